//! The embedded PTX as the interpreter (`backends-ptx`) reads and runs it: every module of
//! every architecture parses and holds every kernel the dispatch table names, with the
//! parameter list the launchers check against; the kernels the interpreter runs so far
//! (scale, split-K reduction) match a float64 reference.

mod common;

use std::collections::BTreeSet;

use backends::DType;
use backends::kernels::{
    self, CUDA_MODULES, ENTRIES, Elem, KernelKey, ScaleKey, SplitKReduceKey, lookup,
};
use backends_ptx::{Launch, Memory};
use common::{random, rel_err};

#[test]
fn every_embedded_module_parses_with_every_kernel_of_the_table() {
    if CUDA_MODULES.iter().all(|m| m.ptx.is_none()) {
        eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
        return;
    }
    let mut opcodes = BTreeSet::new();
    for module in CUDA_MODULES.iter() {
        if let Some(ptx) = module.ptx {
            let arch = module.tier;
            let parsed = backends_ptx::parse::parse(ptx)
                .unwrap_or_else(|e| panic!("{} sm_{arch}: {e}", module.family));
            assert_eq!(parsed.target, format!("sm_{arch}"));
            let entries = ENTRIES.iter().filter(|e| {
                e.key.family() == module.family && e.cuda.as_ref().is_some_and(|c| c.min_sm <= arch)
            });
            for entry in entries {
                let kernel = parsed
                    .kernel(entry.name)
                    .unwrap_or_else(|| panic!("{} sm_{arch} lacks {}", module.family, entry.name));
                let params = kernels::ptx_params(ptx, entry.name).expect("readable parameters");
                assert_eq!(kernel.params.len(), params.len(), "{}", entry.name);
                assert!(!kernel.body.is_empty(), "{}", entry.name);
                // Every branch target is a label of the kernel.
                for instruction in &kernel.body {
                    if instruction.opcode.starts_with("bra") {
                        let Some(backends_ptx::Operand::Symbol(label)) =
                            instruction.operands.first()
                        else {
                            panic!("{}: a branch without a label", entry.name)
                        };
                        assert!(kernel.labels.contains_key(label), "{}: {label}", entry.name);
                    }
                    opcodes.insert(instruction.opcode.clone());
                }
            }
        }
    }
    eprintln!("{} distinct opcodes in the embedded PTX", opcodes.len());
    assert!(opcodes.iter().any(|o| o.starts_with("mma.sync")));
}

/// The embedded PTX (sm_80) of the kernel serving `key`, parsed, with its name; `None`
/// where no PTX is embedded.
fn embedded(key: &KernelKey) -> Option<(backends_ptx::Module, &'static str)> {
    let entry = lookup(key)?;
    let ptx = backends::kernels::cuda_module(key.family(), 80)?.ptx?;
    Some((backends_ptx::parse::parse(ptx).expect("parses"), entry.name))
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn the_scale_kernel_runs_in_the_interpreter() {
    let Some((module, name)) = embedded(&KernelKey::Scale(ScaleKey { elem: Elem::F32 })) else {
        eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
        return;
    };
    // 600 values over 3 blocks of 256 (the last partly idle), scaled by 1/3.
    let x: Vec<f32> = random(600).iter().map(|&v| v as f32).collect();
    let mut memory = Memory::default();
    let at = memory.upload(&f32_bytes(&x));
    let launch = Launch {
        grid: [3, 1, 1],
        block: [256, 1, 1],
        params: vec![
            at.to_le_bytes().to_vec(),
            600u64.to_le_bytes().to_vec(),
            (1.0f64 / 3.0).to_le_bytes().to_vec(),
        ],
        counters: false,
    };
    let stats = backends_ptx::run(module.kernel(name).unwrap(), &launch, &mut memory).unwrap();
    let got: Vec<f64> = f32_values(memory.download(at, 2400).unwrap())
        .into_iter()
        .map(f64::from)
        .collect();
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v) / 3.0).collect();
    assert!(rel_err(&got, &want) < 1e-6, "{}", rel_err(&got, &want));
    assert!(stats.instructions > 600 * 10, "{stats:?}");
    // Past the end of the allocation: a typed error, not a silent write.
    let short = Launch {
        params: vec![
            at.to_le_bytes().to_vec(),
            700u64.to_le_bytes().to_vec(),
            1.0f64.to_le_bytes().to_vec(),
        ],
        ..launch
    };
    let err = backends_ptx::run(module.kernel(name).unwrap(), &short, &mut memory).unwrap_err();
    assert!(
        matches!(err, backends_ptx::ExecError::BadAccess { .. }),
        "{err}"
    );
}

