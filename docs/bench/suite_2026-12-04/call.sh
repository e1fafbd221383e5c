#!/usr/bin/env bash
# s19 call E: the whole benchmark suite (kernels, layer, baselines) on a fresh machine, for docs/benchmarks.md
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19e; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > $L/gpu.txt
s=$(date +%s); MAX_JOBS=16 timeout 180 python3 -m pip install --no-build-isolation --no-deps -e . > $L/ext_build.log 2>&1
echo "ext build rc=$? $(( $(date +%s) - s )) s"
left=$(( 575 - ($(date +%s) - s) - 15 ))
budget=$(( left - 25 ))
echo "suite budget $budget s"
timeout $left python3 bench/run.py --device cuda --max-seconds $budget --out $L/suite > $L/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19e.tgz -C /tmp s19e
grep -E "kernel|layer|crossover|skipped" $L/suite.log | tail -45
cat $L/gpu.txt
