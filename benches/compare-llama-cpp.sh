#!/usr/bin/env bash
# ferry vs llama.cpp on the same GGUFs, same prompt token ids, same thread count, in one run:
# the default model (SmolLM2-135M Q4_1) and the synthetic 2048-wide Llama of
# scripts/make-quant-models.py in Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, IQ4_NL, Q2_K, Q3_K_M and the
# 896-wide Q4_K_M mix; prefill and decode after a prompt of 512 and of 4,096 tokens; plus each
# engine's load-to-ready time against one warm read of the file (ferry's from its panel cache,
# `device.panel_cache`, in the user's cache as the server has it, made by one load before the
# timed ones; plus one load without it, which packs the layouts on AVX2 CPUs), and its
# resident set after loading against the file's size; for ferry also the
# resident set after a request against the file's size plus the KV cache it holds, split into
# anonymous memory and file pages (the model's mapped pages, the binary's own); and each side's
# decode as the rate it reads the weights at (the bytes of every tensor a token reads, the
# embedding table aside, times tokens per second) against the machine's read bandwidth with
# the same threads (`benches/read_bandwidth.rs`, run beside every pair of processes: decode of
# a model past the caches is bound by it, so no engine can pass 1.0 there). A row whose model
# ferry cannot load yet says so and the run goes on. Prints one markdown table at the end
# (name the CPU with it: AVX2-only and AVX-512 machines differ).
#
# Usage: benches/compare-llama-cpp.sh [THREADS] [GEN_TOKENS] [RUNS]
#   RUNS (default 2) processes of each engine per row, alternating ferry and llama.cpp, each
#   process running the request twice; the table takes the median of their second (warm) runs.
#   FERRY_COMPARE_MODE     native (default): each engine on everything the CPU has; avx2: both held
#                          to AVX2 + FMA + F16C (an AVX2-only CPU such as AMD Zen 2/3 on this
#                          one): ferry with `--cpu-qmatmul avx2` (no AVX-512, AVX-VNNI or AMX,
#                          attention included), llama.cpp from a llama-cpp-python built with
#                          GGML_NATIVE=OFF and only AVX/AVX2/FMA/F16C/BMI2 on (its venv
#                          FERRY_BENCH_VENV defaults to ~/.cache/ferry/bench-venv-avx2; the wheel
#                          is built once, ~11+ minutes on 2 cores, and cached in
#                          ~/.cache/ferry/wheels/avx2/) with its repacked weight layouts on
#                          (FERRY_PEER_EXTRA_BUFTS=1; without AMX built in they are safe)
#   FERRY_COMPARE_MODELS   models to run (default: "default synth-q4_k_m synth-q5_k_m synth-q6_k
#                          synth-q8_0 synth-iq4_xs synth-iq4_nl synth896-q4_k_m synth-q2_k
#                          synth-q3_k_m"; any name of
#                          `scripts/make-quant-models.py --list`, or a path to a GGUF;
#                          synth896-q4_k_m is the Q5_0/Q8_0-heavy mix of 896-wide models)
#   FERRY_COMPARE_PROMPTS  prompt lengths (default: "512 4096")
#   FERRY_BENCH_VENV       Python venv with llama-cpp-python, numpy and gguf (made if missing:
#                          llama-cpp-python builds llama.cpp from source, about 11 minutes on 2
#                          cores)
#   FERRY_QUANT_MODELS     where the generated models are cached (see make-quant-models.py)
#   FERRY_COMPARE_PROFILE  cargo profile of ferry's side (default: bench, i.e. release; `dev`
#                          builds ferry at opt-level 1 over opt-level-3 dependencies, for a
#                          quick look where no release build exists yet: say so with its numbers)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${1:-2}"; gen_tokens="${2:-64}"; runs="${3:-2}"
models="${FERRY_COMPARE_MODELS:-default synth-q4_k_m synth-q5_k_m synth-q6_k synth-q8_0 synth-iq4_xs synth-iq4_nl synth896-q4_k_m synth-q2_k synth-q3_k_m}"
prompts="${FERRY_COMPARE_PROMPTS:-512 4096}"
mode="${FERRY_COMPARE_MODE:-native}"
case "$mode" in
    native)
        venv="${FERRY_BENCH_VENV:-$HOME/.cache/ferry/bench-venv}"
        ferry_kernels=auto
        ;;
    avx2)
        venv="${FERRY_BENCH_VENV:-$HOME/.cache/ferry/bench-venv-avx2}"
        ferry_kernels=avx2
        export FERRY_PEER_EXTRA_BUFTS=1
        ;;
    *) echo "compare: FERRY_COMPARE_MODE is native or avx2, not $mode" >&2; exit 2 ;;
