#!/usr/bin/env bash
# The main job: install + build, then run the DSA layer forward + backward demo on the default
# device (the GPU when there is one, else the CPU backend at a small size).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
printf '\n==> DSA layer demo\n'
${PYTHON:-python3} examples/dsa_layer_demo.py "$@"
