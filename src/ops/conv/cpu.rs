//! The CPU convolution: each group of each image becomes one GEMM of the weight `[O/g, C/g ·
//! kH · kW]` with the unfolded input `[C/g · kH · kW, H' · W']` (im2col), run by `matmul`;
//! convolutions of one group read those rows in place from padded phase planes of the
//! input instead (pointwise ones from the input itself: [`implicit`]), depthwise ones run
//! directly.

use half::{bf16, f16};

use super::{Geometry, Lowering};
use crate::core::tensor::{Element, host_zeros};
use crate::core::trace::{self, Call};
use crate::kernels::gemm::{self, MatView, Rounding};
use crate::{DType, Device, Result, Tensor, matmul};

/// Elements of unfolded input made at once: images are unfolded in chunks of about this
/// many (at least one image), which bounds the extra memory to a few tens of MB.
const UNFOLD_CHUNK: usize = 1 << 21;

/// Runs the CPU `lowering` [`super::plan`] chose (NNPACK's runs in [`super::nnpack`]).
pub(crate) fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    lowering: Lowering,
) -> Result<Tensor> {
    let run = match input.dtype() {
        DType::F32 => run::<f32>,
        DType::F64 => run::<f64>,
        DType::F16 => run::<f16>,
        DType::Bf16 => run::<bf16>,
        DType::Bool | DType::I32 => unreachable!("conv2d refuses non-floats"),
    };
    run(input, weight, bias, g, lowering)
}

fn run<T: Element>(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    lowering: Lowering,
) -> Result<Tensor> {
    let (n, o, p) = (g.batch, g.out_channels, g.pixels());
    let out_shape = [n, o, g.output[0], g.output[1]];
    if let Lowering::ImplicitGemm
    | Lowering::Gemm {
        rows_in_place: true,
    } = lowering
    {
        let out = implicit::<T>(input, weight, bias, g)?;
        return Tensor::from_vec(out, &out_shape, Device::Cpu);
    }
    let kg = g.patch_len();
    // [groups, O/g, C/g · kH · kW]: the weight's rows are already in the patch order.
    let w = weight
        .contiguous()?
        .view(&[g.groups, g.group_out_channels(), kg])?;
    let mut out = if lowering == Lowering::DirectDepthwise {
        match T::DTYPE {
            DType::F64 => depthwise::<T, f64>(input, weight, g, T::to_f64, T::from_f64)?,
            _ => depthwise::<T, f32>(input, weight, g, T::to_f32, T::from_f32)?,
        }
    } else if let Lowering::Gemm { .. } = lowering {
        // The input [N, C, H·W] is the right side as it stands (no unfolding).
        let x = input.contiguous()?.view(&[n, g.channels, p])?;
        matmul(&w.view(&[o, kg])?, &x)?.into_vec::<T>()?
    } else {
        let x = input.elements::<T>()?;
        let per_image = g.groups * kg * p;
        let chunk = (UNFOLD_CHUNK / per_image.max(1)).clamp(1, n.max(1));
        let image_len = g.channels * g.input[0] * g.input[1];
        // One chunk's product is the output as it stands; several are copied into place.
        let mut out = if chunk < n {
            host_zeros::<T>("conv2d", n * o * p)?
        } else {
            Vec::new()
        };
        for first in (0..n).step_by(chunk) {
            let count = chunk.min(n - first);
            let mut cols = host_zeros::<T>("conv2d", count * per_image)?;
            unfold(&x[first * image_len..][..count * image_len], g, &mut cols);
            let cols = Tensor::from_vec(cols, &[count * g.groups, kg, p], Device::Cpu)?;
            let product = if g.groups == 1 {
                matmul(&w.view(&[o, kg])?, &cols)?
            } else {
                // One batched product per image: [g, O/g, K] x [g, K, P] = [g, O/g, P].
                let mut images = Vec::with_capacity(count);
                for i in 0..count {
                    let image = cols.narrow(0, i * g.groups, g.groups)?;
                    images.push(matmul(&w, &image)?.to_vec::<T>()?);
                }
                Tensor::from_vec(images.concat(), &[count, o, p], Device::Cpu)?
            };
            if chunk < n {
                out[first * o * p..][..count * o * p].copy_from_slice(&product.elements::<T>()?);
            } else {
                out = product.into_vec::<T>()?;
            }
        }
        out
    };
    if let Some(bias) = bias {
        add_bias(&mut out, &bias.to_vec::<T>()?, p);
    }
    Tensor::from_vec(out, &out_shape, Device::Cpu)
}

