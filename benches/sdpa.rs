//! SDPA throughput per device and backend: B=2, H=16, D=64/128, L=512…4096, causal on/off,
//! f32 and bf16 on the CPU (smaller shapes on software wgpu adapters). Throughput counts
//! 4·B·H·Lq·Lk·D FLOPs per call, halved for causal; the selected backend is in the name.
//!
//! `cargo bench --bench sdpa` (add `-- --quick` for a short run).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;

use backends::attention::{SdpBackend, sdpa_kernel};
use backends::{Device, Element, SdpaOptions, Tensor, sdpa};

fn input<T: Element>(shape: &[usize], device: Device) -> Option<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        (0..n)
            .map(|i| T::from_f64(((i * 7919) % 1000) as f64 / 500.0 - 1.0))
            .collect(),
        shape,
        device,
    )
    .ok()
}

fn bench<T: Element>(
    c: &mut Criterion,
    device: Device,
    backend: SdpBackend,
    lengths: &[usize],
    dims: &[usize],
) {
    let _only = sdpa_kernel(&[backend], false);
    for &d in dims {
        for causal in [false, true] {
            let name = format!(
                "sdpa/{device}/{}/{backend}/d{d}{}",
                T::DTYPE,
                if causal { "/causal" } else { "" }
            );
            let mut group = c.benchmark_group(name);
            group.sample_size(10);
            for &l in lengths {
                let shape = [2, 16, l, d];
                let (Some(q), Some(k), Some(v)) = (
                    input::<T>(&shape, device),
                    input::<T>(&shape, device),
                    input::<T>(&shape, device),
                ) else {
                    return;
                };
                let options = SdpaOptions {
                    is_causal: causal,
                    ..Default::default()
                };
                if sdpa(&q, &k, &v, &options).is_err() {
                    continue; // this backend cannot serve this call here
                }
                let flops = 4 * 2 * 16 * l * l * d / if causal { 2 } else { 1 };
                group.throughput(Throughput::Elements(flops as u64));
                group.bench_with_input(BenchmarkId::from_parameter(l), &l, |b, _| {
                    b.iter(|| sdpa(&q, &k, &v, &options).unwrap())
                });
            }
            group.finish();
        }
    }
}

fn sdpa_benches(c: &mut Criterion) {
    let lengths = [512, 1024, 2048, 4096];
    bench::<f32>(c, Device::Cpu, SdpBackend::Flash, &lengths, &[64, 128]);
    bench::<bf16>(c, Device::Cpu, SdpBackend::Flash, &lengths[..2], &[64, 128]);
    bench::<f32>(c, Device::Cpu, SdpBackend::Math, &[512], &[64]);
    for index in 0..backends::adapters::list().len() {
        let gpu = backends::adapters::list()[index].is_gpu();
        let lengths: &[usize] = if gpu { &lengths } else { &[128] };
        for backend in [SdpBackend::Flash, SdpBackend::MemEfficient] {
            bench::<f32>(c, Device::Wgpu(index), backend, lengths, &[64]);
        }
    }
}

criterion_group!(benches, sdpa_benches);
criterion_main!(benches);
