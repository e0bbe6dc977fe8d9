//! Helpers shared by the numeric tests: seeded random inputs, a float64 reference and the
//! relative error ‖out − ref‖ / ‖ref‖.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod linalg;
pub mod serving;

/// Fresh pseudo-random values in [-1, 1): each call continues one process-wide stream
/// seeded from the clock, so every run sees new inputs (the seed is printed on failure
/// through the values' own messages).
pub fn random(n: usize) -> Vec<f64> {
    static STATE: AtomicU64 = AtomicU64::new(0);
    if STATE.load(Ordering::Relaxed) == 0 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        let _ = STATE.compare_exchange(0, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    (0..n)
        .map(|_| {
            // splitmix64
            let mut z = STATE
                .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
                .wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// Row-major `m x n` product of row-major `a (m x k)` and `b (k x n)` in f64.
pub fn reference(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

/// ‖out − ref‖ / ‖ref‖ (Frobenius norms).
pub fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let diff: f64 = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum();
    let norm: f64 = reference.iter().map(|r| r * r).sum();
    (diff / norm).sqrt()
}

/// Whether a sliding window hides key j from query i, written out here from flash-attn's
/// rule: visible when `i + diag - left <= j <= i + diag + right`, diag 0 top-left and
/// `lk - lq` bottom-right (an absent side is unbounded).
pub fn window_hides(
    window: backends::Window,
    variant: backends::CausalVariant,
    (lq, lk): (usize, usize),
    i: usize,
    j: usize,
) -> bool {
    let diag = match variant {
        backends::CausalVariant::UpperLeft => 0,
        backends::CausalVariant::LowerRight => lk as i64 - lq as i64,
    };
    let (i, j) = (i as i64, j as i64);
    window.left.is_some_and(|l| j < i + diag - l as i64)
        || window.right.is_some_and(|r| j > i + diag + r as i64)
}

/// Attention in f64: q `[b, h, lq, d]`, k `[b, hk, lk, d]`, v `[b, hk, lk, dv]` (row-major),
/// an additive bias `bias(b, h, i, j)`, causal masking in either alignment (written out
/// here: query i sees keys j <= i top-left, j <= i + lk - lq bottom-right), grouped heads.
/// A row that sees no key is 0, as PyTorch 2.15's safe softmax gives.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: [usize; 7],
    scale: f64,
    causal: Option<backends::CausalVariant>,
    bias: &dyn Fn(usize, usize, usize, usize) -> f64,
) -> Vec<f64> {
    use backends::CausalVariant::{LowerRight, UpperLeft};
    let [b_n, h_n, hk_n, lq, lk, d, dv] = dims;
    let mut out = vec![0.0; b_n * h_n * lq * dv];
    for b in 0..b_n {
        for h in 0..h_n {
            let hk = h / (h_n / hk_n);
            for i in 0..lq {
                let mut w: Vec<f64> = (0..lk)
                    .map(|j| {
                        let hidden = match causal {
                            Some(UpperLeft) => j > i,
                            Some(LowerRight) => j + lq > i + lk,
                            None => false,
                        };
                        if hidden {
                            return f64::NEG_INFINITY;
                        }
                        let dot: f64 = (0..d)
                            .map(|x| {
                                q[((b * h_n + h) * lq + i) * d + x]
                                    * k[((b * hk_n + hk) * lk + j) * d + x]
                            })
                            .sum();
                        dot * scale + bias(b, h, i, j)
                    })
                    .collect();
                let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue; // no visible key: the row stays 0
                }
                let sum: f64 = w.iter().map(|x| (x - max).exp()).sum();
                for x in &mut w {
                    *x = (*x - max).exp() / sum;
                }
                for y in 0..dv {
                    out[((b * h_n + h) * lq + i) * dv + y] = (0..lk)
                        .map(|j| w[j] * v[((b * hk_n + hk) * lk + j) * dv + y])
                        .sum();
                }
            }
        }
    }
    out
}

/// The variable that marks a re-run of one test in a child process.
pub const CHILD: &str = "BACKENDS_TEST_CHILD";

/// In the parent: re-runs test `name` alone in a child process (this test binary) with
/// `vars` set and asserts that it passed; returns false. In the child: returns true, and
/// the caller runs the test's body there.
pub fn in_child(name: &str, vars: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let args = [
        name,
        "--exact",
        "--test-threads=1",
        "--nocapture",
        "--include-ignored",
    ];
    let (passed, log) = rerun(&args, &[&[(CHILD, "1")], vars].concat());
    assert!(passed && log.contains("1 passed"), "child {name}:\n{log}");
    false
}

/// Runs this test binary again in a child process with `args` and `vars`: whether it exited
/// successfully, and its output (stdout, then stderr).
pub fn rerun(args: &[&str], vars: &[(&str, &str)]) -> (bool, String) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), log)
}

/// The first wgpu adapter, or `None` (with the reason printed) on a machine without one.
pub fn adapter() -> Option<backends::Device> {
    if backends::adapters::list().is_empty() {
        eprintln!("skipped: no wgpu adapter (install mesa-vulkan-drivers)");
        return None;
    }
    Some(backends::Device::Wgpu(0))
}

