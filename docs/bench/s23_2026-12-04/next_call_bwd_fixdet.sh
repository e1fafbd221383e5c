#!/usr/bin/env bash
# Prepared on 2026-12-04 (twenty-third session; no device was lent that session), not yet run: the cost of a
# deterministic sparse MLA backward built from fixed-point pairs in 64-bit integer reductions (docs/perf-notes.md,
# twenty-third session). Four builds of the check program, binaries built here and packed in
# build-x/bwd-fixdet/fixdet.tar.xz (flags.txt lists them):
#   main  the default build (SASS identical to the kernel measured against cuDNN)
#   fx    -DFLASHDSA_BWD_FIX_EMIT=1: dkv as fixed-point pairs in red.add.u64 (WRONG dkv, a fixed unit: cost only)
#   nr    -DFLASHDSA_BWD_SWEEP_NOROT=1: the sorted sweep without its timing-dependent rotation (correct dq / dkv)
#   fxnr  both: the cost of the candidate deterministic mode's main kernel (WRONG dkv)
# and bench/micro/red_rate (with the u64 half-line pattern).
#   BUILD_ONLY=1 BIN=build-x/bwd-X AB_FLAGS="<flags>" bash scripts/bwd_gpu.sh; nvcc ... bench/micro/red_rate.cu
# Device: run(command="bash docs/bench/s23_2026-12-04/next_call_bwd_fixdet.sh", carry=["build-x/bwd-fixdet"])
# Steps (guarded to ~560 s): red_rate (all patterns); main / fx / nr / fxnr alternated, fast mode, uniform rows,
# 8K-32K, 2 rounds; causal rows 16K / 32K for main / nr / fxnr, 1 round; 64K / 128K once each; nr's 38 correctness
# cases (it must stay correct); memcheck of fxnr --small (addresses only: its dkv is wrong by design). A table last.
# Decision (perf-notes, twenty-third session): fxnr / main <= 1.25 at 32K and 128K (0.8x) on uniform rows -> build
# the real fixed-point deterministic mode on the no-rotation sweep; fx / main <= 1.12 at 8K-32K but nr costly ->
# the fixed-point mode for T_kv <= 32K only, beside the fp16 partials.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/fixdet; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd-fixdet; OUT=${OUT:-/tmp}
V="main fx nr fxnr"
[ -x $B/bwd_fxnr ] || tar -xJf $B/fixdet.tar.xz -C $B || exit 2
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
s=$(date +%s)
# The archive and the table, written after the timed steps and again at the end (review of 2026-12-05).
report() {
tar -czf "$OUT/fixdet_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
grep -E "u64|v4.f32, 4 lines" "$L/red_rate.log"
# (review of 2026-12-05) the scale check (the sorted sweep without rotation at 20K-32K) runs after the "correctness:"
# line: its exit status and FAIL lines count too
echo "nr: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/nr_correct.log" 2>/dev/null | tail -1)," \
  "$(grep -c "RUNS DIFFER\|FAIL" "$L/nr_correct.log" 2>/dev/null) lines with FAIL / RUNS DIFFER," \
  "$(grep -x "exit=[0-9]*" "$L/nr_correct.log" 2>/dev/null)"
echo "(fx / fxnr bench runs exit 1 by design: their dkv is fixed-point words read as floats; the timing lines count)"
grep -h "ERROR SUMMARY" "$L/fxnr_memcheck.log" 2>/dev/null | sed 's/^/fxnr memcheck: /'
ms() { awk -v T=$1 -F'|' '$1 + 0 == T && NF >= 3 { split($2, a, " "); printf "%s", a[1]; exit }' "$2" 2>/dev/null; }
echo "fast ms: T | rows | main | fx | nr | fxnr   (uniform: r1 r2)"
for T in 8192 16384 32768; do
  row="$T | uniform |"
  for v in $V; do row="$row $(ms $T "$L/${v}_uniform_r1.log") $(ms $T "$L/${v}_uniform_r2.log") |"; done
  echo "$row"
done
for T in 16384 32768; do
  row="$T | causal |"
  for v in $V; do row="$row $(ms $T "$L/${v}_causal.log") |"; done
  echo "$row"
done
for T in 65536 131072; do
  row="$T | uniform |"
  for v in $V; do row="$row $(ms $T "$L/${v}_long.log") |"; done
  echo "$row"
done
}
left() { echo $(( 560 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
timeout 60 $B/red_rate > "$L/red_rate.log" 2>&1; echo "red_rate rc=$? $(el)"
for r in 1 2; do
  order="$V"; [ $r = 2 ] && order=$(echo $V | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    [ "$(left)" -lt 200 ] && { echo "round $r $v skipped (time)"; continue; }
    timeout 45 $B/bwd_$v --bench-only --fast-only --T 8192,16384,32768 > "$L/${v}_uniform_r$r.log" 2>&1
    echo "$v uniform r$r rc=$? $(el)"
  done
done
for v in main nr fxnr; do
  [ "$(left)" -lt 170 ] && { echo "causal $v skipped (time)"; continue; }
  timeout 45 $B/bwd_$v --bench-only --fast-only --bench-indices causal --T 16384,32768 > "$L/${v}_causal.log" 2>&1
  echo "$v causal rc=$? $(el)"
done
for v in main fxnr nr fx; do
  [ "$(left)" -lt 120 ] && { echo "long $v skipped (time)"; continue; }
  timeout 60 $B/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/${v}_long.log" 2>&1; echo "$v long rc=$? $(el)"
done
report > /dev/null
l=$(left); if [ "$l" -gt 60 ]; then
  timeout $(( l < 160 ? l - 20 : 140 )) $B/bwd_nr --no-bench > "$L/nr_correct.log" 2>&1; rc=$?
  echo "exit=$rc" >> "$L/nr_correct.log"; echo "nr correctness rc=$rc $(el)"
fi
l=$(left); if [ "$l" -gt 40 ]; then
  timeout $(( l - 10 )) $SAN --tool memcheck $B/bwd_fxnr --small --no-bench > "$L/fxnr_memcheck.log" 2>&1
  echo "fxnr memcheck rc=$? $(el)"
fi
report
