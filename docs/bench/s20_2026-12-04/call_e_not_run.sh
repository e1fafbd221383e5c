#!/usr/bin/env bash
# s20 call E: (1) the source pages (SASS, warp-state samples) of call C's ncu reports; (2) FLASHDSA_BWD_RS_DKV
# (dKV chunks with A = dS^T / P^T register fragments, tiles freed after the back's dQ): correctness (--small) and
# fast-mode A/B vs main, builds rs248 (two accumulators, producer 24 / back 248 regs: small spills) and rs1 (one accumulator, default regs).
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s20e; mkdir -p $L; B=build-x/bwd
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for T in 8192 32768; do
  $NCU -i build-x/ncu/bwd$T.ncu-rep --page source --csv --print-source sass > $L/sass_$T.csv 2> $L/err_$T.txt
  echo "sass T=$T rc=$? $(wc -c < $L/sass_$T.csv) bytes"
done
s=$(date +%s)
for v in rs1 rs248; do
  timeout 90 $B/bwd_$v --small --no-bench > $L/correct_$v.log 2>&1; echo "correct $v rc=$? $(( $(date +%s) - s )) s"
done
for r in 1 2; do
  for v in main rs248 rs1; do
    timeout 80 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768,65536,131072 > $L/${v}_r$r.log 2>&1
    echo "$v r$r rc=$? $(( $(date +%s) - s )) s"
  done
done
tar -czf $OUT/s20e.tgz -C /tmp s20e
for v in rs1 rs248; do tail -3 $L/correct_$v.log; done
for v in main rs248 rs1; do for r in 1 2; do echo "== $v r$r"; grep -E "^ +[0-9]+ " $L/${v}_r$r.log | head -8; done; done
python3 scripts/ncu_source_stalls.py $L/sass_8192.csv --top 25 2>&1 | tail -35
