#!/usr/bin/env bash
# One command: set up .venv, build torchops, run the end-to-end demo and the benchmark.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" "$ROOT/requirements-demo.txt"
cd "$ROOT"
"$PY" examples/demo.py
"$PY" -m torchops.bench --quick "$@"
