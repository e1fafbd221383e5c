#!/usr/bin/env bash
# One-shot GPU validation used on the H200 (device runs): builds the torch extension with the CUDA
# kernels, runs the CUDA variants of the Python tests, the layer demo on the GPU and (optionally)
# the benchmark. Writes logs under ${OUT:-/tmp/flashdsa_gpu}; prints a short summary last.
#   bash scripts/gpu_validate.sh [--bench-seconds N] [--no-tests]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_gpu}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
bench_seconds=0; run_tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --bench-seconds) bench_seconds=$2; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FLASHDSA_WITH_CUDA=1
summary=()
t0=$(date +%s)
if $PY -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  summary+=("build: OK ($(( $(date +%s) - t0 )) s)")
else
  tail -30 "$OUT/build.log"; echo "build: FAILED"; exit 1
fi
$PY -c "import flashdsa, torch; print('flashdsa', flashdsa.__version__, 'cuda kernels:', flashdsa.built_with_cuda(), torch.cuda.get_device_name())"
if [ $run_tests = 1 ]; then
  $PY -m pytest -q -ra -k cuda tests/python >"$OUT/pytest_cuda.log" 2>&1
  summary+=("pytest -k cuda: $(tail -1 "$OUT/pytest_cuda.log")")
fi
$PY examples/dsa_layer_demo.py --device cuda >"$OUT/demo.log" 2>&1
summary+=("demo: $(grep RESULT "$OUT/demo.log" || tail -1 "$OUT/demo.log")")
if [ "$bench_seconds" -gt 0 ]; then
  $PY bench/run.py --device cuda --max-seconds "$bench_seconds" --out "$OUT/bench" >"$OUT/bench.log" 2>&1
  summary+=("bench: exit $? (log bench.log, report in bench/)")
fi
echo "==== summary"; printf '%s\n' "${summary[@]}"
