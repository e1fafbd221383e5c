#!/usr/bin/env bash
# s19 call G: the whole CUDA pytest suite on the final tree (extension built here)
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s19g; mkdir -p $L
s=$(date +%s); MAX_JOBS=16 timeout 200 python3 -m pip install --no-build-isolation --no-deps -e . > $L/ext_build.log 2>&1
echo "ext build rc=$? $(( $(date +%s) - s )) s"
timeout 330 python3 -m pytest -q -k cuda tests/python -p no:cacheprovider > $L/pytest_cuda.log 2>&1
echo "pytest rc=$? $(( $(date +%s) - s )) s"
tar -czf $OUT/s19g_logs.tgz -C /tmp s19g
tail -5 $L/pytest_cuda.log; grep -E "FAILED|Error" $L/pytest_cuda.log | head
