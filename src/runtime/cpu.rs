//! This machine's CPU: the vector level the CPU kernels dispatch on, its features, caches
//! and the speed of its bf16 dot products (`torch.backends.cpu` re-exports the queries).
//!
//! The level is detected once (x86 feature detection, capped by the environment
//! variable `ATEN_CPU_CAPABILITY`) and cached; every later call is one atomic load.

use std::sync::OnceLock;

use crate::core::flag::option_enum;

option_enum! {
    /// A CPU vector level, spelled as PyTorch's `get_cpu_capability()` prints it.
    pub enum CpuCapability ("CPU capability") {
        /// Baseline code (x86-64 with AVX but without AVX2+FMA; other architectures).
        Default = "DEFAULT",
        /// POWER vector-scalar extension.
        Vsx = "VSX",
        /// IBM z vector facility.
        ZVector = "Z VECTOR" | "zvector",
        /// x86-64 without AVX.
        NoAvx = "NO AVX",
        /// AVX2 with FMA.
        Avx2 = "AVX2",
        /// AVX-512 F, BW, VL and DQ, with FMA.
        Avx512 = "AVX512",
        /// Arm SVE with 256-bit vectors.
        Sve256 = "SVE256",
    }
}

impl CpuCapability {
    /// Rank within one architecture family; a cap may only lower the rank.
    fn rank(self) -> u8 {
        match self {
            CpuCapability::NoAvx => 0,
            CpuCapability::Default => 1,
            CpuCapability::Vsx | CpuCapability::ZVector | CpuCapability::Sve256 => 2,
            CpuCapability::Avx2 => 2,
            CpuCapability::Avx512 => 3,
        }
    }

    fn is_x86(self) -> bool {
        matches!(
            self,
            CpuCapability::NoAvx
                | CpuCapability::Default
                | CpuCapability::Avx2
                | CpuCapability::Avx512
        )
    }
}

/// The environment variable that caps the CPU capability.
pub const CAPABILITY_ENV: &str = "ATEN_CPU_CAPABILITY";

struct Levels {
    detected: CpuCapability,
    used: CpuCapability,
    requested: Option<String>,
}

fn levels() -> &'static Levels {
    static LEVELS: OnceLock<Levels> = OnceLock::new();
    LEVELS.get_or_init(|| {
        let detected = detect();
        let requested = std::env::var(CAPABILITY_ENV).ok();
        let used = match requested.as_deref() {
            None | Some("") => detected,
            Some(text) => cap(detected, text),
        };
        Levels {
            detected,
            used,
            requested,
        }
    })
}

/// The level the env var asks for, where it may lower `detected`; else `detected`.
fn cap(detected: CpuCapability, requested: &str) -> CpuCapability {
    match requested.parse::<CpuCapability>() {
        Ok(wanted)
            if wanted == detected
                || wanted == CpuCapability::Default && detected != CpuCapability::NoAvx
                || wanted.is_x86() && detected.is_x86() && wanted.rank() <= detected.rank() =>
        {
            wanted
        }
        Ok(wanted) => {
            log::warn!(
                "{CAPABILITY_ENV}={requested} asks for {wanted}, above what this CPU has ({detected}); using {detected}"
            );
            detected
        }
        Err(err) => {
            log::warn!("{CAPABILITY_ENV}: {err}; using {detected}");
            detected
        }
    }
}

/// The vector level the CPU kernels use: the detected one, capped by `ATEN_CPU_CAPABILITY`.
pub fn get_cpu_capability() -> CpuCapability {
    levels().used
}

