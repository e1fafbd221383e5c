#!/usr/bin/env bash
# Issue 20 against TileLang, and the CUDA pytest suite on this tree (thirtieth session):
#   run(command="bash docs/bench/s30_2026-12-05/next_call_tilelang.sh", carry=[".peers"])
#   .peers: tilelang.tar.xz + MANIFEST only (move cudnn.tar.xz out for this call: 64 MiB carry limit).
# Steps: the extension builds in the background (CPU) while the TileLang set unpacks and its imports are checked;
# then the peers A/B of indexer_topk, one process, calls alternated: ours bf16 (exact, the default) against TileLang's
# FP8 example (logits + top-k, logits alone) and megatron-core's TileLang indexer at 8K / 32K / 128K; then ours with the
# FP8 selection against the same peers (issue 20's FP8 rows); then `pytest -k cuda tests/python` with what is left.
# Logs in $OUT/tl_logs.tgz; the two reports in $OUT/tl_bf16_report.md and $OUT/tl_fp8_report.md.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/tl; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt" 2>&1
s=$(date +%s); BUDGET=${BUDGET:-585}
left() { echo $(( BUDGET - ($(date +%s) - s) )); }
( FLASHDSA_BUILD_DIR=/tmp/build_tl MAX_JOBS=12 timeout 300 python3 -m pip install --no-build-isolation --no-deps -e . \
    > "$L/ext_build.log" 2>&1; echo "ext rc=$? $(( $(date +%s) - s )) s" > "$L/ext.rc" ) &
ext_pid=$!
PEERS_SKIP_BUILD=1 timeout 280 bash scripts/peers_gpu.sh > "$L/peers_setup.log" 2>&1
echo "peers setup rc=$? $(( $(date +%s) - s )) s"
wait "$ext_pid"; cat "$L/ext.rc"
peers_run() {  # NAME SELECTION SECONDS
  local t=$3; [ "$(left)" -lt "$t" ] && t=$(( $(left) - 5 ))
  [ "$t" -lt 40 ] && { echo "$1: skipped (time)"; return; }
  PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=$(( t - 10 )) OUT=$L/$1 timeout "$t" bash scripts/peers_gpu.sh --run \
    --peer-kernels indexer_topk --peer-keys tilelang_fp8_example tilelang --indexer-selection "$2" \
    --seq-lens 8192 32768 131072 --peers-max-seconds $(( t - 40 )) > "$L/$1.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - s )) s"
  cp "$L/$1"/peers_bench/report.md "$OUT/tl_${1}_report.md" 2>/dev/null
}
peers_run bf16 bf16 260
peers_run fp8 fp8 170
if [ "$(left)" -gt 50 ]; then
  timeout $(( $(left) - 15 )) python3 -m pytest -q -ra -k cuda tests/python > "$L/pytest_cuda.log" 2>&1
  echo "pytest rc=$? $(( $(date +%s) - s )) s"
fi
tar -czf "$OUT/tl_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"; grep -h "FAILED\|^tilelang\|tilelang_fp8" "$L/peers_setup.log" | head -8
for n in bf16 fp8; do echo "== $n"; grep "^| indexer_topk\|^| kernel" "$L/$n.log" | head -24; tail -1 "$L/$n.log"; done
echo "pytest -k cuda: $(tail -1 "$L/pytest_cuda.log" 2>/dev/null)"
