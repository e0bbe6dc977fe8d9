//! `torch.backends.xeon.run_cpu`: runs a program (or several instances of it) with tuned
//! CPU settings: each instance bound to its own cores (and NUMA node), `OMP_NUM_THREADS`
//! (which also sizes this library's pool) set to its core count, and a faster allocator and
//! Intel's OpenMP preloaded where they are installed.
//!
//! [`plan`] turns the options and a [`CpuTopology`] into a [`LaunchPlan`] without touching
//! the machine (tests inject a topology); [`run_cpu`] discovers the real one, prints the
//! warnings, and runs the plan (or prints it with `dry_run`).

use std::fmt;
use std::path::{Path, PathBuf};

use super::{CpuTopology, LogicalCpu};
use crate::{Error, Result};

/// The launcher's options, named as PyTorch's `run_cpu` flags.
#[derive(Clone, Debug, Default)]
pub struct RunCpuOptions {
    /// Instances to run (0: decided by the mode or the core counts).
    pub ninstances: usize,
    /// Cores per instance (0: decided by the mode or the instance count).
    pub ncores_per_instance: usize,
    /// Only use the cores of this NUMA node.
    pub node_id: Option<usize>,
    /// Use every logical CPU (hyperthreads too), not one per physical core.
    pub use_logical_core: bool,
    /// Bind with `sched_setaffinity` even where `numactl` is installed.
    pub disable_numactl: bool,
    /// Preload jemalloc.
    pub enable_jemalloc: bool,
    /// Preload tcmalloc.
    pub enable_tcmalloc: bool,
    /// Preload no allocator (by default tcmalloc, else jemalloc, where installed).
    pub use_default_allocator: bool,
    /// Do not preload Intel's OpenMP (`libiomp5`).
    pub disable_iomp: bool,
    /// One instance per NUMA node unless counts are given.
    pub multi_instance: bool,
    /// 4 cores per instance, as many instances as the cores allow.
    pub latency_mode: bool,
    /// One instance per NUMA node using all its cores.
    pub throughput_mode: bool,
    /// A folder for one log file per instance (its stdout and stderr).
    pub log_path: Option<PathBuf>,
    /// Print the plan instead of running it.
    pub dry_run: bool,
    /// The program and its arguments.
    pub program: Vec<String>,
}

/// One instance of the program as planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// Its index, from 0.
    pub index: usize,
    /// The logical CPUs it is bound to.
    pub cpus: Vec<usize>,
    /// Its NUMA node, when all its CPUs are on one.
    pub node: Option<usize>,
    /// The command line (with `numactl` in front when it binds).
    pub command: Vec<String>,
    /// Variables set for it.
    pub env: Vec<(String, String)>,
    /// Where its output goes, with `--log-path`.
    pub log: Option<PathBuf>,
}

/// Everything [`run_cpu`] will do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    /// The instances.
    pub instances: Vec<Instance>,
    /// Whether binding is left to `sched_setaffinity` (no `numactl` in the command).
    pub set_affinity: bool,
    /// What the user should know (a missing allocator, …).
    pub warnings: Vec<String>,
}

impl fmt::Display for LaunchPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in &self.instances {
            writeln!(
                f,
                "instance {}: cpus {} (node {}){}",
                i.index,
                cpu_list(&i.cpus),
                i.node.map_or("mixed".into(), |n| n.to_string()),
                if self.set_affinity {
                    ", bound by sched_setaffinity"
                } else {
                    ""
                }
            )?;
            for (k, v) in &i.env {
                writeln!(f, "  {k}={v}")?;
            }
            writeln!(f, "  {}", i.command.join(" "))?;
            if let Some(log) = &i.log {
                writeln!(f, "  log: {}", log.display())?;
            }
        }
        Ok(())
    }
}

/// `0-3,8`-style text of sorted CPU ids.
fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn invalid(why: String) -> Error {
    Error::InvalidArgument {
        what: "run-cpu options",
        why,
    }
}

/// The CPUs instances may use: one per physical core (its lowest logical id) unless
/// `use_logical_core`, only `node_id`'s when given, in (node, id) order.
fn usable_cpus(options: &RunCpuOptions, topology: &CpuTopology) -> Result<Vec<LogicalCpu>> {
    let mut cpus: Vec<LogicalCpu> = topology.cpus.clone();
    cpus.sort_by_key(|c| (c.node, c.id));
    if let Some(node) = options.node_id {
        cpus.retain(|c| c.node == node);
        if cpus.is_empty() {
            return Err(invalid(format!(
                "NUMA node {node} has no CPUs here (nodes: 0..{})",
                topology.numa_nodes()
            )));
        }
    }
    if !options.use_logical_core {
        let mut seen = Vec::new();
        cpus.retain(|c| {
            let first = !seen.contains(&(c.socket, c.core));
            seen.push((c.socket, c.core));
            first
        });
    }
    Ok(cpus)
}

