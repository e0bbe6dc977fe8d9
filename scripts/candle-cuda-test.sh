#!/usr/bin/env bash
# tests/candle.rs built with the `candle-cuda` feature (candle's CUDA tensors through this
# library's attention and matmul) and run without a GPU: the program links CUDA (candle's
# choice), here against stand-in libraries (scripts/cuda-stand-ins.py), and runs with
# backends-ptx-driver as its libcuda.so.1, so candle's kernels and ours run on the PTX
# interpreter behind the driver API. Fails if the CUDA test skips. On a GPU machine, run
# `cargo test --features candle-cuda --test candle` instead.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
eval "$(scripts/nvcc.sh)"
stand="$root/target/cuda-stand-ins"
python3 scripts/cuda-stand-ins.py "$stand"
cargo build -q -p backends-ptx-driver
# Built without the stand-ins on the library path (the build finds the real NVRTC).
exe=$(CUDA_HOME="$stand" cargo test -q -p backends --features candle-cuda --test candle \
  --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "candle":
        print(m["executable"])')
# At run time: the stand-ins, but the interpreter's driver as libcuda.so.1.
run="$stand/run"
rm -rf "$run" && mkdir -p "$run"
for lib in "$stand"/lib64/lib*.so; do ln -s "$lib" "$run/"; done
rm "$run/libcuda.so"
ln -s "$root/target/debug/libbackends_ptx_driver.so" "$run/libcuda.so.1"
log="$stand/candle-cuda-test.log"
LD_LIBRARY_PATH="$run${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe" --nocapture "$@" 2>&1 | tee "$log"
if grep -q "^skipped: candle finds no CUDA device" "$log"; then
  echo "candle-cuda-test: candle found no CUDA device on the interpreter's driver" >&2
  exit 1
fi
