#!/usr/bin/env bash
# Builds build-x/s29/s29.tar.xz for next_call_detdiet.sh on a machine without a GPU (nvcc 13, ≈ 2 min): the
# backward's check program of this tree, default and six A/B builds, packed with their sha256 and flags.
set -euo pipefail
cd "$(dirname "$0")/../../.."
declare -A F=([raw]="-DFLASHDSA_BWD_DET_RAW_BITS=1" [addr]="-DFLASHDSA_BWD_DET_ADDR=1"
  [both]="-DFLASHDSA_BWD_DET_ADDR=1 -DFLASHDSA_BWD_DET_RAW_BITS=1"
  [all]="-DFLASHDSA_BWD_DET_ADDR=1 -DFLASHDSA_BWD_DET_RAW_BITS=1 -DFLASHDSA_BWD_DET_AMAX2=1"
  [allr]="-DFLASHDSA_BWD_DET_ADDR=1 -DFLASHDSA_BWD_DET_RAW_BITS=1 -DFLASHDSA_BWD_DET_AMAX2=1 -DFLASHDSA_BWD_FIXED_SUM_MARGIN_LOG2=20 -DFLASHDSA_BWD_FIXED_MAX_MARGIN_LOG2=20"
  [nr]="-DFLASHDSA_BWD_SWEEP_NOROT=1")
D=build-x/s29; W=$(mktemp -d); rm -rf "$D"; mkdir -p "$D"
BUILD_ONLY=1 BIN=$W/main bash scripts/bwd_gpu.sh > "$W/main.log" 2>&1
cp "$W/main/bwd_main" "$D/bwd_main"
for n in raw addr both all allr nr; do
  BUILD_ONLY=1 BIN=$W/$n AB_FLAGS="${F[$n]}" bash scripts/bwd_gpu.sh > "$W/$n.log" 2>&1
  echo "$n: 0-spill kernels $(grep -A1 'Function properties for.*main_kernelILb' /tmp/bwd_gpu/build_ab.log | grep -c ' 0 bytes spill stores') / 2"
  cp "$W/$n/bwd_ab" "$D/bwd_$n"; echo "$n: ${F[$n]}" >> "$D/flags.txt"
done
echo "built from $(git rev-parse --short HEAD) (tree clean: $(git status --short | wc -l) changes)" >> "$D/flags.txt"
(cd "$D" && sha256sum bwd_* > sha256.txt && tar -cJf s29.tar.xz bwd_* sha256.txt flags.txt && rm bwd_*)
rm -rf "$W"; ls -la "$D"
