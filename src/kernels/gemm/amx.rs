//! Products of bf16 values on Intel AMX: `tdpbf16ps` multiplies a 16 x 32 bf16 tile of A by
//! a 32 x 16 tile of B (in bf16 pairs) into a 16 x 16 f32 tile. Each 32 x 32 block of C is
//! four such tiles, accumulated over K 32 indices at a time. A is copied once into bf16
//! tiles, each 16 rows x 32 K values contiguous (1 KiB: rows of a tile 4 KiB apart would
//! fall in one L1 set), padded to whole tiles; B is packed in bf16 pairs by the common
//! packing (the layout AMX reads), 32 columns per panel; partial blocks of C go through a
//! padded buffer.
//!
//! It serves bf16 inputs and f32 inputs rounded to bf16 (fp32 precision "medium"), where the
//! CPU has AMX-BF16 and AMX-TILE, the OS grants the tile state (`arch_prctl`), and the
//! AVX-512 level is in force (a capability cap below it turns AMX off too).

use std::arch::asm;
use std::sync::{Barrier, OnceLock};

use super::driver::SharedOut;
use super::pack::{bf16_bits, pack_b};
use super::{MatView, Rounding};
use crate::DType;
use crate::core::tensor::{Element, host_zeros};
use crate::runtime::cpu::CpuCapability;

/// Rows and columns of C one block computes (2 x 2 tiles of 16 x 16).
const BLOCK: usize = 32;
/// K indices per tile step (32 bf16 values, 64 bytes per tile row).
const K_STEP: usize = 32;
/// K indices per packed B block (512 pair rows of a panel, 64 KiB): fewer blocks mean fewer
/// reloads of C's tiles; 1024 measured faster than 256, 512 and 2048 at n = 2048.
const KC: usize = 1024;
/// Columns of B per packed block (2 MiB of pairs at KC).
const NC: usize = 1024;
/// Row blocks run against one B panel before the next (their A tiles, 512 KiB at KC, stay
/// in L2 while the panel streams past them).
const GROUP: usize = 8;

/// The kernel's name in the trace, where AMX serves a product in `T` with `rounding`.
pub(super) fn kernel<T: Element>(rounding: Rounding) -> Option<&'static str> {
    let bf16_values = (T::DTYPE == DType::Bf16 && rounding == Rounding::None)
        || (T::DTYPE == DType::F32 && rounding == Rounding::Bf16);
    let level = crate::runtime::cpu::get_cpu_capability() == CpuCapability::Avx512;
    (bf16_values && level && crate::runtime::cpu::has_amx_bf16()).then_some("amx_bf16")
}

