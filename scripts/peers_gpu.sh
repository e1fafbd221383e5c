#!/usr/bin/env bash
# Sets up the public peers ON THE GPU MACHINE (no network) from the parts that scripts/peers_stage.sh
# put in .peers/ (carried with the device calls), then optionally runs the peers benchmark.
#
#   bash scripts/peers_gpu.sh                 # unpack what has arrived, build FlashMLA when its source is there
#   bash scripts/peers_gpu.sh --run [ARGS]    # ... then: python bench/run.py --only peers ARGS
#   source scripts/peers_gpu.sh               # ... and export PYTHONPATH / TILELANG_CACHE_DIR into this shell
#
# Idempotent, and made for parts that arrive over several device calls: each call's parts are copied
# to /tmp/peers/parts (which lasts while the machine stays up); a set is unpacked into /tmp/peers/<set>
# once all its parts (listed in .peers/MANIFEST with their sha256) are there; what is already unpacked
# or built is skipped. FlashMLA's SM90 sparse prefill kernel and our op around it
# (bench/peers/flashmla_binding.cpp) are built into /tmp/peers/flashmla/build. Writes
# /tmp/peers/env.sh (the PYTHONPATH of the sets present) and prints a status table last.
# FLASHDSA_PEERS_DIR moves /tmp/peers; PEERS_SKIP_BUILD=1 skips the FlashMLA build; PEERS_BUILD_TIMEOUT
# (480 s) and PEERS_RUN_TIMEOUT (570 s) bound the build and the run; with $OUT set, the build log is
# copied there and the report goes to $OUT/peers_bench unless --out is given. The vs-peers table of
# the report is printed last.
_peers_main() {
    local root peers stage have_run=0 run_args=() s
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    peers=${FLASHDSA_PEERS_DIR:-/tmp/peers}
    stage=$root/.peers
    if [ "${1:-}" = "--run" ]; then have_run=1; shift; run_args=("$@"); fi
    mkdir -p "$peers/parts"

    # 1. Keep every part that arrived with this call (verified against the manifest when one is there).
    if [ -d "$stage" ]; then
        for f in "$stage"/*.tar.xz "$stage"/*.tar.xz.part* "$stage"/MANIFEST; do
            [ -e "$f" ] || continue
            cmp -s "$f" "$peers/parts/$(basename "$f")" 2>/dev/null || cp -f "$f" "$peers/parts/"
        done
    fi
    local manifest=$peers/parts/MANIFEST status=()
    # 2. Unpack each complete set once.
    for s in cudnn tilelang flashmla; do
        if [ -e "$peers/$s/.unpacked" ]; then status+=("$s: unpacked earlier"); continue; fi
        local parts=() expected=0 missing=() bad=()
        if [ -f "$manifest" ]; then
            while read -r name size sum; do
                case $name in "$s".tar.xz|"$s".tar.xz.part*) ;; *) continue ;; esac
                expected=$((expected + 1))
                if [ ! -f "$peers/parts/$name" ]; then missing+=("$name"); continue; fi
                [ "$(sha256sum "$peers/parts/$name" | cut -d' ' -f1)" = "$sum" ] || bad+=("$name")
            done < "$manifest"
        fi
        for f in "$peers/parts/$s".tar.xz "$peers/parts/$s".tar.xz.part*; do [ -e "$f" ] && parts+=("$f"); done
        if [ ${#parts[@]} -eq 0 ]; then status+=("$s: no parts yet"); continue; fi
        if [ ${#missing[@]} -gt 0 ]; then status+=("$s: waiting for ${missing[*]}"); continue; fi
        if [ ${#bad[@]} -gt 0 ]; then status+=("$s: checksum mismatch in ${bad[*]} (stage again)"); continue; fi
        if [ "$expected" -eq 0 ] && [ "${parts[0]##*.}" != "xz" ]; then
            status+=("$s: split parts but no MANIFEST: cannot tell whether all arrived"); continue
        fi
        rm -rf "$peers/$s"; mkdir -p "$peers/$s"
        local target=$peers/$s
        [ "$s" = flashmla ] && target=$peers/$s/src && mkdir -p "$target"
        if cat "${parts[@]}" | tar -xJ -C "$target"; then
            touch "$peers/$s/.unpacked"
            status+=("$s: unpacked ${#parts[@]} part(s) into $target")
        else
            status+=("$s: unpack FAILED")
        fi
    done
    # 3. Build FlashMLA's SM90 sparse prefill + our op (skipped when built).
    if [ -e "$peers/flashmla/.unpacked" ] && [ -n "${PEERS_SKIP_BUILD:-}" ]; then
        status+=("flashmla: build skipped (PEERS_SKIP_BUILD set)")
    elif [ -e "$peers/flashmla/.unpacked" ]; then
        if [ -f "$peers/flashmla/build/flashdsa_peer_flashmla.so" ]; then
            status+=("flashmla: built earlier")
        elif (cd "$root" && timeout "${PEERS_BUILD_TIMEOUT:-480}" python3 bench/peers/build_flashmla.py --src "$peers/flashmla/src" \
                --dest "$peers/flashmla") > "$peers/flashmla/build.log" 2>&1; then
            status+=("flashmla: built ($(grep -E 'registers|spill' "$peers/flashmla/build.log" | grep -m1 -oE 'Used [0-9]+ registers') ; $(tail -1 "$peers/flashmla/build.log"))")
        else
            status+=("flashmla: build FAILED (tail of $peers/flashmla/build.log below)")
            tail -20 "$peers/flashmla/build.log"
        fi
    fi
    [ -n "${OUT:-}" ] && [ -f "$peers/flashmla/build.log" ] && cp -f "$peers/flashmla/build.log" "$OUT/flashmla_build.log"
    # 4. The environment of the peers present.
    local path=""
    [ -e "$peers/cudnn/.unpacked" ] && path="$peers/cudnn:$peers/cudnn/nvidia_cutlass_dsl/dsl_packages"
    [ -e "$peers/tilelang/.unpacked" ] && path="${path:+$path:}$peers/tilelang"
    {
        echo "export FLASHDSA_PEERS_DIR=$peers"
        echo "export TILELANG_CACHE_DIR=$peers/tilelang_cache"
        [ -n "$path" ] && echo "export PYTHONPATH=$path\${PYTHONPATH:+:\$PYTHONPATH}"
    } > "$peers/env.sh"
    # shellcheck disable=SC1091
    source "$peers/env.sh"
    echo "peers_gpu: $peers (env: source $peers/env.sh)"
    for s in "${status[@]}"; do echo "  $s"; done
    if [ "$have_run" = 1 ]; then
        if ! (cd "$root" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/python" python3 -c "import flashdsa" 2>/dev/null); then
            echo "peers_gpu: flashdsa is not importable: build it first (pip install --no-build-isolation --no-deps -e .)"
            return 3
        fi
        local out_dir="" a prev=""
        for a in "${run_args[@]}"; do [ "$prev" = "--out" ] && out_dir=$a; prev=$a; done
        if [ -z "$out_dir" ]; then
            out_dir=${OUT:-$peers}/peers_bench
            run_args+=(--out "$out_dir")
        fi
        local rc=0
        (cd "$root" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/python" \
            timeout "${PEERS_RUN_TIMEOUT:-570}" python3 bench/run.py --only peers "${run_args[@]}") || rc=$?
        # The summary last: the vs-peers table of the report.
        if [ -f "$out_dir/report.md" ]; then
            echo; sed -n '/^## vs peers/,/^## DSA layer/p' "$out_dir/report.md" | sed '$d'
        fi
        [ "$rc" = 0 ] || echo "peers_gpu: bench/run.py exited with $rc (124: PEERS_RUN_TIMEOUT)"
        return $rc
    fi
}
_peers_main "$@"
_peers_rc=$?
unset -f _peers_main
# Sourced: keep the caller's shell (and its exports); executed: exit with the status.
(return 0 2>/dev/null) || exit $_peers_rc
