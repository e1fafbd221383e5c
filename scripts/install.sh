#!/usr/bin/env bash
# Installs FlashDSA's dependencies (Debian packages, pinned PyPI packages) and builds
#  - the C++ library, its GoogleTest tests, the GPU check programs and the torch extension (one
#    CMake build, build/),
#  - the Python package (editable install; setup.py builds the extension through the same CMake build).
# Idempotent: a second run only rebuilds what changed. CUDA code is compiled whenever the CUDA
# toolkit is present (also on machines without a GPU); FLASHDSA_WITH_CUDA=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
jobs=${MAX_JOBS:-$(nproc)}
export MAX_JOBS=$jobs

step() { printf '\n==> %s\n' "$*"; }

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  step "pip install torch==$TORCH_VERSION (first time: a few minutes)"
  $PY -m pip install -q "torch==$TORCH_VERSION"
fi
step "pip install test/bench dependencies"
# setuptools within torch's own requirement (torch 2.11: setuptools<82), so pip's resolver is content.
$PY -m pip install -q "numpy>=1.26" "pytest>=8" "ninja>=1.11" "matplotlib>=3.8" "setuptools>=69,<82" wheel

# --- Megatron Core backend tests (flashdsa[megatron], docs/megatron.md; owner: megatron helper) ---
# megatron-core 0.19.2 is pure Python and declares Python >= 3.12, but runs on 3.11; its DSA path
# needs only torch, numpy and packaging (already installed), hence --no-deps.
if ! $PY -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('megatron-core') == '0.19.2' else 1)" 2>/dev/null; then
  step "pip install megatron-core==0.19.2 (Megatron Core backend tests)"
  $PY -m pip install -q --ignore-requires-python --no-deps "megatron-core==0.19.2" "packaging>=23"
fi

if [ -z "${FLASHDSA_WITH_CUDA:-}" ]; then
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then FLASHDSA_WITH_CUDA=1; else FLASHDSA_WITH_CUDA=0; fi
fi
export FLASHDSA_WITH_CUDA
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
cuda_flag=OFF; [ "$FLASHDSA_WITH_CUDA" = 1 ] && cuda_flag=ON

# One CMake build for everything: the library, its tests, the C++ example and the torch extension
# (the pip step below only copies the extension out of build/ when nothing changed).
step "CMake build (C++ library, tests, torch extension; CUDA=$cuda_flag)"
generator=(); [ -f build/CMakeCache.txt ] || generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHDSA_WITH_CUDA=$cuda_flag \
  -DFLASHDSA_BUILD_TORCH=ON -DFLASHDSA_PYTHON="$($PY -c 'import sys; print(sys.executable)')" >/dev/null
cmake --build build -j "$jobs"

# The editable install is redone only when the extension's inputs changed (sources, build files,
# torch version, CUDA on/off) or the installed flashdsa is not this tree's with its _C built.
stamp=build/.flashdsa_pip_stamp
inputs=$( { echo "$FLASHDSA_WITH_CUDA $($PY -c 'import torch; print(torch.__version__)')";
            find csrc include setup.py pyproject.toml python/flashdsa/_version.py -type f -print0 | sort -z |
              xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1)
installed_here=$($PY -c "import flashdsa, flashdsa._C, os; print(os.path.realpath(flashdsa.__file__))" 2>/dev/null || true)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && [ "$installed_here" = "$(realpath python/flashdsa/__init__.py)" ]; then
  step "Python package + torch extension: up to date (no reinstall)"
else
  step "Python package + torch extension (CUDA=$FLASHDSA_WITH_CUDA)"
  $PY -m pip install -q --no-build-isolation -e . 2>&1 | grep -v -E "^\s*$|Running as the 'root'|WARNING: Running pip" || true
  mkdir -p build && echo "$inputs" > "$stamp"
fi
$PY -c "import flashdsa; print('flashdsa', flashdsa.__version__, '| CUDA kernels built:', flashdsa.built_with_cuda())"
