#!/usr/bin/env bash
# Checks the cuDNN graphs (attention: src/ops/sdpa/cudnn.rs, convolution:
# src/ops/conv/cudnn.rs) on a machine without a GPU:
#  - installs cuDNN 9 from PyPI (nvidia-cudnn-cu12, a ~700 MB download) into .cuda/cudnn/
#    (a folder of its own: pip --target --upgrade replaces the `nvidia` package folder, which
#    in .cuda/ holds setup.sh's NVRTC and ptxas);
#  - builds a stand-in libcuda.so.1 into .cuda/stub/: cuDNN's engine library links against
#    the driver, and without one cuDNN refuses to finalize operations. Every call of the
#    stand-in reports "no device"; it is only put on the library path of this check;
#  - runs the unit tests that build the attention graph for f16/bf16, causal or not, with
#    and without dropout, and the convolution graph for f32/f16/bf16 (grouped, strided,
#    padded; a wrong output size refused), finalizing every tensor and operation descriptor.
# What needs a GPU (the operation graph, cuDNN's engine choice, execution) is tested by
# tests/cuda_libraries.rs on a lent GPU (scripts/device-check.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
lib="$root/.cuda/cudnn/nvidia/cudnn/lib"
if [ ! -e "$lib/libcudnn.so.9" ]; then
  echo "cudnn-check: installing cuDNN 9 from PyPI into .cuda/cudnn/" >&2
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$root/.cuda/cudnn" \
    --upgrade nvidia-cudnn-cu12
fi
stub="$root/.cuda/stub"
if [ ! -e "$stub/libcuda.so.1" ]; then
  mkdir -p "$stub"
  cat > "$stub/cuda_stub.c" <<'C'
/* A stand-in for the CUDA driver on a machine without a GPU: every call reports no device. */
enum { NO_DEVICE = 100 };
int cuGetErrorString(int error, const char **text) { (void)error; *text = "no device (stand-in driver)"; return 0; }
int cuModuleGetFunction(void *f, void *m, const char *name) { (void)f; (void)m; (void)name; return NO_DEVICE; }
int cuModuleLoadData(void *m, const void *image) { (void)m; (void)image; return NO_DEVICE; }
int cuModuleUnload(void *m) { (void)m; return NO_DEVICE; }
int cuTensorMapEncodeIm2col(void) { return NO_DEVICE; }
int cuTensorMapEncodeTiled(void) { return NO_DEVICE; }
C
  cc -shared -fPIC -o "$stub/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$stub/cuda_stub.c"
fi
LD_LIBRARY_PATH="$lib:$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --release --lib cudnn -- --nocapture