/// The vector level this CPU supports, before any cap.
pub fn detected_cpu_capability() -> CpuCapability {
    levels().detected
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuCapability {
    use std::arch::is_x86_feature_detected as has;
    // AVX-512 as PyTorch defines the level: F, BW, VL and DQ, with FMA (the AVX-512 kernels
    // are compiled with FMA enabled).
    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") && has!("fma") {
        CpuCapability::Avx512
    } else if has!("avx2") && has!("fma") {
        CpuCapability::Avx2
    } else if has!("avx") {
        CpuCapability::Default
    } else {
        CpuCapability::NoAvx
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> CpuCapability {
    // The default SVE vector length, in bytes, as the kernel reports it.
    let vector_bytes = std::fs::read_to_string("/proc/sys/abi/sve_default_vector_length")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if std::arch::is_aarch64_feature_detected!("sve") && vector_bytes == Some(32) {
        CpuCapability::Sve256
    } else {
        CpuCapability::Default
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> CpuCapability {
    CpuCapability::Default
}

/// Proof that the AVX-512 level (F, BW, VL, DQ and FMA) is in force: only [`Avx512Token::get`]
/// makes one, after checking, so that code compiled for that level is safe to call with it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Token(());

impl Avx512Token {
    /// The proof, where the capability in force is AVX-512.
    pub(crate) fn get() -> Option<Avx512Token> {
        (get_cpu_capability() == CpuCapability::Avx512).then_some(Avx512Token(()))
    }
}

/// Proof that AVX2 and FMA are available: the AVX2 level or above is in force (only
/// [`Avx2Token::get`] makes one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2Token(());

impl Avx2Token {
    /// The proof, where the capability in force is AVX2 or AVX-512 (which implies it).
    pub(crate) fn get() -> Option<Avx2Token> {
        matches!(
            get_cpu_capability(),
            CpuCapability::Avx2 | CpuCapability::Avx512
        )
        .then_some(Avx2Token(()))
    }
}

/// Proof that the AVX-512 level is in force and the CPU has AVX512-BF16 dot products (only
/// [`Avx512Bf16Token::get`] makes one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Bf16Token(());

impl Avx512Bf16Token {
    /// The proof, where the capability in force is AVX-512 and the CPU has AVX512-BF16.
    pub(crate) fn get() -> Option<Avx512Bf16Token> {
        (Avx512Token::get().is_some() && has_avx512_bf16()).then_some(Avx512Bf16Token(()))
    }
}

/// Whether products of bf16 values should run on AVX512-BF16 dot products: the AVX-512
/// level is in force and the CPU runs them well faster than f32 FMAs (see
/// [`bf16_dot_speedup`]); else widening them to f32 is as fast or faster.
pub(crate) fn bf16_dots_pay() -> bool {
    Avx512Bf16Token::get().is_some() && bf16_dot_speedup().is_some_and(|speedup| speedup > 1.5)
}

/// Whether this CPU has AVX-512 BF16 dot products (the relaxed bf16 matmul path).
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has Intel AMX with bf16 tiles (AMX-BF16, AMX-TILE) and the OS lets this
/// process use the tile state (asked of Linux once per process: without it the first tile
/// instruction faults). Where it does, bf16 matmuls (and f32 ones at "medium" precision)
/// run on AMX at the AVX-512 level.
pub fn has_amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *GRANTED.get_or_init(|| {
            use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
            // Leaf 7 is read only where the CPU reports it.
            if __get_cpuid_max(0).0 < 7 {
                return false;
            }
            let leaf7 = __cpuid_count(7, 0);
            let (bf16, tile) = (leaf7.edx >> 22 & 1 == 1, leaf7.edx >> 24 & 1 == 1);
            bf16 && tile && request_tile_state()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks Linux for the AMX tile data state of this process.
#[cfg(target_arch = "x86_64")]
fn request_tile_state() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: this arch_prctl request only asks the kernel to enable a register state
        // for the process; it reads and writes no memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Whether code compiled without a target feature has a hardware fused multiply-add
/// (aarch64 always; x86-64 only when the whole build targets FMA).
pub(crate) const BASELINE_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// `a·b + c`, with one rounding where `FUSED`, else a multiply and an add: the portable
/// kernels take [`BASELINE_FMA`], since without the instruction `f32::mul_add` is a
/// library routine that made them ~100x slower.
#[inline(always)]
pub(crate) fn mul_add<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// How fast this CPU's AVX512-BF16 dot products (`vdpbf16ps`, two products per lane) run
/// next to its f32 FMAs, in multiply-adds per second: about 2 where both retire at the same
/// rate (AMD Zen 4), about 1 where the dot products take twice as long (Intel cores without
/// AMX), in which case bf16 GEMM runs faster widened to f32. Measured once per process, in a
/// fraction of a millisecond; `None` without AVX512-BF16.
pub fn bf16_dot_speedup() -> Option<f64> {
    static SPEEDUP: OnceLock<Option<f64>> = OnceLock::new();
    *SPEEDUP.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() && std::arch::is_x86_feature_detected!("avx512f") {
            return Some(probe::bf16_dot_speedup());
        }
        None
    })
}

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Independent accumulators per loop, as many as the GEMM tile has (with 12, latency
    /// bounded the dot products on an Intel Xeon).
    const CHAINS: usize = 24;
    /// Loop trips per timing: ~50 000 instructions, a few microseconds.
    const TRIPS: usize = 4096;

    /// The best of a few alternating timings of the two loops (the first of each untimed:
    /// it pays for the switch to 512-bit execution).
    pub(super) fn bf16_dot_speedup() -> f64 {
        let time = |run: &dyn Fn() -> f32| {
            let start = Instant::now();
            std::hint::black_box(run());
            start.elapsed().as_secs_f64()
        };
        // SAFETY: the caller checked AVX-512F and AVX512-BF16.
        let fma = || unsafe { fma_chains(std::hint::black_box(TRIPS)) };
        // SAFETY: as above.
        let dot = || unsafe { dot_chains(std::hint::black_box(TRIPS)) };
        let (mut t_fma, mut t_dot) = (f64::MAX, f64::MAX);
        for trial in 0..8 {
            let (f, d) = (time(&fma), time(&dot));
            if trial > 0 {
                (t_fma, t_dot) = (t_fma.min(f), t_dot.min(d));
            }
        }
        2.0 * t_fma / t_dot
    }

    /// `CHAINS` accumulators, `trips` f32 FMAs each.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn fma_chains(trips: usize) -> f32 {
        let (x, y) = (_mm512_set1_ps(1e-3), _mm512_set1_ps(1e-3));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..trips {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(x, y, *a);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }

    /// `CHAINS` accumulators, `trips` bf16 pair dot products each.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dot_chains(trips: usize) -> f32 {
        let pairs = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3), _mm512_set1_ps(1e-3));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..trips {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, pairs, pairs);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }
}

/// The vector features this CPU reports that the kernels care about.
pub fn features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let all = [
            ("avx", has!("avx")),
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512dq", has!("avx512dq")),
            ("avx512vnni", has!("avx512vnni")),
            ("avx512bf16", has!("avx512bf16")),
            ("avx512fp16", has!("avx512fp16")),
            ("amx-bf16", has_amx_bf16()),
        ];
        all.into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect()
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        let all = [
            ("neon", has!("neon")),
            ("sve", has!("sve")),
            ("bf16", has!("bf16")),
        ];
        all.into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect()
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

/// The CPU's model name as the OS reports it, where it does.
pub fn model_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            matches!(key.trim(), "model name" | "Model" | "cpu model")
                .then(|| value.trim().to_string())
        })
        .filter(|name| !name.is_empty())
}

