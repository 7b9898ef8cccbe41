#!/usr/bin/env bash
# One command: set up .venv, build torchops, run the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k batch_norm`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" "$ROOT/requirements-dev.txt"
cd "$ROOT"
echo "== running tests"
# pytest exits 5 when no test ran: that fails this script like any other non-zero exit.
"$PY" -m pytest -q -ra --durations=10 "$@"
