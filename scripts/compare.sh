#!/usr/bin/env bash
# Side by side on this machine, in one run, with the same thread count (the best of ROUNDS,
# default 3, alternating rounds, each the median of several runs): our CPU f32 GEMM against
# numpy/OpenBLAS, our bf16 GEMM against PyTorch's (oneDNN), our CPU f32 and bf16 attention
# against PyTorch's CPU scaled_dot_product_attention, and each as a share of the machine's measured
# fp32 FMA peak (examples/fma_peak.rs). Prints one table with ratios (ours / theirs). The
# f32 GEMM is also timed against numpy's OpenBLAS library loaded into our own process
# (examples/gemm_vs_openblas.rs), call for call: the "one process" rows.
#
# Installs numpy (and, for the attention rows, torch: a large download) into .venv/ from
# PyPI on first use; where torch cannot be installed, its rows say so.
# Usage: scripts/compare.sh            (GEMM n = 1024 2048 4096, SDPA L = 512 1024 2048)
#        GEMM_SIZES="1024" SDPA_LENGTHS="1024" ROUNDS=1 scripts/compare.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
read -r -a gemm_sizes <<< "${GEMM_SIZES:-1024 2048 4096}"
read -r -a sdpa_lengths <<< "${SDPA_LENGTHS:-512 1024 2048}"
rounds="${ROUNDS:-3}"
threads="${OMP_NUM_THREADS:-$(nproc)}"
export OMP_NUM_THREADS="$threads"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -c "import numpy, threadpoolctl" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check numpy threadpoolctl
have_torch=yes
.venv/bin/python -c "import torch" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check torch \
  || have_torch=no
cargo build -q --release --example gemm_speed --example gemm_vs_openblas --example sdpa_speed \
  --example fma_peak

peak=$(target/release/examples/fma_peak | awk '{print $4}')
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow a current OpenBLAS down: unset for this command only.
theirs_gemm() {
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$threads" \
  .venv/bin/python - "${gemm_sizes[@]}" <<'PY'
import sys, time
import numpy as np
from threadpoolctl import threadpool_info
for n in map(int, sys.argv[1:]):
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    a @ b
    runs = 5 if n >= 2048 else 10
    times = []
    for _ in range(runs):
        t0 = time.perf_counter(); a @ b; times.append(time.perf_counter() - t0)
    times.sort()
    print(f"f32 {n:5}: {2 * n**3 / times[runs // 2] / 1e9:8.1f} GFLOP/s")
info = [i for i in threadpool_info() if i["internal_api"] == "openblas"]
print("# " + ", ".join(f"openblas {i.get('version')} {i.get('architecture')} x{i['num_threads']}" for i in info))
PY
}
theirs_torch() {
  [ "$have_torch" = yes ] || return 0
  .venv/bin/python - "$threads" "$(IFS=,; echo "${gemm_sizes[*]}")" "${sdpa_lengths[@]}" <<'PY'
import sys, time
import torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]))
for n in map(int, sys.argv[2].split(",")):
    a, b = (torch.rand(n, n).to(torch.bfloat16) for _ in range(2))
    a @ b
    times = []
    for _ in range(5):
        t0 = time.perf_counter(); a @ b; times.append(time.perf_counter() - t0)
    times.sort()
    print(f"bf16 {n:5}: {2 * n**3 / times[2] / 1e9:8.1f} GFLOP/s")
for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
  for d in (64, 128):
    for causal in (False, True):
        for l in map(int, sys.argv[3:]):
            q, k, v = ((torch.rand(2, 16, l, d) * 2 - 1).to(dtype) for _ in range(3))
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                times.append(time.perf_counter() - t0)
            times.sort()
            flops = 4 * 2 * 16 * l * l * d / (2 if causal else 1)
            print(f"{name} d{d} L{l} causal={'true' if causal else 'false'}: {flops / times[2] / 1e12:.3f} TFLOP/s")
print(f"# torch {torch.__version__}")
PY
}
# Ours and theirs alternate for $rounds rounds; each work keeps its best round (the VM's
# noise comes in bursts that would otherwise land on one side only).
ours_gemm="" theirs_gemm="" ours_sdpa="" theirs_sdpa=""
for _ in $(seq "$rounds"); do
  ours_gemm+=$(target/release/examples/gemm_speed "${gemm_sizes[@]}")$'\n'
  theirs_gemm+=$(theirs_gemm)$'\n'
  ours_sdpa+=$(target/release/examples/sdpa_speed "${sdpa_lengths[@]}")$'\n'
  theirs_sdpa+=$(theirs_torch)$'\n'
