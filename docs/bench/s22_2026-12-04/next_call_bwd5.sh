#!/usr/bin/env bash
# Prepared on 2026-12-04 (twenty-second session; no device was lent that session), not yet run. Replaces
# docs/bench/s20_2026-12-04/next_call_rs.sh as the first device call of the next session: the sparse MLA backward's
# fast mode, five builds alternated in one call, plus the red-rate micro-benchmark with the half-line patterns
# (docs/perf-notes.md, twenty-second session: where the warps wait, from the 8K ncu report of the twentieth).
#   main  the default build (SASS identical to the kernel measured against cuDNN)
#   rs    -DFLASHDSA_BWD_RS_DKV=2 (dKV A operands as register fragments, tiles freed after the back's dQ)
#   eh    -DFLASHDSA_BWD_EMIT_HALF=1 (dkv emitted without the quad-pair exchange: 8 half lines per red.v4.f32)
#   ks    -DFLASHDSA_BWD_KV_SPLIT=1 (the kv gather in three parts; S starts on the first)
#   ksh   both eh and ks
# Binaries built here (packed in build-x/bwd5/bwd5.tar.xz): main, eh, ks, ksh from
#   BUILD_ONLY=1 BIN=build-x/bwd-X AB_FLAGS="-D..." bash scripts/bwd_gpu.sh   (bwd_main / bwd_ab of each folder)
# rs = build-x/bwd-rs's bwd_ab (main kernels SASS-identical to the tree's RS_DKV=2 build), red_rate =
#   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/micro/red_rate.cu
# Device: run(command="bash docs/bench/s22_2026-12-04/next_call_bwd5.sh", carry=["build-x/bwd5"])
# Steps (guarded to ~575 s): red_rate (all patterns; one warpgroup on 132 / 66 / 33 SMs); the 38 correctness cases
# of the four variants, concurrently (not timed); main / rs / eh / ks / ksh alternated, 2 rounds, fast mode, uniform
# and causal rows, 4K-32K; 64K and 128K once; ncu --set full of ksh at 8K (the report comes back: read it on the CPU
# machine with scripts/ncu_source_stalls.py --roles); memcheck / synccheck / racecheck of ksh --small if time is left.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/bwd5; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd5; OUT=${OUT:-/tmp}
V="main rs eh ks ksh"
[ -x $B/bwd_ksh ] || tar -xJf $B/bwd5.tar.xz -C $B || exit 2
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
s=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
timeout 60 $B/red_rate > "$L/red_rate.log" 2>&1; echo "red_rate rc=$? $(el)"
for n in 132 66 33; do
  timeout 40 $B/red_rate --ctas $n --threads 128 > "$L/red_rate_wg$n.log" 2>&1; echo "red_rate wg$n rc=$? $(el)"
done
for v in rs eh ks ksh; do
  ( timeout 200 $B/bwd_$v --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
wait; echo "correctness done $(el)"
# a variant whose cases fail (or hang) is not timed: its rounds would only cost device time. The exit status counts
# too: the scale check (many blocks per row, fast vs deterministic over the sweep) runs after the "correctness:" line
# (review of 2026-12-05).
for v in rs eh ks ksh; do
  if ! grep -q "correctness: [0-9]* passed, 0 failed" "$L/${v}_correct.log" || grep -q "RUNS DIFFER\|FAIL" "$L/${v}_correct.log" \
     || ! grep -qx "exit=0" "$L/${v}_correct.log"; then
    echo "$v: correctness not clean, dropped from the timing"; V=$(echo " $V " | sed "s/ $v / /; s/^ //; s/ $//")
  fi
done
for r in 1 2; do
  order="$V"; [ $r = 2 ] && order=$(echo $V | tr ' ' '\n' | tac | tr '\n' ' ')
  for idx in uniform causal; do
    for v in $order; do
      [ "$(left)" -lt 190 ] && { echo "round $r $v $idx skipped (time)"; continue; }
      timeout 50 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768 --bench-indices $idx \
        > "$L/${v}_${idx}_r$r.log" 2>&1
      echo "$v $idx r$r rc=$? $(el)"
    done
  done
done
for v in $V; do
  [ "$(left)" -lt 140 ] && { echo "long $v skipped (time)"; continue; }
  timeout 40 $B/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/${v}_long.log" 2>&1; echo "$v long rc=$? $(el)"
done
tar -czf "$OUT/bwd5_logs.tgz" -C "$L" .  # the timings come back even if the rest is cut short
if [ "$(left)" -gt 110 ] && [[ " $V " == *" ksh "* ]]; then
  timeout 100 $NCU --set full -k regex:sparse_mla_bwd_main -s 2 -c 1 -o "$L/ksh8192" $B/bwd_ksh --bench-only --fast-only \
    --T 8192 > "$L/ncu_ksh.log" 2>&1
  echo "ncu ksh rc=$? $(el)"
fi
for t in memcheck synccheck racecheck; do
  l=$(left); [ "$l" -lt 40 ] && { echo "$t skipped (time)"; continue; }
  timeout $(( l < 150 ? l - 15 : 150 )) $SAN --tool $t $B/bwd_ksh --small --no-bench > "$L/$t.log" 2>&1
  echo "$t rc=$? $(el)"
done
tar -czf "$OUT/bwd5_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
for f in red_rate red_rate_wg132 red_rate_wg66 red_rate_wg33; do
  echo "$f:"; grep -E "v4.f32|bulk|u64" "$L/$f.log" 2>/dev/null
done
for v in rs eh ks ksh; do
  echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1)," \
    "$(grep -c "RUNS DIFFER\|FAIL" "$L/${v}_correct.log") lines with FAIL / RUNS DIFFER, $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"
