#!/usr/bin/env bash
# Installs CUDA 13's nvcc from PyPI into .nvcc/ (where missing) and prints the environment
# that puts it in use, for the `candle-cuda` feature: candle's CUDA kernels are compiled by
# nvcc when candle-core builds. No GPU is needed to build; one is needed to run.
#
#   eval "$(scripts/nvcc.sh)" && cargo build --features candle-cuda
#
# CUDA_COMPUTE_CAP is the GPU generation candle compiles for (80: Ampere and later) unless
# it is set already; candle would otherwise ask nvidia-smi.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.nvcc"
# 13.0 emits PTX that every CUDA 13 driver loads. The compiler, its front end (nvvm), the
# CUDA runtime's headers (crt, runtime) and the C++ library headers nvcc's includes name.
version=13.0.88
wheels=("nvidia-cuda-nvcc==$version" "nvidia-nvvm==$version" "nvidia-cuda-crt==$version"
  "nvidia-cuda-runtime==$version" "nvidia-cuda-cccl==13.0.85")
toolkit="$dir/nvidia/cu13"
if [ ! -x "$toolkit/bin/nvcc" ] || [ ! -f "$dir/.version-$version" ]; then
  echo "nvcc.sh: installing nvcc $version from PyPI into .nvcc/" >&2
  rm -rf "$dir"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "${wheels[@]}" >&2
  touch "$dir/.version-$version"
fi
echo "export PATH=\"$toolkit/bin:\$PATH\" CUDA_ROOT=\"$toolkit\" CUDA_PATH=\"$toolkit\""
echo "export CUDA_COMPUTE_CAP=\"${CUDA_COMPUTE_CAP:-80}\""