#[test]
fn the_split_k_reduction_runs_in_the_interpreter() {
    let key = KernelKey::SplitKReduce(SplitKReduceKey {
        elem: Elem::F32,
        partials: Elem::F32,
    });
    let Some((module, name)) = embedded(&key) else {
        eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
        return;
    };
    // P[splits][batch][M][N] into C with a row stride of N + 3 (poisoned padding).
    let (m, n, batch, splits, ldc) = (5usize, 7usize, 2usize, 3usize, 10usize);
    let partials: Vec<f32> = random(splits * batch * m * n)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let mut memory = Memory::default();
    let p_at = memory.upload(&f32_bytes(&partials));
    let c_len = batch * m * ldc;
    let c_at = memory.upload(&f32_bytes(&vec![f32::NAN; c_len]));
    let int = |v: usize| (v as i32).to_le_bytes().to_vec();
    let long = |v: usize| (v as i64).to_le_bytes().to_vec();
    let launch = Launch {
        grid: [(batch * m * n).div_ceil(256) as u32, 1, 1],
        block: [256, 1, 1],
        params: vec![
            p_at.to_le_bytes().to_vec(),
            c_at.to_le_bytes().to_vec(),
            int(m),
            int(n),
            int(batch),
            int(splits),
            long(m * ldc),
            long(ldc),
        ],
        counters: false,
    };
    backends_ptx::run(module.kernel(name).unwrap(), &launch, &mut memory).unwrap();
    let c = f32_values(memory.download(c_at, c_len * 4).unwrap());
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for b in 0..batch {
        for i in 0..m {
            for j in 0..ldc {
                let value = c[b * m * ldc + i * ldc + j];
                if j >= n {
                    assert!(value.is_nan(), "padding ({b}, {i}, {j}) was written");
                    continue;
                }
                got.push(f64::from(value));
                want.push(
                    (0..splits)
                        .map(|s| f64::from(partials[((s * batch + b) * m + i) * n + j]))
                        .sum(),
                );
            }
        }
    }
    assert!(rel_err(&got, &want) < 1e-6, "{}", rel_err(&got, &want));
}

/// Elements of `values` as the bytes of `elem` (f32, f16 or bf16).
fn bytes_of(values: &[f64], elem: Elem) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| match elem {
            // Through f32, as the library converts.
            Elem::F16 => half::f16::from_f32(v as f32).to_le_bytes().to_vec(),
            Elem::Bf16 => half::bf16::from_f32(v as f32).to_le_bytes().to_vec(),
            _ => (v as f32).to_le_bytes().to_vec(),
        })
        .collect()
}

