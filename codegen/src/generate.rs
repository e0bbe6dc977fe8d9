//! The generator `build.rs` runs: renders every variant, validates and translates the WGSL
//! (naga), compiles the CUDA families to PTX (NVRTC, where present), and writes the Rust
//! dispatch table that embeds the results.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::nvrtc;
use backends_spec::keys::Family;
use backends_spec::table::content_hash;
use backends_spec::variants::{self, CUBIN_ARCHS, PTX_TIERS, Variant, WgslDecl, tier_for};

/// What a generator run produced.
#[derive(Debug)]
pub struct Generated {
    /// The Rust table, to `include!`.
    pub table: PathBuf,
    /// Where NVRTC was loaded from, or why PTX was not built.
    pub nvrtc: Result<String, String>,
    /// Why no cubins were assembled (no PTX, or no ptxas), or `None` when they were.
    pub no_cubins: Option<String>,
    /// PTX modules and cubins built in this run (not found in the cache).
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
    for prelude in variant.family().wgsl_preludes() {
        out.push_str(&read(
            &kernels_dir.join("wgsl").join(format!("{prelude}.wgsl")),
        )?);
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

/// Renders the CUDA module of `family` for `tier`: the shared header, then every variant of
/// the family whose `min_sm` is at most the tier.
pub fn render_cuda_family(
    family: Family,
    tier: u32,
    variants: &[Variant],
    kernels_dir: &Path,
) -> Result<String, String> {
    let mut out =
        format!("// {family} for compute_{tier}: generated from kernels/cuda/{family}.cu\n");
    out.push_str(&read(&kernels_dir.join("cuda").join("common.cuh"))?);
    for v in variants
        .iter()
        .filter(|v| v.family() == family && v.cuda.as_ref().is_some_and(|c| c.min_sm <= tier))
    {
        out.push_str(&render_cuda_variant(v, kernels_dir)?);
    }
    Ok(out)
}

/// The content hash of a module: its source, its tier and the compile options.
pub fn module_hash(source: &str, tier: u32) -> u64 {
    content_hash(format!("{source}\n{tier}\n{}", nvrtc::OPTIONS.join(" ")).as_bytes())
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

/// A CUDA module to build: family, tier, source, hash, source file.
struct Module {
    family: Family,
    tier: u32,
    source: String,
    hash: u64,
    source_path: PathBuf,
}

/// One build step of the AOT images, with the file it writes.
enum Job<'a> {
    /// NVRTC: a module's source to PTX for its tier.
    Ptx(&'a Module, PathBuf),
    /// ptxas: a module's PTX (the file of its `Ptx` job) to a cubin for an arch.
    Cubin(&'a Module, u32, PathBuf),
}

impl Job<'_> {
    fn output(&self) -> &Path {
        match self {
            Job::Ptx(_, path) | Job::Cubin(_, _, path) => path,
        }
    }
}

/// Runs the generator: kernels from `kernels_dir`, outputs under `out_dir`. With
/// `ptx: Some(hint)` the CUDA modules are compiled to PTX where NVRTC is found (`hint` is
/// one more place to look for it), and assembled to cubins for [`CUBIN_ARCHS`] where
/// `ptxas` is given; with `None` no PTX is built.
pub fn generate(
    kernels_dir: &Path,
    out_dir: &Path,
    ptx: Option<Option<&str>>,
    ptxas: Option<&Path>,
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
        for tier in PTX_TIERS {
            let serves = |v: &Variant| {
                v.family() == family && v.cuda.as_ref().is_some_and(|c| c.min_sm <= tier)
            };
            if !variants.iter().any(serves) {
                continue;
            }
            let source = render_cuda_family(family, tier, &variants, kernels_dir)?;
            let hash = module_hash(&source, tier);
            let source_path = out_dir
                .join("cuda")
                .join(format!("{family}.compute_{tier}.cu"));
            write(&source_path, &source)?;
            modules.push(Module {
                family,
                tier,
                source,
                hash,
                source_path,
            });
        }
    }

    // PTX per module and cubins per (family, arch), reused from earlier runs when the
    // content hash matches.
    let cuda_dir = out_dir.join("cuda");
    let mut ptx_jobs = Vec::new();
    let mut cubin_jobs = Vec::new();
    let no_cubins = match (&nvrtc_state, ptxas) {
        (Err(_), _) => Some("no PTX was built".to_string()),
        (Ok(_), None) => Some("ptxas was not found (scripts/setup.sh installs it)".to_string()),
        (Ok(_), Some(_)) => None,
    };
    if nvrtc_state.is_ok() {
        // The NVRTC release is part of the file name: another release emits other PTX.
        let (major, minor) = nvrtc::version().unwrap_or((0, 0));
        for m in &modules {
            let name = format!(
                "{}-{:016x}.nvrtc{major}.{minor}.compute_{}.ptx",
                m.family, m.hash, m.tier
            );
            ptx_jobs.push(Job::Ptx(m, cuda_dir.join(name)));
        }
        if ptxas.is_some() {
            for m in &modules {
                for arch in CUBIN_ARCHS
                    .into_iter()
                    .filter(|&a| tier_for(a) == Some(m.tier))
                {
                    let name = format!(
                        "{}-{:016x}.nvrtc{major}.{minor}.sm_{arch}.cubin",
                        m.family, m.hash
                    );
                    cubin_jobs.push(Job::Cubin(m, arch, cuda_dir.join(name)));
                }
            }
        }
    }
    let outputs: Vec<&Path> = ptx_jobs
        .iter()
        .chain(&cubin_jobs)
        .map(Job::output)
        .collect();
    remove_stale(&cuda_dir, &outputs);
    let mut compiled = run_jobs(&ptx_jobs, ptxas, &ptx_jobs)?;
    compiled += run_jobs(&cubin_jobs, ptxas, &ptx_jobs)?;

    let table = out_dir.join("kernels.rs");
    write(
        &table,
        &table_source(
            &variants,
            &modules,
            (&ptx_jobs, &cubin_jobs),
            &wgsl_files,
            kernels_dir,
        )?,
    )?;
    Ok(Generated {
        table,
        nvrtc: nvrtc_state,
        no_cubins,
        compiled,
    })
}

/// Runs the jobs whose output is missing, on every core; returns how many ran. A cubin job
/// reads the PTX file its module's `Ptx` job wrote.
fn run_jobs(jobs: &[Job], ptxas: Option<&Path>, ptx_jobs: &[Job]) -> Result<usize, String> {
    let todo: Vec<&Job> = jobs.iter().filter(|j| !j.output().exists()).collect();
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
                        let Some(job) = todo.get(i) else {
                            return Ok(());
                        };
                        match job {
                            Job::Ptx(m, path) => {
                                let name = format!("{}.cu", m.family);
                                write(path, &nvrtc::compile(&m.source, &name, m.tier)?)?;
                            }
                            Job::Cubin(m, arch, path) => {
                                let ptx = ptx_jobs
                                    .iter()
                                    .find_map(|j| match j {
                                        Job::Ptx(pm, ptx) if std::ptr::eq(*pm, *m) => Some(ptx),
                                        _ => None,
                                    })
                                    .expect("every module has a PTX job");
                                let ptxas = ptxas.expect("cubin jobs exist only with ptxas");
                                assemble(ptxas, ptx, *arch, path)?;
                            }
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a compile worker panicked"))
    })?;
    Ok(todo.len())
}

/// Assembles `ptx` into a cubin for `sm_{arch}` with ptxas (written to a temporary name
/// first, so that an interrupted build leaves no truncated cubin behind).
fn assemble(ptxas: &Path, ptx: &Path, arch: u32, out: &Path) -> Result<(), String> {
    let partial = out.with_extension("cubin.partial");
    let output = std::process::Command::new(ptxas)
        .arg(format!("-arch=sm_{arch}"))
        .arg("-o")
        .arg(&partial)
        .arg(ptx)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    if !output.status.success() {
        return Err(format!(
            "ptxas failed on {} for sm_{arch}:\n{}",
            ptx.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    std::fs::rename(&partial, out).map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// Deletes PTX and cubin files of earlier runs that no job writes any more.
fn remove_stale(dir: &Path, current: &[&Path]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let built = path
            .extension()
            .is_some_and(|e| e == "ptx" || e == "cubin" || e == "partial");
        if built && !current.contains(&path.as_path()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn table_source(
    variants: &[Variant],
    modules: &[Module],
    (ptx, cubins): (&[Job], &[Job]),
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
        "/// One CUDA module per family and tier.\npub static CUDA_MODULES: [CudaModuleSource; {}] = [",
        modules.len()
    )
    .unwrap();
    for m in modules {
        write!(
            out,
            "    CudaModuleSource {{ family: Family::{:?}, tier: {}, source: include_str!({}), hash: 0x{:016x}, ",
            m.family,
            m.tier,
            lit(&m.source_path),
            m.hash
        )
        .unwrap();
        match ptx
            .iter()
            .find(|j| matches!(j, Job::Ptx(pm, _) if std::ptr::eq(*pm, m)))
        {
            Some(job) => write!(out, "ptx: Some(include_str!({})), ", lit(job.output())).unwrap(),
            None => out.push_str("ptx: None, "),
        }
        out.push_str("cubins: &[");
        for job in cubins {
            if let Job::Cubin(cm, arch, path) = job
                && std::ptr::eq(*cm, m)
            {
                write!(out, "({arch}, include_bytes!({})), ", lit(path)).unwrap();
            }
        }
        out.push_str("] },\n");
    }
    out.push_str("];\n\n");

    let tiers: Vec<u32> = if ptx.is_empty() {
        Vec::new()
    } else {
        PTX_TIERS.to_vec()
    };
    writeln!(out, "/// The tiers PTX was generated for at build time (empty without NVRTC).\npub const PTX_ARCHS: &[u32] = &{tiers:?};\n").unwrap();
    let archs: Vec<u32> = if cubins.is_empty() {
        Vec::new()
    } else {
        CUBIN_ARCHS.to_vec()
    };
    writeln!(out, "/// The architectures cubins were assembled for at build time (empty without NVRTC and ptxas).\npub const CUBIN_ARCHS_BUILT: &[u32] = &{archs:?};\n").unwrap();

    out.push_str("/// The table entry for `key`, if that specialisation is built.\npub fn lookup(key: &KernelKey) -> Option<&'static KernelEntry> {\n    match *key {\n");
    for (i, v) in variants.iter().enumerate() {
        writeln!(out, "        {} => Some(&ENTRIES[{i}]),", v.key.rust_expr()).unwrap();
    }
    out.push_str("        _ => None,\n    }\n}\n");
    Ok(out)
}
