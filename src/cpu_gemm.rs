//! CPU GEMM: cache-blocked and packed, with SIMD micro-kernels for AVX-512 and AVX2+FMA and
//! a portable fallback, chosen from [`crate::cpu::get_cpu_capability`], on the library's
//! threads. fp16/bf16 inputs are widened to f32 while packing, and every product is
//! accumulated in f32, in a fixed order: results are bit-identical run to run and do not
//! depend on the thread count.

use crate::DType;
use crate::cpu::CpuCapability;
use crate::tensor::Element;

/// How inputs are rounded while packing (the reduced-precision matmul modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// Exact (IEEE fp32 math).
    None,
    /// To TF32's 10-bit mantissa.
    Tf32,
    /// To bf16's 7-bit mantissa.
    Bf16,
}

impl Rounding {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        let keep = match self {
            Rounding::None => return x,
            Rounding::Tf32 => 10,
            Rounding::Bf16 => 7,
        };
        let drop = 23 - keep;
        // Round to nearest, ties away from zero, on the magnitude bits (as cvt.rna.tf32.f32).
        let bits = x.to_bits();
        if x.is_finite() {
            f32::from_bits((bits + (1 << (drop - 1))) & !((1u32 << drop) - 1))
        } else {
            x
        }
    }
}

/// A matrix view: element `(r, c)` is `data[offset + r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatView<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<T: Element> MatView<'_, T> {
    #[inline]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.offset + r * self.rs + c * self.cs].to_f32()
    }
}

type MicroFn = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// A micro-kernel: computes an `mr x nr` block of C from packed panels, storing it (the
/// first K block) or adding it to what C holds (later K blocks). It runs over packed
/// steps: one K index each, or with `pairs` two K indices as bf16 values in one 32-bit slot.
#[derive(Clone, Copy)]
pub(crate) struct Micro {
    pub name: &'static str,
    mr: usize,
    nr: usize,
    pairs: bool,
    run: MicroFn,
}

impl Micro {
    /// Packed steps for `kc` K indices.
    fn steps(&self, kc: usize) -> usize {
        if self.pairs { kc.div_ceil(2) } else { kc }
    }
}

/// The micro-kernel for a product whose inputs are bf16 values (bf16 data, or f32 rounded
/// to bf16): AVX512-BF16 dot products where the CPU has them and AVX-512 is in force, else
/// [`micro`].
pub(crate) fn micro_for_bf16() -> Micro {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::get_cpu_capability() == CpuCapability::Avx512 && crate::cpu::has_avx512_bf16() {
        return x86::AVX512_BF16;
    }
    micro()
}

/// The micro-kernel for the CPU capability in force.
pub(crate) fn micro() -> Micro {
    match crate::cpu::get_cpu_capability() {
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx512 => x86::AVX512,
        #[cfg(target_arch = "x86_64")]
        CpuCapability::Avx2 => x86::AVX2,
        _ => PORTABLE,
    }
}

const KC: usize = 384;
const NC: usize = 2048;

