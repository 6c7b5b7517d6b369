#!/usr/bin/env bash
# ferry's GPU check: one script for a lent GPU machine (no cargo, no internet), with a CPU dry run.
#
#   scripts/gpu-check.sh [--full] [--dry-run] [--bundle PATH] [--out DIR] [--work DIR]
#                        [--ferry PATH] [--deadline SECONDS] [--steps LIST]
#
# GPU (default): unpacks the bundle (dist/ferry-cuda.tar.xz -> ferry-cuda/ferry and, if present,
# ferry-cuda/ferry-gpu-tests), prints an nvidia-smi summary (read-only), then answers, in this
# order, so that a run cut off early still says the most (each step has its own timeout under one
# global deadline; a step that would start too late gets a "skipped: out of time" row):
#   a gpu tests    ferry-gpu-tests --test-threads=1 (FERRY_GPU_TEST_MODEL = the small model)
#   b logits       ferry logprobs vs transformers on the same weights (greedy tokens, max |diff|)
#   c bandwidth    pinned host-to-device GB/s (torch, CUDA events)
#   d decode       tok/s at batch 1 and 8, offload none / auto (half the layers streamed) /
#                  sequential, against the PCIe bound; device memory (driver) against the plan
#   e prefill      2k-token prefill time to first token, auto vs none
#   f accelerate   device_map="auto" with the same max_memory: decode tok/s, ferry / accelerate
#   g moe          a Qwen3-30B-A3B-shaped MoE (4 of 48 layers, 128 experts, top 8): decode tok/s
#                  per offload tier (stream / host / auto) with half the experts offloaded
#                  (offload.experts; bf16, and q8_0 at load: experts of GGUF blocks, which
#                  have the host tier on CUDA) and with half the layers (experts false),
#                  against the PCIe bound (link bandwidth / bytes moved per token)
#   h speculation  batch-1 decode of the large model with every layer streamed, without
#                  speculation, with ngram, with itself as the draft (acceptance 1: the
#                  ceiling, tokens per streamed pass) and with the small model as the draft
#                  (acceptance ~0: the adaptive length must back off); acceptance, the PCIe
#                  bound, and the greedy tokens against the plain run
# The models are generated on the machine first (seeded bf16 HF checkpoints with the real
# Llama-3.2-1B / Llama-3.1-8B layer shapes and fewer layers: 4 of 16 and 8 of 32, --full: 16 of 16
# and 16 of 32), the small one before (a), the large one before (d); the MoE one (transformers'
# Qwen3MoeConfig, seeded) before (g).
#
# Profiles: quick (default) fits in 7 minutes including model generation and the first CUDA
# JIT (deadline 400 s); --full: more tokens, the 2k prefill, larger models (deadline 540 s).
#
# Files: everything is written under the work folder (--work: models, the unpacked bundle,
# logs, step data, the report). After every step, exactly four files are copied into the output
# folder (--out, default $OUT), the whole of what comes back from a device run:
#   gpu-check.md (the table), gpu-check.json, results.jsonl (one row per line) and
#   logs.tar.xz (logs/ and data/ of the work folder).
#
# --dry-run: the same pipeline on this CPU machine: target/release/ferry (built if missing; or
# --ferry PATH), device cpu, scaled-down models in f32, link_bandwidth 2GB/s, host memcpy
# instead of pinned H2D, transformers/accelerate on the CPU; the GPU test binary is skipped.
# --steps c,d: run only these steps (models are generated as the chosen steps need).
#
# Environment: FERRY_PYTHON (default python3) with torch, transformers, accelerate,
# safetensors, numpy; OUT (the default for --out); FERRY_GPU_CHECK_WORK (default for --work;
# generated models are reused when their marker matches).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELPERS="$ROOT/scripts/gpu_check"
TOKENIZER="$ROOT/tests/fixtures/smollm2-hf-tokenizer"

DRY_RUN=0
QUICK=1
FERRY_ARG=""
BUNDLE="$ROOT/dist/ferry-cuda.tar.xz"
OUT_DIR="${OUT:-}"
WORK="${FERRY_GPU_CHECK_WORK:-}"
DEADLINE_S=""
STEPS="a,b,c,d,e,f,g,h"
PY="${FERRY_PYTHON:-python3}"

usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() {
    echo "gpu-check: error: $*" >&2
    exit 2
}

while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --quick) QUICK=1 ;;
        --full) QUICK=0 ;;
        --ferry) FERRY_ARG="${2:?--ferry needs a path}"; shift ;;
        --bundle) BUNDLE="${2:?--bundle needs a path}"; shift ;;
        --out) OUT_DIR="${2:?--out needs a folder}"; shift ;;
        --work) WORK="${2:?--work needs a folder}"; shift ;;
        --deadline) DEADLINE_S="${2:?--deadline needs seconds}"; shift ;;
        --steps) STEPS="${2:?--steps needs a list like c,d}"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done

if ((DRY_RUN)); then
    : "${OUT_DIR:=/tmp/ferry-gpu-check-dry}"
    : "${WORK:=/tmp/ferry-gpu-check-work-dry}"
    : "${DEADLINE_S:=1200}"
else
    : "${OUT_DIR:=/tmp/ferry-gpu-check}"
    : "${WORK:=/tmp/ferry-gpu-check-work}"
    if ((QUICK)); then : "${DEADLINE_S:=400}"; else : "${DEADLINE_S:=540}"; fi
fi
[[ $DEADLINE_S =~ ^[0-9]+$ ]] || die "--deadline must be whole seconds, got '$DEADLINE_S'"
[[ $STEPS =~ ^[a-h](,[a-h])*$ ]] || die "--steps must be a list of a-h like c,d, got '$STEPS'"

mkdir -p "$OUT_DIR" "$WORK"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(cd "$WORK" && pwd)
[[ $OUT_DIR != "$WORK" ]] || die "--out and --work must be different folders"
# The report, logs and data live in the work folder; publish copies four files into OUT_DIR.
REPORT="$WORK/report"
LOGS="$WORK/logs"
DATA="$WORK/data"
rm -rf "$REPORT" "$LOGS" "$DATA"
mkdir -p "$REPORT" "$LOGS" "$DATA"
PUBLISHED=(gpu-check.md gpu-check.json results.jsonl logs.tar.xz)
for f in "${PUBLISHED[@]}"; do rm -f "$OUT_DIR/$f"; done
STARTED=$SECONDS
DEADLINE=$((SECONDS + DEADLINE_S))
STEP_PID=""

export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1
export FERRY_GPU_CHECK_DRY_RUN=$DRY_RUN

log() { printf '[%s +%3ds] %s\n' "$(date +%H:%M:%S)" "$((SECONDS - STARTED))" "$*"; }

command -v "$PY" >/dev/null 2>&1 || die "FERRY_PYTHON='$PY' is not on PATH"
"$PY" -c 'import json, sys; assert sys.version_info >= (3, 8)' 2>/dev/null ||
    die "'$PY' is not a working Python >= 3.8"

report() { "$PY" "$HELPERS/report.py" "$@"; }
# row STEP METRIC VALUE VERDICT NOTE [GOAL]
row() { report add "$REPORT" "$1" "$2" "$3" --verdict "$4" --note="$5" --goal="${6:--}"; }
skip() { row "$1" "step" "-" SKIP "skipped: $2"; }
meta() { report meta "$REPORT" "$@" >/dev/null; }

# Copies the report and one archive of the logs into OUT_DIR (after every step, so a run killed
# from outside still leaves what it measured). Never fails the script.
publish() {
    local f
    for f in gpu-check.md gpu-check.json results.jsonl; do
        [[ -f $REPORT/$f ]] && cp "$REPORT/$f" "$OUT_DIR/$f.tmp" && mv "$OUT_DIR/$f.tmp" "$OUT_DIR/$f"
    done
    cp "$REPORT/meta.json" "$LOGS/meta.json" 2>/dev/null || true
    tar -C "$WORK" -cJf "$OUT_DIR/logs.tar.xz.tmp" logs data 2>/dev/null &&
        mv "$OUT_DIR/logs.tar.xz.tmp" "$OUT_DIR/logs.tar.xz" || rm -f "$OUT_DIR/logs.tar.xz.tmp"
    return 0
}

on_signal() {
    log "interrupted; stopping the running step"
    if [[ -n $STEP_PID ]]; then
        kill -TERM "$STEP_PID" 2>/dev/null || true
        wait "$STEP_PID" 2>/dev/null || true
    fi
    meta "finished=interrupted after $((SECONDS - STARTED)) s" || true
    publish
    exit 130
}
trap on_signal INT TERM

