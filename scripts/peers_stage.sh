#!/usr/bin/env bash
# Prepares the public peers for the GPU machine (which has no network) in the git-ignored folder
# .peers/ of the repository root: one compressed archive per set, to be carried in the device calls
# and unpacked there by scripts/peers_gpu.sh. Run HERE (a machine with PyPI access and the `fetch`
# mirrors of deepseek-ai/FlashMLA, NVIDIA/cutlass and tile-ai/tilelang). Nothing is vendored: .peers/
# is ignored by git and only travels to the GPU machine.
#
#   bash scripts/peers_stage.sh              # all sets, slim (default)
#   bash scripts/peers_stage.sh cudnn        # only some: cudnn tilelang flashmla
#   bash scripts/peers_stage.sh --full ...   # the packages as pip installs them, xz -6, 40 MiB parts
#   bash scripts/peers_stage.sh --examples-into DIR   # only the TileLang example step, into DIR/tilelang_examples
#
# Sets (each one tar.xz; split into NAME.tar.xz.partNN only when larger than PEERS_PART_MIB):
#   cudnn    : site-packages (Python 3.12, x86_64) of nvidia-cudnn-frontend 1.32.0, nvidia-cutlass-dsl
#              4.8.1 (+ -libs-base, -libs-core, -libs-cu13), apache-tvm-ffi 0.1.12
#   tilelang : site-packages of tilelang 0.1.15, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5,
#              z3-solver 4.15.4.0 and megatron-core 0.19.2 (its TileLang DSA kernels); and, in its folder
#              tilelang_examples/, TileLang's examples/deepseek_v32 FP8 lightning indexer, top-k selector
#              and utils (+ README, LICENSE) at TILELANG_EXAMPLES_REF of the tile-ai/tilelang mirror, the
#              commit in tilelang_examples/PEERS_COMMITS (the PyPI wheel has no examples; bench/peers
#              loads them by path: peer tilelang_fp8_example). PEERS_TL_EXAMPLES=0 leaves them out.
#   flashmla : deepseek-ai/FlashMLA source (git archive of the mirror) + CUTLASS include/ and
#              tools/util/include/ at the commit FlashMLA's csrc/cutlass submodule pins
#
# Slim (the default) keeps every file that the code paths we run load, import or include, and
# makes the sets 29% smaller (119.6 -> 85.2 MiB: cudnn 53.5, tilelang 30.6, flashmla 1.1 MiB;
# docs/benchmarks.md, "Bringing the peers to the GPU machine"):
#   - removes files no run of ours needs (slim_cudnn / slim_tilelang below: each with its reason);
#   - identical large files become hard links (tar stores the data once and recreates the link);
#   - strips the static symbol table of libz3 only (its dynamic symbols and dynamic section are
#     checked unchanged; the CuTe DSL binaries are never touched: cutlass checks their sha256);
#   - one solid xz stream per set with the x86 branch filter and a 256 MiB dictionary
#     (preset 9; PEERS_XZ overrides the xz options; about 20-25 minutes per set on 2 busy cores,
#     2.7 GiB of memory).
# Then it verifies the slim tree statically (verify_slim): every ELF file's NEEDED libraries are in
# the set or are system / CUDA / torch libraries, and no remaining Python file imports a removed
# module. PEERS_WORK (/tmp/peers_stage) holds the installed trees; PEERS_REUSE=1 re-uses an
# installed tree there instead of installing again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGE=$ROOT/.peers
WORK=${PEERS_WORK:-/tmp/peers_stage}
PY=${PYTHON:-python3}
FLASHMLA_MIRROR=${FLASHMLA_MIRROR:-/work/.mirror/deepseek-ai+FlashMLA/repo}
CUTLASS_MIRROR=${CUTLASS_MIRROR:-/work/.mirror/NVIDIA+cutlass/repo}
FLASHMLA_REF=${FLASHMLA_REF:-HEAD}
TILELANG_MIRROR=${TILELANG_MIRROR:-/work/.mirror/tile-ai+tilelang/repo}
# The newest main of the tile-ai/tilelang snapshot (2026-08-21; the mirror has no v0.1.14 / v0.1.15
# tag: it predates those releases). The three example files are byte-identical from c4c5ec595
# (2026-07-21) through the v0.1.13 tag to this commit; every TileLang name they use is in tilelang
# 0.1.15's language module (docs/benchmarks.md, "Peers").
TILELANG_EXAMPLES_REF=${TILELANG_EXAMPLES_REF:-a35008a42531c62b976ae4cec3855d4383db0f3c}
TILELANG_EXAMPLE_FILES=(fp8_lighting_indexer.py topk_selector.py utils.py README.md)