/// A convolution of one group ([`Geometry::reads_shifted_rows`]) as one GEMM per band of
/// output rows that reads the input in place. The band's part of the image is copied, with
/// its zero padding, as phase planes: per channel, one per pair of stride phases its taps
/// fall on ([`Geometry::phases`]; plane `(p, q)` holds the padded input's rows `p, p + s0,
/// ...` and columns `q, q + s1, ...`: the band's rows and the halo its taps read below them,
/// `W_q = W' +` [`Geometry::extra_columns`] columns), so that tap `(ki, kj)` of channel `c`
/// reads one plane at a fixed shift: B's row `(c, ki, kj)` is that plane from row
/// `ki·dH / s0`, column `kj·dW / s1` on, and its column `y·W_q + x` is the band's output
/// pixel `(y, x)`. (A pointwise convolution's only plane per channel would be the channel
/// itself: its rows are read from the input, with no copy.)
/// The columns `x ≥ W'` (a few per output row) are computed and dropped when the result is
/// stored with the bias, rounded to `T` once.
///
/// While a full round of images (one per thread) is left, each image is one band; each
/// image left over is cut into one band per thread. A band runs on one thread from its
/// planes to its store, so no thread waits on another inside a call, and each reads back
/// the product it wrote from its own caches (a 7x7/2 stem of one image split its planes,
/// GEMM and store over 2 threads each, and ran no faster than on one).
fn implicit<T: Element>(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
) -> Result<Vec<T>> {
    let x = input.elements::<T>()?;
    let weight = weight.contiguous()?;
    let w = weight.elements::<T>()?;
    let (o, k, [oh, ow]) = (g.out_channels, g.patch_len(), g.output);
    let image_len = g.channels * g.input[0] * g.input[1];
    let mut out = host_zeros::<T>("conv2d", g.batch * o * g.pixels())?;
    if out.is_empty() {
        return Ok(out);
    }
    let bias: Vec<f32> = match bias {
        Some(bias) => bias.to_vec::<T>()?.into_iter().map(T::to_f32).collect(),
        None => vec![0.0; o],
    };
    let (rounding, note) = crate::ops::matmul::cpu_rounding(T::DTYPE);
    let micro = gemm::packed_micro::<T>(rounding).name;
    let describe = || Call {
        kernel: format!("gemm_{}_{micro}", T::DTYPE),
        backend: format!("cpu/{micro}"),
        dtype: T::DTYPE,
        shapes: format!(
            "{:?}x{:?}",
            [o, k],
            [g.batch, k, oh * (ow + g.extra_columns())]
        ),
        precision: note.clone(),
    };
    let threads = crate::get_num_threads();
    let out_len = o * g.pixels();
    let whole = g.batch / threads * threads;
    let (whole_out, rest_out) = out.split_at_mut(whole * out_len);
    let run = |band_rows: usize, out: &mut [T], first: usize| {
        let images = Images::new(g, &w, &bias, band_rows);
        crate::runtime::threads::try_for_each(
            bands(out, first, [o, oh, ow], band_rows),
            &|band: Band<'_, T>| {
                let mut room = Room::take(&images)?;
                images.run(
                    &x[band.image * image_len..][..image_len],
                    band,
                    &mut room,
                    rounding,
                );
                room.keep();
                Ok(())
            },
        )
    };
    trace::kernel(describe, || {
        if whole > 0 {
            run(oh, whole_out, 0)?;
        }
        if !rest_out.is_empty() {
            run(oh.div_ceil(threads.min(oh)), rest_out, whole)?;
        }
        Ok(())
    })?;
    Ok(out)
}

/// Output rows `row0..row0 + rows` of one image of an implicit convolution: each output
/// channel's part of them (`rows · W'` values) in `out`.
struct Band<'a, T> {
    image: usize,
    row0: usize,
    rows: usize,
    out: Vec<&'a mut [T]>,
}

