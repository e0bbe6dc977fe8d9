//! The generator `build.rs` runs: renders every variant, validates and translates the WGSL
//! (naga), compiles the CUDA families to PTX (NVRTC, where present), and writes the Rust
//! dispatch table that embeds the results.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::nvrtc;
use backends_spec::keys::Family;
use backends_spec::table::content_hash;
use backends_spec::variants::{self, CUDA_ARCHS, Variant, WgslDecl};

/// What a generator run produced.
#[derive(Debug)]
pub struct Generated {
    /// The Rust table, to `include!`.
    pub table: PathBuf,
    /// Where NVRTC was loaded from, or why PTX was not built.
    pub nvrtc: Result<String, String>,
    /// CUDA modules compiled in this run (not found in the cache).
    pub compiled: usize,
}

/// Renders the WGSL of one variant: its declarations, then the template text.
pub fn render_wgsl(variant: &Variant, kernels_dir: &Path) -> Result<String, String> {
    let spec = variant
        .wgsl
        .as_ref()
        .ok_or_else(|| format!("{} has no WGSL build", variant.name))?;
    let template = variant
        .family()
        .wgsl_template()
        .expect("a WGSL variant has a WGSL template");
    let body = read(&kernels_dir.join("wgsl").join(format!("{template}.wgsl")))?;
    let mut out = String::new();
    if spec.needs_f16 {
        out.push_str("enable f16;\n");
    }
    writeln!(
        out,
        "// {}: generated from kernels/wgsl/{template}.wgsl",
        variant.name
    )
    .unwrap();
    for decl in &spec.decls {
        match decl {
            WgslDecl::Alias(name, ty) => writeln!(out, "alias {name} = {ty};").unwrap(),
            WgslDecl::Const(name, value) => writeln!(out, "const {name}: u32 = {value}u;").unwrap(),
        }
    }
    out.push_str(&body);
    Ok(out)
}

/// Renders one variant's CUDA block: its `#define`s, the template, the `#undef`s, inside a
/// namespace of its own so that every variant of a family compiles in one unit.
pub fn render_cuda_variant(variant: &Variant, kernels_dir: &Path) -> Result<String, String> {
    let spec = variant
        .cuda
        .as_ref()
        .ok_or_else(|| format!("{} has no CUDA build", variant.name))?;
    let body = read(
        &kernels_dir
            .join("cuda")
            .join(format!("{}.cu", variant.family().name())),
    )?;
    let mut out = format!(
        "namespace {} {{\n#define KERNEL {}\n",
        variant.name, variant.name
    );
    for (name, value) in &spec.defines {
        writeln!(out, "#define {name} {value}").unwrap();
    }
    out.push_str(&body);
    out.push_str("\n#undef KERNEL\n");
    for (name, _) in &spec.defines {
        writeln!(out, "#undef {name}").unwrap();
    }
    out.push_str("}\n");
    Ok(out)
}

/// Renders a whole CUDA family: the shared preamble, then every variant's block.
pub fn render_cuda_family(
    family: Family,
    variants: &[Variant],
    kernels_dir: &Path,
) -> Result<String, String> {
    let mut out = format!("// {family}: generated from kernels/cuda/{family}.cu\n");
    out.push_str(&read(&kernels_dir.join("cuda").join("common.cuh"))?);
    for v in variants
        .iter()
        .filter(|v| v.family() == family && v.cuda.is_some())
    {
        out.push_str(&render_cuda_variant(v, kernels_dir)?);
    }
    Ok(out)
}

