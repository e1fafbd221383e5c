#!/usr/bin/env bash
# The FP8 (e4m3) selection pass of indexer_topk on one H200 (csrc/sm90/indexer_topk/fp8_kernel_v2.cuh:
# the walk at D_I = 128, fp8_kernel.cuh: D_I = 64 and the quantization; docs/kernels/indexer_topk.md
# "FP8 selection pass"): correctness, recall, sanitizers and the benchmark against the bf16 fused kernel.
# It runs tests/cuda/indexer_topk_fp8_check.cu built from this tree (indexer_topk_fp8.cu compiled here,
# the rest linked from $LIB, default build/libflashdsa.a):
#   fp8 = the default build (the library's FP8 pass);
#   ab  = only with AB_FLAGS="-D..." set: indexer_topk_fp8.cu again with those nvcc flags, for an A/B
#         of a compile-time change (benchmarked alternately with fp8, checked and sanitized);
#   ab2 = only with AB2_FLAGS="-D..." set (and AB_FLAGS): a third build, as ab.
#
#   BUILD_ONLY=1 bash scripts/fp8_gpu.sh    (any machine with nvcc 13 and $LIB: builds the binaries and
#        packs them into $BIN/fp8_bins.tar.xz, BIN default build-fp8; ≈ 2–3 min on 2 cores)
#   PREBUILT=1 bash scripts/fp8_gpu.sh      (the H200: carry build-fp8; ≈ 4 min; SKIP_CHECK=1 or
#        SKIP_BENCH=1 split it into two calls)
#   bash scripts/fp8_gpu.sh                 (builds on the H200 first: needs $LIB there)
#
# Steps (per-step timeouts; logs under ${OUT:-/tmp/flashdsa_fp8}; tables last):
#   1. concurrently (nothing is timed): the check cases (--no-bench; the FP8 tolerance by D_I: 0.05 of
#      the row bound for the packed bf16x2 epilogue at D_I = 128, 2e-4 for the f32 one at 64), again at
#      --tol8 0.005 (informational: catches a wrong weight layout or key scale that 0.05 lets pass),
#      compute-sanitizer memcheck / racecheck / synccheck of --small;
#   2. the benchmark (--bench-only --bench-T $BENCH_T --bench-H $BENCH_H, D_I = 128, K = 2048), $ROUNDS
#      rounds (fp8 and ab alternated); each run also times the bf16 fused kernel on the same inputs;
#   3. the table: FP8 ms (quantize + select, min over rounds) per shape, speed vs bf16 (and ab vs fp8),
#      recall of the exact bf16 top K (mean / min row).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_fp8}; mkdir -p "$OUT"
BIN=${BIN:-build-fp8}
LIB=${LIB:-build/libflashdsa.a}
NVCC=${NVCC:-nvcc}
ROUNDS=${ROUNDS:-2}
BENCH_T=${BENCH_T:-8192,32768,131072}
BENCH_H=${BENCH_H:-32,64}
AB_FLAGS=${AB_FLAGS:-}
AB2_FLAGS=${AB2_FLAGS:-}
VARIANTS="fp8"; [ -n "$AB_FLAGS" ] && VARIANTS="fp8 ab"
[ -n "$AB_FLAGS" ] && [ -n "$AB2_FLAGS" ] && VARIANTS="fp8 ab ab2"
NVFLAGS=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Iinclude -Icsrc)
source scripts/lib/gpu_steps.sh  # row_step, fp8_bench_results_py; NVCC, SAN

