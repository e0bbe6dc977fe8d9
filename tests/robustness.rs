//! Inputs that once crashed, aborted or panicked the caller's process: each now gives a
//! typed error or a correct result. Every call runs under `catch_unwind`, so that a panic
//! fails its case by name instead of ending the run.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use backends::mha::{self, MhaOptions, MhaWeights};
use backends::{Device, Error, SdpaOptions, Tensor, einsum, einsum_path, fft, matmul, sdpa};

/// Runs `f`, failing with `what` if it panics; returns its result.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("{what} panicked"))
}

fn full(shape: &[usize]) -> Tensor {
    Tensor::full(0.5f32, shape, Device::Cpu).unwrap()
}

#[test]
fn shapes_whose_extent_overflows_are_errors_at_construction() {
    for shape in [
        &[2, (1 << 63) + 8][..],
        &[1 << 32, 1 << 32],
        &[0, 1 << 62, 1 << 62],
        &[0, 1, 1, usize::MAX],
    ] {
        let made = no_panic("from_vec", || {
            Tensor::from_vec(vec![0f32; 16], shape, Device::Cpu)
        });
        assert!(
            matches!(made, Err(Error::ShapeMismatch { .. })),
            "{shape:?}: {made:?}"
        );
        let bools = no_panic("from_bools", || Tensor::from_bools(&[], shape, Device::Cpu));
        assert!(bools.is_err(), "{shape:?}");
        assert!(Tensor::full(0f32, shape, Device::Cpu).is_err(), "{shape:?}");
    }
}

#[test]
fn allocations_sized_by_the_caller_fail_with_out_of_memory() {
    let huge = no_panic("full", || Tensor::full(0f32, &[1 << 40], Device::Cpu));
    assert!(matches!(huge, Err(Error::OutOfMemory { .. })), "{huge:?}");
    // einsum materialising a broadcast of 4096^3 elements.
    let (one, v) = (full(&[1, 1, 1]), full(&[4096]));
    let out = no_panic("einsum broadcast", || {
        einsum("ijk,i,j,k->ijk", &[&one, &v, &v, &v])
    });
    assert!(matches!(out, Err(Error::OutOfMemory { .. })), "{out:?}");
    // irfft's output length is the caller's: 2^40 complex values do not fit the machine,
    // and 2^62 real ones not the address space.
    let spectrum = full(&[1, 3, 2]);
    let out = no_panic("irfft n = 2^40", || fft::irfft(&spectrum, Some(1 << 40)));
    assert!(matches!(out, Err(Error::OutOfMemory { .. })), "{out:?}");
    for n in [1 << 62, usize::MAX] {
        let out = no_panic("irfft n = 2^62", || fft::irfft(&spectrum, Some(n)));
        assert!(
            matches!(out, Err(Error::ShapeMismatch { .. })),
            "{n}: {out:?}"
        );
    }
}

#[test]
fn attention_without_query_rows_and_with_a_head_dim_of_0() {
    // No rows: an empty result, whatever the head dim.
    let q = Tensor::from_vec(Vec::<f32>::new(), &[0, 1, 1, 1 << 40], Device::Cpu).unwrap();
    let out = no_panic("sdpa without rows", || {
        sdpa(&q, &q, &q, &SdpaOptions::default())
    });
    assert_eq!(out.unwrap().output.shape(), &[0, 1, 1, 1 << 40]);
    // Head dim 0: every score is 0 times an infinite scale, NaN, as math and PyTorch give.
    let q = Tensor::from_vec(Vec::<f32>::new(), &[1, 2, 3, 0], Device::Cpu).unwrap();
    let v = full(&[1, 2, 3, 4]);
    let out = no_panic("sdpa head dim 0", || {
        sdpa(&q, &q, &v, &SdpaOptions::default())
    })
    .unwrap();
    assert!(
        out.output
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_nan())
    );
}

