#!/usr/bin/env bash
# Prepared on 2026-12-04 (twenty-first session; no device was lent that session), not yet run. The second call
# after docs/bench/s20_2026-12-04/next_call_rs.sh, only if that call's A/B shows -DFLASHDSA_BWD_RS_DKV=2 correct
# (38 cases, deterministic bitwise, sanitizers clean) and faster: the extension built with the switch on (CMake
# takes CUDAFLAGS on a fresh build folder; checked here with `ninja -t commands`: sparse_mla_bwd.cu gets the
# define), then the backward against cuDNN frontend 1.32.0 in one process, calls alternated, ascending rows, at
# 4K-128K: issue 19's acceptance table for the RS build before the default is flipped.
# Device: run(command="bash docs/bench/s21_2026-12-04/next_call_rs_peers.sh", carry=[".peers"])
#   (.peers: cudnn.tar.xz + MANIFEST only, 53.5 MiB: with the 9.8 MB tree under the 64 MiB limit; move
#   tilelang.tar.xz out of .peers for this call)
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=/tmp/rs_peers; mkdir -p "$L"; OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$L/gpu.txt"
s=$(date +%s)
# (twenty-second session) The backward's switches are now chosen by the first call of docs/bench/NEXT_CALLS.md:
# set BWD_FLAGS below to its winner (e.g. "-DFLASHDSA_BWD_EMIT_HALF=1 -DFLASHDSA_BWD_KV_SPLIT=1") before the call.
# (twenty-third session) Without BWD_FLAGS the winner that call 1 wrote to /tmp/bwd5/winner_flags in the same warm
# session is used ("" there = the default build wins: the peers run then measures it).
# (twenty-seventh session) call 6's winner (/tmp/bwdfc8ed/winner_flags: call 1's flags plus its switches) when it is newer
# than call 1's file.
if [ -z "${BWD_FLAGS+set}" ]; then
  WF=$(ls -t /tmp/bwdfc8ed/winner_flags /tmp/bwd5/winner_flags 2>/dev/null | head -1)
  [ -n "$WF" ] || { echo "no BWD_FLAGS and neither /tmp/bwd5/winner_flags nor /tmp/bwdfc8ed/winner_flags (calls 1 / 6 not run in this warm session)"; exit 2; }
  BWD_FLAGS=$(cat "$WF"); echo "backward flags from $WF"
fi
echo "backward flags of this run: '$BWD_FLAGS'"
CUDAFLAGS="$BWD_FLAGS" FLASHDSA_BUILD_DIR=/tmp/build_rs MAX_JOBS=16 \
  timeout 200 python3 -m pip install --no-build-isolation --no-deps -e . > "$L/ext_build.log" 2>&1
echo "ext build ($BWD_FLAGS) rc=$? $(( $(date +%s) - s )) s"
[ -n "$BWD_FLAGS" ] && grep -c -e "${BWD_FLAGS%% *}" /tmp/build_rs/build.ninja 2>/dev/null | sed 's/^/build.ninja lines with the first define: /'
left=$(( 570 - ($(date +%s) - s) ))
PEERS_SKIP_BUILD=1 PEERS_RUN_TIMEOUT=$(( left - 20 )) OUT=$L timeout "$left" bash scripts/peers_gpu.sh --run \
  --peer-kernels sparse_mla_bwd --peer-keys cudnn --seq-lens 4096 8192 16384 32768 65536 131072 \
  --peers-max-seconds $(( left - 60 )) > "$L/peers.log" 2>&1
echo "peers rc=$? $(( $(date +%s) - s )) s"
tar -czf "$OUT/rs_peers.tgz" -C "$L" .
tail -30 "$L/peers.log"; cat "$L/gpu.txt"
