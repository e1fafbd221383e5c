#!/usr/bin/env bash
# Issue 19 / 20 acceptance tables on the lent GPU (twenty-ninth session), one call:
#   run(command="bash docs/bench/s29_2026-12-05/next_call_accept.sh", carry=[".peers", "build-x/acc"])
#   .peers: cudnn.tar.xz + MANIFEST only (move tilelang.tar.xz out for this call: 64 MiB carry limit);
#   build-x/acc/acc.tar.xz: the backward's check program of this tree (bash docs/bench/s29_2026-12-05/build_acc.sh).
# Steps: 1. the deterministic mode against the fast mode with the check program, 2 rounds at 8K / 32K / 128K (and the
# 3-run bitwise check at 32K and 128K); 2. the extension build; 3. the peers A/B against cuDNN frontend 1.32 of the
# backward (H = 64 at 4K-128K, H = 16 / 32 / 128 at 32K) and of the bf16 indexer + top-k (H_I = 32 / 64), one process,
# calls alternated. A table last; logs in $OUT/accept_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/accept; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; B=build-x/acc
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt" 2>&1
s=$(date +%s)
source scripts/lib/gpu_steps.sh  # bench_col, call_step
BUDGET=${BUDGET:-575}
[ -x $B/bwd_main ] || tar -xJf $B/acc.tar.xz -C $B || exit 2
(cd $B && sha256sum -c sha256.txt > "$L/sha256.txt" 2>&1; cp flags.txt "$L/")
for r in 1 2; do call_step "det r$r" 200 80 "$L/det_r$r.log" $B/bwd_main --bench-only --T 8192,32768,131072; done
for T in 32768 131072; do call_step "det bitwise $T" 200 60 "$L/det_bw_$T.log" $B/bwd_main --bench-only --T $T; done
FLASHDSA_BUILD_DIR=/tmp/build_acc MAX_JOBS=16 timeout 260 python3 -m pip install --no-build-isolation --no-deps -e . \
  > "$L/ext_build.log" 2>&1
echo "ext build rc=$? $(( $(date +%s) - s )) s"
left=$(( BUDGET - ($(date +%s) - s) - 10 ))
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=$(( left - 10 )) OUT=$L timeout "$left" bash scripts/peers_gpu.sh --run \
  --peer-kernels sparse_mla_bwd indexer_topk --peer-keys cudnn --seq-lens 4096 8192 16384 32768 65536 131072 \
  --peers-max-seconds $(( left - 45 )) > "$L/peers.log" 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
tar -czf "$OUT/accept_logs.tgz" -C "$L" .
cp "$L"/peers_bench/report.md "$OUT/peers_report.md" 2>/dev/null
echo "==== summary"; cat "$L/gpu.txt"
echo "T: fast ms r1 / r2, det ms r1 / r2, det speed / fast speed (mean)"
for T in 8192 32768 131072; do
  f1=$(bench_col $T 2 "$L/det_r1.log"); f2=$(bench_col $T 2 "$L/det_r2.log")
  d1=$(bench_col $T 3 "$L/det_r1.log"); d2=$(bench_col $T 3 "$L/det_r2.log")
  echo "$T: $f1 / $f2, $d1 / $d2, $(awk -v a="$f1" -v b="$f2" -v c="$d1" -v d="$d2" 'BEGIN { if (c > 0 && d > 0) printf "%.3f", (a + b) / (c + d); else print "-" }')"
done
grep -h "bitwise\|DIFFER" "$L"/det_bw_*.log | head -4
grep "^| sparse_mla_bwd\|^| indexer_topk\|^| kernel" "$L/peers.log" | head -40
tail -3 "$L/peers.log"
