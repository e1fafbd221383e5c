#!/usr/bin/env bash
# One-command GPU check of the sparse MLA backward (csrc/sm90/sparse_mla_bwd/; design and measurements:
# docs/kernels/sparse_mla_bwd.md) through its check program tests/cuda/sparse_mla_bwd_check.cu.
#   PREBUILT=1 BIN=build-bwd SKIP_SAN=1 BUDGET=570 bash scripts/bwd_gpu.sh   (about 4 min; SWEEP_AB=1: + 1-2 min)
#   PREBUILT=1 BIN=build-bwd SAN_ONLY=1 BUDGET=570 bash scripts/bwd_gpu.sh   (about 5-8 min)
#   PREBUILT=1 BIN=build-x AB_ONLY=1 SKIP_SAN=1 BUDGET=570 bash scripts/bwd_gpu.sh   (A/B only: about 3-4 min)
#   bash scripts/bwd_gpu.sh                                                  (builds first: + about 2 min)
# Binaries: BUILD_ONLY=1 BIN=build-bwd [SWEEP_AB=1] [NO_REDS=1] [AB_FLAGS=-D...] bash scripts/bwd_gpu.sh on a
# machine without a GPU builds them and packs them as $BIN/bwd_bin.tar.xz (build-*/ is git-ignored: carry
# it to the GPU machine, where the script unpacks it; an ab binary in it brings its flags along).
# Builds (scripts/lib/gpu_steps.sh build_variants; the check translation unit once, sparse_mla_bwd.cu per
# variant, in parallel):
#   main     the library's kernel as shipped (default flags);
#   sweepab  only with SWEEP_AB=1: -DFLASHDSA_BWD_SWEEP_MIN_KEYS=$SWEEP_AB_KEYS, the A/B of the sorted
#            sweep's threshold (the library's: T_kv >= 20480, tuning::kBwdSweepMinKeys). Default
#            0x7fffffffffff: never sweep, so that T_SWEEP_AB (default 8K, 16K, 24K, 32K; 8K is a control,
#            no sweep in either build) shows from which T_kv on the sweep pays; SWEEP_AB_KEYS=24576 tries
#            a threshold directly;
#   nodkv    only with NO_REDS=1: -DFLASHDSA_BWD_NO_DKV=1, no dkv writes at all (wrong dkv by design): the
#            compute-path floor, benched at 4K and 32K;
#   ab       only with AB_FLAGS="-D..." (or a prebuilt bwd_ab): sparse_mla_bwd.cu with those nvcc flags, the
#            A/B of a compile-time variant (e.g. AB_FLAGS=-DFLASHDSA_BWD_SWEEP_MIN_KEYS=24576).
# Steps (each under its own timeout; logs in $OUT, default /tmp/bwd_gpu):
#   1. (unless PREBUILT=1) the builds;
#   2. main: the 38 correctness cases (fast, deterministic 3 runs bitwise, mass) and the scale check;
#      sweepab: the reduced (--small) correctness set; ab: the same 38 cases + scale check (--no-bench);
#   3. main: fast, deterministic and fast + mass at T_BENCH (default 4K, 8K, 16K, 32K, 64K, 128K;
#      --bench-only), then the deterministic mode's 3-run bitwise check at each T of T_DET (default 32K,
#      128K; --bench-only --T <T>);
#   4. SWEEP_AB=1: main / sweepab alternated for 2 rounds, --bench-only --fast-only --T $T_SWEEP_AB;
#      NO_REDS=1: nodkv --bench-only --fast-only --T 4096,32768;
#      ab: main / ab alternated (the order swapped every round) for AB_ROUNDS (default 2) rounds, for each
#      index set of AB_INDICES (default "uniform causal": --bench-indices, causal = the peers benchmark's
#      ascending rows), --bench-only --fast-only --T $T_AB (default 4K, 8K, 16K, 32K);
#   5. compute-sanitizer memcheck, racecheck, synccheck of main --small --no-bench (and of ab when built).
# AB_ONLY=1 (with an ab build): step 2 and 5 for ab only, no step 3, step 4 only the ab rounds.
# Prints one summary table last. Exit 0 when main is correct, the deterministic mode bitwise repeatable,
# the sanitizers clean (when run), sweepab --small correct and ab correct (when built). The run is bounded by BUDGET
# seconds (default 470): each step's timeout is cut to what is left, a step with < 15 s left is skipped
# (the sanitizers come last). SAN_ONLY=1 runs only step 5 (and the table); SKIP_SAN=1 skips it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
source scripts/lib/gpu_steps.sh  # budget_step, build_variants, sanitize_steps, print_status; NVCC, SAN
OUT=${OUT:-/tmp/bwd_gpu}; mkdir -p "$OUT"
BIN=${BIN:-/tmp/bwd_gpu_bin}; mkdir -p "$BIN"
T_BENCH=${T_BENCH:-4096,8192,16384,32768,65536,131072}
T_DET=${T_DET:-32768,131072}
T_SWEEP_AB=${T_SWEEP_AB:-8192,16384,24576,32768}
T_AB=${T_AB:-4096,8192,16384,32768}
AB_INDICES=${AB_INDICES:-uniform causal}
AB_ROUNDS=${AB_ROUNDS:-2}
AB_FLAGS=${AB_FLAGS:-}
SWEEP_AB_KEYS=${SWEEP_AB_KEYS:-0x7fffffffffff}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}
flags=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Xptxas -v -Iinclude -Icsrc)
variants=(main)
[ "${SWEEP_AB:-0}" = 1 ] && variants+=(sweepab)
[ "${NO_REDS:-0}" = 1 ] && variants+=(nodkv)
declare -A vflags=([main]="" [sweepab]="-DFLASHDSA_BWD_SWEEP_MIN_KEYS=$SWEEP_AB_KEYS" [nodkv]="-DFLASHDSA_BWD_NO_DKV=1")
status=()  # "step|result" lines for the table
START=$(date +%s); BUDGET=${BUDGET:-470}
step() { budget_step "$@"; }  # step NAME TIMEOUT LOG CMD...
# field LOG T COLUMN: the first number of bench column COLUMN (2 fast ms, 3 det ms, 4 fast+mass ms) at T.
# Bench lines: "T | fast ms TFLOP/s | det ms TFLOP/s | fast+mass ms | checks".
field() { awk -v T="$2" -v c="$3" -F'|' '$1 + 0 == T && NF >= 5 { split($c, a, " "); print a[1]; exit }' "$1" 2>/dev/null; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else print "-" }'; }

