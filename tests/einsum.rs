//! einsum against a naive float64 sum over every label, path costs for known cases, the
//! strategies, and errors.

mod common;

use backends::opt_einsum::{self, Strategy};
use backends::{DType, Device, Error, Tensor, einsum, einsum_path};
use common::{adapter, random, rel_err};

/// The naive sum: every assignment of every label, the product of the operands' values.
/// `equation` is explicit (`->`), letters only.
fn naive(equation: &str, values: &[Vec<f64>], shapes: &[Vec<usize>]) -> Vec<f64> {
    let (lhs, out) = equation.split_once("->").unwrap();
    let terms: Vec<&str> = lhs.split(',').collect();
    let mut size = std::collections::BTreeMap::new();
    for (t, shape) in terms.iter().zip(shapes) {
        for (c, &n) in t.chars().zip(shape) {
            let e = size.entry(c).or_insert(n);
            *e = (*e).max(n);
        }
    }
    let labels: Vec<char> = size.keys().copied().collect();
    let total: usize = size.values().product();
    let out_len: usize = out.chars().map(|c| size[&c]).product();
    let mut result = vec![0.0; out_len];
    for flat in 0..total {
        let mut at = std::collections::HashMap::new();
        let mut rest = flat;
        for &c in labels.iter().rev() {
            at.insert(c, rest % size[&c]);
            rest /= size[&c];
        }
        let mut product = 1.0;
        for ((t, v), shape) in terms.iter().zip(values).zip(shapes) {
            let mut index = 0;
            for (c, &n) in t.chars().zip(shape) {
                index = index * n + if n == 1 { 0 } else { at[&c] };
            }
            product *= v[index];
        }
        let mut o = 0;
        for c in out.chars() {
            o = o * size[&c] + at[&c];
        }
        result[o] += product;
    }
    result
}

/// Runs `equation` on random operands of `shapes` on `device` and compares with the naive
/// sum of `explicit` (the same contraction spelled with letters only and `->`).
fn check(equation: &str, explicit: &str, shapes: &[&[usize]], device: Device, bound: f64) {
    let values: Vec<Vec<f64>> = shapes.iter().map(|s| random(s.iter().product())).collect();
    let tensors: Vec<Tensor> = values
        .iter()
        .zip(shapes)
        .map(|(v, s)| Tensor::from_f64(v, s, DType::F32, device).unwrap())
        .collect();
    let rounded: Vec<Vec<f64>> = tensors.iter().map(|t| t.to_f64().unwrap()).collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let out = einsum(equation, &refs).unwrap_or_else(|e| panic!("{equation}: {e}"));
    let owned: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
    let expected = naive(explicit, &rounded, &owned);
    let got = out.to_f64().unwrap();
    assert_eq!(got.len(), expected.len(), "{equation}");
    let err = rel_err(&got, &expected);
    assert!(err < bound, "{equation}: relative error {err:e}");
}

const CASES: &[(&str, &str, &[&[usize]])] = &[
    ("ij,jk->ik", "ij,jk->ik", &[&[7, 63], &[63, 9]]),
    ("ij,jk", "ij,jk->ik", &[&[5, 4], &[4, 3]]),
    ("ij,jk,kl->il", "ij,jk,kl->il", &[&[2, 8], &[8, 5], &[5, 3]]),
    (
        "ab,bc,cd,de,ef->af",
        "ab,bc,cd,de,ef->af",
        &[&[3, 4], &[4, 5], &[5, 2], &[2, 6], &[6, 3]],
    ),
    ("bij,bjk->bik", "bij,bjk->bik", &[&[3, 4, 5], &[3, 5, 6]]),
    (
        "bij , bjk -> bki",
        "bij,bjk->bki",
        &[&[2, 4, 5], &[2, 5, 3]],
    ),
    ("ii->i", "ii->i", &[&[6, 6]]),
    ("ii->", "ii->", &[&[6, 6]]),
    ("ii", "ii->", &[&[5, 5]]),
    ("iji->j", "iji->j", &[&[3, 4, 3]]),
    ("ij->ji", "ij->ji", &[&[3, 7]]),
    ("ba", "ba->ab", &[&[3, 4]]),
    ("i,j->ij", "i,j->ij", &[&[4], &[5]]),
    ("i,i->", "i,i->", &[&[129], &[129]]),
    ("ij,ij->ij", "ij,ij->ij", &[&[4, 5], &[4, 5]]),
    ("ij,ij->", "ij,ij->", &[&[4, 5], &[4, 5]]),
    (
        "ijk,jl,lk->i",
        "ijk,jl,lk->i",
        &[&[3, 4, 5], &[4, 2], &[2, 5]],
    ),
    ("ij,kl->ijkl", "ij,kl->ijkl", &[&[2, 3], &[2, 2]]),
    ("ab,a->b", "ab,a->b", &[&[1, 4], &[3]]),
    (
        "...ij,...jk->...ik",
        "aij,ajk->aik",
        &[&[3, 4, 5], &[3, 5, 2]],
    ),
    (
        "...ij,jk->...ik",
        "abij,jk->abik",
        &[&[2, 3, 4, 5], &[5, 2]],
    ),
    ("...j,j", "abj,j->ab", &[&[2, 3, 4], &[4]]),
    ("i...->...", "iab->ab", &[&[3, 2, 4]]),
    ("...ij,...jk", "aij,ajk->aik", &[&[1, 2, 3], &[4, 3, 2]]),
];

