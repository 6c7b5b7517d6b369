#!/usr/bin/env bash
# The Python clients the suite drives the real server with (the official openai SDK and
# LangChain's OpenAI integration), installed once from PyPI into a cached virtual environment.
# Prints the environment's python on stdout. scripts/test.sh runs it before the tests; the suite
# reads FERRY_CLIENT_PYTHON (default: the path below) and fails, naming this script, without it.
set -euo pipefail
venv="${FERRY_CLIENT_VENV:-$HOME/.cache/ferry/client-venv}"
requirements=("openai==3.63.0" "langchain-openai==1.8.1")
if ! "$venv/bin/python" -c 'import openai, langchain_openai' 2>/dev/null; then
  echo "client-venv: installing ${requirements[*]} into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}" >&2
fi
echo "$venv/bin/python"
