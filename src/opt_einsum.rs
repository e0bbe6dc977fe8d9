//! `torch.backends.opt_einsum`: how [`crate::einsum`] orders its pairwise contractions,
//! and the path search itself.
//!
//! A path is a list of steps in opt_einsum's "linear" form: each step names two positions
//! in the current operand list; those two leave the list and their contraction is
//! appended at its end. A step costs, as opt_einsum counts it, the product of the sizes
//! of every index the two operands hold, twice when an index is summed away.

use crate::flag::{Flag, FlagGuard, Guard, ScopedGuard, option_enum};

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
    fn size(&self, set: Indices) -> u128 {
        bits(set).map(|i| self.sizes[i] as u128).product()
    }

    /// opt_einsum's count: the product of every involved index's size, times
    /// max(1, terms - 1), plus one more such product when an index is summed away.
    fn flops(&self, involved: Indices, result: Indices, terms: usize) -> u128 {
        let inner = u128::from(involved & !result != 0);
        self.size(involved) * ((terms.max(2) - 1) as u128 + inner)
    }

    /// The result and cost of contracting `a` and `b` while `others` remain.
    fn step(&self, a: Indices, b: Indices, others: Indices) -> (Indices, u128) {
        let involved = a | b;
        let result = involved & (self.output | others);
        (result, self.flops(involved, result, 2))
    }

    /// Plans the contraction with `strategy` (left to right when `optimize` is false).
    pub fn plan(&self, optimize: bool, strategy: Strategy) -> ContractionPath {
        let n = self.inputs.len();
        let all = self.inputs.iter().fold(0, |acc, &s| acc | s);
        let naive_flops = self.flops(all, self.output, n);
        if n < 2 {
            return ContractionPath {
                path: vec![vec![0]],
                naive_flops,
                optimized_flops: naive_flops,
                largest_intermediate: self.size(self.output),
            };
        }
        let pairs = if !optimize {
            (0..n - 1)
                .map(|step| if step == 0 { (0, 1) } else { (0, n - 1 - step) })
                .collect()
        } else {
            let branches = match strategy {
                Strategy::Optimal => Search::Exhaustive,
                Strategy::Greedy => Search::Greedy,
                Strategy::Auto => match n {
                    ..=4 => Search::Exhaustive,
                    5..=6 => Search::Branch(usize::MAX),
                    7..=8 => Search::Branch(2),
                    9..=14 => Search::Branch(1),
                    _ => Search::Greedy,
                },
            };
            self.search(branches)
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
        let (mut total, mut largest) = (0, 0);
        for &(i, j) in pairs {
            let (a, b) = (ops[i], ops[j]);
            ops.remove(j);
            ops.remove(i);
            let others = ops.iter().fold(0, |acc, &s| acc | s);
            let (result, flops) = self.step(a, b, others);
            total += flops;
            largest = largest.max(self.size(result));
            ops.push(result);
        }
        (total, largest)
    }

    /// Every pair of `ops` with its result, cost and greedy score (the size the step
    /// adds, `|result| - |a| - |b|`), best score first; pairs sharing no index only when
    /// no pair shares one, unless `outer` asks for them too.
    fn candidates(&self, ops: &[Indices], outer: bool) -> Vec<Candidate> {
        let mut found = Vec::new();
        for i in 0..ops.len() {
            for j in i + 1..ops.len() {
                let others = ops
                    .iter()
                    .enumerate()
                    .filter(|&(x, _)| x != i && x != j)
                    .fold(0, |acc, (_, &s)| acc | s);
                let (result, flops) = self.step(ops[i], ops[j], others);
                let score = self.size(result) as i128
                    - self.size(ops[i]) as i128
                    - self.size(ops[j]) as i128;
                found.push(Candidate {
                    pair: (i, j),
                    result,
                    flops,
                    score,
                    shares: ops[i] & ops[j] != 0,
                });
            }
        }
        if !outer && found.iter().any(|c| c.shares) {
            found.retain(|c| c.shares);
        }
        found.sort_by_key(|c| (c.score, c.flops, c.pair));
        found
    }

    fn search(&self, how: Search) -> Vec<(usize, usize)> {
        if how == Search::Greedy {
            let mut ops = self.inputs.to_vec();
            let mut path = Vec::new();
            while ops.len() > 1 {
                let best = self.candidates(&ops, false).swap_remove(0);
                let (i, j) = best.pair;
                ops.remove(j);
                ops.remove(i);
                ops.push(best.result);
                path.push(best.pair);
            }
            return path;
        }
        let mut best = Best {
            flops: u128::MAX,
            path: Vec::new(),
        };
        self.branch(self.inputs.to_vec(), 0, &mut Vec::new(), how, &mut best);
        best.path
    }

    /// Depth-first over the candidate steps (all of them, or the `n` best by greedy
    /// score), pruning every branch whose cost already reaches the best complete path's.
    fn branch(
        &self,
        ops: Vec<Indices>,
        flops: u128,
        path: &mut Vec<(usize, usize)>,
        how: Search,
        best: &mut Best,
    ) {
        if ops.len() == 1 {
            if flops < best.flops {
                *best = Best {
                    flops,
                    path: path.clone(),
                };
            }
            return;
        }
        let limit = match how {
            Search::Branch(n) => n,
            _ => usize::MAX,
        };
        let candidates = self.candidates(&ops, how == Search::Exhaustive);
        for c in candidates.into_iter().take(limit) {
            let total = flops + c.flops;
            if total >= best.flops {
                continue;
            }
            let (i, j) = c.pair;
            let mut next = ops.clone();
            next.remove(j);
            next.remove(i);
            next.push(c.result);
            path.push(c.pair);
            self.branch(next, total, path, how, best);
            path.pop();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Search {
    /// Every pair at every step, outer products included.
    Exhaustive,
    /// The `n` best pairs by greedy score at every step.
    Branch(usize),
    /// The best pair by greedy score, no backtracking.
    Greedy,
}

struct Candidate {
    pair: (usize, usize),
    result: Indices,
    flops: u128,
    score: i128,
    shares: bool,
}

struct Best {
    flops: u128,
    path: Vec<(usize, usize)>,
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
