//! FFTs against a direct float64 DFT, round trips, and the per-device LRU plan cache
//! (size, eviction, clear, concurrent use). The cache is process-wide, so every test here
//! takes one lock.

mod common;

use std::sync::Mutex;

use backends::fft::{self, Direction, PlanCache, PlanKey, plan_cache};
use backends::{DType, Device, Error, Tensor};
use common::{random, rel_err};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The direct DFT of each length-n line of interleaved complex `x`.
fn dft(x: &[f64], n: usize, inverse: bool) -> Vec<f64> {
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut out = Vec::with_capacity(x.len());
    for line in x.chunks(2 * n) {
        for k in 0..n {
            let (mut re, mut im) = (0.0, 0.0);
            for j in 0..n {
                let a = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                let (c, s) = (a.cos(), a.sin());
                re += line[2 * j] * c - line[2 * j + 1] * s;
                im += line[2 * j] * s + line[2 * j + 1] * c;
            }
            let scale = if inverse { n as f64 } else { 1.0 };
            out.extend([re / scale, im / scale]);
        }
    }
    out
}

fn tensor(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(values, shape, DType::F64, Device::Cpu).unwrap()
}

const LENGTHS: &[usize] = &[1, 2, 3, 7, 8, 12, 17, 64, 100, 128, 1000];

#[test]
fn fft_and_ifft_match_the_direct_dft() {
    let _s = serial();
    for &n in LENGTHS {
        let x = random(3 * n * 2);
        let t = tensor(&x, &[3, n, 2]);
        let forward = fft::fft(&t).unwrap();
        assert_eq!(forward.shape(), &[3, n, 2]);
        let err = rel_err(&forward.to_f64().unwrap(), &dft(&x, n, false));
        assert!(err < 1e-12, "fft n={n}: {err:e}");
        let inverse = fft::ifft(&t).unwrap().to_f64().unwrap();
        let err = rel_err(&inverse, &dft(&x, n, true));
        assert!(err < 1e-12, "ifft n={n}: {err:e}");
        let back = fft::ifft(&forward).unwrap().to_f64().unwrap();
        assert!(rel_err(&back, &x) < 1e-12, "round trip n={n}");
    }
}

#[test]
fn f32_inputs_are_transformed_to_f32_precision() {
    let _s = serial();
    let x = random(2 * 333 * 2);
    let t = Tensor::from_f64(&x, &[2, 333, 2], DType::F32, Device::Cpu).unwrap();
    let rounded = t.to_f64().unwrap();
    let out = fft::fft(&t).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    assert!(rel_err(&out.to_f64().unwrap(), &dft(&rounded, 333, false)) < 1e-6);
}

#[test]
fn rfft_and_irfft_match_the_direct_dft() {
    let _s = serial();
    for &n in LENGTHS {
        let real = random(2 * n);
        let t = tensor(&real, &[2, n]);
        let half = fft::rfft(&t).unwrap();
        assert_eq!(half.shape(), &[2, n / 2 + 1, 2]);
        let as_complex: Vec<f64> = real.iter().flat_map(|&r| [r, 0.0]).collect();
        let full = dft(&as_complex, n, false);
        let expected: Vec<f64> = full
            .chunks(2 * n)
            .flat_map(|line| line[..2 * (n / 2 + 1)].to_vec())
            .collect();
        assert!(
            rel_err(&half.to_f64().unwrap(), &expected) < 1e-12,
            "rfft n={n}"
        );
        let back = fft::irfft(&half, Some(n)).unwrap();
        assert_eq!(back.shape(), &[2, n]);
        assert!(
            rel_err(&back.to_f64().unwrap(), &real) < 1e-12,
            "irfft n={n}"
        );
    }
}

/// The 2-D DFT of each `[h, w]` complex matrix of `x` (rows, then columns), by [`dft`].
fn dft2(x: &[f64], h: usize, w: usize, inverse: bool) -> Vec<f64> {
    let mut expected = Vec::with_capacity(x.len());
    for matrix in x.chunks(2 * h * w) {
        let rows = dft(matrix, w, inverse);
        // Columns: transpose, transform, transpose back.
        let mut cols = vec![0.0; rows.len()];
        for i in 0..h {
            for j in 0..w {
                cols[2 * (j * h + i)..2 * (j * h + i) + 2]
                    .copy_from_slice(&rows[2 * (i * w + j)..2 * (i * w + j) + 2]);
            }
        }
        let cols = dft(&cols, h, inverse);
        let start = expected.len();
        expected.resize(start + rows.len(), 0.0);
        for i in 0..h {
            for j in 0..w {
                expected[start + 2 * (i * w + j)..start + 2 * (i * w + j) + 2]
                    .copy_from_slice(&cols[2 * (j * h + i)..2 * (j * h + i) + 2]);
            }
        }
    }
    expected
}

