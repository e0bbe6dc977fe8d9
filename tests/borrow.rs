//! Tensors over caller memory (`borrow_scope`): read in place by matmul, sdpa, einsum and
//! fft (the same results as owned tensors of the same layout, which the kernels' own tests
//! check against float64), written in place by `copy_` and the `*_out` forms, cut off when
//! the scope ends, and the typed errors of bad layouts and bad destinations.

mod common;

use backends::fft::{self, FftArgs, Norm};
use backends::{
    DType, Device, Error, SdpaOptions, Tensor, borrow_scope, einsum, einsum_out, matmul,
    matmul_out, sdpa, sdpa_out,
};
use common::{random, reference, rel_err};

/// Fresh random f32 values.
fn values(n: usize) -> Vec<f32> {
    random(n).into_iter().map(|x| x as f32).collect()
}

fn owned(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape, Device::Cpu).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn borrowed_tensors_view_the_callers_memory() {
    let data = values(24);
    borrow_scope(|scope| {
        let t = scope.borrow(&data, &[2, 3, 4]).unwrap();
        assert_eq!(t.data_ptr(), Some(data.as_ptr() as usize));
        assert_eq!(t.to_vec::<f32>().unwrap(), data);
        // Views share the caller's memory: a narrow starts 4 bytes per element further.
        let n = t.narrow(2, 1, 2).unwrap();
        assert_eq!(n.data_ptr(), Some(data.as_ptr() as usize + 4));
        assert_eq!(
            f32s(&n),
            f32s(&owned(&data, &[2, 3, 4]).narrow(2, 1, 2).unwrap())
        );
    });
}

#[test]
fn matmul_reads_borrowed_operands_in_place() {
    let (m, k, n) = (7, 33, 19);
    let (a, b) = (values(m * k), values(n * k));
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    // b is a [n, k] weight, used as its transpose: x @ W^T.
    let bt: Vec<f64> = (0..k * n)
        .map(|i| f64::from(b[(i % n) * k + i / n]))
        .collect();
    let expected = reference(&wide(&a), &bt, m, n, k);
    let got = borrow_scope(|scope| {
        let x = scope.borrow(&a, &[m, k])?;
        let w = scope.borrow(&b, &[n, k])?;
        matmul(&x, &w.t()?)
    })
    .unwrap();
    let owned_result = matmul(&owned(&a, &[m, k]), &owned(&b, &[n, k]).t().unwrap()).unwrap();
    assert_eq!(f32s(&got), f32s(&owned_result));
    assert!(rel_err(&got.to_f64().unwrap(), &expected) < 1e-5);
}

#[test]
fn attention_reads_a_blhd_cache_and_a_packed_qkv_buffer_without_copies() {
    let (b, l, h, d) = (2, 37, 4, 16);
    // One packed [B, L, 3, H, D] buffer, as a fused QKV projection writes it.
    let packed = values(b * l * 3 * h * d);
    let strides = [l * 3 * h * d, d, 3 * h * d, 1]; // [B, H, L, D] over [B, L, 3, H, D]
    let options = SdpaOptions {
        is_causal: true,
        ..Default::default()
    };
    let got = borrow_scope(|scope| {
        let part = |i: usize| scope.borrow_strided(&packed, &[b, h, l, d], &strides, i * h * d);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        assert_eq!(
            k.data_ptr(),
            Some(packed.as_ptr() as usize + h * d * 4),
            "k starts one head block into the caller's buffer"
        );
        sdpa(&q, &k, &v, &options)
    })
    .unwrap();
    // The same layout over an owned copy of the buffer.
    let whole = owned(&packed, &[b, l, 3, h, d]);
    let part = |i: usize| whole.select(2, i).unwrap().permute(&[0, 2, 1, 3]).unwrap();
    let expected = sdpa(&part(0), &part(1), &part(2), &options).unwrap();
    assert_eq!(got.backend, expected.backend);
    assert_eq!(f32s(&got.output), f32s(&expected.output));
}

#[test]
fn einsum_and_fft_read_borrowed_inputs() {
    let (x, y) = (values(2 * 3 * 5 * 8), values(2 * 3 * 6 * 8));
    let signal = values(4 * 64);
    let (e, spectrum) = borrow_scope(|scope| {
        let a = scope.borrow(&x, &[2, 3, 5, 8])?;
        let b = scope.borrow(&y, &[2, 3, 6, 8])?;
        let s = scope.borrow(&signal, &[4, 64])?;
        Ok::<_, Error>((
            einsum("bhld,bhmd->bhlm", &[&a, &b])?,
            fft::rfft_with(&s, &FftArgs::along(None, -1, Norm::Ortho))?,
        ))
    })
    .unwrap();
    let expected = einsum(
        "bhld,bhmd->bhlm",
        &[&owned(&x, &[2, 3, 5, 8]), &owned(&y, &[2, 3, 6, 8])],
    )
    .unwrap();
    assert_eq!(f32s(&e), f32s(&expected));
    let expected = fft::rfft_with(
        &owned(&signal, &[4, 64]),
        &FftArgs::along(None, -1, Norm::Ortho),
    )
    .unwrap();
    assert_eq!(f32s(&spectrum), f32s(&expected));
}

