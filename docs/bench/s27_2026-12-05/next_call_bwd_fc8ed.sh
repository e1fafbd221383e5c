#!/usr/bin/env bash
# Prepared on 2026-12-05 (twenty-seventh session; no device was lent that session), not yet run. Call 6 (replaces the
# twenty-sixth session's docs/bench/s26_2026-12-05/next_call_bwd_fc8.sh, in git history): after call 1
# (docs/bench/s22_2026-12-04/next_call_bwd5.sh), on top of its winner W (main | eh | ks | ksh; read from
# /tmp/bwd5/winner.txt while the machine is still warm, else pass WINNER=...; rs: neither switch applies), a 2 x 2 of
# two switches, alternated, plus W's compute-path floor:
#   W        call 1's binary
#   fc8W     + -DFLASHDSA_BWD_FRONT_CHUNK8=1 (dKV chunk 8 computed and emitted by the front; twenty-sixth session)
#   edW      + -DFLASHDSA_BWD_EARLY_DQ=1 (the back issues the next block's dQ inside its last chunk's emission;
#            twenty-seventh session)
#   fc8edW   both
#   ndW      W without dkv writes (-DFLASHDSA_BWD_NO_DKV=1, the dKV MMAs kept; round 1 only, timing only, wrong dkv);
#            EMIT_HALF changes only the emission, so eh / ksh use main's / ks's (ndmain / ndks)
# Binaries (build-x/bwd-fc8ed/fc8ed.tar.xz, SHA256SUMS, BUILT_FROM): the bases are call 1's (build-x/bwd5), the fc8 ones
# built in the twenty-sixth session, the rest in the twenty-seventh:
#   BUILD_ONLY=1 BIN=X AB_FLAGS="<W's flags> [-DFLASHDSA_BWD_FRONT_CHUNK8=1] [-DFLASHDSA_BWD_EARLY_DQ=1]" bash scripts/bwd_gpu.sh
# Device: run(command="WINNER=<W> bash docs/bench/s27_2026-12-05/next_call_bwd_fc8ed.sh", carry=["build-x/bwd-fc8ed"])
# Steps (guarded to ~575 s): everything untimed first and concurrently — the three new builds' cases and synccheck /
# memcheck / racecheck of fc8edW (its sanitizers cover both switches' code; no duration of them is on record); then 2
# alternated rounds x uniform / causal x 4K-32K of the variants whose cases passed (round 1 also ndW); 64K / 128K once
# each if time is left. Decision (printed last): a variant qualifies when its cases passed and it gains >= 2% over W at
# 8K and 16K on both index sets (means of both rounds; a point without both rounds disqualifies) with no point of
# 4K-32K >= 2% slower; the qualifier with the largest mean gain wins if fc8edW passed its cases and its three sanitizers
# exited 0 with clean summaries (else W stays: run them with longer timeouts first, docs/bench/NEXT_CALLS.md).
# Its flags go to /tmp/bwdfc8ed/winner_flags, which call 4 reads when BWD_FLAGS is unset.
set -uo pipefail
s=$(date +%s)
cd "$(dirname "$0")/../../.."
L=/tmp/bwdfc8ed; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd-fc8ed; OUT=${OUT:-/tmp}
W=${WINNER:-$(awk '/^winner:/ { print $2; exit }' /tmp/bwd5/winner.txt 2>/dev/null)}
case "$W" in main|eh|ks|ksh) ;; *) echo "no usable winner ('$W'): pass WINNER=main|eh|ks|ksh (rs: the switches do not apply)"; exit 2 ;; esac
NEW="fc8$W ed$W fc8ed$W"; SANV=fc8ed$W
case "$W" in main|eh) ND=ndmain ;; *) ND=ndks ;; esac
declare -A FL=([main]="" [eh]="-DFLASHDSA_BWD_EMIT_HALF=1" [ks]="-DFLASHDSA_BWD_KV_SPLIT=1"
  [ksh]="-DFLASHDSA_BWD_EMIT_HALF=1 -DFLASHDSA_BWD_KV_SPLIT=1")
