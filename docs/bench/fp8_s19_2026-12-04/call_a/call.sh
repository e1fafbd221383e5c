#!/usr/bin/env bash
# s19 call A: checks + sanitizers of the scaled band (check program), bench fixed vs scaled band (alternated, one
# process), extension build for call B (peers)
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19a; mkdir -p $L
s=$(date +%s)
(MAX_JOBS=10 timeout 280 python3 -m pip install --no-build-isolation --no-deps -e . > $L/ext_build.log 2>&1; echo "ext build rc=$? $(( $(date +%s) - s )) s" > $L/ext_rc.txt) &
PREBUILT=1 SKIP_BENCH=1 BIN=build-x OUT=$L/fp8 timeout 300 bash scripts/fp8_gpu.sh > $L/fp8_gpu.log 2>&1
echo "fp8_gpu rc=$? $(( $(date +%s) - s )) s"
wait
cat $L/ext_rc.txt
X=build-x/x
timeout 200 $X/fp8check_fp8 --bench-only --bench-T 8192,32768,131072 --bench-H 32 --seed 2 \
  --bench-bands 256/2304,256/2304s,256/2304,256/2304s > $L/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19a_logs.tgz -C /tmp s19a
grep -E "^==== |OK|FAIL|ERROR" $L/fp8_gpu.log | head -30
grep -E "band scaled|band " $L/fp8/check_fp8.log | head -40
grep -E "band|^  32 " $L/bench.log
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
