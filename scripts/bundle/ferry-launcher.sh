#!/bin/sh
# The `ferry` command of the CUDA bundle (dist/ferry-cuda.tar.xz, made by scripts/build-cuda.sh).
#
# The real binary, ferry-bin beside this script, links the CUDA libraries at start (candle links
# cudarc with `dynamic-linking`), so when one is missing the dynamic loader stops it before
# `main` with a bare "cannot open shared object file". This launcher asks `ldd` first and, when a
# library is missing, says which ones, where ferry looks and how to get them, and exits 127 (the
# shell's "command not found" status). When everything is found it replaces itself with the
# binary (`exec`), so signals, exit codes and arguments are the binary's own.
set -u
here=$(dirname "$(readlink -f "$0")")
bin="$here/ferry-bin"
if [ ! -x "$bin" ]; then
    echo "ferry: $bin is missing or not executable (unpack the whole ferry-cuda bundle)" >&2
    exit 127
fi
if command -v ldd >/dev/null 2>&1; then
    missing=$(LC_ALL=C ldd "$bin" 2>/dev/null | awk '/=> not found/ { printf "%s ", $1 }')
    if [ -n "$missing" ]; then
        {
            echo "ferry: cannot start, shared libraries not found: $missing"
            echo "  ferry looks in $here/lib, then LD_LIBRARY_PATH, then the system's library path."
            case "$missing" in
            *libcuda.so*)
                echo "  libcuda.so.1 comes with the NVIDIA driver (580 series or newer for CUDA 13);" \
                    "install the driver, or run where the GPU is." ;;
            esac
            echo "  The CUDA 13 libraries (libcublas.so.13, libcublasLt.so.13, libcudart.so.13," \
                "libcurand.so.10, libnvrtc.so.13) come from the CUDA toolkit or the pip wheels" \
                "nvidia-cublas, nvidia-cuda-runtime, nvidia-curand and nvidia-cuda-nvrtc:" \
                "copy them into $here/lib or add their folder to LD_LIBRARY_PATH."
        } >&2
        exit 127
    fi
fi
exec "$bin" "$@"
