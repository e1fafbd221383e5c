#!/usr/bin/env bash
# Prepared on 2026-12-04 (twenty-first session; no device was lent that session), not yet run: the sparse MLA
# backward's deterministic mode with fp16 partials (-DFLASHDSA_BWD_DET_FP16=1; docs/perf-notes.md, twenty-first
# session), A/B against the default build. Binaries built here:
#   BUILD_ONLY=1 BIN=build-x/bwd-f16 AB_FLAGS=-DFLASHDSA_BWD_DET_FP16=1 bash scripts/bwd_gpu.sh
#   then the same with AB_FLAGS=-DFLASHDSA_BWD_DET_FP16=2 (evict-first stores) into another folder, its bwd_ab
#   copied to build-x/bwd-f16/bwd_ab2 (flags in ab2_flags.txt)
# Device: run(command="bash docs/bench/s21_2026-12-04/next_call_bwd_det_fp16.sh", carry=["build-x/bwd-f16"])
# Steps: (1) the fp16 build's 38 correctness cases (deterministic 3 runs bitwise, errors vs float64, the sweep vs
# deterministic comparisons at --det-tol 1e-3: fp16 partials differ from the fast mode by ~2e-4 rel-L2);
# (2) main / ab alternated, 2 rounds, fast + deterministic + mass at 8K / 32K / 128K (uniform rows; the first T also
# checks the deterministic mode bitwise over 3 runs and against the fast one), with ab2 = the same with evict-first
# partial stores (-DFLASHDSA_BWD_DET_FP16=2); (3) memcheck and synccheck of the
# fp16 build --small (the change is global stores, shuffles and a new reduce kernel; no shared memory: racecheck
# last, if time is left). Prints a table last: det ms and det / fast of both builds.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/detf16; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd-f16; OUT=${OUT:-/tmp}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x $B/bwd_ab ] || tar -xJf $B/bwd_bin.tar.xz -C $B || exit 2
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
s=$(date +%s)
# The archive and the table, written after the timed rounds and again at the end (review of 2026-12-05).
report() {
tar -czf "$OUT/detf16_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/ab_correct.log" | tail -1
grep -c "RUNS DIFFER\|FAIL" "$L/ab_correct.log" | sed 's/^/ab correctness lines with FAIL or RUNS DIFFER: /'
grep -x "exit=[0-9]*" "$L/ab_correct.log" | sed 's/^/ab correctness /'
for m in fast det; do
  awk -v m=$m '$1 == m && $2 == "dq" { for (i = 1; i <= NF; ++i) if ($i == "dkv" && $(i+1) == "rel_l2" && $(i+2) + 0 > w + 0) w = $(i+2) } END { print "ab worst " m " dkv rel_l2 vs float64: " w }' "$L/ab_correct.log"
done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
echo "T | main fast/det ms (r1, r2) | ab (fp16) | ab2 (fp16, evict-first)   (bench lines: T | fast ms TFLOP/s | det ms ...)"
for T in 8192 32768 131072; do
  row="$T |"
  for v in main ab ab2; do for r in 1 2; do
    row="$row $(awk -v T=$T -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); split($3, b, " "); printf "%s/%s", a[1], b[1]; exit }' "$L/${v}_r$r.log")"
  done; row="$row |"; done
  echo "$row"
done
grep -H "bitwise\|DIFFER" "$L"/ab_r*.log "$L"/ab2_r*.log 2>/dev/null | head -4
}
left() { echo $(( 575 - ($(date +%s) - s) )); }
timeout 200 $B/bwd_ab --no-bench --det-tol 1e-3 > "$L/ab_correct.log" 2>&1; rc=$?; echo "exit=$rc" >> "$L/ab_correct.log"
echo "ab correct rc=$rc $(( $(date +%s) - s )) s"
# (review of 2026-12-05) the builds are timed only when the cases and the scale check (after the "correctness:" line)
# passed: exit status 0, 0 failed, no FAIL / RUNS DIFFER line
ok=1
grep -q "correctness: [0-9]* passed, 0 failed" "$L/ab_correct.log" && ! grep -q "RUNS DIFFER\|FAIL" "$L/ab_correct.log" \
  && [ $rc = 0 ] || ok=0
[ $ok = 0 ] && echo "ab: correctness not clean: ab and ab2 not timed"
for r in 1 2; do
  order="main ab ab2"; [ $r = 2 ] && order="ab2 ab main"
  for v in $order; do
    [ $ok = 0 ] && [ $v != main ] && continue
    l=$(left); [ "$l" -lt 60 ] && { echo "round $r $v skipped (time)"; continue; }
    timeout $(( l < 110 ? l - 10 : 100 )) $B/bwd_$v --bench-only --T 8192,32768,131072 --det-tol 1e-3 > "$L/${v}_r$r.log" 2>&1
    echo "$v r$r rc=$? $(( $(date +%s) - s )) s"
  done
done
report
for t in memcheck synccheck racecheck; do
  l=$(left); [ "$l" -lt 30 ] && { echo "$t skipped (time)"; continue; }
  timeout $(( l < 150 ? l - 10 : 150 )) $SAN --tool $t $B/bwd_ab --small --no-bench --det-tol 1e-3 > "$L/$t.log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - s )) s"
done
report
