#!/usr/bin/env bash
# Session 17, call E: warp-state samples per SASS instruction of the FP8 band kernel at 32K (H_I = 32, b = 256 / C = 2304;
# the ab binary = main's kernels at 950bbec, SASS-identical), for the next session's tail work. carry: build-s17b .dev
set -uo pipefail
cd "$(dirname "$0")/.."
N=build-s17b/x; mkdir -p $N && tar -xJf build-s17b/fp8_bins.tar.xz -C $N
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 170 $NCU --section WarpStateStats --section SourceCounters --kernel-name regex:"fp8_v2_kernelILi32ELi128ELb1ELb1ELb1E" \
  --launch-count 1 -o /tmp/band32k $N/fp8check_ab --bench-only --bench-T 32768 --bench-H 32 --seed 2 --bench-bands 256/2304 > $OUT/ncu_run.txt 2>&1
echo "ncu rc=$?"
timeout 40 $NCU -i /tmp/band32k.ncu-rep --page source --csv --print-source sass > /tmp/band32k_sass.csv 2>/dev/null; echo "export rc=$?"
xz -T4 -c /tmp/band32k_sass.csv > $OUT/band32k_sass.csv.xz; ls -l $OUT
