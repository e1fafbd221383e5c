# Shared step runners of the one-command GPU scripts (scripts/*_gpu.sh); source after `cd` to the
# repository root. Each runs CMD under `timeout`, its output to a log file.
#
#   budget_step NAME LIMIT LOG CMD...   the limit is cut to what is left of $BUDGET seconds since
#                                       $START (both set by the caller); with < 15 s left the step is
#                                       skipped (return 125, "SKIPPED (time budget)" in LOG); prints
#                                       "=== NAME" and the last $STEP_TAIL (default 40) lines of LOG.
#   row_step NAME LIMIT LOG CMD...      LOG is relative to $OUT; appends "NAME | status | seconds | LOG"
#                                       to the caller's array `rows` (status OK / TIMEOUT / FAIL (rc N)).
# Both return CMD's exit status (124: timeout).
#   sanitize_steps LABEL "TOOL:LIMIT ..." BINARY ARGS...
#                                       compute-sanitizer TOOL on BINARY ARGS through the caller's `step`
#                                       (its log $OUT/<LABEL with _ for spaces><TOOL>.log), one row
#                                       "LABEL TOOL ARGS|rc=..; <summary line>" per tool appended to the
#                                       caller's array `status`; without compute-sanitizer one row saying so.
#   bwd_check_summary LOG               "<passed/failed line>; worst dq rel_l2 X, dkv rel_l2 Y" of a
#                                       sparse_mla_bwd_check correctness log.
#   print_status WIDTH                  the caller's `status` rows ("step|result") as a two-column table.
# Tool paths (a caller's setting wins): NVCC, SAN (from COMPUTE_SANITIZER).

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
SAN=${SAN:-${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}}

budget_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local rest=$((BUDGET - ($(date +%s) - START)))
  [ "$rest" -lt "$limit" ] && limit=$rest
  if [ "$limit" -lt 15 ]; then echo "=== $name: SKIPPED (time budget)"; echo "SKIPPED (time budget)" > "$log"; return 125; fi
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s)"
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  tail -n "${STEP_TAIL:-40}" "$log"
  [ $rc -eq 124 ] && echo "  TIMEOUT after ${limit}s"
  return $rc
}

row_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0 rc status
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$log" 2>&1; rc=$?
  status=OK; [ $rc = 124 ] && status="TIMEOUT (${limit}s)"; [ $rc != 0 ] && [ $rc != 124 ] && status="FAIL (rc $rc)"
  rows+=("$name | $status | $(( $(date +%s) - t0 )) s | $log")
  return $rc
}

# build_variants CHECK_SRC KERNEL_SRC PREFIX [EXTRA_SRC...]
#   Builds a check program once per variant, all compiles in parallel: CHECK_SRC and each EXTRA_SRC
#   once, KERNEL_SRC once per variant with the flags ${vflags[variant]}, then links $BIN/PREFIX_<variant>.
#   Uses the caller's arrays `variants`, `vflags` (associative), `flags` and NVCC, BUILD_TIMEOUT, BIN,
#   OUT; logs: $OUT/build_check.log, build_common.log, build_<variant>.log. Returns 1 if any step failed.
build_variants() {
  local check=$1 kernel=$2 prefix=$3; shift 3
  local pids=() extra_objs=() src obj v rc=0 i=0
  timeout "$BUILD_TIMEOUT" "$NVCC" "${flags[@]}" -c -o "$BIN/check.o" "$check" > "$OUT/build_check.log" 2>&1 &
  pids+=($!)
  for src in "$@"; do
    obj="$BIN/extra_$i.o"; i=$((i + 1)); extra_objs+=("$obj")
    timeout "$BUILD_TIMEOUT" "$NVCC" "${flags[@]}" -c -o "$obj" "$src" >> "$OUT/build_common.log" 2>&1 &
    pids+=($!)
  done
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086
    timeout "$BUILD_TIMEOUT" "$NVCC" "${flags[@]}" ${vflags[$v]} -c -o "$BIN/${prefix}_$v.o" "$kernel" > "$OUT/build_$v.log" 2>&1 &
    pids+=($!)
  done
  for obj in "${pids[@]}"; do wait "$obj" || rc=1; done
  for v in "${variants[@]}"; do
    [ $rc -eq 0 ] && { "$NVCC" "${flags[@]}" -o "$BIN/${prefix}_$v" "$BIN/check.o" "$BIN/${prefix}_$v.o" "${extra_objs[@]}" \
      >> "$OUT/build_$v.log" 2>&1 || rc=1; }
  done
  return $rc
}