/// `A (m x k) · B (k x n)` into the row-major `m x n` f32 matrix `c`, on AMX (where
/// [`kernel`] said so). `false` where its buffers cannot be allocated (nothing is written:
/// the caller runs another path).
pub(super) fn gemm<T: Element>(
    c: &mut [f32],
    (m, n, k): (usize, usize, usize),
    a: MatView<T>,
    b: MatView<T>,
    threads: usize,
) -> bool {
    let (mp, np, kp) = (
        m.next_multiple_of(BLOCK),
        n.next_multiple_of(BLOCK),
        k.next_multiple_of(K_STEP),
    );
    let padded = mp != m || np != n;
    let nc_max = NC.min(np);
    // Zeroed by the allocator (fresh pages, no pass over them); the packed B is this
    // thread's from its last product, every panel rewritten before use.
    let (Ok(mut rows), Ok(mut padded_c)) = (
        host_zeros::<u16>("matmul", mp * kp),
        host_zeros::<f32>("matmul", if padded { mp * np } else { 0 }),
    ) else {
        return false;
    };
    let mut packed = PACKED_B.take();
    if packed.len() < nc_max * KC / 2 {
        packed = vec![0f32; nc_max * KC / 2];
    }
    copy_tiles(a, (m, k), kp, &mut rows, threads);
    let (c_ptr, ldc) = if padded {
        (SharedOut(padded_c.as_mut_ptr()), np)
    } else {
        (SharedOut(c.as_mut_ptr()), n)
    };
    let packed_ptr = SharedOut(packed.as_mut_ptr());
    let threads = threads.clamp(
        1,
        m.saturating_mul(n)
            .saturating_mul(k)
            .div_ceil(super::driver::MIN_WORK_PER_THREAD),
    );
    let blocks: Vec<(usize, usize)> = (0..np)
        .step_by(NC)
        .flat_map(|jc| (0..kp).step_by(KC).map(move |pc| (jc, pc)))
        .collect();
    let row_blocks = mp / BLOCK;
    let barrier = OnceLock::new();
    let rows = &rows;
    let worker = |t: usize, team: usize| {
        let barrier = barrier.get_or_init(|| Barrier::new(team));
        let config = TileConfig::new();
        // SAFETY: the CPU has AMX and the process holds the tile state (`kernel` checked
        // both); the configuration is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
        let mine = (t * row_blocks / team)..((t + 1) * row_blocks / team);
        for &(jc, pc) in &blocks {
            let (nc, kc) = (NC.min(np - jc), KC.min(kp - pc));
            let (panels, steps) = (nc / BLOCK, kc / 2);
            // This thread's panels of the B block: packed as pairs, zero past K and N.
            let share = (t * panels / team)..((t + 1) * panels / team);
            for panel in share {
                let at = panel * BLOCK * steps;
                // SAFETY: threads pack disjoint panels of the buffer (nc x kc / 2 floats,
                // within its nc_max x KC / 2), which nobody reads before the barrier.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(packed_ptr.get().add(at), BLOCK * steps)
                };
                let k_real = (k - pc).min(kc);
                let filled = BLOCK * k_real.div_ceil(2);
                pack_b(
                    super::BOperand::View(b),
                    panel,
                    &mut out[..filled],
                    BLOCK,
                    (pc, k_real, jc, n.min(jc + nc)),
                    Rounding::None,
                    true,
                );
                out[filled..].fill(0.0);
            }
            barrier.wait();
            for group in mine.clone().step_by(GROUP) {
                let group = group..(group + GROUP).min(mine.end);
                for panel in 0..panels {
                    for row_block in group.clone() {
                        // SAFETY: the tiles are configured on this thread; the row block's
                        // A tiles hold kp values from pc on (padded), the panel `steps` pair
                        // rows of 32 columns, and C's block lies inside the (padded) output,
                        // written by this thread only (its row blocks).
                        unsafe {
                            block(
                                rows.as_ptr().add(row_block * BLOCK * kp + pc * BLOCK),
                                packed_ptr.get().add(panel * BLOCK * steps),
                                steps,
                                c_ptr
                                    .get()
                                    .add(row_block * BLOCK * ldc + jc + panel * BLOCK),
                                ldc * 4,
                                pc > 0,
                            )
                        };
                    }
                }
            }
            barrier.wait();
        }
        // SAFETY: releases this thread's tile state (configured above).
        unsafe { asm!("tilerelease", options(nostack)) };
    };
    crate::runtime::threads::parallel(threads, &worker);
    PACKED_B.set(packed);
    if padded {
        for (row, out) in c.chunks_exact_mut(n).enumerate() {
            out.copy_from_slice(&padded_c[row * np..row * np + n]);
        }
    }
    true
}