/// `(instances, cores each)` from the mode and the counts.
fn layout(options: &RunCpuOptions, cpus: &[LogicalCpu]) -> Result<(usize, usize)> {
    let total = cpus.len();
    if total == 0 {
        return Err(invalid(
            "no usable CPU was found to run on; check --node-id".into(),
        ));
    }
    let nodes = {
        let mut n: Vec<usize> = cpus.iter().map(|c| c.node).collect();
        n.dedup();
        n.len()
    };
    let (ni, nc) = (options.ninstances, options.ncores_per_instance);
    if options.latency_mode && options.throughput_mode {
        return Err(invalid(
            "--latency-mode and --throughput-mode exclude each other".into(),
        ));
    }
    let (ni, nc) = if options.latency_mode {
        let nc = if nc == 0 { 4.min(total) } else { nc };
        (if ni == 0 { total / nc } else { ni }, nc)
    } else if (options.throughput_mode || options.multi_instance) && ni == 0 && nc == 0 {
        (nodes, total / nodes)
    } else {
        match (ni, nc) {
            (0, 0) => (1, total),
            (0, nc) => (total / nc, nc),
            (ni, 0) => (ni, total / ni),
            both => both,
        }
    };
    if ni == 0 || nc == 0 || ni.checked_mul(nc).is_none_or(|cores| cores > total) {
        return Err(invalid(format!(
            "{ni} instance(s) of {nc} core(s) do not fit the {total} usable CPUs; lower \
             --ninstances or --ncores-per-instance (or pass --use-logical-core)"
        )));
    }
    Ok((ni, nc))
}

/// Where shared libraries are looked for: `LD_LIBRARY_PATH`, the active conda or virtual
/// environment, then the system folders.
pub fn library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CONDA_PREFIX", "VIRTUAL_ENV"] {
        if let Some(prefix) = std::env::var_os(var) {
            dirs.push(PathBuf::from(prefix).join("lib"));
        }
    }
    for dir in [
        "/usr/local/lib",
        "/usr/lib",
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ] {
        dirs.push(PathBuf::from(dir));
    }
    dirs
}

/// The first of `names` in `dirs`.
pub fn find_library(dirs: &[PathBuf], names: &[&str]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

const JEMALLOC: &[&str] = &["libjemalloc.so", "libjemalloc.so.2"];
const TCMALLOC: &[&str] = &[
    "libtcmalloc.so",
    "libtcmalloc.so.4",
    "libtcmalloc_minimal.so.4",
];
const IOMP: &[&str] = &["libiomp5.so"];

/// The plan for `options` on `topology`, with libraries looked up in `lib_dirs` and
/// `numactl` at `numactl` (None: not installed).
pub fn plan(
    options: &RunCpuOptions,
    topology: &CpuTopology,
    lib_dirs: &[PathBuf],
    numactl: Option<&Path>,
) -> Result<LaunchPlan> {
    if options.program.is_empty() {
        return Err(invalid(
            "no program given: put it after `--`, e.g. `backends run-cpu -- python app.py`".into(),
        ));
    }
    let allocators = [
        options.enable_jemalloc,
        options.enable_tcmalloc,
        options.use_default_allocator,
    ];
    if allocators.iter().filter(|&&x| x).count() > 1 {
        return Err(invalid(
            "choose one of --enable-jemalloc, --enable-tcmalloc and --use-default-allocator".into(),
        ));
    }
    let cpus = usable_cpus(options, topology)?;
    let (ninstances, ncores) = layout(options, &cpus)?;
    let mut warnings = Vec::new();
    let mut preload: Vec<PathBuf> = Vec::new();
    let mut env: Vec<(String, String)> = vec![("OMP_NUM_THREADS".into(), ncores.to_string())];
    let wanted: &[(&str, &[&str])] = if options.enable_jemalloc {
        &[("jemalloc", JEMALLOC)]
    } else if options.enable_tcmalloc {
        &[("tcmalloc", TCMALLOC)]
    } else if options.use_default_allocator {
        &[]
    } else {
        &[("tcmalloc", TCMALLOC), ("jemalloc", JEMALLOC)]
    };
    match wanted
        .iter()
        .find_map(|(name, files)| find_library(lib_dirs, files).map(|p| (*name, p)))
    {
        Some((name, path)) => {
            if name == "jemalloc" {
                env.push((
                    "MALLOC_CONF".into(),
                    "oversize_threshold:1,background_thread:true,metadata_thp:auto".into(),
                ));
            }
            preload.push(path);
        }
        None if !wanted.is_empty() => {
            let names: Vec<&str> = wanted.iter().map(|(n, _)| *n).collect();
            warnings.push(format!(
                "{} not found in {} folders (LD_LIBRARY_PATH, conda/venv lib, system lib); \
                 running with the default allocator. Install one (e.g. `apt install \
                 libjemalloc2` or `libgoogle-perftools4`) or pass --use-default-allocator",
                names.join(" or "),
                lib_dirs.len()
            ));
        }
        None => {}
    }
    if !options.disable_iomp {
        match find_library(lib_dirs, IOMP) {
            Some(path) => {
                preload.push(path);
                env.push(("KMP_AFFINITY".into(), "granularity=fine,compact,1,0".into()));
                env.push(("KMP_BLOCKTIME".into(), "1".into()));
            }
            None => warnings.push(
                "Intel OpenMP (libiomp5.so) not found; the program keeps its own OpenMP runtime"
                    .into(),
            ),
        }
    }
    if !preload.is_empty() {
        let mut parts: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
        if let Ok(old) = std::env::var("LD_PRELOAD")
            && !old.is_empty()
        {
            parts.push(old);
        }
        env.push(("LD_PRELOAD".into(), parts.join(":")));
    }
    let numactl = numactl.filter(|_| !options.disable_numactl);
    let instances = (0..ninstances)
        .map(|index| {
            let mine = &cpus[index * ncores..(index + 1) * ncores];
            let mut ids: Vec<usize> = mine.iter().map(|c| c.id).collect();
            ids.sort_unstable();
            let node = Some(mine[0].node).filter(|&n| mine.iter().all(|c| c.node == n));
            let mut command = Vec::new();
            if let Some(numactl) = numactl {
                command.push(numactl.display().to_string());
                command.push(format!("--physcpubind={}", cpu_list(&ids)));
                if let Some(node) = node {
                    command.push(format!("--membind={node}"));
                }
            }
            command.extend(options.program.iter().cloned());
            let log = options.log_path.as_ref().map(|dir| {
                dir.join(format!(
                    "run_cpu_instance_{index}_cpus_{}.log",
                    cpu_list(&ids).replace(',', "_")
                ))
            });
            Instance {
                index,
                cpus: ids,
                node,
                command,
                env: env.clone(),
                log,
            }
        })
        .collect();
    Ok(LaunchPlan {
        instances,
        set_affinity: numactl.is_none(),
        warnings,
    })
}

/// `numactl` on the `PATH`, if installed.
pub fn find_numactl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("numactl"))
        .find(|p| p.is_file())
}

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// glibc's `sched_setaffinity(2)` wrapper.
    fn sched_setaffinity(pid: i32, cpusetsize: usize, mask: *const u64) -> i32;
}

