#!/usr/bin/env bash
# One command: set up .venv, build torchops, run the end-to-end main job (python -m torchops.demo: train
# with synchronous replicas, export, reload, serve). The benchmarks are their own command (python -m torchops.bench).
# Arguments go to the demo (e.g. `bash scripts/demo.sh --rnn lstm --processes`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" "$ROOT/requirements-dev.txt" "$ROOT/requirements-demo.txt"
cd "$ROOT"
echo "== python -m torchops.demo $*"
"$PY" -m torchops.demo "$@"
