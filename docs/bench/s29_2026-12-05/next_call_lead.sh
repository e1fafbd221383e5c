#!/usr/bin/env bash
# The deterministic mode's waves: when a CTA signals its wave (twenty-ninth session).
#   run(command="bash docs/bench/s29_2026-12-05/next_call_lead.sh", carry=["build-x/lead"])
# waves = -DFLASHDSA_BWD_DET_WAVES=1 as measured by next_call_accept.sh (signal once the last block is issued);
# l4 / l8 = + -DFLASHDSA_BWD_DET_WAVE_LEAD=4 / 8 (signal 4 / 8 blocks before the last). Cases of l4 and l8, then
# waves / l4 / l8 alternated, 3 rounds at 32K (round 2 reversed), one run each at 128K; rev = -DFLASHDSA_BWD_REVERSE_TOKENS=1
# (each launch's rows in reverse order: a causal sequence's short rows fill the tail wave) against the default, fast
# mode, causal rows, 16K / 32K, 3 alternated rounds. (waves = the default since 9359098: SASS identical.)
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/lead; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; B=build-x/lead
s=$(date +%s); BUDGET=${BUDGET:-300}
source scripts/lib/gpu_steps.sh
tar -xJf $B/lead.tar.xz -C $B && (cd $B && sha256sum -c sha256.txt > "$L/sha256.txt" 2>&1)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$L/gpu.txt"
for v in l4 l8 rev; do
  ( timeout 120 $B/bwd_$v --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
wait; echo "cases $(( $(date +%s) - s )) s"
# rev (-DFLASHDSA_BWD_REVERSE_TOKENS=1): the fast mode on the peers' causal rows at 16K / 32K against the default
for r in 1 2 3; do
  order="waves rev"; [ $r = 2 ] && order="rev waves"
  for v in $order; do call_step "$v causal r$r" 30 30 "$L/${v}_causal_r$r.log" $B/bwd_$v --bench-only --fast-only \
    --bench-indices causal --T 16384,32768; done
done
for r in 1 2 3; do  # 32K: 3 rounds (round 2 reversed); 128K: one run each (device time was short)
  order="waves l4 l8"; [ $r = 2 ] && order="l8 l4 waves"
  for v in $order; do call_step "$v r$r" 30 30 "$L/${v}_r$r.log" $B/bwd_$v --bench-only --T 32768; done
done
for v in waves l4 l8; do call_step "$v 128K" 25 40 "$L/${v}_128k.log" $B/bwd_$v --bench-only --T 131072; done
# Where det's 32K time goes beyond the main kernel (bound / count / units / sort / check / decode passes): per-kernel
# times of one det run under nsys when the machine has it (the kernel table goes into the logs).
if command -v nsys > /dev/null && [ $((BUDGET - ($(date +%s) - s))) -gt 40 ]; then
  timeout 60 nsys profile -o "$L/det32k" --force-overwrite true --stats=false $B/bwd_waves --bench-only --T 32768 \
    > "$L/nsys_run.log" 2>&1 && timeout 30 nsys stats -r cuda_gpu_kern_sum "$L/det32k.nsys-rep" > "$L/nsys_kern.txt" 2>&1
  rm -f "$L"/det32k.nsys-rep "$L"/det32k.sqlite
fi
tar -czf "$OUT/lead_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
for v in l4 l8 rev; do echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1) $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"; done
echo "32K: fast (waves r1) | det ms r1 / r2 / r3: waves, l4, l8; 128K: det ms of one run each"
row="32768 | $(bench_col 32768 2 "$L/waves_r1.log") |"
for v in waves l4 l8; do row="$row $v $(bench_col 32768 3 "$L/${v}_r1.log") / $(bench_col 32768 3 "$L/${v}_r2.log") / $(bench_col 32768 3 "$L/${v}_r3.log") |"; done
echo "$row"
row="131072 | $(bench_col 131072 2 "$L/waves_128k.log") |"
for v in waves l4 l8; do row="$row $v $(bench_col 131072 3 "$L/${v}_128k.log") |"; done
echo "$row"
grep -h "bitwise\|DIFFER" "$L"/*_r1.log | head -6
echo "causal fast ms r1 / r2 / r3: default (waves) | rev"
for T in 16384 32768; do
  echo "$T: $(for r in 1 2 3; do printf '%s ' "$(bench_col $T 2 "$L/waves_causal_r$r.log")"; done)| $(for r in 1 2 3; do printf '%s ' "$(bench_col $T 2 "$L/rev_causal_r$r.log")"; done)"
done
head -20 "$L/nsys_kern.txt" 2>/dev/null | cut -c1-160