/// `A (m x k) · B (k x n)` as a row-major `m x n` f32 matrix.
pub(crate) fn gemm<T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: MatView<T>,
    b: MatView<T>,
    rounding: Rounding,
    threads: usize,
) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0f32; m * n];
    }
    // Every element is stored by the first K block: NaN shows any that is not.
    let mut c = vec![f32::NAN; m * n];
    let mk = if T::DTYPE == DType::Bf16 || rounding == Rounding::Bf16 {
        micro_for_bf16()
    } else {
        micro()
    };
    let (mr, nr) = (mk.mr, mk.nr);
    let mc = mr * 16;
    let threads = threads.max(1);
    let a_panels = m.div_ceil(mr);
    let mut packed_a = vec![0f32; a_panels * mr * KC];
    let mut packed_b = vec![0f32; NC.min(n).div_ceil(nr) * nr * KC];
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        let b_panels = nc.div_ceil(nr);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let ks = mk.steps(kc);
            // Pack A (all rows) and B (this column block) in panels, split over threads.
            let a_buf = &mut packed_a[..a_panels * mr * ks];
            let b_buf = &mut packed_b[..b_panels * nr * ks];
            let (pairs, a_rows, b_cols) = (mk.pairs, (pc, kc, m), (pc, kc, jc, jc + nc));
            std::thread::scope(|s| {
                let per = a_panels.div_ceil(threads);
                for (t, chunk) in a_buf.chunks_mut(per * mr * ks).enumerate() {
                    s.spawn(move || pack_a(a, t * per, chunk, mr, a_rows, rounding, pairs));
                }
                let per = b_panels.div_ceil(threads);
                for (t, chunk) in b_buf.chunks_mut(per * nr * ks).enumerate() {
                    s.spawn(move || pack_b(b, t * per, chunk, nr, b_cols, rounding, pairs));
                }
            });
            // Tiles of C: row blocks of mc by column chunks, taken by threads in turn.
            let col_chunks = if m.div_ceil(mc) >= threads {
                1
            } else {
                threads.div_ceil(m.div_ceil(mc))
            };
            let panels_per_chunk = b_panels.div_ceil(col_chunks);
            let items: Vec<(usize, usize)> = (0..m.div_ceil(mc))
                .flat_map(|i| (0..b_panels.div_ceil(panels_per_chunk)).map(move |j| (i, j)))
                .collect();
            let next = std::sync::atomic::AtomicUsize::new(0);
            let c_ptr = SharedOut(c.as_mut_ptr());
            let (a_buf, b_buf) = (&*a_buf, &*b_buf);
            std::thread::scope(|s| {
                for _ in 0..threads.min(items.len()) {
                    s.spawn(|| {
                        while let Some(&(ib, jb)) =
                            items.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                        {
                            let rows = ib * mc..(ib * mc + mc).min(m);
                            let panels =
                                jb * panels_per_chunk..((jb + 1) * panels_per_chunk).min(b_panels);
                            for jp in panels {
                                let b_panel = &b_buf[jp * nr * ks..(jp + 1) * nr * ks];
                                let col0 = jc + jp * nr;
                                let cols = nr.min(n - col0);
                                for ip in (rows.start / mr)..rows.end.div_ceil(mr) {
                                    let a_panel = &a_buf[ip * mr * ks..(ip + 1) * mr * ks];
                                    let row0 = ip * mr;
                                    let rows_here = mr.min(m - row0);
                                    // SAFETY: every (row block, column chunk) item is taken by one
                                    // thread, so the tiles written here are disjoint; the tile lies
                                    // inside the m x n buffer (rows_here and cols are clipped).
                                    unsafe {
                                        tile(
                                            mk,
                                            ks,
                                            a_panel,
                                            b_panel,
                                            c_ptr.get().add(row0 * n + col0),
                                            n,
                                            rows_here,
                                            cols,
                                            pc > 0,
                                        )
                                    };
                                }
                            }
                        }
                    });
                }
            });
        }
    }
    c
}

/// The output pointer, shared by threads that write disjoint tiles.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