[ -x $B/bwd_$SANV ] && [ -x $B/bwd_$ND ] || tar -xJf $B/fc8ed.tar.xz -C $B || exit 2
(cd $B && sha256sum -c SHA256SUMS > "$L/sha256.txt" 2>&1) || { echo "binaries do not match SHA256SUMS"; exit 2; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
echo "base $W, variants $NEW, floor $ND" | tee "$L/which.txt"
left() { echo $(( 575 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
clean() {  # the check program's cases passed, the deterministic runs were bitwise equal, the scale check passed
  grep -q "correctness: [0-9]* passed, 0 failed" "$1" && ! grep -q "RUNS DIFFER\|FAIL" "$1" && grep -qx "exit=0" "$1"
}
for v in $NEW; do
  ( timeout -k 5 200 $B/bwd_$v --no-bench > "$L/${v}_correct.log" 2>&1; echo "exit=$?" >> "$L/${v}_correct.log" ) &
done
for t in synccheck:200 memcheck:200 racecheck:240; do
  ( timeout -k 5 ${t#*:} $SAN --tool ${t%%:*} $B/bwd_$SANV --small --no-bench > "$L/${t%%:*}.log" 2>&1
    echo "$?" > "$L/${t%%:*}.rc" ) &
done
wait; echo "correctness + sanitizers done $(el)"
V="$W"
for v in $NEW; do
  if clean "$L/${v}_correct.log"; then V="$V $v"; else echo "$v: correctness not clean, not timed"; fi
done
report() {
  tar -czf "$OUT/bwdfc8ed_logs.tgz" -C "$L" .
  echo "==== summary"; cat "$L/gpu.txt" "$L/which.txt"
  for v in $NEW; do
    echo "$v: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/${v}_correct.log" | tail -1)," \
      "$(grep -c "RUNS DIFFER\|FAIL" "$L/${v}_correct.log") lines with FAIL / RUNS DIFFER, $(grep -x "exit=[0-9]*" "$L/${v}_correct.log")"
  done
  grep -H "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
  for t in synccheck memcheck racecheck; do echo "$t exit: $(cat "$L/$t.rc" 2>/dev/null || echo none)"; done
  echo "fast ms (r1 r2): T | idx | $(echo $V | sed 's/ / | /g') | $ND (r1)"
  for idx in uniform causal; do for T in 4096 8192 16384 32768; do
    row="$T | $idx |"
    for v in $V $ND; do for r in 1 2; do
      [ $v = $ND ] && [ $r = 2 ] && continue
      row="$row $(awk -v T=$T -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); printf "%s", a[1]; exit }' "$L/${v}_${idx}_r$r.log" 2>/dev/null)"
    done; row="$row |"; done
    echo "$row"
  done; done
  for v in $V; do
    [ -f "$L/${v}_long.log" ] && echo "$v long: $(grep -hE "^ +(65536|131072) " "$L/${v}_long.log" | awk -F'|' '{ printf "%s:%s ", $1 + 0, $2 }')"
  done
  python3 - "$L" "$W" "$V" "${FL[$W]}" "$ND" "$SANV" <<'PY'
import sys, statistics
L, W, V, wflags, ND, SANV = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
def vals(v, idx, T, rounds):
    out = {}
    for r in rounds:
        try:
            for line in open(f"{L}/{v}_{idx}_r{r}.log"):
                f = line.split("|")
                if len(f) >= 5 and f[0].strip() == str(T):
                    out[r] = float(f[1].split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out
def pair(a, b, idx, T, rounds=(1, 2)):  # means over the rounds; None unless both sides have every one of them
    x, y = vals(a, idx, T, rounds), vals(b, idx, T, rounds)
    if len(x) < len(rounds) or len(y) < len(rounds):
        return None, None
    return statistics.mean(x.values()), statistics.mean(y.values())
pts = [(i, T) for i in ("uniform", "causal") for T in (4096, 8192, 16384, 32768)]
need = [(i, T) for i in ("uniform", "causal") for T in (8192, 16384)]
share = []
for i, T in pts:
    a, b = pair(W, ND, i, T, rounds=(1,))
    if a and b:
        share.append(f"{i[0]}{T // 1024}K {1 - b / a:.2f}")
print(f"time the dkv emission adds to {W} (1 - {ND} / {W}, round 1): " + (" ".join(share) or "n/a"))
best, best_gain = W, 1.0
for v in V[1:]:
    r = {}
    for k in pts:
        a, b = pair(W, v, *k)
        if a and b:
            r[k] = a / b
    ok = len(r) == len(pts) and all(r[k] >= 1.02 for k in need) and all(x > 1 / 1.02 for x in r.values())
    mean = statistics.mean(r.values()) if r else 0.0
    print(f"{v} vs {W}: " + (" ".join(f"{i[0]}{T // 1024}K {x:.3f}" for (i, T), x in sorted(r.items())) or "no ratios")
          + f" | mean {mean:.3f} | " + ("qualifies" if ok else "does not qualify"))
    if ok and mean > best_gain:
        best, best_gain = v, mean
flags = wflags
if best != W:
    if best.startswith("fc8"):
        flags += " -DFLASHDSA_BWD_FRONT_CHUNK8=1"
    if "ed" in best:
        flags += " -DFLASHDSA_BWD_EARLY_DQ=1"
flags = flags.strip()
def has(tool, needle):
    try:
        return open(f"{L}/{tool}.rc").read().strip() == "0" and needle in open(f"{L}/{tool}.log").read()
    except OSError:
        return False
san_ok = (SANV in V and has("memcheck", "ERROR SUMMARY: 0 errors") and has("synccheck", "ERROR SUMMARY: 0 errors")
          and has("racecheck", "RACECHECK SUMMARY: 0 hazards"))
if best != W and not san_ok:
    print(f"winner by time: {best} (mean {W}/{best} {best_gain:.3f}), but the sanitizers of the new switches are not all"
          f" clean (or did not run): call 4 gets {W}'s flags until they are")
    best, best_gain, flags = W, 1.0, wflags
open(f"{L}/winner_flags", "w").write(flags)
print(f"winner: {best} (mean gain {best_gain:.3f}); flags for call 4: BWD_FLAGS='{flags}' (in {L}/winner_flags)")
PY
}
for r in 1 2; do
  order="$V $ND"; [ $r = 2 ] && order=$(echo $V | tr ' ' '\n' | tac | tr '\n' ' ')
  for idx in uniform causal; do
    for v in $order; do
      [ "$(left)" -lt 90 ] && { echo "round $r $v $idx skipped (time)"; continue; }
      timeout -k 5 50 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768 --bench-indices $idx > "$L/${v}_${idx}_r$r.log" 2>&1
      echo "$v $idx r$r rc=$? $(el)"
    done
  done
done
report > "$L/summary_early.txt" 2>&1  # the timings come back even if the rest is cut short
for v in $V; do
  [ "$(left)" -lt 45 ] && { echo "long $v skipped (time)"; continue; }
  timeout -k 5 40 $B/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/${v}_long.log" 2>&1; echo "$v long rc=$? $(el)"
done
report
