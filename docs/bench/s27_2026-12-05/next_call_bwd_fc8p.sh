#!/usr/bin/env bash
# Prepared on 2026-12-05 (twenty-seventh session; no device was lent that session), not yet run. Replaces call 6
# (docs/bench/s26_2026-12-05/next_call_bwd_fc8.sh, kept for reference) as the call after call 1
# (docs/bench/s22_2026-12-04/next_call_bwd5.sh): on top of call 1's winner W (main | eh | ks | ksh | rs; read from
# /tmp/bwd5/winner.txt while the machine is still warm, else pass WINNER=...), a 2 x 2 of two switches, alternated:
#   W        call 1's binary
#   fc8W     + -DFLASHDSA_BWD_FRONT_CHUNK8=1 (dKV chunk 8 computed and emitted by the front; twenty-sixth session)
#   p1W      + -DFLASHDSA_BWD_DQ_PRIORITY=1 (the front's dQ issued behind the back's dQ and dKV chunk 0; twenty-seventh)
#   fc8p1W   both
# (rs: W and p1rs only; FRONT_CHUNK8 does not apply to RS_DKV.)
# Binaries (build-x/bwd-fc8p/fc8p.tar.xz, SHA256SUMS, BUILT_FROM): the bases are call 1's (build-x/bwd5), the fc8 ones
# call 6's (build-x/bwd-fc8), the p1 ones built here from the twenty-seventh session's tree:
#   BUILD_ONLY=1 BIN=X AB_FLAGS="<W's flags> [-DFLASHDSA_BWD_FRONT_CHUNK8=1] -DFLASHDSA_BWD_DQ_PRIORITY=1" bash scripts/bwd_gpu.sh
# Device: run(command="WINNER=<W> bash docs/bench/s27_2026-12-05/next_call_bwd_fc8p.sh", carry=["build-x/bwd-fc8p"])
# Steps (guarded to ~575 s): the three new builds' cases concurrently (deterministic bitwise, the scale check; not
# timed); 2 alternated rounds x uniform / causal x 4K-32K of the variants whose cases passed; synccheck / memcheck /
# racecheck --small of fc8p1W (p1rs for rs: both new barriers' paths); 64K / 128K once each if time is left.
# Decision (printed last): a variant qualifies when its cases passed and it gains >= 2% over W at 8K and 16K on both
# index sets (means of the rounds) with no point of 4K-32K >= 2% slower; the qualifier with the largest mean gain wins,
# fc8p1W's sanitizers clean (they cover both switches' code), else W stays. Its flags go to /tmp/bwdfc8p/winner_flags,
# which call 4 reads when BWD_FLAGS is unset.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/bwdfc8p; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd-fc8p; OUT=${OUT:-/tmp}
W=${WINNER:-$(awk '/^winner:/ { print $2; exit }' /tmp/bwd5/winner.txt 2>/dev/null)}
case "$W" in main|eh|ks|ksh) NEW="fc8$W p1$W fc8p1$W"; SANV=fc8p1$W ;; rs) NEW="p1rs"; SANV=p1rs ;;
  *) echo "no usable winner ('$W'): pass WINNER=main|eh|ks|ksh|rs"; exit 2 ;; esac
declare -A FL=([main]="" [eh]="-DFLASHDSA_BWD_EMIT_HALF=1" [ks]="-DFLASHDSA_BWD_KV_SPLIT=1"
  [ksh]="-DFLASHDSA_BWD_EMIT_HALF=1 -DFLASHDSA_BWD_KV_SPLIT=1" [rs]="-DFLASHDSA_BWD_RS_DKV=2")
