//! Decoding attention on x86 vector registers: the few query rows of one key/value head
//! group (every query head of a GQA group, each with its Lq ≤ [`MAX_QUERY_ROWS`] rows), or
//! of several groups whose heads a paged cache keeps side by side, against all the keys,
//! reading each key and value row once for the whole group, in the inputs' own dtype (f32
//! or bf16, widened in registers once per tile of rows). Scores for all keys (tiles of up
//! to 8 query rows sharing each key vector), then the softmax, then the weighted sum of the
//! values (tiles of rows x output vectors held in registers over a block of keys): the key
//! and value streams are the cost, and no query row is computed that the call does not
//! have (the 48-row block kernel computes 48 for one).

use super::lanes::SoftmaxLanes;
use super::{MaskView, Rows, finish_rows};
use crate::kernels::simd::{Load, Vector};
use crate::runtime::cpu::{Avx2Token, Avx512Token};
use std::arch::x86_64::{__m256, __m512};

/// Query rows per call (`Lq`) this path takes.
pub(crate) const MAX_QUERY_ROWS: usize = 4;
/// Rows per group (query heads of a group × Lq) it takes, at most.
pub(crate) const MAX_GROUP_ROWS: usize = 32;

/// The work of one key/value head group, or of several read together.
pub(crate) struct Group<'a, E> {
    /// The group's query rows, `[rows, d]`, already multiplied by the scale: those of each
    /// key/value head in turn.
    pub(crate) q: &'a [f32],
    /// The elements holding the group's keys and values, and where its first head's `lk`
    /// key rows (of `d`) and value rows (of `dv`) lie in them.
    pub(crate) k: &'a [E],
    pub(crate) v: &'a [E],
    pub(crate) k_rows: Rows<'a>,
    pub(crate) v_rows: Rows<'a>,
    /// Key/value heads read together (each with `rows / heads` query rows), and how many
    /// elements each head's key and value rows lie after the previous head's: a paged
    /// cache keeps a key's heads side by side, so reading them together reads its blocks
    /// in order.
    pub(crate) heads: usize,
    pub(crate) head_offsets: (usize, usize),
    pub(crate) lk: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    /// Per row: the keys it sees (of `0..lk`; fewer under a causal mask or a window), its
    /// mask and its index in that mask (the query position).
    pub(crate) rows: &'a [(std::ops::Range<usize>, Option<MaskView<'a>>, usize)],
    /// `[rows, dv]` outputs and the rows' log-sum-exp.
    pub(crate) out: &'a mut [f32],
    pub(crate) lse: &'a mut [f32],
    /// Scratch of `rows · ⌈lk / 16⌉ · 16` floats for the scores.
    pub(crate) scores: &'a mut [f32],
}

/// How many rows ahead key and value rows are asked for. The hardware's prefetch alone
/// leaves the dot products waiting on memory (f32 decoding, H = 32, Hk = 8, Lk = 8192 on a
/// 2-core Xeon: 1.55x PyTorch without, 2.16x with), and a paged cache's rows, a block's
/// other heads apart, defeat it altogether (0.96x without, 1.78x with); 4 rows ahead gave
/// less, 16 no more.
const AHEAD: usize = 8;

/// Asks for the cache lines of elements `at..at + len` of `data` in L1.
#[inline(always)]
fn prefetch_row<E>(data: &[E], at: usize, len: usize) {
    let bytes = len * std::mem::size_of::<E>();
    let start = data.as_ptr().wrapping_add(at).cast::<f32>();
    for line in (0..bytes).step_by(64) {
        crate::kernels::simd::prefetch_l1(start.wrapping_byte_add(line));
    }
}

/// Whether a vector level this path runs on is in force.
pub(crate) fn available() -> bool {
    Avx512Token::get().is_some() || Avx2Token::get().is_some()
}

