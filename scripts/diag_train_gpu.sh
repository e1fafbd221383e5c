#!/usr/bin/env bash
# GPU diagnosis of the training example not learning on the H200 (docs/training.md, "GPU runs").
# One device call (< 10 min): builds the extension, runs the at-scale backward checks and a one-batch
# gradient comparison (fused vs reference) at T = 8K and 16K, then the CUDA preset trained at 8K and
# 16K tokens per step side by side (8K: sparse MLA bwd without the sorted sweep; 16K: with it) and a
# fused-vs-reference parity run. Logs and metrics under ${OUT:-/tmp/flashdsa_diag}.
#   bash scripts/diag_train_gpu.sh [--minutes M]   (M: training time of each run, default 3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_diag}; mkdir -p "$OUT"
minutes=3
[ "${1:-}" = "--minutes" ] && minutes=$2
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FLASHDSA_WITH_CUDA=1
python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -m pytest -q -k "at_scale and cuda" tests/python/test_ops_mla.py >"$OUT/pytest_at_scale.log" 2>&1
echo "at-scale pytest: $(tail -1 "$OUT/pytest_at_scale.log")"
# Gradients of the fused model vs the reference on one batch, at T = 8K (no sweep) and 16K (sweep).
for T in 8192 16384; do
  python3 examples/train_recall.py --device cuda --grad-check --tokens $T --min-len 1024 --max-len 2048 \
    --num-keys 512 --query-every 32 --num-values 16 --topk 256 --out "$OUT/grad_$T" >"$OUT/grad_$T.log" 2>&1
  echo "grad-check T=$T (worst 5 by rel diff):"; grep -a -A6 "^LM loss" "$OUT/grad_$T.log"
done
# The CUDA preset (CPU task x16 sequences, K = 64, lr 1e-3) at 8K tokens per step (sparse MLA bwd
# without the sorted sweep) and at its own 16K (with it), side by side.
train="python3 examples/train_recall.py --device cuda --log-every 100 --time-limit $minutes"
$train --tokens 8192 --out "$OUT/preset_8k" >"$OUT/preset_8k.log" 2>&1 &
$train --out "$OUT/preset_16k" >"$OUT/preset_16k.log" 2>&1 &
wait
for run in preset_8k preset_16k; do echo "$run: $(grep -a '^steps=' "$OUT/$run.log")"; done
python3 examples/train_recall.py --device cuda --parity --tokens 8192 --topk 256 --steps 150 \
  --out "$OUT/parity" >"$OUT/parity.log" 2>&1
echo "parity: $(grep -a -i 'max_rel\|rel' "$OUT/parity.log" | tail -3)"
