//! Attention for serving on the CPU: packed variable-length batches (`sdpa_varlen`) and
//! paged KV caches (`sdpa_paged`) against the float64 reference of each sequence alone
//! (its rows gathered here, its causal mask and window written out by the reference), with
//! lengths off the tiles, empty sequences, GQA, both causal alignments, sliding windows,
//! rows that see no key, the decoding kernel (split over the keys where threads are idle)
//! and the block kernel; bad offsets and block tables give typed errors.

mod common;

use backends::{
    CausalVariant, DType, Device, Error, PagedKv, SdpaOptions, Tensor, Varlen, Window, sdpa_paged,
    sdpa_varlen,
};
use common::random;
use common::serving::{Masking, NONE, paged_error, varlen_error};
use half::bf16;

#[test]
fn packed_sequences_match_each_sequence_alone() {
    let lower = Some(CausalVariant::LowerRight);
    let upper = Some(CausalVariant::UpperLeft);
    // Prefill: each sequence against itself, lengths off the 48-row and 64-key tiles, an
    // empty sequence, GQA.
    let prefill = [17, 300, 5, 0, 64];
    for masking in [
        NONE,
        Masking {
            causal: upper,
            ..NONE
        },
        Masking {
            causal: lower,
            window: Window::new(Some(32), Some(0)),
        },
        Masking {
            causal: None,
            window: Window::new(Some(7), Some(3)),
        },
    ] {
        let err = varlen_error::<f32>(&prefill, &prefill, (4, 2, 64), masking, Device::Cpu);
        assert!(err < 1e-5, "f32 {masking:?}: {err}");
        let err = varlen_error::<bf16>(&prefill, &prefill, (4, 2, 64), masking, Device::Cpu);
        assert!(err < 1e-2, "bf16 {masking:?}: {err}");
    }
    // Chunked prefill: new queries against longer contexts, bottom-right causal; more
    // queries than keys (the first rows see none, and give 0); a sequence without keys.
    let err = varlen_error::<f32>(
        &[5, 60, 20, 3],
        &[100, 61, 7, 0],
        (3, 3, 32),
        Masking {
            causal: lower,
            ..NONE
        },
        Device::Cpu,
    );
    assert!(err < 1e-5, "chunked prefill: {err}");
    let err = varlen_error::<half::f16>(&[33, 1], &[40, 90], (2, 1, 128), NONE, Device::Cpu);
    assert!(err < 2e-3, "f16: {err}");
}

#[test]
fn a_paged_cache_matches_each_sequence_alone() {
    let lower = Masking {
        causal: Some(CausalVariant::LowerRight),
        ..NONE
    };
    let vector_level = matches!(
        backends::cpu::get_cpu_capability(),
        backends::cpu::CpuCapability::Avx2 | backends::cpu::CpuCapability::Avx512
    );
    let decoding = |lines: &[String]| lines.iter().any(|l| l.contains("decoding kernel"));
    let together = |lines: &[String]| lines.iter().any(|l| l.contains("heads read together"));
    // Decoding steps (Lq = 1 and 3, GQA): the decoding kernel reads the blocks through the
    // table; contexts off the block size, and an empty one.
    for (lq, masking) in [
        (1, NONE),
        (3, lower),
        (
            2,
            Masking {
                window: Window::new(Some(50), None),
                ..lower
            },
        ),
    ] {
        let dims = (8, 2, lq, 64, 16);
        let (err, lines) = paged_error::<f32>(&[1000, 0, 37, 16], dims, masking, Device::Cpu);
        assert!(err < 1e-5, "f32 Lq {lq} {masking:?}: {err}");
        assert!(!vector_level || decoding(&lines), "{lines:?}");
        // The sequence's 8 x Lq query rows fit one unit: both heads of a block read together.
        assert!(!vector_level || together(&lines), "{lines:?}");
        let (err, _) = paged_error::<bf16>(&[300, 5], dims, masking, Device::Cpu);
        assert!(err < 1e-2, "bf16 Lq {lq} {masking:?}: {err}");
    }
    // 16 heads x 3 rows are more than a unit holds: one unit per key/value head (blocks of 7
    // tokens).
    let (err, lines) = paged_error::<f32>(&[300, 40], (16, 2, 3, 32, 7), lower, Device::Cpu);
    assert!(err < 1e-5, "16 heads: {err}");
    assert!(
        !vector_level || decoding(&lines) && !together(&lines),
        "{lines:?}"
    );
    // A chunk of 16 queries per sequence (chunked prefill, bottom-right causal): the block
    // kernel over each sequence's gathered heads; blocks of 1 and of 7 tokens.
    for block in [1, 7] {
        let (err, lines) =
            paged_error::<f32>(&[200, 16, 77], (4, 4, 16, 32, block), lower, Device::Cpu);
        assert!(err < 1e-5, "Lq 16, block {block}: {err}");
        assert!(!decoding(&lines), "{lines:?}");
        // In bf16, on the CPU's bf16 dot products where they pay (the f32 FMAs elsewhere).
        let (err, lines) =
            paged_error::<bf16>(&[200, 16, 77], (4, 4, 16, 32, block), lower, Device::Cpu);
        assert!(err < 1e-2, "bf16 Lq 16, block {block}: {err}");
        let dots = backends::cpu::get_cpu_capability() == backends::cpu::CpuCapability::Avx512
            && backends::cpu::bf16_dot_speedup().is_some_and(|speedup| speedup > 1.5);
        let said = lines.iter().any(|l| l.contains("bf16 dot products"));
        assert_eq!(said, dots, "{lines:?}");
    }
    // One long sequence on 4 threads: its keys are split into runs, combined by their
    // log-sum-exps.
    let _t = backends::NUM_THREADS.guard_scoped(4);
    let (err, lines) = paged_error::<f32>(&[9000], (4, 1, 1, 64, 32), NONE, Device::Cpu);
    assert!(err < 1e-5, "split: {err}");
    assert!(
        !vector_level || lines.iter().any(|l| l.contains("split into")),
        "{lines:?}"
    );
}

