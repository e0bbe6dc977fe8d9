//! The CPU kernels in force: chosen once per process from the CPU capability in force
//! (detected, capped by `ATEN_CPU_CAPABILITY`), as a table that GEMM and attention read
//! instead of matching the capability on every call.

use std::sync::OnceLock;

use super::attention::{self, BfPairs, BlockArgs};
use super::gemm::{self, Micro};

/// One table of kernels for the capability in force.
pub(crate) struct CpuKernels {
    /// GEMM's micro-kernel for f32 products (and 16-bit inputs widened to f32).
    pub(crate) gemm: Micro,
    /// GEMM's micro-kernel for bf16 values (bf16 data, or f32 rounded to bf16).
    pub(crate) gemm_bf16: Micro,
    /// Attention's fused block.
    pub(crate) attention_block: fn(BlockArgs),
    /// Whether that block reads the keys as rows (else as transposed blocks).
    pub(crate) attention_reads_key_rows: bool,
    /// Attention's fused block on bf16 dot products, where they pay.
    pub(crate) attention_block_bf16: Option<fn(BlockArgs<BfPairs>)>,
}

/// The table, built on first use.
pub(crate) fn cpu_kernels() -> &'static CpuKernels {
    static KERNELS: OnceLock<CpuKernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let (attention_block, attention_reads_key_rows) = attention::block_in_force();
        CpuKernels {
            gemm: gemm::micro_in_force(),
            gemm_bf16: gemm::micro_for_bf16_in_force(),
            attention_block,
            attention_reads_key_rows,
            attention_block_bf16: attention::bf16_block_in_force(),
        }
    })
}
