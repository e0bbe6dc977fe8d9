//! `torch.backends.opt_einsum`: how [`crate::ops::einsum`] orders its pairwise contractions,
//! and the path search itself.
//!
//! A path is a list of steps in opt_einsum's "linear" form: each step names two positions
//! in the current operand list; those two leave the list and their contraction is
//! appended at its end. Paths and costs are opt_einsum 3.4's, since `torch.einsum`
//! contracts along the path it returns: a step costs the product of the sizes of every
//! index the two operands hold, twice when an index is summed away; the naive count
//! (every operand at once) is that product times max(1, operands - 1), plus one more when
//! an index is held by several operands. The searches (`optimal`, `branch`) reproduce
//! opt_einsum's, including its heuristics and tie-breaking; a cheaper path than
//! opt_einsum's would be a different answer.

use std::collections::HashMap;

use crate::core::flag::{Flag, FlagGuard, Guard, ScopedGuard, option_enum};

option_enum! {
    /// How the contraction path is searched.
    pub enum Strategy ("opt_einsum strategy") {
        /// `optimal` up to 4 operands, cheaper searches beyond (as opt_einsum 3.4).
        Auto = "auto",
        /// Cheapest pair first.
        Greedy = "greedy",
        /// Exhaustive search with pruning.
        Optimal = "optimal",
    }
}

/// Contraction paths are optimised (otherwise operands contract left to right).
pub static ENABLED: Flag<bool> = Flag::new("opt_einsum.enabled", true, None);
/// The path search strategy.
pub static STRATEGY: Flag<Strategy> = Flag::new("opt_einsum.strategy", Strategy::Auto, None);

/// Whether the contraction-path optimizer is part of this build (it always is).
pub fn is_available() -> bool {
    true
}

/// Whether contraction paths are optimised.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Turns path optimisation on or off.
pub fn set_enabled(enabled: bool) {
    ENABLED.set(enabled);
}

/// The path search strategy.
pub fn strategy() -> Strategy {
    STRATEGY.get()
}

/// Sets the path search strategy.
pub fn set_strategy(strategy: Strategy) {
    STRATEGY.set(strategy);
}

/// Sets the given settings until the guard drops (`None` leaves one as it is).
pub fn flags(enabled: Option<bool>, strategy: Option<Strategy>) -> Guard {
    settings(enabled, strategy)
}

/// [`flags`] for the current thread only.
pub fn flags_scoped(enabled: Option<bool>, strategy: Option<Strategy>) -> ScopedGuard {
    settings(enabled, strategy)
}

fn settings<G: FlagGuard>(enabled: Option<bool>, strategy: Option<Strategy>) -> G {
    let mut guard = G::default();
    if let Some(enabled) = enabled {
        guard.push(&ENABLED, enabled);
    }
    if let Some(strategy) = strategy {
        guard.push(&STRATEGY, strategy);
    }
    guard
}

/// A contraction path and what it costs, as opt_einsum's `contract_path` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContractionPath {
    /// The steps, in linear form (`[[0]]` for a single operand).
    pub path: Vec<Vec<usize>>,
    /// The cost of contracting every operand at once.
    pub naive_flops: u128,
    /// The cost along `path`.
    pub optimized_flops: u128,
    /// The element count of the largest result along `path`.
    pub largest_intermediate: u128,
}

/// Index sets are bit sets over at most 64 index labels.
pub(crate) type Indices = u64;

/// A contraction to plan: each operand's index set, the output's, and each index's size.
pub(crate) struct Problem<'a> {
    pub inputs: &'a [Indices],
    pub output: Indices,
    pub sizes: &'a [usize; 64],
}