impl SharedOut {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: threads write disjoint tiles of the buffer behind the pointer (see `gemm`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// Stores (or with `accumulate`, adds) one `rows x cols` tile (at most `mr x nr`) into C at
/// `c` (row stride `ldc`), over `steps` packed steps.
///
/// # Safety
/// `c` must point at `rows` rows of `cols` writable floats, `ldc` apart, that no other
/// thread touches; the panels must hold `steps` steps of `mr` and `nr` values.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    mk: Micro,
    steps: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    debug_assert!(a.len() >= steps * mk.mr && b.len() >= steps * mk.nr);
    if rows == mk.mr && cols == mk.nr {
        // SAFETY: the panels are long enough (asserted) and C holds a full tile (caller).
        unsafe { (mk.run)(steps, a.as_ptr(), b.as_ptr(), c, ldc, accumulate) };
        return;
    }
    let mut scratch = [0f32; 1024];
    assert!(
        mk.mr * mk.nr <= scratch.len(),
        "the scratch tile holds every micro-kernel's tile"
    );
    // SAFETY: the scratch tile holds mr x nr floats (asserted) with row stride nr.
    unsafe {
        (mk.run)(
            steps,
            a.as_ptr(),
            b.as_ptr(),
            scratch.as_mut_ptr(),
            mk.nr,
            false,
        )
    };
    for r in 0..rows {
        for col in 0..cols {
            let v = scratch[r * mk.nr + col];
            // SAFETY: r < rows and col < cols stay inside the caller's tile.
            unsafe {
                *c.add(r * ldc + col) = if accumulate {
                    *c.add(r * ldc + col) + v
                } else {
                    v
                }
            };
        }
    }
}

/// Two values rounded to bf16 in one 32-bit word, `lo` in the lower half.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> f32 {
    let bits = |x: f32| u32::from(half::bf16::from_f32(x).to_bits());
    f32::from_bits(bits(lo) | bits(hi) << 16)
}

/// One packed slot: a value, or with `pairs` the bf16 values of K indices `k` and `k + 1`
/// (zero past `k_end`) in one 32-bit word.
#[inline(always)]
fn slot(
    value: impl Fn(usize) -> f32,
    k: usize,
    k_end: usize,
    rounding: Rounding,
    pairs: bool,
) -> f32 {
    if !pairs {
        return rounding.apply(value(k));
    }
    let hi = if k + 1 < k_end { value(k + 1) } else { 0.0 };
    pair(value(k), hi)
}

/// Packs A's rows `[first_panel * mr ..)` (one chunk of panels) for K indices
/// `pc..pc + kc` (`rows` is `(pc, kc, m)`): panel `p` holds `out[p][step][row]`, zero past
/// row `m`; with `pairs`, a step holds two K indices.
fn pack_a<T: Element>(
    a: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    mr: usize,
    (pc, kc, m): (usize, usize, usize),
    rounding: Rounding,
    pairs: bool,
) {
    let stride = if pairs { 2 } else { 1 };
    let steps = kc.div_ceil(stride);
    for (p, panel) in out.chunks_mut(mr * steps).enumerate() {
        let row0 = (first_panel + p) * mr;
        for (i, dst) in (0..mr).map(|i| (i, row0 + i)) {
            if dst >= m {
                for step in 0..steps {
                    panel[step * mr + i] = 0.0;
                }
            } else if a.cs == 1 {
                let start = a.offset + dst * a.rs + pc;
                let row = &a.data[start..start + kc];
                if pairs {
                    for (step, two) in row.chunks(2).enumerate() {
                        let hi = two.get(1).map_or(0.0, |x| x.to_f32());
                        panel[step * mr + i] = pair(two[0].to_f32(), hi);
                    }
                } else {
                    for (step, x) in row.iter().enumerate() {
                        panel[step * mr + i] = rounding.apply(x.to_f32());
                    }
                }
            } else {
                for step in 0..steps {
                    let k = pc + step * stride;
                    panel[step * mr + i] = slot(|k| a.at(dst, k), k, pc + kc, rounding, pairs);
                }
            }
        }
    }
}

