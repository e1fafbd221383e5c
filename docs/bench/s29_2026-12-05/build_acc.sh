#!/usr/bin/env bash
# Builds build-x/acc/acc.tar.xz for next_call_accept.sh on a machine without a GPU (nvcc 13, ≈ 1 min): the backward's
# check program of this tree (default flags), packed with its sha256 and the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=build-x/acc; W=$(mktemp -d); rm -rf "$D"; mkdir -p "$D"
BUILD_ONLY=1 BIN=$W/main bash scripts/bwd_gpu.sh > "$W/main.log" 2>&1
cp "$W/main/bwd_main" "$D/bwd_main"
echo "built from $(git rev-parse --short HEAD) (tree clean: $(git status --short | wc -l) changes)" > "$D/flags.txt"
(cd "$D" && sha256sum bwd_main > sha256.txt && tar -cJf acc.tar.xz bwd_main sha256.txt flags.txt && rm bwd_main)
rm -rf "$W"; ls -la "$D"
