#!/usr/bin/env bash
# One command: set up .venv, build torchops, run the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k batch_norm`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" "$ROOT/requirements-dev.txt"
cd "$ROOT"
echo "== running tests"
# One pytest-xdist worker per CPU, at most 4 (TORCHOPS_TEST_WORKERS=N sets N, 0 runs in this process); the tests of
# a file run in order in one worker (tests/conftest.py). An `-n` among the arguments wins (the last one counts).
cpus=$(nproc 2>/dev/null || echo 1)
workers="${TORCHOPS_TEST_WORKERS:-$(( cpus < 2 ? 0 : (cpus < 4 ? cpus : 4) ))}"
# pytest exits 5 when no test ran: that fails this script like any other non-zero exit.
"$PY" -m pytest -q -ra --durations=10 -n "$workers" --dist loadfile "$@"
