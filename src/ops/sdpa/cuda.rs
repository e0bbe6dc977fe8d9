//! Flash and memory-efficient attention on CUDA through the generated kernels
//! (`flash_fwd.cu`: fp16/bf16 `mma.sync`; `mem_eff_fwd.cu`: fp32 SIMT with masks), with
//! dropout drawn by the same stateless per-weight decision as the host's math path.

use super::{GpuRows, Job, SdpaOutput, band_args, broadcast_strides};
use crate::core::generator::Draw;
use crate::core::sdp::SdpBackend;
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{Elem, KernelEntry, MaskKind, rules};
use crate::runtime::cuda::launch::Kernel;
use crate::runtime::cuda::memory::CudaBuffer;
use crate::runtime::cuda::{grid_dim, int_arg, long_arg};
use crate::{DType, Device, Error, Result};

const OP: &str = "scaled_dot_product_attention on CUDA";

/// Batch, head and row strides of q, k, v or o (`[B, H, L, D]`, or `[H, L, D]` with a batch
/// stride of 0), which the kernels take with the last dimension contiguous.
fn strides(t: &Tensor) -> Result<[usize; 3]> {
    let st = t.strides();
    let r = st.len();
    if st[r - 1] != 1 && t.shape()[r - 1] > 1 {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: format!(
                "the last dimension must be contiguous (strides {st:?}); pass a contiguous copy"
            ),
        });
    }
    Ok([if r == 4 { st[0] } else { 0 }, st[r - 3], st[r - 2]])
}

/// Runs the selected fused backend (flash or memory-efficient) on device `ordinal`.
pub(super) fn fused(
    ordinal: usize,
    backend: SdpBackend,
    pinned: Option<&'static KernelEntry>,
    job: &Job,
) -> Result<SdpaOutput> {
    launch(ordinal, backend, pinned, job, None)
}

/// Flash attention over `count` chunks of `chunk` keys side by side (split-KV, the grid's
/// third axis): the partial outputs `[count, B · H · Lq · Dv]` and log-sum-exps
/// `[count, B · H · Lq]`, for the combine kernel.
pub(super) fn flash_chunks(
    ordinal: usize,
    job: &Job,
    count: usize,
    chunk: usize,
) -> Result<SdpaOutput> {
    launch(ordinal, SdpBackend::Flash, None, job, Some((count, chunk)))
}

