#!/usr/bin/env bash
# Prepares the public peers for the GPU machine (which has no network) in the git-ignored folder
# .peers/ of the repository root: compressed parts of at most 40 MiB each, to be carried in a few
# device calls and unpacked there by scripts/peers_gpu.sh. Run HERE (a machine with PyPI access and
# the `fetch` mirrors of deepseek-ai/FlashMLA and NVIDIA/cutlass). Nothing is vendored: .peers/ is
# ignored by git and only travels to the GPU machine.
#
#   bash scripts/peers_stage.sh            # all sets
#   bash scripts/peers_stage.sh cudnn      # only some: cudnn tilelang flashmla
#
# Sets (each a tar.xz, split into NAME.tar.xz.partNN when larger than 40 MiB):
#   cudnn    : site-packages (Python 3.12, x86_64) of nvidia-cudnn-frontend 1.32.0, nvidia-cutlass-dsl
#              4.8.1 (+ -libs-base, -libs-core, -libs-cu13), apache-tvm-ffi 0.1.12
#   tilelang : site-packages of tilelang 0.1.15, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5,
#              z3-solver 4.15.4.0 and megatron-core 0.19.2 (its TileLang DSA kernels)
#   flashmla : deepseek-ai/FlashMLA source (git archive of the mirror) + CUTLASS include/ and
#              tools/util/include/ at the commit FlashMLA's csrc/cutlass submodule pins
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=$ROOT/.peers
WORK=${PEERS_WORK:-/tmp/peers_stage}
PY=${PYTHON:-python3}
PART_MIB=${PEERS_PART_MIB:-40}
FLASHMLA_MIRROR=${FLASHMLA_MIRROR:-/work/.mirror/deepseek-ai+FlashMLA/repo}
CUTLASS_MIRROR=${CUTLASS_MIRROR:-/work/.mirror/NVIDIA+cutlass/repo}
FLASHMLA_REF=${FLASHMLA_REF:-HEAD}

CUDNN_PKGS=(nvidia-cudnn-frontend==1.32.0 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
            nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.12)
TILELANG_PKGS=(tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0
               megatron-core==0.19.2)

SETS=("$@")
[ ${#SETS[@]} -eq 0 ] && SETS=(cudnn tilelang flashmla)
mkdir -p "$STAGE" "$WORK"

# tar.xz of a folder, split into parts of at most PART_MIB MiB (a single part keeps the plain name).
pack() {  # pack NAME DIR
    local name=$1 dir=$2 out=$WORK/$1.tar.xz
    rm -f "$STAGE/$name".tar.xz "$STAGE/$name".tar.xz.part*
    XZ_OPT="-6 -T2" tar -cJf "$out" -C "$dir" .
    local size; size=$(stat -c %s "$out")
    if [ "$size" -le $((PART_MIB * 1024 * 1024)) ]; then
        mv "$out" "$STAGE/$name.tar.xz"
    else
        split -b "${PART_MIB}M" -d -a 2 "$out" "$STAGE/$name.tar.xz.part"
        rm -f "$out"
    fi
}

site() {  # site NAME PACKAGES...: pip install for CPython 3.12 x86_64 into a --target folder, then pack
    local name=$1; shift
    local dir=$WORK/site-$name
    rm -rf "$dir"
    "$PY" -m pip install --quiet --no-deps --only-binary=:all: --ignore-requires-python \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --target "$dir" "$@"
    # Compiled caches and console scripts are not needed on the GPU machine.
    find "$dir" -name __pycache__ -type d -prune -exec rm -rf {} +
    rm -rf "$dir/bin"
    echo "$name: $(du -sh "$dir" | cut -f1) installed: $*"
    pack "$name" "$dir"
}

flashmla() {
    [ -d "$FLASHMLA_MIRROR" ] || { echo "flashmla: no mirror at $FLASHMLA_MIRROR (use the fetch tool on github:deepseek-ai/FlashMLA)"; return 1; }
    [ -d "$CUTLASS_MIRROR" ] || { echo "flashmla: no mirror at $CUTLASS_MIRROR (use the fetch tool on github:NVIDIA/cutlass)"; return 1; }
    local dir=$WORK/flashmla commit pin
    rm -rf "$dir"; mkdir -p "$dir/csrc/cutlass"
    commit=$(git --git-dir="$FLASHMLA_MIRROR" rev-parse "$FLASHMLA_REF")
    pin=$(git --git-dir="$FLASHMLA_MIRROR" ls-tree "$commit" csrc/cutlass | awk '{print $3}')
    # Only what the build needs: the sources and the Python package (no images, no benchmarks).
    git --git-dir="$FLASHMLA_MIRROR" archive "$commit" csrc flash_mla setup.py LICENSE | tar -x -C "$dir"
    git --git-dir="$CUTLASS_MIRROR" archive "$pin" include tools/util/include LICENSE.txt | tar -x -C "$dir/csrc/cutlass"
    printf 'flashmla %s\ncutlass %s\n' "$commit" "$pin" > "$dir/PEERS_COMMITS"
    echo "flashmla: FlashMLA $commit, CUTLASS $pin, $(du -sh "$dir" | cut -f1)"
    pack flashmla "$dir"
}

for s in "${SETS[@]}"; do
    case $s in
        cudnn) site cudnn "${CUDNN_PKGS[@]}" ;;
        tilelang) site tilelang "${TILELANG_PKGS[@]}" ;;
        flashmla) flashmla ;;
        *) echo "unknown set '$s' (known: cudnn tilelang flashmla)"; exit 2 ;;
    esac
done

# MANIFEST: name, bytes and sha256 of every part, so that scripts/peers_gpu.sh knows when a set is complete.
(cd "$STAGE" && for f in *.tar.xz *.tar.xz.part*; do
    [ -e "$f" ] && echo "$f $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
done) > "$STAGE/MANIFEST"

echo "parts in $STAGE (each <= $PART_MIB MiB; carry MANIFEST with every device call):"
total=0
for f in "$STAGE"/*.tar.xz*; do
    [ -e "$f" ] || continue
    size=$(stat -c %s "$f"); total=$((total + size))
    printf '  %-32s %6.1f MiB\n' "$(basename "$f")" "$(echo "$size / 1048576" | bc -l)"
done
printf '  %-32s %6.1f MiB\n' total "$(echo "$total / 1048576" | bc -l)"