/// Math attention on `device` (wgpu or CUDA) against the CPU's math path on the same
/// `dtype` inputs (f32, or a half type, which both compute in f32): no mask, a broadcast boolean mask with a fully hidden query row, an additive mask
/// with -inf entries, causal with Lq != Lk in both alignments, grouped-query heads (with a mask), 3-D inputs; the trace
/// says the device ran it. Returns the worst relative error.
pub fn device_math_error(device: backends::Device, dtype: backends::DType) -> f64 {
    use backends::CausalVariant::{LowerRight, UpperLeft};
    use backends::attention::{SdpBackend, sdpa_kernel_scoped};
    use backends::{Device, SdpaOptions, Tensor, sdpa};
    let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
    let none = backends::Window::UNBOUNDED;
    let window = backends::Window::new;
    // (q shape, kv shape, causal, window, mask: 0 none, 1 boolean, 2 additive)
    let cases: [(&[usize], &[usize], _, _, u8); 10] = [
        (&[2, 3, 17, 16], &[2, 3, 23, 16], None, none, 0),
        (&[1, 2, 9, 8], &[1, 2, 300, 8], None, none, 1),
        (&[2, 2, 11, 32], &[2, 2, 11, 32], None, none, 2),
        (&[1, 2, 7, 16], &[1, 2, 12, 16], Some(UpperLeft), none, 0),
        (&[1, 2, 7, 16], &[1, 2, 12, 16], Some(LowerRight), none, 0),
        // More queries than keys: the first five rows see none.
        (&[1, 2, 12, 16], &[1, 2, 7, 16], Some(LowerRight), none, 0),
        (&[1, 8, 5, 16], &[1, 2, 40, 16], None, none, 1),
        (&[3, 6, 16], &[3, 6, 16], None, none, 0),
        // Sliding windows: causal local attention, both sides with a mask.
        (
            &[1, 2, 30, 16],
            &[1, 2, 30, 16],
            Some(UpperLeft),
            window(Some(4), Some(0)),
            0,
        ),
        (
            &[2, 2, 11, 32],
            &[2, 2, 20, 32],
            None,
            window(Some(3), Some(2)),
            2,
        ),
    ];
    let mut worst = 0f64;
    for (q_shape, kv_shape, causal, window, mask_kind) in cases {
        let make = |shape: &[usize], device| {
            let t = Tensor::from_f64(&random(shape.iter().product()), shape, dtype, Device::Cpu)
                .unwrap();
            (t.to_device(device).unwrap(), t)
        };
        let (q, q_host) = make(q_shape, device);
        let (k, k_host) = make(kv_shape, device);
        let (v, v_host) = make(kv_shape, device);
        let (lq, lk) = (q_shape[q_shape.len() - 2], kv_shape[kv_shape.len() - 2]);
        let mask_host = match mask_kind {
            // [Lq, Lk], broadcast over batch and heads; query row 0 sees no key.
            1 => {
                let keep: Vec<bool> = (0..lq * lk).map(|e| e >= lk && e % 3 != 0).collect();
                Some(Tensor::from_bools(&keep, &[lq, lk], Device::Cpu).unwrap())
            }
            // [B, 1, Lq, Lk], some entries -inf.
            2 => {
                let b = q_shape[0];
                let values: Vec<f64> = random(b * lq * lk)
                    .into_iter()
                    .enumerate()
                    .map(|(e, x)| if e % 5 == 1 { f64::NEG_INFINITY } else { x })
                    .collect();
                Some(Tensor::from_f64(&values, &[b, 1, lq, lk], dtype, Device::Cpu).unwrap())
            }
            _ => None,
        };
        let mask = mask_host.as_ref().map(|m| m.to_device(device).unwrap());
        let options = |mask| SdpaOptions {
            attn_mask: mask,
            is_causal: causal.is_some(),
            causal_variant: causal.unwrap_or_default(),
            window,
            enable_gqa: q_shape[q_shape.len() - 3] != kv_shape[kv_shape.len() - 3],
            ..SdpaOptions::default()
        };
        let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
        let capture = backends::TraceCapture::start();
        let out = sdpa(&q, &k, &v, &options(mask.as_ref())).unwrap();
        let trace = capture.take();
        assert!(
            trace.iter().any(|line| line.contains("math on the device")),
            "{q_shape:?}: {trace:?}"
        );
        assert_eq!((out.output.device(), out.output.dtype()), (device, dtype));
        let expected = sdpa(&q_host, &k_host, &v_host, &options(mask_host.as_ref()))
            .unwrap()
            .output
            .to_f64()
            .unwrap();
        let got = out.output.to_f64().unwrap();
        assert_eq!(got.len(), expected.len());
        worst = worst.max(rel_err(&got, &expected));
    }
    // A NaN in q makes its row NaN (max operations on the device drop NaN operands).
    let (l, d) = (5, 8);
    let mut values = random(l * d);
    values[d + 2] = f64::NAN;
    let q = Tensor::from_f64(&values, &[1, 1, l, d], dtype, device).unwrap();
    let k = Tensor::from_f64(&random(l * d), &[1, 1, l, d], dtype, device).unwrap();
    let out = sdpa(&q, &k, &k, &SdpaOptions::default())
        .unwrap()
        .output
        .to_f64()
        .unwrap();
    assert!(out[d..2 * d].iter().all(|x| x.is_nan()), "{out:?}");
    assert!(
        out[..d].iter().chain(&out[2 * d..]).all(|x| x.is_finite()),
        "{out:?}"
    );
    worst
}