esac
profile="${FERRY_COMPARE_PROFILE:-bench}"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT

# llama.cpp's CMake switches for an AVX2-only build (no native detection, nothing newer).
avx2_cmake="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
avx2_cmake+=" -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
avx2_cmake+=" -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
wheels="$HOME/.cache/ferry/wheels/avx2"

scripts/fetch-model.sh >&2
if ! "$venv/bin/python" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
    echo "compare: installing llama-cpp-python ($mode), gguf and numpy into $venv..." >&2
    python3 -m venv "$venv"
    if [ "$mode" = avx2 ]; then
        wheel="$(ls "$wheels"/llama_cpp_python-0.3.36-*.whl 2>/dev/null | head -n 1 || true)"
        if [ -z "$wheel" ]; then
            echo "compare: building llama-cpp-python for AVX2 only into $wheels (~11+ min)..." >&2
            mkdir -p "$wheels"
            CMAKE_ARGS="$avx2_cmake" "$venv/bin/pip" wheel --quiet --no-deps --no-cache-dir \
                --no-binary llama-cpp-python llama-cpp-python==0.3.36 -w "$wheels"
            wheel="$(ls "$wheels"/llama_cpp_python-0.3.36-*.whl | head -n 1)"
        fi
        "$venv/bin/pip" install --quiet "$wheel" gguf==0.19.0 numpy
    else
        "$venv/bin/pip" install --quiet llama-cpp-python==0.3.36 gguf==0.19.0 numpy
    fi
fi
# What each side runs on, for the table's caption.
peer_isa="$("$venv/bin/python" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" 2>/dev/null \
    | tr '|' '\n' | grep -E '^ *(AVX|AVX2|AVX_VNNI|AVX512|AVX512_VNNI|AMX_INT8|FMA|F16C) *= *1' | tr -d ' ' | paste -sd, - || true)"
if [ "$mode" = avx2 ] && echo "$peer_isa" | grep -qE 'AVX512|AVX_VNNI|AMX'; then
    echo "compare: $venv's llama.cpp was not built for AVX2 only ($peer_isa)" >&2
    exit 1
fi
cargo build --profile "$profile" --bench decode --bench read_bandwidth >&2

# The machine's read bandwidth with `threads` threads (median of its rounds), GB/s.
read_bandwidth() {
    cargo bench --profile "$profile" --quiet --bench read_bandwidth -- --threads "$threads" --rounds 5 \
        | sed -n 's/.*"read_gb_s_median":\([0-9.]*\).*/\1/p'
}

# Bytes a decoded token reads from the weights: every tensor but the embedding table, which
# is read one row a token (unless it is also the output head: no `output.weight`).
decode_bytes() {
    "$venv/bin/python" - "$1" <<'PY'
import sys
from gguf import GGUFReader
tensors = GGUFReader(sys.argv[1]).tensors
names = {t.name for t in tensors}
tied = "output.weight" not in names
print(sum(int(t.n_bytes) for t in tensors if tied or t.name != "token_embd.weight"))
PY
}

# Resolves a model name to its file, making generated models on first use.
model_path() {
    case "$1" in
        default) echo "models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        *.gguf) echo "$1" ;;
        *)
            "$venv/bin/python" scripts/make-quant-models.py --only "$1" >&2
            "$venv/bin/python" scripts/make-quant-models.py --only "$1" --list | awk '{print $2}'
            ;;
    esac
}