# ---- build (skipped with PREBUILT=1)
if [ "${PREBUILT:-0}" != 1 ]; then
  [ -f "$LIB" ] || { echo "no $LIB: build the library first (cmake --build build --target flashdsa) or set LIB"; exit 2; }
  OBJ=${OBJ:-$(mktemp -d)}; mkdir -p "$BIN" "$OBJ/bin"
  echo "=== build ($(date -u +%H:%M:%S)): objects in $OBJ, binaries packed into $BIN/fp8_bins.tar.xz"
  pids=()
  timeout 600 "$NVCC" "${NVFLAGS[@]}" -Itests/cuda -c tests/cuda/indexer_topk_fp8_check.cu -o "$OBJ/check.o" \
    >"$OUT/build_check.log" 2>&1 & pids+=($!)
  for v in $VARIANTS; do
    vflags=(); [ "$v" = ab ] && read -r -a vflags <<<"$AB_FLAGS"
    [ "$v" = ab2 ] && read -r -a vflags <<<"$AB2_FLAGS"
    # (this object defines every symbol of the library's indexer_topk_fp8 member: the linker never pulls it)
    timeout 600 "$NVCC" "${NVFLAGS[@]}" -DFLASHDSA_WITH_CUDA=1 -Xptxas -v "${vflags[@]}" -c \
      csrc/sm90/indexer_topk/indexer_topk_fp8.cu -o "$OBJ/fp8_$v.o" >"$OUT/build_$v.log" 2>&1 & pids+=($!)
    [ -n "${JOBS1:-}" ] && wait "${pids[-1]}"
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || { echo "build failed: see $OUT/build_*.log"; tail -20 "$OUT"/build_*.log; exit 2; }
  for v in $VARIANTS; do
    "$NVCC" -gencode=arch=compute_90a,code=sm_90a "$OBJ/check.o" "$OBJ/fp8_$v.o" "$LIB" -lpthread \
      -o "$OBJ/bin/fp8check_$v" >>"$OUT/build_$v.log" 2>&1 || { echo "link $v failed"; exit 2; }
  done
  echo "ptxas (FP8 kernels: registers, spills; wgmma serialisation warnings):"
  for v in $VARIANTS; do
    awk -v v="$v" '/Compiling entry function/ { match($0, /indexer_topk_fp8(_v2)?_kernelILi[0-9]+ELi[0-9]+ELb[01]/);
                     k = substr($0, RSTART, RLENGTH) } /spill stores/ { sp = $5 " B spill stores, " $9 " B spill loads" }
                   /Used [0-9]+ registers/ && k != "" { print "  " v ": " k ": " $5 " registers, " sp; k = "" }' "$OUT/build_$v.log"
    grep -E "C751[0-9]|C752[0-9]|serializ" "$OUT/build_$v.log" && echo "  $v: WGMMA SERIALISATION WARNING"
  done
  tar -cJf "$BIN/fp8_bins.tar.xz" -C "$OBJ/bin" . && ls -l "$BIN/fp8_bins.tar.xz"
  [ "${BUILD_ONLY:-0}" = 1 ] && exit 0
fi
X=$BIN/x
if [ ! -x "$X/fp8check_fp8" ]; then
  mkdir -p "$X" && tar -xJf "$BIN/fp8_bins.tar.xz" -C "$X" || { echo "cannot unpack $BIN/fp8_bins.tar.xz"; exit 2; }
fi
[ -n "$AB_FLAGS" ] || [ ! -x "$X/fp8check_ab" ] || VARIANTS="fp8 ab"  # prebuilt with an ab binary
[ -n "$AB2_FLAGS" ] || [ ! -x "$X/fp8check_ab2" ] || VARIANTS="fp8 ab ab2"

