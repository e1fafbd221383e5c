#!/usr/bin/env bash
# Prepared on 2026-12-05 (twenty-sixth session; no device was lent that session), not yet run. After call 1
# (docs/bench/s22_2026-12-04/next_call_bwd5.sh), on top of its winner W (main | eh | ks | ksh; read from
# /tmp/bwd5/winner.txt while the machine is still warm, else pass WINNER=...): dKV chunk 8 computed and emitted by the
# front instead of the back (-DFLASHDSA_BWD_FRONT_CHUNK8=1: its fast instance runs with front 248 / producer 32 / back 224 registers; docs/perf-notes.md,
# twenty-sixth session), W against W + fc8 alternated. Not with rs (RS_DKV: the front uses the SS form).
# Binaries (build-x/bwd-fc8/fc8.tar.xz, SHA256SUMS, BUILT_FROM): bwd_{main,eh,ks,ksh} = call 1's (copied from
# build-x/bwd5), bwd_fc8{main,eh,ks,ksh} = the same with the switch, built here:
#   BUILD_ONLY=1 BIN=X AB_FLAGS="<W's flags> -DFLASHDSA_BWD_FRONT_CHUNK8=1" bash scripts/bwd_gpu.sh
# Device: run(command="WINNER=<W> bash docs/bench/s26_2026-12-05/next_call_bwd_fc8.sh", carry=["build-x/bwd-fc8"])
# Steps (guarded to ~570 s): the fc8 build's cases (deterministic bitwise, the scale check), 2 alternated rounds
# x uniform / causal x 4K-32K (round 1 also times ND, W without dkv writes: the compute-path floor; twenty-seventh
# session), synccheck / memcheck / racecheck --small, 64K / 128K once. Decision: fc8 joins the
# default if its cases pass, the sanitizers are clean and it gains >= 2% at 8K and 16K on both index sets with no point
# of 4K-32K >= 2% slower (the rule printed last).
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/bwdfc8; rm -rf "$L"; mkdir -p "$L"; B=build-x/bwd-fc8; OUT=${OUT:-/tmp}
W=${WINNER:-$(awk '/^winner:/ { print $2; exit }' /tmp/bwd5/winner.txt 2>/dev/null)}
case "$W" in main|eh|ks|ksh) ;; *) echo "no usable winner ('$W'): pass WINNER=main|eh|ks|ksh (rs: fc8 does not apply)"; exit 2;; esac
F=fc8$W
# (twenty-seventh session) ND: W's compute-path floor, timing only (-DFLASHDSA_BWD_NO_DKV=1: no dkv writes, wrong dkv;
# the dKV MMAs kept alive since that session). EMIT_HALF changes only the emission, so eh / ksh share main's / ks's.
case "$W" in main|eh) ND=ndmain ;; *) ND=ndks ;; esac
[ -x $B/bwd_$F ] && [ -x $B/bwd_$ND ] || tar -xJf $B/fc8.tar.xz -C $B || exit 2
(cd $B && sha256sum -c SHA256SUMS > "$L/sha256.txt" 2>&1) || { echo "binaries do not match SHA256SUMS"; exit 2; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
echo "base $W, variant $F" | tee "$L/which.txt"
s=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - s) )); }
el() { echo "$(( $(date +%s) - s )) s"; }
report() {
tar -czf "$OUT/bwdfc8_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt" "$L/which.txt"
echo "$F: $(grep -o "correctness: [0-9]* passed, [0-9]* failed" "$L/correct.log" | tail -1)," \
  "$(grep -c "RUNS DIFFER\|FAIL" "$L/correct.log") lines with FAIL / RUNS DIFFER, $(grep -x "exit=[0-9]*" "$L/correct.log")"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$L"/memcheck.log "$L"/synccheck.log "$L"/racecheck.log 2>/dev/null
echo "fast ms (r1 r2): T | idx | $W | $F"
for idx in uniform causal; do for T in 4096 8192 16384 32768; do
  row="$T | $idx |"
  for v in $W $F; do for r in 1 2; do
    row="$row $(awk -v T=$T -F'|' '$1 + 0 == T && NF >= 5 { split($2, a, " "); printf "%s", a[1]; exit }' "$L/${v}_${idx}_r$r.log" 2>/dev/null)"
  done; row="$row |"; done
  echo "$row"
done; done
echo "$ND (no dkv writes, round 1 only): $(for idx in uniform causal; do awk -v i=$idx -F'|' '$1 + 0 >= 4096 && NF >= 5 { split($2, a, " "); printf "%s %d:%s ", substr(i, 1, 1), $1 / 1024, a[1] }' "$L/${ND}_${idx}_r1.log" 2>/dev/null; done)"
for v in $W $F; do echo "$v long: $(grep -hE "^ +(65536|131072) " "$L/${v}_long.log" 2>/dev/null | awk -F'|' '{ printf "%s:%s ", $1 + 0, $2 }')"; done
python3 - "$L" "$W" "$F" "$ND" <<'PY'
import sys, statistics
L, W, F = sys.argv[1:4]
def ms(v, idx, T):
    vals = []
    for r in (1, 2):
        try:
            for line in open(f"{L}/{v}_{idx}_r{r}.log"):
                f = line.split("|")
                if len(f) >= 5 and f[0].strip() == str(T):
                    vals.append(float(f[1].split()[0]))
        except OSError:
            pass
    return statistics.mean(vals) if vals else None
nd = sys.argv[4] if len(sys.argv) > 4 else None
if nd:
    share = []
    for idx in ("uniform", "causal"):
        for T in (4096, 8192, 16384, 32768):
            a = ms(W, idx, T)
            try:
                b = [float(l.split("|")[1].split()[0]) for l in open(f"{L}/{nd}_{idx}_r1.log")
                     if len(l.split("|")) >= 5 and l.split("|")[0].strip() == str(T)]
            except (OSError, ValueError, IndexError):
                b = []
            if a and b:
                share.append(f"{idx[0]}{T // 1024}K {1 - b[0] / a:.2f}")
    print("time the dkv emission adds to W (1 - ND / W): " + (" ".join(share) or "n/a"))
ratios = {}
for idx in ("uniform", "causal"):
    for T in (4096, 8192, 16384, 32768):
        a, b = ms(W, idx, T), ms(F, idx, T)
        if a and b:
            ratios[(idx, T)] = a / b
need = [(i, T) for i in ("uniform", "causal") for T in (8192, 16384)]
ok = len(ratios) == 8 and all(ratios[k] >= 1.02 for k in need) and all(r > 1 / 1.02 for r in ratios.values())
print(" ".join(f"{i[0]}{T // 1024}K {r:.3f}" for (i, T), r in sorted(ratios.items())) or "no ratios")
print(f"{F} vs {W}: " + ("QUALIFIES (if its cases and sanitizers are clean)" if ok else "does not qualify"))
PY
}
( timeout 200 $B/bwd_$F --no-bench > "$L/correct.log" 2>&1; echo "exit=$?" >> "$L/correct.log" )
echo "correctness done $(el)"
if ! grep -q "correctness: [0-9]* passed, 0 failed" "$L/correct.log" || grep -q "RUNS DIFFER\|FAIL" "$L/correct.log" \
   || ! grep -qx "exit=0" "$L/correct.log"; then
  echo "$F: correctness not clean: not timed"; report; exit 1
