#!/usr/bin/env bash
# FP8 (e4m3) selection pass on the v2 structure (csrc/sm90/indexer_topk/fp8_kernel_v2.cuh, issue 20):
# correctness, recall, sanitizers and the benchmark against the current FP8 kernel, on one H200.
# Three builds of tests/cuda/indexer_topk_fp8_check.cu (only indexer_topk_fp8.cu differs; the rest is
# linked from libflashdsa.a):
#   base   = main's FP8 kernel (fp8_kernel.cuh, default flags)
#   v2     = -DFLASHDSA_FP8_V2=1 (the v2 walk, bf16x2 epilogue; D_I = 64 cases run base)
#   v2f32  = -DFLASHDSA_FP8_V2=1 -DFLASHDSA_FP8_V2_PACKED=0 (the v2 walk, f32 epilogue)
#
#   BUILD_ONLY=1 bash scripts/fp8_v2_gpu.sh     (any machine with nvcc 13: builds the three binaries
#        against $LIB (default build/libflashdsa.a) and packs them into build-fp8v2/fp8v2_bins.tar.xz)
#   PREBUILT=1 bash scripts/fp8_v2_gpu.sh       (the H200: carry build-fp8v2; about 4-5 minutes;
#        SKIP_CHECK=1 or SKIP_BENCH=1 split it into two calls)
#   bash scripts/fp8_v2_gpu.sh                  (builds on the H200 first: needs build/libflashdsa.a)
#
# Steps (per-step timeouts; logs under ${OUT:-/tmp/flashdsa_fp8v2}; a table last):
#   1. correctness, concurrently: the check cases of v2 (--tol8 0.05: the packed epilogue's error
#      bound; again with 0.005, informational) and of v2f32 (default tolerance), memcheck / racecheck /
#      synccheck of v2 --small;
#   2. benchmark --bench-only --bench-T 8192,32768,131072 --bench-H 32,64: base and v2 alternated over
#      2 rounds, v2f32 once (round 1); each run also times the bf16 fused kernel;
#   3. the table: FP8 ms (quantize + select) per build and shape, speed vs bf16 and vs base, recall
#      of the exact bf16 top K (mean / min row), the issue-20 targets (32K <= 8.6 ms, 128K <= 101 ms).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashdsa_fp8v2}; mkdir -p "$OUT"
BIN=${BIN:-build-fp8v2}
LIB=${LIB:-build/libflashdsa.a}
NVCC=${NVCC:-nvcc}
ROUNDS=${ROUNDS:-2}
BENCH_T=${BENCH_T:-8192,32768,131072}
BENCH_H=${BENCH_H:-32,64}
TOL8_PACKED=${TOL8_PACKED:-0.05}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
VARIANTS="base v2 v2f32"
flags_of() {
  case $1 in
    base) echo "" ;;
    v2) echo "-DFLASHDSA_FP8_V2=1" ;;
    v2f32) echo "-DFLASHDSA_FP8_V2=1 -DFLASHDSA_FP8_V2_PACKED=0" ;;
  esac
}
NVFLAGS=(-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Iinclude -Icsrc)

# ---- build (skipped with PREBUILT=1)
if [ "${PREBUILT:-0}" != 1 ]; then
  [ -f "$LIB" ] || { echo "no $LIB: build the library first (cmake --build build --target flashdsa) or set LIB"; exit 2; }
  OBJ=${OBJ:-$(mktemp -d)}; mkdir -p "$BIN" "$OBJ/bin"
  echo "=== build ($(date -u +%H:%M:%S)): objects in $OBJ, binaries packed into $BIN/fp8v2_bins.tar.xz"
  pids=()
  timeout 600 "$NVCC" "${NVFLAGS[@]}" -Itests/cuda -c tests/cuda/indexer_topk_fp8_check.cu -o "$OBJ/check.o" \
    >"$OUT/build_check.log" 2>&1 & pids+=($!)
  for v in $VARIANTS; do
    # shellcheck disable=SC2046
    timeout 600 "$NVCC" "${NVFLAGS[@]}" -DFLASHDSA_WITH_CUDA=1 -Xptxas -v $(flags_of $v) -c \
      csrc/sm90/indexer_topk/indexer_topk_fp8.cu -o "$OBJ/fp8_$v.o" >"$OUT/build_$v.log" 2>&1 & pids+=($!)
    [ -n "${JOBS1:-}" ] && wait "${pids[-1]}"
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || { echo "build failed: see $OUT/build_*.log"; tail -20 "$OUT"/build_*.log; exit 2; }
  for v in $VARIANTS; do
    "$NVCC" -gencode=arch=compute_90a,code=sm_90a "$OBJ/check.o" "$OBJ/fp8_$v.o" "$LIB" -lpthread \
      -o "$OBJ/bin/fp8check_$v" >>"$OUT/build_$v.log" 2>&1 || { echo "link $v failed"; exit 2; }
  done
  echo "ptxas (v2 / v2f32 kernels: registers, spills; wgmma serialisation warnings):"
  for v in v2 v2f32; do
    grep -A2 "fp8_v2_kernel" "$OUT/build_$v.log" | grep -E "spill|Used" | sed 's/ptxas info *: //' | paste - - | sed "s/^/  $v: /"
    grep -E "C751[0-9]|C752[0-9]|serializ" "$OUT/build_$v.log" && echo "  $v: WGMMA SERIALISATION WARNING"
  done
  tar -cJf "$BIN/fp8v2_bins.tar.xz" -C "$OBJ/bin" . && ls -l "$BIN/fp8v2_bins.tar.xz"
  [ "${BUILD_ONLY:-0}" = 1 ] && exit 0
