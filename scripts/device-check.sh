#!/usr/bin/env bash
# One-shot check on a lent NVIDIA GPU (H200, CUDA 13 driver, PyTorch in python3, no
# network), in under 8 minutes.
#
#   here, with network:  scripts/device-check.sh prepare
#       vendors every crate (`cargo vendor`, packed into .device/vendor.tar.gz, ~36 MB) and
#       builds the release `backends` binary and CUDA test binaries into .device/bin as a
#       fallback for a machine without a Rust toolchain. .device/ is git-ignored.
#   there:               scripts/device-check.sh run
#       carry list of the device call: [".device/bin"] (the binaries, xz-compressed: ~10 MB;
#       add ".device/vendor.tar.gz" only where the device machine has cargo; together they
#       pass the call's 64 MiB limit when the binaries travel uncompressed)
#       builds offline from the vendored crates when cargo is there (else uses .device/bin),
#       runs the CUDA tests (the candle-cuda test from its prebuilt binary: candle's CUDA
#       tensors through our attention and matmul; every generated module loads and exposes its kernels on the
#       GPU; PTX assembled for the GPU's arch; device memory, GEMM under each precision flag,
#       split-K, cuBLAS, attention and cuDNN convolution against float64), the `backends` report and
#       self-checks, then
#       measures PyTorch on the same GPU: GEMM (cuBLAS) and flash / memory-efficient / cuDNN
#       SDPA forced through torch.nn.attention.sdpa_kernel, a 3x3 conv2d (cuDNN) and
#       linalg inv / cholesky / eigvalsh (cuSOLVER), each against a float64 reference.
#       The vendor libraries (cuBLAS, cuBLASLt, cuFFT, cuDNN) are PyTorch's wheels' copies,
#       put on LD_LIBRARY_PATH.
#       Prints a final table; the whole log goes to $OUT/device-check.log when $OUT is set.
#
# Then it times ours on the same GPU (examples/cuda_speed.rs: generated GEMM kernels,
# cuBLAS and cuBLASLt, flash, memory-efficient and cuDNN attention, conv2d through cuDNN and
# the generated kernels) and prints both side by
# side.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dev="$root/.device"

prepare() {
  set -e
  rm -rf "$dev/bin" "$dev/vendor" "$dev/vendor.tar.gz"
  mkdir -p "$dev/bin"
  cargo vendor -q --versioned-dirs "$dev/vendor" >/dev/null
  tar -C "$dev" -czf "$dev/vendor.tar.gz" vendor
  rm -rf "$dev/vendor"
  cargo build -q --release --bin backends
  cargo build -q --release --example cuda_speed
  cp target/release/backends "$dev/bin/backends"
  cp target/release/examples/cuda_speed "$dev/bin/cuda_speed"
  cargo test -q --release --no-run --test cuda --test cuda_libraries --message-format=json \
    2>/dev/null | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])' \
    | while read -r name exe; do cp "$exe" "$dev/bin/test-$name"; done
  candle_test || echo "prepare: no candle-cuda test binary (see above)"
  strip "$dev/bin/"* 2>/dev/null || true
  xz -T0 -f "$dev/bin/"*
  du -sh "$dev"/* && du -sh "$dev"
}

# Links each versioned library among the files given after `dest` (`libcublas.so.13`) into
# `dest` by its plain name (`libcublas.so`), the first of a name winning: linkers and
# cudarc's loader look for the plain names.
plain_names() {
  local dest="$1" file plain
  shift
  for file in "$@"; do
    [ -e "$file" ] || continue
    plain="${file##*/}"; plain="${plain%%.so.*}.so"
    [ -e "$dest/$plain" ] || ln -s "$file" "$dest/$plain"
  done
}

