//! The CPU attention kernels: one query block against all its keys with a tiled online
//! softmax (never an Lq x Lk buffer). `lanes.rs` holds the AVX-512 and AVX2 kernels (one
//! generic body over a small vector vocabulary), `pairs.rs` that body's products on
//! AVX512-BF16 dot products for bf16 inputs, `decode.rs` the decoding kernel (a few
//! query rows per key/value head group, K and V read once per group), `portable.rs` the
//! build's own vector width, `f64.rs` the row-by-row f64 path;
//! [`block_in_force`] and [`bf16_block_in_force`] pick them by the CPU capability in force. The op around them (threads,
//! inputs, masks, dropout) is [`crate::ops::sdpa`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod decode;
pub(crate) mod f64;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod pairs;
pub(crate) mod portable;

use crate::Tensor;
use crate::core::sdp::{CausalVariant, Window};

/// Sizes of one call, with 3-D inputs read as batch 1.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) b: usize,
    pub(crate) h: usize,
    pub(crate) hk: usize,
    pub(crate) lq: usize,
    pub(crate) lk: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
}

impl Shape {
    /// The sizes of q `[B, H, Lq, D]`, k `[B, Hk, Lk, D]` and v `[B, Hk, Lk, Dv]`.
    pub(crate) fn of(q: &Tensor, k: &Tensor, v: &Tensor) -> Shape {
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        let r = qs.len();
        Shape {
            b: if r == 4 { qs[0] } else { 1 },
            h: qs[r - 3],
            hk: ks[r - 3],
            lq: qs[r - 2],
            lk: ks[r - 2],
            d: qs[r - 1],
            dv: vs[r - 1],
        }
    }

    /// The key/value head of query head `h`.
    pub(crate) fn kv_head(&self, h: usize) -> usize {
        h / (self.h / self.hk.max(1)).max(1)
    }
}

pub(crate) const BLOCK_M: usize = 48;
pub(crate) const BLOCK_N: usize = 64;

/// The mask of one (batch, head) as additive f32 values: `at(i, j)`.
#[derive(Clone, Copy)]
pub(crate) struct MaskView<'a> {
    pub(crate) values: &'a [f32],
    pub(crate) base: usize,
    pub(crate) si: usize,
    pub(crate) sj: usize,
}

impl MaskView<'_> {
    #[inline(always)]
    pub(crate) fn at(&self, i: usize, j: usize) -> f32 {
        self.values[self.base + i * self.si + j * self.sj]
    }
}

/// The keys each query row sees under a causal mask and/or a sliding window: key j is
/// visible to row i when `i + lo <= j <= i + hi`, a bound of `None` being no limit (a
/// causal mask is `hi = diag`: 0 top-left aligned, Lk - Lq bottom-right).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Band {
    pub(crate) lo: Option<isize>,
    pub(crate) hi: Option<isize>,
}

impl Band {
    /// The band of a call of `lq` queries against `lk` keys, causal or not, with `window`
    /// around the diagonal `variant` names; `None` where every key is visible.
    pub(crate) fn new(
        causal: bool,
        variant: CausalVariant,
        window: Window,
        lq: usize,
        lk: usize,
    ) -> Option<Band> {
        let diag = match variant {
            CausalVariant::UpperLeft => 0,
            // Both lengths are tensor extents (at most isize::MAX): the difference fits.
            CausalVariant::LowerRight => lk as isize - lq as isize,
        };
        let Band { lo, hi } = Band::around_diagonal(causal, window)?;
        let shift = |edge: isize| diag.saturating_add(edge);
        Some(Band {
            lo: lo.map(shift),
            hi: hi.map(shift),
        })
    }

    /// The band's edges relative to the diagonal (what the GPU kernels take, each sequence
    /// adding its own diagonal), or `None` where every key is visible.
    pub(crate) fn around_diagonal(causal: bool, window: Window) -> Option<Band> {
        let reach = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        let lo = window.left.map(|l| -reach(l));
        let hi = if causal {
            Some(0)
        } else {
            window.right.map(reach)
        };
        (lo.is_some() || hi.is_some()).then_some(Band { lo, hi })
    }

    /// The keys (of `lk`) query row `i` sees.
    #[inline(always)]
    pub(crate) fn keys(self, i: usize, lk: usize) -> std::ops::Range<usize> {
        let at = |offset: isize| (i as isize).saturating_add(offset).clamp(0, lk as isize) as usize;
        let start = self.lo.map_or(0, at);
        let end = self.hi.map_or(lk, |hi| at(hi.saturating_add(1)));
        start..end.max(start)
    }
}

