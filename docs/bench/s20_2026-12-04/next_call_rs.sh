#!/usr/bin/env bash
# Prepared on 2026-12-04 (twentieth session), not yet run: the first device call of the next session for the
# sparse MLA backward's -DFLASHDSA_BWD_RS_DKV=2 switch (docs/perf-notes.md, "dKV with register A fragments").
# Here first:   BUILD_ONLY=1 BIN=build-x/bwd-rs AB_FLAGS=-DFLASHDSA_BWD_RS_DKV=2 bash scripts/bwd_gpu.sh
#               (then keep only build-x/bwd-rs/bwd_bin.tar.xz and ab_flags.txt)
# Device:       run(command="bash docs/bench/s20_2026-12-04/next_call_rs.sh", carry=["build-x/bwd-rs"])
# Steps: the ab build's 38 correctness cases + deterministic bitwise + sanitizers, main / ab alternated at
# 4K-32K on uniform and causal rows (scripts/bwd_gpu.sh AB_ONLY), then both at 64K / 128K once, then an ncu
# profile of the ab build at 8K (tensor / red / smem utilisation to compare with call_c's 46 / 44 / 50%).
# Added 2026-12-04 (twenty-first session): first, the red-rate micro-benchmark with its bulk patterns
# (cp.reduce.async.bulk .add.f32 from shared memory, 512 B and 2 KB per operation; build-x/bwd-rs/red_rate,
# built here with `nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/micro/red_rate.cu`), and with one
# warpgroup on 66 and 33 SMs: whether one SM can reduce faster than its 1/132 share of the L2 rate — if it can,
# an SM's gaps in the dkv stream are filled by the others and only gaps shared by many SMs cost time.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/next_rs; mkdir -p "$L"; OUT=${OUT:-/tmp}  # $OUT: the device call's folder that comes back
if [ -x build-x/bwd-rs/red_rate ]; then
  timeout 40 build-x/bwd-rs/red_rate > "$L/red_rate.log" 2>&1
  timeout 40 build-x/bwd-rs/red_rate --ctas 132 --threads 128 > "$L/red_rate_wg.log" 2>&1
  # one warpgroup on half / a quarter of the SMs: can one SM reduce faster than its 1/132 share (29 GB/s)?
  for n in 66 33; do timeout 40 build-x/bwd-rs/red_rate --ctas $n --threads 128 > "$L/red_rate_wg$n.log" 2>&1; done
fi
PREBUILT=1 BIN=build-x/bwd-rs AB_ONLY=1 BUDGET=420 OUT=$L/bwd bash scripts/bwd_gpu.sh > "$L/bwd_gpu.log" 2>&1
echo "bwd_gpu rc=$?"
for v in main ab; do
  timeout 60 build-x/bwd-rs/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/long_$v.log" 2>&1
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 90 $NCU --section SpeedOfLight --section WarpStateStats --metrics \
  lts__t_sectors_srcunit_tex_op_red.sum.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed \
  -k regex:sparse_mla_bwd_main -s 2 -c 1 build-x/bwd-rs/bwd_ab --bench-only --fast-only --T 8192 > "$L/ncu_ab_8k.txt" 2>&1
tar -czf "$OUT/next_rs_logs.tgz" -C "$L" .
for f in red_rate red_rate_wg red_rate_wg66 red_rate_wg33; do echo "$f:"; grep -E "bulk|v4.f32" "$L/$f.log" 2>/dev/null; done
tail -40 "$L/bwd_gpu.log"; grep -hE "^ +[0-9]+ " "$L"/long_*.log
grep -E "pct|Duration" "$L/ncu_ab_8k.txt" | head
