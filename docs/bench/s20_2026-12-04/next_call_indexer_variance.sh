#!/usr/bin/env bash
# Prepared on 2026-12-04 (twentieth session), not yet run: why the bf16 indexer's 32K time varies 8.64-9.38 ms between
# processes of one device call (docs/bench/s20_2026-12-04/call_a, per-process medians of 10). Runs the check
# program's benchmark at 32K, H_I = 32, eight times in separate processes while nvidia-smi samples the SM clock,
# power and temperature every 100 ms; then once more after a 20 s idle. If the slow processes coincide with lower
# SM clocks (power / thermal limit after the 128K runs), the spread is the GPU's, not the kernel's.
# Here first: build the check program (tests/cuda/indexer_topk_check.cu + csrc/sm90/indexer_topk/indexer_topk.cu +
#   csrc/common/{ranges,status}.cpp, nvcc -O3 -gencode=arch=compute_90a,code=sm_90a) into build-x/idx/check.
# Device: run(command="bash docs/bench/s20_2026-12-04/next_call_indexer_variance.sh", carry=["build-x/idx"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/itk_var; mkdir -p "$L"; OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 100 > "$L/smi.csv" 2>&1 &
smi=$!
for r in 1 2 3 4 5 6 7 8; do
  date +%s.%N > "$L/start_$r.txt"
  timeout 60 build-x/idx/check --bench-only --bench-T 32768,131072 --bench-H 32 --seed 7 > "$L/run_$r.log" 2>&1
done
sleep 20
timeout 60 build-x/idx/check --bench-only --bench-T 32768 --bench-H 32 --seed 7 > "$L/run_idle.log" 2>&1
kill $smi
tar -czf "$OUT/itk_var_logs.tgz" -C "$L" .
for f in "$L"/run_*.log; do echo "$(basename $f): $(awk '$1 == 32 && $2 == 32768 {print $3}' $f) ms at 32K"; done
