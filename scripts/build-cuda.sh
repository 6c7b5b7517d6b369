#!/usr/bin/env bash
# Builds ferry with the CUDA backend on a machine without a GPU (the pip CUDA 13.0 toolchain from
# scripts/cuda-toolchain.sh), plus the GPU test binary, and packs both for a GPU machine:
#
#   scripts/build-cuda.sh                  # -> target/cuda/release/ferry, dist/ferry-cuda.tar.xz
#                                          #    (ferry-cuda/ferry: launcher; ferry-cuda/ferry-bin: binary)
#   CUDA_COMPUTE_CAP=90 scripts/build-cuda.sh   # one card family, native code only (90: H100/H200,
#                                               # 89: RTX 40xx/L4, 86: RTX 30xx/A10, 120: RTX 50xx);
#                                               # default 80: every card from Ampere on (PTX JIT)
#   scripts/build-cuda.sh --no-tests       # the server binary only
#   scripts/build-cuda.sh --with-curand    # also pack libcurand.so.10 (+43 MiB; see below)
#
# The CUDA build uses its own target folder (target/cuda; FERRY_CUDA_TARGET_DIR overrides), so
# it never replaces the CPU build in target/. A cold build takes about 20 minutes on 2 cores
# (candle's CUDA kernels dominate); later builds reuse it. The binary gets a RUNPATH of
# $ORIGIN/lib (build.rs), so ferry-cuda/lib/ beside it is searched without LD_LIBRARY_PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

tests=1
pack=1
curand=0
for arg in "$@"; do
  case "$arg" in
    --no-tests) tests=0 ;;
    --no-pack) pack=0 ;;
    --with-curand) curand=1 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "build-cuda: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

eval "$(scripts/cuda-toolchain.sh)"
export CARGO_TARGET_DIR="${FERRY_CUDA_TARGET_DIR:-$root/target/cuda}"
echo "build-cuda: compute capability $CUDA_COMPUTE_CAP, target folder $CARGO_TARGET_DIR" >&2

cargo build --release --locked --features cuda --bin ferry
binary="$CARGO_TARGET_DIR/release/ferry"

test_binary=""
if [[ "$tests" == 1 ]]; then
  # The test binary's path is printed by cargo as JSON; pick the `gpu` test's executable.
  test_binary="$(cargo test --release --locked --features cuda --test gpu --no-run \
      --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "gpu" and m.get("executable"):
        print(m["executable"])')"
  if [[ -z "$test_binary" ]]; then
    echo "build-cuda: the gpu test binary was not built (run: cargo test --release --features cuda --test gpu --no-run)" >&2
    exit 1
  fi
fi

if [[ "$pack" == 1 ]]; then
  stage="$root/dist/ferry-cuda"
  rm -rf "$stage"
  mkdir -p "$stage"
  # `ferry` is the launcher (scripts/bundle/ferry-launcher.sh): it names missing CUDA libraries
  # instead of the dynamic loader's bare error, then execs ferry-bin.
  cp "$binary" "$stage/ferry-bin"
  cp scripts/bundle/ferry-launcher.sh "$stage/ferry"
  chmod +x "$stage/ferry"
  [[ -n "$test_binary" ]] && cp "$test_binary" "$stage/ferry-gpu-tests"
  # Line tables are not needed on the GPU machine; symbols stay for backtraces.
  for elf in "$stage/ferry-bin" "$stage/ferry-gpu-tests"; do
    [[ -f "$elf" ]] && { strip --strip-debug "$elf" 2>/dev/null || true; }
  done
  # cuRAND: candle links it (and creates a generator when it opens a device). The lent H200's
  # image has nvidia-curand beside torch, but PyTorch's own CUDA 13 wheels do not pull it in, so
  # a machine whose CUDA comes from torch alone lacks it: --with-curand packs the toolchain's
  # copy (43 MiB; the device tool carries 64 MiB in all) into ferry-cuda/lib, which
  # gpu-check.sh puts first on LD_LIBRARY_PATH. cuBLAS and cudart come from the machine.
  if [[ "$curand" == 1 ]]; then
    mkdir -p "$stage/lib"
    cp -L "$CUDA_ROOT/lib/libcurand.so.10" "$stage/lib/"
  fi
  tar -C "$root/dist" -cf - ferry-cuda | xz -T0 -6 >"$root/dist/ferry-cuda.tar.xz"
  size=$(stat -c %s "$root/dist/ferry-cuda.tar.xz")
  echo "build-cuda: dist/ferry-cuda.tar.xz is $((size >> 20)) MiB ($(cd "$stage" && find . -type f | sort | tr '\n' ' '))" >&2
  if (( size > 60 << 20 )); then
    echo "build-cuda: warning: over 60 MiB; the device tool carries at most 64 MiB per call" >&2
  fi
fi
echo "$binary"