# A carried build folder may come as one archive (bwd_bin.tar.xz next to the binaries).
if [ -f "$BIN/bwd_bin.tar.xz" ] && [ ! -x "$BIN/bwd_main" ]; then
  echo "=== unpacking $BIN/bwd_bin.tar.xz"; tar -xJf "$BIN/bwd_bin.tar.xz" -C "$BIN" || exit 2
fi
# The ab variant: built with AB_FLAGS, or prebuilt (its flags recorded in $BIN/ab_flags.txt).
if [ -z "$AB_FLAGS" ] && [ "${PREBUILT:-0}" = 1 ] && [ -x "$BIN/bwd_ab" ]; then
  AB_FLAGS=$(cat "$BIN/ab_flags.txt" 2>/dev/null || echo "?")
fi
AB=0; [ -n "$AB_FLAGS" ] && { AB=1; variants+=(ab); vflags[ab]=$AB_FLAGS; }
if [ "${AB_ONLY:-0}" = 1 ] && [ $AB = 0 ]; then echo "AB_ONLY=1 needs AB_FLAGS or a prebuilt $BIN/bwd_ab"; exit 2; fi

if [ "${PREBUILT:-0}" = 1 ]; then
  echo "=== PREBUILT=1: using $BIN/bwd_{${variants[*]}}"
  for v in "${variants[@]}"; do [ -x "$BIN/bwd_$v" ] || { echo "missing $BIN/bwd_$v"; exit 2; }; done
  status+=("build|prebuilt ($BIN)")
