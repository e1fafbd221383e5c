#!/usr/bin/env bash
# Attribution of the FP8 (e4m3) selection pass's time on one H200 (csrc/sm90/indexer_topk/fp8_kernel.cuh;
# docs/kernels/indexer_topk.md "FP8 selection pass"): builds tests/cuda/indexer_topk_fp8_check.cu once
# per variant (the library build's objects, only indexer_topk_fp8.cu recompiled with the variant's -D
# flags): `full` (the library's kernel) and the attribution builds a1-a4 (-DFLASHDSA_FP8_ABLATE=n,
# wrong results by design). Runs the correctness cases of `full` and compute-sanitizer memcheck +
# racecheck of it (--small), all at once, then the benchmark (--bench-only --bench-T $BENCH_T
# --bench-H $BENCH_H) alternated over the variants for $ROUNDS rounds; per-step timeouts, logs under
# ${OUT:-/tmp/flashdsa_fp8v}, a table last (ms per variant, speed vs the bf16 fused kernel of the same
# run, recall). (Until 2026-12-02 it also A/B-tested four speed switches; they are folded in.)
#
#   bash scripts/fp8_variants_gpu.sh --phases build          (first, on a machine without binaries)
#   bash scripts/fp8_variants_gpu.sh --phases check,bench    (about 5-6 minutes)
#   BIN=dir PREBUILT=1 bash scripts/fp8_variants_gpu.sh --phases check,bench
#        (dir holds fp8check_<variant> binaries or fp8_variants.tar.xz of them, built elsewhere with
#         --phases build, e.g. on the CPU box: BIN=/path LIB=/path/to/libflashdsa.a ... --phases build)
#
# Environment: VARIANTS (full, a1-a4: see flags_of; default "full a1 a2 a3 a4"), CHECK_VARIANTS
# (default "full"), BEST (sanitized variant, default full), ROUNDS (2), BENCH_T
# (8192,32768,131072), BENCH_H (32,64), BUILD (the CMake build dir holding libflashdsa.a, default
# build), LIB (default $BUILD/libflashdsa.a), BIN / OBJ (binaries / objects, default
# $BUILD/fp8_variants/{bin,obj}: outside $OUT, which holds only the logs), NVCC, JOBS.
# The build phase first brings $BUILD/libflashdsa.a up to date (ninja, incremental; a cold build of
# every kernel takes several minutes: then run `--phases build` alone), unless LIB points elsewhere.
# The variant binaries are ≈ 32 MB each (every kernel of the library is linked in): to carry them
# from another machine, `tar -cJf $BIN/fp8_variants.tar.xz -C $BIN .` (≈ 4–5 MB per variant) and
# PREBUILT=1 unpacks it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_fp8v}; mkdir -p "$OUT"
BUILD=${BUILD:-build}
LIB=${LIB:-$BUILD/libflashdsa.a}
BIN=${BIN:-$BUILD/fp8_variants/bin}
OBJ=${OBJ:-$BUILD/fp8_variants/obj}
NVCC=${NVCC:-nvcc}
JOBS=${JOBS:-$(nproc)}
VARIANTS=${VARIANTS:-"full a1 a2 a3 a4"}
CHECK_VARIANTS=${CHECK_VARIANTS:-"full"}
BEST=${BEST:-full}
ROUNDS=${ROUNDS:-2}
BENCH_T=${BENCH_T:-8192,32768,131072}
BENCH_H=${BENCH_H:-32,64}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
phases=build,check,bench
build_one=
while [ $# -gt 0 ]; do
  case $1 in
    --phases) phases=$2; shift 2 ;;
    --build-one) build_one=$2; shift 2 ;;  # internal: builds one variant's binary
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
has() { [[ ",$phases," == *",$1,"* ]]; }

