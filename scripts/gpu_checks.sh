#!/usr/bin/env bash
# Builds the library with the sm90 kernels and the GPU check programs of tests/cuda/ through the
# CMake project (the product's flags) and runs each check program, in one command. Logs under
# ${OUT:-/tmp/flashdsa_gpu_checks}; a summary table last. Exit 0 when every program passes.
#
#   bash scripts/gpu_checks.sh [--small] [--bench]
#
#   --small: the programs' --small correctness sets (about a minute in all); default: the full sets.
#   --bench: also run each program's benchmark part (default: --no-bench).
#   --prebuilt DIR: skip the build and run the programs found in DIR (built elsewhere with this CMake
#                   project, e.g. on a machine without a GPU, and carried over).
# Environment: JOBS (build parallelism, default nproc), STEP_TIMEOUT (seconds per program, default 900).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_gpu_checks}; mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
size_flag=""; bench_flag="--no-bench"; prebuilt=""
while [ $# -gt 0 ]; do
  case $1 in
    --small) size_flag="--small"; shift ;;
    --bench) bench_flag=""; shift ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
programs=(hopper_primitives_check indexer_topk_check indexer_topk_fp8_check sparse_mla_fwd_check sparse_mla_bwd_check
          kl_loss_check)
summary=()
t0=$(date +%s)
bindir=$OUT/build
if [ -n "$prebuilt" ]; then
  bindir=$prebuilt
  summary+=("$(printf '%-26s %-8s %6s s' build "prebuilt" 0)")
elif ! { cmake -S . -B "$OUT/build" -G Ninja -DFLASHDSA_WITH_CUDA=ON -DFLASHDSA_BUILD_TESTS=ON \
         -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
       timeout 1800 cmake --build "$OUT/build" -j "$JOBS" --target "${programs[@]}" >"$OUT/build.log" 2>&1; }; then
  tail -n 30 "$OUT/cmake.log" "$OUT/build.log"; echo "build: FAILED (logs in $OUT)"; exit 1
else
  summary+=("$(printf '%-26s %-8s %6s s' build OK $(( $(date +%s) - t0 )))")
fi
status=0
for prog in "${programs[@]}"; do
  args=""
  [ "$prog" != hopper_primitives_check ] && args="$size_flag $bench_flag"
  t=$(date +%s)
  timeout "$STEP_TIMEOUT" "$bindir/$prog" $args >"$OUT/$prog.log" 2>&1
  rc=$?
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;  # no GPU
    124) verdict=TIMEOUT; status=1 ;;
    *) verdict="FAIL($rc)"; status=1 ;;
  esac
  summary+=("$(printf '%-26s %-8s %6s s  %s' "$prog" "$verdict" $(( $(date +%s) - t )) "$args")")
done
echo "==== summary (logs in $OUT)"
printf '%s\n' "${summary[@]}"
exit $status