#[test]
fn bad_offsets_tables_and_options_are_typed_errors() {
    let t = |shape: &[usize]| {
        Tensor::from_f64(
            &random(shape.iter().product()),
            shape,
            DType::F32,
            Device::Cpu,
        )
        .unwrap()
    };
    let (q, k) = (t(&[10, 2, 8]), t(&[12, 2, 8]));
    let call = |cu_q: &[usize], cu_k: &[usize], options: &SdpaOptions| {
        let batch = Varlen {
            cu_seqlens_q: cu_q,
            cu_seqlens_k: cu_k,
        };
        sdpa_varlen(&q, &k, &k, &batch, options)
    };
    let plain = SdpaOptions::default();
    for (cu_q, cu_k) in [
        (&[0, 4, 9][..], &[0, 5, 12][..]), // does not end at total_q
        (&[1, 4, 10], &[0, 5, 12]),        // does not start at 0
        (&[0, 6, 4, 10], &[0, 5, 6, 12]),  // decreases
        (&[0, 4, 10], &[0, 12]),           // different batch sizes
        (&[], &[]),                        // no offsets at all
    ] {
        let err = call(cu_q, cu_k, &plain).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument { .. } | Error::ShapeMismatch { .. }
            ),
            "{cu_q:?} {cu_k:?}: {err}"
        );
    }
    let good = (&[0, 4, 10][..], &[0, 5, 12][..]);
    assert!(call(good.0, good.1, &plain).is_ok());
    let mask = t(&[10, 12]);
    for options in [
        SdpaOptions {
            attn_mask: Some(&mask),
            ..plain
        },
        SdpaOptions {
            dropout_p: 0.1,
            ..plain
        },
    ] {
        let err = call(good.0, good.1, &options).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
    // Paged: a table entry past the cache, a length past its table row, a ragged table.
    let (kc, q4) = (t(&[4, 8, 2, 8]), t(&[2, 2, 1, 8]));
    let paged = |table: &[usize], lens: &[usize]| {
        let cache = PagedKv {
            key_cache: &kc,
            value_cache: &kc,
            block_table: table,
            seq_lens: lens,
        };
        sdpa_paged(&q4, &cache, &plain)
    };
    assert!(paged(&[0, 1, 2, 3], &[16, 9]).is_ok());
    for (table, lens) in [
        (&[0, 1, 2, 4][..], &[16, 9][..]),
        (&[0, 1, 2, 3], &[17, 9]),
        (&[0, 1, 2], &[8, 8]),
        (&[0, 1, 2, 3], &[8]),
    ] {
        let err = paged(table, lens).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{table:?} {lens:?}: {err}"
        );
    }
    // Head dims of 0 let the head counts be huge: a typed error or an empty result, at once.
    let empty = |shape: &[usize]| Tensor::from_f64(&[], shape, DType::F32, Device::Cpu).unwrap();
    let (hq, hk) = (empty(&[3, 1 << 40, 0]), empty(&[2, 1 << 40, 0]));
    let batch = Varlen {
        cu_seqlens_q: &[0, 3],
        cu_seqlens_k: &[0, 2],
    };
    let huge = SdpaOptions {
        scale: Some(1.0),
        ..plain
    };
    let result = sdpa_varlen(&hq, &hk, &hk, &batch, &huge);
    assert!(
        match &result {
            Ok(out) => out.output.numel() == 0,
            Err(e) => matches!(
                e,
                Error::OutOfMemory { .. } | Error::NoAvailableKernel { .. }
            ),
        },
        "{result:?}"
    );
    // f64 and non-CPU tensors are refused with what to do.
    let q64 = Tensor::from_f64(&random(160), &[10, 2, 8], DType::F64, Device::Cpu).unwrap();
    let batch = Varlen::same(&[0, 10]);
    assert!(sdpa_varlen(&q64, &q64, &q64, &batch, &plain).is_err());
}

/// The same calls on wgpu (lavapipe here): the memory-efficient WGSL kernel reads the
/// sequence table (packed offsets, or the paged cache's lengths and block table).
#[test]
fn split_kv_decoding_runs_on_wgpu() {
    let Some(device) = common::adapter() else {
        return;
    };
    common::serving::split_kv_decoding_matches(
        device,
        &[backends::DType::F32, backends::DType::F16],
        true,
    );
    common::serving::split_kv_paged_decoding_matches(device);
}

#[test]
fn serving_calls_run_on_wgpu() {
    let Some(device) = common::adapter() else {
        return;
    };
    let lower = Some(CausalVariant::LowerRight);
    for masking in [
        NONE,
        Masking {
            causal: lower,
            window: Window::new(Some(20), Some(0)),
        },
    ] {
        let err = varlen_error::<f32>(
            &[17, 70, 0, 5],
            &[17, 70, 0, 5],
            (4, 2, 32),
            masking,
            device,
        );
        assert!(err < 1e-5, "varlen {masking:?}: {err}");
        let err = varlen_error::<f32>(&[3, 40], &[50, 41], (2, 2, 64), masking, device);
        assert!(err < 1e-5, "chunked varlen {masking:?}: {err}");
        let (err, lines) = paged_error::<f32>(&[100, 0, 37], (4, 2, 2, 32, 16), masking, device);
        assert!(err < 1e-5, "paged {masking:?}: {err}");
        assert!(
            lines.iter().any(|l| l.contains("sequence table")),
            "{lines:?}"
        );
    }
}