#[test]
fn fft2_matches_row_then_column_dfts() {
    let _s = serial();
    // One small matrix, and a batch large enough to be spread over the threads.
    for [b, h, w] in [[1, 6, 10], [8, 64, 80]] {
        let x = random(b * h * w * 2);
        let out = fft::fft2(&tensor(&x, &[b, h, w, 2]))
            .unwrap()
            .to_f64()
            .unwrap();
        assert!(rel_err(&out, &dft2(&x, h, w, false)) < 1e-12, "{b}x{h}x{w}");
        let back = fft::ifft2(&tensor(&out, &[b, h, w, 2]))
            .unwrap()
            .to_f64()
            .unwrap();
        assert!(rel_err(&back, &x) < 1e-12, "{b}x{h}x{w}");
    }
}

#[test]
fn large_batches_spread_over_the_threads_match_in_f32_and_f64() {
    let _s = serial();
    // 64 Ki complex values: past the size where the batch is split over the pool.
    let (lines, n) = (64, 1024);
    let x = random(lines * n * 2);
    let want = dft(&x, n, false);
    for (dtype, bound) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let t = Tensor::from_f64(&x, &[lines, n, 2], dtype, Device::Cpu).unwrap();
        let rounded = t.to_f64().unwrap();
        let want = if dtype == DType::F64 {
            want.clone()
        } else {
            dft(&rounded, n, false)
        };
        let got = fft::fft(&t).unwrap();
        assert_eq!(got.dtype(), dtype);
        let err = rel_err(&got.to_f64().unwrap(), &want);
        assert!(err < bound, "{dtype}: {err:e}");
    }
    // A prime length, real input: rfft equals the complex transform's first half, and
    // irfft brings the signal back.
    let (lines, n) = (16, 4099);
    let real = random(lines * n);
    let t = Tensor::from_f64(&real, &[lines, n], DType::F32, Device::Cpu).unwrap();
    let rounded = t.to_f64().unwrap();
    let as_complex: Vec<f64> = rounded.iter().flat_map(|&r| [r, 0.0]).collect();
    let full = fft::fft(&tensor(&as_complex, &[lines, n, 2]))
        .unwrap()
        .to_f64()
        .unwrap();
    let half = n / 2 + 1;
    let expected: Vec<f64> = full
        .chunks(2 * n)
        .flat_map(|line| line[..2 * half].to_vec())
        .collect();
    let spectrum = fft::rfft(&t).unwrap();
    assert_eq!(
        (spectrum.shape(), spectrum.dtype()),
        (&[lines, half, 2][..], DType::F32)
    );
    let err = rel_err(&spectrum.to_f64().unwrap(), &expected);
    assert!(err < 1e-5, "rfft f32 n={n}: {err:e}");
    let back = fft::irfft(&spectrum, Some(n)).unwrap();
    let err = rel_err(&back.to_f64().unwrap(), &rounded);
    assert!(err < 1e-5, "irfft f32 n={n}: {err:e}");
}

#[test]
fn the_entry_points_fill_the_cpu_cache_and_reuse_its_plans() {
    let _s = serial();
    let cache = plan_cache(Device::Cpu).unwrap();
    cache.clear();
    assert_eq!(cache.size(), 0);
    let t = tensor(&random(48 * 2), &[48, 2]);
    fft::fft(&t).unwrap();
    assert_eq!(cache.size(), 1);
    fft::fft(&t).unwrap();
    assert_eq!(cache.size(), 1, "the same key reuses its plan");
    fft::ifft(&t).unwrap();
    assert_eq!(cache.size(), 2, "the direction is part of the key");
    let key = PlanKey {
        sizes: vec![48],
        batch: 1,
        dtype: DType::F64,
        direction: Direction::Forward,
        strides: t.strides().to_vec(),
    };
    assert!(cache.contains(&key));
    // A CUDA device keeps its own cache (with the device); wgpu has no FFT, hence no cache.
    let count = backends::cuda::device_count();
    if count > 0 {
        let device_cache = fft::plan_cache(Device::Cuda(0)).unwrap();
        assert!(!std::ptr::eq(cache, device_cache), "one cache per device");
        assert_eq!(device_cache.max_size(), fft::DEFAULT_MAX_SIZE);
        assert!(std::ptr::eq(
            device_cache,
            backends::cuda::cufft_plan_cache(0).unwrap()
        ));
    } else {
        let err = fft::plan_cache(Device::Cuda(0)).unwrap_err();
        assert!(err.to_string().contains("cuda:0"), "{err}");
    }
    assert!(fft::plan_cache(Device::Wgpu(0)).is_err());
    // As in PyTorch, asking for the cache of a device that does not exist is an error.
    let err = backends::cuda::cufft_plan_cache(count).unwrap_err();
    assert!(err.to_string().contains(&format!("< {count}")), "{err}");
    cache.clear();
    assert_eq!(cache.size(), 0);
}

