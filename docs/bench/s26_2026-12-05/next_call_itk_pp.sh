#!/usr/bin/env bash
# Prepared on 2026-12-05 (twenty-sixth session; no device was lent that session), not yet run. Replaces call 3 of
# docs/bench/NEXT_CALLS.md (docs/bench/s21_2026-12-04/next_call_itk_warp_final.sh, deleted): the bf16 indexer's two A/B builds
# against the default build in one call —
#   wf    -DFLASHDSA_ITK_WARP_FINAL=1  final selections one warp per row (twenty-first session)
#   pp    -DFLASHDSA_ITK_PINGPONG=1    the two warpgroups' MMAs of a CTA ordered, each epilogue under the other's MMA
#                                      (twenty-sixth session, docs/perf-notes.md): a warpgroup issues once the
#                                      other's MMA has completed
#   pp2   -DFLASHDSA_ITK_PINGPONG=2    the same turns passed right after each issue (FlashAttention-3's order: both
#                                      MMAs in flight, run in issue order)
#   ppwf  wf + pp
# with the SM clock / power sampled beside the rounds. Binaries built here (check program, commands in
# docs/kernels/indexer_topk.md; the default build's SASS is identical to main's, normalised cuobjdump):
#   nvcc <flags> [-D...] -o check_{main,wf,pp,pp2,ppwf,a1,a2,a1pp,a2pp,a1pp2,a2pp2} tests/cuda/indexer_topk_check.cu \
#        csrc/common/ranges.cpp csrc/common/status.cpp csrc/sm90/indexer_topk/indexer_topk.cu
# Device: run(command="bash docs/bench/s26_2026-12-05/next_call_itk_pp.sh", carry=["build-x/itkpp"])
# Steps (guarded to ~570 s): correctness cases of pp, pp2, wf and ppwf (concurrently; exact top-K multiset at every
# capacity), 3 alternated rounds of main / wf / pp / pp2 (+ ppwf while time allows) at 8K / 32K / 128K x H_I 32 / 64,
# synccheck / racecheck / memcheck of pp, pp2 and wf (`--small`: seconds each; the pp change is a barrier protocol),
# the attribution builds without and with the orderings at H_I = 32 (a1 / a2, a1pp / a2pp, a1pp2 / a2pp2), an ncu
# report of pp at 32K if time is left. Binaries: build-x/itkpp/itkpp.tar.xz (11 check programs, 2.9 MB; SHA256SUMS).
# A table last.
# Decision rules: a switch becomes the default if its cases pass, its sanitizers are clean and it is >= 2% faster at
# 8K and 32K (wf) / >= 3% faster at 32K and 128K (pp or pp2, the faster of the two), H_I = 32, with no point >= 2%
# slower (H_I 32 and 64).
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/itkpp; rm -rf "$L"; mkdir -p "$L"; B=build-x/itkpp; OUT=${OUT:-/tmp}
[ -x $B/check_pp ] || tar -xJf $B/itkpp.tar.xz -C $B || exit 2
(cd $B && sha256sum -c SHA256SUMS > "$L/sha256.txt" 2>&1) || { echo "binaries do not match SHA256SUMS"; exit 2; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > "$L/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 200 > "$L/smi.csv" 2>&1 &
smi=$!
VARS="main wf pp pp2 ppwf"
pack_and_report() {
tar -czf "$OUT/itkpp_logs.tgz" -C "$L" .
echo "==== summary"; cat "$L/gpu.txt"
for v in wf pp pp2 ppwf; do
  echo "$v: $(grep -c "FAIL" "$L/correct_$v.log" 2>/dev/null) lines with FAIL, $(grep -m1 -o "ALL PASS" "$L/correct_$v.log" 2>/dev/null), $(grep -x "exit=[0-9]*" "$L/correct_$v.log" 2>/dev/null)"
done
for f in "$L"/san_*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$f" | tail -1)"; done
echo "H T | main r1 r2 r3 | wf r1 r2 r3 | pp r1 r2 r3 | pp2 r1 r2 r3 | ppwf r1 r2 r3   (ms, per-process medians)"
for H in 32 64; do for T in 8192 32768 131072; do
  row="$H $T |"
  for v in $VARS; do for r in 1 2 3; do
    x=$(awk -v H=$H -v T=$T '$1==H && $2==T && NF>=7 {print $3; exit}' "$L/${v}_r$r.log" 2>/dev/null)
    row="$row ${x:--}"
  done; row="$row |"; done
  echo "$row"
done; done
grep -h "SOME FAILED\|FAIL" "$L"/{main,wf,pp,pp2,ppwf}_r*.log 2>/dev/null | head -5
echo "attribution, H_I 32, T 8K 32K 128K (ms): $(for v in a1 a1pp a1pp2 a2 a2pp a2pp2; do printf '%s:' $v; for T in 8192 32768 131072; do printf ' %s' "$(awk -v T=$T '$1==32 && $2==T && NF>=7 {print $3; exit}' "$L/${v}_r1.log" 2>/dev/null)"; done; printf '  '; done)"
awk -F', ' 'NR > 1 && $2 + 0 > 0 { n++; s += $2; if (min == "" || $2 + 0 < min) min = $2 + 0 } END { if (n) printf "SM clock over the rounds: mean %.0f MHz, min %d MHz (%d samples)\n", s / n, min, n }' "$L/smi.csv"
}
s=$(date +%s)
el() { echo "$(( $(date +%s) - s )) s"; }
left() { echo $(( 570 - ($(date +%s) - s) )); }
pids=""
for v in pp pp2 wf ppwf; do
  ( timeout -k 5 170 $B/check_$v --no-bench --seed 20261205 > "$L/correct_$v.log" 2>&1; echo "exit=$?" >> "$L/correct_$v.log" ) &
  pids="$pids $!"
done
wait $pids; echo "correctness done $(el)"  # (not a bare wait: the clock sampler runs in the background)
# A build whose cases fail or hang is not timed or sanitized further (its pp variants neither: a1pp, a2pp follow pp).
bad=""
for v in pp pp2 wf ppwf; do
  { grep -q "ALL PASS" "$L/correct_$v.log" && ! grep -q "FAIL" "$L/correct_$v.log" && grep -qx "exit=0" "$L/correct_$v.log"; } \
    || { bad="$bad $v"; echo "$v: correctness cases failed or timed out: not timed"; }
done
skip() {
  case " $bad " in *" $1 "*) return 0;; esac
  case $1 in a1pp|a2pp) case " $bad " in *" pp "*) return 0;; esac;; a1pp2|a2pp2) case " $bad " in *" pp2 "*) return 0;; esac;; esac
  return 1
}
for r in 1 2 3; do
  case $r in 1) order="main wf pp pp2 ppwf";; 2) order="pp2 pp main wf ppwf";; 3) order="wf pp main pp2 ppwf";; esac
  for v in $order; do
    skip $v && continue
    [ "$(left)" -lt 260 ] && [ $v = ppwf ] && { echo "$v r$r skipped (time)"; continue; }
    [ "$(left)" -lt 200 ] && { echo "$v r$r skipped (time)"; continue; }
    timeout -k 5 90 $B/check_$v --bench-only --bench-T 8192,32768,131072 --bench-H 32,64 --seed 7 > "$L/${v}_r$r.log" 2>&1
    echo "$v r$r rc=$? $(el)"
  done