/// `out` (`[count, O, H', W']`, images `first..`) cut into bands of `band_rows` output rows
/// (the last of an image may have fewer), image by image.
fn bands<T>(
    out: &mut [T],
    first: usize,
    [o, oh, ow]: [usize; 3],
    band_rows: usize,
) -> Vec<Band<'_, T>> {
    let mut all = Vec::new();
    for (i, image) in out.chunks_exact_mut(o * oh * ow).enumerate() {
        let start = all.len();
        for row0 in (0..oh).step_by(band_rows) {
            all.push(Band {
                image: first + i,
                row0,
                rows: band_rows.min(oh - row0),
                out: Vec::with_capacity(o),
            });
        }
        for mut channel in image.chunks_exact_mut(oh * ow) {
            for band in &mut all[start..] {
                let (part, rest) = std::mem::take(&mut channel).split_at_mut(band.rows * ow);
                band.out.push(part);
                channel = rest;
            }
        }
    }
    all
}

/// What every band of an implicit convolution shares: the weight (A), B's row starts in a
/// band's planes, the bias and the planes' layout.
struct Images<'a, T> {
    g: &'a Geometry,
    weight: &'a [T],
    bias: &'a [f32],
    /// B's row starts (one per row of the patch) in the planes, or in the image itself.
    starts: Vec<usize>,
    row_phases: Vec<usize>,
    col_phases: Vec<usize>,
    /// Planes per band (none where B's rows are the image itself), elements of one (`(band
    /// rows + halo) · W_q`) and of all with their slack.
    planes: usize,
    plane: usize,
    planes_len: usize,
    /// Plane rows past a band's own that its taps read: `(kH - 1) · dH / s0`.
    halo: usize,
    /// The planes' row length, `W_q`.
    wq: usize,
    /// Output rows of a band, at most.
    band_rows: usize,
}

impl<'a, T: Element> Images<'a, T> {
    fn new(g: &'a Geometry, weight: &'a [T], bias: &'a [f32], band_rows: usize) -> Self {
        let [kh, kw] = g.kernel;
        let ([dh, dw], [sh, sw]) = (g.dilation, g.stride);
        // (`reads_shifted_rows` saw the planes' size fit; a band's are no larger.)
        let [hq, wq] = g.phase_plane().expect("checked by reads_shifted_rows");
        let halo = hq - g.output[0];
        let (row_phases, col_phases) = (g.phases(0), g.phases(1));
        let index = |phases: &[usize], phase: usize| {
            phases
                .binary_search(&phase)
                .expect("`phases` lists every tap's phase")
        };
        let per_channel = row_phases.len() * col_phases.len();
        // A pointwise convolution's planes would be the image itself: B's rows are read there.
        let (planes, plane_rows) = match g.is_pointwise() {
            true => (0, hq),
            false => (g.channels * per_channel, band_rows + halo),
        };
        let starts = (0..g.patch_len())
            .map(|row| {
                let (channel, ki, kj) = (row / (kh * kw), row / kw % kh, row % kw);
                let (p, q) = (
                    index(&row_phases, ki * dh % sh),
                    index(&col_phases, kj * dw % sw),
                );
                let plane_index = channel * per_channel + p * col_phases.len() + q;
                plane_index * plane_rows * wq + ki * dh / sh * wq + kj * dw / sw
            })
            .collect();
        let plane = plane_rows * wq;
        Images {
            g,
            weight,
            bias,
            starts,
            row_phases,
            col_phases,
            planes,
            plane,
            planes_len: planes * plane + g.extra_columns(),
            halo,
            wq,
            band_rows,
        }
    }

