#!/usr/bin/env bash
# s19 call D: which kernel faults in call C's H = 64, 32K like-for-like case: the same run with CUDA_LAUNCH_BLOCKING=1
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19d; mkdir -p $L
ls /tmp/peers/tilelang_cache 2>/dev/null | head -3 > $L/cache_ls.txt; du -sh /tmp/peers/tilelang_cache >> $L/cache_ls.txt 2>&1
CUDA_LAUNCH_BLOCKING=1 PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=200 OUT=$L timeout 240 bash scripts/peers_gpu.sh --run --peer-kernels indexer_topk \
  --peer-keys tilelang_fp8_example --indexer-selection fp8-fast --seq-lens 32768 --peers-max-seconds 150 > $L/peers.log 2>&1
echo "peers rc=$?"
tar -czf $OUT/s19d_logs.tgz -C /tmp s19d
grep -E "^\[|File \"|Error" $L/peers.log | tail -30