done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
echo "fast ms (r1 r2): T | idx | main | rs | eh | ks | ksh"
for idx in uniform causal; do for T in 4096 8192 16384 32768; do
  row="$T | $idx |"
  for v in $V; do for r in 1 2; do
    row="$row $(awk -v T=$T -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); printf "%s", a[1]; exit }' "$L/${v}_${idx}_r$r.log")"
  done; row="$row |"; done
  echo "$row"
done; done
for v in $V; do echo "$v long: $(grep -hE "^ +(65536|131072) " "$L/${v}_long.log" | awk -F'|' '{ printf "%s:%s ", $1 + 0, $2 }')"; done
# (twenty-third session) The decision rule of the 22nd session's perf-notes entry, applied here so that the peers call
# (docs/bench/s21_2026-12-04/next_call_rs_peers.sh) can follow in the same warm session: a variant qualifies when its
# cases passed, it gains >= 3% at 8K and 16K on both index sets (means of the rounds) and no point of 4K-32K is >= 2%
# slower (all 8 points measured); the qualifier with the largest mean gain wins. Its -D flags go to /tmp/bwd5/winner_flags ("" = keep main);
# /tmp survives back-to-back calls while the machine stays warm. (Sanitizers of a winner other than ksh: before the flip.)
python3 - "$L" "$V" > "$L/winner.txt" <<'PY'
import re, sys, statistics
L, V = sys.argv[1], sys.argv[2].split()
flags = {"rs": "-DFLASHDSA_BWD_RS_DKV=2", "eh": "-DFLASHDSA_BWD_EMIT_HALF=1", "ks": "-DFLASHDSA_BWD_KV_SPLIT=1",
         "ksh": "-DFLASHDSA_BWD_EMIT_HALF=1 -DFLASHDSA_BWD_KV_SPLIT=1"}
def ms(v, idx, T):
    # (twenty-seventh session's review) the mean of both rounds, None unless both exist: round 2 runs in the reverse
    # order, so a ratio from one round alone would keep the position bias the alternation is there to cancel
    vals = []
    for r in (1, 2):
        try:
            for line in open(f"{L}/{v}_{idx}_r{r}.log"):
                f = line.split("|")
                if len(f) >= 5 and f[0].strip() == str(T):
                    vals.append(float(f[1].split()[0]))
                    break
        except (OSError, ValueError, IndexError):
            pass
    return statistics.mean(vals) if len(vals) == 2 else None
best, best_gain = "main", 0.0
for v in V:
    if v == "main":
        continue
    ratios = {}
    for idx in ("uniform", "causal"):
        for T in (4096, 8192, 16384, 32768):
            a, b = ms("main", idx, T), ms(v, idx, T)
            if a and b:
                ratios[(idx, T)] = a / b
    need = [(i, T) for i in ("uniform", "causal") for T in (8192, 16384)]
    ok = all(k in ratios and ratios[k] >= 1.03 for k in need) and all(r > 1 / 1.02 for r in ratios.values()) and len(ratios) == 8
    gain = statistics.mean(ratios.values()) if ratios else 0.0
    print(f"{v}: " + " ".join(f"{i[0]}{T // 1024}K {r:.3f}" for (i, T), r in sorted(ratios.items())) +
          (" qualifies" if ok else ""))
    if ok and gain > best_gain:
        best, best_gain = v, gain
print(f"winner: {best} (mean main/variant {best_gain:.3f})" if best != "main" else "winner: main (no variant qualifies)")
open(f"{L}/winner_flags", "w").write(flags.get(best, ""))
PY
cat "$L/winner.txt"; echo "winner flags: '$(cat "$L/winner_flags" 2>/dev/null)' (in $L/winner_flags)"