/// The values of `bytes` of `elem`.
fn values_of(bytes: &[u8], elem: Elem) -> Vec<f64> {
    match elem {
        Elem::F16 => bytes
            .chunks_exact(2)
            .map(|b| f64::from(half::f16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Elem::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| f64::from(half::bf16::from_le_bytes([b[0], b[1]])))
            .collect(),
        _ => f32_values(bytes).into_iter().map(f64::from).collect(),
    }
}

/// Every GEMM variant class (fp32 FFMA, TF32, bf16 and fp16 tensor cores, fp16
/// accumulation) through its shipped PTX in the interpreter, at a shape that is no tile
/// multiple, batched, against the float64 product of the inputs as the kernel sees them.
#[test]
fn the_gemm_kernels_run_in_the_interpreter() {
    use backends::kernels::{Family, GemmMath};
    let (m, n, k, batch) = (37usize, 29usize, 40usize, 2usize);
    let mut classes = BTreeSet::new();
    let mut ran = 0;
    for entry in ENTRIES.iter() {
        let KernelKey::Gemm(key) = entry.key else {
            continue;
        };
        let Some(cuda) = &entry.cuda else { continue };
        if key.partials != Elem::F32 && key.elem == Elem::F32 {
            continue;
        }
        if !classes.insert((key.elem, key.math, key.acc_f16)) {
            continue;
        }
        let Some((module, name)) = embedded(&entry.key) else {
            eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
            return;
        };
        assert_eq!(entry.key.family(), Family::Gemm);
        let (a, b) = (random(batch * m * k), random(batch * k * n));
        // The inputs as the kernel rounds them: the element type, then the math's type.
        let round = |x: &[f64]| -> Vec<f64> {
            let stored = values_of(&bytes_of(x, key.elem), key.elem);
            stored
                .into_iter()
                .map(|v| match key.math {
                    GemmMath::Tf32 => {
                        let bits = (v as f32).to_bits();
                        f64::from(f32::from_bits((bits + (1 << 12)) & !((1 << 13) - 1)))
                    }
                    GemmMath::Bf16 => f64::from(half::bf16::from_f32(v as f32)),
                    GemmMath::F16 => f64::from(half::f16::from_f32(v as f32)),
                    GemmMath::Ieee => v,
                })
                .collect()
        };
        let (ra, rb) = (round(&a), round(&b));
        let mut want = Vec::new();
        for bi in 0..batch {
            want.extend(common::reference(
                &ra[bi * m * k..(bi + 1) * m * k],
                &rb[bi * k * n..(bi + 1) * k * n],
                m,
                n,
                k,
            ));
        }
        let size = DType::from(key.elem).size();
        let mut memory = Memory::default();
        let a_at = memory.upload(&bytes_of(&a, key.elem));
        let b_at = memory.upload(&bytes_of(&b, key.elem));
        let c_at = memory.upload(&bytes_of(&vec![f64::NAN; batch * m * n], key.elem));
        let int = |v: usize| (v as i32).to_le_bytes().to_vec();
        let long = |v: usize| (v as i64).to_le_bytes().to_vec();
        let k_slice = k.next_multiple_of(32);
        let mut params = vec![
            a_at.to_le_bytes().to_vec(),
            b_at.to_le_bytes().to_vec(),
            c_at.to_le_bytes().to_vec(),
        ];
        params.extend([m, n, k, batch, 1, k_slice].map(int));
        // A's, B's (batch, row, col) strides, then C's batch and row strides.
        params.extend([m * k, k, 1, k * n, n, 1, m * n, n].map(long));
        let launch = Launch {
            grid: [
                n.div_ceil(cuda.tile[1] as usize) as u32,
                m.div_ceil(cuda.tile[0] as usize) as u32,
                batch as u32,
            ],
            block: cuda.threads,
            params,
            counters: false,
        };
        backends_ptx::run(module.kernel(name).unwrap(), &launch, &mut memory)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = values_of(
            memory.download(c_at, batch * m * n * size).unwrap(),
            key.elem,
        );
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{name}: unwritten outputs"
        );
        let bound = match (key.elem, key.acc_f16) {
            (Elem::F32, _) => 1e-5,
            (_, false) => 1e-2,
            (_, true) => 2e-2,
        };
        let err = rel_err(&got, &want);
        assert!(err < bound, "{name}: {err}");
        eprintln!("{name}: relative error {err:.1e}");
        ran += 1;
    }
    assert!(ran >= 5, "{ran} GEMM classes ran");
}

