#!/usr/bin/env bash
# TF parity check: bash tools/tf_compare/run.sh block_rnn|fused_batch_norm|batching|accumulator [--cases N] [--seed S]
# TF_PYTHON / TORCH_PYTHON override the two interpreters (TF and torch live in separate venvs).
set -euo pipefail
family=${1:-block_rnn}; shift || true
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
TF_PYTHON=${TF_PYTHON:-/work/tfvenv/bin/python}
TORCH_PYTHON=${TORCH_PYTHON:-/work/venv/bin/python}
out=$(mktemp -d "${TMPDIR:-/tmp}/tf_compare_${family}.XXXXXX")
trap 'rm -rf "$out"' EXIT
TF_CPP_MIN_LOG_LEVEL=3 CUDA_VISIBLE_DEVICES= "$TF_PYTHON" "$here/gen_${family}.py" "$out" "$@"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$TORCH_PYTHON" "$here/check_${family}.py" "$out"
