#!/usr/bin/env bash
# Where the deterministic backward's time goes beyond the main kernel at 32K (prepared in the thirtieth session; the
# lead call's nsys step was cut): run(command="bash docs/bench/s30_2026-12-05/next_call_nsys_det.sh") (≈ 2 min + start).
# Builds the check program on the device (≈ 20 s), then one det 32K run (fast + det + 3-run bitwise check) under nsys
# and the per-kernel table (bound / count / units / sort / main / check / decode / unpermute). Issue 19's det / fast at
# 32K is at the 0.8× line (0.795× / 0.801×): a pass around the main kernel worth ≥ 1% is the lever if there is one.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/nsysdet; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}; B=/tmp/nsysdet_bin
BUILD_ONLY=1 BIN=$B timeout 200 bash scripts/bwd_gpu.sh > "$L/build.log" 2>&1; echo "build rc=$?"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > "$L/gpu.txt"
if command -v nsys > /dev/null; then
  for T in 32768 131072; do
    timeout 150 nsys profile -o "$L/det$T" --force-overwrite true --stats=false $B/bwd_main --bench-only --T $T \
      > "$L/nsys_run_$T.log" 2>&1; echo "nsys $T rc=$?"
    timeout 90 nsys stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum "$L/det$T.nsys-rep" > "$L/nsys_kern_$T.txt" 2>&1
    rm -f "$L/det$T.nsys-rep" "$L/det$T.sqlite"
  done
else
  echo "no nsys on this machine" | tee "$L/nsys_kern_32768.txt"
fi
tar -czf "$OUT/nsysdet_logs.tgz" -C "$L" .
cat "$L/gpu.txt"
for T in 32768 131072; do grep -E '^ +[0-9]+ \|' "$L/nsys_run_$T.log"; head -45 "$L/nsys_kern_$T.txt" | cut -c1-220; done
