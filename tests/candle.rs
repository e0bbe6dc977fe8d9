//! The `candle` feature (`cargo test --features candle --test candle`): an attention block of
//! a candle model whose attention and output projection run through this library, checked
//! against candle's own ops; inputs read in place, the `#[sdpa_kernel]` pin and the trace in
//! force, and the conversions between the tensor types sharing memory. With `candle-cuda`
//! (which links CUDA: build it where a CUDA toolkit is), the block on candle's CUDA tensors.
#![cfg(feature = "candle")]

use candle_core::{D, DType, Device, Tensor};

mod common;

fn randn(shape: &[usize]) -> Tensor {
    let values: Vec<f32> = common::random(shape.iter().product())
        .into_iter()
        .map(|x| x as f32)
        .collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn rel_err(got: &Tensor, expected: &Tensor) -> f64 {
    let flat = |t: &Tensor| -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    common::rel_err(&flat(got), &flat(expected))
}

/// Causal attention of `[B, H, L, D]` tensors with candle's own ops.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    let (l, d) = (q.dim(2).unwrap(), q.dim(3).unwrap());
    let scores = (q
        .contiguous()
        .unwrap()
        .matmul(&k.t().unwrap().contiguous().unwrap())
        .unwrap()
        / (d as f64).sqrt())
    .unwrap();
    let hidden: Vec<f32> = (0..l * l)
        .map(|i| {
            if i % l > i / l {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(hidden, (l, l), &Device::Cpu).unwrap();
    let scores = scores.broadcast_add(&mask).unwrap();
    let max = scores.max_keepdim(D::Minus1).unwrap();
    let weights = scores.broadcast_sub(&max).unwrap().exp().unwrap();
    let weights = weights
        .broadcast_div(&weights.sum_keepdim(D::Minus1).unwrap())
        .unwrap();
    weights.matmul(&v.contiguous().unwrap()).unwrap()
}

#[test]
fn an_attention_block_matches_candles_own_ops() {
    let (b, l, e, h) = (2, 37, 64, 4);
    let x = randn(&[b, l, e]);
    let weight = |_| randn(&[e, e]);
    let (wq, wk, wv, wo): (Tensor, Tensor, Tensor, Tensor) =
        (weight(0), weight(1), weight(2), weight(3));
    // [B, L, E] -> [B, L, H, D] -> [B, H, L, D]: a strided view, read in place.
    let heads = |w: &Tensor| {
        x.broadcast_matmul(&w.t().unwrap())
            .unwrap()
            .reshape((b, l, h, e / h))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let (q, k, v) = (heads(&wq), heads(&wk), heads(&wv));
    assert!(!q.is_contiguous());
    let attention = backends::candle::Attention {
        is_causal: true,
        ..Default::default()
    };
    let ours = backends::candle::sdpa(&q, &k, &v, &attention).unwrap();
    let theirs = candle_attention(&q, &k, &v);
    assert_eq!(ours.dims(), theirs.dims());
    assert!(
        rel_err(&ours, &theirs) < 1e-5,
        "{}",
        rel_err(&ours, &theirs)
    );
    // The output projection: x @ Woᵀ with Woᵀ a transposed view.
    let merged = ours.transpose(1, 2).unwrap().reshape((b, l, e)).unwrap();
    let projected = backends::candle::matmul(&merged, &wo.t().unwrap()).unwrap();
    let expected = merged.broadcast_matmul(&wo.t().unwrap()).unwrap();
    assert!(rel_err(&projected, &expected) < 1e-5);
}

/// With `candle-cuda`: q, k and v as strided views of one packed QKV tensor on candle's CUDA
/// device, read there in place, and the output projection with a transposed weight, against
/// candle's own ops on the host (candle's CUDA matmul would need cuBLAS besides).
#[cfg(feature = "candle-cuda")]
#[test]
fn an_attention_block_runs_on_candles_cuda_tensors() {
    let Ok(gpu) = Device::new_cuda(0) else {
        eprintln!("skipped: candle finds no CUDA device");
        return;
    };
    let (b, l, e, h) = (2, 37, 64, 4);
    let (qkv, wo) = (randn(&[b, l, 3, h, e / h]), randn(&[e, e]));
    // [B, L, 3, H, D] -> q, k, v as [B, H, L, D] views: strides only, on either device.
    let split = |t: &Tensor, which: usize| {
        t.narrow(2, which, 1)
            .unwrap()
            .squeeze(2)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let on_gpu = qkv.to_device(&gpu).unwrap();
    for (dtype, bound) in [(DType::F32, 2e-5), (DType::BF16, 1e-2)] {
        let packed = on_gpu.to_dtype(dtype).unwrap();
        let (q, k, v) = (split(&packed, 0), split(&packed, 1), split(&packed, 2));
        assert!(!q.is_contiguous());
        let causal = backends::candle::Attention {
            is_causal: true,
            ..Default::default()
        };
        let ours = backends::candle::sdpa(&q, &k, &v, &causal).unwrap();
        assert!(ours.device().is_cuda());
        assert_eq!(ours.dtype(), dtype);
        let theirs = candle_attention(&split(&qkv, 0), &split(&qkv, 1), &split(&qkv, 2));
        let ours = ours.to_device(&Device::Cpu).unwrap();
        assert!(
            rel_err(&ours, &theirs) < bound,
            "{dtype:?}: {}",
            rel_err(&ours, &theirs)
        );
    }
    let (q, k, v) = (split(&on_gpu, 0), split(&on_gpu, 1), split(&on_gpu, 2));
    let out = backends::candle::sdpa(&q, &k, &v, &Default::default()).unwrap();
    let merged = out.transpose(1, 2).unwrap().reshape((b, l, e)).unwrap();
    let projected =
        backends::candle::matmul(&merged, &wo.to_device(&gpu).unwrap().t().unwrap()).unwrap();
    assert!(projected.device().is_cuda());
    let merged = merged.to_device(&Device::Cpu).unwrap();
    let expected = merged.broadcast_matmul(&wo.t().unwrap()).unwrap();
    let projected = projected.to_device(&Device::Cpu).unwrap();
    assert!(rel_err(&projected, &expected) < 2e-5);
    // A mask on the host with q on the GPU is a candle error, not a panic.
    let masked = backends::candle::Attention {
        attn_mask: Some(randn(&[1, 1, l, l])),
        ..Default::default()
    };
    assert!(backends::candle::sdpa(&q, &k, &v, &masked).is_err());
}

#[test]
fn masks_gqa_and_bf16_go_through() {
    let (b, hq, hk, l, d) = (1, 8, 2, 19, 32);
    let (q, k, v) = (
        randn(&[b, hq, l, d]),
        randn(&[b, hk, l, d]),
        randn(&[b, hk, l, d]),
    );
    let mask = randn(&[1, 1, l, l]);
    let attention = backends::candle::Attention {
        attn_mask: Some(mask.clone()),
        enable_gqa: true,
        ..Default::default()
    };
    let ours = backends::candle::sdpa(&q, &k, &v, &attention).unwrap();
    // The same call on this library's tensors (the kernels' own tests check those).
    let mine = |t: &Tensor| {
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        backends::Tensor::from_vec(values, t.dims(), backends::Device::Cpu).unwrap()
    };
    let expected = backends::sdpa(
        &mine(&q),
        &mine(&k),
        &mine(&v),
        &backends::SdpaOptions {
            attn_mask: Some(&mine(&mask)),
            enable_gqa: true,
            ..Default::default()
        },
    )
    .unwrap()
    .output;
    let got: Vec<f32> = ours.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(got, expected.to_vec::<f32>().unwrap());

    let half = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let attention = backends::candle::Attention {
        enable_gqa: true,
        is_causal: true,
        ..Default::default()
    };
    let ours = backends::candle::sdpa(&half(&q), &half(&k), &half(&v), &attention).unwrap();
    assert_eq!(ours.dtype(), DType::BF16);
    let repeat = |t: &Tensor| {
        Tensor::cat(&vec![t.unsqueeze(2).unwrap(); hq / hk], 2)
            .unwrap()
            .reshape((b, hq, l, d))
            .unwrap()
    };
    let reference = candle_attention(&q, &repeat(&k), &repeat(&v));
    assert!(rel_err(&ours, &reference) < 1e-2);
}

/// The trace line of one candle attention call on `q`.
fn traced_backend(q: &Tensor) -> String {
    let _v = backends::mkldnn::verbose_scoped(backends::mkldnn::VERBOSE_ON).unwrap();
    let capture = backends::TraceCapture::start();
    backends::candle::sdpa(q, q, q, &Default::default()).unwrap();
    let lines = capture.take();
    lines
        .into_iter()
        .find(|l| l.contains(",sdpa_"))
        .expect("an sdpa line")
}

#[test]
fn the_sdpa_kernel_attribute_and_the_trace_apply_to_candle_calls() {
    #[backends::sdpa_kernel(math)]
    fn pinned(q: &Tensor) -> String {
        traced_backend(q)
    }
    let q = randn(&[1, 2, 8, 16]);
    let free = traced_backend(&q);
    assert!(free.contains(",sdpa_flash_attention,"), "{free}");
    let line = pinned(&q);
    assert!(line.contains(",sdpa_math,"), "{line}");
}

#[test]
fn conversions_share_memory() {
    // A candle tensor read in place: the same address, offset by the view's start.
    let t = randn(&[4, 6]);
    let narrowed = t.narrow(1, 2, 3).unwrap();
    let (storage, layout) = narrowed.storage_and_layout();
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(values)) = &*storage else {
        panic!("a CPU f32 tensor");
    };
    let base = values.as_ptr() as usize;
    backends::borrow_scope(|scope| {
        let view = backends::candle::borrow(scope, &storage, layout).unwrap();
        assert_eq!(view.data_ptr(), Some(base + 2 * 4));
        assert_eq!(view.shape(), [4, 3]);
        let expected: Vec<f32> = narrowed.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(view.to_vec::<f32>().unwrap(), expected);
    });
    drop(storage);
    // Our result moves into candle without a copy.
    let ours =
        backends::Tensor::from_vec(vec![1.5f32; 12], &[3, 4], backends::Device::Cpu).unwrap();
    let address = ours.data_ptr().unwrap();
    let moved = backends::candle::to_candle(ours).unwrap();
    let (storage, _) = moved.storage_and_layout();
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(values)) = &*storage else {
        panic!("a CPU f32 tensor");
    };
    assert_eq!(values.as_ptr() as usize, address);
    assert_eq!(moved.dims(), [3, 4]);
}

#[test]
fn unsupported_inputs_are_candle_errors() {
    let q = randn(&[1, 2, 4, 8]);
    let ints = q.to_dtype(DType::U8).unwrap();
    assert!(backends::candle::sdpa(&ints, &ints, &ints, &Default::default()).is_err());
    let bad = randn(&[1, 2, 4, 9]);
    assert!(backends::candle::matmul(&q, &bad).is_err());
}
