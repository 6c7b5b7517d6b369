#!/usr/bin/env bash
# Validates deploy/'s Kubernetes manifests (deploy/test_manifests.py): schemas from the PyPI
# package kubernetes-validate (installed once into a cached virtual environment) and the
# vendored CRD schemas in deploy/schemas; no cluster and no network beyond PyPI. CI runs it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FERRY_DEPLOY_VENV:-$HOME/.cache/ferry/deploy-check-venv}"
requirement="kubernetes-validate==1.37.0"
if ! "$venv/bin/python" -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
  echo "deploy/check: installing $requirement into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$requirement"
fi
cd "$here"
"$venv/bin/python" -m unittest -v test_manifests
