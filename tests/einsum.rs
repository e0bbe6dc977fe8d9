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
    let err = error(&got, &expected, explicit, &rounded, &owned);
    assert!(err < bound, "{equation}: relative error {err:e}");
}

/// ‖got − expected‖ relative to the naive sum of the terms' magnitudes: a sum that
/// cancels (a trace or a dot product near 0) has rounding errors relative to its terms,
/// not to its own small value, in any dtype below f64.
fn error(
    got: &[f64],
    expected: &[f64],
    equation: &str,
    values: &[Vec<f64>],
    shapes: &[Vec<usize>],
) -> f64 {
    let magnitudes: Vec<Vec<f64>> = values
        .iter()
        .map(|v| v.iter().map(|x| x.abs()).collect())
        .collect();
    let scale = naive(equation, &magnitudes, shapes);
    let diff: f64 = got.iter().zip(expected).map(|(g, e)| (g - e).powi(2)).sum();
    let norm: f64 = scale.iter().map(|x| x * x).sum();
    if norm == 0.0 {
        return diff.sqrt();
    }
    (diff / norm).sqrt()
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

/// Operands given as views (a transpose, a narrowed slice, a broadcast), in f64, f32 and
/// bf16: the result keeps the operands' dtype, within that dtype's bound of the naive sum
/// of the same (rounded) values; the batched GEMMs split by batch or within each product.
#[test]
fn einsum_takes_views_and_keeps_the_dtype() {
    let cases: &[(&str, &[&[usize]])] = &[
        ("bhld,bhmd->bhlm", &[&[2, 3, 17, 8], &[2, 3, 19, 8]]),
        ("bn,anm,bm->ba", &[&[5, 6], &[7, 6, 9], &[5, 9]]),
        ("ij,jk,kl->il", &[&[9, 33], &[33, 20], &[20, 7]]),
        ("anm,bm->abn", &[&[4, 6, 9], &[5, 9]]),
        ("nm,anm->a", &[&[6, 9], &[4, 6, 9]]),
        ("ii,ij->j", &[&[7, 7], &[7, 5]]),
    ];
    for dtype in [DType::F64, DType::F32, DType::Bf16] {
        let bound = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        };
        for &(equation, shapes) in cases {
            // Each operand is the transpose of a tensor one column wider than needed,
            // narrowed back: non-contiguous, with an offset of one element.
            let tensors: Vec<Tensor> = shapes
                .iter()
                .map(|shape| {
                    let rank = shape.len();
                    let mut wide: Vec<usize> = shape.to_vec();
                    wide.swap(rank - 2, rank - 1);
                    wide[rank - 1] += 1;
                    let values = random(wide.iter().product());
                    Tensor::from_f64(&values, &wide, dtype, Device::Cpu)
                        .unwrap()
                        .narrow(rank - 1, 1, wide[rank - 1] - 1)
                        .unwrap()
                        .t()
                        .unwrap()
                })
                .collect();
            let values: Vec<Vec<f64>> = tensors.iter().map(|t| t.to_f64().unwrap()).collect();
            let owned: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
            let expected = naive(equation, &values, &owned);
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let out = einsum(equation, &refs).unwrap_or_else(|e| panic!("{equation}: {e}"));
            assert_eq!(out.dtype(), dtype, "{equation}");
            let err = error(&out.to_f64().unwrap(), &expected, equation, &values, &owned);
            assert!(err < bound, "{equation} {dtype}: relative error {err:e}");
        }
    }
    // A broadcast operand (stride 0) and a batch of 8 small products (split by batch).
    let row = Tensor::from_f64(&random(6), &[1, 6], DType::F32, Device::Cpu).unwrap();
    let broadcast = row.expand(&[8, 6]).unwrap();
    let stack = Tensor::from_f64(&random(8 * 6 * 5), &[8, 6, 5], DType::F32, Device::Cpu).unwrap();
    let out = einsum("bi,bij->bj", &[&broadcast, &stack]).unwrap();
    let expected = naive(
        "bi,bij->bj",
        &[broadcast.to_f64().unwrap(), stack.to_f64().unwrap()],
        &[vec![8, 6], vec![8, 6, 5]],
    );
    assert!(rel_err(&out.to_f64().unwrap(), &expected) < 1e-5);
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
fn optimal_is_sometimes_better_than_greedy_and_auto_is_optimal_up_to_4_operands() {
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
        // No `optimal <= greedy` here: opt_einsum's optimal search counts a step as an
        // inner product only when an index both operands hold is summed away, so the cost
        // it reports can exceed greedy's (a,ceg,ecd,ac->a below), and we return its paths.
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
    // A label of size 1 broadcasts against size 0, as in PyTorch.
    let t = |shape: &[usize]| Tensor::full(1f32, shape, Device::Cpu).unwrap();
    let out = einsum("bij,bjk->bik", &[&t(&[0, 4, 5]), &t(&[1, 5, 6])]).unwrap();
    assert_eq!(out.shape(), &[0, 4, 6]);
    let out = einsum("bij,bjk->bik", &[&t(&[1, 4, 5]), &t(&[0, 5, 6])]).unwrap();
    assert_eq!(out.shape(), &[0, 4, 6]);
    for (x, y) in [(&[0][..], &[1][..]), (&[1], &[0])] {
        let out = einsum("i,i->i", &[&t(x), &t(y)]).unwrap();
        assert_eq!(out.shape(), &[0]);
    }
}

// Recorded with opt_einsum 3.4.0 (pip install opt_einsum==3.4.0) from 28 networks: the issue's
// examples, one where its optimal reports more than its greedy, and random ones of 2-9
// operands (sizes 2-9, seeded).
/// (equation, shapes, path, naive flops, optimized flops, largest intermediate) as
/// opt_einsum 3.4.0's `contract_path(..., optimize='auto')` returns them.
/// One recorded network: equation, shapes, path, naive, optimized, largest intermediate.
type Recorded = (
    &'static str,
    &'static [&'static [usize]],
    &'static [&'static [usize]],
    u128,
    u128,
    u128,
);

