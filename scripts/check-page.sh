#!/usr/bin/env bash
# A real browser on ferry's page (issue 34), for anyone to run by hand; CI does not run it (it
# needs Chromium and takes a minute). It starts `ferry serve --offload auto` on the default model
# on the CPU device (a budget that leaves layers on the host), opens `GET /` in headless
# Chromium, sends a chat message through the page's form (scripts/check-page.py, over the
# Chrome DevTools protocol), checks the streamed answer appears, and saves a screenshot (and a
# second one at a phone's width, with `chromium --headless --screenshot`).
#
# Usage: scripts/check-page.sh [SCREENSHOT_PNG] (default: target/check-page.png)
# Environment: FERRY (the binary, default target/release/ferry), MODEL (default
# models/SmolLM2-135M-Instruct.Q4_1.gguf), GPU_MEMORY (the budget, default 120MiB), CHROMIUM
# (default chromium), PYTHON (one with websocket-client; default /usr/bin/python3).
# Needs: Debian's `chromium` and `python3-websocket` (apt-get install -y chromium python3-websocket).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
screenshot="${1:-$root/target/check-page.png}"
ferry="${FERRY:-$root/target/release/ferry}"
model="${MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
chromium="${CHROMIUM:-chromium}"
python="${PYTHON:-/usr/bin/python3}"

command -v "$chromium" >/dev/null || { echo "check-page: no $chromium (apt-get install -y chromium)" >&2; exit 2; }
[[ -x "$ferry" ]] || { echo "check-page: no $ferry (cargo build --release)" >&2; exit 2; }
"$python" -c 'import websocket' 2>/dev/null \
  || { echo "check-page: $python lacks websocket-client (apt-get install -y python3-websocket)" >&2; exit 2; }

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
devtools="$(free_port)"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$ferry" serve --model "$model" --served-name smollm2 --offload auto \
  --gpu-memory "${GPU_MEMORY:-120MiB}" --max-context 1024 --device cpu --port "$port" \
  >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 240); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fs "http://127.0.0.1:$port/health" >/dev/null || { cat "$work/serve.log" >&2; echo "check-page: the server did not become healthy" >&2; exit 1; }

"$chromium" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
  --remote-debugging-port="$devtools" --window-size=1280,1000 "http://127.0.0.1:$port/" \
  >"$work/chromium.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  curl -fs "http://127.0.0.1:$devtools/json/version" >/dev/null 2>&1 && break
  sleep 0.5
done

mkdir -p "$(dirname "$screenshot")"
"$python" "$root/scripts/check-page.py" "$devtools" "$screenshot" "What is the capital of France?"
# The same page at a phone's width (a second, plain headless run: the layout, not the chat).
phone="${screenshot%.png}-phone.png"
"$chromium" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/phone" \
  --window-size=390,1600 --virtual-time-budget=4000 --screenshot="$phone" \
  "http://127.0.0.1:$port/" >"$work/phone.log" 2>&1
echo "check-page: phone-width screenshot in $phone"
echo "check-page: ok"
