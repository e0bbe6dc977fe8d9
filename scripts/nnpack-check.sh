#!/usr/bin/env bash
# Runs conv2d's NNPACK and `mkldnn.enabled` tests (tests/conv.rs: batches of 16 in every
# layout NNPACK is called with, against the float64 convolution) with NNPACK loaded. No
# NNPACK package exists for Debian or on PyPI; PyTorch's libtorch_cpu.so links NNPACK in and
# exports its C API, so this check puts PyTorch's torch/lib on LD_LIBRARY_PATH: PyTorch in
# .venv/, installed there as scripts/compare.sh does (a large download) where missing.
# Fails if the NNPACK test skips.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check torch
lib=$(.venv/bin/python -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
echo "nnpack-check: NNPACK from $lib/libtorch_cpu.so"
mkdir -p target
log="$root/target/nnpack-check.log"
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --test conv -- --nocapture nnpack mkldnn 2>&1 | tee "$log"
if grep -q "skipped: NNPACK's convolutions" "$log"; then
  echo "nnpack-check: NNPACK did not load from $lib" >&2
  exit 1
fi
