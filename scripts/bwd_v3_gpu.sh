#!/usr/bin/env bash
# One-command GPU check of the sparse MLA backward v3 kernel and the L2 cache-policy step (compile-time
# variants -DFLASHDSA_BWD_V3=1 and -DFLASHDSA_BWD_L2HINT=1; csrc/sm90/sparse_mla_bwd/main_kernel_v3.cuh,
# l2_policy.cuh; design: docs/kernels/sparse_mla_bwd.md, "v3").
#   PREBUILT=1 BIN=build-bwd3 SKIP_SAN=1 BUDGET=570 bash scripts/bwd_v3_gpu.sh   (about 6 min)
#   PREBUILT=1 BIN=build-bwd3 SAN_ONLY=1 BUDGET=570 bash scripts/bwd_v3_gpu.sh   (about 5-8 min)
#   (binaries built on the CPU box with BUILD_ONLY=1 BIN=build-bwd3 and packed as
#   build-bwd3/bwd3_bin.tar.xz, unpacked here; without PREBUILT=1 it builds first: + about 2 minutes)
# Variants of the check program tests/cuda/sparse_mla_bwd_check.cu:
#   base = main's dispatch (no flag: v2 below the sweep / deterministic, v1 with the sorted sweep),
#   v2   = -DFLASHDSA_BWD_V2=1 (v2 everywhere),          v2h = v2 + -DFLASHDSA_BWD_L2HINT=1,
#   v3   = -DFLASHDSA_BWD_V3=1 (v3 everywhere),          v3h = v3 + -DFLASHDSA_BWD_L2HINT=1,
#   v3hn = v3h without the sorted sweep at any T_kv (-DFLASHDSA_BWD_SWEEP_MIN_KEYS=2^47-1: the L2 policy
#          alone steers residency, as in cuDNN's kernel), benched at T_NOSWEEP = 16K, 32K, 128K only,
#   v3hc = v3h with v2's order in the back (dKV chunk 0, then dQ: -DFLASHDSA_BWD_V3_DQ_AFTER_C0=1),
#          benched at T_DQORDER = 8K, 32K only.
# Steps (each under its own timeout; logs in $OUT, default /tmp/bwd_v3_gpu):
#   1. (unless PREBUILT=1) the seven builds in parallel (scripts/lib/gpu_steps.sh build_variants);
#   2. v3: the 38 correctness cases (fast, deterministic 3 runs bitwise, mass) and the scale check;
#      v3h and v2h: the reduced (--small) correctness set;
#   3. fast mode, the seven variants alternated for 2 rounds: --bench-only --fast-only --T $T_BENCH
#      (v3hn: --T $T_NOSWEEP, v3hc: --T $T_DQORDER);
#   4. v3 deterministic mode at 32K (--bench-only --T 32768: fast, det, det 3 runs bitwise);
#   5. compute-sanitizer memcheck, racecheck, synccheck of v3 --small --no-bench.
# Prints one summary table last. Exit 0 when v3 is correct, det bitwise, sanitizers clean. The run is
# bounded by BUDGET seconds (default 470): each step's timeout is cut to what is left, a step with
# < 15 s left is skipped (the sanitizers come last). SAN_ONLY=1 runs only step 5 (and the table);
# SKIP_SAN=1 skips it. BUILD_ONLY=1 stops after the builds (BIN defaults to /tmp/bwd_v3_gpu_bin;
# build-bwd3/ in the repository is git-ignored and can be carried to the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/gpu_steps.sh  # budget_step, build_variants, sanitize_steps, print_status; NVCC, SAN
OUT=${OUT:-/tmp/bwd_v3_gpu}; mkdir -p "$OUT"
BIN=${BIN:-/tmp/bwd_v3_gpu_bin}; mkdir -p "$BIN"
T_BENCH=${T_BENCH:-4096,8192,16384,32768,131072}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}
flags=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Xptxas -v -Iinclude -Icsrc)
variants=(base v2 v3 v3h v2h v3hn v3hc)
declare -A vflags=([base]="" [v2]="-DFLASHDSA_BWD_V2=1" [v3]="-DFLASHDSA_BWD_V3=1"
                   [v3h]="-DFLASHDSA_BWD_V3=1 -DFLASHDSA_BWD_L2HINT=1" [v2h]="-DFLASHDSA_BWD_V2=1 -DFLASHDSA_BWD_L2HINT=1"
                   [v3hn]="-DFLASHDSA_BWD_V3=1 -DFLASHDSA_BWD_L2HINT=1 -DFLASHDSA_BWD_SWEEP_MIN_KEYS=0x7fffffffffff"
                   [v3hc]="-DFLASHDSA_BWD_V3=1 -DFLASHDSA_BWD_L2HINT=1 -DFLASHDSA_BWD_V3_DQ_AFTER_C0=1")
T_NOSWEEP=${T_NOSWEEP:-16384,32768,131072}  # v3hn differs from v3h only where the sweep would run
T_DQORDER=${T_DQORDER:-8192,32768}          # v3hc: one point without and one with the sweep
status=()  # "step|result" lines for the table
START=$(date +%s); BUDGET=${BUDGET:-470}
step() { budget_step "$@"; }  # step NAME TIMEOUT LOG CMD...

# A carried build folder may come as one archive (bwd3_bin.tar.xz next to the binaries).
if [ -f "$BIN/bwd3_bin.tar.xz" ] && [ ! -x "$BIN/bwd_v3" ]; then
  echo "=== unpacking $BIN/bwd3_bin.tar.xz"; tar -xJf "$BIN/bwd3_bin.tar.xz" -C "$BIN" || exit 2
