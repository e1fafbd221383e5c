#!/usr/bin/env bash
# The twenty-ninth session's lead call, then the 16K sweep threshold (thirtieth session):
#   run(command="bash docs/bench/s30_2026-12-05/next_call_lead_sw.sh", carry=["build-x/lead", "build-x/s30"])
# After docs/bench/s29_2026-12-05/next_call_lead.sh (waves / l4 / l8 det, rev, nsys): sw20 = -DFLASHDSA_BWD_SWEEP_MIN_KEYS=20480
# (16K keys without the sorted sweep: kv + dkv of 16K keys are 56.6 MB, a little over the L2; the tenth session
# measured the sweep neutral there on ascending rows) and revsw20 (+ REVERSE_TOKENS) against the default and rev,
# fast mode, causal rows, 16K, 3 alternated rounds; cases of sw20 (the 16K no-sweep path) first.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUDGET=250 bash docs/bench/s29_2026-12-05/next_call_lead.sh
L=/tmp/lsw; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; B=build-x/s30; A=build-x/lead
s=$(date +%s); BUDGET=${BUDGET2:-130}
source scripts/lib/gpu_steps.sh
tar -xJf $B/s30.tar.xz -C $B && (cd $B && sha256sum -c sha256.txt > "$L/sha256.txt" 2>&1)
( timeout 90 $B/bwd_sw20 --no-bench > "$L/sw20_correct.log" 2>&1; echo "exit=$?" >> "$L/sw20_correct.log" ) &
( timeout 90 $B/bwd_revsw20 --no-bench > "$L/revsw20_correct.log" 2>&1; echo "exit=$?" >> "$L/revsw20_correct.log" ) &
wait
for r in 1 2 3; do
  order="waves sw20 rev revsw20"; [ $r = 2 ] && order="revsw20 rev sw20 waves"
  for v in $order; do
    bin=$A/bwd_$v; [ -x $B/bwd_$v ] && bin=$B/bwd_$v
    call_step "$v 16K r$r" 15 20 "$L/${v}_r$r.log" $bin --bench-only --fast-only --bench-indices causal --T 16384
  done
done
tar -czf "$OUT/lsw_logs.tgz" -C "$L" .
echo "==== 16K sweep threshold (fast ms, causal rows, r1 / r2 / r3)"
for v in sw20 revsw20; do echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1) $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"; done
for v in waves rev sw20 revsw20; do
  echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 16384 2 "$L/${v}_r$r.log")"; done)"
done