impl Problem<'_> {
    /// The element count of an operand holding `set` (saturating: a count past u128 is
    /// reported as u128::MAX, never wrapped).
    fn size(&self, set: Indices) -> u128 {
        bits(set).fold(1u128, |n, i| n.saturating_mul(self.sizes[i] as u128))
    }

    /// The size a step adds, `|result| - |a| - |b|` (opt_einsum's "memory-removed"
    /// heuristic), saturating.
    fn added(&self, result: Indices, a: Indices, b: Indices) -> i128 {
        let size = |set| i128::try_from(self.size(set)).unwrap_or(i128::MAX);
        size(result).saturating_sub(size(a)).saturating_sub(size(b))
    }

    /// opt_einsum's `flop_count`: the product of every involved index's size, times
    /// max(1, terms - 1), plus one more such product when the step is an inner product.
    fn flops(&self, involved: Indices, inner: bool, terms: usize) -> u128 {
        self.size(involved)
            .saturating_mul((terms.max(2) - 1) as u128 + u128::from(inner))
    }

    /// The result and reported cost of contracting `a` and `b` while `others` remain: an
    /// inner product when any index is summed away (opt_einsum's `contract_path`).
    fn step(&self, a: Indices, b: Indices, others: Indices) -> (Indices, u128) {
        let involved = a | b;
        let result = involved & (self.output | others);
        (result, self.flops(involved, involved != result, 2))
    }

    /// Plans the contraction with `strategy` (left to right when `optimize` is false).
    pub fn plan(&self, optimize: bool, strategy: Strategy) -> ContractionPath {
        let n = self.inputs.len();
        let all = self.inputs.iter().fold(0, |acc, &s| acc | s);
        // An inner product, for the naive count, is an index that several operands hold.
        let held: u32 = self.inputs.iter().map(|s| s.count_ones()).sum();
        let naive_flops = self.flops(all, held > all.count_ones(), n);
        if n < 2 {
            let input = self.inputs.first().copied().unwrap_or(0);
            return ContractionPath {
                path: vec![vec![0]],
                naive_flops,
                optimized_flops: self.flops(input, input & !self.output != 0, 1),
                largest_intermediate: self.size(self.output),
            };
        }
        let pairs = if !optimize {
            (0..n - 1)
                .map(|step| if step == 0 { (0, 1) } else { (0, n - 1 - step) })
                .collect()
        } else if n == 2 {
            vec![(0, 1)]
        } else {
            let search = Search::new(self);
            match strategy {
                Strategy::Optimal => search.optimal(),
                Strategy::Greedy => self.greedy(),
                Strategy::Auto => match n {
                    ..=4 => search.optimal(),
                    5..=6 => search.branch(usize::MAX),
                    7..=8 => search.branch(2),
                    9..=14 => search.branch(1),
                    _ => self.greedy(),
                },
            }
        };
        let (optimized_flops, largest_intermediate) = self.cost(&pairs);
        ContractionPath {
            path: pairs.into_iter().map(|(i, j)| vec![i, j]).collect(),
            naive_flops,
            optimized_flops,
            largest_intermediate,
        }
    }

    /// The total cost and largest result along `pairs`.
    fn cost(&self, pairs: &[(usize, usize)]) -> (u128, u128) {
        let mut ops = self.inputs.to_vec();
        let (mut total, mut largest) = (0u128, 0);
        for &(i, j) in pairs {
            let (a, b) = (ops[i], ops[j]);
            ops.remove(j);
            ops.remove(i);
            let others = ops.iter().fold(0, |acc, &s| acc | s);
            let (result, flops) = self.step(a, b, others);
            total = total.saturating_add(flops);
            largest = largest.max(self.size(result));
            ops.push(result);
        }
        (total, largest)
    }

    /// Cheapest pair first by the size a step adds (`|result| - |a| - |b|`), pairs that
    /// share an index before outer products; no backtracking.
    fn greedy(&self) -> Vec<(usize, usize)> {
        let mut ops = self.inputs.to_vec();
        let mut path = Vec::new();
        while ops.len() > 1 {
            let pairs = (0..ops.len()).flat_map(|i| (i + 1..ops.len()).map(move |j| (i, j)));
            let (_, (i, j), result) = pairs
                .map(|(i, j)| {
                    let others = ops
                        .iter()
                        .enumerate()
                        .filter(|&(x, _)| x != i && x != j)
                        .fold(0, |acc, (_, &s)| acc | s);
                    let (result, flops) = self.step(ops[i], ops[j], others);
                    let added = self.added(result, ops[i], ops[j]);
                    ((ops[i] & ops[j] == 0, added, flops), (i, j), result)
                })
                .min_by_key(|&(key, pair, _)| (key, pair))
                .expect("two or more operands");
            ops.remove(j);
            ops.remove(i);
            ops.push(result);
            path.push((i, j));
        }
        path
    }
}

