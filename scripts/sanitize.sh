#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on every CUDA kernel at small sizes, in one
# command (issue 17; re-run it after every kernel change). Builds the GPU check programs of
# tests/cuda/ (each kernel family with its own sources, as in docs/kernels/*.md) and runs each, in
# its --small mode, under each tool. Logs under ${OUT:-/tmp/flashdsa_sanitize}; summary table last.
#
#   bash scripts/sanitize.sh [--tools memcheck,racecheck,synccheck] [--only NAME[,NAME]] [--with-torch]
#
#   --only: check programs to run (hopper_primitives, indexer_topk, sparse_mla_fwd, sparse_mla_bwd,
#           kl_loss); default all.
#   --with-torch: also run the torch ops through memcheck (tests/cuda/fuzz.py, 2 small cases per op,
#           PyTorch's caching allocator off so that out-of-bounds accesses are not hidden in pools).
# Exit status 0 when every step reports 0 errors / 0 hazards and the programs' own checks pass.
# Environment: NVCC, COMPUTE_SANITIZER, STEP_TIMEOUT (seconds per step, default 1200), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_sanitize}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
STEP_TIMEOUT=${STEP_TIMEOUT:-1200}
tools=memcheck,racecheck,synccheck
only=all
with_torch=0
while [ $# -gt 0 ]; do
  case $1 in
    --tools) tools=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --with-torch) with_torch=1; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
if [ ! -x "$SAN" ]; then echo "compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 2; fi

# name | sources | arguments
programs=(
  "hopper_primitives|tests/cuda/hopper_primitives_check.cu|"
  "indexer_topk|tests/cuda/indexer_topk_check.cu csrc/sm90/indexer_topk/*.cu csrc/common/ranges.cpp csrc/common/status.cpp|--small"
  "sparse_mla_fwd|tests/cuda/sparse_mla_fwd_check.cu csrc/sm90/sparse_mla_fwd/*.cu|--small"
  "sparse_mla_bwd|tests/cuda/sparse_mla_bwd_check.cu csrc/sm90/sparse_mla_bwd/*.cu|--small --no-bench"
  "kl_loss|tests/cuda/kl_loss_check.cu csrc/sm90/kl_loss/*.cu csrc/common/ranges.cpp csrc/common/status.cpp|--small"
)
selected() { [ "$only" = all ] || [[ ",$only," == *",$1,"* ]]; }

# Build (in parallel; -lineinfo so that sanitizer reports name source lines).
declare -A built
for entry in "${programs[@]}"; do
  IFS='|' read -r name sources args <<<"$entry"
  selected "$name" || continue
  # shellcheck disable=SC2086
  ( timeout "$STEP_TIMEOUT" "$NVCC" -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a \
      --expt-relaxed-constexpr -Iinclude -Icsrc -o "$OUT/${name}_check" $sources >"$OUT/build_$name.log" 2>&1 ) &
done
wait
summary=()
status=0
for entry in "${programs[@]}"; do
  IFS='|' read -r name sources args <<<"$entry"
  selected "$name" || continue
  if [ -x "$OUT/${name}_check" ]; then built[$name]=1; else
    summary+=("$(printf '%-18s %-10s %s' "$name" build "FAILED (build_$name.log)")"); status=1
    tail -20 "$OUT/build_$name.log"
  fi
done

# Parses one sanitizer log into "N errors" / "N hazards"; sets step_ok.
report() {  # tool log rc
  local tool=$1 log=$2 rc=$3 line count
  if [ "$tool" = racecheck ]; then
    line=$(grep -E "RACECHECK SUMMARY" "$log" | tail -1)
    count=$(sed -nE 's/.*SUMMARY: ([0-9]+) hazard.*/\1/p' <<<"$line")
    result="${count:-?} hazards"
  else
    line=$(grep -E "ERROR SUMMARY" "$log" | tail -1)
    count=$(sed -nE 's/.*SUMMARY: ([0-9]+) error.*/\1/p' <<<"$line")
    result="${count:-?} errors"
  fi
  step_ok=1
  if [ "${count:-x}" != 0 ]; then step_ok=0; fi
  case $rc in
    0) ;;
    124|137) result="$result, TIMEOUT after ${STEP_TIMEOUT}s"; step_ok=0 ;;
    77) result="$result, no GPU (skipped)"; step_ok=0 ;;
    *) result="$result, exit $rc"; step_ok=0 ;;
  esac
}

IFS=',' read -r -a tool_list <<<"$tools"
for entry in "${programs[@]}"; do
  IFS='|' read -r name sources args <<<"$entry"
  [ -n "${built[$name]:-}" ] || continue
  for tool in "${tool_list[@]}"; do
    log="$OUT/${name}_$tool.log"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout "$STEP_TIMEOUT" "$SAN" --tool "$tool" --error-exitcode 99 "$OUT/${name}_check" $args \
      >"$log" 2>&1
    rc=$?
    report "$tool" "$log" "$rc"
    [ "$step_ok" = 1 ] || status=1
    summary+=("$(printf '%-18s %-10s %-28s %5ss  %s' "$name" "$tool" "$result" "$(( $(date +%s) - t0 ))" \
      "$([ "$step_ok" = 1 ] && echo OK || echo "FAIL ($log)")")")
  done
done

if [ "$with_torch" = 1 ]; then
  log="$OUT/torch_ops_memcheck.log"
  t0=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$STEP_TIMEOUT" "$SAN" --tool memcheck --error-exitcode 99 \
    "$PY" tests/cuda/fuzz.py --device cuda --small --cases 2 >"$log" 2>&1
  rc=$?
  report memcheck "$log" "$rc"
  [ "$step_ok" = 1 ] || status=1
  summary+=("$(printf '%-18s %-10s %-28s %5ss  %s' torch_ops memcheck "$result" "$(( $(date +%s) - t0 ))" \
    "$([ "$step_ok" = 1 ] && echo OK || echo "FAIL ($log)")")")
fi

echo "==== compute-sanitizer summary ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?))"
printf '%-18s %-10s %-28s %6s  %s\n' program tool result time status
printf '%s\n' "${summary[@]}"
echo "RESULT: $([ $status = 0 ] && echo OK || echo FAILED)"
exit $status