    /// One band of an image (`source`, `[C, H, W]`): its planes, the GEMM into `room`'s
    /// product, the product stored with the bias into the band's output rows.
    fn run(&self, source: &[T], band: Band<'_, T>, room: &mut Room, rounding: Rounding) {
        let g = self.g;
        let ([h, wd], ow) = (g.input, g.output[1]);
        let ([top, left], [sh, sw]) = (g.pad_before, g.stride);
        let wq = self.wq;
        let (row_phases, col_phases) = (&self.row_phases, &self.col_phases);
        let per_channel = row_phases.len() * col_phases.len();
        let padded = &mut bytemuck::cast_slice_mut::<f32, T>(&mut room.planes)[..self.planes_len];
        // Every value the GEMM keeps is written here, padding included: the buffer holds an
        // earlier band's planes.
        let zero = T::zeroed();
        for (index, plane) in padded[..self.planes * self.plane]
            .chunks_exact_mut(self.plane)
            .enumerate()
        {
            let (channel, phase) = (index / per_channel, index % per_channel);
            let (p, q) = (
                row_phases[phase / col_phases.len()],
                col_phases[phase % col_phases.len()],
            );
            let from = &source[channel * h * wd..][..h * wd];
            // Plane column x' reads input column x'·s1 + q - left, where that is inside.
            let shift = q as isize - left as isize;
            let inside = inside(shift, sw, wd, wq);
            let rows = plane.chunks_exact_mut(wq).take(band.rows + self.halo);
            for (y, row) in rows.enumerate() {
                let iy = ((band.row0 + y) * sh + p).checked_sub(top);
                match iy.filter(|&iy| iy < h && !inside.is_empty()) {
                    Some(iy) => {
                        row[..inside.start].fill(zero);
                        row[inside.end..].fill(zero);
                        gather(&from[iy * wd..][..wd], (shift, sw), inside.clone(), row);
                    }
                    None => row.fill(zero),
                }
            }
        }
        let (o, k, columns) = (g.out_channels, g.patch_len(), band.rows * wq);
        let product = &mut room.product[..o * columns];
        let a = MatView {
            data: self.weight,
            offset: 0,
            rs: k,
            cs: 1,
        };
        // A pointwise convolution's band reads its channels' rows from its first pixel on
        // (an image of no channels has none).
        let rows = match self.planes {
            0 => source.get(band.row0 * ow..).unwrap_or_default(),
            _ => &*padded,
        };
        gemm::gemm_rows(
            product,
            (o, columns, k),
            a,
            (rows, &self.starts),
            rounding,
            1,
        );
        for ((to, sums), &b) in band
            .out
            .into_iter()
            .zip(product.chunks_exact(columns))
            .zip(self.bias)
        {
            for (line, from) in to.chunks_exact_mut(ow).zip(sums.chunks_exact(wq)) {
                for (t, &f) in line.iter_mut().zip(from) {
                    *t = T::from_f32(f + b);
                }
            }
        }
    }
}

/// One thread's buffers for the bands it runs: the planes and the GEMM's product, each
/// taken from and given back to the thread's kept buffers.
struct Room {
    /// The planes, as 32-bit words.
    planes: Vec<f32>,
    product: Vec<f32>,
}

impl Room {
    fn take<T: Element>(images: &Images<'_, T>) -> Result<Room> {
        let mut planes = PLANES.take();
        let words = (images.planes_len * std::mem::size_of::<T>()).div_ceil(4);
        // Every value a result depends on is written before it is read (the planes by the
        // band, the product by the GEMM; only the dropped columns past each output row read
        // past a band's planes, into what an earlier one left): a kept buffer needs no
        // zeroing.
        if planes.len() < words {
            planes
                .try_reserve(words - planes.len())
                .map_err(|_| crate::Error::OutOfMemory {
                    device: Device::Cpu,
                    bytes: words as u64 * 4,
                    why: "conv2d: the padded input planes".into(),
                })?;
            planes.resize(words, 0.0);
        }
        let len = images.g.out_channels * images.band_rows * images.wq;
        let mut product = PRODUCT.take();
        if product.len() < len {
            product = host_zeros::<f32>("conv2d", len)?;
        }
        Ok(Room { planes, product })
    }

    /// Gives the buffers back to this thread's kept ones, where they are small enough.
    fn keep(self) {
        if self.product.len() <= KEPT_PRODUCT {
            PRODUCT.set(self.product);
        }
        if self.planes.len() <= KEPT_PRODUCT {
            PLANES.set(self.planes);
        }
    }
}

/// f32 values (or 32-bit words of planes) of an implicit convolution's product and padded
/// input planes a thread keeps for its next call, at most (16 MiB each): fresh pages for
/// the product cost a 7x7/2 stem's GEMM (3 MiB of products) as much as the GEMM itself on
/// an AMD EPYC VM, and fresh planes a third of a 3x3 64-channel convolution at 56x56.
const KEPT_PRODUCT: usize = 1 << 22;

