//! The generated kernel table: it covers exactly the declared variants, every variant has
//! its WGSL (valid for naga) and MSL and, where NVRTC was present at build time, PTX for
//! its tier at an ISA every CUDA 12 driver loads, which `ptxas` accepts, and cubins for
//! every declared architecture; devices pick their image by arch; the run-time NVRTC
//! fallback produces the same PTX as the build.

mod common;

use std::process::Command;

use backends::kernels::{
    self, CUBIN_ARCHS, CUDA_MODULES, ENTRIES, Family, FlashKey, KernelKey, ModuleImage, PTX_TIERS,
    PtxParam, lookup,
};
use backends_spec::variants;
use common::in_child;

#[test]
fn the_table_holds_exactly_the_declared_variants() {
    let declared = variants::all();
    assert_eq!(ENTRIES.len(), declared.len());
    for (entry, variant) in ENTRIES.iter().zip(&declared) {
        assert_eq!(entry.key, variant.key);
        assert_eq!(entry.name, variant.name);
        assert_eq!(
            entry.cuda.is_some(),
            variant.cuda.is_some(),
            "{}",
            entry.name
        );
        assert_eq!(
            entry.wgsl.is_some(),
            variant.wgsl.is_some(),
            "{}",
            entry.name
        );
        let found = lookup(&variant.key).expect("every declared key is found");
        assert!(
            std::ptr::eq(found, entry),
            "{} looks up its own entry",
            entry.name
        );
    }
    let undeclared = KernelKey::FlashFwd(FlashKey {
        elem: kernels::Elem::F16,
        head_dim: 512,
        causal: false,
    });
    assert!(lookup(&undeclared).is_none());
}

#[test]
fn every_wgsl_variant_validates_and_has_msl() {
    for entry in ENTRIES.iter() {
        let Some(w) = &entry.wgsl else { continue };
        let msl = backends_codegen::generate::wgsl_to_msl(entry.name, w.wgsl)
            .unwrap_or_else(|e| panic!("naga rejects {}: {e}", entry.name));
        assert_eq!(
            msl, w.msl,
            "{}: the embedded MSL is naga's translation",
            entry.name
        );
        assert!(w.msl.contains("kernel void"), "{}", entry.name);
        assert_eq!(
            w.needs_f16,
            w.wgsl.starts_with("enable f16;"),
            "{}",
            entry.name
        );
    }
}

/// The CUDA entries of `family` that run on `tier`.
fn entries_for(family: Family, tier: u32) -> impl Iterator<Item = &'static kernels::KernelEntry> {
    ENTRIES.iter().filter(move |e| {
        e.key.family() == family && e.cuda.as_ref().is_some_and(|c| c.min_sm <= tier)
    })
}

#[test]
fn every_cuda_module_carries_the_variants_of_its_tier() {
    for family in Family::ALL {
        for tier in PTX_TIERS {
            let module = kernels::cuda_module(family, tier);
            if entries_for(family, tier).count() == 0 {
                assert!(module.is_none(), "{family} compute_{tier}");
                continue;
            }
            let module = module.expect("a family with variants on a tier has a module there");
            assert_eq!(module.tier, tier);
            assert_eq!(
                module.hash,
                backends_codegen::generate::module_hash(module.source, tier)
            );
            for entry in ENTRIES.iter().filter(|e| e.key.family() == family) {
                let Some(cuda) = &entry.cuda else { continue };
                assert_eq!(
                    module
                        .source
                        .contains(&format!("namespace {} {{", entry.name)),
                    cuda.min_sm <= tier,
                    "{} (min sm_{}) in the compute_{tier} module",
                    entry.name,
                    cuda.min_sm
                );
            }
        }
    }
}

#[cfg_attr(
    not(backends_ptx),
    ignore = "no PTX was built: NVRTC was absent or hidden at build time"
)]
#[test]
fn every_module_has_ptx_for_its_tier_that_every_cuda_12_driver_loads() {
    assert_eq!(kernels::PTX_ARCHS, PTX_TIERS);
    for module in CUDA_MODULES.iter() {
        let ptx = module.ptx.expect("PTX for every module");
        let tier = module.tier;
        assert!(
            ptx.contains(&format!(".target sm_{tier}")),
            "{} compute_{tier}",
            module.family
        );
        // ISA 8.0 (NVRTC 12.0): a CUDA 12.0 driver (R525) loads it.
        assert_eq!(kernels::ptx_isa(ptx), Some((8, 0)), "{}", module.family);
        backends::cuda::loader::check_ptx_version(ptx, 12000).unwrap();
        for entry in entries_for(module.family, tier) {
            assert!(
                ptx.contains(&format!(".entry {}(", entry.name)),
                "{} in compute_{tier} PTX",
                entry.name
            );
        }
    }
}

