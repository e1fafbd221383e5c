#!/usr/bin/env bash
# Proves that a refactor left the device code alone: compiles every CUDA translation unit of
# csrc/sm90 and tests/cuda at BASE_REV and in the working tree to sm_90a cubins, dumps the SASS and
# the resource usage (registers, shared memory, stack) of every kernel, and diffs them kernel by
# kernel.
#
#   scripts/sass_diff.sh [BASE_REV]     (default HEAD; run from anywhere inside the repository)
#
# Kernels are matched by translation unit and demangled name. Normalised away: the "/*0a30*/"
# address comments and symbol names inside instructions (so that renaming a namespace is neutral);
# everything else, including each instruction's encoding, must be identical. Also fails if ptxas
# reports a spill (-Xptxas -v) in the working tree.
#
# Environment: NVCC (default nvcc), CUOBJDUMP (default: cuobjdump on PATH, else triton's copy),
# JOBS (parallel nvcc processes, default 2), SASS_CACHE (default ${TMPDIR:-/tmp}/flashdsa_sass;
# the base revision's dumps are cached there by commit and flags), NVCC_EXTRA (extra nvcc flags for
# both sides, e.g. -DFLASHDSA_BWD_NO_DKV=1 to compare a compile-time variant), ONLY (an extended
# regular expression: only the translation units whose path matches, e.g. ONLY=sparse_mla_bwd).
# Exit: 0 no kernel changed, 1 a kernel changed / appeared / vanished or a spill, 2 a build failed.
set -euo pipefail

BASE_REV=${1:-HEAD}
ROOT=$(git rev-parse --show-toplevel)
BASE_SHA=$(git -C "$ROOT" rev-parse --verify "${BASE_REV}^{commit}")
NVCC=${NVCC:-nvcc}
JOBS=${JOBS:-2}
CACHE=${SASS_CACHE:-${TMPDIR:-/tmp}/flashdsa_sass}
if [[ -z "${CUOBJDUMP:-}" ]]; then
  CUOBJDUMP=$(command -v cuobjdump || true)
  if [[ -z "$CUOBJDUMP" ]]; then
    CUOBJDUMP=$(python3 - <<'PY' 2>/dev/null || true
import os, triton
print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))
PY
)
  fi
fi
[[ -x "$CUOBJDUMP" ]] || { echo "sass_diff: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
FLAGS=(-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
       -Xptxas -v -Iinclude -Icsrc -Itests/cuda ${NVCC_EXTRA:-})

# dump SRC_DIR OUT_DIR: one <tu>.sass (+ .res, .ptxas) per translation unit.
dump() {
  local src=$1 out=$2
  mkdir -p "$out"
  local tus
  tus=$(cd "$src" && find csrc/sm90 tests/cuda -name '*.cu' 2>/dev/null | sort | grep -E "${ONLY:-.}")
  printf '%s\n' $tus > "$out/tus.txt"
  local failed=0
  # shellcheck disable=SC2016
  printf '%s\n' $tus | xargs -P "$JOBS" -I{} bash -c '
    tu={}; key=$(echo "$tu" | tr / _)
    cd "$1" || exit 1
    if ! "$2" "${@:5}" -cubin -o "$3/$key.cubin" "$tu" > "$3/$key.ptxas" 2>&1; then
      echo "sass_diff: nvcc failed on $tu in $1 (log $3/$key.ptxas)" >&2; exit 1; fi
    "$4" -sass "$3/$key.cubin" 2>/dev/null > "$3/$key.sass"
    "$4" -res-usage "$3/$key.cubin" > "$3/$key.res" 2>&1
  ' _ "$src" "$NVCC" "$out" "$CUOBJDUMP" "${FLAGS[@]}" || failed=1
  return $failed
}

# The cache key: the base commit and the flags (NVCC_EXTRA builds a variant, e.g. -DFLASHDSA_BWD_NO_DKV=1).
FLAGS_KEY=$(printf '%s ' "$NVCC" "${FLAGS[@]}" "${ONLY:-.}" | sha1sum | cut -c1-12)
BASE_DIR=$CACHE/$BASE_SHA-$FLAGS_KEY
if [[ ! -f "$BASE_DIR/done" ]]; then
  echo "sass_diff: building base $BASE_REV ($BASE_SHA)"
  rm -rf "$BASE_DIR"; mkdir -p "$BASE_DIR/src"
  git -C "$ROOT" archive "$BASE_SHA" include csrc tests/cuda tests/cpp | tar -x -C "$BASE_DIR/src"
  dump "$BASE_DIR/src" "$BASE_DIR/dump" || exit 2
  touch "$BASE_DIR/done"
fi
WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/flashdsa_sass_work.XXXXXX")
trap 'rm -rf "$WORK_DIR"' EXIT
echo "sass_diff: building working tree $ROOT"
dump "$ROOT" "$WORK_DIR" || exit 2

python3 - "$BASE_DIR/dump" "$WORK_DIR" "$BASE_REV" <<'PY'
import os, re, subprocess, sys

base_dir, work_dir, base_rev = sys.argv[1:4]
FUNC = re.compile(r"^\s*Function : (\S+)")
ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
MANGLED = re.compile(r"\b_Z\w+")

def demangle(names):
    names = sorted(set(names))
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))

