#!/usr/bin/env bash
# s20 call B: red-rate micro-benchmark (7 patterns); the cost of a fixed-point u32 dkv emission
# (-DFLASHDSA_BWD_INT_EMIT=1: ab) and of a run-independent sweep rotation (-DFLASHDSA_BWD_STATIC_ROT=1: srot;
# both: isrot) vs the fast mode (main), alternated, 2 rounds. Measurement builds: ab / isrot write wrong dkv.
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s20b; mkdir -p $L; B=build-x/bwd
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $L/gpu.txt 2>&1
timeout 60 build-x/red_rate > $L/red_rate.log 2>&1; echo "red_rate rc=$?"
s=$(date +%s)
for r in 1 2; do
  for v in main ab srot isrot; do
    timeout 100 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768,65536,131072 > $L/${v}_r$r.log 2>&1
    echo "$v r$r rc=$? $(( $(date +%s) - s )) s"
  done
done
tar -czf $OUT/s20b_logs.tgz -C /tmp s20b
cat $L/gpu.txt $L/red_rate.log; sed -n 1,12p $L/main_r1.log
for v in main ab srot isrot; do for r in 1 2; do echo "== $v r$r"; grep -E "^ +[0-9]+ " $L/${v}_r$r.log | head -8; done; done
