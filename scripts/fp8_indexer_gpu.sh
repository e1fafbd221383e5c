#!/usr/bin/env bash
# One command on the H200 for the FP8 (e4m3) selection pass of indexer_topk (issue 20 item 2;
# docs/spec.md §3 "FP8 selection", docs/kernels/indexer_topk.md): builds the torch extension and the
# check program tests/cuda/indexer_topk_fp8_check.cu in one CMake build dir (every kernel compiled
# once), runs the FP8 correctness cases, the benchmark (bf16 vs FP8 time, recall of the bf16 top-K at
# T = 8K, 32K, 128K), the CUDA cases of tests/python/test_ops_indexer_fp8.py, and memcheck /
# racecheck of the check program's --small cases when compute-sanitizer is there. Per-step timeouts;
# logs under ${OUT:-/tmp/flashdsa_fp8}; a summary table last.
#
#   bash scripts/fp8_indexer_gpu.sh [--phases build,check,bench,pytest,sanitize] [--bench-H 32]
#                                   [--no-sanitize]            (defaults: every phase, --bench-H 32,64)
#
# Time: the runs take about 3 minutes after the build. The build is incremental (ninja) in the
# build dir; a cold build of every kernel takes a few minutes: on a fresh machine run
# `--phases build` first, then `--phases check,bench,pytest,sanitize`, to stay within one call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_fp8}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUILD=${FLASHDSA_BUILD_DIR:-build}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
bench_h=32,64; sanitize=1; phases=build,check,bench,pytest,sanitize
while [ $# -gt 0 ]; do
  case $1 in
    --bench-H) bench_h=$2; shift 2 ;;
    --phases) phases=$2; shift 2 ;;
    --no-sanitize) sanitize=0; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FLASHDSA_WITH_CUDA=1 FLASHDSA_BUILD_DIR=$BUILD
rows=()
source scripts/lib/gpu_steps.sh
step() { row_step "$@"; }  # step NAME TIMEOUT LOG CMD...

has() { [[ ",$phases," == *",$1,"* ]]; }
CHECK=$BUILD/indexer_topk_fp8_check
built=1
# 1. Build: the extension (in place, python/flashdsa/_C*.so) and the check program, one build dir.
if has build; then
  if ! { step "build extension" 420 build_ext.log $PY setup.py build_ext --inplace \
         && step "build check" 150 build_check.log cmake --build "$BUILD" --target indexer_topk_fp8_check -j "$MAX_JOBS"; }; then
    built=0
    tail -30 "$OUT/build_ext.log" "$OUT/build_check.log" 2>/dev/null
  fi
fi
if [ $built = 1 ] && [ -x "$CHECK" ]; then
  # 2. Correctness (quantization bitwise, the contract's selection, NaN rules), no benchmark.
  has check && step "fp8 check cases" 150 check.log "$CHECK" --no-bench --seed 1
  # 3. Benchmark + recall.
  has bench && step "fp8 benchmark" 150 bench.log "$CHECK" --bench-only --bench-T 8192,32768,131072 \
    --bench-H "$bench_h" --seed 2
  # 4. The Python CUDA cases of the FP8 option (op, quantization; CPU cases run in CI).
  has pytest && step "pytest fp8 (cuda)" 120 pytest.log env PYTHONPATH=python $PY -m pytest -q \
    -p no:cacheprovider tests/python/test_ops_indexer_fp8.py -k cuda -s
  # 5. compute-sanitizer on the small cases.
  if has sanitize && [ $sanitize = 1 ] && [ -x "$SAN" ]; then
    step "memcheck --small" 120 memcheck.log "$SAN" --tool memcheck --error-exitcode 3 "$CHECK" --small --seed 3
    step "racecheck --small" 150 racecheck.log "$SAN" --tool racecheck --error-exitcode 3 "$CHECK" --small --seed 3
  fi
elif [ $built = 1 ]; then
  echo "no $CHECK: run with --phases build first"
fi

echo "==== FP8 check cases"; grep -E "PASS|FAIL|bad rows" "$OUT/check.log" 2>/dev/null
echo "==== FP8 benchmark"; sed -n '/^Benchmark/,$p' "$OUT/bench.log" 2>/dev/null
echo "==== pytest"; grep -E "recall|passed|failed|error|skipped" "$OUT/pytest.log" 2>/dev/null | tail -5
for f in memcheck racecheck; do [ -f "$OUT/$f.log" ] && echo "==== $f: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$f.log" | tail -1)"; done
echo "==== summary (logs in $OUT)"
printf 'step | status | time | log\n'
printf '%s\n' "${rows[@]}"
