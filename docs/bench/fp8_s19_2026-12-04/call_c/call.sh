#!/usr/bin/env bash
# s19 call C (after B, warm): peers A/B vs TileLang's FP8 example again, fp8-scaled at 32K / 128K, then fp8-fast at 32K
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19c; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > $L/gpu.txt
s=$(date +%s)
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=330 OUT=$L timeout 400 bash scripts/peers_gpu.sh --run --peer-kernels indexer_topk \
  --peer-keys tilelang_fp8_example --indexer-selection fp8-scaled --seq-lens 32768 131072 --peers-max-seconds 280 > $L/peers.log 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
mkdir -p $L/fast; PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=200 OUT=$L/fast timeout 240 bash scripts/peers_gpu.sh --run --peer-kernels indexer_topk \
  --peer-keys tilelang_fp8_example --indexer-selection fp8-fast --seq-lens 32768 --peers-max-seconds 150 > $L/peers_fast.log 2>&1
echo "peers fast rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19c_logs.tgz -C /tmp s19c
grep -E '^\| indexer_topk' $L/peers.log $L/peers_fast.log | grep -E '\| 32 \|'
cat $L/gpu.txt
