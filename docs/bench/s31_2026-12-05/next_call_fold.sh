#!/usr/bin/env bash
# The folded deterministic sorted pass (thirty-first session) on the acceptance GPU:
#   run(command="bash docs/bench/s31_2026-12-05/next_call_fold.sh", carry=["build-x/s31"])
# build-x/s31/fold: the check program of the folded default (device SASS identical, function by function, to the
# measured cb build); build-x/s31/cb/bwd_main: the default before the fold (pre). Steps: the extension builds in the
# background; fold's 38 cases; det + fast at 32K pre / fold alternated, 3 rounds (round 2 reversed), 128K one run each;
# the row sort's digit width (fast mode, causal rows, 16K / 32K: fold (4 bits) / rb5 / rb6 = -DFLASHDSA_BWD_SORT_RADIX_BITS=5 /
# 6, 3 alternated rounds; 16K is issue 19's tie with cuDNN and its sort is ≈ 1.4% of the call) and ncu durations of
# the sort at 16K; then `pytest -k cuda`. Logs: $OUT/s31fold_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
X=build-x/s31
source scripts/lib/gpu_steps.sh  # call_begin, bench_col, call_step
call_begin s31fold 470  # L, OUT, gpu.txt, s, BUDGET, snap
( FLASHDSA_BUILD_DIR=/tmp/build_ext MAX_JOBS=8 timeout 300 nice -n 19 python3 -m pip install --no-build-isolation --no-deps -e . \
    > "$L/ext_build.log" 2>&1; echo "ext rc=$? $(( $(date +%s) - s )) s" > "$L/ext.rc" ) &
ext_pid=$!
RB=(); [ -f $X/rb5/bwd_bin.tar.xz ] && RB=(rb5 rb6)  # the sort A/B ran once (H100) and was removed
for n in fold cb "${RB[@]}"; do tar -xJf $X/$n/bwd_bin.tar.xz -C $X/$n || echo "unpack $n failed"; done
bin() { case $1 in pre) echo $X/cb/bwd_main ;; fold) echo $X/fold/bwd_main ;; *) echo $X/$1/bwd_ab ;; esac; }
call_step "fold cases" 300 150 "$L/fold_correct.log" $(bin fold) --no-bench
snap
# SHORT=1 (a GPU where the two already ran side by side, e.g. the H100 of this session): one round of fold, no 128K.
R=3; [ "${SHORT:-0}" = 1 ] && R=1
for r in $(seq $R); do
  order="pre fold"; [ $r = 2 ] && order="fold pre"; [ "${SHORT:-0}" = 1 ] && order=fold
  for v in $order; do call_step "$v 32K r$r" 300 40 "$L/${v}_r$r.log" $(bin $v) --bench-only --T 32768; done
done
snap
[ "${SHORT:-0}" = 1 ] || call_step "fold 128K" 230 60 "$L/fold_128k.log" $(bin fold) --bench-only --T 131072
snap
if [ ${#RB[@]} -gt 0 ]; then
for v in rb5 rb6; do call_step "$v cases" 200 100 "$L/${v}_correct.log" $(bin $v) --small --no-bench; done
for r in 1 2 3; do
  order="fold rb5 rb6"; [ $r = 2 ] && order="rb6 rb5 fold"
  for v in $order; do call_step "$v sort r$r" 170 30 "$L/${v}_sort_r$r.log" $(bin $v) --bench-only --fast-only \
    --bench-indices causal --T 16384,32768; done
done
for v in fold rb5 rb6; do
  call_step "ncu sort $v" 140 40 "$L/ncu_sort_$v.csv" ncu --kernel-name-base demangled --kernel-name regex:sort_rows \
    --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-count 4 --csv \
    $(bin $v) --bench-only --fast-only --bench-indices causal --T 16384
done
fi
snap
wait "$ext_pid"; cat "$L/ext.rc"
call_step "pytest -k cuda" 100 130 "$L/pytest_cuda.log" python3 -m pytest -q -ra -k cuda tests/python
snap
echo "==== summary"; cat "$L/gpu.txt"
echo "fold cases: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/fold_correct.log" | tail -1)"
echo "32K det r1 / r2 / r3 | fast r1 / r2 / r3 | dkv bits r1"
for v in pre fold; do echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 32768 3 "$L/${v}_r$r.log")"; done)| $(for r in 1 2 3; do printf '%s ' "$(bench_col 32768 2 "$L/${v}_r$r.log")"; done)| $(grep -o 'dkv bits [0-9a-f]*\|DIFFER' "$L/${v}_r1.log" | head -1)"; done
echo "128K det | fast | dkv bits"
echo "fold: $(bench_col 131072 3 "$L/fold_128k.log") | $(bench_col 131072 2 "$L/fold_128k.log") | $(grep -o 'dkv bits [0-9a-f]*\|DIFFER' "$L/fold_128k.log" | head -1)"
echo "fast causal ms 16K r1 / r2 / r3 | 32K r1 / r2 / r3 | small cases"
for v in fold rb5 rb6; do echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 16384 2 "$L/${v}_sort_r$r.log")"; done)| $(for r in 1 2 3; do printf '%s ' "$(bench_col 32768 2 "$L/${v}_sort_r$r.log")"; done)| $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" 2>/dev/null | tail -1)"; done
for v in fold rb5 rb6; do echo "ncu sort 16K $v: $(grep -o '"gpu__time_duration.sum","ns","[0-9,]*"' "$L/ncu_sort_$v.csv" 2>/dev/null | grep -o '[0-9,]*"$' | tr -d '",' | tr '\n' ' ')"; done
echo "pytest -k cuda: $(tail -1 "$L/pytest_cuda.log" 2>/dev/null)"
