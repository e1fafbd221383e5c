#!/usr/bin/env bash
# s20 call C: ncu --set full of the sparse MLA backward main kernel (fast mode) at 8K (no sweep) and 32K (sweep),
# one launch each (the third), raw + details pages as CSV.
set -uo pipefail
cd "$(dirname "$0")/.."
L=/tmp/s20c; mkdir -p $L; B=build-x/bwd
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for g in "264 256" "132 128" "132 256" "132 512" "264 128"; do
  set -- $g; echo "== ctas $1 threads $2" >> $L/red_rate_grid.log
  timeout 60 build-x/red_rate --ctas $1 --threads $2 >> $L/red_rate_grid.log 2>&1
done
for T in 8192 32768; do
  s=$(date +%s)
  timeout 240 $NCU --set full -k regex:sparse_mla_bwd_main -s 2 -c 1 -o $L/bwd$T $B/bwd_main --bench-only --fast-only --T $T > $L/ncu_$T.log 2>&1
  echo "ncu $T rc=$? $(( $(date +%s) - s )) s"
  $NCU -i $L/bwd$T.ncu-rep --page raw --csv > $L/raw_$T.csv 2>/dev/null
  $NCU -i $L/bwd$T.ncu-rep --page details --csv > $L/details_$T.csv 2>/dev/null
  $NCU -i $L/bwd$T.ncu-rep --page details > $L/details_$T.txt 2>/dev/null
done
ls -la $L
tar -czf $OUT/s20c_logs.tgz -C /tmp s20c
cat $L/red_rate_grid.log
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|Issue Slots Busy|Warp Cycles Per Issued|Stall|Shared" $L/details_8192.txt | head -40