#[test]
fn einsum_matches_the_naive_sum_on_cpu() {
    for &(equation, explicit, shapes) in CASES {
        check(equation, explicit, shapes, Device::Cpu, 1e-5);
    }
}

#[test]
fn einsum_matches_without_path_optimisation_and_with_every_strategy() {
    let chain: &[&[usize]] = &[&[3, 4], &[4, 5], &[5, 2], &[2, 6], &[6, 3]];
    for strategy in [Strategy::Optimal, Strategy::Greedy, Strategy::Auto] {
        let _s = opt_einsum::flags_scoped(Some(true), Some(strategy));
        check(
            "ab,bc,cd,de,ef->af",
            "ab,bc,cd,de,ef->af",
            chain,
            Device::Cpu,
            1e-5,
        );
    }
    let _off = opt_einsum::flags_scoped(Some(false), None);
    check(
        "ab,bc,cd,de,ef->af",
        "ab,bc,cd,de,ef->af",
        chain,
        Device::Cpu,
        1e-5,
    );
}

#[test]
fn einsum_runs_its_gemms_on_wgpu() {
    let Some(device) = adapter() else { return };
    check(
        "bij,bjk->bik",
        "bij,bjk->bik",
        &[&[3, 17, 33], &[3, 33, 9]],
        device,
        1e-5,
    );
    check(
        "ij,jk,kl->il",
        "ij,jk,kl->il",
        &[&[2, 8], &[8, 5], &[5, 3]],
        device,
        1e-5,
    );
}

#[test]
fn numpy_documented_path_and_cost() {
    // numpy's einsum_path docs: a (2, 2), b (2, 5), c (5, 2); greedy gives (1, 2), (0, 1)
    // and an optimized FLOP count of 56.
    let shapes: &[&[usize]] = &[&[2, 2], &[2, 5], &[5, 2]];
    for strategy in [Strategy::Greedy, Strategy::Optimal, Strategy::Auto] {
        let _s = opt_einsum::flags_scoped(Some(true), Some(strategy));
        let p = einsum_path("ij,jk,kl->il", shapes).unwrap();
        assert_eq!(p.path, [vec![1, 2], vec![0, 1]], "{strategy}");
        assert_eq!(p.optimized_flops, 56);
        assert_eq!(p.largest_intermediate, 4);
    }
    let _off = opt_einsum::flags_scoped(Some(false), None);
    let p = einsum_path("ij,jk,kl->il", shapes).unwrap();
    assert_eq!(p.path, [vec![0, 1], vec![0, 1]]);
    // (ij,jk): 2·2·5 = 20, summed: 40; (ik,kl): 2·5·2 = 20, summed: 40.
    assert_eq!(p.optimized_flops, 80);
    assert_eq!(p.largest_intermediate, 10);
    // All at once: 2·2·5·2 = 40, times max(1, 3 - 1) + 1.
    assert_eq!(p.naive_flops, 120);
}

#[test]
fn single_operands_and_outer_products_cost_as_opt_einsum_counts() {
    let p = einsum_path("ii->", &[&[4, 4]]).unwrap();
    assert_eq!(p.path, [vec![0]]);
    let p = einsum_path("i,j->ij", &[&[3], &[5]]).unwrap();
    assert_eq!(p.path, [vec![0, 1]]);
    assert_eq!(
        p.optimized_flops, 15,
        "nothing is summed: one product per element"
    );
}