/// Runs the plan's instances at once and waits for all; the exit code is the first
/// failing instance's (128 + signal for a signal), else 0.
#[cfg(not(target_os = "linux"))]
pub fn launch(_: &LaunchPlan) -> Result<i32> {
    Err(Error::Unavailable {
        what: "run-cpu",
        why: "binding instances to cores is implemented for Linux only".into(),
    })
}

/// Runs the plan's instances at once and waits for all; the exit code is the first
/// failing instance's (128 + signal for a signal), else 0.
#[cfg(target_os = "linux")]
pub fn launch(plan: &LaunchPlan) -> Result<i32> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};
    let mut children = Vec::new();
    for instance in &plan.instances {
        let mut command = Command::new(&instance.command[0]);
        command
            .args(&instance.command[1..])
            .envs(instance.env.iter().map(|(k, v)| (k, v)));
        if let Some(log) = &instance.log {
            if let Some(dir) = log.parent() {
                std::fs::create_dir_all(dir).map_err(|e| io_error(log, e))?;
            }
            let file = std::fs::File::create(log).map_err(|e| io_error(log, e))?;
            let err = file.try_clone().map_err(|e| io_error(log, e))?;
            command.stdout(Stdio::from(file)).stderr(Stdio::from(err));
        }
        if plan.set_affinity {
            let mut mask = [0u64; 16];
            for &cpu in instance.cpus.iter().filter(|&&c| c < 1024) {
                mask[cpu / 64] |= 1 << (cpu % 64);
            }
            // SAFETY: runs in the forked child before exec; sched_setaffinity is a plain
            // system call (async-signal-safe) reading `mask`, which the closure owns.
            unsafe {
                command.pre_exec(move || {
                    if sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().map_err(|e| Error::InvalidArgument {
            what: "program",
            why: format!("cannot start {:?}: {e}", instance.command[0]),
        })?;
        children.push(child);
    }
    let mut code = 0;
    for mut child in children {
        let status = child.wait().map_err(|e| Error::InvalidArgument {
            what: "program",
            why: format!("cannot wait for an instance: {e}"),
        })?;
        let this = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        if code == 0 {
            code = this;
        }
    }
    Ok(code)
}

#[cfg(target_os = "linux")]
fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::InvalidArgument {
        what: "--log-path",
        why: format!("{}: {e}", path.display()),
    }
}

/// Plans on this machine's topology, prints the warnings (and the plan with `dry_run`),
/// then runs it. Returns the exit code to propagate.
pub fn run_cpu(options: &RunCpuOptions) -> Result<i32> {
    let plan = plan(
        options,
        &CpuTopology::discover(),
        &library_dirs(),
        find_numactl().as_deref(),
    )?;
    for warning in &plan.warnings {
        eprintln!("run-cpu: warning: {warning}");
    }
    if options.dry_run {
        print!("{plan}");
        return Ok(0);
    }
    launch(&plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_compact() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
    }
}
