//! The `run_cpu` launcher: plans for an injected topology, and real runs on this machine
//! that check the instance's CPU affinity from inside.

use std::path::{Path, PathBuf};

use backends::Error;
use backends::xeon::{CpuTopology, LaunchPlan, LogicalCpu, RunCpuOptions, launch, plan};

/// Two sockets (NUMA nodes 0 and 1), 4 cores each, 2 hyperthreads per core: logical CPUs
/// 0-7 are the first threads (0-3 on socket 0), 8-15 their siblings.
fn two_socket_machine() -> CpuTopology {
    let cpus = (0..16)
        .map(|id| {
            let first = id % 8;
            LogicalCpu {
                id,
                core: first % 4,
                socket: first / 4,
                node: first / 4,
            }
        })
        .collect();
    CpuTopology { cpus }
}

fn options(program: &[&str]) -> RunCpuOptions {
    RunCpuOptions {
        program: program.iter().map(|s| s.to_string()).collect(),
        ..RunCpuOptions::default()
    }
}

fn plan_on(o: &RunCpuOptions, libs: &[PathBuf], numactl: Option<&Path>) -> LaunchPlan {
    plan(o, &two_socket_machine(), libs, numactl).unwrap()
}

fn layout(p: &LaunchPlan) -> Vec<Vec<usize>> {
    p.instances.iter().map(|i| i.cpus.clone()).collect()
}