/// An attention mask `[Lq, Lk]`: boolean (true takes part) or additive.
#[derive(Clone, Copy)]
enum Mask<'a> {
    Keep(&'a [bool]),
    Add(&'a [f64]),
}

/// The band of a causal mask, top-left aligned: key j visible to query i when
/// `i - lq <= j <= i` (the kernels' `lo`, `hi`).
fn causal_band(lq: usize) -> [i32; 2] {
    [-(lq as i32), 0]
}

/// One attention launch through the interpreter: q, k, v `[1, H, L, D]` (contiguous, GQA
/// with `hk` key/value heads), an optional band `[lo, hi]` (key j visible to query i when
/// `i + lo <= j <= i + hi`: causal, sliding windows), an optional mask `[Lq, Lk]`
/// (broadcast over heads), for the kernel `key`; returns the output next to the float64
/// reference of the inputs as rounded.
fn attention_in_interpreter(
    key: KernelKey,
    dims: (usize, usize, usize, usize, usize),
    band: Option<[i32; 2]>,
    mask: Option<Mask>,
) -> Option<(Vec<f64>, Vec<f64>)> {
    let (h, hk, lq, lk, d) = dims;
    let (q, k, v) = (random(h * lq * d), random(hk * lk * d), random(hk * lk * d));
    let elem = attention_elem(key);
    let rounded = |x: &[f64]| values_of(&bytes_of(x, elem), elem);
    let (rq, rk, rv) = (rounded(&q), rounded(&k), rounded(&v));
    let scale = 1.0 / (d as f64).sqrt();
    let outside = |i: usize, j: usize| {
        band.is_some_and(|[lo, hi]| {
            let (i, j) = (i as i64, j as i64);
            j < i + i64::from(lo) || j > i + i64::from(hi)
        })
    };
    let bias = |_: usize, _: usize, i: usize, j: usize| match mask {
        _ if outside(i, j) => f64::NEG_INFINITY,
        Some(Mask::Keep(m)) if !m[i * lk + j] => f64::NEG_INFINITY,
        Some(Mask::Add(m)) => f64::from(m[i * lk + j] as f32),
        _ => 0.0,
    };
    let want =
        common::attention_reference(&rq, &rk, &rv, [1, h, hk, lq, lk, d, d], scale, None, &bias);
    let got = run_attention(key, dims, band, mask, None, [&q, &k, &v])?;
    Some((got, want))
}

/// The element type of an attention kernel.
fn attention_elem(key: KernelKey) -> Elem {
    match key {
        KernelKey::FlashFwd(f) => f.elem,
        KernelKey::MemEffFwd(m) => m.elem,
        _ => unreachable!("an attention key"),
    }
}

/// Launches attention kernel `key` in the interpreter on q, k, v (`[1, H(k), L, D]`), with an
/// optional band `[lo, hi]` (read by the causal flash variants and by memory-efficient
/// attention), mask and dropout `(p, key)`; returns the output.
fn run_attention(
    key: KernelKey,
    (h, hk, lq, lk, d): (usize, usize, usize, usize, usize),
    band: Option<[i32; 2]>,
    mask: Option<Mask>,
    dropout: Option<(f64, u64)>,
    [q, k, v]: [&[f64]; 3],
) -> Option<Vec<f64>> {
    let (module, name) = embedded(&key)?;
    let entry = lookup(&key).unwrap();
    let cuda = entry.cuda.as_ref().unwrap();
    let elem = attention_elem(key);
    let scale = 1.0 / (d as f64).sqrt();
    let size = DType::from(elem).size();
    let mut memory = Memory::default();
    let (q_at, k_at, v_at) = (
        memory.upload(&bytes_of(q, elem)),
        memory.upload(&bytes_of(k, elem)),
        memory.upload(&bytes_of(v, elem)),
    );
    let o_at = memory.upload(&bytes_of(&vec![f64::NAN; h * lq * d], elem));
    let lse_at = memory.upload(&f32_bytes(&vec![f32::NAN; h * lq]));
    let mask_at = match mask {
        None => o_at,
        Some(Mask::Keep(m)) => memory.upload(&m.iter().map(|&x| u8::from(x)).collect::<Vec<_>>()),
        Some(Mask::Add(m)) => memory.upload(&bytes_of(m, elem)),
    };
    let ptr = |a: u64| a.to_le_bytes().to_vec();
    let int = |v: usize| (v as i32).to_le_bytes().to_vec();
    let long = |v: usize| (v as i64).to_le_bytes().to_vec();
    let strides = |heads: usize, len: usize| [heads * len * d, len * d, d].map(long);
    let mut params = vec![ptr(q_at), ptr(k_at), ptr(v_at)];
    let flash = matches!(key, KernelKey::FlashFwd(_));
    // The band as the kernels take it: around the top-left diagonal (lower_right 0).
    let [lo, hi] = band.unwrap_or([0, 0]);
    let band_words = [lo, hi, 0].map(|x| x.to_le_bytes().to_vec());
    if flash {
        params.extend([ptr(o_at), ptr(lse_at)]);
        params.extend([h, hk, lq, lk, d].map(int));
        params.push((scale as f32).to_le_bytes().to_vec());
        params.extend(band_words);
        // One chunk of keys (no split-KV).
        params.push(int(lk));
    } else {
        params.extend([ptr(mask_at), ptr(o_at), ptr(lse_at)]);
        params.extend([h, hk, lq, lk, d].map(int));
        params.push((scale as f32).to_le_bytes().to_vec());
        params.push(int(usize::from(band.is_some())));
        params.extend(band_words);
    }
    params.extend(strides(h, lq));
    params.extend(strides(hk, lk));
    params.extend(strides(hk, lk));
    params.extend(strides(h, lq));
    if flash {
        // The chunk strides of the output and log-sum-exp (unused with one chunk).
        params.extend([0, 0].map(long));
    }
    if !flash {
        // The mask's [B, H, Lq, Lk] strides: broadcast over batch and heads; a dense call
        // (no sequence table: the kernel reads none); the log-sum-exp [H, Lq].
        params.extend([0, 0, lk, 1].map(long));
        params.push(ptr(o_at));
        params.extend([0, 0, 0, 0, 0].map(int));
        params.extend([h * lq, lq].map(long));
    }
    let (p, seed) = dropout.unwrap_or((0.0, 0));
    params.push(p.to_le_bytes().to_vec());
    params.push(seed.to_le_bytes().to_vec());
    let launch = Launch {
        grid: [lq.div_ceil(cuda.tile[0] as usize) as u32, h as u32, 1],
        block: cuda.threads,
        params,
        counters: false,
    };
    backends_ptx::run(module.kernel(name).unwrap(), &launch, &mut memory)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Some(values_of(
        memory.download(o_at, h * lq * d * size).unwrap(),
        elem,
    ))
}

/// Flash attention (f16 and bf16 tensor cores) at every head dim it is built for, with and
/// without causal masking, GQA, and a length that is no tile multiple.
#[test]
fn the_flash_kernels_run_in_the_interpreter() {
    let mut ran = 0;
    for entry in ENTRIES.iter() {
        let KernelKey::FlashFwd(key) = entry.key else {
            continue;
        };
        if entry.cuda.is_none() {
            continue;
        }
        let d = key.head_dim as usize;
        // The causal variants also take sliding windows: causal local attention, and a
        // band on both sides whose first rows' keys start past the first key block.
        let bands = if key.causal {
            vec![causal_band(33), [-5, 0], [-40, 3]]
        } else {
            vec![]
        };
        let lengths = |band: &Option<[i32; 2]>| {
            if band.is_some_and(|b| b[0] == -40) {
                90
            } else {
                33
            }
        };
        for band in std::iter::once(None)
            .filter(|_| !key.causal)
            .chain(bands.into_iter().map(Some))
        {
            let l = lengths(&band);
            let Some((got, want)) =
                attention_in_interpreter(entry.key, (4, 2, l, l, d), band, None)
            else {
                eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
                return;
            };
            let err = rel_err(&got, &want);
            eprintln!("{} band {band:?}: relative error {err:.1e}", entry.name);
            assert!(err < 1e-2, "{} band {band:?}: {err}", entry.name);
            ran += 1;
        }
    }
    assert!(ran >= 4, "{ran} flash runs");
}

/// Memory-efficient attention: every variant, with a boolean or additive mask, causal with
/// Lq != Lk (bottom-right keys hidden past the diagonal, as PyTorch's top-left causal).
#[test]
fn the_memory_efficient_kernels_run_in_the_interpreter() {
    let mut ran = 0;
    for entry in ENTRIES.iter() {
        let KernelKey::MemEffFwd(key) = entry.key else {
            continue;
        };
        if entry.cuda.is_none() {
            continue;
        }
        let d = (key.head_dim_max as usize).min(40);
        let (lq, lk) = (19, 27);
        // Key 0 stays visible to every query the band lets see it.
        let keep: Vec<bool> = random(lq * lk)
            .iter()
            .enumerate()
            .map(|(e, &x)| e % lk == 0 || x > -0.6)
            .collect();
        let additive = random(lq * lk);
        let mask = match key.mask {
            backends::kernels::MaskKind::None => None,
            backends::kernels::MaskKind::Bool => Some(Mask::Keep(&keep)),
            backends::kernels::MaskKind::Additive => Some(Mask::Add(&additive)),
        };
        // Unmasked, causal, and a window of keys i - 6..=i + 2 (rows past 6 lose key 0).
        for band in [None, Some(causal_band(lq)), Some([-6, 2])] {
            let Some((got, want)) =
                attention_in_interpreter(entry.key, (2, 1, lq, lk, d), band, mask)
            else {
                eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
                return;
            };
            let err = rel_err(&got, &want);
            eprintln!("{} band {band:?}: relative error {err:.1e}", entry.name);
            let bound = if key.elem == Elem::F32 { 1e-5 } else { 1e-2 };
            assert!(err < bound, "{} band {band:?}: {err}", entry.name);
            ran += 1;
        }
    }
    assert!(ran >= 4, "{ran} memory-efficient runs");
}

/// A query row that sees no key (its boolean mask row all false) gives 0 on the
/// memory-efficient kernels too, as the contract says for every backend.
#[test]
fn a_fully_masked_row_gives_zeros_in_the_interpreter() {
    for entry in ENTRIES.iter() {
        let KernelKey::MemEffFwd(key) = entry.key else {
            continue;
        };
        if entry.cuda.is_none() || key.mask != backends::kernels::MaskKind::Bool {
            continue;
        }
        let (lq, lk, d) = (5, 9, 16);
        // Row 2 sees nothing; every other row sees every key.
        let keep: Vec<bool> = (0..lq * lk).map(|e| e / lk != 2).collect();
        let Some((got, want)) =
            attention_in_interpreter(entry.key, (1, 1, lq, lk, d), None, Some(Mask::Keep(&keep)))
        else {
            eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
            return;
        };
        let row = &got[2 * d..3 * d];
        assert!(row.iter().all(|&x| x == 0.0), "{}: {row:?}", entry.name);
        let (got_rest, want_rest): (Vec<f64>, Vec<f64>) = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(e, _)| e / d != 2)
            .map(|(_, (g, w))| (*g, *w))
            .unzip();
        let bound = if key.elem == Elem::F32 { 1e-5 } else { 1e-2 };
        assert!(rel_err(&got_rest, &want_rest) < bound, "{}", entry.name);
    }
}