/// Where the rows of one head (of q, k or v) lie in their input's elements: row j at
/// `base + index(first + j) * stride`, `index` the identity, or a paged cache's block
/// table lookup (row r in block `table[r / block]`, slot `r % block`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows<'a> {
    pub(crate) base: usize,
    pub(crate) stride: usize,
    pub(crate) first: usize,
    pub(crate) pages: Option<Pages<'a>>,
}

/// One sequence's block table: its blocks' indices in the cache, `block` rows each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pages<'a> {
    pub(crate) table: &'a [usize],
    pub(crate) block: usize,
}

impl Rows<'_> {
    /// Rows `stride` apart from `base`.
    pub(crate) fn strided(base: usize, stride: usize) -> Rows<'static> {
        Rows {
            base,
            stride,
            first: 0,
            pages: None,
        }
    }

    /// These rows with the first `first` skipped.
    pub(crate) fn skipping(self, first: usize) -> Self {
        Rows {
            first: self.first + first,
            ..self
        }
    }

    /// The element offset of row `j`.
    #[inline(always)]
    pub(crate) fn at(&self, j: usize) -> usize {
        let r = self.first + j;
        let index = match self.pages {
            None => r,
            // (Blocks are powers of two in practice: a shift and a mask where a division by
            // a size known only at run time would be.)
            Some(p) if p.block.is_power_of_two() => {
                let shift = p.block.trailing_zeros();
                (p.table[r >> shift] << shift) + (r & (p.block - 1))
            }
            Some(p) => p.table[r / p.block] * p.block + r % p.block,
        };
        self.base + index * self.stride
    }
}

/// The keys a block of query rows reads, `start..end` with `start` on a key block's
/// boundary: from the first row's first visible key to the last row's last (the band
/// moves right with the rows); each row still hides the keys outside its own band.
#[inline(always)]
pub(crate) fn key_span(
    band: Option<Band>,
    rows: std::ops::Range<usize>,
    lk: usize,
) -> (usize, usize) {
    let Some(band) = band.filter(|_| !rows.is_empty()) else {
        return (0, lk);
    };
    let start = band.keys(rows.start, lk).start / BLOCK_N * BLOCK_N;
    (start, band.keys(rows.end - 1, lk).end.max(start))
}

/// The arguments of one fused block, with its inputs as `I` holds them ([`Floats`], or
/// [`BfPairs`] for the AVX512-BF16 block).
pub(crate) struct BlockArgs<'a, I = Floats<'a>> {
    pub(crate) inputs: I,
    pub(crate) rows: std::ops::Range<usize>,
    pub(crate) s: &'a Shape,
    pub(crate) band: Option<Band>,
    pub(crate) bias: Option<MaskView<'a>>,
    pub(crate) out: &'a mut [f32],
    pub(crate) lse: &'a mut [f32],
}

impl<'a, I> BlockArgs<'a, I> {
    /// The inputs, and the rest of the arguments.
    pub(crate) fn split(self) -> (I, BlockArgs<'a, ()>) {
        let BlockArgs {
            inputs,
            rows,
            s,
            band,
            bias,
            out,
            lse,
        } = self;
        let rest = BlockArgs {
            inputs: (),
            rows,
            s,
            band,
            bias,
            out,
            lse,
        };
        (inputs, rest)
    }
}

/// A block's inputs as f32 values.
pub(crate) struct Floats<'a> {
    /// The block's queries (the rows of `rows`), already multiplied by the scale.
    pub(crate) q: &'a [f32],
    /// The head's keys, `[Lk, d]`, for the kernel that reads them as rows (else empty).
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    /// The head's keys, transposed block by block (see [`transpose_keys`]), for the kernels
    /// that read them so (else empty).
    pub(crate) kt: &'a [f32],
}

/// A block's bf16 inputs as the AVX512-BF16 block reads them (`d` even).
pub(crate) struct BfPairs<'a> {
    /// The block's queries (the rows of `rows`), `[rows, d]`, not scaled.
    pub(crate) q: &'a [half::bf16],
    /// The head's keys, `[Lk, d]`.
    pub(crate) k: &'a [half::bf16],
    /// The head's values as pairs of keys (see [`pair_values`]).
    pub(crate) v_pairs: &'a [u32],
    /// The factor of the scores.
    pub(crate) scale: f32,
}

/// Values `[lk, dv]` of one head (`v`, rows of `dv`) into `out` (`⌈lk / 2⌉·dv` words) as
/// pairs of keys: word `(c / 2)·dv + x` holds column x of key c in its low half and of key
/// c + 1 in its high half (zero past the last key), as a dot product over keys reads them.
pub(crate) fn pair_values(v: &[half::bf16], lk: usize, dv: usize, out: &mut [u32]) {
    if dv == 0 {
        return;
    }
    for (words, keys) in out.chunks_exact_mut(dv).zip(v[..lk * dv].chunks(2 * dv)) {
        let (low, high) = keys.split_at(dv);
        match high.len() {
            0 => words
                .iter_mut()
                .zip(low)
                .for_each(|(w, l)| *w = u32::from(l.to_bits())),
            _ => words
                .iter_mut()
                .zip(low.iter().zip(high))
                .for_each(|(w, (l, h))| *w = u32::from(l.to_bits()) | u32::from(h.to_bits()) << 16),
        }
    }
}