fn env<'a>(p: &'a LaunchPlan, key: &str) -> Option<&'a str> {
    p.instances[0]
        .env
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn modes_and_counts_lay_out_instances() {
    let base = options(&["app"]);
    let p = plan_on(&base, &[], None);
    assert_eq!(
        layout(&p),
        [vec![0, 1, 2, 3, 4, 5, 6, 7]],
        "one per physical core"
    );
    assert_eq!(env(&p, "OMP_NUM_THREADS"), Some("8"));
    assert!(p.set_affinity);
    assert_eq!(p.instances[0].command, ["app"]);
    assert_eq!(p.instances[0].node, None, "spans both nodes");

    let logical = RunCpuOptions {
        use_logical_core: true,
        ..base.clone()
    };
    assert_eq!(plan_on(&logical, &[], None).instances[0].cpus.len(), 16);

    let throughput = RunCpuOptions {
        throughput_mode: true,
        ..base.clone()
    };
    let p = plan_on(&throughput, &[], None);
    assert_eq!(layout(&p), [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(
        p.instances.iter().map(|i| i.node).collect::<Vec<_>>(),
        [Some(0), Some(1)]
    );
    let multi = RunCpuOptions {
        multi_instance: true,
        ..base.clone()
    };
    assert_eq!(layout(&plan_on(&multi, &[], None)), layout(&p));

    let latency = RunCpuOptions {
        latency_mode: true,
        ..base.clone()
    };
    assert_eq!(layout(&plan_on(&latency, &[], None)).len(), 2);

    let four = RunCpuOptions {
        ninstances: 4,
        ..base.clone()
    };
    let p = plan_on(&four, &[], None);
    assert_eq!(layout(&p), [vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
    assert_eq!(env(&p, "OMP_NUM_THREADS"), Some("2"));

    let node1 = RunCpuOptions {
        node_id: Some(1),
        ncores_per_instance: 2,
        ..base.clone()
    };
    assert_eq!(
        layout(&plan_on(&node1, &[], None)),
        [vec![4, 5], vec![6, 7]]
    );
}

#[test]
fn numactl_binds_cores_and_memory_when_present() {
    let o = RunCpuOptions {
        throughput_mode: true,
        ..options(&["app", "--flag"])
    };
    let p = plan_on(&o, &[], Some(Path::new("/usr/bin/numactl")));
    assert!(!p.set_affinity);
    assert_eq!(
        p.instances[1].command,
        [
            "/usr/bin/numactl",
            "--physcpubind=4-7",
            "--membind=1",
            "app",
            "--flag"
        ]
    );
    let disabled = RunCpuOptions {
        disable_numactl: true,
        ..o
    };
    let p = plan_on(&disabled, &[], Some(Path::new("/usr/bin/numactl")));
    assert!(p.set_affinity);
    assert_eq!(p.instances[1].command, ["app", "--flag"]);
}

#[test]
fn allocators_and_openmp_are_preloaded_when_found_and_warned_about_when_not() {
    let dir = std::env::temp_dir().join(format!("backends-libs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for lib in ["libjemalloc.so.2", "libiomp5.so"] {
        std::fs::write(dir.join(lib), b"").unwrap();
    }
    let libs = [dir.clone()];
    let p = plan_on(&options(&["app"]), &libs, None);
    let preload = env(&p, "LD_PRELOAD").unwrap();
    assert!(preload.starts_with(&format!("{}", dir.join("libjemalloc.so.2").display())));
    assert!(preload.contains("libiomp5.so"));
    assert!(env(&p, "MALLOC_CONF").is_some());
    assert_eq!(env(&p, "KMP_BLOCKTIME"), Some("1"));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);

    let tcmalloc = RunCpuOptions {
        enable_tcmalloc: true,
        disable_iomp: true,
        ..options(&["app"])
    };
    let p = plan_on(&tcmalloc, &libs, None);
    assert_eq!(env(&p, "LD_PRELOAD"), None);
    assert!(
        p.warnings[0].contains("tcmalloc not found"),
        "{:?}",
        p.warnings
    );

    let plain = RunCpuOptions {
        use_default_allocator: true,
        disable_iomp: true,
        ..options(&["app"])
    };
    let p = plan_on(&plain, &libs, None);
    assert_eq!(env(&p, "LD_PRELOAD"), None);
    assert!(p.warnings.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn impossible_requests_are_typed_errors() {
    let too_many = RunCpuOptions {
        ninstances: 3,
        ncores_per_instance: 4,
        ..options(&["app"])
    };
    let both_modes = RunCpuOptions {
        latency_mode: true,
        throughput_mode: true,
        ..options(&["app"])
    };
    let no_node = RunCpuOptions {
        node_id: Some(5),
        ..options(&["app"])
    };
    let two_allocators = RunCpuOptions {
        enable_jemalloc: true,
        enable_tcmalloc: true,
        ..options(&["app"])
    };
    for (o, needle) in [
        (too_many, "do not fit the 8 usable CPUs"),
        (both_modes, "exclude each other"),
        (no_node, "NUMA node 5"),
        (two_allocators, "choose one"),
        (options(&[]), "no program given"),
    ] {
        let err = plan(&o, &two_socket_machine(), &[], None).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[test]
#[cfg(target_os = "linux")]
fn a_real_instance_runs_pinned_to_one_core_and_its_exit_code_comes_back() {
    let logs = std::env::temp_dir().join(format!("backends-run-cpu-{}", std::process::id()));
    let o = RunCpuOptions {
        ncores_per_instance: 1,
        ninstances: 1,
        use_default_allocator: true,
        disable_iomp: true,
        disable_numactl: true,
        log_path: Some(logs.clone()),
        ..options(&[
            "sh",
            "-c",
            "grep Cpus_allowed_list /proc/self/status; echo \"threads=$OMP_NUM_THREADS\"; exit 7",
        ])
    };
    let p = plan(&o, &CpuTopology::discover(), &[], None).unwrap();
    let code = launch(&p).unwrap();
    assert_eq!(code, 7);
    let log = std::fs::read_to_string(p.instances[0].log.as_ref().unwrap()).unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    let cpu = p.instances[0].cpus[0];
    assert!(
        log.contains(&format!("Cpus_allowed_list:\t{cpu}\n")),
        "{log}"
    );
    assert!(log.contains("threads=1"), "{log}");
}