/// Runs one group on the vector level in force (where [`available`]).
pub(crate) fn run<E: Load>(g: Group<E>) {
    if let Some(token) = Avx512Token::get() {
        avx512(token, g);
    } else if let Some(token) = Avx2Token::get() {
        avx2(token, g);
    }
}

fn avx512<E: Load>(_: Avx512Token, g: Group<E>) {
    #[target_feature(enable = "avx512f,avx512dq,fma")]
    unsafe fn go<E: Load>(g: Group<E>) {
        // SAFETY: the CPU has the AVX-512 level (the caller's token).
        unsafe { body::<__m512, E>(g) }
    }
    // SAFETY: the token proves the AVX-512 level (F, DQ, FMA).
    unsafe { go(g) }
}

fn avx2<E: Load>(_: Avx2Token, g: Group<E>) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn go<E: Load>(g: Group<E>) {
        // SAFETY: the CPU has AVX2 and FMA (the caller's token).
        unsafe { body::<__m256, E>(g) }
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { go(g) }
}

/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn body<V: SoftmaxLanes, E: Load>(g: Group<E>) {
    let Group {
        q,
        k,
        v,
        k_rows,
        v_rows,
        heads,
        head_offsets: (k_head, v_head),
        lk,
        d,
        dv,
        rows,
        out,
        lse,
        scores,
    } = g;
    let n = rows.len();
    assert!(heads > 0 && n.is_multiple_of(heads));
    let per_head = n / heads;
    let stride = lk.next_multiple_of(16);
    assert!(q.len() == n * d);
    assert!(out.len() == n * dv && lse.len() == n && scores.len() >= n * stride);
    assert!(n <= MAX_GROUP_ROWS && rows.iter().all(|(keys, ..)| keys.end <= lk));
    let (dl, dvl) = (d / V::LANES * V::LANES, dv / V::LANES * V::LANES);
    // Scores: each key row read once, against every query row of the group; keys a row
    // does not see are -inf (weight 0), as is the padding up to `stride`.
    for r in 0..n {
        scores[r * stride + lk..(r + 1) * stride].fill(f32::NEG_INFINITY);
    }
    for j in 0..lk {
        if j + AHEAD < lk {
            let ahead = k_rows.at(j + AHEAD);
            for h in 0..heads {
                prefetch_row(k, ahead + h * k_head, d);
            }
        }
        let row = k_rows.at(j);
        for h in 0..heads {
            let key = &k[row + h * k_head..][..d];
            // The key's vectors are widened once for a tile of the head's rows (8, then 4,
            // 2, 1).
            let (mut r0, end) = (h * per_head, (h + 1) * per_head);
            while r0 < end {
                // SAFETY: rows r0.. of q exist (r0 + R ≤ end ≤ n), lanes below dl ≤ d.
                r0 += unsafe {
                    match end - r0 {
                        8.. => score_tile::<V, E, 8>(q, key, (r0, d, dl), rows, j, stride, scores),
                        4.. => score_tile::<V, E, 4>(q, key, (r0, d, dl), rows, j, stride, scores),
                        2.. => score_tile::<V, E, 2>(q, key, (r0, d, dl), rows, j, stride, scores),
                        _ => score_tile::<V, E, 1>(q, key, (r0, d, dl), rows, j, stride, scores),
                    }
                };
            }
        }
    }
    // The softmax of each row, 16 keys at a time (the padding's -inf gives 0).
    let mut maxes = [f32::NEG_INFINITY; MAX_GROUP_ROWS];
    let mut sums = [0f32; MAX_GROUP_ROWS];
    for r in 0..n {
        let row = &mut scores[r * stride..(r + 1) * stride];
        let max = row.iter().fold(
            f32::NEG_INFINITY,
            |m, &x| if x > m || x.is_nan() { x } else { m },
        );
        // SAFETY: lanes c..c + LANES of the row (stride is a multiple of 16, and of LANES).
        let sum = unsafe {
            let shift = V::shift_of(V::splat(max));
            let mut total = V::splat(0.0);
            for c in (0..stride).step_by(V::LANES) {
                let at = row.as_mut_ptr().add(c);
                let e = V::exp_shifted(V::load(at), shift);
                e.store(at);
                total = V::add(total, e);
            }
            total.sum()
        };
        (maxes[r], sums[r]) = (max, sum);
    }
    // The weighted sum, in register tiles of rows x vectors of the outputs, block of keys by
    // block: each value row is read from memory once, widened once per tile of rows.
    out.fill(0.0);
    // Heads read together go a few keys at a time: the first head's pass asks for whole
    // rows of all heads, which the others then find in cache.
    let (keys_per_block, row_ahead) = match heads {
        1 => (VALUE_BLOCK, dv),
        _ => (HEADS_VALUE_BLOCK, (heads - 1) * v_head + dv),
    };
    for first in (0..lk).step_by(keys_per_block) {
        let block = first..(first + keys_per_block).min(lk);
        for h in 0..heads {
            let (mut r0, end) = (h * per_head, (h + 1) * per_head);
            while r0 < end {
                let tile = match end - r0 {
                    4.. => 4,
                    2.. => 2,
                    _ => 1,
                };
                let mut x0 = 0;
                while x0 < dvl {
                    let at = (r0, x0, block.clone(), h * v_head);
                    // The first tile asks for whole value rows ahead: the other tiles find
                    // them in cache (a paged cache's rows, apart, defeat the hardware's
                    // prefetch).
                    let ahead = if r0 == 0 && x0 == 0 { row_ahead } else { 0 };
                    let shape = (dv, stride, lk, ahead);
                    // SAFETY: rows r0..r0 + tile ≤ n and lanes x0.. below dvl ≤ dv.
                    x0 += unsafe {
                        match (tile, (dvl - x0) / V::LANES) {
                            (4, 4..) => value_tile::<V, E, 4, 4>(v, v_rows, at, shape, scores, out),
                            (4, _) => value_tile::<V, E, 4, 1>(v, v_rows, at, shape, scores, out),
                            (2, 4..) => value_tile::<V, E, 2, 4>(v, v_rows, at, shape, scores, out),
                            (2, _) => value_tile::<V, E, 2, 1>(v, v_rows, at, shape, scores, out),
                            (_, 8..) => value_tile::<V, E, 1, 8>(v, v_rows, at, shape, scores, out),
                            (_, 4..) => value_tile::<V, E, 1, 4>(v, v_rows, at, shape, scores, out),
                            _ => value_tile::<V, E, 1, 1>(v, v_rows, at, shape, scores, out),
                        }
                    };
                }
                for j in block.clone().filter(|_| dvl < dv) {
                    let value = &v[v_rows.at(j) + h * v_head..][..dv];
                    for r in r0..r0 + tile {
                        let p = scores[r * stride + j];
                        let o = &mut out[r * dv..(r + 1) * dv];
                        for x in dvl..dv {
                            o[x] = p.mul_add(value[x].to_f32(), o[x]);
                        }
                    }
                }
                r0 += tile;
            }
        }
    }
    finish_rows(out, dv, &maxes[..n], &sums[..n], lse);
}