flags_of() {  # the -D flags of a variant
  case $1 in
    full) echo "" ;;
    a1|a2|a3|a4) echo "-DFLASHDSA_FP8_ABLATE=${1#a}" ;;  # attribution only: results are wrong
    *) echo "BAD" ;;
  esac
}
describe() {
  case $1 in
    full) echo "the library's kernel" ;;
    a1) echo "attribution: MMA + fold only" ;;
    a2) echo "attribution: scores + head sums + pass test, no appends" ;;
    a3) echo "attribution: walk + appends, top K from the FP8 lists (no C cut, no re-score)" ;;
    a4) echo "attribution: walk + C cut, no re-score" ;;
  esac
}
for v in $VARIANTS $CHECK_VARIANTS $BEST; do
  [ "$(flags_of "$v")" = BAD ] && { echo "unknown variant $v"; exit 2; }
done

# ---- 1. build: one check object, one indexer_topk_fp8 object per variant, linked against the library
# (the variant object defines every symbol of the library's indexer_topk_fp8 member, so the linker
# never pulls that member).
NVFLAGS=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -Iinclude -Icsrc)
if [ -n "$build_one" ]; then
  v=$build_one
  # shellcheck disable=SC2046
  "$NVCC" "${NVFLAGS[@]}" -DFLASHDSA_WITH_CUDA=1 -Xptxas -v $(flags_of "$v") -c \
    csrc/sm90/indexer_topk/indexer_topk_fp8.cu -o "$OBJ/fp8_$v.o" || exit 1
  exec "$NVCC" -gencode=arch=compute_90a,code=sm_90a "$OBJ/check.o" "$OBJ/fp8_$v.o" "$LIB" -lpthread \
    -o "$BIN/fp8check_$v"
