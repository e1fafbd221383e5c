#!/usr/bin/env bash
# One command on one H200 for the bf16 fused indexer + top-k (csrc/sm90/indexer_topk/kernel_v2.cuh;
# design: docs/kernels/indexer_topk.md): correctness, sanitizers, benchmark and the attribution builds.
#
#   bash scripts/indexer_gpu.sh                       builds, then runs (about 4 minutes with 16 cores)
#   BUILD_ONLY=1 bash scripts/indexer_gpu.sh          only the builds (e.g. on the CPU box), into $BIN
#   BIN=build-itk bash scripts/indexer_gpu.sh --prebuilt   (or PREBUILT=1) runs binaries built earlier (carry $BIN)
#
# Steps (each under its own timeout; logs in $OUT, default /tmp/indexer_gpu):
#   1. builds the check program tests/cuda/indexer_topk_check.cu three times, in parallel: the kernel
#      (full) and its attribution builds (-DFLASHDSA_INDEXER_ABLATE=1: MMA only, =2: head sums + pass
#      test without appends); ptxas registers / spills of each are logged;
#   2. correctness: every case of the check program at every capacity (exact top-K multiset vs a
#      double CPU reference) and the T = 0 case;
#   3. benchmark, 2 rounds: --bench-only --bench-T $T_BENCH --bench-H $H_BENCH (each run also
#      spot-checks 9 rows at the first T against the CPU reference);
#   4. compute-sanitizer memcheck, racecheck, synccheck --small;
#   5. the two attribution builds once each, same shapes (their spot checks fail by design).
# Prints a summary table last. Exit status 0 when the kernel is correct and the sanitizers are clean.
# The run is bounded by BUDGET seconds (default 240 after the builds, which take about 60 s); a step
# with < 15 s left is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/gpu_steps.sh  # budget_step, build_variants, sanitize_steps, print_status; NVCC, SAN
OUT=${OUT:-/tmp/indexer_gpu}; mkdir -p "$OUT"
BIN=${BIN:-build-itk}; mkdir -p "$BIN"
T_BENCH=${T_BENCH:-8192,32768,131072}
H_BENCH=${H_BENCH:-32,64}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-240}
prebuilt=${PREBUILT:-0}
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) prebuilt=1; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
flags=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Xptxas -v -Iinclude -Icsrc)
variants=(full a1 a2)
declare -A vflags=([full]="" [a1]="-DFLASHDSA_INDEXER_ABLATE=1" [a2]="-DFLASHDSA_INDEXER_ABLATE=2")
status=()  # "step|result" lines for the table
T0=$(date +%s)