SLIM=1
SETS=()
EXAMPLES_INTO=""
while [ $# -gt 0 ]; do
    case $1 in
        --full) SLIM=0 ;;
        --slim) SLIM=1 ;;
        --examples-into) EXAMPLES_INTO=${2:?--examples-into needs a folder}; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) SETS+=("$1") ;;
    esac
    shift
done
[ ${#SETS[@]} -eq 0 ] && SETS=(cudnn tilelang flashmla)
if [ "$SLIM" = 1 ]; then
    PART_MIB=${PEERS_PART_MIB:-60}
    XZ_FLAGS=${PEERS_XZ:---x86 --lzma2=preset=9,dict=256MiB,pb=0 -T1}
else
    PART_MIB=${PEERS_PART_MIB:-40}
    XZ_FLAGS=${PEERS_XZ:--6 -T2}
fi

CUDNN_PKGS=(nvidia-cudnn-frontend==1.32.0 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
            nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.12)
TILELANG_PKGS=(tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0
               megatron-core==0.19.2)

mib() { echo "$1" | awk '{printf "%.1f MiB", $1 / 1048576}'; }

# tar.xz of a folder (names sorted: reproducible, and similar files sit together in the solid
# stream), split into parts of at most PART_MIB MiB (a single part keeps the plain name).
pack() {  # pack NAME DIR
    local name=$1 dir=$2 out=$WORK/$1.tar.xz
    rm -f "$STAGE/$name".tar.xz "$STAGE/$name".tar.xz.part*
    # shellcheck disable=SC2086
    tar -c --sort=name --owner=0 --group=0 --numeric-owner -C "$dir" . | xz -c $XZ_FLAGS > "$out"
    local size; size=$(stat -c %s "$out")
    if [ "$size" -le $((PART_MIB * 1024 * 1024)) ]; then
        mv "$out" "$STAGE/$name.tar.xz"
    else
        split -b "${PART_MIB}M" -d -a 2 "$out" "$STAGE/$name.tar.xz.part"
        rm -f "$out"
    fi
    echo "$name: $(mib "$size") compressed (xz $XZ_FLAGS)"
}

# Removes paths (relative to DIR) and says how much went; a path that is not there is an error, so
# that a new package version cannot silently change what is removed.
remove() {  # remove DIR REASON PATH...
    local dir=$1 reason=$2 bytes=0 p; shift 2
    for p in "$@"; do
        [ -e "$dir/$p" ] || { echo "slim: $p is not in $dir (package changed?)"; return 1; }
        bytes=$((bytes + $(du -sb "$dir/$p" | cut -f1)))
        rm -rf "${dir:?}/$p"
    done
    printf '  - %-9s %s: %s\n' "$(mib "$bytes")" "$reason" "$*"
}

# Identical files of 1 MiB or more become hard links to one copy (tar stores the data once).
dedup() {  # dedup DIR
    local dir=$1 sum f first prev=""
    find "$dir" -type f -size +1M -print0 | xargs -0 sha256sum | sort | while read -r sum f; do
        if [ "$sum" = "$prev" ]; then
            ln -f "$first" "$f"
            echo "  - $(mib "$(stat -c %s "$f")") duplicate: ${f#"$dir"/} is now a hard link to ${first#"$dir"/}"
        else
            prev=$sum; first=$f
        fi
    done
}

# strip --strip-unneeded, refusing any change to what the dynamic loader sees.
strip_static() {  # strip_static DIR PATH
    local f=$1/$2 before after tmp
    before=$(stat -c %s "$f")
    tmp=$(mktemp -d)
    readelf --dyn-syms -W "$f" > "$tmp/syms"; readelf -d "$f" > "$tmp/dyn"
    strip --strip-unneeded -o "$tmp/out" "$f"
    readelf --dyn-syms -W "$tmp/out" | cmp -s - "$tmp/syms" || { echo "slim: strip changed the dynamic symbols of $2"; rm -rf "$tmp"; return 1; }
    readelf -d "$tmp/out" | cmp -s - "$tmp/dyn" || { echo "slim: strip changed the dynamic section of $2"; rm -rf "$tmp"; return 1; }
    chmod --reference="$f" "$tmp/out"
    mv -f "$tmp/out" "$f"  # a new file: the installed tree (hard-linked into this one) stays as it was
    rm -rf "$tmp"
    after=$(stat -c %s "$f")
    echo "  - $(mib $((before - after))) static symbol table of $2 (strip --strip-unneeded; dynamic symbols and section unchanged)"
}

# What the slim cuDNN set leaves out. Each path was checked against the packages' own code
# (grep of imports / loads / include paths, readelf -d of every shared object; docs/benchmarks.md).
slim_cudnn() {  # slim_cudnn DIR
    local d=$1
    # IKET (In-Kernel Event Tracing) host tools: a top-level package `iket` (CLI, profiler injection
    # library, cubin info); no module of cutlass or cudnn imports it (cutlass.cute.experimental.iket
    # is a separate MLIR dialect wrapper and stays).
    remove "$d" "IKET tracing tools, never imported" nvidia_cutlass_dsl/dsl_packages/iket
    # Empty-body libcute_dsl_runtime.so stubs for aarch64 / QNX cross-linking of AOT exports.
    remove "$d" "aarch64/QNX link stubs (AOT cross builds)" nvidia_cutlass_dsl/cu13/lib/stubs
    # The cudnn_frontend C++ headers (for C++ users of the frontend; Python never reads them).
    remove "$d" "cudnn_frontend C++ headers" include
    # Sources and test texts of libbacktrace, which is already linked into libtvm_ffi.so.
    remove "$d" "libbacktrace sources" tvm_ffi/3rdparty/libbacktrace
    # cudnn's Python modules that `import cudnn` and cudnn.deepseek_sparse_attention never import
    # (sdpa, gemm, moe_ep, linear_attention, ...: 950 of its 1066 modules). PEERS_CUDNN_ALL_PY=1 keeps them.
    if [ -z "${PEERS_CUDNN_ALL_PY:-}" ]; then
        prune_py "$d" cudnn cudnn.deepseek_sparse_attention
    fi
}

# Removes the modules of package PKG that no kept module can import. Kept: the package's
# __init__ (only the statements it runs at import: the bodies of its functions are the lazy
# `cudnn.<name>` attributes, which no kept module uses), every module of each ENTRY package, and,
# transitively, every module named by an import statement anywhere in a kept module (function
# bodies included), by importlib.import_module("literal"), or by an attribute PKG.<name>; with
# their parent packages. Non-Python files stay.
prune_py() {  # prune_py DIR PKG ENTRY...
    "$PY" - "$@" <<'PYEOF'
import ast, os, sys
root, pkg, entries = sys.argv[1], sys.argv[2], sys.argv[3:]
mods = {}
for dp, _, fn in os.walk(os.path.join(root, pkg)):
    for f in fn:
        if f.endswith(".py"):
            path = os.path.join(dp, f)
            name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            is_pkg = name.endswith(".__init__")
            mods[name[:-9] if is_pkg else name] = (path, is_pkg)

def absolute(mod, is_pkg, level, name):
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))

def deps(mod):
    path, is_pkg = mods[mod]
    tree = ast.parse(open(path, encoding="utf-8").read())
    if mod == pkg:  # run-at-import statements only
        nodes = [n for st in tree.body if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(st)]
    else:
        nodes = list(ast.walk(tree))
    out = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            b = absolute(mod, is_pkg, n.level, n.module) if n.level else n.module
            out.add(b)
            out.update(f"{b}.{a.name}" for a in n.names)
        elif (isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module"
              and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)):
            s = n.args[0].value
            level = len(s) - len(s.lstrip("."))
            out.add(absolute(mod, is_pkg, level, s.lstrip(".")) if level else s)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == pkg:
            out.add(f"{pkg}.{n.attr}")
    found = set()
    for d in out:
        parts = d.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in mods)
    return found