/// opt_einsum 3.4's depth-first searches (`optimal`, and `branch` with its heuristic
/// pruning), reproduced step for step so that `auto` returns the same path as
/// `torch.einsum` contracts along. Operands get static single-assignment ids: the inputs
/// are 0..n, each contraction's result the next id.
struct Search<'p, 'a> {
    problem: &'p Problem<'a>,
    /// Every operand made so far, by id.
    ops: Vec<Indices>,
    /// Step results by the pair of index sets contracted, as opt_einsum caches them:
    /// computed in the first context a pair is met in, and reused in every other.
    results: HashMap<(Indices, Indices), (Indices, u128)>,
    /// The best complete path's cost and largest intermediate (`None` until one is found:
    /// any path beats none, also one whose saturated cost is `u128::MAX`).
    best: Option<(u128, u128)>,
    best_path: Vec<(usize, usize)>,
    /// `branch`: the lowest cost seen at each depth (by the number of ids made).
    progress: HashMap<usize, u128>,
}

/// One step `branch` may take: heuristic cost, the step's cost, the totals after it, the
/// pair, and the result, ordered as opt_einsum's heap orders them.
type Candidate = (i128, u128, u128, u128, (usize, usize), Indices);

/// How much worse than the best at the same depth a `branch` path may be and still go on.
const CUTOFF_FLOPS_FACTOR: u128 = 4;

impl<'p, 'a> Search<'p, 'a> {
    fn new(problem: &'p Problem<'a>) -> Self {
        Search {
            problem,
            ops: problem.inputs.to_vec(),
            results: HashMap::new(),
            best: None,
            best_path: Vec::new(),
            progress: HashMap::new(),
        }
    }

    /// The result and search cost of contracting ids `i` and `j` while `remaining` stay:
    /// an inner product only when an index both hold is summed away (opt_einsum's
    /// `calc_k12_flops`).
    fn result(&mut self, i: usize, j: usize, remaining: &[usize]) -> (Indices, u128) {
        let (a, b) = (self.ops[i], self.ops[j]);
        if let Some(&hit) = self.results.get(&(a, b)) {
            return hit;
        }
        let keep = remaining
            .iter()
            .filter(|&&r| r != i && r != j)
            .fold(self.problem.output, |acc, &r| acc | self.ops[r]);
        let either = a | b;
        let found = (
            either & keep,
            self.problem.flops(either, a & b & !keep != 0, 2),
        );
        self.results.insert((a, b), found);
        found
    }

    /// The pairs of `remaining` in the order `itertools.combinations` gives them over
    /// opt_einsum's id set, smaller id first in each.
    fn pairs(remaining: &[usize]) -> Vec<(usize, usize)> {
        let mut pairs = Vec::new();
        for (x, &a) in remaining.iter().enumerate() {
            for &b in &remaining[x + 1..] {
                pairs.push((a.min(b), a.max(b)));
            }
        }
        pairs
    }

    /// The linear path of the best SSA path.
    fn linear(&self) -> Vec<(usize, usize)> {
        let mut ids: Vec<usize> = (0..self.problem.inputs.len()).collect();
        let mut next = ids.len();
        self.best_path
            .iter()
            .map(|&(a, b)| {
                let position = |id| ids.iter().position(|&x| x == id).expect("live id");
                let (x, y) = (position(a).min(position(b)), position(a).max(position(b)));
                ids.remove(y);
                ids.remove(x);
                ids.push(next);
                next += 1;
                (x, y)
            })
            .collect()
    }

    /// Every pair at every step, pruned by the best complete path's cost.
    fn optimal(mut self) -> Vec<(usize, usize)> {
        let remaining = IdSet::range(self.ops.len());
        self.optimal_from(&remaining, 0, &mut Vec::new());
        self.linear()
    }

