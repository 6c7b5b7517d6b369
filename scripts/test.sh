#!/usr/bin/env bash
# The test suite: fetches the default model (the real-model tests need it), then runs every test of
# every crate of the workspace, with the Python clients (scripts/client-venv.sh) in place. The
# tests build in the release profile, so they reuse everything `cargo build --release` (the
# README's run command) compiled: one build for both commands.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh --test suite http_api::).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-model.sh
FERRY_CLIENT_PYTHON="$(scripts/client-venv.sh)"
export FERRY_CLIENT_PYTHON
cargo test --release --workspace --locked "$@"