todo = [pkg] + [m for e in entries for m in mods if m == e or m.startswith(e + ".")]
kept = set()
while todo:
    m = todo.pop()
    if m in kept or m not in mods:
        continue
    kept.add(m)
    parts = m.split(".")
    todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(deps(m))
gone = [mods[m][0] for m in mods if m not in kept]
size = sum(os.path.getsize(p) for p in gone)
for p in gone:
    os.remove(p)
print(f"  - {size / 1048576:.1f} MiB   {pkg} Python modules no kept module imports: {len(gone)} of {len(mods)} "
      f"(kept {len(kept)}: {pkg}/__init__ and what it imports, {', '.join(entries)})")
PYEOF
}

slim_tilelang() {  # slim_tilelang DIR
    local d=$1
    # TVM's C++ sources: built into tilelang/lib; only tvm.rpc.minrpc (not used) reads them.
    # The JIT include paths are tvm/include, tvm_ffi/include, cutlass/include and tilelang/src.
    remove "$d" "TVM C++ sources" tilelang/3rdparty/tvm/src
    # CUTLASS profiler and library generator sources (tools/util, included by a CUTLASS header, stays).
    remove "$d" "CUTLASS profiler/library sources" tilelang/3rdparty/cutlass/tools/library tilelang/3rdparty/cutlass/tools/profiler
    remove "$d" "libbacktrace sources" tvm_ffi/3rdparty/libbacktrace
    # TileLang's own C++ compiler sources (*.cc, CMakeLists.txt), built into libtilelang.so. The
    # headers in tilelang/src stay: it is TL_TEMPLATE_PATH, the include root of the JIT kernels.
    local cc bytes
    cc=$(cd "$d" && find tilelang/src \( -name '*.cc' -o -name CMakeLists.txt \) -type f | sort)
    bytes=$(cd "$d" && echo "$cc" | xargs stat -c %s | awk '{s += $1} END {print s + 0}')
    (cd "$d" && echo "$cc" | xargs rm -f)
    printf '  - %-9s %s: %s files tilelang/src/**/*.cc, CMakeLists.txt\n' "$(mib "$bytes")" "TileLang C++ sources" "$(echo "$cc" | wc -l)"
    # libz3.so and libz3.so.4.15 are the same file (dedup links them afterwards); its static
    # symbol table goes (z3's Python API and libtvm_compiler.so use its dynamic symbols only).
    strip_static "$d" z3/lib/libz3.so.4.15
    strip_static "$d" z3/lib/libz3.so
}