/// The arch a CUDA cubin's ELF header names, after checking that it is one: 64-bit ELF,
/// the CUDA OS ABI (0x33, ELF ABI version 7, as ptxas 12 writes) and machine (EM_CUDA,
/// 190); the arch is the low byte of `e_flags`.
fn cubin_arch(image: &[u8]) -> u32 {
    assert_eq!(&image[..4], b"\x7fELF", "an ELF image");
    assert_eq!(image[4], 2, "64-bit ELF");
    assert_eq!(image[7], 0x33, "the CUDA OS ABI");
    assert_eq!(image[8], 7, "ELF ABI version 7");
    assert_eq!(u16::from_le_bytes([image[18], image[19]]), 190, "EM_CUDA");
    let flags = u32::from_le_bytes(image[48..52].try_into().unwrap());
    flags & 0xff
}

#[cfg_attr(
    not(all(backends_ptx, backends_ptxas)),
    ignore = "needs PTX and ptxas at build time (scripts/setup.sh installs both)"
)]
#[test]
fn every_family_ships_a_cubin_for_every_declared_arch() {
    assert_eq!(kernels::CUBIN_ARCHS_BUILT, CUBIN_ARCHS);
    for family in Family::ALL {
        for arch in CUBIN_ARCHS {
            let Some(module) = kernels::cuda_module(family, arch) else {
                assert_eq!(entries_for(family, arch).count(), 0, "{family} sm_{arch}");
                continue;
            };
            let (_, image) = module
                .cubins
                .iter()
                .find(|(a, _)| *a == arch)
                .unwrap_or_else(|| panic!("{family} has no cubin for sm_{arch}"));
            assert_eq!(cubin_arch(image), arch, "{family} sm_{arch}");
            for entry in entries_for(family, module.tier) {
                let name = entry.name.as_bytes();
                assert!(
                    image.windows(name.len()).any(|w| w == name),
                    "{} in the sm_{arch} cubin",
                    entry.name
                );
            }
        }
    }
}

/// Each kernel's parameter list, as its template's header documents it (and as the CUDA
/// launchers pass it: they check their arguments against the PTX before every launch).
fn documented_params(key: KernelKey) -> Vec<PtxParam> {
    use PtxParam::{B32, B64, F32, F64};
    let n = |p: PtxParam, count: usize| vec![p; count];
    match key.family() {
        // A, B, out; M, N, K, batch, splits, k_slice; 6 operand strides, c_batch, c_row;
        // an implicit-GEMM convolution's groups, H, W, W', kH, kW, 2 strides, 2 pads and 2
        // dilations.
        Family::Gemm => {
            let conv = matches!(key, KernelKey::Gemm(k) if k.conv);
            [
                n(B64, 3),
                n(B32, 6),
                n(B64, 8),
                n(B32, if conv { 12 } else { 0 }),
            ]
            .concat()
        }
        // partials, C; M, N, batch, splits; c_batch, c_row.
        Family::SplitKReduce => [n(B64, 2), n(B32, 4), n(B64, 2)].concat(),
        // q, k, v, o, lse; H, Hk, Lq, Lk, D; scale; lo, hi, lower_right, split_len; 12
        // strides, o_z, lse_z; dropout_p, seed.
        Family::FlashFwd => [
            n(B64, 5),
            n(B32, 5),
            vec![F32, B32, B32, B32, B32],
            n(B64, 14),
            vec![F64, B64],
        ]
        .concat(),
        // q, k, v, mask, o, lse; H, Hk, Lq, Lk, D; scale; band, lo, hi, lower_right; 16
        // strides; seq; seqs, seq_k, table, per_seq, block; lse_b, lse_h; dropout_p, seed.
        Family::MemEffFwd => [
            n(B64, 6),
            n(B32, 5),
            vec![F32, B32, B32, B32, B32],
            n(B64, 17),
            n(B32, 5),
            n(B64, 2),
            vec![F64, B64],
        ]
        .concat(),
        // x; n; factor.
        Family::Scale => vec![B64, B64, F64],
        // x; n, rows, cols, diagonal; keep_upper, unit_diagonal.
        Family::Triangle => [n(B64, 5), n(B32, 2)].concat(),
        // src, dst; n, offset; 8 sizes; 8 strides.
        Family::StridedCopy => [n(B64, 2), n(B64, 18)].concat(),
        // x, bias; n, inner, channels.
        Family::BiasAdd => n(B64, 5),
        // partial, partial_lse, out, lse; B, H, Lq, Dv, S; 4 partial strides, 4 lse
        // strides.
        Family::AttentionCombine => [n(B64, 4), n(B32, 5), n(B64, 8)].concat(),
        // in, out; n.
        Family::Convert => n(B64, 3),
        // s, mask, p; H, Lq, Lk; scale; band, lo, hi, lower_right; 4 mask strides;
        // dropout_p, seed.
        Family::MaskedSoftmax => [
            n(B64, 3),
            n(B32, 3),
            vec![F32, B32, B32, B32, B32],
            n(B64, 4),
            vec![F64, B64],
        ]
        .concat(),
    }
}

