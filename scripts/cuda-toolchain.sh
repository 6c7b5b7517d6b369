#!/usr/bin/env bash
# Installs the pip CUDA 13.0 toolchain ferry's `cuda` feature builds with, into a cache folder, and
# prints the environment to use. No GPU and no system CUDA are needed: the wheels bring nvcc, the
# headers and the libraries; a stub libcuda.so.1 is built here so the final link succeeds (the real
# driver library is loaded at run time on the GPU machine).
#
#   eval "$(scripts/cuda-toolchain.sh)"        # install once (cached), then export the environment
#   scripts/cuda-toolchain.sh --print-env      # the same, quiet when already installed
#
# Environment knobs:
#   FERRY_CUDA_HOME      install folder (default: ~/.cache/ferry/cuda-13.0)
#   CUDA_COMPUTE_CAP     target compute capability. Default 80 ("portable"): candle's PTX kernels
#                        for compute_80, which the driver compiles for any card from Ampere on
#                        (sm_80 A100, sm_86 RTX 30xx/A10, sm_89 RTX 40xx/L4, sm_90 H100/H200,
#                        sm_120 RTX 50xx), and its statically built kernels (quantized matmul,
#                        MoE) as sm_80 code plus compute_80 PTX (NVCC_APPEND_FLAGS below), so
#                        they too run on every such card. 86 / 89 / 90 / 120 build for one card
#                        family only (native code, no JIT at start; 90 means sm_90a, H100/H200
#                        only). The printed environment keeps yours.
# Everything but the `export` lines goes to stderr, so `eval "$(...)"` sees only the environment.
set -euo pipefail

home="${FERRY_CUDA_HOME:-$HOME/.cache/ferry/cuda-13.0}"
compute_cap="${CUDA_COMPUTE_CAP:-80}"
python="${PYTHON:-python3}"

# Pins: cudarc 0.19 (candle 0.11.1) rejects nvcc 13.5, and nvidia-nvvm must match nvcc exactly.
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-curand==10.4.0.35
  nvidia-cublas==13.0.2.14
)
# Bump when the layout this script builds changes, so cached installs are redone.
layout=2
stamp="$home/.installed-$(printf '%s\n' "${packages[@]}" "layout $layout" | sha256sum | cut -c1-16)"

say() { echo "cuda-toolchain: $*" >&2; }

# A stub libcuda.so.1 for linking only: the pip wheels have no driver library (the real one
# comes with the NVIDIA driver on the GPU machine). It defines every driver API function that
# cuda.h declares (versioned names such as cuStreamDestroy_v2 as the header maps them, and the
# plain names), as empty functions; at run time the dynamic linker binds them in the real
# libcuda.so.1 instead.
build_stub() {
  local root="$1" dir="$2"
  mkdir -p "$dir"
  {
    cc -E -P -I"$root/include" "$root/include/cuda.h"
    grep -hoE 'CUDAAPI[[:space:]]+cu[A-Z][A-Za-z0-9_]*' "$root/include/cuda.h" | sed 's/CUDAAPI[[:space:]]*//;s/$/ (/'
  } | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u \
    | sed 's/.*/void &(void) {}/' >"$dir/stub.c"
  if [[ ! -s "$dir/stub.c" ]]; then
    say "error: found no driver functions in $root/include/cuda.h"
    exit 1
  fi
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$dir/stub.c"
  ln -sfn libcuda.so.1 "$dir/libcuda.so"
  say "stub libcuda.so.1 with $(wc -l <"$dir/stub.c") driver functions in $dir"
}

if [[ ! -f "$stamp" ]]; then
  if ! command -v "$python" >/dev/null 2>&1; then
    say "error: $python not found; the CUDA toolchain comes from PyPI wheels and needs Python 3 with pip"
    exit 1
  fi
  say "installing the CUDA 13.0 toolchain into $home (about 1 GB, once)"
  rm -rf "$home"
  mkdir -p "$home"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --root-user-action=ignore --target "$home/site" "${packages[@]}" >&2
  # The wheels install under site/nvidia/cu13 (CUDA 13 layout); older layouts used one folder per
  # package. Find the folder holding bin/nvcc and make it CUDA_ROOT.
  nvcc_path="$(find "$home/site" -path '*/bin/nvcc' -type f | head -n1)"
  if [[ -z "$nvcc_path" ]]; then
    say "error: no bin/nvcc in the installed wheels under $home/site"
    exit 1
  fi
  root="$(dirname "$(dirname "$nvcc_path")")"
  ln -sfn "$root" "$home/root"
  chmod +x "$root"/bin/* 2>/dev/null || true
  # nvcc looks for nvvm/ and crt/ beside bin/; the nvvm and crt wheels may install elsewhere.
  for part in nvvm include/crt; do
    if [[ ! -e "$root/$part" ]]; then
      found="$(find "$home/site" -path "*/${part}" -type d | grep -v "^$root/" | head -n1 || true)"
      [[ -n "$found" ]] && ln -sfn "$found" "$root/$part"
    fi
  done
  chmod +x "$root"/nvvm/bin/* 2>/dev/null || true
  # Unversioned links (libcublas.so -> libcublas.so.13) so the linker finds -lcublas etc.
  mkdir -p "$root/lib"
  for lib in "$home"/site/nvidia/*/lib/*.so.* "$home"/site/nvidia/*/*/lib/*.so.*; do
    [[ -e "$lib" ]] || continue
    base="$(basename "$lib")"
    [[ -e "$root/lib/$base" ]] || ln -sfn "$lib" "$root/lib/$base"
    unversioned="${base%%.so.*}.so"
    [[ -e "$root/lib/$unversioned" ]] || ln -sfn "$lib" "$root/lib/$unversioned"
  done
  build_stub "$root" "$home/stubs"
  version="$("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  if [[ "$version" != 13.0 ]]; then
    say "error: nvcc reports release '$version', expected 13.0 (cudarc rejects newer nvcc)"
    exit 1
  fi
  touch "$stamp"
  say "installed nvcc $version at $root/bin/nvcc"
fi

root="$(readlink -f "$home/root")"
cat <<EOF
export CUDA_ROOT="$root"
export CUDA_PATH="$root"
export CUDA_HOME="$root"
export PATH="$root/bin:\$PATH"
export CUDA_COMPUTE_CAP="$compute_cap"
export CUDARC_CUDA_VERSION=13000
export LIBRARY_PATH="$root/lib:$home/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export RUSTFLAGS="\${RUSTFLAGS:-} -L native=$root/lib -L native=$home/stubs"
EOF
# cudaforge (candle-kernels' build) compiles its static kernels for one real architecture only
# (-gencode=arch=compute_80,code=sm_80): embed the compute_80 PTX beside it so sm_90 and sm_120
# cards can JIT them. nvcc reads NVCC_APPEND_FLAGS; the --ptx builds accept the same flag.
if [[ $compute_cap == 80 ]]; then
  echo "export NVCC_APPEND_FLAGS=\"\${NVCC_APPEND_FLAGS:-} -gencode=arch=compute_80,code=compute_80\""
fi
