#!/usr/bin/env bash
# ferry vs llama.cpp on the same GGUF, same prompt token ids, same thread count, in one run.
# Installs llama-cpp-python (built from source: about 11 minutes on 2 cores) into a cached venv.
#
# Usage: benches/compare-llama-cpp.sh [THREADS] [PROMPT_TOKENS] [GEN_TOKENS] [RUNS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${1:-2}"; prompt_tokens="${2:-128}"; gen_tokens="${3:-128}"; runs="${4:-3}"
model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
venv="${FERRY_BENCH_VENV:-$HOME/.cache/ferry/bench-venv}"

scripts/fetch-model.sh
if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
    echo "compare: installing llama-cpp-python into $venv (builds llama.cpp from source)..." >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet llama-cpp-python numpy
fi

cargo build --release --bench decode >&2
ferry_out="$(RAYON_NUM_THREADS="$threads" cargo bench --quiet --bench decode -- \
    --model "$model" --prompt-tokens "$prompt_tokens" --gen-tokens "$gen_tokens" --runs "$runs")"
echo "$ferry_out" | sed 's/,"prompt_ids":\[[0-9, ]*\]//'
ids="$(echo "$ferry_out" | head -n 1 | sed 's/.*"prompt_ids":\(\[[0-9, ]*\]\).*/\1/')"
peer_out="$("$venv/bin/python" benches/llama_cpp_peer.py "$model" "$ids" "$gen_tokens" "$runs" "$threads")"
echo "$peer_out"

python3 - "$ferry_out" "$peer_out" "$threads" <<'PY'
import json, statistics, sys
def load(text):
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return (statistics.median(r["prefill_tok_s"] for r in rows),
            statistics.median(r["decode_tok_s"] for r in rows))
ferry, peer, threads = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
print(f"\n| engine | threads | prefill tok/s | decode tok/s |\n|---|---|---|---|")
print(f"| ferry | {threads} | {ferry[0]:.1f} | {ferry[1]:.1f} |")
print(f"| llama.cpp | {threads} | {peer[0]:.1f} | {peer[1]:.1f} |")
print(f"| ferry / llama.cpp | | {ferry[0]/peer[0]:.2f} | {ferry[1]/peer[1]:.2f} |")
PY