# The candle-cuda test binary (tests/candle.rs, candle's CUDA tensors through our ops) into
# .device/bin/test-candle. Its program links CUDA (candle's choice): here against a stand-in
# libcuda (scripts/cuda-stand-ins.py: every driver call answers "no device"), PyTorch's CUDA 13 libraries in .venv
# (scripts/compare.sh makes it) and cuRAND from PyPI; there against the driver and the
# image's own copies. candle's kernels need nvcc (scripts/nvcc.sh).
candle_test() {
  local site link="$dev/link"
  site=$(ls -d "$root"/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1)
  [ -n "$site" ] || { echo "prepare: no .venv with PyTorch (run scripts/compare.sh once)"; return 1; }
  rm -rf "$link" && mkdir -p "$link/lib64/stubs"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$link/curand" \
    nvidia-curand==10.4.5.25 || return 1
  plain_names "$link/lib64" "$site"/*/lib/lib*.so.* "$link"/curand/nvidia/*/lib/lib*.so.*
  python3 scripts/cuda-stand-ins.py "$link/stand-ins" || return 1
  cp "$link/stand-ins/lib64/libcuda.so" "$link/lib64/stubs/libcuda.so"
  local exe
  exe=$(eval "$(scripts/nvcc.sh)" && CUDA_HOME="$link" cargo test -q --release \
    --features candle-cuda --test candle --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "candle":
        print(m["executable"])')
  [ -n "$exe" ] || { echo "prepare: the candle-cuda test did not build"; return 1; }
  cp "$exe" "$dev/bin/test-candle"
}

run() {
  local log="${OUT:-/tmp}/device-check.log"
  exec > >(tee "$log") 2>&1
  echo "== device check $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  # NVRTC for run-time compilation: the one PyTorch's wheels bring, if any.
  local nvrtc
  nvrtc=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
paths = site.getsitepackages() + [site.getusersitepackages()]
hits = [p for d in paths for p in glob.glob(os.path.join(d, "nvidia", "**", "libnvrtc.so*"), recursive=True)]
hits = [h for h in hits if "builtins" not in h]
print(sorted(hits)[-1] if hits else "")
PY
)
  [ -n "$nvrtc" ] && export BACKENDS_NVRTC_LIB="$nvrtc" && echo "NVRTC: $nvrtc"
  # cuBLAS, cuBLASLt, cuFFT and cuDNN: the ones PyTorch's wheels bring, found by their
  # standard names once their folders are on the library path.
  local libs
  libs=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
paths = site.getsitepackages() + [site.getusersitepackages()]
dirs = {os.path.dirname(p) for d in paths for p in glob.glob(os.path.join(d, "nvidia", "*", "lib", "lib*.so*"))}
print(":".join(sorted(dirs)))
PY
)
  [ -n "$libs" ] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && echo "vendor libraries: $libs"
  # cudarc (built for CUDA 12) asks for `libcublas.so`, `libcublas.so.12`, ...; CUDA 13's
  # wheels ship `libcublas.so.13` alone: give each versioned library its plain name too.
  local shim=/tmp/backends-libs
  rm -rf "$shim" && mkdir -p "$shim"
  local dir
  for dir in ${libs//:/ }; do
    plain_names "$shim" "$dir"/lib*.so.*
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$shim"
  echo "plain names for: $(ls "$shim" | tr '\n' ' ')"
  local backends_bin test_cuda speed_bin
  if command -v cargo >/dev/null && [ -f "$dev/vendor.tar.gz" ]; then
    echo "== building offline from the vendored crates"
    rm -rf /tmp/backends-vendor && mkdir -p /tmp/backends-vendor
    tar -C /tmp/backends-vendor -xzf "$dev/vendor.tar.gz"
    local cfg=(--offline --config 'source.crates-io.replace-with="vendored"'
      --config 'source.vendored.directory="/tmp/backends-vendor/vendor"')
    export CARGO_BUILD_JOBS="$(nproc)"
    if cargo build "${cfg[@]}" -q --release --bin backends --example cuda_speed \
      && cargo test "${cfg[@]}" --release --test cuda --test cuda_libraries --test kernels \
        -- --nocapture; then
      backends_bin=target/release/backends
      speed_bin=target/release/examples/cuda_speed
    else
      echo "build or tests failed; falling back to the prebuilt binaries"
    fi
  else
    echo "== no cargo here: using the prebuilt binaries in .device/bin"
  fi
  if [ -z "${backends_bin:-}" ]; then
    local bin=/tmp/backends-bin file
    mkdir -p "$bin"
    for file in "$dev"/bin/*.xz; do
      [ -e "$file" ] || continue
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$file" "$bin/$(basename "$file" .xz)"
      chmod +x "$bin/$(basename "$file" .xz)"
    done
    backends_bin="$bin/backends"
    speed_bin="$bin/cuda_speed"
    for test_cuda in "$bin/test-cuda" "$bin/test-cuda_libraries"; do
      if [ -x "$test_cuda" ]; then "$test_cuda" --nocapture; else echo "no $test_cuda: run prepare"; fi
    done
  fi
  echo "== candle's CUDA tensors through our ops (tests/candle.rs, built with candle-cuda)"
  if [ -f "$dev/bin/test-candle.xz" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$dev/bin/test-candle.xz" /tmp/test-candle && chmod +x /tmp/test-candle
    /tmp/test-candle --nocapture || echo "test-candle exited with $?"
  else
    echo "no .device/bin/test-candle.xz: run prepare where .venv holds PyTorch"
  fi
  echo "== backends (report and self-checks)"
  [ -x "$backends_bin" ] && "$backends_bin" || echo "backends exited with $?"
  echo "== ours on this GPU"
  local ours="${OUT:-/tmp}/ours.tsv"
  if [ -x "$speed_bin" ]; then "$speed_bin" | tee "$ours"; else : > "$ours"; echo "no cuda_speed binary"; fi
  echo "== PyTorch on this GPU"
  OURS="$ours" python3 - <<'PY'
import time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = "cuda"
def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]

def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()

rows = []
for dtype, name in [(torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.float32, "f32 ieee"), (torch.float32, "f32 tf32")]:
    torch.backends.cuda.matmul.allow_tf32 = name == "f32 tf32"
    n = 8192
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    t = timed(lambda: a @ b)
    small = 1024
    sa, sb = a[:small, :small], b[:small, :small]
    rows.append((f"GEMM {name} n={n}", 2 * n**3 / t / 1e12, rel(sa @ sb, sa.double() @ sb.double())))
torch.backends.cuda.matmul.allow_tf32 = False

def reference(q, k, v, causal):
    qd, kd, vd = q.double(), k.double(), v.double()
    s = qd @ kd.transpose(-1, -2) / qd.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=dev).triu(1), float("-inf"))
    return s.softmax(-1) @ vd

for backend, bname in [(SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.EFFICIENT_ATTENTION, "mem-efficient"), (SDPBackend.CUDNN_ATTENTION, "cudnn")]:
    for d in (64, 128):
        for causal in (False, True):
            for l in (1024, 4096):
                name = f"SDPA {bname} bf16 d{d} L{l}{' causal' if causal else ''}"
                q, k, v = (torch.randn(2, 16, l, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
                try:
                    with sdpa_kernel([backend]):
                        t = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                        out = F.scaled_dot_product_attention(q[:, :2], k[:, :2], v[:, :2], is_causal=causal)
                except RuntimeError as e:
                    print(f"torch {name}: {str(e).splitlines()[0]}")
                    rows.append((name, float("nan"), float("nan")))
                    continue
                flops = 4 * 2 * 16 * l * l * d / (2 if causal else 1)
                err = rel(out, reference(q[:, :2], k[:, :2], v[:, :2], causal))
                rows.append((name, flops / t / 1e12, err))

for b in (1, 8):
    name = f"SDPA decode bf16 b{b} h32 d128 Lk8192"
    q = torch.randn(b, 32, 1, 128, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(b, 32, 8192, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    t = timed(lambda: F.scaled_dot_product_attention(q, k, v), reps=50)
    qs, ks, vs = q[:1, :2], k[:1, :2, :512], v[:1, :2, :512]
    err = rel(F.scaled_dot_product_attention(qs, ks, vs), (qs.double() @ ks.double().transpose(-1, -2) / 128 ** 0.5).softmax(-1) @ vs.double())
    rows.append((name, 4 * b * 32 * 8192 * 128 / t / 1e12, err))

for dtype, name in [(torch.bfloat16, "bf16"), (torch.float32, "f32 ieee"), (torch.float32, "f32 tf32")]:
    torch.backends.cudnn.allow_tf32 = name == "f32 tf32"
    x, w = torch.randn(32, 256, 28, 28, device=dev, dtype=dtype), torch.randn(256, 256, 3, 3, device=dev, dtype=dtype)
    t = timed(lambda: F.conv2d(x, w, padding=1))
    xs, ws = torch.randn(2, 64, 14, 14, device=dev, dtype=dtype), torch.randn(64, 64, 3, 3, device=dev, dtype=dtype)
    err = rel(F.conv2d(xs, ws, padding=1), F.conv2d(xs.double(), ws.double(), padding=1))
    rows.append((f"conv2d {name} 3x3 n32 c256 28x28", 2 * 32 * 256 * 28 * 28 * 256 * 9 / t / 1e12, err))
torch.backends.cudnn.allow_tf32 = True

def spd(n, dtype, device):
    m = torch.randn(n, n, dtype=torch.float64)
    return ((m + m.T) / 2 + n * torch.eye(n, dtype=torch.float64)).to(device=device, dtype=dtype)
for op, fn, flops in [("inv", torch.linalg.inv, 2.0), ("cholesky", torch.linalg.cholesky, 1 / 3), ("eigvalsh", torch.linalg.eigvalsh, 4 / 3)]:
    a = spd(1024, torch.float32, dev)
    t = timed(lambda: fn(a), reps=5)
    small = spd(128, torch.float64, "cpu")
    err = ((fn(small.to(dev, torch.float32)).double().cpu() - fn(small)).norm() / fn(small).norm()).item()
    rows.append((f"linalg {op} f32 n=1024", flops * 1024**3 / t / 1e12, err))

import os
ours = {}
for line in open(os.environ["OURS"]):
    parts = line.rstrip("\n").split("\t")
    if len(parts) == 3:
        ours[parts[0]] = parts[1:]

print()
print(f"{'work':48} {'ours TFLOP/s':>12} {'ours err':>9} {'torch TFLOP/s':>13} {'torch err':>9} {'ours/torch':>10}")
for name, tflops, err in rows:
    paths = {"GEMM": [" generated", " cublas", " cublaslt"], "conv2d": [" cudnn", " generated"]}.get(name.split()[0], [""])
    for path in paths:
        mine, mine_err = ours.get(name + path, ["-", "-"])
        try:
            ratio = f"{float(mine) / tflops:10.2f}"
        except ValueError:
            ratio = f"{'-':>10}"
        print(f"{name + path:48} {mine:>12} {mine_err:>9} {tflops:13.1f} {err:9.1e} {ratio}")
print(f"\ntorch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
PY
  echo "== done $(date -u +%FT%TZ); log: $log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/device-check.sh prepare|run (see the top of this script)" >&2; exit 2 ;;
esac
