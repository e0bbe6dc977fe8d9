//! What a launch's counters count: instructions, warps, barriers and `mma` per launch
//! ([`Stats`]), and, where the launch asks for them, every warp-wide memory access gathered
//! ([`Accesses`]) to count global 32-byte sectors against the minimum the bytes need
//! (coalescing) and extra shared-memory wavefronts (bank conflicts).

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::decode::Space;

/// What a launch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions executed, over all threads.
    pub instructions: u64,
    /// Warps launched.
    pub warps: u64,
    /// `bar.sync` releases.
    pub barriers: u64,
    /// `mma.sync` instructions, per warp.
    pub mma: u64,
    /// Global memory traffic: the 32-byte sectors each warp-wide access touched (counted
    /// where the launch asks for counters, as the two below).
    pub global_sectors: u64,
    /// The sectors those accesses need at least (their bytes / 32, rounded up, per access).
    pub global_min_sectors: u64,
    /// Extra shared-memory wavefronts from bank conflicts (0 when conflict-free).
    pub shared_conflicts: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, other: &Stats) {
        self.instructions += other.instructions;
        self.warps += other.warps;
        self.barriers += other.barriers;
        self.mma += other.mma;
        self.global_sectors += other.global_sectors;
        self.global_min_sectors += other.global_min_sectors;
        self.shared_conflicts += other.shared_conflicts;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_warp = self.instructions as f64 / 32.0 / self.warps.max(1) as f64;
        write!(
            f,
            "{per_warp:.0} instructions per warp, {} mma, {} barriers, global {} sectors for {} \
             needed ({:.2}x), {} extra shared wavefronts",
            self.mma,
            self.barriers,
            self.global_sectors,
            self.global_min_sectors,
            self.global_sectors as f64 / self.global_min_sectors.max(1) as f64,
            self.shared_conflicts
        )
    }
}

/// One warp-wide memory access: the same instruction's `k`-th execution by the lanes of a
/// warp, gathered to count sectors and bank conflicts.
#[derive(Default)]
struct Access {
    /// Global: the 32-byte sectors touched, and the bytes accessed.
    sectors: HashSet<u64>,
    bytes: u64,
    /// Shared: the distinct 4-byte words per bank.
    banks: HashMap<u64, HashSet<u64>>,
}

/// The warp-wide accesses of one CTA, by (warp, instruction, how often the lane had run it).
#[derive(Default)]
pub(crate) struct Accesses(HashMap<(u32, usize, u32), Access>);

impl Accesses {
    /// One lane's `bytes`-wide access at `address` in `space`, part of warp-wide access `key`.
    pub(crate) fn record(
        &mut self,
        key: (u32, usize, u32),
        space: Space,
        address: u64,
        bytes: u64,
    ) {
        let access = self.0.entry(key).or_default();
        match space {
            Space::Global => {
                for sector in address / 32..=(address + bytes - 1) / 32 {
                    access.sectors.insert(sector);
                }
                access.bytes += bytes;
            }
            _ => {
                for word in address / 4..=(address + bytes - 1) / 4 {
                    access.banks.entry(word % 32).or_default().insert(word);
                }
            }
        }
    }

    /// Folds the recorded accesses into `stats` and forgets them.
    pub(crate) fn tally(&mut self, stats: &mut Stats) {
        for access in self.0.values() {
            stats.global_sectors += access.sectors.len() as u64;
            stats.global_min_sectors += access.bytes.div_ceil(32);
            let wavefronts = access
                .banks
                .values()
                .map(|w| w.len() as u64)
                .max()
                .unwrap_or(1);
            stats.shared_conflicts += wavefronts.saturating_sub(1);
        }
        self.0.clear();
    }
}
