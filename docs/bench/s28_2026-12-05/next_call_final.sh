#!/usr/bin/env bash
# Twenty-eighth session, last device call (carry build-x/s28: s28.tar.xz = bwd_main, the default check program of
# the merged tree, and bwd_fl, the same with -DFLASHDSA_BWD_DET_FULL_LINES=1; both built here from one tree).
#   run(command="bash docs/bench/s28_2026-12-05/next_call_final.sh", carry=["build-x/s28"])
# 1. the torch extension of this tree builds in the background (CPU only), then `pytest -k cuda tests/python` and the
#    layer demo on the GPU: the integration check of the merged defaults (fixed-point deterministic backward, the
#    warp final selection, the removed switches);
# 2. meanwhile on the GPU: the correctness cases of bwd_main and bwd_fl, and memcheck / synccheck / racecheck of bwd_fl
#    --small (the changed deterministic kernel), then main / fl alternated (2 rounds, round 2 reversed) at 8K / 32K /
#    128K and causal 32K: the deterministic mode with full-line u64 reductions against the default's half lines.
# Decision (docs/perf-notes.md, twenty-eighth session): fl becomes the deterministic default if its cases pass, its
# sanitizers are clean, its det time is lower at every T (both rounds), and it keeps 3 runs bitwise equal.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/s28final; rm -rf "$L"; mkdir -p "$L"; B=build-x/s28; OUT=${OUT:-/tmp}
[ -x $B/bwd_fl ] || tar -xJf $B/s28.tar.xz -C $B || exit 2
(cd $B && sha256sum -c sha256.txt > "$L/sha256.txt" 2>&1)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
s=$(date +%s)
left() { echo $(( 420 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
col() { awk -v T=$1 -v F=$2 -F'|' '$1 + 0 == T && NF >= 5 { split($F, a, " "); printf "%s", a[1]; exit }' "$3" 2>/dev/null; }
report() {
  tar -czf "$OUT/s28final_logs.tgz" -C "$L" .
  echo "==== summary"; cat "$L/gpu.txt"
  for v in main fl; do
    echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" 2>/dev/null | tail -1)," \
      "$(grep -c "RUNS DIFFER\|FAIL" "$L/${v}_correct.log" 2>/dev/null) lines with FAIL / RUNS DIFFER, $(grep -x "exit=[0-9]*" "$L/${v}_correct.log" 2>/dev/null)"
    awk '$1 == "det" && $2 == "dq" { for (i = 1; i <= NF; ++i) if ($i == "dkv" && $(i+1) == "rel_l2" && $(i+2) + 0 > w + 0) w = $(i+2) } END { print "  worst det dkv rel_l2 vs float64: " w }' "$L/${v}_correct.log" 2>/dev/null
  done
  grep -H "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
  cat "$L"/*.rc 2>/dev/null
  echo "T | main fast det (r1; r2) | fl fast det (r1; r2)"
  for T in 8192 32768 131072; do
    row="$T |"
    for v in main fl; do
      row="$row $(col $T 2 "$L/${v}_r1.log") $(col $T 3 "$L/${v}_r1.log"); $(col $T 2 "$L/${v}_r2.log") $(col $T 3 "$L/${v}_r2.log") |"
    done
    echo "$row"
  done
  echo "causal 32K: main $(col 32768 2 "$L/main_causal.log") $(col 32768 3 "$L/main_causal.log") | fl $(col 32768 2 "$L/fl_causal.log") $(col 32768 3 "$L/fl_causal.log")"
  grep -h "bitwise\|DIFFER" "$L"/fl_r*.log 2>/dev/null | head -2
  echo "extension: $(tail -1 "$L/ext_build.log" 2>/dev/null | cut -c1-120)"
  echo "pytest -k cuda: $(tail -1 "$L/pytest_cuda.log" 2>/dev/null)"
  echo "demo: $(grep RESULT "$L/demo.log" 2>/dev/null || tail -1 "$L/demo.log" 2>/dev/null)"
}
# 1. the extension (CPU) in the background
( export MAX_JOBS=$(nproc) FLASHDSA_WITH_CUDA=1
  timeout 240 $PY -m pip install --no-build-isolation --no-deps -e . > "$L/ext_build.log" 2>&1
  echo "ext rc=$?" > "$L/ext.rc" ) &
ext_pid=$!
# 2. cases and sanitizers, concurrently
( timeout 200 $B/bwd_main --no-bench > "$L/main_correct.log" 2>&1; echo "exit=$?" >> "$L/main_correct.log" ) &
( timeout 200 $B/bwd_fl --no-bench > "$L/fl_correct.log" 2>&1; echo "exit=$?" >> "$L/fl_correct.log" ) &
for t in memcheck:200 synccheck:200 racecheck:240; do
  ( timeout -k 5 ${t#*:} $SAN --tool ${t%%:*} $B/bwd_fl --small --no-bench > "$L/${t%%:*}.log" 2>&1
    echo "${t%%:*} rc=$?" > "$L/${t%%:*}.rc" ) &
done
for j in $(jobs -p); do [ "$j" = "$ext_pid" ] || wait "$j"; done
echo "cases + sanitizers done $(el)"; cat "$L"/*.rc 2>/dev/null
ok=1
grep -q "correctness: [0-9]* passed, 0 failed" "$L/fl_correct.log" && ! grep -q "RUNS DIFFER\|FAIL" "$L/fl_correct.log" \
  && grep -qx "exit=0" "$L/fl_correct.log" || ok=0
for r in 1 2; do
  order="main fl"; [ $r = 2 ] && order="fl main"
  for v in $order; do
    [ $ok = 0 ] && [ $v = fl ] && { echo "fl not timed: its correctness cases failed"; continue; }
    [ "$(left)" -lt 250 ] && { echo "round $r $v skipped (time)"; continue; }
    timeout 90 $B/bwd_$v --bench-only --T 8192,32768,131072 > "$L/${v}_r$r.log" 2>&1
    echo "$v r$r rc=$? $(el)"
  done
done
for v in main fl; do
  [ "$(left)" -lt 200 ] && { echo "causal $v skipped (time)"; continue; }
  timeout 40 $B/bwd_$v --bench-only --bench-indices causal --T 32768 > "$L/${v}_causal.log" 2>&1; echo "$v causal rc=$? $(el)"
done
report
# 3. the extension, pytest -k cuda, the demo
wait "$ext_pid"; cat "$L/ext.rc"; echo "extension done $(el)"
if grep -qx "ext rc=0" "$L/ext.rc"; then
  timeout $(( $(left) - 40 )) $PY -m pytest -q -ra -k cuda tests/python > "$L/pytest_cuda.log" 2>&1
  echo "pytest rc=$? $(el)"
  [ "$(left)" -gt 20 ] && timeout $(( $(left) - 10 )) $PY examples/dsa_layer_demo.py --device cuda > "$L/demo.log" 2>&1
  echo "demo rc=$? $(el)"
fi
report