/// [`fused`], or with `split = Some((count, chunk))` flash's split-KV form ([`flash_chunks`]).
fn launch(
    ordinal: usize,
    backend: SdpBackend,
    pinned: Option<&'static KernelEntry>,
    job: &Job,
    split: Option<(usize, usize)>,
) -> Result<SdpaOutput> {
    let Job {
        query: q,
        key: k,
        value: v,
        options: o,
        shape: ref s,
        scale,
        ref out_shape,
        ..
    } = *job;
    let elem = q.dtype().elem().ok_or(Error::DTypeMismatch {
        op: OP,
        expected: DType::F16,
        got: q.dtype(),
    })?;
    let mask = match o.attn_mask.map(Tensor::dtype) {
        None => MaskKind::None,
        Some(DType::Bool) => MaskKind::Bool,
        Some(dtype) if dtype == q.dtype() => MaskKind::Additive,
        Some(dtype) => {
            return Err(Error::DTypeMismatch {
                op: "an additive attn_mask on CUDA",
                expected: q.dtype(),
                got: dtype,
            });
        }
    };
    let key = pinned
        .filter(|e| e.cuda.is_some())
        .map(|e| e.key)
        .or_else(|| rules::kernel_key(backend.into(), elem, s.d, job.banded(), mask))
        .ok_or_else(|| Error::Unavailable {
            what: "an attention kernel",
            why: format!("no {backend} variant serves head dim {}", s.d),
        })?;
    let kernel = Kernel::get(ordinal, &key)?;
    let size = q.dtype().size();
    let rows = GpuRows::of(OP, job, [strides(q)?, strides(k)?, strides(v)?])?;
    let out_len: usize = out_shape.iter().product();
    let (count, split_len) = split.unwrap_or((1, s.lk));
    let too_large = || Error::ShapeMismatch {
        op: OP,
        detail: format!("{count} key chunks of this call's output exceed the address space"),
    };
    let out_bytes = (out_len.checked_mul(count))
        .and_then(|n| n.checked_mul(size))
        .ok_or_else(too_large)?;
    let lse_bytes = (rows.lse_len.checked_mul(count))
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(too_large)?;
    let out = CudaBuffer::zeroed(ordinal, out_bytes)?;
    let lse = CudaBuffer::zeroed(ordinal, lse_bytes)?;
    let flash = matches!(backend, SdpBackend::Flash);
    // The sequence table of the memory-efficient kernels (one unread word for a dense
    // call; flash takes dense calls only and no table).
    let seq = (!flash)
        .then(|| {
            let seq_bytes: Vec<u8> = rows.seq.iter().flat_map(|w| w.to_le_bytes()).collect();
            CudaBuffer::upload(ordinal, &seq_bytes)
        })
        .transpose()?;
    if s.lq > 0 && s.b * s.h > 0 {
        let views = [q, k, v].map(|t| {
            t.cuda_buffer()
                .expect("a CUDA tensor has a buffer")
                .view(t.offset() * size)
        });
        let (out_view, lse_view) = (out.view(0), lse.view(0));
        let ints = [s.h, s.hk, s.lq, s.lk, s.d]
            .map(|x| int_arg(OP, x))
            .into_iter()
            .collect::<Result<Vec<i32>>>()?;
        let scale = scale as f32;
        let [band, lo, hi, lower_right] = band_args(OP, job)?;
        let mut all_strides: Vec<i64> = [rows.q, rows.k, rows.v, rows.o]
            .into_iter()
            .flatten()
            .map(long_arg)
            .collect();
        let tile = kernel.entry.cuda.as_ref().expect("a CUDA variant").tile;
        let grid = (
            grid_dim(OP, s.lq.div_ceil(tile[0] as usize))?,
            grid_dim(OP, s.b * s.h)?,
            grid_dim(OP, count)?,
        );
        if !flash {
            let mask_strides = o
                .attn_mask
                .map_or([0; 4], |m| broadcast_strides(m.shape(), m.strides()));
            all_strides.extend(mask_strides.map(long_arg));
        }
        // Without a mask the kernel never reads it: any valid pointer serves.
        let mask_view = o.attn_mask.map_or(out.view(0), |m| {
            m.cuda_buffer()
                .expect("a CUDA mask has a buffer")
                .view(m.offset() * m.dtype().size())
        });
        let seq_view = seq.as_ref().map(|seq| seq.view(0));
        // Flash's split-KV words: keys per chunk, then the chunks' output and lse strides.
        let split_len = int_arg(OP, split_len)?;
        let chunk_strides = [out_len, rows.lse_len].map(long_arg);
        let mut args = kernel.args();
        args.ptr(&views[0]).ptr(&views[1]).ptr(&views[2]);
        if flash {
            args.ptr(&out_view).ptr(&lse_view);
            for x in &ints {
                args.int(x);
            }
            args.float(&scale)
                .int(&lo)
                .int(&hi)
                .int(&lower_right)
                .int(&split_len);
        } else {
            args.ptr(&mask_view).ptr(&out_view).ptr(&lse_view);
            for x in &ints {
                args.int(x);
            }
            args.float(&scale)
                .int(&band)
                .int(&lo)
                .int(&hi)
                .int(&lower_right);
        }
        for x in &all_strides {
            args.long(x);
        }
        if flash {
            args.long(&chunk_strides[0]).long(&chunk_strides[1]);
        }
        let sequence_words = rows
            .sequence_words()
            .map(|x| int_arg(OP, x))
            .into_iter()
            .collect::<Result<Vec<i32>>>()?;
        let lse_strides = rows.lse.map(long_arg);
        if let Some(seq_view) = &seq_view {
            args.ptr(seq_view);
            for x in &sequence_words {
                args.int(x);
            }
            for x in &lse_strides {
                args.long(x);
            }
        }
        let key = job.dropout.map_or(0, Draw::key);
        args.double(&o.dropout_p).ulong(&key);
        // SAFETY: the arguments follow the kernel's parameter list (flash_fwd.cu or
        // mem_eff_fwd.cu); q, k, v and the mask are the tensors' own views and hold every
        // element their strides reach; o and lse were allocated above for B x H x Lq rows
        // (times the chunks of a split call, each at its chunk stride).
        unsafe { kernel.launch(args, grid) }?;
    }
    let (out_shape, lse_shape) = match split {
        None => (out_shape.to_vec(), job.lse_shape()),
        Some(_) => (vec![count, out_len], vec![count, rows.lse_len]),
    };
    Ok(output(
        ordinal,
        backend,
        q.dtype(),
        &out_shape,
        &lse_shape,
        out,
        lse,
    ))
}