/// Packs B's columns `[col_begin + first_panel * nr .. col_end)` for K indices
/// `pc..pc + kc` (`cols` is `(pc, kc, col_begin, col_end)`): panel `p` holds
/// `out[p][step][col]`, zero past `col_end`; with `pairs`, a step holds two K indices.
fn pack_b<T: Element>(
    b: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    nr: usize,
    (pc, kc, col_begin, col_end): (usize, usize, usize, usize),
    rounding: Rounding,
    pairs: bool,
) {
    let stride = if pairs { 2 } else { 1 };
    let steps = kc.div_ceil(stride);
    for (p, panel) in out.chunks_mut(nr * steps).enumerate() {
        let col0 = col_begin + (first_panel + p) * nr;
        for step in 0..steps {
            let row = &mut panel[step * nr..(step + 1) * nr];
            let k = pc + step * stride;
            if b.cs == 1 && col0 + nr <= col_end {
                let start = b.offset + k * b.rs + col0;
                let lo = &b.data[start..start + nr];
                if !pairs {
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = rounding.apply(x.to_f32());
                    }
                } else if k + 1 < pc + kc {
                    let hi = &b.data[start + b.rs..start + b.rs + nr];
                    for ((slot, x), y) in row.iter_mut().zip(lo).zip(hi) {
                        *slot = pair(x.to_f32(), y.to_f32());
                    }
                } else {
                    for (slot, x) in row.iter_mut().zip(lo) {
                        *slot = pair(x.to_f32(), 0.0);
                    }
                }
                continue;
            }
            for (j, out) in row.iter_mut().enumerate() {
                let col = col0 + j;
                *out = if col < col_end {
                    slot(|k| b.at(k, col), k, pc + kc, rounding, pairs)
                } else {
                    0.0
                };
            }
        }
    }
}

/// The portable micro-kernel and its tile.
const PORTABLE: Micro = Micro {
    name: "portable",
    mr: 4,
    nr: 8,
    pairs: false,
    run: micro_portable,
};

/// # Safety
/// `a` holds `kc * 4` floats, `b` `kc * 8`, and `c` 4 rows of 8 writable floats `ldc` apart
/// (readable too with `accumulate`).
unsafe fn micro_portable(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the lengths above.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * 4),
            std::slice::from_raw_parts(b, kc * 8),
        )
    };
    let mut acc = [[0f32; 8]; 4];
    for step in 0..kc {
        let bs = &b[step * 8..step * 8 + 8];
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = a[step * 4 + i];
            for (x, &bv) in row.iter_mut().zip(bs) {
                *x = ai.mul_add(bv, *x);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: i < 4 and j < 8 stay inside the caller's tile.
            unsafe {
                *c.add(i * ldc + j) = if accumulate {
                    *c.add(i * ldc + j) + v
                } else {
                    v
                }
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Micro;

    /// The AVX-512 micro-kernel and its tile.
    pub(super) const AVX512: Micro = Micro {
        name: "avx512",
        mr: 6,
        nr: 64,
        pairs: false,
        run: micro_avx512::<6, 4>,
    };

    /// The AVX512-BF16 micro-kernel: the AVX-512 tile over bf16 pairs (`vdpbf16ps`).
    pub(super) const AVX512_BF16: Micro = Micro {
        name: "avx512_bf16",
        mr: 6,
        nr: 64,
        pairs: true,
        run: micro_avx512_bf16::<6, 4>,
    };

    /// As [`micro_avx512`], but each step holds two K indices as bf16 pairs: one
    /// `vdpbf16ps` per accumulator adds both products in f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16; `a` holds `steps * MR` pairs, `b`
    /// `steps * 16 * NV`, and `c` MR rows of `16 * NV` writable floats `ldc` apart.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn micro_avx512_bf16<const MR: usize, const NV: usize>(
        steps: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for step in 0..steps {
            // SAFETY: step < steps, so the reads stay inside the panels (caller). A pair
            // of bf16 values and an f32 are both 32 bits: the casts reinterpret lanes.
            unsafe {
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, slot) in bv.iter_mut().enumerate() {
                    *slot = _mm512_loadu_ps(b.add((step * NV + v) * 16));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai: __m512bh = std::mem::transmute(_mm512_set1_ps(*a.add(step * MR + i)));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, ai, std::mem::transmute::<__m512, __m512bh>(bx));
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// Stores (or adds) the accumulators into C.
    ///
    /// # Safety
    /// As the micro-kernels: `c` has MR rows of `16 * NV` writable floats `ldc` apart.
    #[inline(always)]
    unsafe fn store<const MR: usize, const NV: usize>(
        acc: &[[__m512; NV]; MR],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: row i of the tile has 16 * NV writable floats (caller).
                unsafe {
                    let cv = c.add(i * ldc + v * 16);
                    let out = if accumulate {
                        _mm512_add_ps(_mm512_loadu_ps(cv), x)
                    } else {
                        x
                    };
                    _mm512_storeu_ps(cv, out);
                }
            }
        }
    }

    /// An `MR x (16 * NV)` tile: `MR * NV` zmm accumulators; per step, NV vectors of B and
    /// one broadcast of A per row.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `a` holds `kc * MR` floats, `b` `kc * 16 * NV`, and `c` MR rows
    /// of `16 * NV` writable floats `ldc` apart.
    #[target_feature(enable = "avx512f")]
    unsafe fn micro_avx512<const MR: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for step in 0..kc {
            // SAFETY: step < kc, so the reads stay inside the panels (caller).
            unsafe {
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, slot) in bv.iter_mut().enumerate() {
                    *slot = _mm512_loadu_ps(b.add((step * NV + v) * 16));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*a.add(step * MR + i));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(ai, bx, *x);
                    }
                }
            }
        }
        // SAFETY: C holds the tile (caller).
        unsafe { store::<MR, NV>(&acc, c, ldc, accumulate) };
    }

    /// The AVX2 micro-kernel and its tile.
    pub(super) const AVX2: Micro = Micro {
        name: "avx2",
        mr: 6,
        nr: 16,
        pairs: false,
        run: micro_avx2,
    };

    /// 6 x 16 tile: 12 ymm accumulators, two B vectors and one A broadcast per step.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `a` holds `kc * 6` floats, `b` `kc * 16`, and `c` 6 rows
    /// of 16 writable floats `ldc` apart.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_avx2(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        for step in 0..kc {
            // SAFETY: step < kc, so the reads stay inside the panels (caller).
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(step * 16));
                let b1 = _mm256_loadu_ps(b.add(step * 16 + 8));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm256_set1_ps(*a.add(step * 6 + i));
                    row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: row i of the tile has 16 writable floats (caller).
            unsafe {
                let cr = c.add(i * ldc);
                let (mut v0, mut v1) = (row[0], row[1]);
                if accumulate {
                    v0 = _mm256_add_ps(_mm256_loadu_ps(cr), v0);
                    v1 = _mm256_add_ps(_mm256_loadu_ps(cr.add(8)), v1);
                }
                _mm256_storeu_ps(cr, v0);
                _mm256_storeu_ps(cr.add(8), v1);
            }
        }
    }
}

