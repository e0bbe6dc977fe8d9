//! The `backends` binary: `info --json` is one JSON object with every module, and
//! environment variables show up as values with their source.

use std::process::Command;

use backends::info::MODULES;

fn run(args: &[&str], vars: &[(&str, &str)]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "backends {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn info_json(vars: &[(&str, &str)]) -> serde_json::Value {
    let text = run(&["info", "--json"], vars);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

#[test]
fn info_json_has_every_module() {
    let report = info_json(&[]);
    for module in MODULES {
        assert!(report[module].is_object(), "missing module {module}");
    }
    assert_eq!(report["cuda"]["is_built"], backends::cuda::is_built());
    assert_eq!(
        report["cuda"]["kernels"]["code"],
        backends::kernels::cuda_code().to_string()
    );
    assert_eq!(report["cuda"]["sdp"]["flash_sdp_enabled"]["value"], true);
    assert_eq!(
        report["cuda"]["sdp"]["flash_sdp_enabled"]["source"],
        "default"
    );
    assert_eq!(
        report["cpu"]["capability"],
        backends::cpu::get_cpu_capability().to_string()
    );
    assert!(report["wgpu"]["adapters"].is_array());
}

#[test]
fn info_json_shows_env_values_and_their_source() {
    let report = info_json(&[
        ("TORCH_BLAS_PREFER_CUBLASLT", "1"),
        ("OMP_NUM_THREADS", "1"),
        ("ATEN_CPU_CAPABILITY", "default"),
    ]);
    let blas = &report["cuda"]["preferred_blas_library"];
    assert_eq!(blas["value"], "cublaslt");
    assert_eq!(blas["source"], "env TORCH_BLAS_PREFER_CUBLASLT");
    assert_eq!(report["openmp"]["num_threads"], 1);
    assert_eq!(report["openmp"]["is_available"], false);
    assert_eq!(
        report["cpu"]["capability_source"],
        "env ATEN_CPU_CAPABILITY=default"
    );
}

#[test]
fn text_report_and_default_run() {
    let text = run(&["info"], &[]);
    for module in MODULES {
        assert!(
            text.lines().any(|l| l == module),
            "no section {module} in:\n{text}"
        );
    }
    assert!(text.contains("flash_sdp_enabled: true (default)"), "{text}");
    let default_run = run(&[], &[]);
    assert!(
        default_run.starts_with(&text),
        "the default run starts with the info report"
    );
    assert!(default_run.contains("self-checks"));
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Usage"));
}

#[test]
fn explain_lists_every_backend_and_the_selection() {
    let text = run(
        &[
            "explain",
            "--shape",
            "2,16,512,300,64",
            "--dtype",
            "f32",
            "--mask",
            "bool",
            "--dropout",
            "0.1",
            "--device",
            "cpu",
        ],
        &[],
    );
    assert!(
        text.contains("FLASH_ATTENTION: does not support dropout; got dropout_p 0.1"),
        "{text}"
    );
    assert!(
        text.contains("EFFICIENT_ATTENTION: has no kernel for cpu tensors"),
        "{text}"
    );
    assert!(text.contains("MATH: usable"), "{text}");
    assert!(text.trim_end().ends_with("selected: MATH"), "{text}");

    let planned = run(
        &[
            "explain",
            "--shape",
            "1,8,128,128,64",
            "--dtype",
            "bf16",
            "--device",
            "cuda",
            "--sm",
            "8.0",
        ],
        &[],
    );
    assert!(
        planned.contains("FLASH_ATTENTION: usable")
            && planned.contains("selected: FLASH_ATTENTION"),
        "{planned}"
    );
    let old = run(
        &[
            "explain",
            "--shape",
            "1,8,128,128,64",
            "--dtype",
            "bf16",
            "--device",
            "cuda",
            "--sm",
            "7.5",
        ],
        &[],
    );
    assert!(
        old.contains("compute capability sm80 or newer; this one is sm75")
            && old.contains("selected: MATH"),
        "{old}"
    );
}

#[test]
fn explain_rejects_a_bad_shape() {
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args(["explain", "--shape", "2,16,512"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("B,H,Lq,Lk,D"));
}

/// The relative error `backends sdpa` printed in `text`.
fn relative_error(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("relative error vs float64 math: "))
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no error line in {text}"))
}

#[test]
fn sdpa_runs_the_selected_backend_and_checks_it_against_float64_math() {
    for (args, backend) in [
        (&["--causal"][..], "FLASH_ATTENTION"),
        (&["--causal", "upper-left"][..], "FLASH_ATTENTION"),
        (&["--causal", "lower-right"][..], "FLASH_ATTENTION"),
        (&["--mask", "bool"][..], "FLASH_ATTENTION"),
        (&["--dropout", "0.25"][..], "MATH"),
    ] {
        let mut all = vec!["sdpa", "--shape", "2,3,33,47,64", "--device", "cpu"];
        all.extend_from_slice(args);
        let text = run(&all, &[]);
        assert!(text.contains(&format!("backend: {backend}")), "{text}");
        let alignment = match args {
            ["--causal", "lower-right"] => "causal_lower_right",
            ["--causal", ..] => "causal_upper_left",
            _ => "not causal",
        };
        assert!(text.contains(&format!(", {alignment}, on cpu")), "{text}");
        assert!(relative_error(&text) < 1e-5, "{text}");
        assert!(text.contains(" ms ("), "{text}");
    }
}

#[test]
fn kv_heads_make_a_grouped_query_call() {
    let args = [
        "--shape",
        "1,8,3,300,32",
        "--kv-heads",
        "2",
        "--device",
        "cpu",
    ];
    let text = run(
        &[&["sdpa"][..], &args, &["--causal", "lower-right"]].concat(),
        &[],
    );
    assert!(text.contains("k/v [1, 2, 300, 32]"), "{text}");
    assert!(relative_error(&text) < 1e-5, "{text}");
    // explain plans the same call: GQA rules out the backends without it.
    let text = run(&[&["explain"][..], &args].concat(), &[]);
    assert!(text.contains("FLASH_ATTENTION: usable"), "{text}");
    // A head count that does not divide H is the library's typed error.
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args([
            "sdpa",
            "--shape",
            "1,8,1,16,8",
            "--kv-heads",
            "3",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("enable_gqa"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn window_makes_a_sliding_window_call() {
    for (args, masking) in [
        (
            &["--causal", "--window", "16,0"][..],
            "causal_upper_left, window left 16, right 0",
        ),
        (
            &["--causal", "lower-right", "--window", "5,-1"][..],
            "causal_lower_right, window left 5, right unbounded",
        ),
        (
            &["--window", "-1,3"][..],
            "not causal, window left unbounded, right 3",
        ),
    ] {
        let mut all = vec!["sdpa", "--shape", "1,2,70,90,32", "--device", "cpu"];
        all.extend_from_slice(args);
        let text = run(&all, &[]);
        assert!(text.contains(masking), "{text}");
        assert!(text.contains("backend: FLASH_ATTENTION"), "{text}");
        assert!(relative_error(&text) < 1e-5, "{text}");
    }
    // explain names cuDNN's refusal; a malformed window is refused with the form to use.
    let text = run(
        &[
            "explain",
            "--shape",
            "1,2,70,90,32",
            "--dtype",
            "bf16",
            "--device",
            "cuda",
            "--sm",
            "9.0",
            "--window",
            "8,8",
        ],
        &[],
    );
    assert!(
        text.contains("CUDNN_ATTENTION: does not support a sliding window"),
        "{text}"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args(["sdpa", "--shape", "1,1,4,4,8", "--window", "8"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("LEFT,RIGHT"), "{stderr}");
}

#[test]
fn varlen_and_paged_make_serving_calls() {
    let text = run(
        &[
            "sdpa",
            "--device",
            "cpu",
            "--shape",
            "1,4,0,0,32",
            "--varlen",
            "17,70,5",
            "--causal",
            "lower-right",
        ],
        &[],
    );
    assert!(text.contains("SDPA varlen [17, 70, 5], H 4"), "{text}");
    assert!(relative_error(&text) < 1e-5, "{text}");
    let text = run(
        &[
            "sdpa",
            "--device",
            "cpu",
            "--shape",
            "3,8,1,300,32",
            "--kv-heads",
            "2",
            "--paged",
            "16",
            "--window",
            "100,0",
            "--causal",
            "lower-right",
        ],
        &[],
    );
    assert!(
        text.contains("3 sequences of 300 tokens in blocks of 16"),
        "{text}"
    );
    assert!(relative_error(&text) < 1e-5, "{text}");
    // explain names the backend serving calls run and why one cannot.
    let text = run(
        &[
            "explain",
            "--device",
            "cpu",
            "--shape",
            "1,4,0,0,32",
            "--varlen",
            "3,9",
            "--dtype",
            "f64",
        ],
        &[],
    );
    assert!(text.contains("selected for sdpa_varlen: none"), "{text}");
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args([
            "sdpa",
            "--shape",
            "1,1,4,4,8",
            "--device",
            "cpu",
            "--paged",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("backends sdpa:"), "{stderr}");
}

#[test]
fn sdpa_reports_bad_input_as_an_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_backends"))
        .args(["sdpa", "--shape", "1,1,4,4,8", "--device", "cuda:7"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("backends sdpa:"), "{stderr}");
}

/// The binary's own input handling: huge shapes and counts are typed errors (exit 1 with a
/// message), never a panic or an abort.
#[test]
fn huge_shapes_and_counts_are_errors_not_crashes() {
    for (args, says) in [
        (
            &["sdpa", "--shape", "1,1,1,1,100000000000"][..],
            "out of memory",
        ),
        (
            &["sdpa", "--shape", "1000000,1000000,1000000,1000000,1000000"],
            "more elements than memory can address",
        ),
        (
            &[
                "run-cpu",
                "--ninstances",
                "9223372036854775809",
                "--ncores-per-instance",
                "2",
                "--",
                "true",
            ],
            "do not fit",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_backends"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