/// A fused backend's result on device `ordinal`: `out` (`out_shape` of `dtype`) and the
/// f32 log-sum-exp `lse` (`lse_shape`).
pub(super) fn output(
    ordinal: usize,
    backend: SdpBackend,
    dtype: DType,
    out_shape: &[usize],
    lse_shape: &[usize],
    out: CudaBuffer,
    lse: CudaBuffer,
) -> SdpaOutput {
    let device = Device::Cuda(ordinal);
    SdpaOutput {
        output: Tensor::from_storage(Storage::Device(Box::new(out)), dtype, device, out_shape),
        lse: Some(Tensor::from_storage(
            Storage::Device(Box::new(lse)),
            DType::F32,
            device,
            lse_shape,
        )),
        backend,
    }
}

/// The element type a CUDA kernel computes in, for the trace.
pub(super) fn note(backend: SdpBackend, dtype: DType) -> String {
    match (backend, dtype.elem()) {
        (SdpBackend::Flash, Some(Elem::F16 | Elem::Bf16)) => {
            format!("{dtype} tensor cores (mma.sync), f32 softmax")
        }
        _ => "f32 SIMT, online softmax".into(),
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use crate::runtime::cuda::memory::{CudaBuffer, View, lent_tensor};
    use crate::{DType, Device, Error, SdpaOptions};

    /// Attention of `[L, D]` rows in float64: softmax(q kᵀ / √D) v.
    fn attention(q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let scale = 1.0 / (q[0].len() as f64).sqrt();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        q.iter()
            .map(|qi| {
                let scores: Vec<f64> = k.iter().map(|kj| dot(qi, kj) * scale).collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                (0..v[0].len())
                    .map(|c| weights.iter().zip(v).map(|(w, vj)| w * vj[c]).sum::<f64>() / total)
                    .collect()
            })
            .collect()
    }

    /// Device memory lent as tensors (the way candle's CUDA tensors come in) is read in
    /// place through their layouts: q, k and v as strided views of one packed `[L, 3, H, D]`
    /// buffer, on the PTX interpreter (in a child process where `cuda:0` is the interpreter).
    #[test]
    fn lent_memory_is_read_in_place_through_its_layout() {
        let name = "ops::sdpa::cuda::tests::lent_memory_is_read_in_place_through_its_layout";
        if !crate::runtime::cuda::in_interpreter_child(name) {
            return;
        }
        if crate::kernels::cuda_code() == crate::kernels::CudaCode::None {
            eprintln!("skipped: no CUDA kernels in this build");
            return;
        }
        let (l, h, d) = (7, 2, 16);
        let mut state = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        let packed: Vec<f32> = (0..l * 3 * h * d)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        let owner = CudaBuffer::upload(0, bytemuck::cast_slice(&packed)).unwrap();
        let View::Interpreted(address) = owner.view(0) else {
            panic!("cuda:0 is the interpreter here")
        };
        let lent = (address, packed.len());
        let (shape, strides) = ([1, h, l, d], [l * 3 * h * d, d, 3 * h * d, 1]);
        // SAFETY: `owner` holds the bytes for the whole test and nothing writes them.
        let view = |which: usize| unsafe {
            lent_tensor(0, DType::F32, lent, &shape, &strides, which * h * d).unwrap()
        };
        let (q, k, v) = (view(0), view(1), view(2));
        let out = crate::sdpa(&q, &k, &v, &SdpaOptions::default())
            .unwrap()
            .output;
        assert_eq!(out.device(), Device::Cuda(0));
        let out = out.to_vec::<f32>().unwrap();
        let rows = |which: usize, head: usize| -> Vec<Vec<f64>> {
            (0..l)
                .map(|t| {
                    let at = t * 3 * h * d + which * h * d + head * d;
                    packed[at..at + d].iter().map(|&x| f64::from(x)).collect()
                })
                .collect()
        };
        let (mut err, mut norm) = (0.0, 0.0);
        for head in 0..h {
            let want = attention(&rows(0, head), &rows(1, head), &rows(2, head));
            for (t, row) in want.iter().enumerate() {
                for (c, &w) in row.iter().enumerate() {
                    let got = f64::from(out[(head * l + t) * d + c]);
                    err += (got - w) * (got - w);
                    norm += w * w;
                }
            }
        }
        assert!(
            (err / norm).sqrt() < 1e-5,
            "relative error {}",
            (err / norm).sqrt()
        );
        // A layout reaching past the lent elements is a typed error.
        // SAFETY: as above; the call fails before anything reads the memory.
        let past = unsafe { lent_tensor(0, DType::F32, lent, &shape, &strides, 3 * h * d) };
        assert!(matches!(past, Err(Error::ShapeMismatch { .. })), "{past:?}");
        // The lent tensors are gone; the owner's bytes are as they were.
        drop((q, k, v));
        assert_eq!(
            owner.download().unwrap(),
            bytemuck::cast_slice::<f32, u8>(&packed)
        );
    }
}
