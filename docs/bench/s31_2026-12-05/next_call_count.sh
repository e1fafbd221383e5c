#!/usr/bin/env bash
# The deterministic backward's passes around the main kernel (thirty-first session):
#   run(command="bash docs/bench/s31_2026-12-05/next_call_count.sh", carry=["build-x/s31"])
# An ncu duration run on an H100 (this session) gave at 32K: fix_count_kernel 2.71 ms, fix_bound_kernel 1.58 ms,
# sort_rows_kernel 0.77 ms against det 78 ms. Builds (scripts/bwd_gpu.sh BUILD_ONLY=1, one tree; main = default):
#   c  = -DFLASHDSA_BWD_FIX_SORTED_COUNT=1 (the count from the sorted rows, shared-memory histograms),
#   cb = c + -DFLASHDSA_BWD_FIX_BOUND_SORT=1 (each row sorted in the bound's CTA), b = the fusion alone.
# Second run (after the first: count 0.95-0.97 ms, bound+sort 1.98 ms against 1.57 + 0.77; det 32K main 77.6-78.7,
# c 76.2-76.7, cb 76.2-76.6 ms, bits equal): the count kernel with 16 warps a CTA and 4 loads in flight per lane; b
# dropped. Steps: the cases of c / cb / b (38 each, in parallel; b only when built); det 32K main / c / cb alternated, 3 rounds (order reversed in
# round 2), each run prints the deterministic dkv's bit hash (every build must print the same); det 128K main / cb /
# c; ncu durations of the passes of cb and c at 32K; compute-sanitizer memcheck / racecheck / synccheck of cb's
# fix_* kernels (--small, the 20480-key case takes the sorted path). Logs: $OUT/s31count_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
X=build-x/s31
source scripts/lib/gpu_steps.sh  # call_begin, bench_col, call_step
call_begin s31count 540  # L, OUT, gpu.txt, s, BUDGET, snap
V=(c cb); [ -f $X/b/bwd_bin.tar.xz ] && V+=(b)
for n in "${V[@]}"; do tar -xJf $X/$n/bwd_bin.tar.xz -C $X/$n || echo "unpack $n failed"; done
bin() { if [ "$1" = main ]; then echo $X/cb/bwd_main; else echo $X/$1/bwd_ab; fi; }
for v in "${V[@]}"; do
  ( timeout 150 $(bin $v) --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
wait; echo "cases $(( $(date +%s) - s )) s"; snap
for r in 1 2 3; do
  order="main c cb"; [ $r = 2 ] && order="cb c main"
  for v in $order; do call_step "$v 32K r$r" 330 40 "$L/${v}_r$r.log" $(bin $v) --bench-only --T 32768; done
done
snap
for v in main cb c; do call_step "$v 128K" 200 60 "$L/${v}_128k.log" $(bin $v) --bench-only --T 131072; done
snap
SANF=(--kernel-name kns=fix_ --print-limit 20 --error-exitcode 1)
for tool in memcheck racecheck synccheck; do
  ( timeout 150 compute-sanitizer --tool $tool "${SANF[@]}" $(bin cb) --small --no-bench > "$L/san_$tool.log" 2>&1
    echo "exit=$?" >> "$L/san_$tool.log" ) &
done
wait; echo "sanitizers $(( $(date +%s) - s )) s"; snap
for v in cb c; do
  call_step "ncu $v" 40 60 "$L/ncu_$v.csv" ncu --kernel-name-base demangled --kernel-name regex:fix_ \
    --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-count 14 --csv \
    $(bin $v) --bench-only --T 32768
done
snap
echo "==== summary"; cat "$L/gpu.txt"
for v in "${V[@]}"; do echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1) $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"; done
echo "det 32K ms r1 / r2 / r3 | fast r1 | dkv bits r1"
for v in main c cb; do echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 32768 3 "$L/${v}_r$r.log")"; done)| $(bench_col 32768 2 "$L/${v}_r1.log") | $(grep -o 'dkv bits [0-9a-f]*' "$L/${v}_r1.log")"; done
echo "128K det | fast | dkv bits"
for v in main cb c; do echo "$v: $(bench_col 131072 3 "$L/${v}_128k.log") | $(bench_col 131072 2 "$L/${v}_128k.log") | $(grep -o 'dkv bits [0-9a-f]*\|DIFFER' "$L/${v}_128k.log" | head -1)"; done
for tool in memcheck racecheck synccheck; do echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L/san_$tool.log" | head -1) $(grep -x "exit=[0-9]*" "$L/san_$tool.log")"; done
for v in cb c; do echo "ncu $v:"; python3 - "$L/ncu_$v.csv" <<'PY'
import csv, sys, collections
try:
    rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
except OSError:
    sys.exit()
if not rows: sys.exit()
h = rows[0]; agg = collections.defaultdict(list)
for r in rows[1:]:
    d = dict(zip(h, r)); agg[d['Kernel Name'].split('(')[0][-40:]].append(float(d['Metric Value'].replace(',', '')) / 1e6)
for n, v in agg.items(): print(f"  {n:40s} n={len(v):2d} mean {sum(v) / len(v):.3f} ms")
PY
done