/// A small deterministic generator for random contraction problems.
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn optimal_is_never_worse_than_greedy_and_sometimes_better() {
    let letters: Vec<char> = "abcdefgh".chars().collect();
    let mut state = 7u64;
    let mut better = None;
    for _ in 0..300 {
        let terms: Vec<String> = (0..4)
            .map(|_| {
                let n = 1 + lcg(&mut state) as usize % 3;
                let mut t: Vec<char> = Vec::new();
                while t.len() < n {
                    let c = letters[lcg(&mut state) as usize % letters.len()];
                    if !t.contains(&c) {
                        t.push(c);
                    }
                }
                t.into_iter().collect()
            })
            .collect();
        let sizes: Vec<usize> = (0..letters.len())
            .map(|_| 2 + lcg(&mut state) as usize % 9)
            .collect();
        let shapes: Vec<Vec<usize>> = terms
            .iter()
            .map(|t| {
                t.chars()
                    .map(|c| sizes[(c as u8 - b'a') as usize])
                    .collect()
            })
            .collect();
        let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
        let equation = format!("{}->a", terms.join(","));
        if !equation.split("->").next().unwrap().contains('a') {
            continue;
        }
        let cost = |strategy| {
            let _s = opt_einsum::flags_scoped(Some(true), Some(strategy));
            einsum_path(&equation, &shape_refs).unwrap()
        };
        let (optimal, greedy, auto) = (
            cost(Strategy::Optimal),
            cost(Strategy::Greedy),
            cost(Strategy::Auto),
        );
        assert!(
            optimal.optimized_flops <= greedy.optimized_flops,
            "{equation}"
        );
        assert_eq!(auto, optimal, "auto searches exhaustively up to 4 operands");
        if optimal.optimized_flops < greedy.optimized_flops {
            assert_ne!(optimal.path, greedy.path);
            better.get_or_insert((equation, shapes));
        }
    }
    let (equation, shapes) = better.expect("some problem where greedy is not optimal");
    // And einsum gives the same numbers along either path.
    let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
    for strategy in [Strategy::Optimal, Strategy::Greedy] {
        let _s = opt_einsum::flags_scoped(Some(true), Some(strategy));
        check(&equation, &equation, &shape_refs, Device::Cpu, 1e-5);
    }
}

#[test]
fn bad_equations_and_operands_are_typed_errors() {
    let a = Tensor::full(1f32, &[2, 3], Device::Cpu).unwrap();
    let b = Tensor::full(1f32, &[4, 5], Device::Cpu).unwrap();
    let h = Tensor::full(half::bf16::ONE, &[3, 5], Device::Cpu).unwrap();
    let shape_mismatch = einsum("ij,jk->ik", &[&a, &b]).unwrap_err();
    assert!(
        matches!(shape_mismatch, Error::ShapeMismatch { .. }),
        "{shape_mismatch}"
    );
    assert!(
        shape_mismatch.to_string().contains("label j has size 3"),
        "{shape_mismatch}"
    );
    for (equation, operands, needle) in [
        ("ij->k", vec![&a], "output label k is in no operand"),
        ("ij,jk->ik", vec![&a], "2 operand terms but 1 operands"),
        ("ij->i->j", vec![&a], "`->` appears twice"),
        ("i1->i", vec![&a], "'1' is not a label"),
        ("ij->ii", vec![&a], "output label i appears twice"),
        ("i......->i", vec![&a], "`...` twice"),
    ] {
        let err = einsum(equation, &operands).unwrap_err();
        assert!(err.to_string().contains(needle), "{equation}: {err}");
    }
    let rank = einsum("ijk->i", &[&a]).unwrap_err();
    assert!(matches!(rank, Error::ShapeMismatch { .. }), "{rank}");
    let mix = einsum("ij,jk->ik", &[&a, &h]).unwrap_err();
    assert!(matches!(mix, Error::DTypeMismatch { .. }), "{mix}");
    assert!(einsum("i", &[]).is_err());
}

#[test]
fn zero_sized_labels_give_empty_or_zero_results() {
    let a = Tensor::full(1f32, &[2, 0], Device::Cpu).unwrap();
    let b = Tensor::full(1f32, &[0, 3], Device::Cpu).unwrap();
    let out = einsum("ij,jk->ik", &[&a, &b]).unwrap();
    assert_eq!(out.shape(), &[2, 3]);
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let empty = einsum("ij->ji", &[&a]).unwrap();
    assert_eq!(empty.shape(), &[0, 2]);
}
