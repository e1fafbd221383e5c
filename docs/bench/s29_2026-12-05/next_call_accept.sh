#!/usr/bin/env bash
# Issue 19 / 20 acceptance tables and the deterministic mode's waves, one call (twenty-ninth session):
#   run(command="bash docs/bench/s29_2026-12-05/next_call_accept.sh", carry=[".peers"])  (+ "build-x/acc" when it fits)
#   .peers: cudnn.tar.xz + MANIFEST only (move tilelang.tar.xz out for this call: 64 MiB carry limit);
#   build-x/acc/acc.tar.xz: the backward's check program, default (main) and -DFLASHDSA_BWD_DET_WAVES=1 (waves)
#   (docs/bench/s29_2026-12-05/build_acc.sh).
# Steps: the extension builds in the background (CPU); the cases of main and waves and memcheck / synccheck / racecheck
# of waves --small (concurrent, untimed); main / waves alternated, 2 rounds (round 2 reversed) at 32K / 128K (fast +
# det, each det line with its 3-run bitwise check) and one 8K row of main; then the peers A/B against cuDNN frontend
# 1.32 of the backward (H = 64 at 4K-128K, H = 16 / 32 / 128 at 32K) and the bf16 indexer + top-k (H_I = 32 / 64), one
# process, calls alternated. A table last; logs in $OUT/accept_logs.tgz, the peers report in $OUT/peers_report.md.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/accept; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; B=build-x/acc
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt" 2>&1
s=$(date +%s)
source scripts/lib/gpu_steps.sh  # bg_sanitizers, bench_col, call_step
BUDGET=${BUDGET:-580}
if [ -f $B/acc.tar.xz ]; then
  [ -x $B/bwd_waves ] || tar -xJf $B/acc.tar.xz -C $B || exit 2
  (cd $B && sha256sum -c sha256.txt > "$L/sha256.txt" 2>&1; cp flags.txt "$L/")
else  # not carried (the carry limit): built here, ≈ 30 s
  B=/tmp/acc_bin; BUILD_ONLY=1 BIN=$B AB_FLAGS="-DFLASHDSA_BWD_DET_WAVES=1" timeout 200 bash scripts/bwd_gpu.sh \
    > "$L/bwd_build.log" 2>&1; echo "check programs built rc=$? $(( $(date +%s) - s )) s"
  cp $B/bwd_ab $B/bwd_waves || exit 2; echo "built on the device from $(git rev-parse --short HEAD 2>/dev/null)" > "$L/sha256.txt"
fi
( FLASHDSA_BUILD_DIR=/tmp/build_acc MAX_JOBS=14 timeout 300 python3 -m pip install --no-build-isolation --no-deps -e . \
    > "$L/ext_build.log" 2>&1; echo "ext rc=$? $(( $(date +%s) - s )) s" > "$L/ext.rc" ) &
ext_pid=$!
for v in main waves; do
  ( timeout 200 $B/bwd_$v --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
bg_sanitizers "$L" $B/bwd_waves --small --no-bench
for j in $(jobs -p); do [ "$j" = "$ext_pid" ] || wait "$j"; done
echo "cases + sanitizers done $(( $(date +%s) - s )) s"
for r in 1 2; do
  order="main waves"; [ $r = 2 ] && order="waves main"
  for v in $order; do
    if [ $v = waves ] && ! grep -q "correctness: [0-9]* passed, 0 failed" "$L/waves_correct.log"; then
      echo "waves not timed: its cases failed"; continue
    fi
    call_step "$v r$r" 250 80 "$L/${v}_r$r.log" $B/bwd_$v --bench-only --T 32768,131072
  done
done
call_step "main 8K" 240 30 "$L/main_8k.log" $B/bwd_main --bench-only --T 8192
wait "$ext_pid"; cat "$L/ext.rc"
left=$(( BUDGET - ($(date +%s) - s) - 10 ))
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=$(( left - 10 )) OUT=$L timeout "$left" bash scripts/peers_gpu.sh --run \
  --peer-kernels sparse_mla_bwd indexer_topk --peer-keys cudnn --seq-lens 4096 8192 16384 32768 65536 131072 \
  --peers-max-seconds $(( left - 45 )) > "$L/peers.log" 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
tar -czf "$OUT/accept_logs.tgz" -C "$L" .
cp "$L"/peers_bench/report.md "$OUT/peers_report.md" 2>/dev/null
echo "==== summary"; cat "$L/gpu.txt" "$L/sha256.txt"
for v in main waves; do
  echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1)," \
    "$(grep -c "RUNS DIFFER\|FAIL" "$L/${v}_correct.log") FAIL / DIFFER lines, $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"
done
echo "det lines of waves equal to main's: $(diff -q <(grep "^  det " "$L/main_correct.log") <(grep "^  det " "$L/waves_correct.log") > /dev/null && echo yes || echo NO)"
grep -H "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
echo "T: fast ms (main r1 / r2) | det ms main r1 / r2, waves r1 / r2 | det speed / fast speed: main, waves"
for T in 32768 131072; do
  f1=$(bench_col $T 2 "$L/main_r1.log"); f2=$(bench_col $T 2 "$L/main_r2.log")
  d1=$(bench_col $T 3 "$L/main_r1.log"); d2=$(bench_col $T 3 "$L/main_r2.log")
  w1=$(bench_col $T 3 "$L/waves_r1.log"); w2=$(bench_col $T 3 "$L/waves_r2.log")
  rat() { awk -v a="$f1" -v b="$f2" -v c="$1" -v d="$2" 'BEGIN { if (c > 0 && d > 0) printf "%.3f", (a + b) / (c + d); else print "-" }'; }
  echo "$T: $f1 / $f2 | $d1 / $d2, $w1 / $w2 | $(rat "$d1" "$d2"), $(rat "$w1" "$w2")"
done
grep -h "^ *[0-9]* |" "$L"/main_8k.log | head -2
grep -h "bitwise\|DIFFER" "$L"/waves_r*.log "$L"/main_r1.log | head -6
grep "^| sparse_mla_bwd\|^| indexer_topk\|^| kernel" "$L/peers.log" | head -40
tail -2 "$L/peers.log"
