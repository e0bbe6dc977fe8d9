//! einsum throughput: a matrix chain and a batched contraction on each device, with the
//! path strategy in the name (`optimal`, `greedy`, and `left-to-right` with the optimizer
//! off). Throughput counts the FLOPs of the chosen path as opt_einsum counts them, so
//! criterion's "elem/s" reads as FLOP/s; a better path shows as less time for the same
//! equation.
//!
//! `cargo bench --bench einsum` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use backends::opt_einsum::{self, Strategy};
use backends::{DType, Device, Tensor, einsum, einsum_path};

fn operand(shape: &[usize], device: Device) -> Option<Tensor> {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    Tensor::from_f64(&values, shape, DType::F32, device).ok()
}

fn bench(c: &mut Criterion, device: Device, equation: &str, shapes: &[&[usize]]) {
    let Some(operands) = shapes
        .iter()
        .map(|s| operand(s, device))
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let refs: Vec<&Tensor> = operands.iter().collect();
    let mut group = c.benchmark_group(format!("einsum/{device}/f32/{equation}"));
    group.sample_size(10);
    for (name, enabled, strategy) in [
        ("optimal", true, Strategy::Optimal),
        ("greedy", true, Strategy::Greedy),
        ("left-to-right", false, Strategy::Auto),
    ] {
        let _flags = opt_einsum::flags(Some(enabled), Some(strategy));
        let path = einsum_path(equation, shapes).expect("a valid equation");
        group.throughput(Throughput::Elements(path.optimized_flops as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let out = einsum(equation, &refs).unwrap();
                if let Device::Cuda(i) = device {
                    backends::cuda::synchronize(i).expect("the device finishes");
                }
                out
            })
        });
    }
    group.finish();
}

fn einsum_benches(c: &mut Criterion) {
    let chain: &[&[usize]] = &[&[512, 16], &[16, 512], &[512, 64], &[64, 8]];
    let batched: &[&[usize]] = &[&[8, 128, 64], &[8, 64, 128], &[128, 32]];
    let mut devices = vec![Device::Cpu];
    devices.extend((0..backends::adapters::list().len()).map(Device::Wgpu));
    devices.extend((0..backends::cuda::device_count()).map(Device::Cuda));
    for device in devices {
        bench(c, device, "ab,bc,cd,de->ae", chain);
        bench(c, device, "bij,bjk,kl->bil", batched);
    }
}

criterion_group!(benches, einsum_benches);
criterion_main!(benches);