/// Dropout inside the kernels decides every weight as the host does: the kernels, run from
/// the shipped PTX with the key of a generator's draw, match the CPU math path drawing from
/// a generator at the same seed (same weights kept, same 1 / (1 - p) scale).
#[test]
fn dropout_in_the_kernels_keeps_the_weights_the_host_keeps() {
    use backends::attention::{SdpBackend, sdpa_kernel_scoped};
    use backends::{Generator, SdpaOptions, Tensor};
    let (h, hk, lq, lk, d) = (2, 2, 17, 17, 32);
    let flash_bf16 = KernelKey::FlashFwd(backends::kernels::FlashKey {
        elem: Elem::Bf16,
        head_dim: 32,
        causal: false,
    });
    let mem_eff_f32 = ENTRIES
        .iter()
        .find(|e| {
            matches!(e.key, KernelKey::MemEffFwd(m)
                if m.elem == Elem::F32 && m.mask == backends::kernels::MaskKind::None)
        })
        .map(|e| e.key)
        .expect("a memory-efficient f32 variant");
    for (key, bound) in [(flash_bf16, 1e-2), (mem_eff_f32, 1e-5)] {
        let elem = attention_elem(key);
        let (q, k, v) = (random(h * lq * d), random(hk * lk * d), random(hk * lk * d));
        let p = 0.3;
        let seed = 1234;
        let draw = Generator::new(seed).draw((h * lq * lk) as u64);
        let Some(got) = run_attention(
            key,
            (h, hk, lq, lk, d),
            None,
            None,
            Some((p, draw.key())),
            [&q, &k, &v],
        ) else {
            eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
            return;
        };
        let dtype = DType::from(elem);
        let tensor = |x: &[f64], heads: usize, len: usize| {
            Tensor::from_f64(x, &[1, heads, len, d], dtype, backends::Device::Cpu).unwrap()
        };
        let generator = Generator::new(seed);
        let want = {
            let _math = sdpa_kernel_scoped(&[SdpBackend::Math], false);
            backends::sdpa(
                &tensor(&q, h, lq),
                &tensor(&k, hk, lk),
                &tensor(&v, hk, lk),
                &SdpaOptions {
                    dropout_p: p,
                    generator: Some(&generator),
                    ..SdpaOptions::default()
                },
            )
            .unwrap()
            .output
            .to_f64()
            .unwrap()
        };
        let err = rel_err(&got, &want);
        eprintln!("{key:?} with dropout: relative error {err:.1e}");
        assert!(err < bound, "{key:?}: {err}");
        // And the draw mattered: without dropout the output is far from it.
        let plain = run_attention(key, (h, hk, lq, lk, d), None, None, None, [&q, &k, &v]).unwrap();
        assert!(rel_err(&plain, &want) > 10.0 * bound.max(1e-3), "{key:?}");
    }
}
