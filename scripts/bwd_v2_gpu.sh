#!/usr/bin/env bash
# One-command GPU check of the sparse MLA backward v2 kernel (compile-time variant -DFLASHDSA_BWD_V2=1,
# csrc/sm90/sparse_mla_bwd/main_kernel_v2.cuh; design: docs/kernels/sparse_mla_bwd.md, "v2").
#   bash scripts/bwd_v2_gpu.sh            (one H200; about 6-8 minutes)
# Steps (each under its own timeout; logs in $OUT, default /tmp/bwd_v2_gpu):
#   1. builds the check program tests/cuda/sparse_mla_bwd_check.cu twice, in parallel: v1 (default
#      build) and v2 (-DFLASHDSA_BWD_V2=1);
#   2. v2: the 38 correctness cases (fast, deterministic 3 runs bitwise, mass) and the scale check;
#   3. A/B, fast mode, v1 / v2 alternated for 2 rounds: --bench-only --fast-only --T 4096,8192,32768,131072;
#   4. deterministic mode at 32K, v1 then v2 (--bench-only --T 32768: fast, det, det 3 runs bitwise);
#   5. compute-sanitizer memcheck and racecheck of v2 --small --no-bench.
# Prints a summary table last. Exit status 0 when every step passed. The whole run is bounded by
# BUDGET seconds (default 470): each step's timeout is cut to what is left, a step with < 15 s left is
# skipped. NO_REDS=1 adds a third build (v2 without any dkv write: the compute-path floor, wrong dkv)
# and one --bench-only --fast-only --T 4096,32768 run of it. BUILD_ONLY=1 stops after the builds;
# BUILD_TIMEOUT (default 300 s) bounds each nvcc process. PREBUILT=1 skips the builds and uses the binaries
# already in $BIN (e.g. built with BUILD_ONLY=1 on a machine without a GPU and carried over).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/gpu_steps.sh  # budget_step, build_variants, sanitize_steps, print_status; NVCC, SAN
OUT=${OUT:-/tmp/bwd_v2_gpu}; mkdir -p "$OUT"
BIN=${BIN:-/tmp/bwd_v2_gpu_bin}; mkdir -p "$BIN"
T_BENCH=${T_BENCH:-4096,8192,32768,131072}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}
flags=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Xptxas -v -Iinclude -Icsrc)
status=()  # "step|result" lines for the table
START=$(date +%s); BUDGET=${BUDGET:-470}
left() { echo $((BUDGET - ($(date +%s) - START))); }

step() { budget_step "$@"; }  # step NAME TIMEOUT LOG CMD...

if [ "${PREBUILT:-0}" = 1 ]; then
  echo "=== PREBUILT=1: using $BIN/bwd_v1 and $BIN/bwd_v2"
  for v in v1 v2; do [ -x "$BIN/bwd_$v" ] || { echo "missing $BIN/bwd_$v"; exit 2; }; done
else
# 1. builds: the check program's translation unit once, sparse_mla_bwd.cu per variant, all in parallel
echo "=== build v1 and v2 ($(date -u +%H:%M:%S))"
variants=(v1 v2)
declare -A vflags=([v1]="-DFLASHDSA_BWD_V2=0" [v2]="-DFLASHDSA_BWD_V2=1" [v2_nodkv]="-DFLASHDSA_BWD_V2=1 -DFLASHDSA_BWD_V2_NO_DKV=1")
[ "${NO_REDS:-0}" = 1 ] && variants+=(v2_nodkv)
build_rc=0
build_variants tests/cuda/sparse_mla_bwd_check.cu csrc/sm90/sparse_mla_bwd/sparse_mla_bwd.cu bwd || build_rc=1
echo "  builds done after $(( $(date +%s) - START )) s"
for v in v1 v2; do
  spills=$(grep -A1 "Function properties for .*main_kernel" "$OUT/build_$v.log" | grep -o "[0-9]* bytes spill stores" | sort -u | tr '\n' ' ')
  echo "  $v main kernel: ${spills:-?}"
done
if [ $build_rc -ne 0 ]; then
  echo "build failed"; tail -n 20 "$OUT"/build_*.log; exit 2
fi
fi
status+=("build v1 / v2|ok")
[ "${BUILD_ONLY:-0}" = 1 ] && { echo "BUILD_ONLY=1: builds in $BIN, stopping"; exit 0; }

# 2. v2 correctness
step "v2 correctness (38 cases + scale check)" 300 "$OUT/v2_correctness.log" "$BIN/bwd_v2" --no-bench
rc=$?
status+=("v2 correctness|rc=$rc; $(bwd_check_summary "$OUT/v2_correctness.log"); $(grep -c 'RUNS DIFFER' "$OUT/v2_correctness.log") det cases not bitwise")

