#!/usr/bin/env bash
# Side by side on this machine, in one run, with the same thread count, every work
# alternating ours and the peer call by call (PAIRS pairs, default 11): our CPU f32 GEMM
# against numpy's own OpenBLAS library loaded into our process
# (examples/gemm_vs_openblas.rs), our bf16 GEMM and our CPU f32 / bf16 attention against
# PyTorch's (oneDNN matmul, CPU scaled_dot_product_attention), whose Python process drives
# ours (examples/paired.rs) line by line. On these noisy VMs both sides then meet the same
# bursts. Prints one table: each side's best, the median of the per-pair ratios (ours /
# theirs in speed: above 1, ours is faster) with its quartiles, and both bests as shares
# of the machine's measured fp32 FMA peak (examples/fma_peak.rs; half of it for the f64
# GEMM rows).
#
# Installs numpy (and, for the PyTorch rows, torch: a large download) into .venv/ from
# PyPI on first use; where torch cannot be installed, those rows show ours alone.
# Usage: scripts/compare.sh            (GEMM n = 1024 2048 4096, SDPA L = 512 1024 2048,
#                                       the rows of issue 21, f64 GEMM, conv2d and linalg)
#        GEMM_SIZES="1024" SDPA_LENGTHS="1024" PAIRS=5 scripts/compare.sh
#        ONLY="linalg|conv2d" scripts/compare.sh   (the rows whose names match the
#                                                   extended regular expression)
#        PEER_SECONDS=120 (default): a PyTorch row whose warm-up call takes longer than
#        this over PAIRS gets fewer pairs (at least one; the row's name says how many),
#        so that PyTorch's bf16 rows on a CPU without bf16 hardware end in minutes
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
read -r -a gemm_sizes <<< "${GEMM_SIZES:-1024 2048 4096}"
read -r -a sdpa_lengths <<< "${SDPA_LENGTHS:-512 1024 2048}"
pairs="${PAIRS:-11}"
only="${ONLY:-}"
peer_budget="${PEER_SECONDS:-120}"
threads="${OMP_NUM_THREADS:-$(nproc)}"
export OMP_NUM_THREADS="$threads"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -c "import numpy, threadpoolctl" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check numpy threadpoolctl
.venv/bin/python -c "import torch" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check torch \
  || echo "(torch could not be installed here: the bf16 GEMM and attention rows have no peer)"
cargo build -q --release --example gemm_vs_openblas --example paired --example fma_peak

peak=$(target/release/examples/fma_peak | awk '{print $4}')
echo "CPU side by side, $threads threads, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "measured fp32 FMA peak: $peak GFLOP/s; $pairs pairs per work, ours and the peer alternating call by call"
echo
row() { # work ours theirs ratio q1 q3 scale (GFLOP/s per unit of ours and theirs; 0: the
         # unit is not FLOPs, no shares of the peak)
  local share_ours="-" share_theirs="-" quartiles="-"
  if [ "$7" != 0 ]; then
    share_ours=$(printf %.2f "$(echo "$2 * $7 / $peak" | bc -l)")
  fi
  if [ "$3" != "n/a" ]; then
    if [ "$7" != 0 ]; then
      share_theirs=$(printf %.2f "$(echo "$3 * $7 / $peak" | bc -l)")
    fi
    quartiles="$5-$6"
  fi
  printf "%-40s %8s %8s %7s %11s %6s %6s\n" "$1" "$2" "$3" "$4" "$quartiles" \
    "$share_ours" "$share_theirs"
}
printf "%-40s %8s %8s %7s %11s %6s %6s\n" work ours peer ratio quartiles ours/pk peer/pk

