#!/usr/bin/env bash
# Builds build-x/acc/acc.tar.xz for next_call_accept.sh on a machine without a GPU (nvcc 13, ≈ 1 min): the backward's
# check program of this tree, default (bwd_main) and -DFLASHDSA_BWD_DET_WAVES=1 (bwd_waves), packed in one xz archive
# (≈ 0.5 MB: it has to fit beside .peers/cudnn.tar.xz in the 64 MiB carry) with their sha256 and the commit.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=build-x/acc; W=$(mktemp -d); rm -rf "$D"; mkdir -p "$D"
BUILD_ONLY=1 BIN=$W/w AB_FLAGS="-DFLASHDSA_BWD_DET_WAVES=1" bash scripts/bwd_gpu.sh > "$W/build.log" 2>&1
cp "$W/w/bwd_main" "$W/bwd_main"; cp "$W/w/bwd_ab" "$W/bwd_waves"
echo "main: default; waves: -DFLASHDSA_BWD_DET_WAVES=1; built from $(git rev-parse --short HEAD) (tree clean: $(git status --short | wc -l) changes)" > "$W/flags.txt"
(cd "$W" && sha256sum bwd_main bwd_waves > sha256.txt && tar -cf - bwd_main bwd_waves sha256.txt flags.txt | xz -9e > acc.tar.xz)
cp "$W/acc.tar.xz" "$D/"; rm -rf "$W"; ls -la "$D"