rows=()
step() { row_step "$@"; }
mkdir -p "$OUT/rows.d"; rm -f "$OUT"/rows.d/*
bg_step() {  # step in the background; its row lands in $OUT/rows.d
  local name=$1
  ( rows=(); step "$@"; printf '%s\n' "${rows[@]}" >"$OUT/rows.d/${name// /_}" ) &
}
collect_bg() { wait; for f in "$OUT"/rows.d/*; do [ -f "$f" ] && rows+=("$(cat "$f")"); done; rm -f "$OUT"/rows.d/*; }

# ---- 1. correctness + sanitizers (concurrent); SKIP_CHECK=1 skips it
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  for v in $VARIANTS; do
    bg_step "check $v" 240 "check_$v.log" "$X/fp8check_$v" --no-bench --seed 1
  done
  for v in $VARIANTS; do
    bg_step "check $v tight (tol8 0.005, info)" 240 "check_${v}_tight.log" "$X/fp8check_$v" --no-bench --seed 1 --tol8 0.005
  done
  if [ -x "$SAN" ]; then
    for v in $VARIANTS; do
      for tool in memcheck racecheck synccheck; do
        bg_step "$tool $v --small" 240 "${tool}_$v.log" "$SAN" --tool $tool --error-exitcode 3 "$X/fp8check_$v" --small --seed 3
      done
    done
  else
    rows+=("sanitizers | NO compute-sanitizer | - | -")
  fi
  collect_bg
fi

# ---- 2. benchmark, the variants alternated; SKIP_BENCH=1 skips it
[ "${SKIP_BENCH:-0}" = 1 ] && ROUNDS=0
for r in $(seq 1 "$ROUNDS"); do
  for v in $VARIANTS; do
    step "bench $v r$r" 150 "bench_${v}_r$r.log" "$X/fp8check_$v" --bench-only --bench-T "$BENCH_T" --bench-H "$BENCH_H" --seed 2
  done
done

# ---- summary
for f in check_fp8 check_ab check_ab2 check_fp8_tight check_ab_tight check_ab2_tight; do
  [ -f "$OUT/$f.log" ] && echo "==== $f: $(grep -cE '^  .* PASS' "$OUT/$f.log") PASS, $(grep -cE '^  .* FAIL' "$OUT/$f.log") FAIL; $(tail -1 "$OUT/$f.log")" \
    && grep -E "FAIL|bad rows" "$OUT/$f.log" | head -5
done
for v in $VARIANTS; do
  for tool in memcheck racecheck synccheck; do
    [ -f "$OUT/${tool}_$v.log" ] && echo "==== $tool $v --small: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/${tool}_$v.log" | tail -1)"
  done
done
echo "==== steps (logs in $OUT)"
printf 'step | status | time | log\n'
printf '%s\n' "${rows[@]}"
[ "$ROUNDS" -gt 0 ] || exit 0
echo "==== FP8 ms (quantize + select; min over rounds, ± spread), speed vs the bf16 fused kernel of the same runs (ab: and vs fp8); recall of the exact bf16 top K, mean / min row"
{ fp8_bench_results_py; cat <<'PY'
print("| H_I | T | bf16 ms | " + " | ".join("%s FP8 ms" % v for v in variants) + " | " +
      " | ".join("%s recall mean / min" % v for v in variants) + " |")
print("|" + "---|" * (3 + 2 * len(variants)))
for H, T in shapes:
    bf = min(x[0] for (vv, h, t), rs in res.items() if (h, t) == (H, T) for x in rs)
    base = res.get(("fp8", H, T))
    cells, rec = [], []
    for v in variants:
        rs = res.get((v, H, T))
        if not rs:
            cells.append("-"); rec.append("-"); continue
        f = min(x[1] for x in rs)
        spread = max(x[1] for x in rs) / f - 1
        vb = ", %.2fx fp8" % (min(x[1] for x in base) / f) if base and v != "fp8" else ""
        cells.append("%.3f (%.2fx bf16%s, ±%.0f%%)" % (f, bf / f, vb, 100 * spread))
        rec.append("%.5f / %.4f" % (min(x[3] for x in rs), min(x[4] for x in rs)))
    print("| %d | %dK | %.3f | %s | %s |" % (H, T // 1024, bf, " | ".join(cells), " | ".join(rec)))
print("(measured 2026-12-02, e0bc266 -DFLASHDSA_FP8_V2=1, same SASS: H_I 32: 1.818 / 14.725 / 138.240 ms at 8K / 32K / 128K;"
      " H_I 64: 2.434 / 19.664 / 205.441 ms; recall 1.00000 mean)")
PY
} | python3 - "$OUT" "$ROUNDS" $VARIANTS
