#!/usr/bin/env bash
# Runs every test: the C++ GoogleTest suite (+ GPU check programs, which skip without a GPU) and the
# Python suite (CPU always; CUDA variants when a GPU is present). Installs/builds first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash scripts/install.sh

printf '\n==> C++ tests (ctest)\n'
ctest --test-dir build --output-on-failure -j "${MAX_JOBS:-$(nproc)}"

printf '\n==> Python tests (pytest)\n'
$PY -m pytest -q -ra tests/python "$@"
