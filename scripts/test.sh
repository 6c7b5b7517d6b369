#!/usr/bin/env bash
# The test suite: fetches the default model (the real-model tests need it), then runs every test.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh --test suite http_api::).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-model.sh
cargo test --locked "$@"