else
  echo "=== build ${variants[*]} ($(date -u +%H:%M:%S))"
  build_rc=0
  build_variants tests/cuda/sparse_mla_bwd_check.cu csrc/sm90/sparse_mla_bwd/sparse_mla_bwd.cu bwd || build_rc=1
  echo "  builds done after $(( $(date +%s) - START )) s"
  for v in "${variants[@]}"; do
    spills=$(grep -A1 "Function properties for .*main_kernel" "$OUT/build_$v.log" | grep -o "[0-9]* bytes spill stores" | sort -u | tr '\n' ' ')
    echo "  $v main kernels: ${spills:-?}"
  done
  if [ $build_rc -ne 0 ]; then echo "build failed"; tail -n 20 "$OUT"/build_*.log; exit 2; fi
  status+=("build ${variants[*]}|ok")
  grep -E "C75(1[0-9]|20)|serializ" "$OUT"/build_*.log && echo "  WGMMA SERIALISATION WARNING (see above)"
  extra=(); [ $AB = 1 ] && { printf '%s\n' "$AB_FLAGS" > "$BIN/ab_flags.txt"; extra=(ab_flags.txt); }
  if [ "${BUILD_ONLY:-0}" = 1 ]; then
    (cd "$BIN" && tar -cJf bwd_bin.tar.xz "${variants[@]/#/bwd_}" "${extra[@]}") || exit 2
    echo "BUILD_ONLY=1: binaries and $BIN/bwd_bin.tar.xz ($(du -h "$BIN/bwd_bin.tar.xz" | cut -f1)), stopping"
    exit 0
  fi
fi

MAIN_STEPS=1; [ "${AB_ONLY:-0}" = 1 ] && MAIN_STEPS=0
Tdet=()
if [ "${SAN_ONLY:-0}" != 1 ]; then
  # 2. correctness
  if [ $MAIN_STEPS = 1 ]; then
  step "correctness (38 cases + scale check)" 240 "$OUT/correctness.log" "$BIN/bwd_main" --no-bench
  rc=$?
  status+=("correctness|rc=$rc; $(bwd_check_summary "$OUT/correctness.log"); $(grep -c 'DIFFER' "$OUT/correctness.log") det lines DIFFER")
  fi
  if [ $AB = 1 ]; then
    step "ab correctness (38 cases + scale check)" 240 "$OUT/ab_correctness.log" "$BIN/bwd_ab" --no-bench
    rc=$?
    status+=("ab correctness ($AB_FLAGS)|rc=$rc; $(bwd_check_summary "$OUT/ab_correctness.log"); $(grep -c 'DIFFER' "$OUT/ab_correctness.log") det lines DIFFER")
  fi
  if [ "${SWEEP_AB:-0}" = 1 ]; then
    step "sweepab correctness --small" 90 "$OUT/sweepab_correctness.log" "$BIN/bwd_sweepab" --small --no-bench
    status+=("sweepab correctness --small|rc=$?; $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$OUT/sweepab_correctness.log" | tail -1)")
  fi

  # 3. fast / det / fast + mass at every T, then the det bitwise check at the T_DET points
  if [ $MAIN_STEPS = 1 ]; then
  step "bench --T $T_BENCH" 200 "$OUT/bench.log" "$BIN/bwd_main" --bench-only --T "$T_BENCH"
  status+=("bench (fast, det, mass)|rc=$?; $(awk -F'|' 'NF >= 5 && $1 + 0 > 0 && $NF ~ /[a-z]/ { print "T=" $1 + 0 ":" $NF }' "$OUT/bench.log" | tr '\n' ' ')")
  IFS=, read -ra Tdet <<< "$T_DET"
  for T in "${Tdet[@]}"; do
    step "det bitwise --T $T" 90 "$OUT/det_$T.log" "$BIN/bwd_main" --bench-only --T "$T"
    status+=("det 3 runs at T=$T|rc=$?;$(awk -v T="$T" -F'|' '$1 + 0 == T && NF >= 5 { print $NF; exit }' "$OUT/det_$T.log")")
  done
  fi

  # 4. optional A/B and floor
  if [ "${SWEEP_AB:-0}" = 1 ]; then
    for r in 1 2; do
      for v in main sweepab; do
        step "round $r $v fast --T $T_SWEEP_AB" 100 "$OUT/sweep_${v}_r$r.log" "$BIN/bwd_$v" --bench-only --fast-only --T "$T_SWEEP_AB"
      done
    done
  fi
  if [ $AB = 1 ]; then
    for r in $(seq 1 "$AB_ROUNDS"); do
      order="main ab"; [ $((r % 2)) = 0 ] && order="ab main"
      for idx in $AB_INDICES; do
        for v in $order; do
          step "round $r $v $idx fast --T $T_AB" 100 "$OUT/ab_${v}_${idx}_r$r.log" \
            "$BIN/bwd_$v" --bench-only --fast-only --T "$T_AB" --bench-indices "$idx"
        done
      done
    done
  fi
  if [ "${NO_REDS:-0}" = 1 ]; then
    step "nodkv fast --T 4096,32768" 90 "$OUT/nodkv.log" "$BIN/bwd_nodkv" --bench-only --fast-only --T 4096,32768
    status+=("nodkv (no dkv writes) floor|$(awk -F'|' '$1 + 0 > 0 && NF >= 5 { split($2, a, " "); printf "T=%d %s ms (%s TFLOP/s); ", $1, a[1], a[2] }' "$OUT/nodkv.log")")
  fi
