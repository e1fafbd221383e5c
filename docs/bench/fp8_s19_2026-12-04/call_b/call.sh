#!/usr/bin/env bash
# s19 call B (after A on the same warm machine: the extension is built): CUDA pytest (FP8 / layer / megatron FP8),
# peers A/B vs TileLang's FP8 example with the scaled band (fp8-scaled) at 8K / 32K / 128K
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19b; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > $L/gpu.txt
s=$(date +%s); timeout 140 python3 -m pytest -q -x -k "cuda or band or quantize or nan or itself" tests/python/test_ops_indexer_fp8.py \
  tests/python/test_layer.py tests/python/test_megatron_fp8.py -p no:cacheprovider > $L/pytest.log 2>&1
echo "pytest rc=$? $(( $(date +%s) - s )) s"; tail -2 $L/pytest.log
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=330 OUT=$L timeout 400 bash scripts/peers_gpu.sh --run --peer-kernels indexer_topk \
  --peer-keys tilelang_fp8_example --indexer-selection fp8-scaled --seq-lens 8192 32768 131072 --peers-max-seconds 280 > $L/peers.log 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19b_logs.tgz -C /tmp s19b
tail -25 $L/peers.log
cat $L/gpu.txt
