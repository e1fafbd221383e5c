#!/usr/bin/env bash
# A/B of a kernel change on the GPU in one sitting: builds one CUDA check program (tests/cuda/NAME.cu)
# twice with nvcc — "after" from this tree, "before" with the files under OVERLAY put back (OVERLAY
# mirrors repository paths, e.g. OVERLAY/csrc/sm90/indexer_topk/kernel.cuh) — then runs both with the
# same arguments, alternating before/after ROUNDS times.
#   bash scripts/ab_check.sh OVERLAY NAME "KERNEL_SOURCES" ROUNDS -- ARGS...
# e.g. bash scripts/ab_check.sh .old/before indexer_topk_check "csrc/sm90/indexer_topk/indexer_topk.cu" 2 \
#        -- --bench-only --bench-T 8192,32768
# Output lines are prefixed "before:" / "after:"; logs go to $OUT (or /tmp/ab).
set -uo pipefail
cd "$(dirname "$0")/.."
overlay=$1; name=$2; sources=$3; rounds=$4; shift 4; [ "${1:-}" = "--" ] && shift
out=${OUT:-/tmp/ab}; mkdir -p "$out"
flags=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo)
# The check programs build their key ranges with the library's helpers (tests/cuda/check_common.cuh).
after_src=(csrc/common/ranges.cpp csrc/common/status.cpp); before_src=(csrc/common/ranges.cpp csrc/common/status.cpp)
for s in $sources; do
  after_src+=("$s")
  if [ -f "$overlay/$s" ]; then before_src+=("$overlay/$s"); else before_src+=("$s"); fi
done
nvcc "${flags[@]}" -Iinclude -Icsrc -o /tmp/ab_after_$name tests/cuda/$name.cu "${after_src[@]}" >"$out/build_after_$name.log" 2>&1 &
nvcc "${flags[@]}" -I"$overlay/csrc" -Iinclude -Icsrc -o /tmp/ab_before_$name tests/cuda/$name.cu "${before_src[@]}" \
  >"$out/build_before_$name.log" 2>&1 &
wait
for v in after before; do
  [ -x /tmp/ab_${v}_$name ] || { echo "build ($v) failed:"; tail -20 "$out/build_${v}_$name.log"; exit 1; }
done
for r in $(seq 1 "$rounds"); do
  /tmp/ab_before_$name "$@" 2>&1 | tee -a "$out/${name}_before.log" | sed 's/^/before: /'
  /tmp/ab_after_$name "$@" 2>&1 | tee -a "$out/${name}_after.log" | sed 's/^/after:  /'
done