fi

# 5. sanitizers on --small
if [ "${SKIP_SAN:-0}" != 1 ]; then
  [ $MAIN_STEPS = 1 ] && sanitize_steps "" "memcheck:150 racecheck:240 synccheck:150" "$BIN/bwd_main" --small --no-bench
  [ $AB = 1 ] && sanitize_steps "ab " "memcheck:150 racecheck:240 synccheck:150" "$BIN/bwd_ab" --small --no-bench
fi

# Summary.
echo
echo "================ summary (sparse MLA bwd, H = 64, K = 2048, T_kv = T, uniform indices) ================"
print_status 30
if [ "${SAN_ONLY:-0}" != 1 ] && [ $MAIN_STEPS = 1 ]; then
  echo
  printf "%8s | %9s | %9s | %9s | %13s\n" "T" "fast ms" "det ms" "det/fast" "fast+mass ms"
  IFS=, read -ra Ts <<< "$T_BENCH"
  for T in "${Ts[@]}"; do
    fast=$(field "$OUT/bench.log" "$T" 2); det=$(field "$OUT/bench.log" "$T" 3)
    printf "%8s | %9s | %9s | %9s | %13s\n" "$T" "${fast:--}" "${det:--}" "$(ratio "$fast" "$det")" \
      "$(field "$OUT/bench.log" "$T" 4)"
  done
  echo "(det/fast = fast ms / det ms: the deterministic mode's speed relative to the fast mode; issue 19 asks >= 0.8)"
  if [ "${SWEEP_AB:-0}" = 1 ]; then
    echo
    thr="from T_kv >= $((SWEEP_AB_KEYS))"; [ $((SWEEP_AB_KEYS)) -ge $((1 << 40)) ] && thr="never"
    echo "sweep threshold A/B: main (sweep from T_kv >= 20480) vs sweepab (sweep $thr), fast ms (r1 / r2)"
    printf "%8s | %-21s | %-21s | %s\n" "T" "main" "sweepab" "main / sweepab (> 1: sweepab faster)"
    IFS=, read -ra Ts <<< "$T_SWEEP_AB"
    for T in "${Ts[@]}"; do
      declare -A mean=()
      printf "%8s" "$T"
      for v in main sweepab; do
        a=$(field "$OUT/sweep_${v}_r1.log" "$T" 2); b=$(field "$OUT/sweep_${v}_r2.log" "$T" 2)
        mean[$v]=$(awk -v a="$a" -v b="$b" 'BEGIN { n = (a > 0) + (b > 0); if (n) printf "%.2f", (a + b) / n; else print "" }')
        printf " | %-21s" "${mean[$v]:--} (${a:--} / ${b:--})"
      done
      printf " | %s\n" "$(ratio "${mean[main]}" "${mean[sweepab]}")"
    done
  fi