thread_local! {
    /// The product buffer of this thread's last implicit convolution (see [`implicit`]).
    static PRODUCT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Its padded input planes, as 32-bit words.
    static PLANES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A convolution whose groups each read one input channel (depthwise, with any channel
/// multiplier), directly: each output plane accumulates its kernel's taps as shifted rows
/// of its input plane, in `A` (f64 for f64, else f32), planes spread over the pool.
fn depthwise<T: Element, A>(
    input: &Tensor,
    weight: &Tensor,
    g: &Geometry,
    widen: impl Fn(T) -> A + Sync,
    narrow: impl Fn(A) -> T + Sync,
) -> Result<Vec<T>>
where
    A: Copy + Default + Send + Sync + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
{
    let x = input.elements::<T>()?;
    let weights: Vec<A> = weight.to_vec::<T>()?.into_iter().map(&widen).collect();
    let (o, p) = (g.out_channels, g.pixels());
    let mut out = host_zeros::<T>("conv2d", g.batch * o * p)?;
    if p == 0 {
        return Ok(out);
    }
    let [h, w] = g.input;
    let [kh, kw] = g.kernel;
    let multiplier = g.group_out_channels();
    let chunks = per_thread(&mut out, p);
    crate::runtime::threads::for_each(chunks, &|(first, chunk): (usize, &mut [T])| {
        let mut source = vec![A::default(); h * w];
        let mut acc = vec![A::default(); p];
        for (i, plane_out) in chunk.chunks_exact_mut(p).enumerate() {
            let plane = first + i;
            let (image, channel) = (plane / o, plane % o);
            let input_plane = image * g.channels + channel / multiplier;
            for (s, &v) in source.iter_mut().zip(&x[input_plane * h * w..][..h * w]) {
                *s = widen(v);
            }
            let taps = &weights[channel * kh * kw..][..kh * kw];
            accumulate_plane(&source, taps, g, &mut acc);
            for (o, &a) in plane_out.iter_mut().zip(&acc) {
                *o = narrow(a);
            }
        }
    });
    Ok(out)
}

/// One depthwise output plane: `acc` (`H' x W'`) = the taps (`kH x kW`) over the input plane
/// `source` (`H x W`), row by row so that each output row stays in L1 while its taps add
/// shifted input rows to it; compiled for AVX-512 or AVX2 where the CPU level allows, so that
/// the rows run on the widest vectors.
fn accumulate_plane<A>(source: &[A], taps: &[A], g: &Geometry, acc: &mut [A])
where
    A: Copy + Default + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
{
    #[inline(always)]
    fn body<A>(source: &[A], taps: &[A], g: &Geometry, acc: &mut [A])
    where
        A: Copy + Default + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
    {
        let [h, w] = g.input;
        let [kh, kw] = g.kernel;
        let [oh, ow] = g.output;
        acc.fill(A::default());
        for (y, sums_row) in acc.chunks_exact_mut(ow).enumerate().take(oh) {
            for ki in 0..kh {
                let iy = (y * g.stride[0] + ki * g.dilation[0]).checked_sub(g.pad_before[0]);
                let Some(iy) = iy.filter(|&iy| iy < h) else {
                    continue; // (the tap row reads padding only)
                };
                for kj in 0..kw {
                    let tap = taps[ki * kw + kj];
                    let shift = (kj * g.dilation[1]) as isize - g.pad_before[1] as isize;
                    let columns = inside(shift, g.stride[1], w, ow);
                    if columns.is_empty() {
                        continue; // (the tap reads padding only)
                    }
                    let first = (columns.start * g.stride[1]).wrapping_add_signed(shift);
                    let line = &source[iy * w + first..(iy + 1) * w];
                    let sums = &mut sums_row[columns];
                    if g.stride[1] == 1 {
                        for (s, &v) in sums.iter_mut().zip(line) {
                            *s = *s + tap * v;
                        }
                    } else {
                        for (s, &v) in sums.iter_mut().zip(line.iter().step_by(g.stride[1])) {
                            *s = *s + tap * v;
                        }
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
        unsafe fn avx512<A>(source: &[A], taps: &[A], g: &Geometry, acc: &mut [A])
        where
            A: Copy + Default + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
        {
            body(source, taps, g, acc)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<A>(source: &[A], taps: &[A], g: &Geometry, acc: &mut [A])
        where
            A: Copy + Default + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
        {
            body(source, taps, g, acc)
        }
        if crate::runtime::cpu::Avx512Token::get().is_some() {
            // SAFETY: the token proves the AVX-512 level (F, BW, VL, DQ, FMA).
            return unsafe { avx512(source, taps, g, acc) };
        }
        if crate::runtime::cpu::Avx2Token::get().is_some() {
            // SAFETY: the token proves AVX2 and FMA.
            return unsafe { avx2(source, taps, g, acc) };
        }
    }
    body(source, taps, g, acc)
}

/// Adds `bias[c]` to each `pixels`-long row of channel `c` of `out` (`[N, O, pixels]`), in
/// f64 for f64 and in f32 otherwise (one rounding to T), rows spread over the pool.
fn add_bias<T: Element>(out: &mut [T], bias: &[T], pixels: usize) {
    if pixels == 0 || bias.is_empty() {
        return;
    }
    let chunks = per_thread(out, pixels);
    crate::runtime::threads::for_each(chunks, &|(first, chunk): (usize, &mut [T])| {
        for (r, row) in chunk.chunks_mut(pixels).enumerate() {
            let b = bias[(first + r) % bias.len()];
            if T::DTYPE == DType::F64 {
                let b = b.to_f64();
                row.iter_mut()
                    .for_each(|x| *x = T::from_f64(x.to_f64() + b));
            } else {
                let b = b.to_f32();
                row.iter_mut()
                    .for_each(|x| *x = T::from_f32(x.to_f32() + b));
            }
        }
    });
}

/// The output columns `x < outputs` whose input column `x · stride + shift` lies in
/// `0..width`.
fn inside(shift: isize, stride: usize, width: usize, outputs: usize) -> std::ops::Range<usize> {
    // x · stride + shift >= 0  <=>  x >= ceil(-shift / stride); < width  <=>  x <= (width - 1 - shift) / stride.
    let start = if shift >= 0 {
        0
    } else {
        shift.unsigned_abs().div_ceil(stride)
    };
    let end = match (width as isize - 1).checked_sub(shift) {
        Some(last) if last >= 0 => (last as usize / stride + 1).min(outputs),
        _ => 0,
    };
    start.min(end)..end
}

/// Unfolds `images` (`[count, C, H, W]`) into `cols` (`[count, groups, C/g · kH · kW,
/// H' · W']`, zero where a tap falls in the padding), rows spread over the thread pool.
fn unfold<T: Element>(images: &[T], g: &Geometry, cols: &mut [T]) {
    let p = g.pixels();
    if p == 0 || cols.is_empty() {
        return;
    }
    let [kh, kw] = g.kernel;
    let [h, w] = g.input;
    let [oh, ow] = g.output;
    let chunks = per_thread(cols, p);
    crate::runtime::threads::for_each(chunks, &|(first, chunk): (usize, &mut [T])| {
        for (r, row) in chunk.chunks_exact_mut(p).enumerate() {
            // Row = ((image · groups + group) · C/g + channel) · kH · kW + tap; the
            // image's channel index is image · C + group · C/g + channel = row / (kH · kW).
            let row_index = first + r;
            let tap = row_index % (kh * kw);
            let plane = row_index / (kh * kw);
            let (ki, kj) = (tap / kw, tap % kw);
            let source = &images[plane * h * w..][..h * w];
            // Output columns x read input column x · stride + shift, in the input for x in
            // `columns` (the rest stay zero: the padding).
            let shift = (kj * g.dilation[1]) as isize - g.pad_before[1] as isize;
            let columns = inside(shift, g.stride[1], w, ow);
            if columns.is_empty() {
                continue; // (the row is zero: the tap reads padding only)
            }
            for y in 0..oh {
                let iy = (y * g.stride[0] + ki * g.dilation[0]).checked_sub(g.pad_before[0]);
                let Some(iy) = iy.filter(|&iy| iy < h) else {
                    continue; // (the row is zero: the padding)
                };
                let out = &mut row[y * ow..][..ow];
                gather(
                    &source[iy * w..][..w],
                    (shift, g.stride[1]),
                    columns.clone(),
                    out,
                );
            }
        }
    });
}

/// `row[x] = line[x · stride + shift]` for the columns `x` in `columns` (from [`inside`]:
/// each reads inside `line`); a plain copy at unit stride.
fn gather<T: Copy>(
    line: &[T],
    (shift, stride): (isize, usize),
    columns: std::ops::Range<usize>,
    row: &mut [T],
) {
    let first = (columns.start * stride).wrapping_add_signed(shift);
    let out = &mut row[columns];
    if stride == 1 {
        out.copy_from_slice(&line[first..][..out.len()]);
    } else {
        for (value, &x) in out.iter_mut().zip(line[first..].iter().step_by(stride)) {
            *value = x;
        }
    }
}

/// `buffer`, whole items of `item_len > 0` values, in one run of items per pool thread,
/// each with the index of its first item.
fn per_thread<T>(buffer: &mut [T], item_len: usize) -> Vec<(usize, &mut [T])> {
    let items = buffer.len() / item_len;
    let per = items.div_ceil(crate::get_num_threads()).max(1);
    buffer
        .chunks_mut(per * item_len)
        .enumerate()
        .map(|(i, chunk)| (i * per, chunk))
        .collect()
}
