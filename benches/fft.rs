//! FFT throughput on the CPU (rustfft / realfft): complex transforms of powers of two and
//! of other lengths, real transforms, and a 2-D transform; cuFFT on each CUDA device; the
//! library and the length class are in the name.
//! Throughput is in samples per second (criterion's "elem/s"); 5·n·log2(n) FLOPs per
//! complex transform of length n is the usual conversion.
//!
//! `cargo bench --bench fft` (add `-- --quick` for a short run).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use backends::{DType, Device, Tensor, fft};

fn signal(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    Tensor::from_f64(&values, shape, DType::F32, Device::Cpu).expect("a CPU tensor")
}

fn fft_benches(c: &mut Criterion) {
    let batch = 16;
    for (kernel, sizes) in [
        ("rustfft-pow2", [256, 4096, 65536]),
        ("rustfft-mixed", [250, 4000, 60000]),
    ] {
        let mut group = c.benchmark_group(format!("fft/cpu/f32/c2c/{kernel}"));
        group.sample_size(10);
        for n in sizes {
            let x = signal(&[batch, n, 2]);
            group.throughput(Throughput::Elements((batch * n) as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| fft::fft(&x).unwrap())
            });
        }
        group.finish();
    }
    let mut group = c.benchmark_group("fft/cpu/f32/r2c/realfft-pow2");
    group.sample_size(10);
    let x = signal(&[batch, 4096]);
    group.throughput(Throughput::Elements((batch * 4096) as u64));
    group.bench_function("4096", |b| b.iter(|| fft::rfft(&x).unwrap()));
    group.finish();
    let mut group = c.benchmark_group("fft/cpu/f32/c2c-2d/rustfft-pow2");
    group.sample_size(10);
    let x = signal(&[256, 256, 2]);
    group.throughput(Throughput::Elements(256 * 256));
    group.bench_function("256x256", |b| b.iter(|| fft::fft2(&x).unwrap()));
    group.finish();
    for index in 0..backends::cuda::device_count() {
        // cuFFT on each CUDA device (skipped where libcufft does not load).
        let device = Device::Cuda(index);
        let mut group = c.benchmark_group(format!("fft/{device}/f32/c2c/cufft"));
        group.sample_size(10);
        for n in [4096, 65536, 1 << 20] {
            let Ok(x) = signal(&[batch, n, 2]).to_device(device) else {
                break;
            };
            if fft::fft(&x).is_err() {
                break;
            }
            group.throughput(Throughput::Elements((batch * n) as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    let y = fft::fft(&x).unwrap();
                    backends::cuda::synchronize(index).expect("the device finishes");
                    y
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, fft_benches);
criterion_main!(benches);
