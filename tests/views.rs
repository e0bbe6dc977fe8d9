//! Views (`view`, `reshape`, `permute`, `transpose`, `narrow`, `select`, `expand`,
//! `unsqueeze`, `squeeze`, `contiguous`) against index arithmetic on random values, their
//! errors, and the kernels that read them (matmul on a view with an offset).

mod common;

use backends::{DType, Device, Error, Tensor, matmul};
use common::{adapter, random, reference, rel_err};

/// A random f32 `[2, 3, 4]` tensor on `device` and its values.
fn source(device: Device) -> (Tensor, Vec<f64>) {
    let values = random(24);
    let t = Tensor::from_f64(&values, &[2, 3, 4], DType::F32, device).unwrap();
    let rounded = t.to_f64().unwrap();
    (t, rounded)
}

/// The value of `[2, 3, 4]` row-major `values` at `(i, j, k)`.
fn at(values: &[f64], i: usize, j: usize, k: usize) -> f64 {
    values[(i * 3 + j) * 4 + k]
}

#[test]
fn views_read_the_elements_pytorch_names() {
    let (t, v) = source(Device::Cpu);
    // permute(2, 0, 1): out[k][i][j] = t[i][j][k].
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), [4, 2, 3]);
    let expected: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (i, j, k))))
        .map(|(i, j, k)| at(&v, i, j, k))
        .collect();
    assert_eq!(p.to_f64().unwrap(), expected);
    assert!(!p.is_contiguous());
    // transpose(0, 2) is permute(2, 1, 0).
    assert_eq!(
        t.transpose(0, 2).unwrap().to_f64().unwrap(),
        t.permute(&[2, 1, 0]).unwrap().to_f64().unwrap()
    );
    // narrow(2, 1, 2): columns 1 and 2.
    let n = t.narrow(2, 1, 2).unwrap();
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| (0..3).flat_map(move |j| (1..3).map(move |k| (i, j, k))))
        .map(|(i, j, k)| at(&v, i, j, k))
        .collect();
    assert_eq!(n.to_f64().unwrap(), expected);
    assert_eq!(n.offset(), 1);
    // select(1, 2): row 2 of every batch.
    let s = t.select(1, 2).unwrap();
    assert_eq!(s.shape(), [2, 4]);
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| (0..4).map(move |k| (i, k)))
        .map(|(i, k)| at(&v, i, 2, k))
        .collect();
    assert_eq!(s.to_f64().unwrap(), expected);
    // expand: a [3, 1] column broadcast to [2, 3, 5] (stride 0 where it repeats).
    let column = t.select(0, 1).unwrap().narrow(1, 3, 1).unwrap();
    let e = column.expand(&[2, 3, 5]).unwrap();
    assert_eq!(e.strides()[0], 0);
    assert_eq!(e.strides()[2], 0);
    let expected: Vec<f64> = (0..2 * 3 * 5).map(|e| at(&v, 1, e / 5 % 3, 3)).collect();
    assert_eq!(e.to_f64().unwrap(), expected);
    // unsqueeze / squeeze round trip, and squeeze of a dimension that is not 1.
    let u = t.unsqueeze(1).unwrap();
    assert_eq!(u.shape(), [2, 1, 3, 4]);
    assert!(u.is_contiguous());
    assert_eq!(u.squeeze(1).unwrap().shape(), [2, 3, 4]);
    assert_eq!(t.squeeze(0).unwrap().shape(), [2, 3, 4]);
    assert_eq!(t.unsqueeze(3).unwrap().shape(), [2, 3, 4, 1]);
}

#[test]
fn view_refuses_what_only_reshape_can_do() {
    let (t, v) = source(Device::Cpu);
    // Contiguous: every regrouping is a view.
    assert_eq!(t.view(&[6, 4]).unwrap().to_f64().unwrap(), v);
    assert_eq!(t.view(&[24]).unwrap().strides(), [1]);
    // A transpose cannot be flattened without a copy: view says so, reshape copies.
    let tt = t.transpose(1, 2).unwrap();
    let refused = tt.view(&[2, 12]);
    assert!(
        matches!(&refused, Err(Error::ShapeMismatch { detail, .. }) if detail.contains("reshape")),
        "{refused:?}"
    );
    let r = tt.reshape(&[2, 12]).unwrap();
    assert!(r.is_contiguous());
    assert_eq!(r.to_f64().unwrap(), tt.to_f64().unwrap());
    // Splitting the transposed dimension is still a view.
    let split = tt.view(&[2, 2, 2, 3]).unwrap();
    assert_eq!(split.to_f64().unwrap(), tt.to_f64().unwrap());
    // contiguous() copies a view once and keeps a contiguous tensor as it is.
    let c = tt.contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.to_f64().unwrap(), tt.to_f64().unwrap());
    assert!(t.contiguous().unwrap().is_same(&t));
}