[ -x $B/bwd_$SANV ] || tar -xJf $B/fc8p.tar.xz -C $B || exit 2
(cd $B && sha256sum -c SHA256SUMS > "$L/sha256.txt" 2>&1) || { echo "binaries do not match SHA256SUMS"; exit 2; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
echo "base $W, variants $NEW" | tee "$L/which.txt"
s=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
clean() {  # the check program's cases passed, the deterministic runs were bitwise equal, the scale check passed
  grep -q "correctness: [0-9]* passed, 0 failed" "$1" && ! grep -q "RUNS DIFFER\|FAIL" "$1" && grep -qx "exit=0" "$1"
}
V="$W"
for v in $NEW; do
  ( timeout 200 $B/bwd_$v --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
wait; echo "correctness done $(el)"
for v in $NEW; do
  if clean "$L/${v}_correct.log"; then V="$V $v"; else echo "$v: correctness not clean, not timed"; fi
done
report() {
  tar -czf "$OUT/bwdfc8p_logs.tgz" -C "$L" .
  echo "==== summary"; cat "$L/gpu.txt" "$L/which.txt"
  for v in $NEW; do
    echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1)," \
      "$(grep -c "RUNS DIFFER\|FAIL" "$L/${v}_correct.log") lines with FAIL / RUNS DIFFER, $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"
  done
  grep -H "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
  echo "fast ms (r1 r2): T | idx | $(echo $V | sed 's/ / | /g')"
  for idx in uniform causal; do for T in 4096 8192 16384 32768; do
    row="$T | $idx |"
    for v in $V; do for r in 1 2; do
      row="$row $(awk -v T=$T -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); printf "%s", a[1]; exit }' "$L/${v}_${idx}_r$r.log" 2>/dev/null)"
    done; row="$row |"; done
    echo "$row"
  done; done
  for v in $V; do
    [ -f "$L/${v}_long.log" ] && echo "$v long: $(grep -hE "^ +(65536|131072) " "$L/${v}_long.log" | awk -F'|' '{ printf "%s:%s ", $1 + 0, $2 }')"
  done
  python3 - "$L" "$W" "$V" "${FL[$W]}" <<'PY'
import sys, statistics
L, W, V, wflags = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
def ms(v, idx, T):
    vals = []
    for r in (1, 2):
        try:
            for line in open(f"{L}/{v}_{idx}_r{r}.log"):
                f = line.split("|")
                if len(f) >= 5 and f[0].strip() == str(T):
                    vals.append(float(f[1].split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return statistics.mean(vals) if vals else None
pts = [(i, T) for i in ("uniform", "causal") for T in (4096, 8192, 16384, 32768)]
need = [(i, T) for i in ("uniform", "causal") for T in (8192, 16384)]
best, best_gain = W, 1.0
for v in V[1:]:
    r = {}
    for k in pts:
        a, b = ms(W, *k), ms(v, *k)
        if a and b:
            r[k] = a / b
    ok = len(r) == len(pts) and all(r[k] >= 1.02 for k in need) and all(x > 1 / 1.02 for x in r.values())
    mean = statistics.mean(r.values()) if r else 0.0
    print(f"{v} vs {W}: " + (" ".join(f"{i[0]}{T // 1024}K {x:.3f}" for (i, T), x in sorted(r.items())) or "no ratios")
          + f" | mean {mean:.3f} | " + ("qualifies" if ok else "does not qualify"))
    if ok and mean > best_gain:
        best, best_gain = v, mean
extra = {"fc8": "-DFLASHDSA_BWD_FRONT_CHUNK8=1", "p1": "-DFLASHDSA_BWD_DQ_PRIORITY=1"}
flags = wflags
if best != W:
    if best.startswith("fc8"):
        flags += " " + extra["fc8"]
    if "p1" in best:
        flags += " " + extra["p1"]
flags = flags.strip()
def clean(tool, needle):
    try:
        return needle in open(f"{L}/{tool}.log").read()
    except OSError:
        return False
san_ok = (clean("memcheck", "ERROR SUMMARY: 0 errors") and clean("synccheck", "ERROR SUMMARY: 0 errors")
          and clean("racecheck", "RACECHECK SUMMARY: 0 hazards"))
if best != W and not san_ok:
    print(f"winner by time: {best} (mean {W}/{best} {best_gain:.3f}), but the sanitizers of the new switches are not all"
          f" clean (or did not run): call 4 gets {W}'s flags")
    best, best_gain, flags = W, 1.0, wflags
open(f"{L}/winner_flags", "w").write(flags)
print(f"winner: {best} (mean gain {best_gain:.3f}); flags for call 4: BWD_FLAGS='{flags}' (in {L}/winner_flags)")
PY
}
for r in 1 2; do
  order="$V"; [ $r = 2 ] && order=$(echo $V | tr ' ' '\n' | tac | tr '\n' ' ')
  for idx in uniform causal; do
    for v in $order; do
      [ "$(left)" -lt 200 ] && { echo "round $r $v $idx skipped (time)"; continue; }
      timeout 50 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768 --bench-indices $idx > "$L/${v}_${idx}_r$r.log" 2>&1
      echo "$v $idx r$r rc=$? $(el)"
    done
  done
done
report > "$L/summary_early.txt" 2>&1  # the timings come back even if the rest is cut short
for t in synccheck memcheck racecheck; do
  l=$(left); [ "$l" -lt 40 ] && { echo "$t skipped (time)"; continue; }
  timeout $(( l < 140 ? l - 15 : 140 )) $SAN --tool $t $B/bwd_$SANV --small --no-bench > "$L/$t.log" 2>&1
  echo "$t rc=$? $(el)"
done
for v in $V; do
  [ "$(left)" -lt 45 ] && { echo "long $v skipped (time)"; continue; }
  timeout 40 $B/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/${v}_long.log" 2>&1; echo "$v long rc=$? $(el)"
done
report
