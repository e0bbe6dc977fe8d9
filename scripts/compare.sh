#!/usr/bin/env bash
# Side by side on this machine, in one run: our CPU f32 GEMM against numpy/OpenBLAS with the
# same thread count, medians of several runs, and the ratio (ours / theirs).
# Installs numpy into .venv/ (PyPI) on first use. Usage: scripts/compare.sh [sizes...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
sizes=("${@:-1024 2048 4096}")
sizes=(${sizes[*]})
threads="${OMP_NUM_THREADS:-$(nproc)}"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check numpy threadpoolctl
fi
cargo build -q --release --example gemm_speed

ours=$(OMP_NUM_THREADS="$threads" target/release/examples/gemm_speed "${sizes[@]}")
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow a current OpenBLAS down: unset for this command only.
theirs=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
  .venv/bin/python - "${sizes[@]}" <<'PY'
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
print("# " + ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} x{i['num_threads']}" for i in info))
PY
)
echo "f32 GEMM, $threads threads, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "peer: $(echo "$theirs" | grep '^#' | cut -c3-)"
printf "%6s %14s %14s %8s\n" n "ours GFLOP/s" "numpy GFLOP/s" ratio
for n in "${sizes[@]}"; do
  o=$(echo "$ours" | awk -v n="$n" '$2 == n":" {print $3}')
  t=$(echo "$theirs" | awk -v n="$n" '$2 == n":" {print $3}')
  printf "%6s %14s %14s %8.2f\n" "$n" "$o" "$t" "$(echo "$o / $t" | bc -l)"
done
