#!/usr/bin/env bash
# Create .venv (if needed), install the pinned requirements and build torchops into it.
# Usage: source scripts/setup_env.sh [extra requirement files...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${TORCHOPS_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
echo "== installing requirements"
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-dev.txt" "${@/#/-r}"
echo "== building torchops (TORCHOPS_WITH_CUDA=${TORCHOPS_WITH_CUDA:-auto})"
start=$(date +%s)
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e "$ROOT"
echo "== built in $(( $(date +%s) - start )) s: $("$PY" -c 'import torchops, torch; print("torchops", torchops.__version__, "on torch", torch.__version__, "| CUDA kernels:", torchops.built_with_cuda())')"
export PY