# Seconds one read of a file takes once it is in the page cache (read twice, the second timed).
warm_read() {
    "$venv/bin/python" - "$1" <<'PY'
import sys, time
def read(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
read(sys.argv[1])
started = time.perf_counter()
read(sys.argv[1])
print(f"{time.perf_counter() - started:.4f}")
PY
}

for name in $models; do
    path="$(model_path "$name")"
    size="$(stat -c %s "$path")"
    warm="$(warm_read "$path")"
    # (0 where the `gguf` package cannot read the file: the bandwidth columns then say n/a.)
    read_bytes="$(decode_bytes "$path" 2>/dev/null)" || read_bytes=0
    # ferry's load when it packs the panel layouts (no cache), then one load that makes the
    # cache, so that every timed process below loads from it as a restarted server does.
    ferry_load() {
        RAYON_NUM_THREADS="$threads" cargo bench --profile "$profile" --quiet --bench decode -- \
            --model "$path" --prompt-tokens 1 --gen-tokens 1 --runs 1 \
            --cpu-qmatmul "$ferry_kernels" --panel-cache "$1" 2>/dev/null \
            | sed -n 's/.*"load_s":\([0-9.]*\).*/\1/p' | head -n 1 || true
    }
    packing="$(ferry_load off)"
    ferry_load auto >/dev/null
    for prompt_tokens in $prompts; do
        echo "compare: $name, $prompt_tokens-token prompt, $threads threads" >&2
        # One process of each side at a time, alternating, so that both see the same phases of
        # a noisy machine (a VM's speed drifts by 15-30 % over minutes); each process runs the
        # request twice and only the second (warm) run counts.
        ferry_out=""; ferry_err=""; peer_out=""; bandwidths=""
        for _ in $(seq "$runs"); do
            bandwidth="$(read_bandwidth)" || bandwidth=""
            bandwidths="$bandwidths $bandwidth"
            if one="$(RAYON_NUM_THREADS="$threads" cargo bench --profile "$profile" --quiet --bench decode -- \
                    --model "$path" --prompt-tokens "$prompt_tokens" --gen-tokens "$gen_tokens" \
                    --runs 2 --cpu-qmatmul "$ferry_kernels" 2>/tmp/ferry-compare-stderr.$$)"; then
                ferry_out="$ferry_out$one"$'\n'
            else
                ferry_err="$(grep -v '^\s*$' /tmp/ferry-compare-stderr.$$ | grep -iE 'error|cannot' | tail -n 1 || true)"
            fi
            rm -f /tmp/ferry-compare-stderr.$$
            # The peer gets ferry's prompt ids; when ferry could not load the file, the same
            # passage length in ids of the peer's own (any ids do for throughput).
            if [ -n "$ferry_out" ]; then
                ids="$(echo "$ferry_out" | head -n 1 | sed 's/.*"prompt_ids":\(\[[0-9, ]*\]\).*/\1/')"
            else
                ids="$(python3 -c "import json; print(json.dumps([(i * 7919) % 20000 + 100 for i in range($prompt_tokens)]))")"
            fi
            peer_out="$peer_out$("$venv/bin/python" benches/llama_cpp_peer.py "$path" "$ids" "$gen_tokens" 2 "$threads" 2>/dev/null || true)"$'\n'
        done
        [ -n "$ferry_out" ] && ferry_err=""
        python3 - "$name" "$prompt_tokens" "$size" "$warm" "$ferry_out" "$ferry_err" "$peer_out" "$packing" \
            "$read_bytes" "$bandwidths" >>"$results" <<'PY'
import json, sys
name, prompt, size, warm, ferry, ferry_err, peer, packing, read_bytes, bandwidths = sys.argv[1:11]
# Each process's warm runs (its first run is the warm-up).
rows = lambda text: [r for r in (json.loads(l) for l in text.splitlines() if l.strip().startswith("{"))
                     if r.get("run", 1) >= 1]
ferry_rows = rows(ferry)
for r in ferry_rows:
    r.pop("prompt_ids", None)
print(json.dumps({"model": name, "prompt": int(prompt), "size": int(size), "warm_read_s": float(warm),
                  "ferry_packing_load_s": float(packing) if packing else None,
                  "ferry": ferry_rows, "ferry_error": ferry_err, "peer": rows(peer),
                  "decode_bytes": int(read_bytes or 0), "read_gb_s": [float(b) for b in bandwidths.split()]}))
PY
        tail -n 1 "$results" >&2
    done
done

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
python3 - "$results" "$threads" "$profile" "$mode" "$cpu" "$ferry_kernels" "$peer_isa" <<'PY'
import json, statistics, sys
path, threads = sys.argv[1], sys.argv[2]
mode, cpu, ferry_kernels, peer_isa = sys.argv[4:8]
print(f"\nmode {mode} on {cpu}: ferry --cpu-qmatmul {ferry_kernels}; llama.cpp built with {peer_isa or 'unknown'}")
med = lambda rows, key: statistics.median(r[key] for r in rows) if rows else None
def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)
def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"
# The k-th process of each side ran back to back (alternating), so their ratio sees one phase
# of a drifting machine: the median of those ratios, and their range when there are several.
def paired(f, p, key):
    rs = sorted(a[key] / b[key] for a, b in zip(f, p) if a.get(key) and b.get(key))
    if not rs:
        return "n/a"
    spread = f" ({rs[0]:.2f}-{rs[-1]:.2f})" if len(rs) > 1 else ""
    return f"{statistics.median(rs):.2f}{spread}"
