#!/usr/bin/env bash
# s19 call F: the peers runner's new guards on the H200: fp8-scaled vs TileLang's FP8 example at 8K / 32K (H_I 32, 64)
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19f; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > $L/gpu.txt
s=$(date +%s); MAX_JOBS=16 timeout 200 python3 -m pip install --no-build-isolation --no-deps -e . > $L/ext_build.log 2>&1
echo "ext build rc=$? $(( $(date +%s) - s )) s"
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=260 OUT=$L timeout 330 bash scripts/peers_gpu.sh --run --peer-kernels indexer_topk \
  --peer-keys tilelang_fp8_example --indexer-selection fp8-scaled --seq-lens 8192 32768 --peers-max-seconds 200 > $L/peers.log 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19f_logs.tgz -C /tmp s19f
grep -E "^\[.*peers|Error|error" $L/peers.log | cut -c1-330 | tail -16
cat $L/gpu.txt