# Static checks of a slim tree (Python 3.12 modules cannot be imported here): every NEEDED library
# of every ELF file is in the set or is a system / CUDA / torch library, and no Python file imports
# a removed top-level package. Prints the findings; fails on any.
verify_slim() {  # verify_slim NAME DIR REMOVED_MODULES...
    local name=$1 dir=$2; shift 2
    "$PY" - "$dir" "$@" <<'PYEOF'
import os, re, subprocess, sys
root, removed = sys.argv[1], sys.argv[2:]
system = re.compile(r"^(libc|libm|libdl|librt|libpthread|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|"
                    r"libcuda|libcudart|libnvrtc|libnvJitLink|libcublas|libcublasLt|libcudnn|libnccl|"
                    r"libtorch|libtorch_cpu|libtorch_cuda|libtorch_python|libc10|libc10_cuda|libpython3)[.\w-]*\.so")
names, elves, problems = set(), [], []
for dp, _, fn in os.walk(root):
    for f in fn:
        p = os.path.join(dp, f)
        names.add(f)
        if not os.path.islink(p):
            with open(p, "rb") as h:
                if h.read(4) == b"\x7fELF" and (".so" in f or os.access(p, os.X_OK)):
                    elves.append(p)
for p in elves:
    out = subprocess.run(["readelf", "-d", p], capture_output=True, text=True).stdout
    for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out):
        if lib not in names and not system.match(lib):
            problems.append(f"{os.path.relpath(p, root)} needs {lib}: not in the set")