#[cfg_attr(
    not(backends_ptx),
    ignore = "no PTX was built: NVRTC was absent or hidden at build time"
)]
#[test]
fn every_cuda_kernel_takes_the_documented_parameters() {
    for module in CUDA_MODULES.iter() {
        let ptx = module.ptx.expect("PTX for every module");
        for entry in entries_for(module.family, module.tier) {
            assert_eq!(
                kernels::ptx_params(ptx, entry.name),
                Some(documented_params(entry.key)),
                "{} for compute_{}",
                entry.name,
                module.tier
            );
        }
    }
}

/// One kernel's resources as ptxas reports them.
#[derive(Debug, Default)]
struct Resources {
    kernel: String,
    arch: u32,
    registers: u32,
    shared_bytes: u32,
    spill_stores: u32,
    spill_loads: u32,
}

fn number_before(text: &str, unit: &str) -> Option<u32> {
    let end = text.find(unit)?;
    text[..end].split_whitespace().last()?.parse().ok()
}

fn parse_ptxas(log: &str, arch: u32) -> Vec<Resources> {
    let mut out: Vec<Resources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(Resources {
                kernel: name,
                arch,
                ..Default::default()
            });
        } else if let Some(last) = out.last_mut() {
            if line.contains("spill stores") {
                last.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                last.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                last.registers = number_before(line, "registers").unwrap_or(0);
                last.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

#[cfg_attr(
    not(all(backends_ptx, backends_ptxas)),
    ignore = "needs PTX and ptxas at build time (scripts/setup.sh installs both)"
)]
#[test]
fn ptxas_accepts_every_kernel_and_the_hot_ones_do_not_spill() {
    // Read at compile time only where the build found ptxas, so that the suite compiles
    // without it (the test is then ignored, and says why if run anyway).
    let Some(ptxas) = option_env!("BACKENDS_PTXAS_PATH") else {
        eprintln!("skipped: the build found no ptxas (scripts/setup.sh installs it)");
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let mut report = Vec::new();
    let mut expected = 0;
    for module in CUDA_MODULES.iter() {
        // Each module at its tier's own arch: the oldest GPU it serves.
        let sm = module.tier;
        let ptx = module.ptx.expect("PTX for every module");
        let file = dir.join(format!("{}.compute_{sm}.ptx", module.family));
        std::fs::write(&file, ptx).unwrap();
        let output = Command::new(ptxas)
            .args([&format!("-arch=sm_{sm}"), "-v", "-o", "/dev/null"])
            .arg(&file)
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "ptxas rejects {} for sm_{sm}:\n{log}",
            module.family
        );
        report.extend(parse_ptxas(&log, sm));
        expected += entries_for(module.family, sm).count();
    }
    assert_eq!(
        report.len(),
        expected,
        "one ptxas record per kernel and tier"
    );

    let mut tsv =
        String::from("kernel\tarch\tregisters\tshared_bytes\tspill_stores\tspill_loads\n");
    for r in &report {
        tsv.push_str(&format!(
            "{}\tsm_{}\t{}\t{}\t{}\t{}\n",
            r.kernel, r.arch, r.registers, r.shared_bytes, r.spill_stores, r.spill_loads
        ));
    }
    let path = dir.join("ptxas-report.tsv");
    std::fs::write(&path, &tsv).unwrap();
    println!("ptxas report: {}\n{tsv}", path.display());

    for r in &report {
        let entry = ENTRIES
            .iter()
            .find(|e| e.name == r.kernel)
            .expect("ptxas names a table kernel");
        let cuda = entry.cuda.as_ref().unwrap();
        assert_eq!(
            r.shared_bytes, cuda.shared_bytes,
            "{} sm_{}: the table's shared memory",
            r.kernel, r.arch
        );
        let hot = matches!(
            entry.key.family(),
            Family::Gemm | Family::FlashFwd | Family::MemEffFwd
        );
        if hot {
            assert_eq!(
                (r.spill_stores, r.spill_loads),
                (0, 0),
                "{} spills on sm_{}",
                r.kernel,
                r.arch
            );
        }
    }
}