const OPT_EINSUM_AUTO: &[Recorded] = &[
    // opt_einsum's optimal reports more than its greedy (6117) here.
    (
        "a,ceg,ecd,ac->a",
        &[&[9], &[6, 5, 10], &[5, 6, 10], &[9, 6]],
        &[&[0, 1], &[0, 1], &[0, 1]],
        108000,
        11340,
        270,
    ),
    (
        "ab,cd,ef->acdf",
        &[&[2, 3], &[4, 5], &[6, 7]],
        &[&[0, 2], &[0, 1]],
        10080,
        784,
        280,
    ),
    (
        "ij,ij,ij->ij",
        &[&[3, 5], &[3, 5], &[3, 5]],
        &[&[0, 1], &[0, 1]],
        45,
        30,
        15,
    ),
    ("ii->", &[&[7, 7]], &[&[0]], 7, 14, 1),
    (
        "abhe,hidj,jgba,hiab,gab->ed",
        &[
            &[5, 6, 7, 8],
            &[7, 9, 3, 4],
            &[4, 2, 6, 5],
            &[7, 9, 5, 6],
            &[2, 5, 6],
        ],
        &[&[2, 4], &[2, 3], &[1, 2], &[0, 1]],
        1814400,
        63480,
        7560,
    ),
    (
        "ab,a,cba,cab->",
        &[&[4, 6], &[4], &[6, 6, 4], &[6, 4, 6]],
        &[&[2, 3], &[0, 2], &[0, 1]],
        576,
        344,
        24,
    ),
    (
        "ec,egc,gah,cafh->fg",
        &[&[2, 8], &[2, 2, 8], &[2, 8, 9], &[8, 8, 9, 9]],
        &[&[0, 1], &[0, 1], &[0, 1]],
        82944,
        21088,
        144,
    ),
    ("a,acb->b", &[&[2], &[2, 8, 9]], &[&[0, 1]], 288, 288, 9),
    (
        "fc,cb,fe,b->bf",
        &[&[4, 3], &[3, 5], &[4, 2], &[5]],
        &[&[0, 2], &[0, 1], &[0, 1]],
        480,
        183,
        20,
    ),
    (
        "fe,a,abgc,g,fabg,dgc->cef",
        &[
            &[7, 4],
            &[8],
            &[8, 8, 7, 9],
            &[7],
            &[7, 8, 8, 7],
            &[7, 7, 9],
        ],
        &[&[3, 5], &[1, 3], &[1, 2], &[1, 2], &[0, 1]],
        4741632,
        64750,
        4032,
    ),
    (
        "ecaf,ec,cagd,c,eadf,gdb,cebg,dgae,f->abc",
        &[
            &[2, 2, 5, 3],
            &[2, 2],
            &[2, 5, 9, 4],
            &[2],
            &[2, 5, 4, 3],
            &[9, 4, 6],
            &[2, 2, 6, 9],
            &[4, 9, 5, 2],
            &[3],
        ],
        &[
            &[0, 1],
            &[6, 7],
            &[1, 6],
            &[0, 4],
            &[0, 3],
            &[2, 3],
            &[0, 1],
            &[0, 1],
        ],
        116640,
        11604,
        864,
    ),
    ("e,f->", &[&[8], &[7]], &[&[0, 1]], 56, 112, 1),
    (
        "af,h,cd,hb,ihab,hcfb,cge,hfeg->",
        &[
            &[3, 5],
            &[4],
            &[8, 3],
            &[4, 5],
            &[9, 4, 3, 5],
            &[4, 8, 5, 5],
            &[8, 6, 5],
            &[4, 5, 5, 6],
        ],
        &[
            &[1, 3],
            &[2, 6],
            &[1, 3],
            &[0, 3],
            &[0, 3],
            &[0, 1],
            &[0, 1],
        ],
        15552000,
        14660,
        240,
    ),
    (
        "acb,bc,ca,c->",
        &[&[8, 3, 2], &[2, 3], &[3, 8], &[3]],
        &[&[0, 2], &[0, 2], &[0, 1]],
        192,
        114,
        6,
    ),
    (
        "dbca,cbd,a,da,b,b->",
        &[&[5, 8, 7, 7], &[7, 8, 5], &[7], &[5, 7], &[8], &[8]],
        &[&[0, 1], &[2, 3], &[0, 1], &[0, 2], &[0, 1]],
        11760,
        4539,
        280,
    ),
    (
        "bcd,dbca->cd",
        &[&[4, 2, 7], &[7, 4, 2, 6]],
        &[&[0, 1]],
        672,
        672,
        14,
    ),
    (
        "badc,ad,bac,bac->abd",
        &[&[7, 7, 5, 7], &[7, 5], &[7, 7, 7], &[7, 7, 7]],
        &[&[2, 3], &[0, 1], &[0, 1]],
        6860,
        5488,
        1715,
    ),
    (
        "cba,b,ac,acb,a,acb,cab,bca->",
        &[
            &[3, 4, 3],
            &[4],
            &[3, 3],
            &[3, 3, 4],
            &[3],
            &[3, 3, 4],
            &[3, 3, 4],
            &[4, 3, 3],
        ],
        &[
            &[0, 3],
            &[3, 4],
            &[3, 4],
            &[3, 4],
            &[0, 3],
            &[0, 1],
            &[0, 1],
        ],
        288,
        243,
        36,
    ),
    (
        "cbad,ba,bda,ac,d->cd",
        &[&[2, 3, 9, 2], &[3, 9], &[3, 2, 9], &[9, 2], &[2]],
        &[&[1, 2], &[0, 1], &[0, 1], &[0, 1]],
        540,
        432,
        108,
    ),
    (
        "gbha,d,eh,hf,cebd->dfgh",
        &[&[2, 7, 3, 6], &[2], &[2, 3], &[3, 6], &[3, 2, 7, 2]],
        &[&[0, 2], &[0, 2], &[1, 2], &[0, 1]],
        90720,
        1584,
        84,
    ),
    (
        "ba,cba,c,c->",
        &[&[2, 2], &[3, 2, 2], &[3], &[3]],
        &[&[0, 1], &[0, 1], &[0, 1]],
        48,
        33,
        3,
    ),
    (
        "ca,c,a,a,b,c,cb,ba,ba->",
        &[
            &[9, 2],
            &[9],
            &[2],
            &[2],
            &[7],
            &[9],
            &[9, 7],
            &[7, 2],
            &[7, 2],
        ],
        &[
            &[1, 5],
            &[5, 6],
            &[0, 5],
            &[2, 4],
            &[0, 1],
            &[2, 3],
            &[0, 1],
            &[0, 1],
        ],
        1134,
        351,
        18,
    ),
    (
        "cba,b,cb,a,acb->ab",
        &[&[7, 6, 4], &[6], &[7, 6], &[4], &[4, 7, 6]],
        &[&[0, 4], &[0, 1], &[1, 2], &[0, 1]],
        840,
        570,
        168,
    ),
    (
        "a,bg,b,d,gfa,a,fg->f",
        &[&[8], &[7, 2], &[7], &[9], &[2, 7, 8], &[8], &[7, 2]],
        &[&[1, 2], &[0, 3], &[1, 4], &[1, 3], &[1, 2], &[0, 1]],
        49392,
        428,
        14,
    ),
    (
        "cb,bda->abc",
        &[&[3, 2], &[2, 8, 4]],
        &[&[0, 1]],
        384,
        384,
        24,
    ),
    (
        "gdb,g,b,efdh->",
        &[&[3, 7, 9], &[3], &[9], &[7, 4, 7, 8]],
        &[&[1, 2], &[0, 2], &[0, 1]],
        169344,
        3541,
        27,
    ),
    (
        "cab,acb,bac,acb->",
        &[&[3, 6, 6], &[6, 3, 6], &[6, 6, 3], &[6, 3, 6]],
        &[&[0, 1], &[0, 1], &[0, 1]],
        432,
        432,
        108,
    ),
    (
        "acdb,cba,bc,dca,a,cda,adbc,dbac->acd",
        &[
            &[4, 9, 5, 6],
            &[9, 6, 4],
            &[6, 9],
            &[5, 9, 4],
            &[4],
            &[9, 5, 4],
            &[4, 5, 6, 9],
            &[5, 6, 4, 9],
        ],
        &[
            &[0, 6],
            &[5, 6],
            &[2, 4],
            &[3, 4],
            &[0, 1],
            &[0, 2],
            &[0, 1],
        ],
        8640,
        6012,
        1080,
    ),
    (
        "acde,be,ebad,ab,ae,bed,c,bae->e",
        &[
            &[6, 6, 4, 8],
            &[9, 8],
            &[8, 9, 6, 4],
            &[6, 9],
            &[6, 8],
            &[9, 8, 4],
            &[6],
            &[9, 6, 8],
        ],
        &[
            &[1, 5],
            &[0, 4],
            &[0, 4],
            &[3, 4],
            &[0, 2],
            &[0, 2],
            &[0, 1],
        ],
        82944,
        9504,
        1728,
    ),
];

#[test]
fn auto_paths_and_costs_are_opt_einsums() {
    let _auto = opt_einsum::flags_scoped(Some(true), Some(Strategy::Auto));
    for &(equation, shapes, path, naive, optimized, largest) in OPT_EINSUM_AUTO {
        let got = einsum_path(equation, shapes).unwrap();
        let want: Vec<Vec<usize>> = path.iter().map(|p| p.to_vec()).collect();
        assert_eq!(
            (
                got.path,
                got.naive_flops,
                got.optimized_flops,
                got.largest_intermediate
            ),
            (want, naive, optimized, largest),
            "{equation} {shapes:?}"
        );
    }
}