def strip_ns(name):
    # Drops namespace qualifiers (a::(anonymous namespace)::f<...>(...) -> f<...>(...)).
    return re.sub(r"(?:\(anonymous namespace\)::|\b[A-Za-z_]\w*::)+", "", name)

def kernels(d):
    """{(tu, canonical kernel name): (sass lines, resource line)} for one dump folder."""
    result, spills = {}, []
    tus = [t for t in open(os.path.join(d, "tus.txt")).read().split() if t]
    for tu in tus:
        key = tu.replace("/", "_")
        text = open(os.path.join(d, key + ".sass")).read()
        names = demangle(MANGLED.findall(text) + FUNC.findall(text))
        full = lambda m: names.get(m, m)
        canon = lambda m: strip_ns(full(m))
        cur, body = None, []
        funcs = {}
        for line in text.splitlines():
            m = FUNC.match(line)
            if m:
                if cur: funcs[cur] = body
                cur, body = full(m.group(1)), []
                continue
            if cur is None or not line.strip():
                continue
            line = ADDR.sub("", line)
            line = MANGLED.sub(lambda mm: canon(mm.group(0)), line)
            body.append(" ".join(line.split()))
        if cur: funcs[cur] = body
        res = {}
        rtext = open(os.path.join(d, key + ".res")).read()
        rnames = demangle(re.findall(r"Function (\S+?):", rtext))
        lines = rtext.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*Function (\S+?):", line)
            if m and i + 1 < len(lines):
                res[rnames.get(m.group(1), m.group(1))] = " ".join(lines[i + 1].split())
        for f, body in funcs.items():
            assert (tu, f) not in result, f"two kernels named {f} in {tu}"
            result[(tu, f)] = (body, res.get(f, "?"))
        for line in open(os.path.join(d, key + ".ptxas")):
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and (m.group(1) != "0" or m.group(2) != "0"):
                spills.append(f"{tu}: {line.strip()}")
    return result, spills

base, _ = kernels(base_dir)
work, spills = kernels(work_dir)
# A kernel whose namespace changed: pair the unmatched ones by their unqualified names.
def unmatched(a, b):
    left = {}
    for (tu, f) in set(a) - set(b):
        left.setdefault((tu, strip_ns(f)), []).append((tu, f))
    return {k: v[0] for k, v in left.items() if len(v) == 1}
gone, new = unmatched(base, work), unmatched(work, base)
for k in set(gone) & set(new):
    base[new[k]] = base.pop(gone[k])
changed, rows = 0, []
for k in sorted(set(base) | set(work)):
    tu, f = k
    short = f if len(f) < 90 else f[:87] + "..."
    if k not in work:
        rows.append(("GONE", tu, short, "")); changed += 1; continue
    if k not in base:
        rows.append(("NEW", tu, short, "")); changed += 1; continue
    (bs, br), (ws, wr) = base[k], work[k]
    if bs != ws or br != wr:
        n = sum(1 for a, b in zip(bs, ws) if a != b) + abs(len(bs) - len(ws))
        why = f"{n} SASS lines differ" if bs != ws else ""
        if br != wr: why += f" resources {br} -> {wr}"
        rows.append(("CHANGED", tu, short, why)); changed += 1
    else:
        rows.append(("same", tu, short, f"{len(ws)} lines; {wr}"))
print(f"\nSASS diff against {base_rev}: {len(rows)} kernels")
for st, tu, f, why in rows:
    print(f"  {st:8s} {tu:45s} {f}\n           {why}")
for s in spills:
    print("  SPILL   ", s)
print(f"\nsass_diff: {len(rows) - changed} kernels identical, {changed} changed/new/gone, "
      f"{len(spills)} spill reports")
sys.exit(1 if changed or spills else 0)
PY
