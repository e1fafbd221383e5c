#!/usr/bin/env bash
# A/B of the sparse MLA forward's build-time variants (the FLASHDSA_FWD_* switches, see
# docs/kernels/sparse_mla_fwd.md "Variants") on one GPU, in one command:
#   1. builds tests/cuda/sparse_mla_fwd_check.cu once per variant (nvcc, in parallel, -Xptxas -v:
#      spills and "wgmma serialized" warnings of the forward kernel are reported),
#   2. static SASS counts of each variant's loops per role (scripts/fwd_sass_counts.py),
#   3. each variant's correctness check (--no-bench: all cases, each run twice, bitwise compared;
#      60 s timeout, three at a time),
#   4. the benchmark (--bench-only, 60 s timeout) alternated over the variants that passed, ROUNDS rounds,
#   and prints a summary and one table (shape x variant: ms / TFLOP/s, best of the rounds' medians) last.
#   bash scripts/fwd_variants_gpu.sh [--rounds N] [--variants "base new ..."] [--build-only] [--no-check]
#                                    [--prebuilt]
# Logs and counts go to $OUT (default /tmp/fwd_variants); binaries to $BIN (default /tmp/fwd_variants_bin).
# --prebuilt: skip step 1 and use the binaries (and their build_<variant>.log) already in $BIN, e.g. built
# on a machine without a GPU with --build-only and carried to the GPU machine.
# Budget: about 6 minutes on one H200 with 16 cores (builds ~1, checks ~1.5, 2 bench rounds ~3);
# bench steps that would start after 7 minutes are skipped (reported).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fwd_variants}; mkdir -p "$OUT"
BIN=${BIN:-/tmp/fwd_variants_bin}; mkdir -p "$BIN"
rounds=2; build_only=0; run_check=1; prebuilt=0
# name -> -D flags. The switches default to 0 (the measured kernel) in the sources; NEW is the set of
# new best guesses and every other variant is NEW with one switch changed (spec_exp is opt-in).
NEW="-DFLASHDSA_FWD_PRODUCER=1 -DFLASHDSA_FWD_DESC=1 -DFLASHDSA_FWD_SOFTMAX=1 -DFLASHDSA_FWD_RESCALE=2 -DFLASHDSA_FWD_EPILOGUE=1"
declare -A FLAGS=(
  [base]=""
  [new]="$NEW"
  [no_producer]="$NEW -DFLASHDSA_FWD_PRODUCER=0"
  [no_desc]="$NEW -DFLASHDSA_FWD_DESC=0"
  [no_softmax]="$NEW -DFLASHDSA_FWD_SOFTMAX=0"
  [no_rescale]="$NEW -DFLASHDSA_FWD_RESCALE=0"
  [rescale1]="$NEW -DFLASHDSA_FWD_RESCALE=1"
  [no_epilogue]="$NEW -DFLASHDSA_FWD_EPILOGUE=0"
  [epilogue_cs]="$NEW -DFLASHDSA_FWD_EPILOGUE=2"
  [regs72]="$NEW -DFLASHDSA_FWD_REGS=1"
  [regs72_nopf]="$NEW -DFLASHDSA_FWD_REGS=1 -DFLASHDSA_FWD_IDX_PREFETCH=0"
  [spec_exp]="$NEW -DFLASHDSA_FWD_SPEC_EXP=1"
)
variants="base new no_producer no_desc no_softmax no_rescale rescale1 no_epilogue epilogue_cs regs72 regs72_nopf spec_exp"
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --no-check) run_check=0; shift ;;
    --prebuilt) prebuilt=1; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
for v in $variants; do [ -n "${FLAGS[$v]+x}" ] || { echo "unknown variant $v (known: ${!FLAGS[*]})"; exit 2; }; done
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
summary=()

# 1. builds
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
srcs=(tests/cuda/sparse_mla_fwd_check.cu csrc/sm90/sparse_mla_fwd/sparse_mla_fwd.cu csrc/common/ranges.cpp
      csrc/common/status.cpp)
for v in $variants; do
  if [ $prebuilt = 1 ]; then cp "$BIN/build_$v.log" "$OUT/build_$v.log" 2>/dev/null; continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do sleep 1; done
  # shellcheck disable=SC2086
  timeout 300 "$NVCC" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
    -Iinclude -Icsrc ${FLAGS[$v]} -o "$BIN/$v" "${srcs[@]}" >"$OUT/build_$v.log" 2>&1 &
