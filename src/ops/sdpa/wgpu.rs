//! Flash and memory-efficient attention on wgpu through the generated WGSL kernels.

use super::{GpuRows, Job, SdpaOutput, band_args, broadcast_strides};
use crate::core::sdp::SdpBackend;
use crate::core::tensor::{Storage, Tensor};
use crate::kernels::{Elem, KernelEntry, MaskKind, rules};
use crate::runtime::wgpu::u32_arg;
use crate::{DType, Device, Error, Result};

const OP: &str = "scaled_dot_product_attention on wgpu";

/// Whether the WGSL kernels read `t` as it is: no offset into its buffer, the last
/// dimension contiguous (they take the other strides).
fn readable(t: &Tensor) -> bool {
    t.offset() == 0 && t.strides().last().is_none_or(|&s| s == 1)
}

/// How many of q, k, v and the mask [`wgpu_fused`] copies first (views the kernels cannot
/// read), for the trace.
pub(super) fn copies(job: &Job) -> usize {
    [
        Some(job.query),
        Some(job.key),
        Some(job.value),
        job.options.attn_mask,
    ]
    .into_iter()
    .flatten()
    .filter(|t| !readable(t))
    .count()
}

/// Flash or memory-efficient attention on wgpu through the generated WGSL; q, k, v or a mask
/// that the kernels cannot read (an offset, a strided last dimension) is copied first.
pub(super) fn wgpu_fused(
    index: usize,
    backend: SdpBackend,
    pinned: Option<&'static KernelEntry>,
    job: &Job,
) -> Result<SdpaOutput> {
    let ready = |t: &Tensor| -> Result<Option<Tensor>> {
        (!readable(t)).then(|| t.to_device(t.device())).transpose()
    };
    let (q, k, v) = (ready(job.query)?, ready(job.key)?, ready(job.value)?);
    let mask = job.options.attn_mask.map(ready).transpose()?.flatten();
    let options = super::SdpaOptions {
        attn_mask: mask.as_ref().or(job.options.attn_mask),
        ..*job.options
    };
    let job = &Job {
        query: q.as_ref().unwrap_or(job.query),
        key: k.as_ref().unwrap_or(job.key),
        value: v.as_ref().unwrap_or(job.value),
        options: &options,
        ..job.clone()
    };
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
    let gpu = crate::runtime::wgpu::gpu(index)?;
    let elem = if q.dtype() == DType::F16 {
        Elem::F16
    } else {
        Elem::F32
    };
    let width = s.d.max(s.dv);
    let mask = match o.attn_mask.map(Tensor::dtype) {
        None => MaskKind::None,
        Some(DType::Bool) => MaskKind::Bool,
        Some(_) => MaskKind::Additive,
    };
    let entry = pinned
        .filter(|e| e.wgsl.is_some())
        .or_else(|| {
            rules::kernel_key(backend.into(), elem, width, job.banded(), mask)
                .and_then(|k| crate::kernels::lookup(&k))
        })
        .ok_or_else(|| Error::Unavailable {
            what: "an attention kernel",
            why: format!("no {backend} variant serves head dim {width}"),
        })?;
    let kernel = entry
        .wgsl
        .as_ref()
        .expect("wgpu attention variants have WGSL");
    let u32_of = |x: usize| u32_arg(OP, x);
    let strides = |t: &Tensor| -> [usize; 3] {
        let st = t.strides();
        let r = st.len();
        [if r == 4 { st[0] } else { 0 }, st[r - 3], st[r - 2]]
    };
    let mask_strides = o
        .attn_mask
        .map_or([0; 4], |m| broadcast_strides(m.shape(), m.strides()));
    let [band, lo, hi, lower_right] = band_args("scaled_dot_product_attention on wgpu", job)?;
    let rows = GpuRows::of(OP, job, [strides(q), strides(k), strides(v)])?;
    let mut words = vec![s.h, s.hk, s.lq, s.lk, s.d]
        .into_iter()
        .map(u32_of)
        .collect::<Result<Vec<u32>>>()?;
    words.push(band.cast_unsigned());
    words.push((scale as f32).to_bits());
    words.extend([lo, hi, lower_right].map(i32::cast_unsigned));
    for x in [rows.q, rows.k, rows.v, rows.o].into_iter().flatten() {
        words.push(u32_of(x)?);
    }
    for x in mask_strides
        .into_iter()
        .chain(rows.sequence_words())
        .chain(rows.lse)
    {
        words.push(u32_of(x)?);
    }
    let out_len = out_shape.iter().product::<usize>() * q.dtype().size();
    let out = crate::runtime::wgpu::WgpuBuffer::output(gpu, out_len)?;
    let lse = crate::runtime::wgpu::WgpuBuffer::output(gpu, rows.lse_len * 4)?;
    let seq_bytes: Vec<u8> = rows.seq.iter().flat_map(|w| w.to_le_bytes()).collect();
    let seq = crate::runtime::wgpu::WgpuBuffer::upload(index, DType::F32, &seq_bytes)?;
    let dummy;
    let mask_buffer = match o.attn_mask {
        Some(m) => m.wgpu_buffer().expect("a wgpu mask has a buffer").raw(),
        None => {
            dummy = crate::runtime::wgpu::WgpuBuffer::zeroed(gpu, 4)?;
            dummy.raw()
        }
    };
    let buffers = [q, k, v].map(|t| t.wgpu_buffer().expect("wgpu tensors have buffers").raw());
    let groups = [
        u32_of(s.lq.div_ceil(kernel.tile[0] as usize))?,
        u32_of(s.b * s.h)?,
        1,
    ];
    if s.lq > 0 && s.b * s.h > 0 {
        gpu.run(
            entry.name,
            kernel,
            &[
                buffers[0],
                buffers[1],
                buffers[2],
                mask_buffer,
                out.raw(),
                lse.raw(),
                seq.raw(),
            ],
            &words,
            groups,
        )?;
    }
    let output = Tensor::from_storage(
        Storage::Device(Box::new(out)),
        q.dtype(),
        Device::Wgpu(index),
        out_shape,
    );
    let lse = Tensor::from_storage(
        Storage::Device(Box::new(lse)),
        DType::F32,
        Device::Wgpu(index),
        &job.lse_shape(),
    );
    Ok(SdpaOutput {
        output,
        lse: Some(lse),
        backend,
    })
}