# run_step STEP_LABEL TIMEOUT_S COMMAND... : runs COMMAND under `timeout` (capped by the global
# deadline), output to the terminal and logs/step-*.log. Exit 0 or 3 (the step wrote its own error
# rows) add nothing; a timeout or any other exit adds an ERROR row. Never fails the script.
run_step() {
    local label=$1 limit=$2
    shift 2
    local left=$((DEADLINE - SECONDS - 5))
    if ((left < 20)); then
        skip "$label" "out of time (${left}s left of the ${DEADLINE_S}s deadline)"
        return 0
    fi
    local t=$((limit < left ? limit : left))
    local logf
    logf="$LOGS/step-${label// /-}.log"
    log "step $label (timeout ${t}s)"
    local rc=0
    GPU_CHECK_STEP_TIMEOUT=$t timeout -k 15 "$t" "$@" > >(tee -a "$logf") 2>&1 &
    STEP_PID=$!
    wait "$STEP_PID" || rc=$?
    STEP_PID=""
    case $rc in
        0 | 3) ;;
        124 | 137) row "$label" "step" "-" ERROR "timed out after ${t}s (log: logs/${logf##*/})" ;;
        *) row "$label" "step" "-" ERROR "exit $rc: $(last_lines "$logf")" ;;
    esac
    log "step $label done (exit $rc, $((SECONDS - STARTED))s elapsed)"
    publish
}

model_ready() { [[ -f "$1/.ferry-gpu-check.json" ]]; }
# The last two non-empty lines of a file, on one line (for error rows).
last_lines() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 2 | tr '\n' ' ' | cut -c1-300; }

# ---------------------------------------------------------------------------------------------
# Setup: mode, Python, ferry binary, device.
if ((DRY_RUN)); then MODE="dry-run (cpu)"; else MODE="gpu"; fi
meta "mode=$MODE" "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)" "host=$(hostname)" \
    "deadline_s=$DEADLINE_S" "quick=$QUICK" "steps=$STEPS" "python=$PY"
log "ferry GPU check: mode $MODE, out $OUT_DIR, work $WORK, deadline ${DEADLINE_S}s"