fi
if [ "${SAN_ONLY:-0}" != 1 ] && [ $AB = 1 ]; then
  echo
  echo "compile-time A/B: main (default flags) vs ab ($AB_FLAGS); fast ms, H = 64, K = 2048, T_kv = T"
  echo "(rounds alternate the order; mean of the rounds; ratio = main / ab: > 1 means ab is faster)"
  printf "%8s | %-7s | %-24s | %-24s | %s\n" "T" "indices" "main (r1 / r2 ..)" "ab (r1 / r2 ..)" "main / ab"
  IFS=, read -ra Ts <<< "$T_AB"
  for idx in $AB_INDICES; do
    for T in "${Ts[@]}"; do
      declare -A mean=()
      printf "%8s | %-7s" "$T" "$idx"
      for v in main ab; do
        vals=()
        for r in $(seq 1 "$AB_ROUNDS"); do x=$(field "$OUT/ab_${v}_${idx}_r$r.log" "$T" 2); vals+=("${x:--}"); done
        mean[$v]=$(printf '%s\n' "${vals[@]}" | awk '$1 > 0 { s += $1; n++ } END { if (n) printf "%.2f", s / n }')
        printf " | %-24s" "${mean[$v]:--} ($(printf '%s / ' "${vals[@]}" | sed 's| / $||'))"
      done
      printf " | %s\n" "$(ratio "${mean[main]}" "${mean[ab]}")"
    done
  done
fi
echo "logs: $OUT"
fail=0
if [ "${SAN_ONLY:-0}" != 1 ]; then
  if [ $MAIN_STEPS = 1 ]; then
    grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/correctness.log" || fail=1
    grep -q "DIFFER" "$OUT/correctness.log" "$OUT"/det_*.log "$OUT/bench.log" 2>/dev/null && fail=1
    for T in "${Tdet[@]}"; do grep -q "det 3 runs bitwise equal" "$OUT/det_$T.log" || fail=1; done
  fi
  if [ "${SWEEP_AB:-0}" = 1 ]; then grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/sweepab_correctness.log" || fail=1; fi
  if [ $AB = 1 ]; then
    grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/ab_correctness.log" || fail=1
    grep -q "DIFFER" "$OUT/ab_correctness.log" && fail=1
  fi
fi
if [ "${SKIP_SAN:-0}" != 1 ]; then
  for pre in $([ $MAIN_STEPS = 1 ] && echo main) $([ $AB = 1 ] && echo ab); do
    p=""; [ "$pre" = ab ] && p="ab_"
    grep -q "ERROR SUMMARY: 0 errors" "$OUT/${p}memcheck.log" 2>/dev/null || fail=1
    grep -q "RACECHECK SUMMARY: 0 hazards" "$OUT/${p}racecheck.log" 2>/dev/null || fail=1
    grep -q "ERROR SUMMARY: 0 errors" "$OUT/${p}synccheck.log" 2>/dev/null || fail=1
  done
fi
echo "exit status $fail (0: correct, det bitwise, sanitizers clean where run, sweepab --small and ab correct where built)"
exit $fail
