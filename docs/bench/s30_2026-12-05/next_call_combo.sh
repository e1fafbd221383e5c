#!/usr/bin/env bash
# One call for both open issues when device starts are scarce (thirtieth session):
#   run(command="bash docs/bench/s30_2026-12-05/next_call_combo.sh", carry=[".peers", "build-x/lead", "build-x/s30"])
#   .peers: tilelang.tar.xz + MANIFEST only (≈ 32 MB; with the tree and the two binary archives ≈ 43.5 MB).
# Issue 19 (check programs built from 8551390 (lead) / 3f2dbf3 (s30; kernels of 06308dd), default SASS = main's): the cases of l4 / l8 / rev /
# sw20 / revsw20; det 32K waves / l4 alternated, 3 rounds (round 2 reversed); fast causal 16K waves / sw20 / rev,
# 3 rounds; det 128K one run each of waves / l4. Issue 20: the extension builds and the TileLang set unpacks in the
# background meanwhile (CPU); then `pytest -k cuda` (≈ 90 s) when 200 s are left; then indexer_topk bf16 against
# TileLang's FP8 example and megatron-core's TileLang indexer at 8K / 32K / 128K, one process, calls alternated; then
# ours FP8 against the same with what is left. Steps are gated on the time left (BUDGET, default 500 s).
# Logs: $OUT/combo_logs.tgz; reports $OUT/tl_bf16_report.md, $OUT/tl_fp8_report.md.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/combo; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; A=build-x/lead; B=build-x/s30
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt" 2>&1
s=$(date +%s); BUDGET=${BUDGET:-500}
left() { echo $(( BUDGET - ($(date +%s) - s) )); }
source scripts/lib/gpu_steps.sh  # bench_col, call_step
snap() { tar -czf "$OUT/combo_logs.tgz" -C "$L" . 2>/dev/null; }  # after each phase: a cut-off call keeps its logs
( FLASHDSA_BUILD_DIR=/tmp/build_tl MAX_JOBS=10 timeout 300 python3 -m pip install --no-build-isolation --no-deps -e . \
    > "$L/ext_build.log" 2>&1; echo "ext rc=$? $(( $(date +%s) - s )) s" > "$L/ext.rc" ) &
ext_pid=$!
( PEERS_SKIP_BUILD=1 timeout 280 bash scripts/peers_gpu.sh > "$L/peers_setup.log" 2>&1; echo "setup rc=$? $(( $(date +%s) - s )) s" > "$L/setup.rc" ) &
setup_pid=$!
tar -xJf $A/lead.tar.xz -C $A && (cd $A && sha256sum -c sha256.txt > "$L/sha256_lead.txt" 2>&1)
tar -xJf $B/s30.tar.xz -C $B && (cd $B && sha256sum -c sha256.txt > "$L/sha256_s30.txt" 2>&1)
bin() { if [ -x $B/bwd_$1 ]; then echo $B/bwd_$1; else echo $A/bwd_$1; fi; }
for v in l4 l8 rev sw20 revsw20; do
  ( timeout 150 $(bin $v) --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
for j in $(jobs -p); do [ "$j" = "$ext_pid" ] || [ "$j" = "$setup_pid" ] || wait "$j"; done
echo "cases $(( $(date +%s) - s )) s"; snap
# Gates (call_step's min_left) are set for BUDGET = 500 s (the device budget after many failed starts): the A/B
# rounds first, then pytest, then TileLang with what is left.
for r in 1 2 3; do
  order="waves l4"; [ $r = 2 ] && order="l4 waves"
  for v in $order; do call_step "$v 32K r$r" 380 30 "$L/${v}_r$r.log" $(bin $v) --bench-only --T 32768; done
done
snap
for r in 1 2 3; do
  order="waves sw20 rev"; [ $r = 2 ] && order="rev sw20 waves"
  for v in $order; do call_step "$v 16K r$r" 330 20 "$L/${v}_c16_r$r.log" $(bin $v) --bench-only --fast-only \
    --bench-indices causal --T 16384; done
done
snap
for v in waves l4; do call_step "$v 128K" 300 40 "$L/${v}_128k.log" $(bin $v) --bench-only --T 131072; done
snap
wait "$ext_pid"; cat "$L/ext.rc"
if [ "$(left)" -gt 200 ]; then
  timeout 120 python3 -m pytest -q -ra -k cuda tests/python > "$L/pytest_cuda.log" 2>&1
  echo "pytest rc=$? $(( $(date +%s) - s )) s"
fi
snap
wait "$setup_pid"; cat "$L/setup.rc"
peers_run() {  # NAME SELECTION SECONDS
  local t=$3; [ "$(left)" -lt "$t" ] && t=$(( $(left) - 5 ))
  [ "$t" -lt 60 ] && { echo "$1: skipped (time)"; return; }
  PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=$(( t - 10 )) OUT=$L/$1 timeout "$t" bash scripts/peers_gpu.sh --run \
    --peer-kernels indexer_topk --peer-keys tilelang_fp8_example tilelang --indexer-selection "$2" \
    --seq-lens 8192 32768 131072 --peers-max-seconds $(( t - 40 )) > "$L/$1.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - s )) s"
  cp "$L/$1"/peers_bench/report.md "$OUT/tl_${1}_report.md" 2>/dev/null
}
peers_run bf16 bf16 240
snap
peers_run fp8 fp8 130
tar -czf "$OUT/combo_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
for v in l4 l8 rev sw20 revsw20; do echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1) $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"; done
echo "det 32K ms r1 / r2 / r3 (fast of waves r1: $(bench_col 32768 2 "$L/waves_r1.log"))"
for v in waves l4; do echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 32768 3 "$L/${v}_r$r.log")"; done)| 128K det $(bench_col 131072 3 "$L/${v}_128k.log") fast $(bench_col 131072 2 "$L/${v}_128k.log")"; done
grep -h "bitwise\|DIFFER" "$L"/*_r1.log | head -4
echo "fast causal 16K ms r1 / r2 / r3"
for v in waves rev sw20; do echo "$v: $(for r in 1 2 3; do printf '%s ' "$(bench_col 16384 2 "$L/${v}_c16_r$r.log")"; done)"; done
grep -h "FAILED" "$L/peers_setup.log" | head -4
for n in bf16 fp8; do echo "== $n"; grep "^| indexer_topk" "$L/$n.log" | cut -d'|' -f2-10 | head -16; tail -1 "$L/$n.log" 2>/dev/null; done
echo "pytest -k cuda: $(tail -1 "$L/pytest_cuda.log" 2>/dev/null)"