#[test]
fn out_forms_write_into_caller_memory() {
    let (m, k, n) = (5, 12, 9);
    let (a, b) = (values(m * k), values(k * n));
    // out is a [m, n] window of a wider [m, n + 3] buffer, poisoned: the columns outside the
    // window must keep their poison, the window must be all written.
    let mut buffer = vec![f32::NAN; m * (n + 3)];
    borrow_scope(|scope| {
        let out = scope.borrow_mut_strided(&mut buffer, &[m, n], &[n + 3, 1], 1)?;
        matmul_out(
            &scope.borrow(&a, &[m, k])?,
            &scope.borrow(&b, &[k, n])?,
            &out,
        )
    })
    .unwrap();
    let expected = f32s(&matmul(&owned(&a, &[m, k]), &owned(&b, &[k, n])).unwrap());
    for i in 0..m {
        let row = &buffer[i * (n + 3)..(i + 1) * (n + 3)];
        assert!(row[0].is_nan() && row[n + 1].is_nan() && row[n + 2].is_nan());
        assert_eq!(&row[1..n + 1], &expected[i * n..(i + 1) * n]);
    }

    // sdpa_out: a decoding step written into its slot of a caller buffer.
    let (h, lk, d) = (4, 50, 32);
    let (q, kv) = (values(h * d), values(2 * h * lk * d));
    let mut attn = vec![f32::NAN; h * d];
    let ran = borrow_scope(|scope| {
        let q = scope.borrow(&q, &[1, h, 1, d])?;
        let k = scope.borrow(&kv[..h * lk * d], &[1, h, lk, d])?;
        let v = scope.borrow(&kv[h * lk * d..], &[1, h, lk, d])?;
        let out = scope.borrow_mut(&mut attn, &[1, h, 1, d])?;
        sdpa_out(&q, &k, &v, &SdpaOptions::default(), &out).map(|r| r.backend)
    })
    .unwrap();
    let expected = sdpa(
        &owned(&q, &[1, h, 1, d]),
        &owned(&kv[..h * lk * d], &[1, h, lk, d]),
        &owned(&kv[h * lk * d..], &[1, h, lk, d]),
        &SdpaOptions::default(),
    )
    .unwrap();
    assert_eq!(ran, expected.backend);
    assert_eq!(attn, f32s(&expected.output));

    // einsum_out and an fft out form.
    let (x, y) = (values(6 * 7), values(7 * 4));
    let mut product = vec![f32::NAN; 6 * 4];
    let signal = values(3 * 32);
    let mut spectrum = vec![f32::NAN; 3 * 17 * 2];
    borrow_scope(|scope| {
        let out = scope.borrow_mut(&mut product, &[6, 4])?;
        einsum_out(
            "ij,jk->ik",
            &[&scope.borrow(&x, &[6, 7])?, &scope.borrow(&y, &[7, 4])?],
            &out,
        )?;
        let out = scope.borrow_mut(&mut spectrum, &[3, 17, 2])?;
        fft::rfft_out(&scope.borrow(&signal, &[3, 32])?, &FftArgs::default(), &out)
    })
    .unwrap();
    let expected = einsum("ij,jk->ik", &[&owned(&x, &[6, 7]), &owned(&y, &[7, 4])]).unwrap();
    assert_eq!(product, f32s(&expected));
    assert_eq!(
        spectrum,
        f32s(&fft::rfft(&owned(&signal, &[3, 32])).unwrap())
    );
}

#[test]
fn an_out_that_overlaps_its_inputs_receives_the_product() {
    let n = 6;
    let (mut a, b) = (values(n * n), values(n * n));
    let expected = f32s(&matmul(&owned(&a, &[n, n]), &owned(&b, &[n, n])).unwrap());
    borrow_scope(|scope| {
        let a = scope.borrow_mut(&mut a, &[n, n])?;
        matmul_out(&a, &scope.borrow(&b, &[n, n])?, &a)
    })
    .unwrap();
    assert_eq!(a, expected);
}