imp = re.compile(r"^\s*(?:from\s+(\S+)\s+import|import\s+([\w.]+))", re.M)
for dp, _, fn in os.walk(root):
    for f in fn:
        if f.endswith(".py"):
            text = open(os.path.join(dp, f), encoding="utf-8", errors="replace").read()
            for a, b in imp.findall(text):
                top = (a or b).split(".")[0]
                if top in removed:
                    problems.append(f"{os.path.relpath(os.path.join(dp, f), root)} imports {a or b} (removed)")
print(f"  verify: {len(elves)} ELF files, NEEDED resolved; {'no' if not problems else len(problems)} problems"
      + (f" (imports of {', '.join(removed)} checked)" if removed else ""))
for p in problems:
    print("  PROBLEM:", p)
sys.exit(1 if problems else 0)
PYEOF
}

# TileLang's example DeepSeek V3.2 indexer files (not in the wheel) at TILELANG_EXAMPLES_REF of the
# mirror, into DIR/tilelang_examples: deepseek_v32/{fp8_lighting_indexer,topk_selector,utils}.py and
# README.md, the repository's LICENSE, and PEERS_COMMITS ("tilelang <commit>", then the blob of each
# file). bench/peers/registry.py loads deepseek_v32/ by path (fp8_lighting_indexer.py imports its
# sibling `utils`).
tilelang_examples() {  # tilelang_examples DIR
    local dir=$1/tilelang_examples commit f paths=()
    if [ "${PEERS_TL_EXAMPLES:-1}" = 0 ]; then
        echo "tilelang: TileLang examples left out (PEERS_TL_EXAMPLES=0): peer tilelang_fp8_example will be absent"
        return 0
    fi
    [ -d "$TILELANG_MIRROR" ] || { echo "tilelang: no mirror at $TILELANG_MIRROR (use the fetch tool on github:tile-ai/tilelang; PEERS_TL_EXAMPLES=0 stages the set without the examples)"; return 1; }
    commit=$(git --git-dir="$TILELANG_MIRROR" rev-parse --verify -q "$TILELANG_EXAMPLES_REF^{commit}") \
        || { echo "tilelang: $TILELANG_EXAMPLES_REF is not a commit of $TILELANG_MIRROR"; return 1; }
    for f in "${TILELANG_EXAMPLE_FILES[@]}"; do paths+=("examples/deepseek_v32/$f"); done
    rm -rf "$dir"; mkdir -p "$dir"
    git --git-dir="$TILELANG_MIRROR" archive "$commit" LICENSE "${paths[@]}" | tar -x -C "$dir"
    mv "$dir/examples/deepseek_v32" "$dir/deepseek_v32"
    rmdir "$dir/examples"
    {
        echo "tilelang $commit"
        git --git-dir="$TILELANG_MIRROR" ls-tree "$commit" LICENSE "${paths[@]}" | awk '{print "blob", $3, $4}'
    } > "$dir/PEERS_COMMITS"
    # The Python files must at least parse (they are imported on the GPU machine only).
    "$PY" -c 'import ast, sys
for f in sys.argv[1:]:
    ast.parse(open(f, encoding="utf-8").read(), f)' "$dir"/deepseek_v32/*.py
    echo "tilelang: examples/deepseek_v32 of tile-ai/tilelang $commit: ${TILELANG_EXAMPLE_FILES[*]}," \
         "LICENSE ($(du -sh "$dir" | cut -f1)) in ${dir#"$1"/}"
}

