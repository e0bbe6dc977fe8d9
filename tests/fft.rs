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
    // One small matrix, one whose rows and columns end in partial tiles and blocks of the
    // column pass, and a batch large enough to be spread over the threads.
    for [b, h, w] in [[1, 6, 10], [2, 13, 40], [8, 64, 80]] {
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

/// rfft2 / rfftn / irfft2 / irfftn as `torch.fft` takes them (their shapes checked against
/// PyTorch 2.15 in a script): the half-spectrum along the last named dimension, the others
/// complex, against the direct DFT under each norm; the inverses given the sizes bring the
/// signals back; fftn given `s` alone transforms the last `s.len()` dimensions.
#[test]
fn real_multidimensional_transforms_follow_torch_fft() {
    use fft::{FftArgs, Norm};
    let _s = serial();
    let shape = [3, 4, 5];
    let real = random(60);
    let x = tensor(&real, &shape);
    let as_complex: Vec<f64> = real.iter().flat_map(|&r| [r, 0.0]).collect();
    // The complex DFT along `(axis, n)` in turn, scaled by `scale`.
    let dft = |steps: &[(usize, usize)], scale: f64| {
        let (mut values, mut sizes) = (as_complex.clone(), shape.to_vec());
        for (i, &(axis, n)) in steps.iter().enumerate() {
            let step_scale = if i == 0 { scale } else { 1.0 };
            (values, sizes) = dft_along(&values, &sizes, axis, (n, false, step_scale));
        }
        (values, sizes)
    };
    // The first `count` coefficients along `axis` of complex `(values, sizes)`.
    let first = |(values, sizes): (Vec<f64>, Vec<usize>), axis: usize, count: usize| {
        let outer: usize = sizes[..axis].iter().product();
        let inner: usize = sizes[axis + 1..].iter().product();
        let mut kept = Vec::new();
        for o in 0..outer {
            let at = o * sizes[axis] * inner * 2;
            kept.extend_from_slice(&values[at..at + count * inner * 2]);
        }
        let mut sizes = sizes;
        sizes[axis] = count;
        (kept, sizes)
    };
    let check = |got: Tensor, (want, sizes): (Vec<f64>, Vec<usize>), what: &str| {
        let mut stored = sizes;
        stored.push(2);
        assert_eq!(got.shape(), stored, "{what}");
        let err = rel_err(&got.to_f64().unwrap(), &want);
        assert!(err < 1e-12, "{what}: {err}");
    };
    let norms = [
        (Norm::Backward, 0.0),
        (Norm::Ortho, -0.5),
        (Norm::Forward, -1.0),
    ];
    for (norm, power) in norms {
        let args = |s: Option<Vec<usize>>, dim: Option<Vec<isize>>| FftArgs { s, dim, norm };
        // Every dimension: the last holds 5 / 2 + 1 = 3 coefficients.
        let want = first(dft(&[(0, 3), (1, 4), (2, 5)], 60f64.powf(power)), 2, 3);
        check(fft::rfftn(&x, &args(None, None)).unwrap(), want, "rfftn");
        // rfft2 with s = (4, 8): the last two dimensions, the last padded to 8 (5 kept).
        let want = first(dft(&[(1, 4), (2, 8)], 32f64.powf(power)), 2, 5);
        let got = fft::rfft2_with(&x, &args(Some(vec![4, 8]), None)).unwrap();
        check(got, want, "rfft2");
        // Over dims (2, 0): dimension 0, named last, holds the half-spectrum (2 of 3).
        let want = first(dft(&[(2, 5), (0, 3)], 15f64.powf(power)), 0, 2);
        let got = fft::rfftn(&x, &args(None, Some(vec![2, 0]))).unwrap();
        check(got, want, "rfftn over (2, 0)");
        // The inverses, given the sizes, bring the signals back.
        let half = fft::rfftn(&x, &args(None, None)).unwrap();
        let back = fft::irfftn(&half, &args(Some(vec![3, 4, 5]), None)).unwrap();
        assert_eq!(back.shape(), &shape);
        assert!(
            rel_err(&back.to_f64().unwrap(), &real) < 1e-12,
            "irfftn {norm:?}"
        );
        let half = fft::rfft2_with(&x, &args(None, None)).unwrap();
        let back = fft::irfft2_with(&half, &args(Some(vec![4, 5]), None)).unwrap();
        assert!(
            rel_err(&back.to_f64().unwrap(), &real) < 1e-12,
            "irfft2 {norm:?}"
        );
    }
    // Without sizes the last output length is 2 (m - 1): 4 from 3 coefficients.
    let half = fft::rfftn(&x, &FftArgs::default()).unwrap();
    let back = fft::irfftn(&half, &FftArgs::default()).unwrap();
    assert_eq!(back.shape(), &[3, 4, 4]);
    let back = fft::irfft2(&fft::rfft2(&x).unwrap()).unwrap();
    assert_eq!(back.shape(), &[3, 4, 4]);
    // fftn given s alone: the last s.len() dimensions, here the last one padded to 6.
    let c = tensor(&as_complex, &[3, 4, 5, 2]);
    let sizes = FftArgs {
        s: Some(vec![6]),
        ..FftArgs::default()
    };
    let want = dft_along(&as_complex, &shape, 2, (6, false, 1.0));
    check(fft::fftn(&c, &sizes).unwrap(), want, "fftn with s = (6,)");
    // irfftn takes complex [..., 2] tensors only.
    assert!(fft::irfftn(&x, &FftArgs::default()).is_err());
}

/// Signals larger than the size from which the work is shared, in f32 (complex pairs moved
/// as 8-byte words) and f64: fewer signals than threads (each pass over all of them, the
/// column passes through transposed copies split over the threads) and more (whole signals
/// per item, column blocks through padded lines), on 3 threads.
#[test]
fn multidimensional_transforms_of_few_and_many_large_signals_match_in_f32_and_f64() {
    use fft::FftArgs;
    let _s = serial();
    let threads = backends::get_num_threads();
    backends::set_num_threads(3).unwrap();
    for (dtype, bound) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        // One matrix, two (both fewer than the threads), and eight.
        for [b, h, w] in [[1, 190, 210], [2, 130, 140], [8, 64, 80]] {
            let t = Tensor::from_f64(&random(b * h * w * 2), &[b, h, w, 2], dtype, Device::Cpu)
                .unwrap();
            let x = t.to_f64().unwrap();
            let out = fft::fft2(&t).unwrap();
            assert_eq!(out.dtype(), dtype);
            let err = rel_err(&out.to_f64().unwrap(), &dft2(&x, h, w, false));
            assert!(err < bound, "{dtype} fft2 {b}x{h}x{w}: {err:e}");
        }
        // A 3-D signal: its middle and first dimensions are column passes of [30, 36] and
        // [40, 1080] matrices.
        let shape = [40, 30, 36];
        let t =
            Tensor::from_f64(&random(43_200 * 2), &[40, 30, 36, 2], dtype, Device::Cpu).unwrap();
        let x = t.to_f64().unwrap();
        let (a, sa) = dft_along(&x, &shape, 0, (40, false, 1.0));
        let (b, sb) = dft_along(&a, &sa, 1, (30, false, 1.0));
        let (want, _) = dft_along(&b, &sb, 2, (36, false, 1.0));
        let got = fft::fftn(&t, &FftArgs::default()).unwrap();
        let err = rel_err(&got.to_f64().unwrap(), &want);
        assert!(err < bound, "{dtype} fftn {shape:?}: {err:e}");
    }
    backends::set_num_threads(threads).unwrap();
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

/// The direct DFT along `axis` of complex values (interleaved) of logical `shape`, each line
/// trimmed or zero-padded to `n` points, times `scale` (no normalisation of its own):
/// `(values, shape)`.
fn dft_along(
    x: &[f64],
    shape: &[usize],
    axis: usize,
    (n, inverse, scale): (usize, bool, f64),
) -> (Vec<f64>, Vec<usize>) {
    let (outer, m) = (shape[..axis].iter().product::<usize>(), shape[axis]);
    let inner: usize = shape[axis + 1..].iter().product();
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut out = vec![0.0; outer * n * inner * 2];
    for o in 0..outer {
        for i in 0..inner {
            for k in 0..n {
                let (mut re, mut im) = (0.0, 0.0);
                for j in 0..m.min(n) {
                    let at = ((o * m + j) * inner + i) * 2;
                    let a = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                    re += x[at] * a.cos() - x[at + 1] * a.sin();
                    im += x[at] * a.sin() + x[at + 1] * a.cos();
                }
                let to = ((o * n + k) * inner + i) * 2;
                (out[to], out[to + 1]) = (re * scale, im * scale);
            }
        }
    }
    let mut shape = shape.to_vec();
    shape[axis] = n;
    (out, shape)
}

/// `n`, `dim` and `norm` as `torch.fft` takes them: trimmed and zero-padded signals along
/// any dimension (negative ones from the end), the three normalisations, 2-D and n-D forms
/// over chosen dimensions, real transforms along a middle dimension, against the direct DFT
/// (and real round trips); bad arguments are typed errors.
#[test]
fn sizes_dimensions_and_normalisations_follow_torch_fft() {
    use fft::{FftArgs, Norm};
    let _s = serial();
    let complex = |shape: &[usize]| {
        let values = random(shape.iter().product::<usize>() * 2);
        let mut stored = shape.to_vec();
        stored.push(2);
        (tensor(&values, &stored), values)
    };
    let check = |got: Tensor, (want, shape): (Vec<f64>, Vec<usize>), what: &str| {
        let mut stored = shape.clone();
        stored.push(2);
        assert_eq!(got.shape(), stored, "{what}");
        let err = rel_err(&got.to_f64().unwrap(), &want);
        assert!(err < 1e-12, "{what}: {err}");
    };
    // Each norm's scale as powers of the point count: forward, inverse.
    let norms = [
        (Norm::Backward, 0.0, -1.0),
        (Norm::Ortho, -0.5, -0.5),
        (Norm::Forward, -1.0, 0.0),
    ];
    let (x, xv) = complex(&[3, 4, 5]);
    for (norm, forward_power, inverse_power) in norms {
        // dim 0 zero-padded from 3 to 7; dim -2 (= 1) trimmed from 4 to 3.
        for (dim, axis, n) in [(0isize, 0usize, 7usize), (-2, 1, 3), (2, 2, 5)] {
            let args = FftArgs::along(Some(n), dim, norm);
            let forward_scale = (n as f64).powf(forward_power);
            let inverse_scale = (n as f64).powf(inverse_power);
            let what = format!("{norm:?} dim {dim} n {n}");
            let want = dft_along(&xv, &[3, 4, 5], axis, (n, false, forward_scale));
            check(fft::fft_with(&x, &args).unwrap(), want, &what);
            let want = dft_along(&xv, &[3, 4, 5], axis, (n, true, inverse_scale));
            check(fft::ifft_with(&x, &args).unwrap(), want, &what);
        }
        // fft2 over dims (0, 2) with s = (4, 6), and fftn over all dims: separable.
        let args = FftArgs {
            s: Some(vec![4, 6]),
            dim: Some(vec![0, 2]),
            norm,
        };
        let scale = (24f64).powf(forward_power);
        let (once, shape) = dft_along(&xv, &[3, 4, 5], 0, (4, false, scale));
        let want = dft_along(&once, &shape, 2, (6, false, 1.0));
        check(fft::fft2_with(&x, &args).unwrap(), want, "fft2");
        let all = FftArgs {
            norm,
            ..FftArgs::default()
        };
        let (a, sa) = dft_along(&xv, &[3, 4, 5], 0, (3, true, 60f64.powf(inverse_power)));
        let (b, sb) = dft_along(&a, &sa, 1, (4, true, 1.0));
        check(
            fft::ifftn(&x, &all).unwrap(),
            dft_along(&b, &sb, 2, (5, true, 1.0)),
            "ifftn",
        );
        // Real signals along the middle dimension, padded to 8: the half-spectrum is the
        // first 5 coefficients of the complex DFT; irfft with the same arguments undoes it.
        let real = random(3 * 6 * 2);
        let rx = tensor(&real, &[3, 6, 2]);
        let args = FftArgs::along(Some(8), 1, norm);
        let spectrum = fft::rfft_with(&rx, &args).unwrap();
        assert_eq!(spectrum.shape(), &[3, 5, 2, 2]);
        let as_complex: Vec<f64> = real.iter().flat_map(|&r| [r, 0.0]).collect();
        let (full, _) = dft_along(
            &as_complex,
            &[3, 6, 2],
            1,
            (8, false, 8f64.powf(forward_power)),
        );
        let want: Vec<f64> = (0..3 * 5 * 2 * 2)
            .map(|e| {
                let (o, k, i, part) = (e / 20, e / 4 % 5, e / 2 % 2, e % 2);
                full[((o * 8 + k) * 2 + i) * 2 + part]
            })
            .collect();
        let err = rel_err(&spectrum.to_f64().unwrap(), &want);
        assert!(err < 1e-12, "rfft {norm:?}: {err}");
        let back = fft::irfft_with(&spectrum, &args).unwrap();
        assert_eq!(back.shape(), &[3, 8, 2]);
        let padded: Vec<f64> = (0..3 * 8 * 2)
            .map(|e| {
                let (o, j, i) = (e / 16, e / 2 % 8, e % 2);
                if j < 6 {
                    real[(o * 6 + j) * 2 + i]
                } else {
                    0.0
                }
            })
            .collect();
        assert!(
            rel_err(&back.to_f64().unwrap(), &padded) < 1e-12,
            "irfft {norm:?}"
        );
    }
    // The defaults are the plain forms.
    assert_eq!(
        fft::fft_with(&x, &FftArgs::default())
            .unwrap()
            .to_f64()
            .unwrap(),
        fft::fft(&x).unwrap().to_f64().unwrap()
    );
    assert_eq!("ortho".parse::<Norm>().unwrap(), Norm::Ortho);
    assert!(matches!(
        "unitary".parse::<Norm>(),
        Err(Error::InvalidArgument { .. })
    ));
    // Bad arguments: a dimension out of range, a repeated one, sizes not matching the
    // dimensions, two dimensions for a 1-D form, a length of 0.
    for (what, result) in [
        (
            "out of range",
            fft::fft_with(&x, &FftArgs::along(None, 3, Norm::Backward)),
        ),
        (
            "out of range",
            fft::fft_with(&x, &FftArgs::along(None, -4, Norm::Backward)),
        ),
        (
            "repeated",
            fft::fft2_with(
                &x,
                &FftArgs {
                    dim: Some(vec![1, -2]),
                    ..FftArgs::default()
                },
            ),
        ),
        (
            "sizes",
            fft::fft2_with(
                &x,
                &FftArgs {
                    s: Some(vec![4]),
                    ..FftArgs::default()
                },
            ),
        ),
        (
            "1-D",
            fft::fft_with(
                &x,
                &FftArgs {
                    dim: Some(vec![0, 1]),
                    ..FftArgs::default()
                },
            ),
        ),
        (
            "length 0",
            fft::fft_with(&x, &FftArgs::along(Some(0), 0, Norm::Backward)),
        ),
    ] {
        assert!(
            matches!(result, Err(Error::ShapeMismatch { .. })),
            "{what}: {result:?}"
        );
    }
}
