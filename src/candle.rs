//! With the `candle` feature: this library's attention and matmul as
//! [candle](https://github.com/huggingface/candle) custom ops, and conversions between the
//! two tensor types.
//!
//! [`sdpa`] and [`matmul`] run on candle's CPU tensors in place: the ops borrow candle's
//! storage with its layout (any strides and offset, as [`crate::BorrowScope`] does), so a
//! `[B, L, H, D]` tensor transposed to `[B, H, L, D]` or a narrowed KV cache is read without
//! a copy, and the result's buffer moves into candle's storage. The backend selection, the
//! flags (`backends::cpu`, matmul precision, ...) and `#[sdpa_kernel]` scopes apply as
//! for this library's own tensors.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! let q = Tensor::randn(0f32, 1.0, (1, 2, 16, 8, 64), &Device::Cpu)?; // [B, 2, L, H, D]
//! let (k, v) = (q.clone(), q.clone());
//! // [B, L, H, D] -> [B, H, L, D] as strides only; no copy on either side.
//! let view = |t: &Tensor| t.narrow(1, 0, 1)?.squeeze(1)?.transpose(1, 2);
//! let attention = backends::candle::Attention { is_causal: true, ..Default::default() };
//! let out = backends::candle::sdpa(&view(&q)?, &view(&k)?, &view(&v)?, &attention)?;
//! assert_eq!(out.dims(), [1, 8, 16, 64]);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! With `candle-cuda` the ops serve candle's CUDA tensors too (`cuda.rs`): the inputs are
//! read in place from candle's device memory, the result is one device copy into memory of
//! candle's. Building it needs nvcc for candle's own kernels (`scripts/nvcc.sh`), and the
//! program then links the CUDA driver and libraries (candle's choice). Without it an op on
//! a CUDA tensor is candle's "no cuda implementation" error.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape};

#[cfg(feature = "candle-cuda")]
mod cuda;

use crate::{BorrowScope, CausalVariant, DType, Error, SdpaOptions, Tensor, Window};

/// What [`sdpa`] takes beyond q, k and v, with PyTorch's names (see [`SdpaOptions`]).
#[derive(Clone, Debug, Default)]
pub struct Attention {
    /// An additive float mask broadcastable to `[B, H, Lq, Lk]`, a candle CPU tensor.
    pub attn_mask: Option<candle_core::Tensor>,
    /// Causal masking, aligned as `causal_variant` says.
    pub is_causal: bool,
    /// Which diagonal the causal mask and the window follow.
    pub causal_variant: CausalVariant,
    /// A sliding window of keys around that diagonal.
    pub window: Window,
    /// Score scale; `None` is `1 / sqrt(D)`.
    pub scale: Option<f64>,
    /// Grouped-query attention (fewer key/value heads than query heads).
    pub enable_gqa: bool,
}

/// `scaled_dot_product_attention(q, k, v, ...)` on candle tensors (`[B, H, L, D]` or 3-D),
/// through this library's selection and kernels; the inputs are read in place.
pub fn sdpa(
    query: &candle_core::Tensor,
    key: &candle_core::Tensor,
    value: &candle_core::Tensor,
    attention: &Attention,
) -> candle_core::Result<candle_core::Tensor> {
    query.apply_op3_no_bwd(key, value, &SdpaOp(attention))
}

/// `torch.matmul(a, b)` on candle tensors (1-D operands, broadcast batch dimensions), through
/// this library's GEMM; the operands are read in place (a transposed weight included).
pub fn matmul(
    a: &candle_core::Tensor,
    b: &candle_core::Tensor,
) -> candle_core::Result<candle_core::Tensor> {
    a.apply_op2_no_bwd(b, &MatmulOp)
}

/// A tensor of this library over a candle CPU tensor's storage, read in place for the
/// length of `scope`: take `storage` and `layout` from candle's `storage_and_layout()`, and
/// keep its guard alive around the scope. (candle's CUDA tensors are read in place inside
/// [`sdpa`] and [`matmul`] only, with `candle-cuda`.)
pub fn borrow<'env>(
    scope: &BorrowScope<'env>,
    storage: &'env candle_core::Storage,
    layout: &Layout,
) -> crate::Result<Tensor> {
    match storage {
        candle_core::Storage::Cpu(cpu) => borrow_cpu(scope, cpu, layout),
        _ => Err(Error::Unavailable {
            what: "a candle tensor off the CPU",
            why: "only candle's CPU tensors are lent this way (candle's CUDA tensors go to \
                  `sdpa` and `matmul` themselves); move it with `to_device`"
                .into(),
        }),
    }
}

