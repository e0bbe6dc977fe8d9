//! `torch.backends.xeon`: the CPU topology, and the `run_cpu` launcher that binds program
//! instances to it.
//!
//! The topology is read from the OS (Linux sysfs); where it cannot be read, every logical
//! CPU counts as its own core on socket 0, NUMA node 0.

mod run_cpu;

pub use run_cpu::{
    Instance, LaunchPlan, RunCpuOptions, find_library, find_numactl, launch, library_dirs, plan,
    run_cpu,
};

use std::path::Path;

use crate::{Error, Result};

/// One logical CPU and where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogicalCpu {
    /// The OS's CPU number.
    pub id: usize,
    /// Its physical core's id within the socket.
    pub core: usize,
    /// Its socket (physical package).
    pub socket: usize,
    /// Its NUMA node.
    pub node: usize,
}

/// The machine's logical CPUs, cores, sockets and NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTopology {
    /// Every online logical CPU, in id order.
    pub cpus: Vec<LogicalCpu>,
}

impl CpuTopology {
    /// Reads the topology of this machine.
    pub fn discover() -> CpuTopology {
        Self::from_sysfs(Path::new("/sys/devices/system")).unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            CpuTopology {
                cpus: (0..n)
                    .map(|id| LogicalCpu {
                        id,
                        core: id,
                        socket: 0,
                        node: 0,
                    })
                    .collect(),
            }
        })
    }

    /// Reads the topology from a sysfs tree rooted at `root` (`/sys/devices/system`).
    pub fn from_sysfs(root: &Path) -> Option<CpuTopology> {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let online = parse_cpu_list(read(&root.join("cpu/online"))?.trim()).ok()?;
        let mut node_of = std::collections::HashMap::new();
        if let Ok(entries) = std::fs::read_dir(root.join("node")) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(node) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                let list = read(&entry.path().join("cpulist")).unwrap_or_default();
                for cpu in parse_cpu_list(list.trim()).unwrap_or_default() {
                    node_of.insert(cpu, node);
                }
            }
        }
        let cpus = online
            .into_iter()
            .map(|id| {
                let topo = root.join(format!("cpu/cpu{id}/topology"));
                let field = |name: &str| read(&topo.join(name)).and_then(|s| s.trim().parse().ok());
                LogicalCpu {
                    id,
                    core: field("core_id").unwrap_or(id),
                    socket: field("physical_package_id").unwrap_or(0),
                    node: node_of.get(&id).copied().unwrap_or(0),
                }
            })
            .collect();
        Some(CpuTopology { cpus })
    }

    /// The number of physical cores (distinct socket and core pairs).
    pub fn physical_cores(&self) -> usize {
        let mut cores: Vec<(usize, usize)> = self.cpus.iter().map(|c| (c.socket, c.core)).collect();
        cores.sort_unstable();
        cores.dedup();
        cores.len()
    }

    /// The number of sockets.
    pub fn sockets(&self) -> usize {
        distinct(self.cpus.iter().map(|c| c.socket))
    }

    /// The number of NUMA nodes.
    pub fn numa_nodes(&self) -> usize {
        distinct(self.cpus.iter().map(|c| c.node))
    }
}

fn distinct(values: impl Iterator<Item = usize>) -> usize {
    let mut v: Vec<usize> = values.collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// CPU ids run below this (Linux's `CONFIG_NR_CPUS` is at most 8192).
const MAX_CPU_ID: usize = 1 << 16;

/// Parses a Linux CPU list such as `0-3,8,10-11` (ids below 65536).
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>> {
    let bad = || Error::InvalidArgument {
        what: "CPU list",
        why: format!("{text:?} is not a list like 0-3,8,10-11 of CPU ids below {MAX_CPU_ID}"),
    };
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b >= MAX_CPU_ID {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => {
                let cpu: usize = part.parse().map_err(|_| bad())?;
                if cpu >= MAX_CPU_ID {
                    return Err(bad());
                }
                cpus.push(cpu);
            }
        }
    }
    Ok(cpus)
}

pub(crate) fn report() -> serde_json::Value {
    let topology = CpuTopology::discover();
    serde_json::json!({
        "logical_cpus": topology.cpus.len(),
        "physical_cores": topology.physical_cores(),
        "sockets": topology.sockets(),
        "numa_nodes": topology.numa_nodes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("0-100000000000").is_err());
        assert!(parse_cpu_list("65536").is_err());
    }

    #[test]
    fn synthetic_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("backends-sysfs-{}", std::process::id()));
        let write = |p: &str, s: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        write("cpu/online", "0-3\n");
        // Two sockets, one core each with two hyperthreads; one NUMA node per socket.
        for (cpu, core, socket) in [(0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 1)] {
            write(
                &format!("cpu/cpu{cpu}/topology/core_id"),
                &format!("{core}\n"),
            );
            write(
                &format!("cpu/cpu{cpu}/topology/physical_package_id"),
                &format!("{socket}\n"),
            );
        }
        write("node/node0/cpulist", "0,2\n");
        write("node/node1/cpulist", "1,3\n");
        let t = CpuTopology::from_sysfs(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            (
                t.cpus.len(),
                t.physical_cores(),
                t.sockets(),
                t.numa_nodes()
            ),
            (4, 2, 2, 2)
        );
        assert_eq!(
            t.cpus[3],
            LogicalCpu {
                id: 3,
                core: 0,
                socket: 1,
                node: 1
            }
        );
    }

    #[test]
    fn this_machine_has_a_sane_topology() {
        let t = CpuTopology::discover();
        assert!(!t.cpus.is_empty());
        assert!(t.physical_cores() >= 1 && t.physical_cores() <= t.cpus.len());
        assert!(t.numa_nodes() >= 1);
    }
}