/// `contiguous()` of views whose innermost dimensions are a transposed plane (copied in
/// register tiles, whole and partial) holds the view's elements in order, for every dtype
/// the tiles move (2-, 4- and 8-byte) and with offsets, padded rows and batches.
#[test]
fn contiguous_copies_of_transposed_planes_hold_the_views_elements() {
    let values = random(3 * 37 * 45);
    for dtype in [DType::F32, DType::F64, DType::Bf16, DType::F16, DType::I32] {
        let t = Tensor::from_f64(&values, &[3, 37, 45], dtype, Device::Cpu).unwrap();
        let views = [
            t.transpose(1, 2).unwrap(),
            t.narrow(2, 3, 40).unwrap().transpose(1, 2).unwrap(),
            t.permute(&[2, 0, 1]).unwrap(),
            t.select(0, 2).unwrap().t().unwrap(),
            t.narrow(1, 1, 32)
                .unwrap()
                .narrow(2, 5, 32)
                .unwrap()
                .transpose(1, 2)
                .unwrap(),
        ];
        // Complex values as trailing pairs (moved as one element), from an even offset and
        // from an odd one, and a permutation that moves the pairs' dimension inward.
        let pairs = Tensor::from_f64(&values, &[3, 37, 45], dtype, Device::Cpu)
            .unwrap()
            .narrow(2, 1, 44)
            .unwrap()
            .contiguous()
            .unwrap()
            .view(&[3, 37, 22, 2])
            .unwrap();
        let odd = Tensor::from_f64(&values, &[values.len()], dtype, Device::Cpu)
            .unwrap()
            .narrow(0, 1, 3 * 37 * 22 * 2)
            .unwrap()
            .view(&[3, 37, 22, 2])
            .unwrap();
        let complex = [
            pairs.transpose(1, 2).unwrap(),
            pairs.permute(&[2, 0, 1, 3]).unwrap(),
            pairs.narrow(1, 3, 30).unwrap().transpose(1, 2).unwrap(),
            odd.transpose(1, 2).unwrap(),
            odd.permute(&[0, 1, 3, 2]).unwrap(),
        ];
        for view in views.into_iter().chain(complex) {
            let copy = view.contiguous().unwrap();
            assert!(copy.is_contiguous() && copy.shape() == view.shape());
            // to_f64 of the view reads it element by element.
            assert_eq!(
                copy.to_f64().unwrap(),
                view.to_f64().unwrap(),
                "{dtype:?} {:?}",
                view.strides()
            );
        }
    }
}

#[test]
fn bad_views_are_typed_errors() {
    let (t, _) = source(Device::Cpu);
    let shape_error = |r: backends::Result<Tensor>| {
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}");
    };
    shape_error(t.view(&[5, 5]));
    shape_error(t.reshape(&[25]));
    shape_error(t.view(&[usize::MAX, 2]));
    shape_error(t.permute(&[0, 1]));
    shape_error(t.permute(&[0, 1, 1]));
    shape_error(t.permute(&[0, 1, 3]));
    shape_error(t.narrow(3, 0, 1));
    shape_error(t.narrow(2, 3, 2));
    shape_error(t.narrow(2, usize::MAX, 2));
    shape_error(t.select(1, 3));
    shape_error(t.select(3, 0));
    shape_error(t.expand(&[2, 5, 4]));
    shape_error(t.expand(&[3, 4]));
    shape_error(t.unsqueeze(4));
    shape_error(t.squeeze(3));
    // Empty views are fine: a narrow of length 0 at the end.
    let empty = t.narrow(2, 4, 0).unwrap();
    assert_eq!(empty.numel(), 0);
    assert!(empty.to_f64().unwrap().is_empty());
}