/// Keys per block of the weighted sum: the block's value rows (256 KiB of f32 at dv = 128)
/// stay in L2 while each tile of rows reads them.
const VALUE_BLOCK: usize = 512;

/// Keys per block of the weighted sum where several heads are read together: their rows
/// (64 KiB of bf16 at 8 heads, dv = 128) stay in L1 and L2 while each head reads its part.
const HEADS_VALUE_BLOCK: usize = 32;

/// The scores of key row `key` (index `j`) against query rows `r0..r0 + R` (their `rows`
/// entries say which keys each sees and its mask); returns `R`.
///
/// # Safety
/// The CPU has `V`'s instruction set; `r0 + R ≤ rows.len()`, `q` holds those rows of `d`,
/// `key` holds `d` elements, `dl ≤ d` is a multiple of `V::LANES`.
#[inline(always)]
unsafe fn score_tile<V: SoftmaxLanes, E: Load, const R: usize>(
    q: &[f32],
    key: &[E],
    (r0, d, dl): (usize, usize, usize),
    rows: &[(std::ops::Range<usize>, Option<MaskView<'_>>, usize)],
    j: usize,
    stride: usize,
    scores: &mut [f32],
) -> usize {
    // SAFETY: lanes x..x + LANES < dl of the key and of rows r0..r0 + R of q (the caller).
    let acc = unsafe {
        let mut acc = [V::splat(0.0); R];
        for x in (0..dl).step_by(V::LANES) {
            let kx = E::load::<V>(key.as_ptr().add(x));
            for (t, a) in acc.iter_mut().enumerate() {
                *a = V::fmadd(V::load(q.as_ptr().add((r0 + t) * d + x)), kx, *a);
            }
        }
        acc
    };
    for (t, a) in acc.into_iter().enumerate() {
        let (keys, mask, i) = &rows[r0 + t];
        let at = &mut scores[(r0 + t) * stride + j];
        if !keys.contains(&j) {
            *at = f32::NEG_INFINITY;
            continue;
        }
        let qr = &q[(r0 + t) * d..(r0 + t + 1) * d];
        // SAFETY: the CPU has V's instruction set (the caller).
        let mut dot = unsafe { a.sum() };
        for x in dl..d {
            dot = qr[x].mul_add(key[x].to_f32(), dot);
        }
        *at = dot + mask.map_or(0.0, |m| m.at(*i, j));
    }
    R
}

/// Adds the weighted value rows of keys `block` (each `offset` elements into its row of
/// `v_rows`) into outputs `r0..r0 + R`, lanes
/// `x0..x0 + C · LANES`, accumulated in registers, asking for `ahead` elements of the value
/// row [`AHEAD`] rows on; returns the lanes done.
///
/// # Safety
/// The CPU has `V`'s instruction set; rows `r0..r0 + R` of `out` (of `dv`) exist and
/// `x0 + C · LANES ≤ dv`.
#[inline(always)]
unsafe fn value_tile<V: Vector, E: Load, const R: usize, const C: usize>(
    v: &[E],
    v_rows: Rows<'_>,
    (r0, x0, block, offset): (usize, usize, std::ops::Range<usize>, usize),
    (dv, stride, lk, ahead): (usize, usize, usize, usize),
    scores: &[f32],
    out: &mut [f32],
) -> usize {
    // SAFETY: lanes x0..x0 + C · LANES ≤ dv of rows r0..r0 + R (the caller).
    unsafe {
        let o = out.as_mut_ptr();
        let mut acc = [[V::splat(0.0); C]; R];
        for (t, row) in acc.iter_mut().enumerate() {
            for (c, a) in row.iter_mut().enumerate() {
                *a = V::load(o.add((r0 + t) * dv + x0 + c * V::LANES));
            }
        }
        for j in block {
            if ahead > 0 && j + AHEAD < lk {
                prefetch_row(v, v_rows.at(j + AHEAD) + offset, ahead);
            }
            let value_row = &v[v_rows.at(j) + offset..][..dv];
            let value: [V; C] =
                std::array::from_fn(|c| E::load::<V>(value_row.as_ptr().add(x0 + c * V::LANES)));
            for (t, row) in acc.iter_mut().enumerate() {
                let p = V::splat(scores[(r0 + t) * stride + j]);
                for (a, &x) in row.iter_mut().zip(&value) {
                    *a = V::fmadd(p, x, *a);
                }
            }
        }
        for (t, row) in acc.iter().enumerate() {
            for (c, a) in row.iter().enumerate() {
                a.store(o.add((r0 + t) * dv + x0 + c * V::LANES));
            }
        }
    }
    C * V::LANES
}