sanitize_steps() {
  local label=$1 tools=$2 bin=$3; shift 3
  local entry tool limit log rc
  if [ ! -x "$SAN" ]; then status+=("sanitizers|compute-sanitizer not found"); return 0; fi
  for entry in $tools; do
    tool=${entry%%:*}; limit=${entry#*:}; log="$OUT/${label// /_}$tool.log"
    step "$label$tool $*" "$limit" "$log" "$SAN" --tool "$tool" "$bin" "$@"; rc=$?
    status+=("$label$tool $1|rc=$rc; $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*\|RACECHECK SUMMARY: .*' "$log" | tail -1)")
  done
}

print_status() {
  local s
  printf "%-${1}s %s\n" "step" "result"
  for s in "${status[@]}"; do printf "%-${1}s %s\n" "${s%%|*}" "${s#*|}"; done
}

bwd_check_summary() {
  local passed worst
  passed=$(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$1" | tail -1)
  worst=$(awk '/dq rel_l2/ { for (i = 1; i <= NF; ++i) { if ($i == "dq" && $(i+1) == "rel_l2" && $(i+2) > dq) dq = $(i+2);
                                                         if ($i == "dkv" && $(i+1) == "rel_l2" && $(i+2) > dkv) dkv = $(i+2) } }
               END { printf "worst dq rel_l2 %s, dkv rel_l2 %s", dq, dkv }' "$1")
  echo "${passed:-no summary}; $worst"
}

# fp8_bench_results_py
#   Prints the head of a Python program (run it as `{ fp8_bench_results_py; cat <<'PY' ... PY
#   } | python3 - OUT ROUNDS VARIANT...`) that reads the FP8 check program's benchmark tables,
#   $OUT/bench_<variant>_r<round>.log, into `res`: (variant, H, T) -> a list over rounds of (bf16 ms,
#   FP8 ms quantize + select, select ms, recall mean, recall min); `shapes`: the sorted (H, T) seen;
#   also `out`, `rounds`, `variants` and the modules os, re, sys. The caller's part prints the table.
fp8_bench_results_py() {
  cat <<'PY'
import os, re, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
res = {}  # (variant, H, T) -> [(bf16, fp8 all, sel, recall mean, recall min)]
for v in variants:
    for r in range(1, rounds + 1):
        p = os.path.join(out, "bench_%s_r%d.log" % (v, r))
        if not os.path.exists(p):
            continue
        for line in open(p):
            m = re.match(r"\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)\s+([\d.]+)", line)
            if m:
                H, T = int(m.group(1)), int(m.group(2))
                res.setdefault((v, H, T), []).append(tuple(float(m.group(i)) for i in (3, 4, 5, 8, 9)))
shapes = sorted({(H, T) for (_, H, T) in res})
PY
}

# The prepared device calls' helpers (docs/bench/*/next_call_*.sh):
#   bg_sanitizers DIR BINARY ARGS...    memcheck / synccheck / racecheck (200 / 200 / 240 s) of BINARY ARGS in the
#                                       background, logs DIR/<tool>.log, exit status lines DIR/<tool>.rc; `wait` for them.
#   bench_col T FIELD LOG               the first number of bench column FIELD at row T of a check program's
#                                       benchmark table ("T | a | b | ..."; 2 = fast ms, 3 = det ms in the backward's).
bg_sanitizers() {
  local dir=$1 t; shift
  for t in memcheck:200 synccheck:200 racecheck:240; do
    ( timeout -k 5 "${t#*:}" "$SAN" --tool "${t%%:*}" "$@" > "$dir/${t%%:*}.log" 2>&1
      echo "${t%%:*} rc=$?" > "$dir/${t%%:*}.rc" ) &
  done
}
bench_col() {
  awk -v T="$1" -v F="$2" -F'|' '$1 + 0 == T && NF >= 5 { split($F, a, " "); printf "%s", a[1]; exit }' "$3" 2>/dev/null
}
#   call_step NAME MIN_LEFT LIMIT LOG CMD...  CMD under `timeout LIMIT` into LOG unless fewer than MIN_LEFT seconds
#                                       are left of the caller's $BUDGET since $s; prints "NAME rc=N T s" or
#                                       "NAME skipped (time)".
call_step() {
  local name=$1 min_left=$2 limit=$3 log=$4; shift 4
  if [ $((BUDGET - ($(date +%s) - s))) -lt "$min_left" ]; then echo "$name skipped (time)"; return 125; fi
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s )) s"
  return $rc
}
#   call_begin NAME DEFAULT_BUDGET       a prepared call's preamble: L=/tmp/NAME (emptied), OUT (default /tmp), the GPU's
#                                       name and clocks in $L/gpu.txt, s = the start, BUDGET (default DEFAULT_BUDGET), and
#                                       snap, which archives $L as $OUT/NAME_logs.tgz (after each phase: a cut-off call
#                                       keeps what it has).
call_begin() {
  L=/tmp/$1; rm -rf "$L"; mkdir -p "$L"; OUT=${OUT:-/tmp}
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt" 2>&1
  s=$(date +%s); BUDGET=${BUDGET:-$2}
  eval "snap() { tar -czf \"\$OUT/${1}_logs.tgz\" -C \"\$L\" . 2>/dev/null; }"
}
