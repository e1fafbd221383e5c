#!/usr/bin/env bash
# Prepared on 2026-12-04 (twenty-first session; no device was lent that session), not yet run: the bf16 indexer's
# final selection with one warp per row (-DFLASHDSA_ITK_WARP_FINAL=1, kernel_v2.cuh; docs/perf-notes.md), A/B
# against the default build, with the SM clock / power sampled beside the rounds (this also answers the prepared
# variance call, docs/bench/s20_2026-12-04/next_call_indexer_variance.sh: do slow processes coincide with lower
# clocks?). Binaries built here (check program, commands in docs/kernels/indexer_topk.md):
#   nvcc <flags> [-DFLASHDSA_ITK_WARP_FINAL=1] -o build-x/itkwf/check_{main,wf} tests/cuda/indexer_topk_check.cu \
#        csrc/common/ranges.cpp csrc/common/status.cpp csrc/sm90/indexer_topk/indexer_topk.cu
# Device: run(command="bash docs/bench/s21_2026-12-04/next_call_itk_warp_final.sh", carry=["build-x/itkwf"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/itkwf; rm -rf "$L"; mkdir -p "$L"; B=build-x/itkwf; OUT=${OUT:-/tmp}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 200 > "$L/smi.csv" 2>&1 &
smi=$!
# The archive and the table, written twice (after the rounds and at the end), so a call cut short still returns the A/B
# numbers (review of 2026-12-05).
pack_and_report() {
tar -czf "$OUT/itkwf_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"; tail -2 "$L/correct.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/racecheck.log "$L"/synccheck.log 2>/dev/null
echo "H T | main r1 r2 r3 | wf r1 r2 r3   (ms, per-process medians)"
for H in 32 64; do for T in 8192 32768 131072; do
  row="$H $T |"
  for v in main wf; do for r in 1 2 3; do
    row="$row $(awk -v H=$H -v T=$T '$1==H && $2==T && NF>=7 {print $3; exit}' "$L/${v}_r$r.log")"
  done; row="$row |"; done
  echo "$row"
done; done
grep -h "SOME FAILED\|FAIL" "$L"/wf_r*.log | head -5
awk -F', ' 'NR > 1 && $2 + 0 > 0 { n++; s += $2; if (min == "" || $2 + 0 < min) min = $2 + 0 } END { if (n) printf "SM clock over the rounds: mean %.0f MHz, min %d MHz (%d samples)\n", s / n, min, n }' "$L/smi.csv"
}
s=$(date +%s)
timeout -k 5 150 $B/check_wf --no-bench --seed 20261205 > "$L/correct.log" 2>&1; echo "wf correct rc=$? $(( $(date +%s) - s )) s"
for r in 1 2 3; do
  order="main wf"; [ $((r % 2)) = 0 ] && order="wf main"
  for v in $order; do
    [ $(( $(date +%s) - s )) -gt 450 ] && { echo "$v r$r skipped (time)"; continue; }
    date +%s.%N > "$L/start_${v}_r$r.txt"
    timeout -k 5 90 $B/check_$v --bench-only --bench-T 8192,32768,131072 --bench-H 32,64 --seed 7 > "$L/${v}_r$r.log" 2>&1
    echo "$v r$r rc=$? $(( $(date +%s) - s )) s"
  done
done
kill $smi 2>/dev/null
pack_and_report
for t in memcheck racecheck synccheck; do
  left=$(( 570 - ($(date +%s) - s) )); [ $left -lt 20 ] && { echo "$t skipped (time)"; continue; }
  timeout $(( left < 110 ? left : 110 )) $SAN --tool $t $B/check_wf --small --seed 1 > "$L/$t.log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - s )) s"
done
# Added 2026-12-04 (twenty-second session), if time is left: an ncu report of the default bf16 kernel at 32K, H_I = 32
# (comes back in the archive; read per instruction on the CPU machine: scripts/ncu_source_stalls.py X.ncu-rep).
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
left=$(( 570 - ($(date +%s) - s) ))
if [ $left -gt 100 ]; then
  timeout $(( left - 10 )) $NCU -f --set full -k regex:indexer_topk_v2 -s 1 -c 1 -o "$L/itk32k" $B/check_main --bench-only \
    --bench-T 32768 --bench-H 32 --seed 7 > "$L/ncu.log" 2>&1
  echo "ncu rc=$? $(( $(date +%s) - s )) s"
fi
pack_and_report
