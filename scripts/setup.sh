#!/usr/bin/env bash
# Installs what backends needs on a fresh Debian/Ubuntu machine, only where missing:
#  - Mesa's lavapipe Vulkan driver and the Vulkan loader (mesa-vulkan-drivers, libvulkan1),
#    so that wgpu finds an adapter even without a GPU;
#  - NVRTC and ptxas from PyPI (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12) into .cuda/,
#    so that the build pre-compiles the CUDA kernels to PTX and assembles cubins from it.
#    No GPU is needed for either. Without them the build still succeeds (kernels are then
#    compiled at run time where NVRTC is found).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: install a Vulkan driver and loader (${missing[*]} on Debian) with your package manager" >&2
  fi
fi

# NVRTC 12.0 emits PTX ISA 8.0, which every CUDA 12 driver (R525 on) loads; ptxas 12.9
# assembles that PTX into the cubins for sm_75..sm_90 (see kernels/mod.rs).
nvrtc=nvidia-cuda-nvrtc-cu12==12.0.76
nvcc=nvidia-cuda-nvcc-cu12==12.9.86
wheel_dir() { echo "$root/.cuda/$(echo "$1" | sed 's/-/_/g; s/==/-/').dist-info"; }
if [ "$(uname -s)" = Linux ] && { [ ! -d "$(wheel_dir "$nvrtc")" ] || [ ! -d "$(wheel_dir "$nvcc")" ]; }; then
  echo "setup: installing NVRTC and ptxas from PyPI into .cuda/" >&2
  rm -rf "$root/.cuda"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$root/.cuda" "$nvrtc" "$nvcc" \
    || echo "setup: NVRTC could not be installed; CUDA kernels will not be pre-compiled to PTX" >&2
fi