/// A candle CPU tensor holding `t`'s elements: the buffer moves into candle where `t` is the
/// only handle to it (as [`Tensor::into_vec`]), else one copy.
pub fn to_candle(t: Tensor) -> candle_core::Result<candle_core::Tensor> {
    let shape = Shape::from_dims(t.shape());
    let storage = into_storage(t).map_err(candle_core::Error::wrap)?;
    Ok(candle_core::Tensor::from_storage(
        candle_core::Storage::Cpu(storage),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

fn borrow_cpu<'env>(
    scope: &BorrowScope<'env>,
    storage: &'env CpuStorage,
    layout: &Layout,
) -> crate::Result<Tensor> {
    let (dims, strides, offset) = (layout.dims(), layout.stride(), layout.start_offset());
    match storage {
        CpuStorage::F32(v) => scope.borrow_strided(v, dims, strides, offset),
        CpuStorage::F64(v) => scope.borrow_strided(v, dims, strides, offset),
        CpuStorage::F16(v) => scope.borrow_strided(v, dims, strides, offset),
        CpuStorage::BF16(v) => scope.borrow_strided(v, dims, strides, offset),
        CpuStorage::I32(v) => scope.borrow_strided(v, dims, strides, offset),
        other => Err(Error::Unavailable {
            what: "this candle dtype",
            why: format!(
                "{:?} has no counterpart here; convert it to f32, f64, f16 or bf16 first",
                other.dtype()
            ),
        }),
    }
}

/// `t`'s elements as candle CPU storage (moved where `t` holds them alone).
fn into_storage(t: Tensor) -> crate::Result<CpuStorage> {
    Ok(match t.dtype() {
        DType::F32 => CpuStorage::F32(t.into_vec()?),
        DType::F64 => CpuStorage::F64(t.into_vec()?),
        DType::F16 => CpuStorage::F16(t.into_vec()?),
        DType::Bf16 => CpuStorage::BF16(t.into_vec()?),
        DType::I32 => CpuStorage::I32(t.into_vec()?),
        DType::Bool => CpuStorage::U8(t.to_bools()?.into_iter().map(u8::from).collect()),
    })
}

/// The op's result as candle storage and shape.
fn output(t: Tensor) -> candle_core::Result<(CpuStorage, Shape)> {
    let shape = Shape::from_dims(t.shape());
    Ok((into_storage(t).map_err(candle_core::Error::wrap)?, shape))
}

struct SdpaOp<'a>(&'a Attention);

impl SdpaOp<'_> {
    /// The options of the op, with its mask lent as `mask`.
    fn options<'m>(&self, mask: Option<&'m Tensor>) -> SdpaOptions<'m> {
        let attention = self.0;
        SdpaOptions {
            attn_mask: mask,
            is_causal: attention.is_causal,
            causal_variant: attention.causal_variant,
            window: attention.window,
            scale: attention.scale,
            enable_gqa: attention.enable_gqa,
            ..Default::default()
        }
    }
}

impl CustomOp3 for SdpaOp<'_> {
    fn name(&self) -> &'static str {
        "backends.sdpa"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_layout: &Layout,
        k: &CpuStorage,
        k_layout: &Layout,
        v: &CpuStorage,
        v_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let mask = self.0.attn_mask.as_ref().map(|m| m.storage_and_layout());
        let result = crate::borrow_scope(|scope| {
            let mask = match &mask {
                Some((storage, layout)) => Some(borrow(scope, storage, layout)?),
                None => None,
            };
            let options = self.options(mask.as_ref());
            let (q, k, v) = (
                borrow_cpu(scope, q, q_layout)?,
                borrow_cpu(scope, k, k_layout)?,
                borrow_cpu(scope, v, v_layout)?,
            );
            crate::sdpa(&q, &k, &v, &options).map(|out| out.output)
        });
        output(result.map_err(candle_core::Error::wrap)?)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_layout: &Layout,
        k: &candle_core::CudaStorage,
        k_layout: &Layout,
        v: &candle_core::CudaStorage,
        v_layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let mask = self.0.attn_mask.as_ref().map(|m| m.storage_and_layout());
        cuda::run(&q.device, |lender| {
            let mask = match &mask {
                Some((storage, layout)) => Some(lender.lend_any(storage, layout)?),
                None => None,
            };
            let options = self.options(mask.as_ref());
            let (q, k, v) = (
                lender.lend(q, q_layout)?,
                lender.lend(k, k_layout)?,
                lender.lend(v, v_layout)?,
            );
            crate::sdpa(&q, &k, &v, &options).map(|out| out.output)
        })
    }
}

struct MatmulOp;

impl CustomOp2 for MatmulOp {
    fn name(&self) -> &'static str {
        "backends.matmul"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let result = crate::borrow_scope(|scope| {
            crate::matmul(
                &borrow_cpu(scope, a, a_layout)?,
                &borrow_cpu(scope, b, b_layout)?,
            )
        });
        output(result.map_err(candle_core::Error::wrap)?)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        a: &candle_core::CudaStorage,
        a_layout: &Layout,
        b: &candle_core::CudaStorage,
        b_layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        cuda::run(&a.device, |lender| {
            crate::matmul(&lender.lend(a, a_layout)?, &lender.lend(b, b_layout)?)
        })
    }
}