thread_local! {
    /// The packed B block of the last AMX product this thread ran (2 MiB at most).
    static PACKED_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A's `m x k` values as bf16 bits into `tiles`: per block of 32 rows, per 32 K indices, two
/// tiles of 16 rows x 32 values, each contiguous (zero past `k` and `m`).
fn copy_tiles<T: Element>(
    a: MatView<T>,
    (m, k): (usize, usize),
    kp: usize,
    tiles: &mut [u16],
    threads: usize,
) {
    let blocks = m.div_ceil(BLOCK);
    let per = blocks.div_ceil(threads.max(1)).max(1);
    let chunks: Vec<(usize, &mut [u16])> = tiles[..blocks * BLOCK * kp]
        .chunks_mut(per * BLOCK * kp)
        .enumerate()
        .map(|(i, chunk)| (i * per, chunk))
        .collect();
    crate::runtime::threads::for_each(chunks, &|(first, chunk): (usize, &mut [u16])| {
        for (i, block) in chunk.chunks_exact_mut(BLOCK * kp).enumerate() {
            for r in 0..BLOCK.min(m - (first + i) * BLOCK) {
                let row = (first + i) * BLOCK + r;
                // Row r of the block: in tile r / 16 of each K chunk, at row r % 16.
                let at = |chunk: usize| (chunk * 2 + r / 16) * 16 * K_STEP + r % 16 * K_STEP;
                for (chunk, k0) in (0..k).step_by(K_STEP).enumerate() {
                    let len = K_STEP.min(k - k0);
                    let out = &mut block[at(chunk)..at(chunk) + len];
                    if T::DTYPE == DType::Bf16 && a.cs == 1 {
                        let start = a.offset + row * a.rs + k0;
                        out.copy_from_slice(bytemuck::cast_slice(&a.data[start..start + len]));
                    } else {
                        for (p, value) in out.iter_mut().enumerate() {
                            *value =
                                bf16_bits(a.data[a.offset + row * a.rs + (k0 + p) * a.cs]) as u16;
                        }
                    }
                }
            }
        }
    });
}

/// The tile configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new() -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for tile in 0..8 {
            bytes[16 + 2 * tile] = 64;
            bytes[48 + tile] = 16;
        }
        TileConfig(bytes)
    }
}

/// `C (32 x 32 f32 at c, rows ldc bytes apart) = A · B`, or `+=` with `accumulate`: A is
/// `steps / 16` pairs of contiguous 16 x 32 bf16 tiles (2 KiB per 32 K indices), B a panel
/// of `steps` rows of 32 bf16 pairs (128 bytes each), `steps` a multiple of 16. Tiles 0-3
/// hold C, 4-5 A, 6-7 B.
///
/// # Safety
/// The tiles are configured on this thread (16 rows of 64 bytes each); A holds `steps / 16`
/// tile pairs, the panel `steps` rows, and C's 32 rows 32 writable floats.
#[inline]
unsafe fn block(
    a: *const u16,
    b: *const f32,
    steps: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller's contract; the loop reads 2 KiB of A and 16 rows of 128 bytes of B
    // per 16 steps, and the stores write C's 32 rows of 128 bytes.
    unsafe {
        asm!(
            "lea {t}, [{c} + {ldc}*8]",
            "lea {t}, [{t} + {ldc}*8]",
            "test {acc:e}, {acc:e}",
            "jz 2f",
            "tileloadd tmm0, [{c} + {ldc}*1]",
            "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
            "tileloadd tmm2, [{t} + {ldc}*1]",
            "tileloadd tmm3, [{t} + {ldc}*1 + 64]",
            "jmp 3f",
            "2:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "3:",
            // Each step reads 2 KiB of A and of B; four lines of each, two steps ahead, are
            // asked for early (every line measured slower: the loads then queue behind them).
            "4:",
            "prefetcht0 [{a} + 4096]",
            "prefetcht0 [{b} + 4096]",
            "prefetcht0 [{a} + 4608]",
            "prefetcht0 [{b} + 4608]",
            "prefetcht0 [{a} + 5120]",
            "prefetcht0 [{b} + 5120]",
            "prefetcht0 [{a} + 5632]",
            "prefetcht0 [{b} + 5632]",
            "tileloadd tmm4, [{a} + {lda}*1]",
            "tileloadd tmm5, [{a} + {lda}*1 + 1024]",
            "tileloadd tmm6, [{b} + {ldb}*1]",
            "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {b}, 2048",
            "dec {n}",
            "jnz 4b",
            "lea {t}, [{c} + {ldc}*8]",
            "lea {t}, [{t} + {ldc}*8]",
            "tilestored [{c} + {ldc}*1], tmm0",
            "tilestored [{c} + {ldc}*1 + 64], tmm1",
            "tilestored [{t} + {ldc}*1], tmm2",
            "tilestored [{t} + {ldc}*1 + 64], tmm3",
            a = inout(reg) a => _,
            lda = in(reg) 64usize,
            b = inout(reg) b => _,
            ldb = in(reg) 128usize,
            n = inout(reg) steps / 16 => _,
            c = in(reg) c,
            ldc = in(reg) ldc,
            acc = in(reg) u32::from(accumulate),
            t = out(reg) _,
            options(nostack),
        )
    };
}