print(f"\n{threads} threads, ferry built with cargo profile {sys.argv[3]}; load = load-to-ready / one warm read of the file; "
      "RSS = resident set after loading / file size (llama.cpp's includes the Python interpreter); "
      "after req = ferry's resident set after a request / (file size + KV cache bytes allocated), then / "
      "(file size + KV bytes of the positions stored: the CPU's cache pages are resident only where written), split into "
      "anonymous memory, the model file's mapped pages and the binary's own pages; ferry's loads come from its panel "
      "cache (made before the timed runs), packing = one load without it (--panel-cache off) / the warm read; "
      "tok/s are each side's median over its processes, = is the median (and range) of the ratios of the "
      "processes that ran back to back; decode GB/s = weight bytes a token reads (the embedding table aside) x "
      "decode tok/s, against the machine's read bandwidth with the same threads (median of its runs beside the "
      "processes), of read = that fraction\n")
print("| model | prompt | prefill tok/s ferry / llama.cpp | = | decode tok/s ferry / llama.cpp | = "
      "| load s ferry / llama.cpp (warm read) | load x ferry / llama.cpp | RSS MiB ferry / llama.cpp (file) | RSS x ferry / llama.cpp "
      "| after req MiB ferry (file + KV) | after req x | x stored | anon / model / binary MiB | packing s (x) "
      "| decode GB/s ferry / llama.cpp (read GB/s) | of read ferry / llama.cpp |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for line in open(path):
    r = json.loads(line)
    f, p, warm, size = r["ferry"], r["peer"], r["warm_read_s"], r["size"]
    mib = size / 2**20
    fp, pp = med(f, "prefill_tok_s"), med(p, "prefill_tok_s")
    fd, pd = med(f, "decode_tok_s"), med(p, "decode_tok_s")
    fl, pl = med(f, "load_s"), med(p, "load_s")
    fr, pr = med(f, "rss_after_load"), med(p, "rss_after_load")
    # After a request (ferry only): total, its anonymous part, the model's and the binary's pages.
    have = lambda key: [x for x in f if key in x]
    fq, kv = med(have("rss_after_request"), "rss_after_request"), med(have("kv_bytes"), "kv_bytes")
    kvs = med(have("kv_stored_bytes"), "kv_stored_bytes")
    fa, fm, fb = (med(have(k), k) for k in ("rss_anon", "rss_model", "rss_binary"))
    if not f:
        why = r["ferry_error"] or "failed"
        note = "not loadable by ferry yet" if "cannot compute yet" in why else f"ferry failed: {why}"
        print(f"| {r['model']} | {r['prompt']} | {note} ({fmt(pp)} llama.cpp) | | "
              f"({fmt(pd)} llama.cpp) | | ({fmt(pl, '.3f')} llama.cpp, {warm:.3f}) | | | | | | | | | | |")
        continue
    mb = lambda b: None if b is None else b / 2**20
    # Decode as the rate the weights are read at, against the machine's read bandwidth.
    read = statistics.median(r["read_gb_s"]) if r.get("read_gb_s") else None
    gbs = lambda tok_s: None if tok_s is None or not r.get("decode_bytes") else tok_s * r["decode_bytes"] / 1e9
    of_read = lambda tok_s: None if gbs(tok_s) is None or not read else gbs(tok_s) / read
    print(f"| {r['model']} | {r['prompt']} | {fmt(fp)} / {fmt(pp)} | {paired(f, p, 'prefill_tok_s')} | {fmt(fd)} / {fmt(pd)} "
          f"| {paired(f, p, 'decode_tok_s')} | {fmt(fl, '.3f')} / {fmt(pl, '.3f')} ({warm:.3f}) "
          f"| {ratio(fl, warm)} / {ratio(pl, warm)} | {fmt(mb(fr), '.0f')} / {fmt(mb(pr), '.0f')} ({mib:.0f}) "
          f"| {ratio(fr, size)} / {ratio(pr, size)} "
          f"| {fmt(mb(fq), '.0f')} ({fmt(mb(size + kv), '.0f')}) | {ratio(fq, None if kv is None else size + kv)} "
          f"| {ratio(fq, None if kvs is None else size + kvs)} "
          f"| {fmt(mb(fa), '.0f')} / {fmt(mb(fm), '.0f')} / {fmt(mb(fb), '.0f')} "
          f"| {fmt(r.get('ferry_packing_load_s'), '.3f')} ({ratio(r.get('ferry_packing_load_s'), warm)}) "
          f"| {fmt(gbs(fd))} / {fmt(gbs(pd))} ({fmt(read)}) | {fmt(of_read(fd), '.2f')} / {fmt(of_read(pd), '.2f')} |")
PY