done
kill $smi 2>/dev/null
pack_and_report
san() {
  for vt in "$@"; do
    v=${vt%%:*}; t=${vt##*:}
    skip $v && continue
    l=$(left); [ "$l" -lt 30 ] && { echo "$t $v skipped (time)"; continue; }
    timeout $(( l < 110 ? l - 5 : 110 )) $SAN --tool $t $B/check_$v --small --seed 1 > "$L/san_${v}_$t.log" 2>&1
    echo "$t $v rc=$? $(el)"
  done
}
san pp:synccheck pp2:synccheck pp:racecheck pp2:racecheck pp:memcheck pp2:memcheck
# Attribution (docs/kernels/indexer_topk.md "Attribution builds"), one process each: MMA only (a1) and MMA + head sums +
# pass test without appends (a2), without and with the ordering — whether the ordered MMAs keep the MMA-only rate (two
# MMA streams per SM instead of four) and how much of the epilogue they hide. Their spot checks fail by design.
for v in a1 a1pp a1pp2 a2 a2pp a2pp2; do
  skip $v && continue
  [ "$(left)" -lt 100 ] && { echo "$v skipped (time)"; continue; }
  timeout -k 5 60 $B/check_$v --bench-only --bench-T 8192,32768,131072 --bench-H 32 --seed 7 > "$L/${v}_r1.log" 2>&1
  echo "$v rc=$? $(el)"
done
pack_and_report
san wf:memcheck wf:racecheck wf:synccheck
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
l=$(left)
if [ "$l" -gt 100 ] && ! skip pp; then
  timeout $(( l - 10 )) $NCU -f --set full -k regex:indexer_topk_v2 -s 1 -c 1 -o "$L/itk32k_pp" $B/check_pp --bench-only \
    --bench-T 32768 --bench-H 32 --seed 7 > "$L/ncu.log" 2>&1
  echo "ncu rc=$? $(el)"
fi
pack_and_report