/// The content hash of a family's module: its source and the compile options.
pub fn module_hash(source: &str) -> u64 {
    content_hash(format!("{source}\n{}", nvrtc::OPTIONS.join(" ")).as_bytes())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // Leave an unchanged file alone so that its timestamp does not trigger rebuilds.
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Parses and validates a WGSL module with naga, and translates it to MSL.
pub fn wgsl_to_msl(name: &str, wgsl: &str) -> Result<String, String> {
    use naga::back::msl;
    let module = naga::front::wgsl::parse_str(wgsl)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(wgsl)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{name}: {}", e.emit_to_string(wgsl)))?;
    // One Metal buffer slot per binding, in binding order; the buffer-sizes buffer after them.
    let mut resources = msl::EntryPointResources::default();
    let mut slot = 0;
    for (_, var) in module.global_variables.iter() {
        if let Some(binding) = &var.binding {
            let mutable = matches!(var.space, naga::AddressSpace::Storage { access } if access.contains(naga::StorageAccess::STORE));
            resources.resources.insert(
                *binding,
                msl::BindTarget {
                    buffer: Some(slot),
                    mutable,
                    ..Default::default()
                },
            );
            slot += 1;
        }
    }
    resources.sizes_buffer = Some(slot);
    let mut options = msl::Options {
        lang_version: (2, 1),
        fake_missing_bindings: false,
        ..Default::default()
    };
    for entry in &module.entry_points {
        options
            .per_entry_point_map
            .insert(entry.name.clone(), resources.clone());
    }
    let (msl, _) = msl::write_string(&module, &info, &options, &msl::PipelineOptions::default())
        .map_err(|e| format!("{name}: MSL translation failed: {e}"))?;
    Ok(msl)
}

/// Runs the generator: kernels from `kernels_dir`, outputs under `out_dir`. With
/// `ptx: Some(hint)` the CUDA families are compiled to PTX where NVRTC is found (`hint` is
/// one more place to look for it); with `None` no PTX is built.
pub fn generate(
    kernels_dir: &Path,
    out_dir: &Path,
    ptx: Option<Option<&str>>,
) -> Result<Generated, String> {
    let variants = variants::all();

    let mut wgsl_files = Vec::new();
    for v in variants.iter().filter(|v| v.wgsl.is_some()) {
        let wgsl = render_wgsl(v, kernels_dir)?;
        let msl = wgsl_to_msl(&v.name, &wgsl)?;
        let wgsl_path = out_dir.join("wgsl").join(format!("{}.wgsl", v.name));
        let msl_path = out_dir.join("msl").join(format!("{}.metal", v.name));
        write(&wgsl_path, &wgsl)?;
        write(&msl_path, &msl)?;
        wgsl_files.push((v.name.clone(), wgsl_path, msl_path));
    }

    let nvrtc_state = match ptx {
        Some(hint) => nvrtc::load(hint).map(str::to_string),
        None => Err("PTX generation is off (the `cuda` feature is disabled)".to_string()),
    };
    let mut modules = Vec::new();
    for family in Family::ALL {
        if !variants
            .iter()
            .any(|v| v.family() == family && v.cuda.is_some())
        {
            continue;
        }
        let source = render_cuda_family(family, &variants, kernels_dir)?;
        let hash = module_hash(&source);
        let source_path = out_dir.join("cuda").join(format!("{family}.cu"));
        write(&source_path, &source)?;
        modules.push((family, source, hash, source_path));
    }

    // PTX per (module, arch), reused from earlier runs when the content hash matches.
    let mut jobs = Vec::new();
    if nvrtc_state.is_ok() {
        for (family, source, hash, _) in &modules {
            for sm in CUDA_ARCHS {
                let path = out_dir
                    .join("cuda")
                    .join(format!("{family}-{hash:016x}.sm_{sm}.ptx"));
                jobs.push((*family, source.as_str(), sm, path));
            }
        }
    }
    remove_stale_ptx(&out_dir.join("cuda"), &jobs);
    let todo: Vec<_> = jobs.iter().filter(|(.., path)| !path.exists()).collect();
    let compiled = todo.len();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(todo.len().max(1));
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((family, source, sm, path)) = todo.get(i) else {
                            return Ok(());
                        };
                        let ptx = nvrtc::compile(source, &format!("{family}.cu"), *sm)?;
                        write(path, &ptx)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a compile worker panicked"))
    })?;

    let table = out_dir.join("kernels.rs");
    write(
        &table,
        &table_source(&variants, &modules, &jobs, &wgsl_files, kernels_dir)?,
    )?;
    Ok(Generated {
        table,
        nvrtc: nvrtc_state,
        compiled,
    })
}