#[test]
fn lowering_max_size_evicts_the_least_recently_used_at_once() {
    let _s = serial();
    let cache = plan_cache(Device::Cpu).unwrap();
    cache.clear();
    let signal = |n: usize| tensor(&random(n * 2), &[n, 2]);
    let key = |n: usize| PlanKey {
        sizes: vec![n],
        batch: 1,
        dtype: DType::F64,
        direction: Direction::Forward,
        strides: vec![2, 1],
    };
    for n in [5, 6, 7] {
        fft::fft(&signal(n)).unwrap();
    }
    fft::fft(&signal(5)).unwrap(); // 5 is now the most recent; 6 the least
    cache.set_max_size(2);
    assert_eq!((cache.size(), cache.max_size()), (2, 2));
    assert!(!cache.contains(&key(6)) && cache.contains(&key(5)) && cache.contains(&key(7)));
    fft::fft(&signal(9)).unwrap();
    assert!(
        !cache.contains(&key(7)),
        "inserting past capacity evicts the oldest"
    );
    cache.set_max_size(0);
    fft::fft(&signal(11)).unwrap();
    assert_eq!(
        cache.size(),
        0,
        "a zero-size cache keeps nothing, and FFTs still run"
    );
    cache.set_max_size(fft::DEFAULT_MAX_SIZE);
}

#[test]
fn many_threads_share_one_cache() {
    let _s = serial();
    let global = plan_cache(Device::Cpu).unwrap();
    global.clear();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            scope.spawn(move || {
                for round in 0..20 {
                    let n = 3 + (thread + round) % 6;
                    let x = random(n * 2);
                    let out = fft::fft(&tensor(&x, &[n, 2])).unwrap().to_f64().unwrap();
                    assert!(rel_err(&out, &dft(&x, n, false)) < 1e-12);
                }
            });
        }
    });
    assert_eq!(global.size(), 6, "one plan per distinct length");
}

#[test]
fn bad_inputs_are_typed_errors() {
    let _s = serial();
    let not_complex = tensor(&random(6), &[2, 3]);
    let err = fft::fft(&not_complex).unwrap_err();
    assert_eq!(PlanCache::new().max_size(), fft::DEFAULT_MAX_SIZE);
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("[..., n, 2]"), "{err}");
    let mask = Tensor::from_bools(&[true, false, true, false], &[2, 2], Device::Cpu).unwrap();
    assert!(matches!(fft::fft(&mask), Err(Error::DTypeMismatch { .. })));
    let one = tensor(&[1.0, 0.0], &[1, 2]);
    assert!(fft::irfft(&one, None).is_err(), "output length 0");
    // A transform over a dimension of length 0 is PyTorch's "Invalid number of data points".
    let empty = |shape: &[usize]| tensor(&[], shape);
    for (what, result) in [
        ("fft", fft::fft(&empty(&[3, 0, 2]))),
        ("fft2", fft::fft2(&empty(&[0, 4, 2]))),
        ("ifft2", fft::ifft2(&empty(&[4, 0, 2]))),
        ("rfft", fft::rfft(&empty(&[3, 0]))),
        ("irfft", fft::irfft(&empty(&[3, 0, 2]), Some(4))),
    ] {
        let err = result.unwrap_err();
        assert!(
            err.to_string()
                .contains("Invalid number of data points (0)"),
            "{what}: {err}"
        );
    }
    // A batch of 0 signals is no error.
    assert_eq!(fft::fft(&empty(&[0, 5, 2])).unwrap().shape(), &[0, 5, 2]);
    if let Some(device) = common::adapter() {
        let gpu = Tensor::from_f64(&random(8), &[4, 2], DType::F32, device).unwrap();
        assert!(matches!(fft::fft(&gpu), Err(Error::Unavailable { .. })));
    }
}
