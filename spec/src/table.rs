//! The types of the generated dispatch table: what `build.rs` writes, the library reads.

use crate::keys::{Family, KernelKey};

/// A kernel as built for CUDA.
#[derive(Debug)]
pub struct CudaKernel {
    /// Threads per block.
    pub threads: [u32; 3],
    /// Output tile one block covers.
    pub tile: [u32; 2],
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
    /// Lowest compute capability (× 10) it runs on.
    pub min_sm: u32,
    /// Content hash of the kernel's rendered source.
    pub hash: u64,
}

/// A kernel as built for wgpu (WGSL) and Metal (MSL).
#[derive(Debug)]
pub struct WgslKernel {
    /// Workgroup size.
    pub threads: [u32; 3],
    /// Output tile one workgroup covers.
    pub tile: [u32; 2],
    /// Workgroup memory in bytes.
    pub shared_bytes: u32,
    /// Whether the adapter must have `shader-f16`.
    pub needs_f16: bool,
    /// The validated WGSL module (entry point `main`).
    pub wgsl: &'static str,
    /// The same module translated to Metal Shading Language by naga.
    pub msl: &'static str,
}

/// One entry of the dispatch table.
#[derive(Debug)]
pub struct KernelEntry {
    /// What it computes.
    pub key: KernelKey,
    /// Entry point name (CUDA) and file stem.
    pub name: &'static str,
    /// The CUDA build, if CUDA serves this key.
    pub cuda: Option<CudaKernel>,
    /// The WGSL/MSL build, if wgpu serves this key.
    pub wgsl: Option<WgslKernel>,
}

impl KernelEntry {
    /// Whether a CUDA device of compute capability `sm` (× 10) runs this kernel.
    pub fn runs_on_sm(&self, sm: u32) -> bool {
        self.cuda.as_ref().is_some_and(|cuda| cuda.min_sm <= sm)
    }
}

/// One CUDA module: the variants of a family that run on one tier (see
/// `variants::PTX_TIERS`), compiled together.
#[derive(Debug)]
pub struct CudaModuleSource {
    /// The family.
    pub family: Family,
    /// The virtual architecture (× 10) the module is built for: it holds the family's
    /// variants whose `min_sm` is at most this.
    pub tier: u32,
    /// The rendered CUDA source (for run-time compilation when no PTX was built).
    pub source: &'static str,
    /// Content hash of `source`, the tier and the compile options.
    pub hash: u64,
    /// PTX for `compute_{tier}` generated at build time; `None` without NVRTC.
    pub ptx: Option<&'static str>,
    /// SASS images (cubins) assembled from `ptx` by ptxas at build time, by real
    /// architecture (× 10); empty without NVRTC or ptxas.
    pub cubins: &'static [(u32, &'static [u8])],
}

/// FNV-1a, 64-bit: a stable content hash (the same on every machine and build).
pub fn content_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
