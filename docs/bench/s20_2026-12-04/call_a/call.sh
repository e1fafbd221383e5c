#!/usr/bin/env bash
# s20 call A: bf16 indexer dense appends (kernel_v2.cuh) — correctness, A/B vs the tree before (3 rounds),
# sanitizers --small; the red-rate micro-benchmark (bench/micro/red_rate.cu). Binaries prebuilt in build-x.
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s20a; mkdir -p $L; B=build-x/idx
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $L/gpu.txt 2>&1
s=$(date +%s)
timeout 150 $B/after --no-bench --seed 20261204 > $L/correct.log 2>&1; echo "correct rc=$? $(( $(date +%s) - s )) s"
for r in 1 2 3; do
  for v in before after; do
    timeout 90 $B/$v --bench-only --bench-T 8192,32768,131072 --bench-H 32,64 --seed 7 > $L/${v}_r$r.log 2>&1
    echo "$v r$r rc=$? $(( $(date +%s) - s )) s"
  done
done
timeout 60 build-x/red_rate > $L/red_rate.log 2>&1; echo "red_rate rc=$?"
for t in memcheck racecheck synccheck; do
  timeout 100 $SAN --tool $t $B/after --small --seed 1 > $L/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s )) s"
done
tar -czf $OUT/s20a_logs.tgz -C /tmp s20a
echo "==== summary"; cat $L/gpu.txt; tail -2 $L/correct.log
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $L/memcheck.log $L/racecheck.log $L/synccheck.log
cat $L/red_rate.log
for H in 32 64; do for T in 8192 32768 131072; do
  row="$H $T |"
  for r in 1 2 3; do for v in before after; do
    row="$row $(awk -v H=$H -v T=$T '$1==H && $2==T && NF>=7 {print $3; exit}' $L/${v}_r$r.log)"
  done; row="$row |"; done
  echo "$row"
done; done
grep -h "SOME FAILED\|FAIL" $L/after_r*.log | head -5
