//! `torch.Generator` and `torch.manual_seed`: where dropout's random draws come from.
//!
//! A [`Generator`] holds a seed and an offset. Each call that draws (attention with
//! `dropout_p > 0`) takes a [`Draw`] at the current offset and advances the offset by the
//! number of values it draws, as PyTorch's Philox generators do, so that consecutive calls
//! drop different weights. Every kernel that applies dropout (host math, the CUDA flash and
//! memory-efficient kernels) decides keep or drop for element `index` as a pure function of
//! (seed, offset, index): the same draw gives the same decisions on every device.
//!
//! Each device has a default generator ([`default_generator`]), seeded with PyTorch's
//! default seed until [`manual_seed`] seeds all of them. For reproducible calls
//! independent of what ran before, pass a generator of your own in the call's options.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::Device;

/// PyTorch's default seed (`default_rng_seed_val`).
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// A source of random draws: a seed and the offset of the next draw.
#[derive(Debug)]
pub struct Generator {
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug)]
struct State {
    seed: u64,
    offset: u64,
}

/// The position of one call's draws: its generator's seed and the offset they start at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    /// The generator's seed.
    pub seed: u64,
    /// The offset of the first value drawn.
    pub offset: u64,
}

impl Draw {
    /// The one 64-bit key the dropout kernels take: seed and offset mixed, so that element
    /// `index` of this draw is decided by `(key, index)` alone.
    pub fn key(self) -> u64 {
        splitmix64(self.seed ^ splitmix64(self.offset))
    }
}

/// SplitMix64's finaliser: a bijection of 64-bit words that mixes every input bit.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Generator {
    /// A generator at `seed`, offset 0.
    pub const fn new(seed: u64) -> Generator {
        Generator {
            state: Mutex::new(State { seed, offset: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two integers, valid whatever a panicking holder did.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reseeds: seed `seed`, offset 0 (`Generator.manual_seed`).
    pub fn manual_seed(&self, seed: u64) -> &Generator {
        *self.lock() = State { seed, offset: 0 };
        self
    }

    /// The seed in use (`Generator.initial_seed`).
    pub fn initial_seed(&self) -> u64 {
        self.lock().seed
    }

    /// The offset of the next draw (`Generator.get_offset`).
    pub fn get_offset(&self) -> u64 {
        self.lock().offset
    }

    /// Moves the next draw to `offset` (`Generator.set_offset`).
    pub fn set_offset(&self, offset: u64) {
        self.lock().offset = offset;
    }

    /// Takes the next `count` values: the draw starts at the current offset, which then
    /// advances by `count` (wrapping at 2^64).
    pub fn draw(&self, count: u64) -> Draw {
        let mut state = self.lock();
        let draw = Draw {
            seed: state.seed,
            offset: state.offset,
        };
        state.offset = state.offset.wrapping_add(count);
        draw
    }
}

/// The seed that default generators made from now on start with.
static BASE_SEED: AtomicU64 = AtomicU64::new(DEFAULT_SEED);

fn defaults() -> MutexGuard<'static, HashMap<Device, &'static Generator>> {
    static DEFAULTS: OnceLock<Mutex<HashMap<Device, &'static Generator>>> = OnceLock::new();
    DEFAULTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The default generator of `device` (`torch.default_generator` for the CPU,
/// `torch.cuda.default_generators[i]` for a GPU), made on first use.
pub fn default_generator(device: Device) -> &'static Generator {
    defaults()
        .entry(device)
        .or_insert_with(|| Box::leak(Box::new(Generator::new(BASE_SEED.load(Relaxed)))))
}

/// Seeds every device's default generator, those made later too (`torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    let defaults = defaults();
    BASE_SEED.store(seed, Relaxed);
    for generator in defaults.values() {
        generator.manual_seed(seed);
    }
}

/// The seed of the CPU's default generator (`torch.initial_seed`).
pub fn initial_seed() -> u64 {
    default_generator(Device::Cpu).initial_seed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_advance_the_offset_and_reseeding_restarts() {
        let g = Generator::new(5);
        assert_eq!(g.draw(100), Draw { seed: 5, offset: 0 });
        assert_eq!(
            g.draw(7),
            Draw {
                seed: 5,
                offset: 100
            }
        );
        assert_eq!(g.get_offset(), 107);
        g.manual_seed(9);
        assert_eq!((g.initial_seed(), g.get_offset()), (9, 0));
        g.set_offset(u64::MAX);
        assert_eq!(g.draw(2).offset, u64::MAX);
        assert_eq!(g.get_offset(), 1);
    }

    #[test]
    fn keys_differ_by_seed_and_by_offset() {
        let key = |seed, offset| Draw { seed, offset }.key();
        assert_eq!(key(1, 2), key(1, 2));
        assert_ne!(key(1, 2), key(1, 3));
        assert_ne!(key(1, 2), key(2, 2));
        assert_ne!(key(0, 0), 0);
    }
}