PYINFO=$("$PY" - <<'EOF' 2>&1 || true
import sys
parts = ["python " + sys.version.split()[0]]
for name in ("torch", "transformers", "accelerate", "safetensors", "numpy", "tokenizers"):
    try:
        mod = __import__(name)
        parts.append(f"{name} {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        parts.append(f"{name} MISSING ({type(e).__name__})")
try:
    import torch
    parts.append(f"cuda available {torch.cuda.is_available()}")
except Exception:
    pass
print(", ".join(parts))
EOF
)
HAVE_TORCH=0
HAVE_HF=0
"$PY" -c 'import torch, safetensors, tokenizers' >/dev/null 2>&1 && HAVE_TORCH=1
((HAVE_TORCH)) && "$PY" -c 'import transformers, accelerate' >/dev/null 2>&1 && HAVE_HF=1
PY_VERDICT=INFO
[[ $HAVE_TORCH$HAVE_HF == 11 ]] || PY_VERDICT=ERROR
row "0 setup" "python" "$PY" "$PY_VERDICT" "$PYINFO"
NO_TORCH="torch/safetensors/tokenizers not importable in $PY (set FERRY_PYTHON)"
NO_HF="transformers/accelerate not importable in $PY (set FERRY_PYTHON)"

FERRY=""
GPU_TESTS=""
if ((DRY_RUN)); then
    FERRY="${FERRY_ARG:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ferry}"
    if [[ ! -x $FERRY ]]; then
        log "building $FERRY (cargo build --release --bin ferry)"
        if ! (cd "$ROOT" && cargo build --release --bin ferry) >"$LOGS/cargo-build.log" 2>&1; then
            row "0 setup" "ferry binary" "-" ERROR \
                "cargo build failed: $(last_lines "$LOGS/cargo-build.log")"
            FERRY=""
        fi
    fi
    if [[ -n $FERRY ]]; then
        row "0 setup" "ferry binary" "$("$FERRY" --version 2>&1 | head -n 1)" INFO "$FERRY (CPU build)"
    fi
    CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
    row "0 setup" "device" "cpu" INFO "dry run: $(nproc) cores, ${CPU_NAME:-unknown CPU}; no GPU"
else
    BUNDLE_DIR="$WORK/bundle"
    if [[ ! -f $BUNDLE ]]; then
        row "0 setup" "bundle" "-" ERROR "bundle not found: $BUNDLE"
    else
        rm -rf "$BUNDLE_DIR"
        mkdir -p "$BUNDLE_DIR"
        how="tar -xJf"
        if ! tar -xJf "$BUNDLE" -C "$BUNDLE_DIR" 2>"$LOGS/unpack.log"; then
            how="python tarfile (tar -xJf failed: $(tail -n 1 "$LOGS/unpack.log"))"
            rm -rf "$BUNDLE_DIR" && mkdir -p "$BUNDLE_DIR"
            "$PY" "$HELPERS/unpack.py" "$BUNDLE" "$BUNDLE_DIR" >>"$LOGS/unpack.log" 2>&1 ||
                how="FAILED"
        fi
        if [[ $how == FAILED ]]; then
            row "0 setup" "bundle" "-" ERROR "cannot unpack $BUNDLE: $(tail -n 1 "$LOGS/unpack.log")"
        else
            listing=$(cd "$BUNDLE_DIR" && find . -type f -printf '%P %s\n' | head -n 20 | tr '\n' ';')
            row "0 setup" "bundle" "unpacked" INFO "$BUNDLE via $how: $listing"
            bin="$BUNDLE_DIR/ferry-cuda"
            [[ -f $bin/ferry ]] && FERRY="$bin/ferry"
            [[ -f $bin/ferry-gpu-tests ]] && GPU_TESTS="$bin/ferry-gpu-tests"
            chmod +x "$BUNDLE_DIR"/ferry-cuda/* 2>/dev/null || true
            if [[ -z $FERRY ]]; then
                row "0 setup" "ferry binary" "-" ERROR "no ferry-cuda/ferry in $BUNDLE"
            fi
        fi
    fi
    # CUDA libraries for the ferry binary: the bundle's own lib/ first, then the Python
    # environment's nvidia/*/lib folders (pip CUDA wheels, e.g. torch's); the system ones stay.
    extra=""
    [[ -d $BUNDLE_DIR/ferry-cuda/lib ]] && extra="$BUNDLE_DIR/ferry-cuda/lib"
    pylibs=$("$PY" - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()]
dirs = sorted({d for r in roots for d in glob.glob(os.path.join(r, "nvidia", "*", "lib"))
               + glob.glob(os.path.join(r, "nvidia", "cu*", "lib"))})
print(":".join(dirs))
EOF
)
    [[ -n $pylibs ]] && extra="${extra:+$extra:}$pylibs"
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$extra"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$LOGS/ld-library-path.txt"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1 || true
        fields="index,name,driver_version,memory.total,memory.used"
        fields+=",pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current"
        gpu=$(nvidia-smi --query-gpu="$fields" --format=csv,noheader 2>&1 | head -n 4 | tr '\n' ';')
        log "nvidia-smi: $gpu"
        row "0 setup" "device" "cuda:0" INFO \
            "nvidia-smi (index, name, driver, mem total, used, PCIe gen cur/max, width): $gpu"
    else
        row "0 setup" "device" "-" ERROR "nvidia-smi not found"
    fi
    if [[ -n $FERRY ]]; then
        # The bundle's `ferry` is a launcher script; ldd reads the binary beside it.
        elf="$FERRY"
        [[ -f "$(dirname "$FERRY")/ferry-bin" ]] && elf="$(dirname "$FERRY")/ferry-bin"
        ldd "$elf" >"$LOGS/ldd-ferry.txt" 2>&1 || true
        missing=$(grep 'not found' "$LOGS/ldd-ferry.txt" | awk '{print $1}' | tr '\n' ' ' || true)
        if [[ -n $missing ]]; then
            row "0 setup" "ferry binary" "-" ERROR \
                "missing shared libraries: $missing(see logs/ldd-ferry.txt)"
        else
            row "0 setup" "ferry binary" "$("$FERRY" --version 2>&1 | head -n 1)" INFO "$FERRY"
        fi
    fi
fi

if ((DRY_RUN)); then
    SMALL=tiny-1B BIG=tiny-8B MODEL_DTYPE=f32 FERRY_DEVICE=cpu TORCH_DEVICE=cpu
elif ((QUICK)); then
    SMALL=1B-4L BIG=8B-8L MODEL_DTYPE=bf16 FERRY_DEVICE=cuda:0 TORCH_DEVICE=cuda
else
    SMALL=1B BIG=8B-16L MODEL_DTYPE=bf16 FERRY_DEVICE=cuda:0 TORCH_DEVICE=cuda
fi
MOE=30B-A3B-4L
((DRY_RUN)) && MOE=tiny-moe
SMALL_DIR="$WORK/models/$SMALL"
BIG_DIR="$WORK/models/$BIG"
MOE_DIR="$WORK/models/$MOE"
if ((QUICK)); then
    TOKENS=16 PREFILL=1024 ACCEL_TOKENS=4 BW_REPS=3 MOE_TOKENS=8 SPEC_TOKENS=24
else
    TOKENS=64 PREFILL=2000 ACCEL_TOKENS=8 BW_REPS=5 MOE_TOKENS=32 SPEC_TOKENS=64
fi
((DRY_RUN)) && ((!QUICK)) && TOKENS=32

# ---------------------------------------------------------------------------------------------
# make_models LABEL NAME DIR: generates one model (once; reused while its marker matches).
make_models() {
    local label=$1 name=$2 dir=$3
    model_ready "$dir" && return 0
    if ((!HAVE_TORCH)); then skip "$label" "$NO_TORCH"; return 0; fi
    run_step "$label" 150 "$PY" "$HELPERS/make_model.py" --out "$REPORT" \
        --model "$name:$dir" --dtype "$MODEL_DTYPE" --tokenizer "$TOKENIZER" --device auto
}
wants() { [[ ",$STEPS," == *",$1,"* ]]; }
make_moe() {
    model_ready "$MOE_DIR" && return 0
    # transformers' Qwen3MoeConfig and safetensors; torch draws the weights, else numpy (f32).
    if ! "$PY" -c 'import transformers, safetensors, numpy' >/dev/null 2>&1; then
        skip "0 moe model" "transformers/safetensors/numpy not importable in $PY (set FERRY_PYTHON)"
        return 0
    fi
    run_step "0 moe model" 150 "$PY" "$HELPERS/make_moe_model.py" --out "$REPORT" \
        --model "$MOE:$MOE_DIR" --dtype "$MODEL_DTYPE" --tokenizer "$TOKENIZER" --device auto
}

wants a || wants b || wants h && make_models "0 small model" "$SMALL" "$SMALL_DIR"
if wants a; then
    L="a gpu tests"
    if ((DRY_RUN)); then
        skip "$L" "dry run (no GPU)"
    elif [[ -z $GPU_TESTS ]]; then
        row "$L" "gpu tests" "-" SKIP "not in bundle (no ferry-cuda/ferry-gpu-tests in $BUNDLE)"
    else
        model_arg=()
        model_ready "$SMALL_DIR" && model_arg=(--model "$SMALL_DIR")
        run_step "$L" 120 "$PY" "$HELPERS/gpu_tests.py" --out "$REPORT" --binary "$GPU_TESTS" \
            ${model_arg[@]+"${model_arg[@]}"} --log "$LOGS/gpu-tests.log"
    fi
fi
if wants b; then
    L="b logits"
    if ((!HAVE_HF)); then skip "$L" "$NO_HF"
    elif [[ -z $FERRY ]]; then skip "$L" "no ferry binary"
    elif ! model_ready "$SMALL_DIR"; then skip "$L" "no $SMALL model"
    else
        run_step "$L" 90 "$PY" "$HELPERS/logits_check.py" --out "$REPORT" --ferry "$FERRY" \
            --model "$SMALL_DIR" --logs "$LOGS" --ferry-device "$FERRY_DEVICE" \
            --ferry-dtype "$MODEL_DTYPE" --torch-device "$TORCH_DEVICE" --tokens 4
    fi
fi
if wants c; then
    L="c bandwidth"
    if ((DRY_RUN)); then
        run_step "$L" 40 "$PY" "$HELPERS/bandwidth.py" --out "$REPORT" \
            --json "$DATA/bandwidth.json" --cpu --mib 256 --reps "$BW_REPS"
    elif ((!HAVE_TORCH)); then
        skip "$L" "$NO_TORCH"
    else
        run_step "$L" 40 "$PY" "$HELPERS/bandwidth.py" --out "$REPORT" \
            --json "$DATA/bandwidth.json" --mib 1024 --reps "$BW_REPS"
    fi
fi
wants d || wants e || wants f || wants h && make_models "0 large model" "$BIG" "$BIG_DIR"
link=()
((DRY_RUN)) && link=(--link-bandwidth 2GB/s)
for phase in d e; do
    wants $phase || continue
    if [[ $phase == d ]]; then L="d decode"; else L="e prefill"; fi
    if [[ -z $FERRY ]]; then skip "$L" "no ferry binary"; continue; fi
    if ! model_ready "$BIG_DIR"; then skip "$L" "no $BIG model"; continue; fi
    args=(--phase decode --tokens "$TOKENS" --data "$DATA/decode.json")
    limit=150
    [[ $phase == e ]] && args=(--phase prefill --tokens 2 --data "$DATA/prefill.json") && limit=90
    run_step "$L" "$limit" "$PY" "$HELPERS/decode_bench.py" --out "$REPORT" --ferry "$FERRY" \
        --model "$BIG_DIR" --device "$FERRY_DEVICE" --dtype "$MODEL_DTYPE" ${link[@]+"${link[@]}"} \
        --bandwidth-json "$DATA/bandwidth.json" --logs "$LOGS" \
        --prefill-tokens "$PREFILL" --batch 8 "${args[@]}"
done
if wants f; then
    L="f accelerate"
    cpu=()
    ((DRY_RUN)) && cpu=(--cpu)
    if ((!HAVE_HF)); then skip "$L" "$NO_HF"
    elif ! model_ready "$BIG_DIR"; then skip "$L" "no $BIG model"
    else
        run_step "$L" 90 "$PY" "$HELPERS/accel_bench.py" --out "$REPORT" --model "$BIG_DIR" \
            --decode-data "$DATA/decode.json" --dtype "$MODEL_DTYPE" --tokens "$ACCEL_TOKENS" \
            ${cpu[@]+"${cpu[@]}"}
    fi
fi
if wants g; then
    L="g moe"
    make_moe
    if [[ -z $FERRY ]]; then skip "$L" "no ferry binary"
    elif ! model_ready "$MOE_DIR"; then skip "$L" "no $MOE model"
    else
        run_step "$L" 210 "$PY" "$HELPERS/moe_bench.py" --out "$REPORT" --ferry "$FERRY" \
            --model "$MOE_DIR" --device "$FERRY_DEVICE" --dtype "$MODEL_DTYPE" \
            ${link[@]+"${link[@]}"} --bandwidth-json "$DATA/bandwidth.json" --logs "$LOGS" \
            --tokens "$MOE_TOKENS" --data "$DATA/moe.json"
    fi
fi
if wants h; then
    L="h speculation"
    if [[ -z $FERRY ]]; then skip "$L" "no ferry binary"
    elif ! model_ready "$BIG_DIR"; then skip "$L" "no $BIG model"
    elif ! model_ready "$SMALL_DIR"; then skip "$L" "no $SMALL model (the unrelated draft)"
    else
        run_step "$L" 150 "$PY" "$HELPERS/spec_bench.py" --out "$REPORT" --ferry "$FERRY" \
            --model "$BIG_DIR" --draft-model "$SMALL_DIR" --device "$FERRY_DEVICE" \
            --dtype "$MODEL_DTYPE" ${link[@]+"${link[@]}"} --bandwidth-json "$DATA/bandwidth.json" \
            --logs "$LOGS" --tokens "$SPEC_TOKENS" --data "$DATA/spec.json"
    fi
fi

meta "finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)" "duration_s=$((SECONDS - STARTED))"
publish
log "done in $((SECONDS - STARTED))s; report: $OUT_DIR/gpu-check.md (+ gpu-check.json, results.jsonl, logs.tar.xz)"
echo
cat "$OUT_DIR/gpu-check.md" 2>/dev/null || true