#[test]
fn einsum_and_fft_edge_cases() {
    let (a, b) = (full(&[2, 3]), full(&[3, 4]));
    let out = no_panic("einsum with U+3000", || {
        einsum("i\u{3000}j,jk->ik", &[&a, &b])
    });
    assert_eq!(out.unwrap().shape(), &[2, 4]);
    let odd = no_panic("einsum with é", || einsum("ié,jk->ik", &[&a, &b]));
    assert!(
        matches!(
            odd,
            Err(Error::InvalidArgument { .. }) | Err(Error::ShapeMismatch { .. })
        ),
        "{odd:?}"
    );
    // A path cost past u128 saturates instead of wrapping to 0.
    let big = usize::MAX;
    let p = no_panic("einsum_path", || {
        einsum_path(
            "ab,bc,cd,de->ae",
            &[&[big, big], &[big, big], &[big, big], &[big, big]],
        )
    })
    .unwrap();
    assert_eq!(p.naive_flops, u128::MAX);
    assert_eq!(p.optimized_flops, u128::MAX);
    // No signal but a huge length (found by the fuzz test): nothing is planned.
    let none = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 40, 2], Device::Cpu).unwrap();
    let out = no_panic("fft of [0, 2^40, 2]", || fft::fft(&none)).unwrap();
    assert_eq!(out.shape(), &[0, 1 << 40, 2]);
    let empty = Tensor::from_vec(Vec::<f32>::new(), &[3, 0, 2], Device::Cpu).unwrap();
    let out = no_panic("irfft of [3, 0, 2]", || fft::irfft(&empty, Some(4)));
    assert!(out.is_err());
}

#[test]
fn mha_with_an_embedding_of_0() {
    // Also with a batch so large that walking it would never end.
    let x = Tensor::from_vec(Vec::<f32>::new(), &[1 << 40, 3, 0], Device::Cpu).unwrap();
    let w = Tensor::from_vec(Vec::<f32>::new(), &[0, 0], Device::Cpu).unwrap();
    let weights = MhaWeights::packed(&w, None, &w, None);
    let out = no_panic("mha with E = 0", || {
        mha::multi_head_attention_forward(&x, &x, &x, 1, &weights, &MhaOptions::default())
    });
    assert!(
        matches!(
            out,
            Err(Error::InvalidArgument {
                what: "embedding size",
                ..
            })
        ),
        "{out:?}"
    );
}

#[test]
fn mha_sizes_that_overflow_are_errors() {
    // A byte-sized dtype lets E reach past usize::MAX / 3: the packed projection's 3E
    // overflows (found reviewing the size arithmetic).
    let x = Tensor::from_bools(&[], &[0, 0, (1 << 62) + 1], Device::Cpu).unwrap();
    let weights = MhaWeights::packed(&x, None, &x, None);
    let out = no_panic("mha with 3E > usize::MAX", || {
        mha::multi_head_attention_forward(&x, &x, &x, 1, &weights, &MhaOptions::default())
    });
    assert!(matches!(out, Err(Error::ShapeMismatch { .. })), "{out:?}");
    // Scores [N, H, L, S] past the address space.
    let q = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 40, 4], Device::Cpu).unwrap();
    let w_in = Tensor::from_vec(vec![0.5f32; 48], &[12, 4], Device::Cpu).unwrap();
    let w_out = Tensor::from_vec(vec![0.5f32; 16], &[4, 4], Device::Cpu).unwrap();
    let weights = MhaWeights::packed(&w_in, None, &w_out, None);
    let out = no_panic("mha with L·S past the address space", || {
        mha::multi_head_attention_forward(&q, &q, &q, 2, &weights, &MhaOptions::default())
    });
    assert!(matches!(out, Err(Error::ShapeMismatch { .. })), "{out:?}");
}

#[test]
fn matmul_of_huge_but_empty_operands() {
    let a = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 30], Device::Cpu).unwrap();
    let b = Tensor::from_vec(Vec::<f32>::new(), &[1 << 30, 0], Device::Cpu).unwrap();
    let out = no_panic("matmul", || matmul(&a, &b)).unwrap();
    assert_eq!(out.shape(), &[0, 0]);
    // An output whose strides would overflow is a typed error, as such a tensor is at
    // construction.
    let a = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 40, 1], Device::Cpu).unwrap();
    let b = Tensor::from_vec(Vec::<f32>::new(), &[0, 1, 1 << 40], Device::Cpu).unwrap();
    let out = no_panic("matmul to [0, 2^40, 2^40]", || matmul(&a, &b));
    assert!(matches!(out, Err(Error::ShapeMismatch { .. })), "{out:?}");
}