    fn optimal_from(&mut self, remaining: &IdSet, flops: u128, path: &mut Vec<(usize, usize)>) {
        let ids = remaining.ids();
        if ids.len() == 1 {
            self.best = Some((flops, 0));
            self.best_path = path.clone();
            return;
        }
        for (i, j) in Self::pairs(&ids) {
            let (result, step) = self.result(i, j, &ids);
            let total = flops.saturating_add(step);
            if self.best.is_some_and(|(best, _)| total >= best) {
                continue;
            }
            let id = self.ops.len();
            self.ops.push(result);
            let next = remaining.without(i, j).with(id);
            path.push((i, j));
            self.optimal_from(&next, total, path);
            path.pop();
            self.ops.pop();
        }
    }

    /// opt_einsum's `branch`: at each step the `nbranch` best pairs by the size they add
    /// (outer products only when no other pair is left), pruned by the best complete path
    /// (flops, then largest intermediate) and by the best cost seen at the same depth.
    fn branch(mut self, nbranch: usize) -> Vec<(usize, usize)> {
        let remaining = IdSet::range(self.ops.len());
        self.branch_from(&remaining, 0, 0, &mut Vec::new(), nbranch);
        self.linear()
    }

    fn branch_from(
        &mut self,
        remaining: &IdSet,
        flops: u128,
        size: u128,
        path: &mut Vec<(usize, usize)>,
        nbranch: usize,
    ) {
        let ids = remaining.ids();
        if ids.len() == 1 {
            self.best = Some((flops, size));
            self.best_path = path.clone();
            return;
        }
        let mut candidates: Vec<Candidate> = Vec::new();
        for outer in [false, true] {
            if outer && !candidates.is_empty() {
                break;
            }
            for (i, j) in Self::pairs(&ids) {
                if !outer && self.ops[i] & self.ops[j] == 0 {
                    continue;
                }
                candidates.extend(self.assess(i, j, &ids, flops, size));
            }
        }
        candidates.sort();
        for (_, _, total, largest, (i, j), result) in candidates.into_iter().take(nbranch) {
            let id = self.ops.len();
            self.ops.push(result);
            let next = remaining.without(i, j).with(id);
            path.push((i, j));
            self.branch_from(&next, total, largest, path, nbranch);
            path.pop();
            self.ops.pop();
        }
    }

    fn assess(
        &mut self,
        i: usize,
        j: usize,
        remaining: &[usize],
        flops: u128,
        size: u128,
    ) -> Option<Candidate> {
        let (result, step) = self.result(i, j, remaining);
        let result_size = self.problem.size(result);
        let total = flops.saturating_add(step);
        let largest = size.max(result_size);
        if self.best.is_some_and(|best| (total, largest) >= best) {
            return None;
        }
        let depth = self.ops.len();
        let best_here = self.progress.entry(depth).or_insert(u128::MAX);
        if total < *best_here {
            *best_here = total;
        } else if total > best_here.saturating_mul(CUTOFF_FLOPS_FACTOR) {
            return None;
        }
        let added = self.problem.added(result, self.ops[i], self.ops[j]);
        Some((added, step, total, largest, (i, j), result))
    }
}

/// A set of operand ids laid out as CPython's `set` lays out small ints (their hash is
/// their value): open addressing over a power-of-two table, linear probes then perturbed
/// jumps, resizing at 3/5 full. opt_einsum walks its sets of remaining operands in table
/// order, and its branch search prunes by what it saw first, so the order decides paths.
#[derive(Clone, Debug)]
struct IdSet {
    table: Vec<Slot>,
    /// Slots ever used (ids and dummies).
    fill: usize,
    /// Ids held.
    used: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Empty,
    /// A discarded id's slot.
    Dummy,
    Id(usize),
}

/// CPython's `LINEAR_PROBES`, `PERTURB_SHIFT` and `PySet_MINSIZE`.
const LINEAR_PROBES: usize = 9;
const PERTURB_SHIFT: u32 = 5;
const SET_MIN_SIZE: usize = 8;

impl IdSet {
    fn empty() -> IdSet {
        IdSet {
            table: vec![Slot::Empty; SET_MIN_SIZE],
            fill: 0,
            used: 0,
        }
    }

    /// `set(range(n))`.
    fn range(n: usize) -> IdSet {
        let mut set = IdSet::empty();
        (0..n).for_each(|id| set.add(id));
        set
    }

    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    /// The ids in iteration order.
    fn ids(&self) -> Vec<usize> {
        self.table
            .iter()
            .filter_map(|s| match s {
                Slot::Id(id) => Some(*id),
                _ => None,
            })
            .collect()
    }

