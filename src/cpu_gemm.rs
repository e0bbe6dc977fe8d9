//! CPU GEMM: cache-blocked and packed, with SIMD micro-kernels for AVX-512 and AVX2+FMA and
//! a portable fallback, chosen from [`crate::cpu::get_cpu_capability`], on the library's
//! threads. fp16/bf16 inputs are widened to f32 while packing, and every product is
//! accumulated in f32, in a fixed order: results are bit-identical run to run and do not
//! depend on the thread count.

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
/// first K block) or adding it to what C holds (later K blocks).
#[derive(Clone, Copy)]
pub(crate) struct Micro {
    pub name: &'static str,
    mr: usize,
    nr: usize,
    run: MicroFn,
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
    let mk = micro();
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
            // Pack A (all rows) and B (this column block) in panels, split over threads.
            let a_buf = &mut packed_a[..a_panels * mr * kc];
            let b_buf = &mut packed_b[..b_panels * nr * kc];
            std::thread::scope(|s| {
                let per = a_panels.div_ceil(threads);
                for (t, chunk) in a_buf.chunks_mut(per * mr * kc).enumerate() {
                    s.spawn(move || pack_a(a, t * per, chunk, mr, kc, pc, m, rounding));
                }
                let per = b_panels.div_ceil(threads);
                for (t, chunk) in b_buf.chunks_mut(per * nr * kc).enumerate() {
                    s.spawn(move || pack_b(b, t * per, chunk, nr, kc, pc, jc, jc + nc, rounding));
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
                                let b_panel = &b_buf[jp * nr * kc..(jp + 1) * nr * kc];
                                let col0 = jc + jp * nr;
                                let cols = nr.min(n - col0);
                                for ip in (rows.start / mr)..rows.end.div_ceil(mr) {
                                    let a_panel = &a_buf[ip * mr * kc..(ip + 1) * mr * kc];
                                    let row0 = ip * mr;
                                    let rows_here = mr.min(m - row0);
                                    // SAFETY: every (row block, column chunk) item is taken by one
                                    // thread, so the tiles written here are disjoint; the tile lies
                                    // inside the m x n buffer (rows_here and cols are clipped).
                                    unsafe {
                                        tile(
                                            mk,
                                            kc,
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
/// `c` (row stride `ldc`).
///
/// # Safety
/// `c` must point at `rows` rows of `cols` writable floats, `ldc` apart, that no other
/// thread touches; the panels must hold `kc` steps of `mr` and `nr` values.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    mk: Micro,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    debug_assert!(a.len() >= kc * mk.mr && b.len() >= kc * mk.nr);
    if rows == mk.mr && cols == mk.nr {
        // SAFETY: the panels are long enough (asserted) and C holds a full tile (caller).
        unsafe { (mk.run)(kc, a.as_ptr(), b.as_ptr(), c, ldc, accumulate) };
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
            kc,
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

/// Packs A's rows `[first_panel * mr ..)` (one chunk of panels) for steps `pc..pc + kc`:
/// panel `p` holds `out[p][step][row]`, zero past row `m`.
#[allow(clippy::too_many_arguments)]
fn pack_a<T: Element>(
    a: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    mr: usize,
    kc: usize,
    pc: usize,
    m: usize,
    rounding: Rounding,
) {
    for (p, panel) in out.chunks_mut(mr * kc).enumerate() {
        let row0 = (first_panel + p) * mr;
        for (i, dst) in (0..mr).map(|i| (i, row0 + i)) {
            if dst < m && a.cs == 1 {
                let start = a.offset + dst * a.rs + pc;
                for (step, x) in a.data[start..start + kc].iter().enumerate() {
                    panel[step * mr + i] = rounding.apply(x.to_f32());
                }
            } else if dst < m {
                for step in 0..kc {
                    panel[step * mr + i] = rounding.apply(a.at(dst, pc + step));
                }
            } else {
                for step in 0..kc {
                    panel[step * mr + i] = 0.0;
                }
            }
        }
    }
}

/// Packs B's columns `[col_begin + first_panel * nr .. col_end)` for steps `pc..pc + kc`:
/// panel `p` holds `out[p][step][col]`, zero past `col_end`.
#[allow(clippy::too_many_arguments)]
fn pack_b<T: Element>(
    b: MatView<T>,
    first_panel: usize,
    out: &mut [f32],
    nr: usize,
    kc: usize,
    pc: usize,
    col_begin: usize,
    col_end: usize,
    rounding: Rounding,
) {
    for (p, panel) in out.chunks_mut(nr * kc).enumerate() {
        let col0 = col_begin + (first_panel + p) * nr;
        for step in 0..kc {
            let row = &mut panel[step * nr..(step + 1) * nr];
            if b.cs == 1 && col0 + nr <= col_end {
                let start = b.offset + (pc + step) * b.rs + col0;
                for (slot, x) in row.iter_mut().zip(&b.data[start..start + nr]) {
                    *slot = rounding.apply(x.to_f32());
                }
                continue;
            }
            for (j, slot) in row.iter_mut().enumerate() {
                let col = col0 + j;
                *slot = if col < col_end {
                    rounding.apply(b.at(pc + step, col))
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
        run: micro_avx512::<6, 4>,
    };

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

    /// The AVX2 micro-kernel and its tile.
    pub(super) const AVX2: Micro = Micro {
        name: "avx2",
        mr: 6,
        nr: 16,
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