if [ -n "$EXAMPLES_INTO" ]; then
    mkdir -p "$EXAMPLES_INTO"
    tilelang_examples "$EXAMPLES_INTO"
    exit 0
fi
mkdir -p "$STAGE" "$WORK"

site() {  # site NAME PACKAGES...: pip install for CPython 3.12 x86_64 into a --target folder, then pack
    local name=$1; shift
    local dir=$WORK/site-$name tree
    if [ -n "${PEERS_REUSE:-}" ] && [ -d "$dir" ]; then
        echo "$name: re-using $dir (PEERS_REUSE)"
    else
        rm -rf "$dir"
        "$PY" -m pip install --quiet --no-deps --only-binary=:all: --ignore-requires-python \
            --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --target "$dir" "$@"
        # Compiled caches and console scripts are not needed on the GPU machine.
        find "$dir" -name __pycache__ -type d -prune -exec rm -rf {} +
        rm -rf "${dir:?}/bin"
    fi
    echo "$name: $(du -sh "$dir" | cut -f1) installed: $*"
    tree=$dir
    if [ "$SLIM" = 1 ]; then
        # A hard-linked copy: the installed tree stays as pip made it (PEERS_REUSE).
        tree=$WORK/slim-$name
        rm -rf "$tree"; cp -al "$dir" "$tree"
        echo "$name: slim:"
        "slim_$name" "$tree"
        dedup "$tree"
        case $name in
            cudnn) verify_slim "$name" "$tree" iket ;;
            *) verify_slim "$name" "$tree" ;;
        esac
        echo "$name: $(du -sh "$tree" | cut -f1) after slimming"
    fi
    if [ "$name" = tilelang ]; then
        tilelang_examples "$tree"
    fi
    pack "$name" "$tree"
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

# The TileLang example step needs the mirror: find out now, not after 20 minutes of installing and slimming.
for s in "${SETS[@]}"; do
    if [ "$s" = tilelang ] && [ "${PEERS_TL_EXAMPLES:-1}" != 0 ]; then
        mkdir -p "$WORK/examples-check"; tilelang_examples "$WORK/examples-check"
        rm -rf "$WORK/examples-check"
    fi
done

for s in "${SETS[@]}"; do
    case $s in
        cudnn) site cudnn "${CUDNN_PKGS[@]}" ;;
        tilelang) site tilelang "${TILELANG_PKGS[@]}" ;;
        flashmla) flashmla ;;
        *) echo "unknown set '$s' (known: cudnn tilelang flashmla; options --slim (default), --full)"; exit 2 ;;
    esac
done

# MANIFEST: name, bytes and sha256 of every part, so that scripts/peers_gpu.sh knows when a set is complete.
# (`|| continue`, not `&&`: an unmatched glob must not end the loop with status 1 under set -e.)
(cd "$STAGE" && for f in *.tar.xz *.tar.xz.part*; do
    [ -e "$f" ] || continue
    echo "$f $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
done) > "$STAGE/MANIFEST"

echo "parts in $STAGE (each <= $PART_MIB MiB; carry MANIFEST with every device call):"
total=0
for f in "$STAGE"/*.tar.xz*; do
    [ -e "$f" ] || continue
    size=$(stat -c %s "$f"); total=$((total + size))
    printf '  %-32s %s\n' "$(basename "$f")" "$(mib "$size")"
done
printf '  %-32s %s\n' total "$(mib "$total")"
