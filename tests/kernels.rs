//! The generated kernel table: it covers exactly the declared variants, every variant has
//! its WGSL (valid for naga) and MSL and, where NVRTC was present at build time, PTX for
//! every declared architecture that `ptxas` accepts; the run-time NVRTC fallback produces
//! the same PTX as the build.

mod common;

use std::process::Command;

use backends::kernels::{
    self, CUDA_ARCHS, CUDA_MODULES, ENTRIES, Family, FlashKey, KernelKey, PtxParam, lookup,
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

#[test]
fn every_cuda_family_carries_its_source_and_hash() {
    for family in Family::ALL {
        let wanted = ENTRIES
            .iter()
            .filter(|e| e.key.family() == family && e.cuda.is_some());
        let module = kernels::cuda_module(family);
        if wanted.clone().count() == 0 {
            assert!(module.is_none());
            continue;
        }
        let module = module.expect("a family with CUDA variants has a module");
        assert_eq!(
            module.hash,
            backends_codegen::generate::module_hash(module.source)
        );
        for entry in wanted {
            assert!(
                module
                    .source
                    .contains(&format!("namespace {} {{", entry.name)),
                "{}",
                entry.name
            );
        }
    }
}

#[cfg_attr(
    not(backends_ptx),
    ignore = "no PTX was built: NVRTC was absent or hidden at build time"
)]
#[test]
fn every_cuda_variant_has_ptx_for_every_arch() {
    assert_eq!(kernels::PTX_ARCHS, CUDA_ARCHS);
    for module in CUDA_MODULES.iter() {
        let archs: Vec<u32> = module.ptx.iter().map(|(sm, _)| *sm).collect();
        assert_eq!(archs, CUDA_ARCHS, "{}", module.family);
        for (sm, ptx) in module.ptx {
            assert!(
                ptx.contains(&format!(".target sm_{sm}")),
                "{} sm_{sm}",
                module.family
            );
            for entry in ENTRIES
                .iter()
                .filter(|e| e.key.family() == module.family && e.cuda.is_some())
            {
                assert!(
                    ptx.contains(&format!(".entry {}(", entry.name)),
                    "{} in sm_{sm} PTX",
                    entry.name
                );
            }
        }
    }
}

/// Each family's parameter list, as its template's header documents it (and as the CUDA
/// launchers pass it: they check their arguments against the PTX before every launch).
fn documented_params(family: Family) -> Vec<PtxParam> {
    use PtxParam::{B32, B64, F32, F64};
    let n = |p: PtxParam, count: usize| vec![p; count];
    match family {
        // A, B, out; M, N, K, batch, splits, k_slice; 6 operand strides, c_batch, c_row.
        Family::Gemm => [n(B64, 3), n(B32, 6), n(B64, 8)].concat(),
        // partials, C; M, N, batch, splits; c_batch, c_row.
        Family::SplitKReduce => [n(B64, 2), n(B32, 4), n(B64, 2)].concat(),
        // q, k, v, o, lse; H, Hk, Lq, Lk; scale; 12 strides; dropout_p, seed.
        Family::FlashFwd => [n(B64, 5), n(B32, 4), vec![F32], n(B64, 12), vec![F64, B64]].concat(),
        // q, k, v, mask, o, lse; H, Hk, Lq, Lk, D; scale; causal; 16 strides; dropout_p, seed.
        Family::MemEffFwd => [
            n(B64, 6),
            n(B32, 5),
            vec![F32, B32],
            n(B64, 16),
            vec![F64, B64],
        ]
        .concat(),
        // x; n; factor.
        Family::Scale => vec![B64, B64, F64],
    }
}

#[cfg_attr(
    not(backends_ptx),
    ignore = "no PTX was built: NVRTC was absent or hidden at build time"
)]
#[test]
fn every_cuda_kernel_takes_the_documented_parameters() {
    for module in CUDA_MODULES.iter() {
        for (sm, ptx) in module.ptx {
            for entry in ENTRIES
                .iter()
                .filter(|e| e.key.family() == module.family && e.cuda.is_some())
            {
                assert_eq!(
                    kernels::ptx_params(ptx, entry.name),
                    Some(documented_params(module.family)),
                    "{} for sm_{sm}",
                    entry.name
                );
            }
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
    let ptxas = env!("BACKENDS_PTXAS_PATH");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let mut report = Vec::new();
    for module in CUDA_MODULES.iter() {
        for (sm, ptx) in module.ptx {
            let file = dir.join(format!("{}.sm_{sm}.ptx", module.family));
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
            report.extend(parse_ptxas(&log, *sm));
        }
    }
    let cuda_kernels = ENTRIES.iter().filter(|e| e.cuda.is_some()).count();
    assert_eq!(
        report.len(),
        cuda_kernels * CUDA_ARCHS.len(),
        "one ptxas record per kernel and arch"
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
    let module = kernels::cuda_module(Family::Scale).unwrap();
    let aot = module.ptx.iter().find(|(sm, _)| *sm == 80).unwrap().1;
    // sm_86 has no PTX of its own: the fallback targets the newest declared arch below it.
    let jit = kernels::ptx_for(Family::Scale, 86).unwrap();
    assert_eq!(
        jit, aot,
        "NVRTC is deterministic: run-time PTX equals build-time PTX"
    );
    let again = kernels::ptx_for(Family::Scale, 86).unwrap();
    assert_eq!(again, jit);
    let err = kernels::ptx_for(Family::Scale, 75).unwrap_err().to_string();
    assert!(err.contains("sm_75") && err.contains("sm_80"), "{err}");
}

#[test]
fn aot_ptx_is_chosen_by_arch() {
    if kernels::PTX_ARCHS.is_empty() {
        // Without PTX or NVRTC there is nothing to choose from, and the answer says so.
        if kernels::cuda_code() == kernels::CudaCode::None {
            assert!(kernels::ptx_for(Family::Gemm, 90).is_err());
        }
        return;
    }
    let module = kernels::cuda_module(Family::Gemm).unwrap();
    let for_arch = |sm| module.ptx.iter().find(|(a, _)| *a == sm).unwrap().1;
    assert_eq!(kernels::ptx_for(Family::Gemm, 80).unwrap(), for_arch(80));
    assert_eq!(kernels::ptx_for(Family::Gemm, 89).unwrap(), for_arch(80));
    assert_eq!(kernels::ptx_for(Family::Gemm, 100).unwrap(), for_arch(90));
}