/// Keys `[L, d]` of one head into `kt` (zeroed, `⌈L / BLOCK_N⌉·d·BLOCK_N` long) as blocks
/// of `BLOCK_N`, each transposed to `[d][BLOCK_N]` (zero past the last key), so that a
/// block's scores are plain vector loops. Done once per head, shared by all its query
/// blocks.
pub(crate) fn transpose_keys(k: &[f32], lk: usize, d: usize, kt: &mut [f32]) {
    if d == 0 {
        return;
    }
    for (block, keys) in kt
        .chunks_exact_mut(d * BLOCK_N)
        .zip(k[..lk * d].chunks(d * BLOCK_N))
    {
        // Row by row of the transposed block: contiguous writes, reads d apart (the block,
        // 64 keys, stays in L1).
        for (x, row) in block.chunks_exact_mut(BLOCK_N).enumerate() {
            for (slot, key) in row.iter_mut().zip(keys.chunks_exact(d)) {
                *slot = key[x];
            }
        }
    }
}

/// The transposed block of keys starting at key `kb`.
#[inline(always)]
pub(crate) fn key_block(kt: &[f32], d: usize, kb: usize) -> &[f32] {
    let start = (kb / BLOCK_N) * d * BLOCK_N;
    &kt[start..start + d * BLOCK_N]
}

/// A cache line of floats: buffers of these start on a 64-byte boundary, so that the
/// vector loads of a row (a multiple of 16 floats) never straddle two lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [f32; 16]);

impl Line {
    pub(crate) const ZERO: Line = Line([0.0; 16]);
}

// SAFETY: sixteen f32s, 64 bytes, no padding: any bit pattern is a valid Line, zero
// included.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; Line is Copy and 'static.
unsafe impl bytemuck::Pod for Line {}

/// The fused block for the CPU capability in force, and whether it reads the keys as rows
/// (`BlockArgs::k`, the AVX-512 and AVX2 blocks) rather than transposed (`BlockArgs::kt`,
/// the portable one). Chosen once per process, in [`crate::kernels::dispatch`].
pub(crate) fn block_in_force() -> (fn(BlockArgs), bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::runtime::cpu::{Avx2Token, Avx512Token};
        // The capability in force is fixed for the process: the token found here is found
        // again at every call.
        if Avx512Token::get().is_some() {
            return (
                |a| lanes::block_avx512(Avx512Token::get().expect("a fixed capability"), a),
                true,
            );
        }
        if Avx2Token::get().is_some() {
            return (
                |a| lanes::block_avx2(Avx2Token::get().expect("a fixed capability"), a),
                true,
            );
        }
    }
    (
        portable::fused_block_body::<{ crate::runtime::cpu::BASELINE_FMA }>,
        false,
    )
}

/// The fused block on AVX512-BF16 dot products for bf16 inputs, where the CPU runs them
/// faster than f32 FMAs ([`crate::runtime::cpu::bf16_dots_pay`]); else none, and bf16
/// inputs are widened to f32 for [`block_in_force`]. Chosen once per process, in
/// [`crate::kernels::dispatch`].
pub(crate) fn bf16_block_in_force() -> Option<fn(BlockArgs<BfPairs>)> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::runtime::cpu::Avx512Bf16Token;
        if crate::runtime::cpu::bf16_dots_pay() {
            return Some(|a| {
                lanes::block_avx512_bf16(Avx512Bf16Token::get().expect("a fixed capability"), a)
            });
        }
    }
    None
}

/// Divides each accumulated row by its softmax sum and writes its log-sum-exp (a row that
/// saw no key gives zeros and -inf; a NaN row gives NaN and NaN).
#[inline(always)]
pub(crate) fn finish_rows(
    acc: &mut [f32],
    dv: usize,
    row_max: &[f32],
    row_sum: &[f32],
    lse: &mut [f32],
) {
    for (r, (&max, &sum)) in row_max.iter().zip(row_sum).enumerate() {
        let (inv, l) = if sum == 0.0 {
            (0.0, f32::NEG_INFINITY)
        } else {
            (1.0 / sum, max + sum.ln())
        };
        for x in &mut acc[r * dv..(r + 1) * dv] {
            *x *= inv;
        }
        lse[r] = l;
    }
}