/// matmul reads a view's offset and strides: a narrowed, transposed weight.
#[test]
fn matmul_reads_views_with_offsets() {
    for dtype in [DType::F32, DType::F64, DType::Bf16] {
        let (m, k, n) = (5, 19, 7);
        let x = Tensor::from_f64(&random(m * (k + 3)), &[m, k + 3], dtype, Device::Cpu)
            .unwrap()
            .narrow(1, 2, k)
            .unwrap();
        let w = Tensor::from_f64(&random((n + 1) * k), &[n + 1, k], dtype, Device::Cpu)
            .unwrap()
            .narrow(0, 1, n)
            .unwrap()
            .t()
            .unwrap();
        let out = matmul(&x, &w).unwrap();
        let expected = reference(&x.to_f64().unwrap(), &w.to_f64().unwrap(), m, n, k);
        let bound = if dtype == DType::Bf16 { 1e-2 } else { 1e-5 };
        let err = rel_err(&out.to_f64().unwrap(), &expected);
        assert!(err < bound, "{dtype}: relative error {err:e}");
    }
}

#[test]
fn views_and_copies_of_device_tensors() {
    let Some(device) = adapter() else { return };
    let (t, _) = source(device);
    let host = t.to_device(Device::Cpu).unwrap();
    let view = t.permute(&[1, 2, 0]).unwrap().narrow(0, 1, 2).unwrap();
    let host_view = host.permute(&[1, 2, 0]).unwrap().narrow(0, 1, 2).unwrap();
    assert_eq!(view.to_f64().unwrap(), host_view.to_f64().unwrap());
    let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    let copy = view.contiguous().unwrap();
    let lines = capture.take();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("strided_copy") && l.contains("on the device")),
        "{lines:?}"
    );
    assert_eq!(copy.device(), device);
    assert!(copy.is_contiguous());
    assert_eq!(copy.to_f64().unwrap(), host_view.to_f64().unwrap());
}

/// Attention on views of a packed `[B, L, 3, H, D]` projection (strided, with offsets) gives
/// what it gives on contiguous copies of the same values, on the CPU (f32 and bf16, fused
/// and math) and on wgpu (which copies such views first and says so in the trace).
#[test]
fn attention_reads_views_of_a_packed_projection() {
    use backends::attention::{SdpBackend, sdpa_kernel_scoped};
    use backends::{SdpaOptions, sdpa};
    let (b, l, h, d) = (2, 9, 3, 16);
    let mut runs = vec![(DType::F32, Device::Cpu), (DType::Bf16, Device::Cpu)];
    runs.extend(adapter().map(|device| (DType::F32, device)));
    for (dtype, device) in runs {
        let packed =
            Tensor::from_f64(&random(b * l * 3 * h * d), &[b, l, 3, h, d], dtype, device).unwrap();
        let part = |i| packed.select(2, i).unwrap().permute(&[0, 2, 1, 3]).unwrap();
        let (q, k, v) = (part(0), part(1), part(2));
        assert!(!q.is_contiguous() && k.offset() > 0);
        for backend in [None, Some(SdpBackend::Math)] {
            let _only = backend.map(|b| sdpa_kernel_scoped(&[b], false));
            let _verbose = backends::mkl::verbose_scoped(backends::mkl::VERBOSE_ON).unwrap();
            let capture = backends::TraceCapture::start();
            let viewed = sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap().output;
            let lines = capture.take();
            let copied = sdpa(
                &q.contiguous().unwrap(),
                &k.contiguous().unwrap(),
                &v.contiguous().unwrap(),
                &SdpaOptions::default(),
            )
            .unwrap()
            .output;
            assert_eq!(
                viewed.to_f64().unwrap(),
                copied.to_f64().unwrap(),
                "{dtype} on {device}, {backend:?}"
            );
            if matches!(device, Device::Wgpu(_)) && backend.is_none() {
                assert!(
                    // q starts at the buffer's start: only k and v (offsets) are copied.
                    lines.iter().any(|l| l.contains("2 input views copied")),
                    "{lines:?}"
                );
            }
        }
    }
}
