//! Runs `backends::linalg` on matrices given as JSON, one call per line of stdin, and prints
//! each call's outputs (or its error) as one JSON line: the Rust side of
//! `scripts/linalg-vs-torch.sh`, which checks the results against PyTorch's on the same
//! inputs.
//!
//! A line: `{"op": "qr", "a": {"shape": [2, 5, 3], "data": [...]}, "b": {...},
//! "upper": false, "mode": "reduced", "full_matrices": true, "left": true, "adjoint": false}`
//! (`b` for the solves, the flags where the op takes them); f64 throughout. The answer: `{"outputs": [{"shape": [...],
//! "data": [...]}, ...]}` in PyTorch's order, or `{"error": "..."}`.

use std::io::{BufRead, Write};

use backends::linalg::{self, LuFactor, QrMode};
use backends::{DType, Device, Tensor};
use serde_json::{Value, json};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn tensor(value: &Value) -> Result<Tensor> {
    let shape: Vec<usize> = serde_json::from_value(value["shape"].clone())?;
    let data: Vec<f64> = serde_json::from_value(value["data"].clone())?;
    Ok(Tensor::from_f64(&data, &shape, DType::F64, Device::Cpu)?)
}

fn json_of(t: &Tensor) -> Result<Value> {
    Ok(json!({ "shape": t.shape(), "data": t.to_f64()? }))
}

fn call(line: &Value) -> Result<Vec<Tensor>> {
    let a = tensor(&line["a"])?;
    let upper = line["upper"].as_bool().unwrap_or(false);
    Ok(match line["op"].as_str().unwrap_or_default() {
        "inv" => vec![linalg::inv(&a)?],
        "cholesky" => vec![linalg::cholesky(&a, upper)?],
        "cholesky_inverse" => vec![linalg::cholesky_inverse(&a, upper)?],
        "cholesky_solve" => vec![linalg::cholesky_solve(&tensor(&line["b"])?, &a, upper)?],
        "lu_factor" => {
            let LuFactor { lu, pivots } = linalg::lu_factor(&a)?;
            vec![lu, pivots]
        }
        "lu" => {
            let lu = linalg::lu(&a)?;
            vec![lu.p, lu.l, lu.u]
        }
        "lu_solve" => vec![linalg::lu_solve(
            &linalg::lu_factor(&a)?,
            &tensor(&line["b"])?,
            line["left"].as_bool().unwrap_or(true),
            line["adjoint"].as_bool().unwrap_or(false),
        )?],
        "qr" => {
            let mode = match line["mode"].as_str() {
                Some("complete") => QrMode::Complete,
                Some("r") => QrMode::R,
                _ => QrMode::Reduced,
            };
            let qr = linalg::qr(&a, mode)?;
            vec![qr.q, qr.r]
        }
        "eigh" => {
            let e = linalg::eigh(&a, upper)?;
            vec![e.eigenvalues, e.eigenvectors]
        }
        "eigvalsh" => vec![linalg::eigvalsh(&a, upper)?],
        "svd" => {
            let s = linalg::svd(&a, line["full_matrices"].as_bool().unwrap_or(true))?;
            vec![s.u, s.s, s.vh]
        }
        "svdvals" => vec![linalg::svdvals(&a)?],
        other => return Err(format!("no linalg op {other:?}").into()),
    })
}

fn main() -> Result<()> {
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let request: Value = serde_json::from_str(&line?)?;
        let answer = match call(&request) {
            Ok(outputs) => {
                json!({ "outputs": outputs.iter().map(json_of).collect::<Result<Vec<_>>>()? })
            }
            Err(e) => json!({ "error": e.to_string() }),
        };
        let mut out = stdout.lock();
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}
