#!/usr/bin/env bash
# Create .venv (if needed), install the pinned requirements and build torchops into it.
# Usage: source scripts/setup_env.sh REQUIREMENTS_FILE...   (or run it with bash)
# Callers name their requirement files explicitly: a script sourced without arguments sees its caller's
# arguments (e.g. test.sh's pytest arguments) as its own.
# The build reuses build/torchops-cpu|cuda and is skipped when nothing it is built from has changed (setup.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "$#" -gt 0 ] || set -- "$ROOT/requirements-dev.txt"
for req in "$@"; do
  if [ ! -f "$req" ]; then
    echo "setup_env.sh: requirement file not found: '$req' (arguments are requirement files)" >&2
    exit 2
  fi
done
PYTHON="${PYTHON:-python3}"
VENV="${TORCHOPS_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
echo "== installing requirements"
"$PY" -m pip install -q --disable-pip-version-check "${@/#/-r}"
echo "== building torchops (TORCHOPS_WITH_CUDA=${TORCHOPS_WITH_CUDA:-auto})"
start=$(date +%s)
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e "$ROOT"
echo "== built in $(( $(date +%s) - start )) s: $("$PY" -c 'import torchops, torch, torchops._build_info as b; print("torchops", torchops.__version__, "on torch", torch.__version__, "| CUDA kernels:", torchops.built_with_cuda(), "(" + getattr(b, "CUDA_REASON", "?") + ")")')"
export PY
