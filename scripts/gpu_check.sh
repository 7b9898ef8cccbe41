#!/usr/bin/env bash
# One command for a lent GPU machine (H100/H200, torch 2.11, Python 3.12, CUDA 13.0, 16 cores, no network):
# builds torchops with CUDA, runs every CUDA test, then the CUDA benchmarks. Run from the repository root:
#   bash scripts/gpu_check.sh [OUTDIR]
# Results go to OUTDIR (default $OUT, else ./gpu_check_out): build.log, pytest_cuda.log, pytest_full.log,
# bench_<family>.json/.log, summary.txt. Stage timings are printed and written to summary.txt.
#
# STAGES picks what runs, in this order (default: all of them, each only while TIME_BUDGET allows):
#   build tests bench_bn bench_rnn bench_brnn bench_batching full
# On a warm machine the in-place build survives between calls, so one session can split the work over
# calls of the device tool (each at most 10 minutes), e.g.
#   STAGES="build tests"  then  STAGES="bench_bn bench_rnn"  then  STAGES="bench_brnn bench_batching"
# (a stage list without `build` needs a CUDA build already in place). No stage runs past the budget.
#
# Python: the machine's plain `python3` already holds torch, pytest, pytest-xdist and numpy and nothing can be
# installed there, so it is used directly (no virtual environment). The build is in place, as in development.
# Environment knobs: TIME_BUDGET (seconds, default 540): later stages are skipped once it is spent;
# BENCH_QUICK=1: one round per benchmark case.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUTDIR="${1:-${OUT:-$ROOT/gpu_check_out}}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
BUDGET="${TIME_BUDGET:-540}"
STAGES=" ${STAGES:-build tests bench_bn bench_rnn bench_brnn bench_batching full} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
left() { echo $(( BUDGET - $(elapsed) )); }
START=$(date +%s)
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
stage() {  # stage NAME TIMEOUT_S LOGFILE COMMAND...: runs COMMAND under a timeout, logs it, records its time
  local name=$1 limit=$2 log=$3; shift 3
  local t0; t0=$(date +%s)
  echo "==== $name (limit ${limit}s, at $(elapsed)s)"
  timeout --signal=INT --kill-after=20 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  note "$name: exit $rc in $(( $(date +%s) - t0 ))s (log $(basename "$log"))"
  tail -n 25 "$log"
  return $rc
}

note "gpu_check at $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
nvidia-smi -L 2>&1 | tee -a "$SUMMARY"
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'device', torch.cuda.get_device_name())" 2>&1 | tee -a "$SUMMARY"

export CXX=/usr/bin/g++ CC=/usr/bin/gcc TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 TORCHOPS_WITH_CUDA=1 NVCC_THREADS=4
if want build; then
  if ! stage build 330 "$OUTDIR/build.log" "$PY" setup.py build_ext --inplace; then
    note "build failed: see build.log"
    exit 1
  fi
fi
"$PY" -c "import torchops, torchops._build_info as b; print('torchops', torchops.__file__, 'WITH_CUDA', b.WITH_CUDA)" 2>&1 | tee -a "$SUMMARY"

# cuDNN's reserve bytes per training batch norm (0: reserve_space_3 stays [0] on the cuDNN route too).
want bench_bn && "$PY" - <<'PYEOF' 2>&1 | tee -a "$SUMMARY"
import torch
for shape, fmt in [((32, 64, 56, 56), torch.contiguous_format), ((32, 64, 56, 56), torch.channels_last),
                   ((64, 256, 14, 14), torch.channels_last), ((4, 16, 3, 5, 6), torch.channels_last_3d)]:
    x = torch.empty(shape, device="cuda").contiguous(memory_format=fmt)
    print("cudnn batch norm reserve bytes", shape, fmt, torch._C._get_cudnn_batch_norm_reserve_space_size(x, True))
PYEOF

# Every CUDA test: marked `cuda`, named test_cuda_*, or a device-parametrized case on "cuda" (tests/conftest.py
# marks them all).
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }  # a stage limit within the budget
# TORCHOPS_ROUTE_REPORT: which routes each test ran, and its outcome (tests/conftest.py), for the per-route summary.
want tests && [ "$(left)" -ge 30 ] && TORCHOPS_ROUTE_REPORT="$OUTDIR/route_report.json" stage "pytest -m cuda" \
  "$(cap 240)" "$OUTDIR/pytest_cuda.log" "$PY" -m pytest -m cuda -q -ra -p no:cacheprovider -n 8 --dist loadfile tests
# Per CUDA route: tests passed and failed on this card. A never-run route that passed everything (and failed
# nothing) can be marked verified in csrc/<family>/routes.cpp with the card, torch version and date.
want tests && "$PY" - "$OUTDIR" <<'PYEOF' 2>&1 | tee -a "$SUMMARY"
import glob, json, sys
import torch, torchops
merged = {}
for path in glob.glob(sys.argv[1] + "/route_report.json*"):
    for route, e in json.load(open(path)).items():
        m = merged.setdefault(route, {"passed": 0, "failed": 0, "failed_tests": []})
        m["passed"] += e["passed"]; m["failed"] += e["failed"]; m["failed_tests"] += e["failed_tests"]
card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"per-route results on {card}, torch {torch.__version__}:")
for r in torchops.backends.routes(device="cuda"):
    m = merged.get(r["id"], {"passed": 0, "failed": 0, "failed_tests": []})
    state = "verified" if r["verified"] else "NEVER RUN before"
    verdict = "PASS" if m["passed"] and not m["failed"] else ("FAIL" if m["failed"] else "not exercised")
    print(f"  {r['id']:42s} {verdict:14s} passed {m['passed']:4d} failed {m['failed']:4d}  ({state})")
    for t in m["failed_tests"][:5]:
        print(f"      failed: {t}")
PYEOF

BENCH_ARGS=(--device cuda)
[ "${BENCH_QUICK:-0}" = 1 ] && BENCH_ARGS+=(--quick)
bench() {  # bench NAME FAMILY LIMIT_S ARGS...: one benchmark family, skipped when the budget is spent
  local name=$1 family=$2 limit=$3; shift 3
  want "$name" || return 0
  if [ "$(left)" -lt 60 ]; then note "$name: skipped, $(left)s of the ${BUDGET}s budget left"; return 0; fi
  stage "$name" "$(cap "$limit")" "$OUTDIR/$name.log" "$PY" -m torchops.bench --filter "$family" \
    --json "$OUTDIR/$name.json" "$@"
}
# BatchNorm: FP32 only (no matmul or convolution, so TF32 does not apply), five rounds per case.
bench bench_bn bn 120 "${BENCH_ARGS[@]}" --precision fp32
# CudnnRNN ops and modules (filter cudnn: both families) and the block RNN ops (rnn): FP32 and TF32, both
# sides under the same setting; one round per case to fit.
bench bench_rnn cudnn 150 --device cuda --quick --precision both
bench bench_brnn rnn 90 --device cuda --quick --precision both
# Batching: Python threads and C++ client threads (a libtorch driver, compiled on first use), FP32.
bench bench_batching batching 180 --device cuda --quick --precision fp32

if want full; then
  if [ "$(left)" -gt 90 ]; then
    stage "pytest full (not slow)" $(( $(left) - 20 )) "$OUTDIR/pytest_full.log" "$PY" -m pytest -q -ra \
      -p no:cacheprovider -n 12 --dist loadfile -m "not slow" tests
  else
    note "pytest full: skipped, $(left)s of the ${BUDGET}s budget left"
  fi
fi
note "total $(elapsed)s"
