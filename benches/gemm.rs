//! GEMM throughput per device and dtype: the CPU kernels, wgpu (TF32-emulated vs IEEE) and,
//! on a CUDA device, the generated kernels against cuBLAS and cuBLASLt under each precision
//! flag. Each
//! benchmark's name holds the device, dtype and code path; throughput is in elements of C
//! per second with the FLOP count in the name's size (2·n³ per call), so criterion's
//! "elem/s" times 2n reads as FLOP/s.
//!
//! `cargo bench --bench gemm` (add `-- --quick` for a short run).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::{bf16, f16};

use backends::cuda::matmul::{ALLOW_BF16_REDUCED_PRECISION_REDUCTION, FP32_PRECISION};
use backends::cuda::{BlasBackend, PREFERRED_BLAS};
use backends::{Device, Element, Fp32Precision, Tensor, matmul};

fn square<T: Element>(n: usize, device: Device) -> Option<Tensor> {
    let values: Vec<T> = (0..n * n)
        .map(|i| T::from_f64(((i * 7919) % 1000) as f64 / 500.0 - 1.0))
        .collect();
    Tensor::from_vec(values, &[n, n], device).ok()
}

fn bench_dtype<T: Element>(c: &mut Criterion, device: Device, sizes: &[usize], path: &str) {
    let mut group = c.benchmark_group(format!("gemm/{device}/{}/{path}", T::DTYPE));
    group.sample_size(10);
    for &n in sizes {
        let (Some(a), Some(b)) = (square::<T>(n, device), square::<T>(n, device)) else {
            return;
        };
        group.throughput(Throughput::Elements((2 * n * n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                let c = matmul(&a, &b).expect("matmul runs");
                if let Device::Cuda(i) = device {
                    backends::cuda::synchronize(i).expect("the device finishes");
                }
                c
            });
        });
    }
    group.finish();
}

fn gemm(c: &mut Criterion) {
    let cpu_path = match backends::cpu::get_cpu_capability() {
        backends::cpu::CpuCapability::Avx512 => "avx512",
        backends::cpu::CpuCapability::Avx2 => "avx2",
        _ => "portable",
    };
    let _ieee = FP32_PRECISION.guard(Fp32Precision::Ieee);
    let cpu_sizes = [256, 512, 1024, 2048, 4096];
    bench_dtype::<f32>(c, Device::Cpu, &cpu_sizes, cpu_path);
    bench_dtype::<bf16>(c, Device::Cpu, &cpu_sizes[..4], cpu_path);
    bench_dtype::<f16>(c, Device::Cpu, &cpu_sizes[..4], cpu_path);
    {
        let _medium = FP32_PRECISION.guard(Fp32Precision::Bf16);
        bench_dtype::<f32>(
            c,
            Device::Cpu,
            &cpu_sizes[..4],
            &format!("{cpu_path}-bf16-inputs"),
        );
    }
    for index in 0..backends::cuda::device_count() {
        // Generated kernels (preferred_blas_library = default) against cuBLAS, per precision.
        let device = Device::Cuda(index);
        let gpu_sizes = [256, 1024, 2048, 4096, 8192];
        for (library, path) in [
            (BlasBackend::Default, "generated"),
            (BlasBackend::Cublas, "cublas"),
            (BlasBackend::Cublaslt, "cublaslt"),
        ] {
            let _library = PREFERRED_BLAS.guard(library);
            bench_dtype::<f32>(c, device, &gpu_sizes, &format!("{path}-ieee"));
            bench_dtype::<bf16>(c, device, &gpu_sizes, path);
            bench_dtype::<f16>(c, device, &gpu_sizes, path);
            let _tf32 = FP32_PRECISION.guard(Fp32Precision::Tf32);
            bench_dtype::<f32>(c, device, &gpu_sizes, &format!("{path}-tf32"));
            drop(_tf32);
            let _reduced = ALLOW_BF16_REDUCED_PRECISION_REDUCTION.guard(false);
            bench_dtype::<bf16>(c, device, &[256, 1024], &format!("{path}-f32-partials"));
        }
    }
    for index in 0..backends::adapters::list().len() {
        // Software adapters (lavapipe) run on the CPU: keep their sizes small.
        let sizes: &[usize] = if backends::adapters::list()[index].is_gpu() {
            &cpu_sizes
        } else {
            &[256, 512]
        };
        let device = Device::Wgpu(index);
        bench_dtype::<f32>(c, device, sizes, "wgsl-ieee");
        bench_dtype::<f16>(c, device, sizes, "wgsl");
        let _tf32 = FP32_PRECISION.guard(Fp32Precision::Tf32);
        let _emulate = backends::EMULATE_REDUCED_PRECISION.guard(true);
        bench_dtype::<f32>(c, device, sizes, "wgsl-tf32-emulated");
    }
}

criterion_group!(benches, gemm);
criterion_main!(benches);