    /// The probe sequence from `id`'s home slot: each start, then its linear probes.
    fn probe(mask: usize, id: usize, mut visit: impl FnMut(usize) -> bool) {
        let (mut i, mut perturb) = (id & mask, id);
        loop {
            let probes = if i + LINEAR_PROBES <= mask {
                LINEAR_PROBES
            } else {
                0
            };
            for slot in i..=i + probes {
                if visit(slot) {
                    return;
                }
            }
            perturb >>= PERTURB_SHIFT;
            i = (i * 5 + 1 + perturb) & mask;
        }
    }

    /// `set_insert_clean`: into the first empty slot (no dummies, no duplicates).
    fn insert_clean(table: &mut [Slot], id: usize) {
        let mask = table.len() - 1;
        Self::probe(mask, id, |slot| {
            let empty = table[slot] == Slot::Empty;
            if empty {
                table[slot] = Slot::Id(id);
            }
            empty
        });
    }

    /// `set_table_resize`: the smallest table above `min_used`, ids reinserted in order.
    fn resize(&mut self, min_used: usize) {
        let mut size = SET_MIN_SIZE;
        while size <= min_used {
            size <<= 1;
        }
        let old = std::mem::replace(&mut self.table, vec![Slot::Empty; size]);
        for slot in old {
            if let Slot::Id(id) = slot {
                Self::insert_clean(&mut self.table, id);
            }
        }
        self.fill = self.used;
    }

    /// `set_add_entry`.
    fn add(&mut self, id: usize) {
        let mut found = None;
        Self::probe(self.mask(), id, |slot| match self.table[slot] {
            Slot::Empty => {
                found = Some(slot);
                true
            }
            Slot::Id(x) => x == id,
            Slot::Dummy => false,
        });
        let Some(slot) = found else { return };
        self.table[slot] = Slot::Id(id);
        self.fill += 1;
        self.used += 1;
        if self.fill * 5 >= self.mask() * 3 {
            self.resize(self.used * 4);
        }
    }

    /// `set_merge` into a new set: `set.copy()`.
    fn copy(&self) -> IdSet {
        let mut copy = IdSet::empty();
        if self.used == 0 {
            return copy;
        }
        if self.used * 5 >= copy.mask() * 3 {
            copy.resize(self.used * 2);
        }
        if copy.table.len() == self.table.len() && self.fill == self.used {
            copy.table.clone_from(&self.table);
        } else {
            for id in self.ids() {
                Self::insert_clean(&mut copy.table, id);
            }
        }
        (copy.fill, copy.used) = (self.used, self.used);
        copy
    }

    /// `self - {i, j}` (`set_difference`, or `set_copy_and_difference` for a large set).
    fn without(&self, i: usize, j: usize) -> IdSet {
        if self.used >> 2 > 2 {
            let mut result = self.copy();
            let mut pair = IdSet::empty();
            pair.add(i);
            pair.add(j);
            for id in pair.ids() {
                if let Some(slot) = result.table.iter().position(|&s| s == Slot::Id(id)) {
                    result.table[slot] = Slot::Dummy;
                    result.used -= 1;
                }
            }
            if result.fill - result.used > result.mask() / 4 {
                result.resize(result.used * 4);
            }
            return result;
        }
        let mut result = IdSet::empty();
        for id in self.ids() {
            if id != i && id != j {
                result.add(id);
            }
        }
        result
    }

    /// `self | {id}` (`set_or`: a copy, then `set_merge` of the one-id set).
    fn with(&self, id: usize) -> IdSet {
        let mut result = self.copy();
        if (result.fill + 1) * 5 >= result.mask() * 3 {
            result.resize((result.used + 1) * 2);
        }
        result.add(id);
        result
    }
}

/// The set bits of `set`, lowest first.
pub(crate) fn bits(set: Indices) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| set >> i & 1 == 1)
}

pub(crate) fn report() -> serde_json::Value {
    serde_json::json!({
        "is_available": is_available(),
        "enabled": ENABLED.report(),
        "strategy": STRATEGY.report(),
    })
}