#[test]
fn copy_writes_every_view_of_the_storage_and_broadcasts() {
    let t = Tensor::full(0.0f32, &[3, 4], Device::Cpu).unwrap();
    let alias = t.clone();
    let row = values(4);
    t.narrow(0, 1, 2)
        .unwrap()
        .copy_(&owned(&row, &[4]))
        .unwrap();
    let got = f32s(&alias);
    assert_eq!(&got[..4], &[0.0; 4]);
    assert_eq!(&got[4..8], &row[..]);
    assert_eq!(&got[8..], &row[..]);
    // Into the transpose: column j of t receives element j of the source.
    let col = values(3);
    t.t()
        .unwrap()
        .select(0, 2)
        .unwrap()
        .copy_(&owned(&col, &[3]))
        .unwrap();
    let got = f32s(&t);
    assert_eq!([got[2], got[6], got[10]], [col[0], col[1], col[2]]);
}

#[test]
fn tensors_kept_past_their_scope_are_cut_off() {
    let data = values(16);
    let kept = borrow_scope(|scope| {
        let t = scope.borrow(&data, &[4, 4]).unwrap();
        (t.clone(), t.t().unwrap())
    });
    for t in [&kept.0, &kept.1] {
        assert!(matches!(t.to_vec::<f32>(), Err(Error::Borrow { .. })));
        assert!(matches!(matmul(t, t), Err(Error::Borrow { .. })));
        assert_eq!(t.data_ptr(), None);
    }
    // Also when the scope unwinds.
    let kept = std::sync::Mutex::new(None);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        borrow_scope(|scope| {
            *kept.lock().unwrap() = Some(scope.borrow(&data, &[16]).unwrap());
            panic!("the caller's closure fails");
        })
    }));
    assert!(unwound.is_err());
    let kept = kept.into_inner().unwrap().unwrap();
    assert!(matches!(kept.to_vec::<f32>(), Err(Error::Borrow { .. })));
}

#[test]
fn threads_share_borrowed_tensors_inside_the_scope() {
    let (a, b) = (values(64 * 64), values(64 * 64));
    let expected = f32s(&matmul(&owned(&a, &[64, 64]), &owned(&b, &[64, 64])).unwrap());
    borrow_scope(|scope| {
        let (x, y) = (
            scope.borrow(&a, &[64, 64]).unwrap(),
            scope.borrow(&b, &[64, 64]).unwrap(),
        );
        std::thread::scope(|threads| {
            let runs: Vec<_> = (0..3)
                .map(|_| threads.spawn(|| f32s(&matmul(&x, &y).unwrap())))
                .collect();
            for run in runs {
                assert_eq!(run.join().unwrap(), expected);
            }
        });
    });
}

#[test]
fn bad_layouts_and_destinations_are_typed_errors() {
    let data = values(12);
    let mut target = vec![0.0f32; 12];
    borrow_scope(|scope| {
        let shape_error =
            |r: backends::Result<Tensor>| matches!(r, Err(Error::ShapeMismatch { .. }));
        assert!(shape_error(scope.borrow(&data, &[5, 3])));
        assert!(shape_error(scope.borrow_strided(
            &data,
            &[3, 4],
            &[4, 1],
            1
        )));
        assert!(shape_error(scope.borrow_strided(&data, &[3, 4], &[4], 0)));
        assert!(shape_error(scope.borrow_strided(
            &data,
            &[2, 2],
            &[usize::MAX, 1],
            0
        )));
        assert!(shape_error(scope.borrow_strided(
            &data,
            &[0, 4],
            &[4, 1],
            13
        )));
        // Empty views and repeated (stride-0) reads are fine.
        scope.borrow_strided(&data, &[0, 4], &[4, 1], 12).unwrap();
        let repeated = scope.borrow_strided(&data, &[3, 12], &[0, 1], 0).unwrap();
        assert_eq!(f32s(&repeated)[12..24], data[..]);

        let read_only = scope.borrow(&data, &[3, 4]).unwrap();
        let source = owned(&values(12), &[3, 4]);
        assert!(matches!(
            read_only.copy_(&source),
            Err(Error::Borrow { .. })
        ));
        let out = scope.borrow_mut(&mut target, &[3, 4]).unwrap();
        // Wrong shape, dtype or repeated destination elements.
        let a = owned(&values(6), &[3, 2]);
        let b = owned(&values(6), &[2, 3]);
        assert!(matches!(
            matmul_out(&a, &b, &out),
            Err(Error::ShapeMismatch { .. })
        ));
        let half = Tensor::from_f64(&random(12), &[3, 4], DType::F16, Device::Cpu).unwrap();
        assert!(matches!(out.copy_(&half), Err(Error::DTypeMismatch { .. })));
        let spread = out.narrow(0, 0, 1).unwrap().expand(&[3, 4]).unwrap();
        assert!(matches!(
            spread.copy_(&source),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            out.copy_(&owned(&values(5), &[5])),
            Err(Error::ShapeMismatch { .. })
        ));
    });
    assert_eq!(
        target, [0.0; 12],
        "failed writes leave the memory as it was"
    );
}