# 3. A/B fast mode, alternated
for r in 1 2; do
  for v in v1 v2; do
    step "round $r $v fast --T $T_BENCH" 150 "$OUT/bench_fast_${v}_r$r.log" "$BIN/bwd_$v" --bench-only --fast-only --T "$T_BENCH"
  done
done

# 4. deterministic mode at 32K
for v in v1 v2; do
  step "$v det --T 32768" 150 "$OUT/bench_det_$v.log" "$BIN/bwd_$v" --bench-only --T 32768
done

# 4b. optional: the compute-path floor (no dkv writes at all; its dkv is wrong by design)
if [ "${NO_REDS:-0}" = 1 ] && [ -x "$BIN/bwd_v2_nodkv" ]; then
  step "v2 without dkv writes --T 4096,32768" 90 "$OUT/bench_fast_v2_nodkv.log" "$BIN/bwd_v2_nodkv" --bench-only --fast-only --T 4096,32768
  status+=("v2 no-dkv floor|$(awk -F'|' '$1 + 0 > 0 && NF >= 5 { split($2, a, " "); printf "T=%d %s ms (%s TFLOP/s); ", $1, a[1], a[2] }' "$OUT/bench_fast_v2_nodkv.log")")
fi

# 5. sanitizers on v2 --small
sanitize_steps "v2 " "memcheck:150 racecheck:240" "$BIN/bwd_v2" --small --no-bench

# Summary. Bench lines: "T | fast ms TFLOP/s | det ms TFLOP/s | fast+mass ms | checks".
echo
echo "================ summary (sparse MLA bwd v1 vs v2, H = 64, K = 2048, uniform indices) ================"
print_status 28
echo
printf "%8s | %-17s | %-17s | %9s | %s\n" "T" "v1 fast ms (r1 r2)" "v2 fast ms (r1 r2)" "v1/v2" "v2 fast+mass ms"
IFS=, read -ra Ts <<< "$T_BENCH"
for T in "${Ts[@]}"; do
  get() { awk -v T="$T" -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); print a[1]; exit }' "$1" 2>/dev/null; }
  getm() { awk -v T="$T" -F'|' '$1 + 0 == T && NF >= 5 { split($4, a, " "); print a[1]; exit }' "$1" 2>/dev/null; }
  a1=$(get "$OUT/bench_fast_v1_r1.log"); a2=$(get "$OUT/bench_fast_v1_r2.log")
  b1=$(get "$OUT/bench_fast_v2_r1.log"); b2=$(get "$OUT/bench_fast_v2_r2.log")
  ratio=$(awk -v a1="$a1" -v a2="$a2" -v b1="$b1" -v b2="$b2" 'BEGIN { if (b1 + b2 > 0 && a1 + a2 > 0) printf "%.3f", (a1 + a2) / (b1 + b2); else print "-" }')
  printf "%8s | %-17s | %-17s | %9s | %s\n" "$T" "${a1:--} ${a2:--}" "${b1:--} ${b2:--}" "$ratio" "$(getm "$OUT/bench_fast_v2_r2.log")"
done
echo
printf "%6s | %9s %9s | %-13s | %s\n" "32K" "fast ms" "det ms" "det/fast" "checks"
for v in v1 v2; do
  line=$(awk -F'|' '$1 + 0 == 32768 && NF >= 5' "$OUT/bench_det_$v.log" 2>/dev/null | head -1)
  fast=$(echo "$line" | awk -F'|' '{ split($2, a, " "); print a[1] }')
  det=$(echo "$line" | awk -F'|' '{ split($3, a, " "); print a[1] }')
  printf "%6s | %9s %9s | %-13s | %s\n" "$v" "${fast:--}" "${det:--}" \
    "$(awk -v f="$fast" -v d="$det" 'BEGIN { if (f > 0) printf "%.2f", d / f; else print "-" }')" "$(echo "$line" | awk -F'|' '{ print $NF }')"
done
echo "logs: $OUT"
fail=0
grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/v2_correctness.log" || fail=1
grep -q "DIFFER" "$OUT"/bench_det_v2.log && fail=1
grep -q "ERROR SUMMARY: 0 errors" "$OUT/v2_memcheck.log" 2>/dev/null || fail=1
grep -q "RACECHECK SUMMARY: 0 hazards" "$OUT/v2_racecheck.log" 2>/dev/null || fail=1
echo "exit status $fail (0: v2 correct, det bitwise, memcheck and racecheck clean)"
exit $fail
