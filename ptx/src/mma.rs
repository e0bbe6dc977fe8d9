//! Warp-level matrix multiply-accumulate (`mma.sync.aligned.*.row.col`): which lane holds
//! which element of A, B, C and D, written from the PTX ISA's fragment tables ("Matrix
//! Fragments for mma.m16n8k16 with floating point type" and "... for mma.m16n8k8"), and the
//! product itself.

/// The shapes and input types the interpreter runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// m16n8k16 with f16 or bf16 inputs (8 A and 4 B elements per lane, two per register).
    M16N8K16,
    /// m16n8k8 with tf32 inputs (4 A and 2 B elements per lane, one per register).
    M16N8K8,
}

impl Shape {
    /// The K of the product.
    pub fn k(self) -> usize {
        match self {
            Shape::M16N8K16 => 16,
            Shape::M16N8K8 => 8,
        }
    }

    /// A elements per lane.
    pub fn a_per_lane(self) -> usize {
        self.k() / 2
    }

    /// B elements per lane.
    pub fn b_per_lane(self) -> usize {
        self.k() / 4
    }
}

/// `(groupID, threadID_in_group)` of a lane.
fn group(lane: usize) -> (usize, usize) {
    (lane >> 2, lane % 4)
}

/// The `(row, col)` of A (16 x K) that element `i` of `lane` holds.
pub fn a_position(shape: Shape, lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = group(lane);
    match shape {
        Shape::M16N8K16 => {
            let row = if i < 2 || (4..6).contains(&i) {
                g
            } else {
                g + 8
            };
            let col = t * 2 + (i & 1) + if i >= 4 { 8 } else { 0 };
            (row, col)
        }
        Shape::M16N8K8 => {
            let row = if i == 0 || i == 2 { g } else { g + 8 };
            let col = if i < 2 { t } else { t + 4 };
            (row, col)
        }
    }
}

/// The `(row, col)` of B (K x 8) that element `i` of `lane` holds.
pub fn b_position(shape: Shape, lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = group(lane);
    match shape {
        Shape::M16N8K16 => (t * 2 + (i & 1) + if i >= 2 { 8 } else { 0 }, g),
        Shape::M16N8K8 => (if i == 0 { t } else { t + 4 }, g),
    }
}

/// The `(row, col)` of C and D (16 x 8) that element `i` (0..4) of `lane` holds.
pub fn cd_position(lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = group(lane);
    (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1))
}

/// `D = A · B + C` over a warp: `a[lane][i]`, `b[lane][i]`, `c[lane][i]` as the fragments
/// hold them (values already widened to f32); returns `d[lane][i]`. Products and sums in
/// f32, as the tensor cores accumulate.
pub fn multiply(
    shape: Shape,
    a: &[Vec<f32>; 32],
    b: &[Vec<f32>; 32],
    c: &[[f32; 4]; 32],
) -> [[f32; 4]; 32] {
    let k = shape.k();
    let mut am = vec![[0f32; 16]; 16];
    let mut bm = vec![[0f32; 8]; 16];
    let mut cm = [[0f32; 8]; 16];
    for lane in 0..32 {
        for (i, &v) in a[lane].iter().enumerate() {
            let (r, col) = a_position(shape, lane, i);
            am[r][col] = v;
        }
        for (i, &v) in b[lane].iter().enumerate() {
            let (r, col) = b_position(shape, lane, i);
            bm[r][col] = v;
        }
        for (i, &v) in c[lane].iter().enumerate() {
            let (r, col) = cd_position(lane, i);
            cm[r][col] = v;
        }
    }
    let mut d = [[0f32; 4]; 32];
    for (lane, out) in d.iter_mut().enumerate() {
        for (i, slot) in out.iter_mut().enumerate() {
            let (r, col) = cd_position(lane, i);
            *slot = (0..k).fold(cm[r][col], |sum, p| am[r][p].mul_add(bm[p][col], sum));
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of A, B, C/D is held by exactly one (lane, index).
    #[test]
    fn the_fragment_tables_are_bijections() {
        for shape in [Shape::M16N8K16, Shape::M16N8K8] {
            let k = shape.k();
            let mut a = vec![0; 16 * k];
            let mut b = vec![0; k * 8];
            let mut cd = [0; 16 * 8];
            for lane in 0..32 {
                for i in 0..shape.a_per_lane() {
                    let (r, c) = a_position(shape, lane, i);
                    a[r * k + c] += 1;
                }
                for i in 0..shape.b_per_lane() {
                    let (r, c) = b_position(shape, lane, i);
                    b[r * 8 + c] += 1;
                }
                for i in 0..4 {
                    let (r, c) = cd_position(lane, i);
                    cd[r * 8 + c] += 1;
                }
            }
            assert!(a.iter().chain(&b).chain(&cd).all(|&n| n == 1), "{shape:?}");
        }
    }

    /// Index-coded and random matrices scattered into lanes by the tables, multiplied, and
    /// gathered back: the plain product.
    #[test]
    fn the_warp_product_is_the_matrix_product() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut random = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for shape in [Shape::M16N8K16, Shape::M16N8K8] {
            let k = shape.k();
            for coded in [true, false] {
                // Index-coded: small integers (exact in every type), so a misplaced element
                // shows as a wrong value.
                let am: Vec<f32> = (0..16 * k)
                    .map(|e| {
                        if coded {
                            (e % 7) as f32 - 3.0
                        } else {
                            random()
                        }
                    })
                    .collect();
                let bm: Vec<f32> = (0..k * 8)
                    .map(|e| {
                        if coded {
                            (e % 5) as f32 - 2.0
                        } else {
                            random()
                        }
                    })
                    .collect();
                let cm: Vec<f32> = (0..128)
                    .map(|e| if coded { e as f32 } else { random() })
                    .collect();
                let a: [Vec<f32>; 32] = std::array::from_fn(|lane| {
                    (0..shape.a_per_lane())
                        .map(|i| {
                            let (r, c) = a_position(shape, lane, i);
                            am[r * k + c]
                        })
                        .collect()
                });
                let b: [Vec<f32>; 32] = std::array::from_fn(|lane| {
                    (0..shape.b_per_lane())
                        .map(|i| {
                            let (r, c) = b_position(shape, lane, i);
                            bm[r * 8 + c]
                        })
                        .collect()
                });
                let c: [[f32; 4]; 32] = std::array::from_fn(|lane| {
                    std::array::from_fn(|i| {
                        let (r, col) = cd_position(lane, i);
                        cm[r * 8 + col]
                    })
                });
                let d = multiply(shape, &a, &b, &c);
                for (lane, values) in d.iter().enumerate() {
                    for (i, &got) in values.iter().enumerate() {
                        let (r, col) = cd_position(lane, i);
                        let want: f64 = f64::from(cm[r * 8 + col])
                            + (0..k)
                                .map(|p| f64::from(am[r * k + p]) * f64::from(bm[p * 8 + col]))
                                .sum::<f64>();
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "{shape:?} coded {coded}: D[{r}][{col}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }
}