#[cfg_attr(
    not(backends_ptx),
    ignore = "needs NVRTC (it was absent or hidden at build time)"
)]
#[test]
fn jit_fallback_compiles_the_embedded_source_like_the_build_did() {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ptx-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let cache_text = cache.display().to_string();
    if !in_child(
        "jit_fallback_compiles_the_embedded_source_like_the_build_did",
        &[
            (kernels::DISABLE_AOT_ENV, "1"),
            (kernels::CACHE_DIR_ENV, &cache_text),
        ],
    ) {
        assert!(
            std::fs::read_dir(cache.join("ptx")).unwrap().count() > 0,
            "the JIT wrote its disk cache"
        );
        return;
    }
    assert_eq!(kernels::cuda_code(), kernels::CudaCode::Jit);
    let module = kernels::cuda_module(Family::Scale, 86).unwrap();
    let aot = module.ptx.unwrap();
    // sm_86 is served by the compute_80 tier: the fallback compiles that module for it.
    let jit = kernels::ptx_for(Family::Scale, 86).unwrap();
    assert_eq!(
        jit, aot,
        "NVRTC is deterministic: run-time PTX equals build-time PTX"
    );
    let again = kernels::ptx_for(Family::Scale, 86).unwrap();
    assert_eq!(again, jit);
    assert!(matches!(
        kernels::image_for(Family::Scale, 90).unwrap(),
        ModuleImage::Ptx {
            jit: true,
            tier: 80,
            ..
        }
    ));
    let err = kernels::ptx_for(Family::Scale, 61).unwrap_err().to_string();
    assert!(err.contains("sm_61") && err.contains("sm_70"), "{err}");
}

#[test]
fn devices_load_the_cubin_of_their_arch_else_the_ptx_of_their_tier() {
    if kernels::PTX_ARCHS.is_empty() {
        // Without PTX or NVRTC there is nothing to choose from, and the answer says so.
        if kernels::cuda_code() == kernels::CudaCode::None {
            assert!(kernels::image_for(Family::Gemm, 90).is_err());
        }
        return;
    }
    let image = |sm| kernels::image_for(Family::Gemm, sm).unwrap().to_string();
    assert!(
        kernels::image_for(Family::Gemm, 61).is_err(),
        "older than every tier"
    );
    if kernels::CUBIN_ARCHS_BUILT.is_empty() {
        assert_eq!(image(90), "PTX compute_80");
        return;
    }
    for (sm, expected) in [
        (70, "PTX compute_70"), // V100: no cubin of its own, the driver compiles the PTX
        (72, "PTX compute_70"), // a cubin runs only on its arch or a newer minor of its major
        (75, "cubin sm_75"),    // T4
        (80, "cubin sm_80"),    // A100
        (86, "cubin sm_86"),    // A10, RTX 30
        (87, "cubin sm_86"),    // Orin: the newest older minor of the same major
        (89, "cubin sm_89"),    // L4, RTX 40
        (90, "cubin sm_90"),    // H100, H200
        (100, "PTX compute_80"), // Blackwell: forward compatibility through PTX
        (120, "PTX compute_80"),
    ] {
        assert_eq!(image(sm), expected, "sm_{sm}");
    }
    let tier80 = kernels::cuda_module(Family::Gemm, 89).unwrap();
    assert_eq!(
        kernels::ptx_for(Family::Gemm, 89).unwrap(),
        tier80.ptx.unwrap()
    );
    assert_eq!(
        kernels::cuda_module(Family::FlashFwd, 75).map(|m| m.tier),
        None
    );
}