fi
rows=()
source scripts/lib/gpu_steps.sh
step() { row_step "$@"; }  # step NAME TIMEOUT LOG CMD...
# Runs `step` in the background; its row is written to $OUT/rows.d/NAME when it ends.
mkdir -p "$OUT/rows.d"; rm -f "$OUT"/rows.d/*
bg_step() {
  local name=$1
  ( rows=(); step "$@"; printf '%s\n' "${rows[@]}" >"$OUT/rows.d/$name" ) &
}
collect_bg() { wait; for f in "$OUT"/rows.d/*; do [ -f "$f" ] && rows+=("$(cat "$f")"); done; rm -f "$OUT"/rows.d/*; }

if has build && [ "${PREBUILT:-0}" != 1 ]; then
  if [ "$LIB" = "$BUILD/libflashdsa.a" ]; then  # (incremental: only what changed since the last build)
    [ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DFLASHDSA_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      >"$OUT/configure.log" 2>&1
    step "build libflashdsa.a" 540 build_lib.log cmake --build "$BUILD" --target flashdsa -j "$JOBS"
  fi
  mkdir -p "$BIN" "$OBJ"
  step "build check object" 300 build_check_obj.log "$NVCC" "${NVFLAGS[@]}" -Itests/cuda -c \
    tests/cuda/indexer_topk_fp8_check.cu -o "$OBJ/check.o"
  for v in $(echo $VARIANTS $CHECK_VARIANTS $BEST | tr ' ' '\n' | sort -u); do
    bg_step "build $v" 420 "build_$v.log" bash "$0" --build-one "$v"
  done
  collect_bg
  grep -H "spill stores" "$OUT"/build_*.log | grep -v " 0 bytes spill stores" && echo "SPILLS (see above)"
  grep -Hi "C7514\|C7518\|serializ" "$OUT"/build_*.log && echo "wgmma serialization warnings (see above)"
fi
if [ "${PREBUILT:-0}" = 1 ] && [ -f "$BIN/fp8_variants.tar.xz" ] && [ ! -d "$BIN/x" ]; then
  mkdir -p "$BIN/x" && tar -xJf "$BIN/fp8_variants.tar.xz" -C "$BIN/x"
fi
binary() {
  if [ -x "$BIN/fp8check_$1" ]; then echo "$BIN/fp8check_$1"; else echo "$BIN/x/fp8check_$1"; fi
}

# ---- 2. correctness of the full kernel + its sanitizers (concurrent: no timing here).
if has check; then
  for v in $CHECK_VARIANTS; do
    b=$(binary "$v"); [ -x "$b" ] || { rows+=("check $v | NO BINARY | - | -"); continue; }
    bg_step "check $v" 200 "check_$v.log" "$b" --no-bench --seed 1
  done
  b=$(binary "$BEST")
  if [ -x "$SAN" ] && [ -x "$b" ]; then
    bg_step "memcheck $BEST --small" 200 "memcheck_$BEST.log" "$SAN" --tool memcheck --error-exitcode 3 "$b" --small --seed 3
    bg_step "racecheck $BEST --small" 200 "racecheck_$BEST.log" "$SAN" --tool racecheck --error-exitcode 3 "$b" --small --seed 3
  fi
  collect_bg
fi

# ---- 3. benchmark, the variants alternated, $ROUNDS rounds.
if has bench; then
  for r in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
      b=$(binary "$v"); [ -x "$b" ] || { rows+=("bench $v r$r | NO BINARY | - | -"); continue; }
      step "bench $v r$r" 120 "bench_${v}_r$r.log" "$b" --bench-only --bench-T "$BENCH_T" --bench-H "$BENCH_H" --seed 2
    done
  done
fi

# ---- summary
for v in $CHECK_VARIANTS; do
  [ -f "$OUT/check_$v.log" ] && echo "==== check $v: $(grep -cE ' PASS' "$OUT/check_$v.log") PASS, $(grep -cE ' FAIL' "$OUT/check_$v.log") FAIL; $(tail -1 "$OUT/check_$v.log")"
done
for f in memcheck racecheck; do
  [ -f "$OUT/${f}_$BEST.log" ] && echo "==== $f $BEST: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/${f}_$BEST.log" | tail -1)"
done
echo "==== steps (logs in $OUT)"
printf 'step | status | time | log\n'
printf '%s\n' "${rows[@]}"
if has bench; then
  echo "==== benchmark: FP8 ms (quantize + select; min over rounds), speed vs the bf16 fused kernel of the same runs and vs full, spread over rounds"
  { fp8_bench_results_py; cat <<'PY'
print("%-8s " % "variant" + " ".join("%-38s" % ("H%d T%dK" % (H, T // 1024)) for H, T in shapes))
for v in variants:
    cells = []
    for H, T in shapes:
        rs = res.get((v, H, T))
        if not rs:
            cells.append("%-38s" % "-")
            continue
        fp8 = min(x[1] for x in rs)
        bf = min(x[0] for x in rs)
        spread = max(x[1] for x in rs) / fp8 - 1
        full = res.get(("full", H, T))
        vs_full = ", %.2fx full" % (min(x[1] for x in full) / fp8) if full and v != "full" else ""
        cells.append("%-38s" % ("%.3f (%.2fx bf16%s, ±%.0f%%)" % (fp8, bf / fp8, vs_full, 100 * spread)))
    print("%-8s " % v + " ".join(cells))
print("recall (mean / min row) of the exact bf16 top-K per variant and shape:")
for v in variants:
    print("%-8s " % v + " ".join("%-24s" % ("%.5f / %.4f" % (min(x[3] for x in res[(v, H, T)]), min(x[4] for x in res[(v, H, T)]))
                                            if (v, H, T) in res else "-") for H, T in shapes))
print("bf16 fused ms (min over all runs): " + ", ".join("H%d T%dK %.3f" % (H, T // 1024, min(x[0] for (vv, h, t), rs in res.items() if (h, t) == (H, T) for x in rs)) for H, T in shapes))
PY
  } | python3 - "$OUT" "$ROUNDS" $VARIANTS
  for v in $VARIANTS; do echo "  $v = $(describe "$v")"; done
fi
