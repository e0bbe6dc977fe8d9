#!/usr/bin/env bash
# Side by side with PyTorch on the same inputs: every `backends::linalg` op on fresh random
# f64 batches (square and rectangular, SPD where the op needs it, singular and indefinite
# ones for the errors; LU, inverse, Cholesky and QR of single matrices of order >= 512 too,
# which are factored in panels on the library's threads), through examples/linalg_io.rs,
# against torch.linalg. Results that are unique are compared directly (inv, cholesky,
# lu_factor's LU and pivots, lu's P/L/U, eigenvalues, singular values, solves); the others
# up to what fixes them (QR's and the singular vectors' signs, eigenvectors' signs): R and Q
# with diag(R) >= 0, |Vᵀ V_torch| = I.
# Errors must agree: both sides refuse the same inputs. Prints one line per check and
# exits non-zero on a mismatch.
#
# Installs numpy and torch into .venv/ on first use (as scripts/compare.sh does).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -c "import numpy, torch" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check numpy torch
cargo build -q --release --example linalg_io
.venv/bin/python - <<'PY'
import json, subprocess, sys
import torch

ours = subprocess.Popen(["target/release/examples/linalg_io"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)
torch.manual_seed(0)
failures = 0

def call(op, a, b=None, **flags):
    request = {"op": op, "a": {"shape": list(a.shape), "data": a.flatten().tolist()}, **flags}
    if b is not None:
        request["b"] = {"shape": list(b.shape), "data": b.flatten().tolist()}
    ours.stdin.write(json.dumps(request) + "\n"); ours.stdin.flush()
    answer = json.loads(ours.stdout.readline())
    if "error" in answer:
        return answer["error"]
    return [torch.tensor(o["data"], dtype=torch.float64).reshape(o["shape"]) for o in answer["outputs"]]

def check(name, ok, detail=""):
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")

def close(x, y, tol=1e-10):
    return x.shape == y.shape and (x - y).abs().max().item() <= tol * max(1.0, y.abs().max().item())

def spd(*batch, n):
    m = torch.randn(*batch, n, n, dtype=torch.float64)
    return m @ m.mT + n * torch.eye(n, dtype=torch.float64)

def positive_diag_qr(q, r):
    k = min(r.shape[-2], r.shape[-1])
    sign = torch.sign(torch.diagonal(r[..., :k, :], dim1=-2, dim2=-1))
    sign[sign == 0] = 1
    return q[..., :, :k] * sign.unsqueeze(-2), r[..., :k, :] * sign.unsqueeze(-1)

square = torch.randn(2, 3, 6, 6, dtype=torch.float64)
tall, wide = torch.randn(2, 7, 4, dtype=torch.float64), torch.randn(2, 4, 7, dtype=torch.float64)
sym = square + square.mT
a_spd = spd(2, 3, n=6)

check("inv", close(call("inv", square)[0], torch.linalg.inv(square)))
for upper in (False, True):
    check(f"cholesky upper={upper}", close(call("cholesky", a_spd, upper=upper)[0],
                                           torch.linalg.cholesky(a_spd, upper=upper)))
    factor = torch.linalg.cholesky(a_spd, upper=upper)
    check(f"cholesky_inverse upper={upper}", close(call("cholesky_inverse", factor, upper=upper)[0],
                                                   torch.cholesky_inverse(factor, upper=upper)))
    rhs = torch.randn(2, 3, 6, 2, dtype=torch.float64)
    check(f"cholesky_solve upper={upper}", close(call("cholesky_solve", factor, rhs, upper=upper)[0],
                                                 torch.cholesky_solve(rhs, factor, upper=upper)))
for name, a in (("square", square), ("tall", tall), ("wide", wide)):
    lu, pivots = call("lu_factor", a)
    t_lu, t_pivots = torch.linalg.lu_factor(a)
    check(f"lu_factor {name}", close(lu, t_lu) and torch.equal(pivots.to(torch.int32), t_pivots))
    p, l, u = call("lu", a)
    t_p, t_l, t_u = torch.linalg.lu(a)
    check(f"lu {name}", close(p, t_p) and close(l, t_l) and close(u, t_u))
# One matrix of order 512 or more: factored in panels on the library's threads.
for name, shape in (("large square", (700, 700)), ("large tall", (900, 530)), ("large wide", (530, 820))):
    a = torch.randn(*shape, dtype=torch.float64)
    lu, pivots = call("lu_factor", a)
    t_lu, t_pivots = torch.linalg.lu_factor(a)
    check(f"lu_factor {name}", close(lu, t_lu, 1e-9) and torch.equal(pivots.to(torch.int32), t_pivots))
big = torch.randn(700, 700, dtype=torch.float64)
check("inv large", close(call("inv", big)[0], torch.linalg.inv(big), 1e-9))
big_spd = spd(n=700)
for upper in (False, True):
    check(f"cholesky large upper={upper}", close(call("cholesky", big_spd, upper=upper)[0],
                                                 torch.linalg.cholesky(big_spd, upper=upper)))
big_spd[400, 400] = -1
ours_error = call("cholesky", big_spd)
try:
    torch.linalg.cholesky(big_spd); torch_error = None
except Exception as e:
    torch_error = str(e)
check("cholesky large refuses", isinstance(ours_error, str) and torch_error is not None
      and ours_error.split(";")[0].split(": ", 1)[1] in torch_error, f"(ours: {ours_error})")
rhs = torch.randn(1, 6, 3, dtype=torch.float64)
check("lu_solve (B broadcast)", close(call("lu_solve", square[0], rhs)[0],
                                      torch.linalg.lu_solve(*torch.linalg.lu_factor(square[0]), rhs)))
for left in (True, False):
    for adjoint in (False, True):
        b = rhs if left else rhs.mT
        check(f"lu_solve left={left} adjoint={adjoint}",
              close(call("lu_solve", square[0], b, left=left, adjoint=adjoint)[0],
                    torch.linalg.lu_solve(*torch.linalg.lu_factor(square[0]), b, left=left, adjoint=adjoint)))
for name, a in (("square", square), ("tall", tall), ("wide", wide)):
    for mode in ("reduced", "complete", "r"):
        q, r = call("qr", a, mode=mode)
        t_q, t_r = torch.linalg.qr(a, mode=mode)
        if mode == "r":
            ok = q.numel() == 0 and t_q.numel() == 0 and close(r.abs(), t_r.abs())
        else:
            (q1, r1), (q2, r2) = positive_diag_qr(q, r), positive_diag_qr(t_q, t_r)
            ok = q.shape == t_q.shape and r.shape == t_r.shape and close(q1, q2) and close(r1, r2)
        check(f"qr {name} {mode}", ok)
# One matrix whose smaller side is 512 or more: QR in panels, Q formed a block of columns
# per thread.
for name, shape, mode in (("large square", (700, 700), "reduced"), ("large tall", (900, 530), "complete"),
                          ("large wide", (530, 820), "reduced")):
    a = torch.randn(*shape, dtype=torch.float64)
    q, r = call("qr", a, mode=mode)
    (q1, r1), (q2, r2) = positive_diag_qr(q, r), positive_diag_qr(*torch.linalg.qr(a, mode=mode))
    ok = close(q1, q2, 1e-9) and close(r1, r2, 1e-9)
    if mode == "complete":  # the columns past min(m, n) are a basis of the complement
        ok = ok and q.shape == (shape[0], shape[0]) and close(q.mT @ q, torch.eye(shape[0], dtype=torch.float64), 1e-9)
    check(f"qr {name} {mode}", ok)
for upper in (False, True):
    w, v = call("eigh", sym, upper=upper)
    t_w, t_v = torch.linalg.eigh(sym, UPLO="U" if upper else "L")
    overlap = (v.mT @ t_v).abs()
    check(f"eigh upper={upper}", close(w, t_w) and close(overlap, torch.eye(6, dtype=torch.float64).expand_as(overlap), 1e-8))
    check(f"eigvalsh upper={upper}", close(call("eigvalsh", sym, upper=upper)[0], torch.linalg.eigvalsh(sym, UPLO="U" if upper else "L")))
for name, a in (("square", square), ("tall", tall), ("wide", wide)):
    for full in (True, False):
        u, s, vh = call("svd", a, full_matrices=full)
        t_u, t_s, t_vh = torch.linalg.svd(a, full_matrices=full)
        k = s.shape[-1]
        # Singular vectors up to sign: each pair (u_i, v_i) may flip together.
        flips = torch.sign((u[..., :, :k] * t_u[..., :, :k]).sum(-2))
        ok = (u.shape == t_u.shape and vh.shape == t_vh.shape and close(s, t_s)
              and close(u[..., :, :k] * flips.unsqueeze(-2), t_u[..., :, :k], 1e-8)
              and close(vh[..., :k, :] * flips.unsqueeze(-1), t_vh[..., :k, :], 1e-8))
        check(f"svd {name} full={full}", ok)
    check(f"svdvals {name}", close(call("svdvals", a)[0], torch.linalg.svdvals(a)))

# The same inputs refused on both sides, with PyTorch's message.
singular = square.clone(); singular[1, 2, :, 3] = 0
not_pd = a_spd.clone(); not_pd[0, 1, 1, 1] = -1
for op, a, t_call in (("inv", singular, torch.linalg.inv),
                      ("cholesky", not_pd, torch.linalg.cholesky),
                      ("lu_factor", singular, torch.linalg.lu_factor)):
    ours_error = call(op, a)
    try:
        t_call(a); torch_error = None
    except Exception as e:
        torch_error = str(e)
    same = isinstance(ours_error, str) and torch_error is not None and ours_error.split(";")[0] in torch_error
    check(f"{op} refuses", same, f"(ours: {ours_error if isinstance(ours_error, str) else 'no error'})")

print(f"{failures} mismatches")
sys.exit(1 if failures else 0)
PY