fi
for r in 1 2; do
  order="$W $F $ND"; [ $r = 2 ] && order="$F $W"
  for idx in uniform causal; do
    for v in $order; do
      [ "$(left)" -lt 170 ] && { echo "round $r $v $idx skipped (time)"; continue; }
      timeout 50 $B/bwd_$v --bench-only --fast-only --T 4096,8192,16384,32768 --bench-indices $idx > "$L/${v}_${idx}_r$r.log" 2>&1
      echo "$v $idx r$r rc=$? $(el)"
    done
  done
done
report > "$L/summary_early.txt" 2>&1  # the timings come back even if the rest is cut short
# (twenty-seventh session) the sanitizers before the long runs: they decide the adoption, the long runs do not
for t in synccheck memcheck racecheck; do
  l=$(left); [ "$l" -lt 40 ] && { echo "$t skipped (time)"; continue; }
  timeout $(( l < 200 ? l - 15 : 200 )) $SAN --tool $t $B/bwd_$F --small --no-bench > "$L/$t.log" 2>&1
  echo "$t rc=$? $(el)"
done
for v in $W $F; do
  [ "$(left)" -lt 60 ] && { echo "long $v skipped (time)"; continue; }
  timeout 40 $B/bwd_$v --bench-only --fast-only --T 65536,131072 > "$L/${v}_long.log" 2>&1; echo "$v long rc=$? $(el)"
done
report
