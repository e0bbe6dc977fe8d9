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
        let _ieee = crate::cuda::matmul::FP32_PRECISION.guard_scoped(Fp32Precision::Ieee);
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
        let diff: f64 = out
            .iter()
            .zip(&reference)
            .map(|(&o, r)| (f64::from(o) - r).powi(2))
            .sum();
        let norm: f64 = reference.iter().map(|r| r * r).sum();
        Ok((diff / norm).sqrt())
    })();
    Check {
        name: format!("matmul f32 {m}x{k} · {k}x{n}"),
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
    devices.extend((0..crate::adapters::list().len()).map(Device::Wgpu));
    devices.dedup();
    let mut seen = Vec::new();
    devices.retain(|d| {
        let new = !seen.contains(d);
        seen.push(*d);
        new
    });
    devices
        .into_iter()
        .map(|d| matmul_check(d, &mut seed))
        .collect()
}