/// `A · B` in f64 (the reference path), row-major `m x n`.
pub(crate) fn gemm_f64(
    m: usize,
    n: usize,
    k: usize,
    a: MatView<f64>,
    b: MatView<f64>,
    threads: usize,
) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    if n == 0 {
        return c;
    }
    let rows_per = m.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (t, chunk) in c.chunks_mut(rows_per * n).enumerate() {
            s.spawn(move || {
                for (r, row) in chunk.chunks_mut(n).enumerate() {
                    let i = t * rows_per + r;
                    for p in 0..k {
                        let x = a.data[a.offset + i * a.rs + p * a.cs];
                        for (j, out) in row.iter_mut().enumerate() {
                            *out += x * b.data[b.offset + p * b.rs + j * b.cs];
                        }
                    }
                }
            });
        }
    });
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_keeps_the_declared_mantissa() {
        let x = 1.0 + f32::EPSILON * 3.0;
        assert_eq!(Rounding::None.apply(x), x);
        assert_eq!(Rounding::Tf32.apply(x), 1.0);
        assert_eq!(
            Rounding::Bf16.apply(1.0 + 1.0 / 256.0 + 1.0 / 1024.0),
            1.0 + 1.0 / 128.0
        );
        assert_eq!(Rounding::Bf16.apply(f32::INFINITY), f32::INFINITY);
        assert!(Rounding::Tf32.apply(f32::NAN).is_nan());
    }
}