# 1. builds
if [ $prebuilt = 0 ]; then
  echo "=== builds ($(date -u +%H:%M:%S)): ${variants[*]}"
  build_rc=0
  build_variants tests/cuda/indexer_topk_check.cu csrc/sm90/indexer_topk/indexer_topk.cu itk csrc/common/ranges.cpp \
    csrc/common/status.cpp || build_rc=1
  echo "  builds done after $(( $(date +%s) - T0 )) s"
  rm -f "$BIN"/*.o  # the binaries alone are carried (about 18 MB)
  if [ $build_rc -ne 0 ]; then
    echo "build failed"; tail -n 20 "$OUT"/build_*.log; exit 2
  fi
  for v in "${variants[@]}"; do
    regs=$(grep -o "Used [0-9]* registers" "$OUT/build_$v.log" | awk '{print $2}' | sort -u | tr '\n' ' ')
    spills=$(grep -o "[0-9]* bytes spill stores" "$OUT/build_$v.log" | awk '{print $1}' | sort -u | tr '\n' ' ')
    warn=$(grep -c "C75[0-9][0-9]" "$OUT/build_$v.log")
    status+=("build $v|registers {${regs% }} spill stores {${spills% }} wgmma warnings $warn")
  done
  [ "${BUILD_ONLY:-0}" = 1 ] && { printf "%s\n" "${status[@]}"; echo "BUILD_ONLY=1: binaries in $BIN"; exit 0; }
else
  for v in "${variants[@]}"; do
    [ -x "$BIN/itk_$v" ] || { echo "--prebuilt: $BIN/itk_$v is missing"; exit 2; }
  done
  status+=("builds|prebuilt ($BIN)")
fi

START=$(date +%s); BUDGET=${BUDGET:-240}
left() { echo $((BUDGET - ($(date +%s) - START))); }
step() { STEP_TAIL=12 budget_step "$@"; }  # step NAME TIMEOUT LOG CMD...

# 2. correctness (full set)
step "correctness (all cases x 3 capacities)" 120 "$OUT/correctness.log" "$BIN/itk_full" --no-bench --seed 20261202
rc=$?
status+=("correctness|rc=$rc; $(grep -c ' PASS' "$OUT/correctness.log") PASS, $(grep -c ' FAIL' "$OUT/correctness.log") FAIL; $(tail -n 1 "$OUT/correctness.log")")

# 3. benchmark, 2 rounds
for r in 1 2; do
  step "round $r bench" 60 "$OUT/bench_full_r$r.log" "$BIN/itk_full" --bench-only --bench-T "$T_BENCH" --bench-H "$H_BENCH" --seed 7
done

# 4. sanitizers --small
sanitize_steps "" "memcheck:75 racecheck:75 synccheck:75" "$BIN/itk_full" --small --seed 1

# 5. attribution builds, once each
for v in a1 a2; do
  step "$v bench (attribution; spot checks fail by design)" 45 "$OUT/bench_$v.log" "$BIN/itk_$v" --bench-only --bench-T "$T_BENCH" --bench-H "$H_BENCH" --seed 7
done

# Summary. Bench lines of the check program: "  H T ms TFLOP/s workspace MiB delta MiB  spot".
ms() { awk -v H="$2" -v T="$3" '$1 == H && $2 == T && NF >= 7 { print $3; exit }' "$1" 2>/dev/null; }
spot() { awk -v H="$2" -v T="$3" '$1 == H && $2 == T && NF >= 7 { $1 = $2 = $3 = $4 = $5 = $6 = $7 = $8 = ""; gsub(/^ +/, ""); print; exit }' "$1" 2>/dev/null; }
echo
echo "================ summary (indexer + top-k; D_I = 128, K = 2048, relu, one causal sequence) ================"
print_status 34
echo
printf "%3s %7s | %-17s | %-9s %-9s | %s\n" "H_I" "T" "ms (r1 r2)" "a1 ms" "a2 ms" "spot check (r1)"
IFS=, read -ra Ts <<< "$T_BENCH"
IFS=, read -ra Hs <<< "$H_BENCH"
for H in "${Hs[@]}"; do
  for T in "${Ts[@]}"; do
    b1=$(ms "$OUT/bench_full_r1.log" "$H" "$T"); b2=$(ms "$OUT/bench_full_r2.log" "$H" "$T")
    printf "%3s %7s | %-17s | %-9s %-9s | %s\n" "$H" "$T" "${b1:--} ${b2:--}" \
      "$(ms "$OUT/bench_a1.log" "$H" "$T")" "$(ms "$OUT/bench_a2.log" "$H" "$T")" "$(spot "$OUT/bench_full_r1.log" "$H" "$T")"
  done
done
echo "(a1 = MMA only, a2 = + head sums and pass test, no appends: attribution of the full kernel's time)"
echo "logs: $OUT; total $(( $(date +%s) - T0 )) s"
fail=0
grep -q "ALL PASS" "$OUT/correctness.log" || fail=1
grep -q "SOME FAILED" "$OUT/bench_full_r1.log" "$OUT/bench_full_r2.log" && fail=1
if [ -x "$SAN" ]; then
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/memcheck.log" || fail=1
  grep -q "RACECHECK SUMMARY: 0 hazards" "$OUT/racecheck.log" || fail=1
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/synccheck.log" || fail=1
fi
echo "exit status $fail (0: correct at every case and spot check, sanitizers clean)"
exit $fail
