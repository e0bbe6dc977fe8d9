//! SDPA throughput per device and backend: B=2, H=16, D=64/128, L=512…4096, causal on/off,
//! f32 and bf16 on the CPU (smaller shapes on software wgpu adapters; flash in bf16/f16 and
//! memory-efficient in f32/bf16 up to L=8192 on a CUDA device). Throughput counts
//! 4·B·H·Lq·Lk·D FLOPs per call, halved for causal; the selected backend is in the name.
//!
//! The `sdpa/selection` group measures what a variant pinned by `#[sdpa_kernel]` saves:
//! the selection alone, and a whole tiny call, pinned vs walking the priority order.
//!
//! `sdpa/decode_l8192` compares a decoding step reading a caller's KV cache in place
//! (`borrow_scope`) with the call that copies the cache into owned tensors first.
//!
//! `cargo bench --bench sdpa` (add `-- --quick` for a short run).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::{bf16, f16};

use backends::attention::{SdpBackend, sdpa_kernel, selected_backend};
use backends::sdpa::params;
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
                    b.iter(|| {
                        let out = sdpa(&q, &k, &v, &options).unwrap();
                        if let Device::Cuda(i) = device {
                            backends::cuda::synchronize(i).expect("the device finishes");
                        }
                        out
                    })
                });
            }
            group.finish();
        }
    }
}

/// One decoding step (Lq=1, H=32, D=128, Lk=8192, f32) against a caller's KV cache: read in
/// place through `borrow_scope`, and the copying call that builds owned tensors from the
/// cache first (all a caller could do before borrowed tensors).
fn zero_copy_decoding(c: &mut Criterion) {
    let (h, lk, d) = (32, 8192, 128);
    let fill = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    let (q, k, v) = (fill(h * d), fill(h * lk * d), fill(h * lk * d));
    let options = SdpaOptions::default();
    let mut group = c.benchmark_group("sdpa/decode_l8192/cpu/f32");
    group.sample_size(20);
    group.bench_function("borrowed", |b| {
        backends::borrow_scope(|scope| {
            let q = scope.borrow(&q, &[1, h, 1, d]).unwrap();
            let k = scope.borrow(&k, &[1, h, lk, d]).unwrap();
            let v = scope.borrow(&v, &[1, h, lk, d]).unwrap();
            b.iter(|| sdpa(&q, &k, &v, &options).unwrap())
        })
    });
    group.bench_function("copied", |b| {
        b.iter(|| {
            let owned = |data: &[f32], l: usize| {
                Tensor::from_vec(data.to_vec(), &[1, h, l, d], Device::Cpu).unwrap()
            };
            sdpa(&owned(&q, 1), &owned(&k, lk), &owned(&v, lk), &options).unwrap()
        })
    });
    group.finish();
}

/// Selection and a `[1, 1, 4, 16]` call with every backend enabled: the priority walk.
#[backends::sdpa_kernel(flash, mem_efficient, math, cudnn, device = cuda)]
fn walked(c: &mut Criterion, q: &Tensor) {
    selection_group(c, "walk", q);
}

/// The same inside a scope that pins CPU flash for f32, head dim 16.
#[backends::sdpa_kernel(flash, dtype = f32, head_dim = 16, device = cpu)]
fn pinned(c: &mut Criterion, q: &Tensor) {
    selection_group(c, "pinned", q);
}

fn selection_group(c: &mut Criterion, how: &str, q: &Tensor) {
    let options = SdpaOptions::default();
    let p = params(q, q, q, &options);
    assert_eq!(selected_backend(&p).unwrap(), SdpBackend::Flash);
    let mut group = c.benchmark_group("sdpa/selection");
    group.bench_function(format!("select/{how}"), |b| {
        b.iter(|| selected_backend(&p).unwrap())
    });
    group.bench_function(format!("call_l4_d16/{how}"), |b| {
        b.iter(|| sdpa(q, q, q, &options).unwrap())
    });
    group.finish();
}

fn sdpa_benches(c: &mut Criterion) {
    let tiny = input::<f32>(&[1, 1, 4, 16], Device::Cpu).expect("a CPU tensor");
    walked(c, &tiny);
    pinned(c, &tiny);
    zero_copy_decoding(c);
    let lengths = [512, 1024, 2048, 4096];
    bench::<f32>(c, Device::Cpu, SdpBackend::Flash, &lengths, &[64, 128]);
    bench::<bf16>(c, Device::Cpu, SdpBackend::Flash, &lengths[..2], &[64, 128]);
    bench::<f32>(c, Device::Cpu, SdpBackend::Math, &[512], &[64]);
    for index in 0..backends::cuda::device_count() {
        let device = Device::Cuda(index);
        let lengths = [512, 1024, 2048, 4096, 8192];
        bench::<bf16>(c, device, SdpBackend::Flash, &lengths, &[64, 128]);
        bench::<f16>(c, device, SdpBackend::Flash, &lengths, &[64, 128]);
        bench::<f32>(c, device, SdpBackend::MemEfficient, &lengths, &[64, 128]);
        bench::<bf16>(c, device, SdpBackend::MemEfficient, &lengths, &[64, 128]);
        bench::<bf16>(c, device, SdpBackend::Cudnn, &lengths, &[64, 128]);
        bench::<bf16>(c, device, SdpBackend::Math, &[512, 1024], &[64]);
    }
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
