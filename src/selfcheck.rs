//! The self-checks `backends` runs after its report: each kernel family on a device,
//! against a float64 reference on fresh inputs.

use std::time::Instant;

use crate::{Device, Fp32Precision, Result, Tensor};

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Where it ran.
    pub device: Device,
    /// ‖out − ref‖ / ‖ref‖, or the error that stopped it.
    pub outcome: std::result::Result<f64, String>,
    /// The largest error that passes.
    pub bound: f64,
    /// Wall time of the checked call, in milliseconds.
    pub millis: f64,
}

impl Check {
    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        self.outcome.as_ref().is_ok_and(|&e| e <= self.bound)
    }
}

/// ‖out − ref‖ / ‖ref‖.
fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    let diff: f64 = out
        .iter()
        .zip(reference)
        .map(|(&o, r)| (f64::from(o) - r).powi(2))
        .sum();
    let norm: f64 = reference.iter().map(|r| r * r).sum();
    (diff / norm).sqrt()
}

/// Fresh values in [-1, 1) from a generator seeded by the clock.
fn fresh(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn matmul_check(device: Device, seed: &mut u64) -> Check {
    let (m, n, k) = (257, 129, 200);
    let (a, b) = (fresh(m * k, seed), fresh(k * n, seed));
    let mut millis = 0.0;
    let outcome = (|| -> Result<f64> {
        let _ieee =
            crate::core::precision::matmul::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
        let ta = Tensor::from_vec(a.clone(), &[m, k], device)?;
        let tb = Tensor::from_vec(b.clone(), &[k, n], device)?;
        let start = Instant::now();
        let out = crate::matmul(&ta, &tb)?.to_vec::<f32>()?;
        millis = start.elapsed().as_secs_f64() * 1e3;
        let wide = |v: &[f32], shape: &[usize]| {
            Tensor::from_vec(
                v.iter().map(|&x| f64::from(x)).collect(),
                shape,
                Device::Cpu,
            )
        };
        let reference = crate::matmul(&wide(&a, &[m, k])?, &wide(&b, &[k, n])?)?.to_vec::<f64>()?;
        Ok(rel_err(&out, &reference))
    })();
    Check {
        name: format!("matmul f32 {m}x{k} · {k}x{n}"),
        device,
        outcome: outcome.map_err(|e| e.to_string()),
        bound: 1e-5,
        millis,
    }
}

fn sdpa_check(device: Device, seed: &mut u64) -> Check {
    let (b, h, l, d) = (1, 4, 100, 64);
    let (q, k, v) = (
        fresh(b * h * l * d, seed),
        fresh(b * h * l * d, seed),
        fresh(b * h * l * d, seed),
    );
    let mut millis = 0.0;
    let mut backend = None;
    let outcome = (|| -> Result<f64> {
        let shape = [b, h, l, d];
        let on = |x: &[f32]| Tensor::from_vec(x.to_vec(), &shape, device);
        let options = crate::SdpaOptions {
            is_causal: true,
            ..Default::default()
        };
        let start = Instant::now();
        let out = crate::sdpa(&on(&q)?, &on(&k)?, &on(&v)?, &options)?;
        millis = start.elapsed().as_secs_f64() * 1e3;
        backend = Some(out.backend);
        let got = out.output.to_vec::<f32>()?;
        // The reference: the math backend in f64 on the CPU.
        let _math = crate::ops::sdpa::backend::sdpa_kernel_scoped(
            &[crate::core::sdp::SdpBackend::Math],
            false,
        );
        let wide = |x: &[f32]| {
            Tensor::from_vec(
                x.iter().map(|&y| f64::from(y)).collect(),
                &shape,
                Device::Cpu,
            )
        };
        let reference = crate::sdpa(&wide(&q)?, &wide(&k)?, &wide(&v)?, &options)?
            .output
            .to_vec::<f64>()?;
        Ok(rel_err(&got, &reference))
    })();
    let via = backend.map_or(String::new(), |b| format!(" ({b})"));
    Check {
        name: format!("sdpa f32 causal [{b}, {h}, {l}, {d}]{via}"),
        device,
        outcome: outcome.map_err(|e| e.to_string()),
        bound: 1e-5,
        millis,
    }
}

/// Runs every self-check on the best device, the CPU, and each wgpu adapter.
pub fn run() -> Vec<Check> {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut devices = vec![Device::best(), Device::Cpu];
    devices.extend((0..crate::runtime::wgpu::adapters::list().len()).map(Device::Wgpu));
    let mut seen = Vec::new();
    devices.retain(|d| {
        let new = !seen.contains(d);
        seen.push(*d);
        new
    });
    devices
        .into_iter()
        .flat_map(|d| [matmul_check(d, &mut seed), sdpa_check(d, &mut seed)])
        .collect()
}
