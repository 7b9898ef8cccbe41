#!/usr/bin/env bash
# Compiles every translation unit against another torch release's headers, without installing it:
#   bash scripts/compile_against_torch.sh 2.11.0
# The oldest supported torch (setup.py's install_requires) is what the lent GPU machines carry, so a header
# change between it and the development torch must show up here, not in the GPU session's build. .cpp files are
# checked with `g++ -fsyntax-only`; .cu files are compiled for sm_90 with nvcc (CUDA host code included).
# Downloads the matching torch wheel from PyPI once (cached under ${TORCHOPS_TORCH_CACHE:-~/.cache/torchops}).
# Run from the repository's development environment (scripts/setup_env.sh): the cuDNN/cuBLAS headers come from
# its nvidia-* wheels. JOBS (default 2) compiles in parallel. Exits 1 if any file fails.
set -uo pipefail
VERSION="${1:?usage: compile_against_torch.sh TORCH_VERSION (e.g. 2.11.0)}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
CACHE="${TORCHOPS_TORCH_CACHE:-$HOME/.cache/torchops}/torch-$VERSION"
PYTAG=$("$PY" -c "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')")
if [ ! -d "$CACHE/torch/include" ]; then
  mkdir -p "$CACHE"
  "$PY" -m pip download "torch==$VERSION" --no-deps --only-binary=:all: --python-version "$PYTAG" -d "$CACHE" -q || exit 1
  (cd "$CACHE" && "$PY" -m zipfile -e torch-*.whl . >/dev/null) || exit 1
  rm -f "$CACHE"/torch-*.whl
  find "$CACHE/torch" -mindepth 1 -maxdepth 1 ! -name include ! -name version.py -exec rm -rf {} +
fi
INC="$CACHE/torch/include"
echo "torch headers: $(grep "^__version__" "$CACHE/torch/version.py")"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PYINC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
NVCC=$(command -v nvcc || true)
CUDA_INC=""
if [ -n "$NVCC" ]; then
  CUDA_INC=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)/include
fi
FLAGS="-std=c++20 -Icsrc -I$INC -I$INC/torch/csrc/api/include -I$PYINC ${CUDA_INC:+-I$CUDA_INC}"
FLAGS="$FLAGS $(ls -d "$SITE"/nvidia/*/include 2>/dev/null | sed 's/^/-I/' | tr '\n' ' ')"
FLAGS="$FLAGS -DTORCH_API_INCLUDE_EXTENSION_H -DPy_LIMITED_API=0x030A0000 -DTORCH_EXTENSION_NAME=_C -D_GLIBCXX_USE_CXX11_ABI=1"
export FLAGS NVCC
one() {
  local f=$1 out rc
  case "$f" in
    *.cu) out=$("$NVCC" -c "$f" -o /dev/null $FLAGS --expt-relaxed-constexpr -O1 -gencode arch=compute_90,code=sm_90 2>&1) ;;
    *_isa.cpp)  # one build per CPU capability, with setup.py's flags (a file that starts at AVX2 says so)
      out="" rc=0
      for level in 0 1 2; do
        if [ $level -eq 0 ] && grep -q "TORCHOPS_CPU_CAPABILITY < 1" "$f"; then continue; fi
        isa=""; [ $level -ge 1 ] && isa="-mavx2 -mfma"; [ $level -eq 2 ] && isa="$isa -mavx512f -mavx512vl -mavx512bw -mavx512dq"
        out+=$(g++ -fsyntax-only -fopenmp -Wall -Wno-unused-parameter -Wno-psabi $FLAGS -DTORCHOPS_CPU_DISPATCH=1 \
          -DTORCHOPS_CPU_CAPABILITY=$level $isa "$f" 2>&1) || rc=1
      done
      [ $rc -eq 0 ] ;;
    *) out=$(g++ -fsyntax-only -fopenmp -Wall -Wno-unused-parameter -Wno-psabi $FLAGS -DTORCHOPS_CPU_DISPATCH=1 "$f" 2>&1) ;;
  esac
  rc=$?
  if [ $rc -eq 0 ]; then echo "ok   $f"; else echo "FAIL $f"; echo "$out" | grep -E "error" | head -20; fi
  return $rc
}
export -f one
FILES=$(ls csrc/*.cpp csrc/*/*.cpp; [ -n "$NVCC" ] && ls csrc/cuda/*.cu)
[ -n "$NVCC" ] || echo "nvcc not found: the .cu files are not checked"
if echo "$FILES" | xargs -P "${JOBS:-2}" -n 1 bash -c 'one "$0"'; then
  echo "all $(echo "$FILES" | wc -l) files compile against torch $VERSION"
else
  echo "some files do not compile against torch $VERSION"
  exit 1
fi