fi
X=$BIN/x
if [ ! -x "$X/fp8check_v2" ]; then
  mkdir -p "$X" && tar -xJf "$BIN/fp8v2_bins.tar.xz" -C "$X" || { echo "cannot unpack $BIN/fp8v2_bins.tar.xz"; exit 2; }
fi

rows=()
source scripts/lib/gpu_steps.sh
step() { row_step "$@"; }
mkdir -p "$OUT/rows.d"; rm -f "$OUT"/rows.d/*
bg_step() {
  local name=$1
  ( rows=(); step "$@"; printf '%s\n' "${rows[@]}" >"$OUT/rows.d/${name// /_}" ) &
}
collect_bg() { wait; for f in "$OUT"/rows.d/*; do [ -f "$f" ] && rows+=("$(cat "$f")"); done; rm -f "$OUT"/rows.d/*; }

# ---- 1. correctness + sanitizers (concurrent: nothing is timed here); SKIP_CHECK=1 skips it
if [ "${SKIP_CHECK:-0}" != 1 ]; then
bg_step "check v2" 240 check_v2.log "$X/fp8check_v2" --no-bench --seed 1 --tol8 "$TOL8_PACKED"
bg_step "check v2f32" 240 check_v2f32.log "$X/fp8check_v2f32" --no-bench --seed 1
# Informational: the packed build against a realistic tolerance (0.005 of the row bound: 5x the largest
# packed-vs-f32 difference seen in emulation). A FAIL here with a PASS above is a boundary case of the
# bf16 rounding, not a bug; in the CPU emulation a wrong weight layout or key scale fails here only.
bg_step "check v2 tight (tol8 0.005, info)" 240 check_v2_tight.log "$X/fp8check_v2" --no-bench --seed 1 --tol8 0.005
if [ -x "$SAN" ]; then
  for tool in memcheck racecheck synccheck; do
    bg_step "$tool v2 --small" 240 "${tool}_v2.log" "$SAN" --tool $tool --error-exitcode 3 "$X/fp8check_v2" --small \
      --seed 3 --tol8 "$TOL8_PACKED"
  done
else
  rows+=("sanitizers | NO compute-sanitizer | - | -")
fi
collect_bg
fi

# ---- 2. benchmark, base and v2 alternated; SKIP_BENCH=1 skips it
[ "${SKIP_BENCH:-0}" = 1 ] && ROUNDS=0
for r in $(seq 1 "$ROUNDS"); do
  vs="base v2"; [ "$r" = 1 ] && vs="base v2 v2f32"
  for v in $vs; do
    step "bench $v r$r" 150 "bench_${v}_r$r.log" "$X/fp8check_$v" --bench-only --bench-T "$BENCH_T" \
      --bench-H "$BENCH_H" --seed 2
  done
done

# ---- summary
for v in v2 v2f32 v2_tight; do
  [ -f "$OUT/check_$v.log" ] && echo "==== check $v: $(grep -cE ' PASS' "$OUT/check_$v.log") PASS, $(grep -cE ' FAIL' "$OUT/check_$v.log") FAIL; $(tail -1 "$OUT/check_$v.log")" \
    && grep -E "FAIL" "$OUT/check_$v.log" | head -5
done
for tool in memcheck racecheck synccheck; do
  [ -f "$OUT/${tool}_v2.log" ] && echo "==== $tool v2 --small: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/${tool}_v2.log" | tail -1)"
done
echo "==== steps (logs in $OUT)"
printf 'step | status | time | log\n'
printf '%s\n' "${rows[@]}"
echo "==== FP8 ms (quantize + select; min over rounds), speed vs the bf16 fused kernel of the same runs and vs base; recall mean / min row"
{ fp8_bench_results_py; cat <<'PY'
target = {32768: 8.6, 131072: 101.0}
print("| H_I | T | bf16 ms | " + " | ".join("%s FP8 ms (x bf16, x base)" % v for v in variants) + " | " +
      " | ".join("%s recall mean / min" % v for v in variants) + " | issue-20 target (v2) |")
print("|" + "---|" * (3 + 2 * len(variants) + 1))
for H, T in shapes:
    bf = min(x[0] for (vv, h, t), rs in res.items() if (h, t) == (H, T) for x in rs)
    base = res.get(("base", H, T))
    cells, rec = [], []
    for v in variants:
        rs = res.get((v, H, T))
        if not rs:
            cells.append("-"); rec.append("-"); continue
        f = min(x[1] for x in rs)
        spread = max(x[1] for x in rs) / f - 1
        vb = " %.2fx" % (min(x[1] for x in base) / f) if base and v != "base" else ""
        cells.append("%.3f (%.2fx%s, ±%.0f%%)" % (f, bf / f, vb, 100 * spread))
        rec.append("%.5f / %.4f" % (min(x[3] for x in rs), min(x[4] for x in rs)))
    tg = "-"
    if H == 32 and T in target and ("v2", H, T) in res:
        f = min(x[1] for x in res[("v2", H, T)])
        tg = "%s (<= %.1f)" % ("MET" if f <= target[T] else "missed", target[T])
    print("| %d | %dK | %.3f | %s | %s | %s |" % (H, T // 1024, bf, " | ".join(cells), " | ".join(rec), tg))
print("(targets: issue 20's FP8 goal at H_I = 32: 1.3x TileLang's FP8 logits + top-k at 32K, 1.3x its logits alone at 128K)")
PY
} | python3 - "$OUT" "$ROUNDS" $VARIANTS
