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
# or built is skipped. Right after unpacking, an import check of each unpacked set (cudnn: tvm_ffi,
# cutlass, cudnn, the three cudnn.deepseek_sparse_attention wrappers; tilelang: z3, tvm_ffi, tilelang,
# megatron.core and its five TileLang DSA kernel modules, the CUTLASS and template include roots, and
# TileLang's example FP8 indexer + top-k in tilelang_examples/ as bench/peers/registry.py loads them)
# prints one line per module (version, folder) or FAILED with the error; PEERS_CHECK_TIMEOUT (240 s)
# bounds each set's check. FlashMLA's SM90 sparse prefill kernel and our op around it
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
        local parts=() listed=() expected=0 missing=() bad=()
        if [ -f "$manifest" ]; then
            while read -r name _ sum; do
                case $name in "$s".tar.xz|"$s".tar.xz.part*) ;; *) continue ;; esac
                expected=$((expected + 1))
                listed+=("$peers/parts/$name")
                if [ ! -f "$peers/parts/$name" ]; then missing+=("$name"); continue; fi
                [ "$(sha256sum "$peers/parts/$name" | cut -d' ' -f1)" = "$sum" ] || bad+=("$name")
            done < "$manifest"
        fi
        if [ "$expected" -gt 0 ]; then
            # Only what the manifest lists: parts of an earlier staging left in $peers/parts
            # (e.g. split parts before a one-archive set) must not be joined in.
            for f in "${listed[@]}"; do [ -e "$f" ] && parts+=("$f"); done
        else
            for f in "$peers/parts/$s".tar.xz "$peers/parts/$s".tar.xz.part*; do [ -e "$f" ] && parts+=("$f"); done
        fi
        if [ ${#parts[@]} -eq 0 ]; then status+=("$s: no parts yet"); continue; fi
        if [ ${#missing[@]} -gt 0 ]; then status+=("$s: waiting for ${missing[*]}"); continue; fi
        if [ ${#bad[@]} -gt 0 ]; then status+=("$s: checksum mismatch in ${bad[*]} (stage again)"); continue; fi
        if [ "$expected" -eq 0 ] && [ "${parts[0]##*.}" != "xz" ]; then
            status+=("$s: split parts but no MANIFEST: cannot tell whether all arrived"); continue
        fi
        rm -rf "${peers:?}/$s"; mkdir -p "$peers/$s"
        local target=$peers/$s
        [ "$s" = flashmla ] && target=$peers/$s/src && mkdir -p "$target"
        if cat "${parts[@]}" | tar -xJ -C "$target"; then
            touch "$peers/$s/.unpacked"
            status+=("$s: unpacked ${#parts[@]} part(s) into $target")
        else
            status+=("$s: unpack FAILED")
        fi
    done
    # 2b. Import check of each unpacked set, first thing (before the FlashMLA build): shows at once
    # whether a set arrived whole (module versions and where they load from).
    local path=""
    [ -e "$peers/cudnn/.unpacked" ] && path="$peers/cudnn:$peers/cudnn/nvidia_cutlass_dsl/dsl_packages"
    [ -e "$peers/tilelang/.unpacked" ] && path="${path:+$path:}$peers/tilelang"
    echo "peers_gpu: import check (PYTHONPATH=${path:-<none>})"
    for s in cudnn tilelang; do
        if [ ! -e "$peers/$s/.unpacked" ]; then echo "  $s: not unpacked"; continue; fi
        (cd "$root" && PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" TILELANG_CACHE_DIR="$peers/tilelang_cache" \
            FLASHDSA_PEERS_DIR="$peers" \
            timeout "${PEERS_CHECK_TIMEOUT:-240}" python3 - "$s" <<'PYEOF'
import importlib, os, sys, time
from importlib.metadata import version

CHECKS = {  # module, distribution (for the version), attributes that must resolve
    "cudnn": [("tvm_ffi", "apache-tvm-ffi", ()), ("cutlass", "nvidia-cutlass-dsl", ()), ("cutlass.cute", None, ()),
              ("cudnn", "nvidia-cudnn-frontend", ()),
              ("cudnn.deepseek_sparse_attention", None,
               ("sparse_attention_backward_wrapper", "indexer_forward_wrapper", "indexer_top_k_wrapper"))],
    "tilelang": [("z3", "z3-solver", ()), ("tvm_ffi", "apache-tvm-ffi", ()), ("tilelang", "tilelang", ()),
                 ("megatron.core", "megatron-core", ())]
                + [(f"megatron.core.transformer.experimental_attention_variant.ops.{m}", None, (a,)) for m, a in (
                    ("tilelang_sparse_mla_fwd", "sparse_mla_fwd_interface"), ("tilelang_sparse_mla_bwd", "sparse_mla_bwd"),
                    ("sparse_mla", "SparseMLA"), ("tilelang_indexer_fwd", "indexer_fwd_interface"),
                    ("tilelang_dsa", "fused_qk_topk_lighting"))],
}
key, failed = sys.argv[1], 0
for module, dist, attrs in CHECKS[key]:
    start = time.time()
    try:
        m = importlib.import_module(module)
        missing = [a for a in attrs if getattr(m, a, None) is None]
        if missing:
            raise ImportError(f"{', '.join(missing)} missing or None")
        where = os.path.dirname(getattr(m, "__file__", None) or "?")
        ver = version(dist) if dist else ""
        print(f"  {key}: ok     {module} {ver} ({where}; {time.time() - start:.1f} s)")
    except Exception as error:  # noqa: BLE001 - report every module
        failed += 1
        line = (str(error).strip().splitlines() or [""])[0][:200]
        print(f"  {key}: FAILED {module}: {type(error).__name__}: {line}")
if key == "tilelang" and not failed:
    from tilelang import env
    for what, folder, probe in (("CUTLASS include", env.CUTLASS_INCLUDE_DIR, "cute/tensor.hpp"),
                                ("TileLang templates", env.TILELANG_TEMPLATE_PATH, "tl_templates/cuda/common.h")):
        ok = bool(folder) and os.path.isfile(os.path.join(folder, probe))
        failed += not ok
        print(f"  {key}: {'ok    ' if ok else 'FAILED'} {what} {folder} ({probe} {'found' if ok else 'missing'})")
if key == "tilelang":  # TileLang's example FP8 indexer + top-k (peer tilelang_fp8_example), loaded by path
    start = time.time()
    try:
        from bench.peers import registry
        folder = registry.tilelang_examples_dir()
        if not os.path.isdir(folder):
            print(f"  {key}: absent TileLang examples: no {folder} (staged without them?)")
        else:
            registry.TileLangFp8Example(folder)
            commit = (open(os.path.join(os.path.dirname(folder), "PEERS_COMMITS")).read().split() + ["?", "?"])[1]
            print(f"  {key}: ok     TileLang examples fp8_lighting_indexer, topk_selector, utils "
                  f"(tile-ai/tilelang {commit[:9]}; {folder}; {time.time() - start:.1f} s)")
    except Exception as error:  # noqa: BLE001
        failed += 1
        line = (str(error).strip().splitlines() or [""])[0][:200]
        print(f"  {key}: FAILED TileLang examples: {type(error).__name__}: {line}")
sys.exit(1 if failed else 0)
PYEOF
        ) || echo "  $s: import check FAILED (see above; 124: PEERS_CHECK_TIMEOUT)"
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
    # 4. The environment of the peers present (PYTHONPATH as in the import check).
    {
        echo "export FLASHDSA_PEERS_DIR=$peers"
        echo "export TILELANG_CACHE_DIR=$peers/tilelang_cache"
        # Megatron's cudnn backend imports flash_mla: our op around FlashMLA's kernel stands in for it.
        [ -f "$peers/flashmla/build/flashdsa_peer_flashmla.so" ] && path="${path:+$path:}$root/bench/peers/flash_mla_shim"
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