# f32 GEMM: numpy's OpenBLAS in our process. Its idle threads would spin for 0.1 s after
# each of its calls, on the cores our next call needs: OPENBLAS_THREAD_TIMEOUT=4 makes
# them sleep as ours do. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow a current OpenBLAS down.
read -r openblas_lib openblas_version < <(.venv/bin/python -c "
from threadpoolctl import threadpool_info
import numpy
print(next(i['filepath'] + ' ' + i['version'] for i in threadpool_info() if i['internal_api'] == 'openblas'))" 2>/dev/null || true)
f32_sizes=()
for n in "${gemm_sizes[@]}"; do
  if [ -z "$only" ] || echo "GEMM f32 n=$n vs OpenBLAS (GFLOP/s)" | grep -Eq -- "$only"; then
    f32_sizes+=("$n")
  fi
done
if [ ${#f32_sizes[@]} -eq 0 ]; then
  : # (no f32 GEMM row wanted)
elif [ -n "${openblas_lib:-}" ]; then
  echo "peer of the f32 GEMM rows: OpenBLAS $openblas_version (numpy's)"
  PAIRS="$pairs" OPENBLAS_LIB="$openblas_lib" OPENBLAS_THREAD_TIMEOUT=4 \
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
    target/release/examples/gemm_vs_openblas "${f32_sizes[@]}" \
    | sed 's/[(),:]//g' | while read -r _ n _ ours _ _ theirs _ _ _ ratio _ q1 q3; do
      row "GEMM f32 n=$n vs OpenBLAS (GFLOP/s)" "$ours" "$theirs" "$ratio" "$q1" "$q3" 1
    done
else
  echo "(numpy's OpenBLAS library was not found: no f32 GEMM rows)"
fi

# bf16 GEMM and attention: PyTorch's process drives ours.
.venv/bin/python - "$threads" "$pairs" "$(IFS=,; echo "${gemm_sizes[*]}")" \
  "$(IFS=,; echo "${sdpa_lengths[*]}")" target/release/examples/paired "$only" "$peer_budget" <<'PY' |
import re, subprocess, sys, time
threads, pairs, budget = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[7])
gemm_sizes = [int(n) for n in sys.argv[3].split(",") if n]
sdpa_lengths = [int(n) for n in sys.argv[4].split(",") if n]
try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
except ImportError:
    torch = None
ours = subprocess.Popen([sys.argv[5]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

def ours_call(line):
    ours.stdin.write(line + "\n")
    ours.stdin.flush()
    answer = ours.stdout.readline()
    if not answer:
        sys.exit(f"examples/paired stopped at {line!r}")
    return float(answer)

def theirs_call(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start

def torch_gemm(n, dtype="bfloat16"):
    a, b = (torch.rand(n, n).to(getattr(torch, dtype)) for _ in range(2))
    return lambda: a @ b

def torch_sdpa(dtype, d, l, causal):
    q, k, v = ((torch.rand(2, 16, l, d) * 2 - 1).to(dtype) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

works = [(f"GEMM bf16 n={n} vs oneDNN (GFLOP/s)", f"gemm bf16 {n}", 2 * n**3 / 1e9,
          lambda n=n: torch_gemm(n)) for n in gemm_sizes]
# f64 GEMM (faer's kernels) against PyTorch's BLAS (MKL on x86).
works += [(f"GEMM f64 n={n} vs PyTorch (GFLOP/s)", f"gemm f64 {n}", 2 * n**3 / 1e9,
           lambda n=n: torch_gemm(n, "float64")) for n in (256, 1024)]
digits = lambda name: 3 if name.startswith("SDPA") else 1

def torch_fft(kind, dims):
    if kind == "rfft":
        x = torch.rand(*dims)
        return lambda: torch.fft.rfft(x)
    x = torch.rand(*dims, dtype=torch.complex64)
    return lambda: (torch.fft.fft2 if kind == "fft2" else torch.fft.fft)(x)

def torch_linear(dtype, m, k, n, layout):
    x = torch.rand(m, k).to(dtype)
    w = torch.rand(n, k).to(dtype).t() if layout == "t" else torch.rand(k, n).to(dtype)
    return lambda: x @ w

def torch_decode(dtype, h, hk, lk, d):
    q = (torch.rand(1, h, 1, d) * 2 - 1).to(dtype)
    k, v = ((torch.rand(1, hk, lk, d) * 2 - 1).to(dtype) for _ in range(2))
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hk != h)

# Few rows against a weight (x @ W and x @ W.t(), K = 4096), and decoding attention
# (one query row per head, H = 32, D = 128, with and without GQA).
for name, dtype in (("f32", "float32"), ("bf16", "bfloat16")):
    for m in (1, 8, 32):
        for n in (4096, 11008):
            for layout in ("plain", "t"):
                works.append((f"linear {name} [{m},4096]x{'W.t()' if layout == 't' else 'B'} N={n} (GFLOP/s)",
                              f"linear {name} {m} 4096 {n} {layout}", 2 * m * 4096 * n / 1e9,
                              lambda t=dtype, m=m, n=n, l=layout: torch_linear(getattr(torch, t), m, 4096, n, l)))
    for hk in (32, 8):
        for lk in (512, 2048, 8192):
            works.append((f"decode {name} H=32 Hk={hk} Lk={lk} D=128 (GFLOP/s)",
                          f"decode {name} 32 {hk} {lk} 128", 4 * 32 * lk * 128 / 1e9,
                          lambda t=dtype, hk=hk, lk=lk: torch_decode(getattr(torch, t), 32, hk, lk, 128)))
    # Ours over a paged cache (blocks of 16, table shuffled), PyTorch over the same keys
    # made contiguous.
    works.append((f"paged decode {name} H=32 Hk=8 Lk=8192 D=128 block 16 (GFLOP/s)",
                  f"paged {name} 32 8 8192 128 16", 4 * 32 * 8192 * 128 / 1e9,
                  lambda t=dtype: torch_decode(getattr(torch, t), 32, 8, 8192, 128)))

# FFTs, f32: 5 n log2 n FLOPs per complex transform of n points (half for real input).
import math
for kind, dims in (("rfft", (64, 4096)), ("fft", (64, 4096)), ("fft2", (8, 256, 256)),
                   ("fft", (64, 4099))):
    points = math.prod(dims[-2:]) if kind == "fft2" else dims[-1]
    count = math.prod(dims) // points
    flops = 5 * points * math.log2(points) * count / (2 if kind == "rfft" else 1)
    works.append((f"FFT {kind} {list(dims)} f32 (GFLOP/s)", f"fft f32 {kind} {' '.join(map(str, dims))}",
                  flops / 1e9, lambda k=kind, d=dims: torch_fft(k, d)))
# einsum (the path's GEMM FLOPs) and MHA forward (E = 1024, 16 heads, L = 512, B = 2).
def torch_einsum(equation, shapes):
    operands = [torch.rand(*shape) * 2 - 1 for shape in shapes]
    return lambda: torch.einsum(equation, *operands)

def torch_mha(dtype, n, l, e, h):
    x = ((torch.rand(n, l, e) * 2 - 1) / 8).to(dtype)
    w_in, w_out = ((torch.rand(r, e) * 2 - 1).to(dtype) / e**0.5 for r in (3 * e, e))
    b_in, b_out = (torch.rand(r).to(dtype) for r in (3 * e, e))
    xt = x.transpose(0, 1)  # F.multi_head_attention_forward takes [L, N, E]
    def call():
        with torch.no_grad():
            return F.multi_head_attention_forward(xt, xt, xt, e, h, w_in, b_in, None, None, False,
                                                  0.0, w_out, b_out, training=False,
                                                  need_weights=False)
    return call

for equation, shapes, flops in (
        ("bhld,bhmd->bhlm", ((2, 16, 512, 64), (2, 16, 512, 64)), 2 * 32 * 512 * 512 * 64),
        ("ij,jk,kl->il", ((512, 512),) * 3, 2 * 2 * 512**3),
        ("bn,anm,bm->ba", ((64, 256), (128, 256, 256), (64, 256)),
         2 * 64 * 256 * 128 * 256 + 2 * 64 * 128 * 256)):
    works.append((f"einsum {equation} f32 (GFLOP/s)",
                  f"einsum f32 {equation} {';'.join(','.join(map(str, s)) for s in shapes)}",
                  flops / 1e9, lambda q=equation, s=shapes: torch_einsum(q, s)))
# conv2d (ResNet-like layers; 2 · N · O · H' · W' · C/g · k² FLOPs) against oneDNN, and
# linalg at n = 256 and 1024 (f64; counted as n³ FLOPs, a nominal unit for the ratio)
# against PyTorch's LAPACK, on the matrices examples/paired.rs builds (symmetric,
# diagonally dominant).
def torch_conv(dtype, n, c, hw, o, k, stride, pad, groups):
    x = (torch.rand(n, c, hw, hw) * 2 - 1).to(dtype)
    w = (torch.rand(o, c // groups, k, k) * 2 - 1).to(dtype)
    b = torch.rand(o).to(dtype)
    return lambda: F.conv2d(x, w, b, stride=stride, padding=pad, groups=groups)

for name, dtype, n, c, hw, o, k, stride, pad, groups in (
        ("f32", "float32", 1, 64, 56, 64, 3, 1, 1, 1),
        ("f32", "float32", 16, 64, 56, 64, 3, 1, 1, 1),
        ("f32", "float32", 1, 256, 14, 256, 3, 1, 1, 1),
        ("f32", "float32", 1, 3, 224, 64, 7, 2, 3, 1),
        ("f32", "float32", 1, 256, 56, 64, 1, 1, 0, 1),
        ("f32", "float32", 1, 32, 112, 32, 3, 1, 1, 32),
        ("bf16", "bfloat16", 1, 64, 56, 64, 3, 1, 1, 1)):
    out = (hw + 2 * pad - k) // stride + 1
    flops = 2 * n * o * out * out * (c // groups) * k * k
    works.append((f"conv2d {name} [{n},{c},{hw},{hw}] {k}x{k}/{stride} -> {o} g={groups} (GFLOP/s)",
                  f"conv {name} {n} {c} {hw} {hw} {o} {k} {stride} {pad} {groups}", flops / 1e9,
                  lambda t=dtype, a=(n, c, hw, o, k, stride, pad, groups): torch_conv(getattr(torch, t), *a)))

def torch_linalg(op, size):
    i, j = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    lo, hi = torch.minimum(i, j), torch.maximum(i, j)
    a = ((lo * 7919 + hi * 104729) % 1000).double() / 1000 - 0.5
    a.fill_diagonal_(float(size))
    return {"inv": lambda: torch.linalg.inv(a), "cholesky": lambda: torch.linalg.cholesky(a),
            "lu_factor": lambda: torch.linalg.lu_factor(a), "qr": lambda: torch.linalg.qr(a),
            "eigh": lambda: torch.linalg.eigh(a), "eigvalsh": lambda: torch.linalg.eigvalsh(a),
            "svd": lambda: torch.linalg.svd(a, full_matrices=False),
            "svdvals": lambda: torch.linalg.svdvals(a)}[op]

for op in ("inv", "cholesky", "lu_factor", "qr", "eigh", "eigvalsh", "svd", "svdvals"):
    for size in (256, 1024):
        works.append((f"linalg f64 {op} n={size} (n^3 / s, G)", f"linalg f64 {op} {size}",
                      size**3 / 1e9, lambda op=op, size=size: torch_linalg(op, size)))
for name, dtype in (("f32", "float32"), ("bf16", "bfloat16")):
    n, l, e, h = 2, 512, 1024, 16
    flops = 2 * n * l * e * 4 * e + 4 * n * l * l * e
    works.append((f"MHA {name} E={e} H={h} L={l} B={n} (GFLOP/s)", f"mha {name} {n} {l} {e} {h}",
                  flops / 1e9, lambda t=dtype: torch_mha(getattr(torch, t), n, l, e, h)))
for name, dtype in (("f32", "float32"), ("bf16", "bfloat16")):
    for d in (64, 128):
        for causal in (False, True):
            for l in sdpa_lengths:
                works.append((
                    f"SDPA {name} D={d} L={l}{' causal' if causal else ''} (TFLOP/s)",
                    f"sdpa {name} {d} {l} {int(causal)}",
                    4 * 2 * 16 * l * l * d / (2 if causal else 1) / 1e12,
                    lambda d=d, l=l, c=causal, t=dtype: torch_sdpa(getattr(torch, t), d, l, c)))
# f32 prefill with an additive [B, 1, L, L] mask.
def torch_sdpa_mask(d, l):
    q, k, v = ((torch.rand(2, 16, l, d) * 2 - 1) for _ in range(3))
    mask = torch.rand(2, 1, l, l) * 2 - 1
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
for d in (64, 128):
    for l in sdpa_lengths:
        works.append((f"SDPA f32 D={d} L={l} additive [B,1,L,L] mask (TFLOP/s)",
                      f"sdpa f32 {d} {l} 0 mask", 4 * 2 * 16 * l * l * d / 1e12,
                      lambda d=d, l=l: torch_sdpa_mask(d, l)))
for name, line, work, make in works:
    if sys.argv[6] and not re.search(sys.argv[6], name):
        continue
    theirs = make() if torch else None
    ours_call(line)
    # A peer far slower than us (PyTorch's bf16 GEMM without bf16 hardware: minutes a
    # call at n = 4096) gets fewer pairs: as many as its warm-up call fits in the budget.
    rounds = pairs
    if theirs:
        rounds = min(pairs, max(1, int(budget / max(theirs_call(theirs), 1e-9))))
    ours_times, theirs_times = [], []
    for _ in range(rounds):
        ours_times.append(ours_call(line))
        # Both thread pools go idle (neither spins on the other's cores) before the next call.
        time.sleep(0.02)
        if theirs:
            theirs_times.append(theirs_call(theirs))
            time.sleep(0.02)
    best_ours = work / min(ours_times)
    if not theirs:
        print(f"{name}\t{best_ours:.{digits(name)}f}\tn/a\t-\t-\t-")
        continue
    ratios = sorted(t / o for o, t in zip(ours_times, theirs_times))
    fewer = f" [{rounds} pair{'s' if rounds > 1 else ''}]" if rounds < pairs else ""
    print(f"{name}{fewer}\t{best_ours:.{digits(name)}f}\t{work / min(theirs_times):.{digits(name)}f}"
          f"\t{ratios[rounds // 2]:.2f}"
          f"\t{ratios[rounds // 4]:.2f}\t{ratios[3 * rounds // 4]:.2f}")
ours.stdin.close()
ours.wait()
print(f"peer\tPyTorch {torch.__version__}" if torch else "peer\tnone (torch is missing)")
PY
while IFS=$'\t' read -r name ours theirs ratio q1 q3; do
  case "$name" in
    peer) echo "peer of the bf16 GEMM and attention rows: $ours" ;;
    "GEMM f64"*) row "$name" "$ours" "$theirs" "$ratio" "$q1" "$q3" 2 ;;
    GEMM*|FFT*|linear*|*decode*|einsum*|MHA*|conv2d*) row "$name" "$ours" "$theirs" "$ratio" "$q1" "$q3" 1 ;;
    linalg*) row "$name" "$ours" "$theirs" "$ratio" "$q1" "$q3" 0 ;;
    *) row "$name" "$ours" "$theirs" "$ratio" "$q1" "$q3" 1000 ;;
  esac
done
