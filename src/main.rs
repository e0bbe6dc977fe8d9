//! The `backends` command: a report of every backend module and its flags, and self-checks.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Reports what this machine can run and how the math is set to run.
#[derive(Parser)]
#[command(name = "backends", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Says, for each SDPA backend, whether it can serve a call of this shape, and why not.
    Explain {
        #[command(flatten)]
        call: CallArgs,
        /// For a CUDA device: assume one of this compute capability (e.g. `9.0`) is present,
        /// to plan on a machine without it.
        #[arg(long, value_parser = parse_sm)]
        sm: Option<(u32, u32)>,
    },
    /// Runs the selected SDPA backend on random data of this shape, checks it against the
    /// math backend in float64 and prints the relative error and the time.
    Sdpa {
        #[command(flatten)]
        call: CallArgs,
    },
    /// Runs a program with tuned CPU settings: instances bound to cores, OMP_NUM_THREADS,
    /// a preloaded allocator (`torch.backends.xeon.run_cpu`).
    RunCpu(RunCpuArgs),
    /// Prints every module's capabilities and flags (and where each value came from).
    Info {
        /// Prints one JSON object keyed by module name instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// One attention call, as `explain` and `sdpa` take it.
#[derive(clap::Args)]
struct CallArgs {
    /// Batch, heads, query length, key length, head dim: `B,H,Lq,Lk,D`.
    #[arg(long, value_parser = parse_shape)]
    shape: [usize; 5],
    /// Element type (`f32`, `f16`, `bf16`, `f64`).
    #[arg(long, default_value = "f32")]
    dtype: backends::DType,
    /// Causal masking: `upper-left` (bare `--causal`; PyTorch's `is_causal`) or
    /// `lower-right` (the last query sees every key: decoding, chunked prefill).
    #[arg(long, num_args = 0..=1, default_missing_value = "upper-left", value_name = "ALIGNMENT")]
    causal: Option<CausalArg>,
    /// Key/value heads, for grouped-query attention (`enable_gqa`): H must be a multiple of
    /// it. Default: H (no grouping).
    #[arg(long, value_name = "N")]
    kv_heads: Option<usize>,
    /// A sliding window: query i sees keys i - LEFT ..= i + RIGHT around the causal
    /// alignment's diagonal (flash-attn's `window_size`; -1 leaves a side unbounded), e.g.
    /// `--causal --window 64,0`.
    #[arg(long, value_parser = parse_window, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    window: Option<backends::Window>,
    /// Packed sequences of these lengths (comma-separated), each used for both q and k,
    /// through `sdpa_varlen`; B, Lq and Lk of `--shape` are then ignored.
    #[arg(long, value_name = "LENS", value_delimiter = ',')]
    varlen: Option<Vec<usize>>,
    /// K and V in a paged cache of blocks of this many tokens, the block table shuffled
    /// (`sdpa_paged`): B sequences of Lk tokens each, Lq queries each.
    #[arg(long, value_name = "BLOCK", conflicts_with = "varlen")]
    paged: Option<usize>,
    /// An attention mask of shape `[Lq, Lk]`: `bool` or `float` (additive).
    #[arg(long)]
    mask: Option<MaskKind>,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// The device (`cpu`, `cuda`, `cuda:N`, `wgpu`, `wgpu:N`); default: the best one here.
    #[arg(long)]
    device: Option<backends::Device>,
}

/// The options of `backends run-cpu`, as PyTorch's launcher names them.
#[derive(clap::Args)]
struct RunCpuArgs {
    /// Number of instances (default: from the mode, or 1).
    #[arg(long, default_value_t = 0)]
    ninstances: usize,
    /// Cores per instance (default: from the mode, or all usable cores shared out).
    #[arg(long, default_value_t = 0)]
    ncores_per_instance: usize,
    /// Only use the cores of this NUMA node.
    #[arg(long)]
    node_id: Option<usize>,
    /// Use hyperthreads too (every logical CPU).
    #[arg(long)]
    use_logical_core: bool,
    /// Bind with sched_setaffinity even where numactl is installed.
    #[arg(long)]
    disable_numactl: bool,
    /// Preload jemalloc.
    #[arg(long)]
    enable_jemalloc: bool,
    /// Preload tcmalloc.
    #[arg(long)]
    enable_tcmalloc: bool,
    /// Preload no allocator (default: tcmalloc, else jemalloc, where installed).
    #[arg(long)]
    use_default_allocator: bool,
    /// Do not preload Intel OpenMP (libiomp5).
    #[arg(long)]
    disable_iomp: bool,
    /// One instance per NUMA node unless counts are given.
    #[arg(long)]
    multi_instance: bool,
    /// 4 cores per instance, as many instances as fit.
    #[arg(long)]
    latency_mode: bool,
    /// One instance per NUMA node with all its cores.
    #[arg(long)]
    throughput_mode: bool,
    /// A folder for one log file per instance.
    #[arg(long)]
    log_path: Option<std::path::PathBuf>,
    /// Print the plan (instances, cores, environment) without running.
    #[arg(long)]
    dry_run: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

impl RunCpuArgs {
    fn options(self) -> backends::xeon::RunCpuOptions {
        backends::xeon::RunCpuOptions {
            ninstances: self.ninstances,
            ncores_per_instance: self.ncores_per_instance,
            node_id: self.node_id,
            use_logical_core: self.use_logical_core,
            disable_numactl: self.disable_numactl,
            enable_jemalloc: self.enable_jemalloc,
            enable_tcmalloc: self.enable_tcmalloc,
            use_default_allocator: self.use_default_allocator,
            disable_iomp: self.disable_iomp,
            multi_instance: self.multi_instance,
            latency_mode: self.latency_mode,
            throughput_mode: self.throughput_mode,
            log_path: self.log_path,
            dry_run: self.dry_run,
            program: self.program,
        }
    }
}

/// The alignments `--causal` takes.
#[derive(Clone, Copy, clap::ValueEnum)]
enum CausalArg {
    UpperLeft,
    LowerRight,
}

impl From<CausalArg> for backends::CausalVariant {
    fn from(c: CausalArg) -> Self {
        match c {
            CausalArg::UpperLeft => backends::CausalVariant::UpperLeft,
            CausalArg::LowerRight => backends::CausalVariant::LowerRight,
        }
    }
}

/// How a call's causal masking and window read in the CLI's output.
fn masking_text(causal: Option<backends::CausalVariant>, window: backends::Window) -> String {
    let causal = causal.map_or("not causal", backends::CausalVariant::as_str);
    if window.is_bounded() {
        format!("{causal}, window {window}")
    } else {
        causal.to_string()
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum MaskKind {
    Bool,
    Float,
}

fn parse_shape(text: &str) -> Result<[usize; 5], String> {
    let dims: Vec<usize> = text
        .split(',')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    dims.try_into()
        .map_err(|d: Vec<usize>| format!("expected B,H,Lq,Lk,D (5 numbers), got {}", d.len()))
}

/// `LEFT,RIGHT` with -1 for an unbounded side.
fn parse_window(text: &str) -> Result<backends::Window, String> {
    let side = |t: &str| -> Result<Option<usize>, String> {
        match t.trim() {
            "-1" => Ok(None),
            n => n
                .parse()
                .map(Some)
                .map_err(|_| format!("expected a key count or -1 (unbounded), got {n:?}")),
        }
    };
    let (left, right) = text
        .split_once(',')
        .ok_or("expected LEFT,RIGHT, e.g. 64,0 (-1: unbounded)")?;
    Ok(backends::Window::new(side(left)?, side(right)?))
}

fn parse_sm(text: &str) -> Result<(u32, u32), String> {
    let (major, minor) = text
        .split_once('.')
        .ok_or("expected MAJOR.MINOR, e.g. 9.0")?;
    Ok((
        major.parse().map_err(|_| "bad major version")?,
        minor.parse().map_err(|_| "bad minor version")?,
    ))
}

/// What `backends explain` asks about.
struct Query {
    shape: [usize; 5],
    dtype: backends::DType,
    causal: Option<backends::CausalVariant>,
    /// Key/value heads (H without grouping).
    kv_heads: usize,
    window: backends::Window,
    varlen: Option<Vec<usize>>,
    paged: Option<usize>,
    mask: Option<MaskKind>,
    dropout: f64,
    device: backends::Device,
    sm: Option<(u32, u32)>,
}

impl Query {
    fn of(c: CallArgs, sm: Option<(u32, u32)>) -> Query {
        Query {
            shape: c.shape,
            dtype: c.dtype,
            causal: c.causal.map(Into::into),
            kv_heads: c.kv_heads.unwrap_or(c.shape[1]),
            window: c.window.unwrap_or_default(),
            varlen: c.varlen,
            paged: c.paged,
            mask: c.mask,
            dropout: c.dropout,
            device: c.device.unwrap_or_else(backends::Device::best),
            sm,
        }
    }
}

/// Runs the selected backend on random inputs and compares it with math in float64.
/// The element count of an input of `dims`, or an error where `--shape` makes it too large.
fn count(q: &Query, dims: &[usize]) -> backends::Result<usize> {
    dims.iter()
        .try_fold(1usize, |n, &x| n.checked_mul(x))
        .ok_or_else(|| backends::Error::InvalidArgument {
            what: "--shape",
            why: format!("{:?} has more elements than memory can address", q.shape),
        })
}

/// A small deterministic generator of inputs: fresh values per call, in [-1, 1), in a
/// fallibly allocated vector.
struct Random(u64);

impl Random {
    fn new(q: &Query) -> Random {
        Random(
            0x9E37_79B9_7F4A_7C15u64 ^ q.shape.iter().fold(1u64, |n, &x| n.wrapping_mul(x as u64)),
        )
    }

    fn values(&mut self, n: usize) -> backends::Result<Vec<f64>> {
        let mut values = Vec::new();
        values
            .try_reserve_exact(n)
            .map_err(|_| backends::Error::OutOfMemory {
                device: backends::Device::Cpu,
                bytes: (n as u64).saturating_mul(8),
                why: "the random inputs of `backends sdpa`".into(),
            })?;
        values.extend((0..n).map(|_| {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        }));
        Ok(values)
    }
}

/// `backends sdpa`: a dense call, or a serving call with `--varlen` / `--paged`.
fn run_sdpa_or_serving(q: &Query) -> backends::Result<String> {
    if q.varlen.is_some() || q.paged.is_some() {
        run_serving(q)
    } else {
        run_sdpa(q)
    }
}

/// Runs a serving call (`--varlen` or `--paged`) on random inputs and compares it with each
/// sequence alone through math in float64 on the CPU.
fn run_serving(q: &Query) -> backends::Result<String> {
    use backends::attention::{SdpBackend, sdpa_kernel_scoped};
    use backends::{
        DType, Device, PagedKv, SdpaOptions, Tensor, Varlen, sdpa, sdpa_paged, sdpa_varlen,
    };
    let [b, h, lq, lk, d] = q.shape;
    let hk = q.kv_heads;
    let mut random = Random::new(q);
    let options = SdpaOptions {
        is_causal: q.causal.is_some(),
        causal_variant: q.causal.unwrap_or_default(),
        window: q.window,
        enable_gqa: hk != h,
        ..SdpaOptions::default()
    };
    // Random inputs of `shape` in the call's dtype on its device, and their values as held.
    let mut input = |shape: &[usize]| -> backends::Result<(Tensor, Vec<f64>)> {
        let values = random.values(count(q, shape)?)?;
        let t = Tensor::from_f64(&values, shape, q.dtype, q.device)?;
        let held = t.to_f64()?;
        Ok((t, held))
    };
    // One sequence alone, q [H, lq, D] and k, v [Hk, lk, D] given by element readers.
    let alone = |lq: usize,
                 lk: usize,
                 at_q: &dyn Fn(usize, usize, usize) -> f64,
                 at_kv: &dyn Fn(bool, usize, usize, usize) -> f64|
     -> backends::Result<Vec<f64>> {
        let gather = |heads: usize, len: usize, f: &dyn Fn(usize, usize, usize) -> f64| {
            let values: Vec<f64> = (0..heads * len * d)
                .map(|e| f(e / (len * d), e / d % len, e % d))
                .collect();
            Tensor::from_f64(&values, &[1, heads, len, d], DType::F64, Device::Cpu)
        };
        let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
        let (k, v) = (
            gather(hk, lk, &|a, j, x| at_kv(true, a, j, x))?,
            gather(hk, lk, &|a, j, x| at_kv(false, a, j, x))?,
        );
        sdpa(&gather(h, lq, at_q)?, &k, &v, &options)?
            .output
            .to_f64()
    };
    let (label, out, want, seconds, pairs) = if let Some(lens) = &q.varlen {
        let cu: Vec<usize> = std::iter::once(0)
            .chain(lens.iter().scan(0usize, |total, &n| {
                *total = total.saturating_add(n);
                Some(*total)
            }))
            .collect();
        let total = cu[lens.len()];
        let ((qt, qh), (kt, kh), (vt, vh)) = (
            input(&[total, h, d])?,
            input(&[total, hk, d])?,
            input(&[total, hk, d])?,
        );
        let batch = Varlen::same(&cu);
        sdpa_varlen(&qt, &kt, &vt, &batch, &options)?; // warm-up
        let start = std::time::Instant::now();
        let out = sdpa_varlen(&qt, &kt, &vt, &batch, &options)?;
        let seconds = start.elapsed().as_secs_f64();
        let mut want = vec![0.0; total * h * d];
        for (s, &len) in lens.iter().enumerate() {
            let row = |values: &[f64], heads: usize, a: usize, r: usize, x: usize| {
                values[((cu[s] + r) * heads + a) * d + x]
            };
            let seq = alone(
                len,
                len,
                &|a, r, x| row(&qh, h, a, r, x),
                &|key, a, j, x| row(if key { &kh } else { &vh }, hk, a, j, x),
            )?;
            for (e, value) in seq.into_iter().enumerate() {
                let (a, r, x) = (e / (len * d), e / d % len, e % d);
                want[((cu[s] + r) * h + a) * d + x] = value;
            }
        }
        let pairs: f64 = lens.iter().map(|&n| visible_pairs(q, n, n)).sum();
        (
            format!("varlen {lens:?}, H {h}, Hk {hk}, D {d}"),
            out,
            want,
            seconds,
            pairs,
        )
    } else {
        let block = q.paged.unwrap_or(1);
        let per_seq = lk.div_ceil(block.max(1));
        let blocks = b.saturating_mul(per_seq);
        // Sequence s's block i is cache block (s * per_seq + i) * stride mod blocks, a
        // permutation (stride coprime to the count).
        let stride = (blocks / 2..)
            .find(|&x| gcd(x.max(1), blocks.max(1)) == 1)
            .unwrap_or(1);
        let table: Vec<usize> = (0..blocks).map(|i| i * stride % blocks.max(1)).collect();
        let ((qt, qh), (kc, kh), (vc, vh)) = (
            input(&[b, h, lq, d])?,
            input(&[blocks, block, hk, d])?,
            input(&[blocks, block, hk, d])?,
        );
        let lens = vec![lk; b];
        let cache = PagedKv {
            key_cache: &kc,
            value_cache: &vc,
            block_table: &table,
            seq_lens: &lens,
        };
        sdpa_paged(&qt, &cache, &options)?; // warm-up
        let start = std::time::Instant::now();
        let out = sdpa_paged(&qt, &cache, &options)?;
        let seconds = start.elapsed().as_secs_f64();
        let mut want = Vec::with_capacity(b * h * lq * d);
        for s in 0..b {
            let slot = |j: usize| table[s * per_seq + j / block] * block + j % block;
            want.extend(alone(
                lq,
                lk,
                &|a, i, x| qh[((s * h + a) * lq + i) * d + x],
                &|key, a, j, x| (if key { &kh } else { &vh })[(slot(j) * hk + a) * d + x],
            )?);
        }
        let pairs = b as f64 * visible_pairs(q, lq, lk);
        (
            format!(
                "paged, {b} sequences of {lk} tokens in blocks of {block}, Lq {lq}, H {h}, Hk {hk}, D {d}"
            ),
            out,
            want,
            seconds,
            pairs,
        )
    };
    let flops = 4.0 * (h * d) as f64 * pairs;
    report(q, &label, &out, &want, (seconds, flops))
}

/// What `backends sdpa` prints: the call (`label`, dtype, masking, device), the backend
/// that ran, its relative error against `want` and its time and throughput.
fn report(
    q: &Query,
    label: &str,
    out: &backends::SdpaOutput,
    want: &[f64],
    (seconds, flops): (f64, f64),
) -> backends::Result<String> {
    let got = out.output.to_f64()?;
    let diff: f64 = got.iter().zip(want).map(|(a, r)| (a - r) * (a - r)).sum();
    let norm: f64 = want.iter().map(|r| r * r).sum();
    Ok(format!(
        "SDPA {label}, {}, {}, on {}\n\
         backend: {}\nrelative error vs float64 math: {:.2e}\ntime: {:.3} ms ({:.3} TFLOP/s)\n",
        q.dtype,
        masking_text(q.causal, q.window),
        q.device,
        out.backend,
        (diff / norm.max(f64::MIN_POSITIVE)).sqrt(),
        seconds * 1e3,
        flops / seconds / 1e12
    ))
}

/// The greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn run_sdpa(q: &Query) -> backends::Result<String> {
    use backends::attention::{SdpBackend, sdpa_kernel_scoped};
    use backends::{DType, Device, SdpaOptions, Tensor, sdpa};
    let [b, h, lq, lk, d] = q.shape;
    let hk = q.kv_heads;
    let count = |dims: &[usize]| count(q, dims);
    let mut generator = Random::new(q);
    let mut random = |n: usize| generator.values(n);
    let (qv, kv, vv) = (
        random(count(&[b, h, lq, d])?)?,
        random(count(&[b, hk, lk, d])?)?,
        random(count(&[b, hk, lk, d])?)?,
    );
    let mask_values: Option<Vec<f64>> = match q.mask {
        // Every row keeps its first key, so that no row is fully masked.
        Some(MaskKind::Bool) => Some(
            random(count(&[lq, lk])?)?
                .iter()
                .enumerate()
                .map(|(i, &x)| f64::from(u8::from(x > -0.5 || i % lk == 0)))
                .collect(),
        ),
        Some(MaskKind::Float) => Some(random(count(&[lq, lk])?)?),
        None => None,
    };
    let inputs = |dtype: DType, device: Device| -> backends::Result<Vec<Tensor>> {
        let mut t = vec![
            Tensor::from_f64(&qv, &[b, h, lq, d], dtype, device)?,
            Tensor::from_f64(&kv, &[b, hk, lk, d], dtype, device)?,
            Tensor::from_f64(&vv, &[b, hk, lk, d], dtype, device)?,
        ];
        if let (Some(values), Some(kind)) = (&mask_values, q.mask) {
            let mask_dtype = if matches!(kind, MaskKind::Bool) {
                DType::Bool
            } else {
                dtype
            };
            t.push(Tensor::from_f64(values, &[lq, lk], mask_dtype, device)?);
        }
        Ok(t)
    };
    let run = |t: &[Tensor]| {
        let options = SdpaOptions {
            attn_mask: t.get(3),
            dropout_p: q.dropout,
            is_causal: q.causal.is_some(),
            causal_variant: q.causal.unwrap_or_default(),
            window: q.window,
            enable_gqa: hk != h,
            generator: Some(&backends::Generator::new(7)),
            ..SdpaOptions::default()
        };
        sdpa(&t[0], &t[1], &t[2], &options)
    };
    let ours = inputs(q.dtype, q.device)?;
    run(&ours)?; // warm-up: pipelines, plans, caches
    let start = std::time::Instant::now();
    let out = run(&ours)?;
    let seconds = start.elapsed().as_secs_f64();
    // The reference: the inputs as the device saw them, in f64, through math on the CPU.
    let exact: Vec<Tensor> = ours
        .iter()
        .map(|t| {
            let dtype = if t.dtype() == DType::Bool {
                DType::Bool
            } else {
                DType::F64
            };
            Tensor::from_f64(&t.to_f64()?, t.shape(), dtype, Device::Cpu)
        })
        .collect::<backends::Result<_>>()?;
    let reference = {
        let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
        run(&exact)?.output.to_f64()?
    };
    let flops = 4.0 * (b * h * d) as f64 * visible_pairs(q, lq, lk);
    let label = format!("q [{b}, {h}, {lq}, {d}], k/v [{b}, {hk}, {lk}, {d}]");
    report(q, &label, &out, &reference, (seconds, flops))
}

/// How many (query, key) pairs the call's causal mask and window leave visible (the
/// FLOP count's basis): query i sees keys `i + diag - left ..= i + diag + right` within
/// `0..lk`, `right` 0 under a causal mask.
fn visible_pairs(q: &Query, lq: usize, lk: usize) -> f64 {
    let diag = match q.causal.unwrap_or_default() {
        backends::CausalVariant::UpperLeft => 0.0,
        backends::CausalVariant::LowerRight => lk as f64 - lq as f64,
    };
    let right = match (q.causal, q.window.right) {
        (Some(_), _) => Some(0.0),
        (None, right) => right.map(|r| r as f64),
    };
    let left = q.window.left.map(|l| l as f64);
    (0..lq)
        .map(|i| {
            let centre = i as f64 + diag;
            let first = left.map_or(0.0, |l| (centre - l).max(0.0));
            let end = right.map_or(lk as f64, |r| (centre + r + 1.0).min(lk as f64));
            (end - first).max(0.0)
        })
        .sum()
}

fn explain(
    Query {
        shape,
        dtype,
        causal,
        kv_heads: hk,
        window,
        varlen,
        paged,
        mask,
        dropout,
        device,
        sm,
    }: Query,
) -> String {
    use backends::attention::{DeviceCaps, explain_with, select_with};
    use backends::cuda::{SDPAParams, TensorMeta};
    // A packed batch is planned as the dense call of its longest sequence.
    let [b, h, lq, lk, d] = match &varlen {
        Some(lens) => {
            let longest = lens.iter().copied().max().unwrap_or(0);
            [lens.len(), shape[1], longest, longest, shape[4]]
        }
        None => shape,
    };
    let meta = |s: &[usize], dt| TensorMeta::contiguous(s, dt, device);
    let params = SDPAParams {
        query: meta(&[b, h, lq, d], dtype),
        key: meta(&[b, hk, lk, d], dtype),
        value: meta(&[b, hk, lk, d], dtype),
        attn_mask: mask.map(|m| {
            meta(
                &[lq, lk],
                if matches!(m, MaskKind::Bool) {
                    backends::DType::Bool
                } else {
                    dtype
                },
            )
        }),
        dropout,
        is_causal: causal.is_some(),
        causal_variant: causal.unwrap_or_default(),
        window,
        enable_gqa: hk != h,
    };
    let mut text = format!(
        "SDPA q [{b}, {h}, {lq}, {d}], k/v [{b}, {hk}, {lk}, {d}], {dtype}, {}, on {device}\n",
        masking_text(causal, window)
    );
    let mut caps = DeviceCaps::of(device);
    if let (Some(sm), backends::Device::Cuda(_)) = (sm, device) {
        caps.present = true;
        caps.sm = Some(sm);
        text.push_str(&format!(
            "(assuming a CUDA device of compute capability {}.{})\n",
            sm.0, sm.1
        ));
    }
    for (backend, reasons) in explain_with(&params, &caps) {
        if reasons.is_empty() {
            text.push_str(&format!("  {backend}: usable\n"));
        }
        for reason in reasons {
            text.push_str(&format!("  {backend}: {reason}\n"));
        }
    }
    if varlen.is_some() || paged.is_some() {
        let call = if varlen.is_some() {
            "sdpa_varlen"
        } else {
            "sdpa_paged"
        };
        let (backend, reasons) = backends::sdpa::serving::serving_verdict(&params, &caps);
        for reason in &reasons {
            text.push_str(&format!("  {call} on {backend}: {reason}\n"));
        }
        match reasons.is_empty() {
            true => text.push_str(&format!("selected for {call}: {backend}\n")),
            false => text.push_str(&format!("selected for {call}: none\n")),
        }
        return text;
    }
    match select_with(&params, &caps) {
        Ok(backend) => text.push_str(&format!("selected: {backend}\n")),
        Err(err) => text.push_str(&format!(
            "selected: none ({})\n",
            err.to_string().lines().last().unwrap_or_default()
        )),
    }
    text
}

/// Prints warnings from this library (and errors from any crate) to stderr.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        meta.level() <= log::Level::Error
            || meta.level() <= log::Level::Warn && meta.target().starts_with("backends")
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("[{}] {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // Mesa's device-select layer prints an error per Vulkan instance when
        // XDG_RUNTIME_DIR is unset (containers, CI); it only reorders devices.
        // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
    let _ = log::set_logger(&StderrLogger).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let cli = Cli::parse();
    let text = match cli.command {
        Some(Command::Explain { call, sm }) => explain(Query::of(call, sm)),
        Some(Command::Sdpa { call }) => match run_sdpa_or_serving(&Query::of(call, None)) {
            Ok(text) => text,
            Err(err) => {
                eprintln!("backends sdpa: {err}");
                return ExitCode::FAILURE;
            }
        },
        Some(Command::RunCpu(args)) => {
            return match backends::xeon::run_cpu(&args.options()) {
                Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                Err(err) => {
                    eprintln!("backends run-cpu: {err}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Info { json: true }) => format!("{:#}\n", backends::info::report()),
        Some(Command::Info { json: false }) => {
            backends::info::render_text(&backends::info::report())
        }
        None => {
            let mut text = backends::info::render_text(&backends::info::report());
            text.push_str(&format!(
                "\nself-checks (best device: {})\n",
                backends::Device::best()
            ));
            let checks = backends::selfcheck::run();
            for c in &checks {
                let verdict = if c.passed() { "ok" } else { "FAILED" };
                let detail = match &c.outcome {
                    Ok(err) => format!(
                        "rel. error {err:.2e} (bound {:.0e}), {:.2} ms",
                        c.bound, c.millis
                    ),
                    Err(why) => why.clone(),
                };
                text.push_str(&format!(
                    "  {verdict:6} {} on {}: {detail}\n",
                    c.name, c.device
                ));
            }
            let code = print_or_exit(&text);
            return if checks.iter().all(|c| c.passed()) {
                code
            } else {
                ExitCode::FAILURE
            };
        }
    };
    print_or_exit(&text)
}

/// Writes to stdout; a closed pipe (`backends info | head`) ends quietly.
fn print_or_exit(text: &str) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("backends: cannot write the report: {err}");
            ExitCode::FAILURE
        }
    }
}