fi

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
  [ "${BUILD_ONLY:-0}" = 1 ] && { echo "BUILD_ONLY=1: binaries in $BIN, stopping"; exit 0; }
fi

if [ "${SAN_ONLY:-0}" != 1 ]; then
  # 2. v3 correctness
  step "v3 correctness (38 cases + scale check)" 240 "$OUT/v3_correctness.log" "$BIN/bwd_v3" --no-bench
  rc=$?
  status+=("v3 correctness|rc=$rc; $(bwd_check_summary "$OUT/v3_correctness.log"); $(grep -c 'DIFFER' "$OUT/v3_correctness.log") det lines DIFFER")

  # 2b. the L2HINT builds: the reduced correctness set (the hints change no value; a bad policy
  # descriptor would fault or corrupt)
  for v in v3h v2h; do
    step "$v correctness --small" 90 "$OUT/${v}_correctness.log" "$BIN/bwd_$v" --small --no-bench
    status+=("$v correctness --small|rc=$?; $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$OUT/${v}_correctness.log" | tail -1)")
  done

  # 3. fast mode, the variants alternated
  for r in 1 2; do
    for v in "${variants[@]}"; do
      Tv=$T_BENCH; [ "$v" = v3hn ] && Tv=$T_NOSWEEP; [ "$v" = v3hc ] && Tv=$T_DQORDER
      step "round $r $v fast --T $Tv" 100 "$OUT/bench_fast_${v}_r$r.log" "$BIN/bwd_$v" --bench-only --fast-only --T "$Tv"
    done
  done

  # 4. v3 deterministic mode at 32K
  step "v3 det --T 32768" 90 "$OUT/bench_det_v3.log" "$BIN/bwd_v3" --bench-only --T 32768
fi

# 5. sanitizers on v3 --small
if [ "${SKIP_SAN:-0}" != 1 ]; then
  sanitize_steps "v3 " "memcheck:150 racecheck:240 synccheck:150" "$BIN/bwd_v3" --small --no-bench
fi

# Summary. Bench lines: "T | fast ms TFLOP/s | det ms TFLOP/s | fast+mass ms | checks".
echo
echo "================ summary (sparse MLA bwd, H = 64, K = 2048, uniform indices; variants: see the script's header) ================"
print_status 26
if [ "${SAN_ONLY:-0}" != 1 ]; then
  echo
  echo "fast ms, mean of rounds 1 and 2 (r1 / r2); ratio = base / variant (> 1: faster than main's dispatch)"
  printf "%8s" "T"; for v in "${variants[@]}"; do printf " | %-19s" "$v"; done; printf " | %s\n" "base/v3 base/v3h base/v2h v2/v3 v3h/v3hn v3h/v3hc"
  IFS=, read -ra Ts <<< "$T_BENCH"
  get() { awk -v T="$1" -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); print a[1]; exit }' "$2" 2>/dev/null; }
  for T in "${Ts[@]}"; do
    declare -A mean=()
    printf "%8s" "$T"
    for v in "${variants[@]}"; do
      a=$(get "$T" "$OUT/bench_fast_${v}_r1.log"); b=$(get "$T" "$OUT/bench_fast_${v}_r2.log")
      mean[$v]=$(awk -v a="$a" -v b="$b" 'BEGIN { n = (a > 0) + (b > 0); if (n) printf "%.2f", (a + b) / n; else print "" }')
      printf " | %-19s" "${mean[$v]:--} (${a:--}/${b:--})"
    done
    r() { awk -v a="${mean[$1]}" -v b="${mean[$2]}" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else print "-" }'; }
    printf " | %s %s %s %s %s %s\n" "$(r base v3)" "$(r base v3h)" "$(r base v2h)" "$(r v2 v3)" "$(r v3h v3hn)" "$(r v3h v3hc)"
  done
  line=$(awk -F'|' '$1 + 0 == 32768 && NF >= 5' "$OUT/bench_det_v3.log" 2>/dev/null | head -1)
  fast=$(echo "$line" | awk -F'|' '{ split($2, a, " "); print a[1] }')
  det=$(echo "$line" | awk -F'|' '{ split($3, a, " "); print a[1] }')
  echo
  echo "v3 at 32K: fast ${fast:--} ms, det ${det:--} ms, det/fast $(awk -v f="$fast" -v d="$det" 'BEGIN { if (f > 0) printf "%.2f", d / f; else print "-" }');$(echo "$line" | awk -F'|' '{ print $NF }')"
fi
echo "logs: $OUT"
fail=0
if [ "${SAN_ONLY:-0}" != 1 ]; then
  grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/v3_correctness.log" || fail=1
  grep -q "DIFFER" "$OUT"/v3_correctness.log "$OUT"/bench_det_v3.log 2>/dev/null && fail=1
  for v in v3h v2h; do grep -q "correctness: [0-9]* passed, 0 failed" "$OUT/${v}_correctness.log" || fail=1; done
fi
if [ "${SKIP_SAN:-0}" != 1 ]; then
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/v3_memcheck.log" 2>/dev/null || fail=1
  grep -q "RACECHECK SUMMARY: 0 hazards" "$OUT/v3_racecheck.log" 2>/dev/null || fail=1
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/v3_synccheck.log" 2>/dev/null || fail=1
fi
echo "exit status $fail (0: v3 correct, det bitwise, v3h / v2h --small correct, sanitizers clean)"
exit $fail