done
[ "$have_torch" = yes ] || theirs_sdpa=""
# The same f32 GEMM against numpy's own OpenBLAS library loaded into our process, the two
# alternating call by call (the median of the per-pair ratios; the fairest number on a
# noisy machine). OpenBLAS's idle threads would spin on our cores for 0.1 s after each of
# its calls: OPENBLAS_THREAD_TIMEOUT=4 makes them sleep as ours do.
openblas_lib=$(.venv/bin/python -c "
from threadpoolctl import threadpool_info
import numpy
print(next(i['filepath'] for i in threadpool_info() if i['internal_api'] == 'openblas'))" 2>/dev/null || true)
in_process=""
if [ -n "$openblas_lib" ]; then
  in_process=$(OPENBLAS_LIB="$openblas_lib" OPENBLAS_THREAD_TIMEOUT=4 \
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
    target/release/examples/gemm_vs_openblas "${gemm_sizes[@]}")
fi

echo "CPU side by side, $threads threads, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "measured fp32 FMA peak: $peak GFLOP/s"
echo "peers: $(echo "$theirs_gemm" | grep -m1 '^#' | cut -c3-)${theirs_sdpa:+, $(echo "$theirs_sdpa" | grep -m1 '^#' | cut -c3-)}"
echo "best of $rounds alternating rounds, each the median of several runs;"
echo "'one process' rows: both in one process, call for call, median of the per-pair ratios"
echo
printf "%-46s %12s %12s %8s %10s %10s\n" "work" "ours" "peer" "ratio" "ours/peak" "peer/peak"
row() { # name ours theirs unit-scale (GFLOP/s per unit)
  local o="$2" t="$3" s="$4"
  if [ -z "$t" ]; then
    printf "%-46s %12s %12s %8s %10s %10s\n" "$1" "$o" "n/a" "-" "$(echo "$o * $s / $peak" | bc -l | xargs printf %.2f)" "-"
  else
    printf "%-46s %12s %12s %8.2f %10.2f %10.2f\n" "$1" "$o" "$t" "$(echo "$o / $t" | bc -l)" \
      "$(echo "$o * $s / $peak" | bc -l)" "$(echo "$t * $s / $peak" | bc -l)"
  fi
}
# The best value of the lines of $1 that start with key $2 (the text before the colon).
best() {
  echo "$1" | awk -v k="$2" -F': *' '$1 == k {split($2, v, " "); if (v[1] > m) m = v[1]} END {if (m != "") print m}'
}
for n in "${gemm_sizes[@]}"; do
  key=$(printf "f32 %5d" "$n")
  row "GEMM f32 n=$n (GFLOP/s)" "$(best "$ours_gemm" "$key")" "$(best "$theirs_gemm" "$key")" 1
done
echo "$in_process" | grep ':' | while read -r line; do
  n=$(echo "$line" | awk '{print $2}' | tr -d :)
  ours=$(echo "$line" | awk '{print $4}')
  theirs=$(echo "$line" | awk '{print $7}')
  ratio=$(echo "$line" | awk '{print $NF}')
  printf "%-46s %12s %12s %8s %10.2f %10.2f\n" "GEMM f32 n=$n, one process (median ratio)" "$ours" "$theirs" \
    "$ratio" "$(echo "$ours / $peak" | bc -l)" "$(echo "$theirs / $peak" | bc -l)"
done
for n in "${gemm_sizes[@]}"; do
  key=$(printf "bf16 %5d" "$n")
  row "GEMM bf16 n=$n (GFLOP/s)" "$(best "$ours_gemm" "$key")" "$(best "$theirs_sdpa" "$key")" 1
done
echo "$ours_sdpa" | grep ':' | cut -d: -f1 | awk '!seen[$0]++' | while read -r key; do
  row "SDPA $key (TFLOP/s)" "$(best "$ours_sdpa" "$key")" "$(best "$theirs_sdpa" "$key")" 1000
done
[ "$have_torch" = yes ] || echo "(torch could not be installed here: the attention rows have no peer)"