/// The L2 cache of one core, in bytes, as the OS reports it (read once); 1 MiB where it
/// does not say.
pub fn l2_cache_bytes() -> usize {
    static L2: OnceLock<usize> = OnceLock::new();
    *L2.get_or_init(|| {
        (0..8)
            .find_map(|index| {
                let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
                let read = |file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok();
                let level = read("level")?;
                let kind = read("type")?;
                (level.trim() == "2" && kind.trim() != "Instruction")
                    .then(|| parse_cache_size(&read("size")?))
                    .flatten()
            })
            .unwrap_or(1 << 20)
    })
}

/// A cache size as sysfs writes it: `2048K`, `1M` or a byte count.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

/// Where the level in use comes from: `detected`, or the environment variable that capped it.
pub(crate) fn capability_source() -> String {
    match &levels().requested {
        Some(value) => format!("env {CAPABILITY_ENV}={value}"),
        None => "detected".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CpuCapability::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("524288"), Some(1 << 19));
        assert_eq!(parse_cache_size("12Q"), None);
        assert_eq!(parse_cache_size(""), None);
        assert!(l2_cache_bytes() >= 1 << 10);
    }

    #[test]
    fn cap_lowers_but_never_raises() {
        assert_eq!(cap(Avx512, "avx2"), Avx2);
        assert_eq!(cap(Avx512, "default"), Default);
        assert_eq!(cap(Avx512, "AVX512"), Avx512);
        assert_eq!(cap(Avx2, "avx512"), Avx2);
        assert_eq!(cap(NoAvx, "default"), NoAvx);
        assert_eq!(cap(Avx2, "sve256"), Avx2);
        assert_eq!(cap(Sve256, "default"), Default);
        assert_eq!(cap(Avx2, "fast please"), Avx2);
    }

    #[test]
    fn spellings_round_trip() {
        for &c in CpuCapability::ALL {
            assert_eq!(c.to_string().parse::<CpuCapability>().unwrap(), c);
        }
        assert_eq!("zvector".parse::<CpuCapability>().unwrap(), ZVector);
        assert_eq!("no avx".parse::<CpuCapability>().unwrap(), NoAvx);
        let err = "avx1024".parse::<CpuCapability>().unwrap_err().to_string();
        assert!(err.contains("AVX512") && err.contains("avx1024"), "{err}");
    }

    #[test]
    fn detection_agrees_with_the_feature_list() {
        let feats = features();
        let detected = detected_cpu_capability();
        if detected == Avx512 {
            assert!(
                ["avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"]
                    .iter()
                    .all(|f| feats.contains(f))
            );
        }
        if cfg!(target_arch = "x86_64") && feats.contains(&"avx2") && feats.contains(&"fma") {
            assert!(matches!(detected, Avx2 | Avx512));
        }
        assert!(get_cpu_capability().rank() <= detected.rank());
    }
}
