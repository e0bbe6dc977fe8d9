//! The embedded PTX as the interpreter (`backends-ptx`) reads and runs it: every module of
//! every architecture parses and holds every kernel the dispatch table names, with the
//! parameter list the launchers check against; the kernels the interpreter runs so far
//! (scale, split-K reduction) match a float64 reference.

mod common;

use std::collections::BTreeSet;

use backends::kernels::{
    self, CUDA_MODULES, ENTRIES, Elem, KernelKey, ScaleKey, SplitKReduceKey, lookup,
};
use backends_ptx::{Launch, Memory};
use common::{random, rel_err};

#[test]
fn every_embedded_module_parses_with_every_kernel_of_the_table() {
    if CUDA_MODULES.iter().all(|m| m.ptx.is_empty()) {
        eprintln!("skipped: no PTX is embedded (NVRTC was absent at build time)");
        return;
    }
    let mut opcodes = BTreeSet::new();
    for module in CUDA_MODULES.iter() {
        for &(arch, ptx) in module.ptx {
            let parsed = backends_ptx::parse::parse(ptx)
                .unwrap_or_else(|e| panic!("{} sm_{arch}: {e}", module.family));
            assert_eq!(parsed.target, format!("sm_{arch}"));
            let entries = ENTRIES
                .iter()
                .filter(|e| e.key.family() == module.family && e.cuda.is_some());
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
    let module = backends::kernels::cuda_module(key.family())?;
    let (_, ptx) = module.ptx.iter().find(|(arch, _)| *arch == 80)?;
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