/// Deletes PTX files of earlier runs whose content hash no longer matches a module.
fn remove_stale_ptx(dir: &Path, current: &[(Family, &str, u32, PathBuf)]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "ptx") && !current.iter().any(|(.., p)| *p == path)
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn table_source(
    variants: &[Variant],
    modules: &[(Family, String, u64, PathBuf)],
    ptx: &[(Family, &str, u32, PathBuf)],
    wgsl_files: &[(String, PathBuf, PathBuf)],
    kernels_dir: &Path,
) -> Result<String, String> {
    let lit = |p: &Path| format!("{:?}", p.display().to_string());
    let mut out = String::from(
        "// Generated by backends-codegen from the declarations in codegen/src/variants.rs; do not edit.\n\
         use backends_spec::keys::*;\nuse backends_spec::table::*;\n\n",
    );
    writeln!(out, "/// Every declared kernel, in declaration order.\npub static ENTRIES: [KernelEntry; {}] = [", variants.len()).unwrap();
    for v in variants {
        writeln!(
            out,
            "    KernelEntry {{\n        key: {},\n        name: {:?},",
            v.key.rust_expr(),
            v.name
        )
        .unwrap();
        match &v.cuda {
            Some(c) => writeln!(
                out,
                "        cuda: Some(CudaKernel {{ threads: {:?}, tile: {:?}, shared_bytes: {}, min_sm: {}, hash: 0x{:016x} }}),",
                c.launch.threads,
                c.launch.tile,
                c.launch.shared_bytes,
                c.min_sm,
                content_hash(render_cuda_variant(v, kernels_dir)?.as_bytes())
            )
            .unwrap(),
            None => out.push_str("        cuda: None,\n"),
        }
        match (&v.wgsl, wgsl_files.iter().find(|(name, ..)| *name == v.name)) {
            (Some(w), Some((_, wgsl, msl))) => writeln!(
                out,
                "        wgsl: Some(WgslKernel {{ threads: {:?}, tile: {:?}, shared_bytes: {}, needs_f16: {}, wgsl: include_str!({}), msl: include_str!({}) }}),",
                w.launch.threads,
                w.launch.tile,
                w.launch.shared_bytes,
                w.needs_f16,
                lit(wgsl),
                lit(msl)
            )
            .unwrap(),
            _ => out.push_str("        wgsl: None,\n"),
        }
        out.push_str("    },\n");
    }
    out.push_str("];\n\n");

    writeln!(
        out,
        "/// One CUDA module per family.\npub static CUDA_MODULES: [CudaModuleSource; {}] = [",
        modules.len()
    )
    .unwrap();
    for (family, _, hash, source_path) in modules {
        write!(out, "    CudaModuleSource {{ family: Family::{family:?}, source: include_str!({}), hash: 0x{hash:016x}, ptx: &[", lit(source_path)).unwrap();
        for (_, _, sm, path) in ptx.iter().filter(|(f, ..)| f == family) {
            write!(out, "({sm}, include_str!({})), ", lit(path)).unwrap();
        }
        out.push_str("] },\n");
    }
    out.push_str("];\n\n");

    let archs: Vec<u32> = if ptx.is_empty() {
        Vec::new()
    } else {
        CUDA_ARCHS.to_vec()
    };
    writeln!(out, "/// The architectures PTX was generated for at build time (empty without NVRTC).\npub const PTX_ARCHS: &[u32] = &{archs:?};\n").unwrap();

    out.push_str("/// The table entry for `key`, if that specialisation is built.\npub fn lookup(key: &KernelKey) -> Option<&'static KernelEntry> {\n    match *key {\n");
    for (i, v) in variants.iter().enumerate() {
        writeln!(out, "        {} => Some(&ENTRIES[{i}]),", v.key.rust_expr()).unwrap();
    }
    out.push_str("        _ => None,\n    }\n}\n");
    Ok(out)
}