done
wait
[ $prebuilt = 1 ] || for v in $variants; do cp "$OUT/build_$v.log" "$BIN/build_$v.log"; done
built=""
for v in $variants; do
  if [ -x "$BIN/$v" ] && ! grep -q "error" "$OUT/build_$v.log"; then
    built="$built $v"
    # ptxas -v: the "Function properties" line of each sparse_mla_fwd_kernel instance is followed by its spills.
    spills=$(grep -A1 "Function properties for .*sparse_mla_fwd_kernel" "$OUT/build_$v.log" | grep -o "[0-9]* bytes spill stores" |
             sort -u | tr '\n' ' ')
    serial=$(grep -c "C75[0-9][0-9]\|wgmma.*serializ" "$OUT/build_$v.log")
    summary+=("build $v: OK (${spills:-no spill line}; wgmma-serialization warnings: $serial)")
  else
    summary+=("build $v: FAILED (see build_$v.log)"); tail -5 "$OUT/build_$v.log"
  fi
done
echo "builds done at $(elapsed) s"

# 2. static SASS counts (the steady-state loop of each role, per kernel instance)
for v in $built; do
  echo "== $v"; timeout 120 python3 scripts/fwd_sass_counts.py "$BIN/$v"
done >"$OUT/sass_counts.txt" 2>&1
[ $build_only = 1 ] && { echo "==== summary"; printf '%s\n' "${summary[@]}"; cat "$OUT/sass_counts.txt"; exit 0; }

# 3. correctness, three variants at a time (the CPU reference is multithreaded; the GPU part is short)
if [ $run_check = 1 ]; then
  # A check takes ~10 s; 60 s means a hang (e.g. a barrier bug): such variants are not benchmarked.
  printf '%s\n' $built | xargs -P 3 -I{} sh -c "timeout 60 '$BIN/{}' --no-bench >'$OUT/check_{}.log' 2>&1; echo \$? >'$OUT/check_{}.rc'"
  passed=""
  for v in $built; do
    rc=$(cat "$OUT/check_$v.rc")
    summary+=("check $v: exit $rc ($(tail -1 "$OUT/check_$v.log"))")
    if [ "$rc" = 0 ]; then passed="$passed $v"; else summary+=("  -> $v not benchmarked"); fi
  done
  built=$passed
  echo "checks done at $(elapsed) s"
fi

# 4. benchmark, variants alternated within each round
for r in $(seq 1 "$rounds"); do
  for v in $built; do
    if [ "$(elapsed)" -gt 420 ]; then
      summary+=("bench $v round $r: skipped (time budget)"); continue
    fi
    timeout 60 "$BIN/$v" --bench-only >"$OUT/bench_${v}_r$r.log" 2>&1 || summary+=("bench $v round $r: exit $?")
  done
done
echo "bench done at $(elapsed) s"

echo "==== summary"
printf '%s\n' "${summary[@]}"
echo "SASS counts (static instructions per steady-state loop; 'fused' = the scale > 0 instance that the"
echo "benchmark runs, 'plain' = scale <= 0 or FLASHDSA_FWD_SOFTMAX=0; all classes in sass_counts.txt):"
awk '/^==/ {v=$2} / (consumer|producer)/ {printf "  %-12s %-6s %-10s total %5d  FMUL %4d  FFMA %4d  int %4d  mov %4d\n", v, $2, $3, $5, $8, $9, $22, $23}' \
  "$OUT/sass_counts.txt"
python3 - "$OUT" "$rounds" $built <<'EOF'
import math, os, re, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
row = re.compile(r"^\s+(uniform|causal)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$")
best, spread, shapes = {}, 0.0, []
for v in variants:
    per_round = []
    for r in range(1, rounds + 1):
        path = os.path.join(out, "bench_%s_r%d.log" % (v, r))
        if not os.path.exists(path):
            continue
        vals = {}
        for line in open(path):
            m = row.match(line)
            if m:
                key = "%s H=%s T=%s" % (m.group(1), m.group(2), m.group(3))
                vals[key] = (float(m.group(4)), float(m.group(5)))
                if key not in shapes:
                    shapes.append(key)
        per_round.append(vals)
    for key in shapes:
        ms = [pr[key] for pr in per_round if key in pr]
        if ms:
            best[(v, key)] = min(ms)
            if len(ms) > 1:
                spread = max(spread, (max(x[0] for x in ms) - min(x[0] for x in ms)) / min(x[0] for x in ms))
print("\nbenchmark: ms / TFLOP/s per shape and variant (best of %d rounds' medians)" % rounds)
print("largest round-to-round spread of one cell: %.1f%%" % (100 * spread))
w = 16
print("%-26s" % "shape" + "".join("%*s" % (w, v) for v in variants))
for key in shapes:
    cells = []
    for v in variants:
        b = best.get((v, key))
        cells.append("%*s" % (w, "%.3f/%.0f" % b if b else "-"))
    print("%-26s" % key + "".join(cells))
if "base" in variants:
    geo = []
    for v in variants:
        ratios = [best[("base", k)][0] / best[(v, k)][0] for k in shapes if ("base", k) in best and (v, k) in best]
        geo.append("%.3fx" % math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else "-")
    print("%-26s" % "speed vs base (geomean)" + "".join("%*s" % (w, g) for g in geo))
EOF
