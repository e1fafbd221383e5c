#!/usr/bin/env python3
"""Static SASS instruction counts of the sparse MLA forward's steady-state loops, per role.

Usage: python3 scripts/fwd_sass_counts.py KERNEL.cubin [more.cubin ...]   (or a .sass text file)

Disassembles each cubin with cuobjdump -sass (found on PATH, next to nvcc, or in triton's bundle),
finds every loop (a backward branch whose body has no EXIT) of the sparse_mla_fwd kernel with at least 40 instructions and
labels it: "producer" (contains LDGSTS), "consumer0" (first wgmma of the body is a 64x256 PV:
the odd PV of the previous pair, issued at the top of consumer 0's pair), "consumer1" (first wgmma
is a 64x64 S). Spin-wait retry stubs live out of line, so a loop body counts each wait once.
Prints one row per (cubin, kernel instance, loop): total instructions and a breakdown by opcode class.
"""
import collections
import os
import re
import shutil
import subprocess
import sys

CLASSES = [  # (label, opcode prefixes); first match wins
    ("HGMMA", ("HGMMA",)),
    ("wgmma-sync", ("WARPGROUP",)),
    ("FMUL", ("FMUL",)),
    ("FFMA", ("FFMA",)),
    ("FADD", ("FADD",)),
    ("FMNMX", ("FMNMX",)),
    ("FSEL", ("FSEL",)),
    ("MUFU", ("MUFU",)),
    ("F2FP", ("F2FP",)),
    ("SHFL", ("SHFL",)),
    ("LDS", ("LDS", "LDSM")),
    ("STS", ("STS", "STSM")),
    ("LDGSTS", ("LDGSTS",)),
    ("LDG", ("LDG",)),
    ("STG", ("STG",)),
    ("SYNCS", ("SYNCS",)),
    ("int", ("IMAD", "IADD", "LEA", "LOP", "SHF", "ISETP", "SEL", "IABS", "IMNMX", "PRMT", "R2P", "P2R",
             "PLOP3", "VOTE", "POPC", "FLO", "BMSK", "SGXT")),
    ("mov", ("MOV", "S2R", "CS2R", "S2UR", "R2UR", "UMOV", "ULDC", "UIADD3", "ULOP3", "USHF", "UIMAD",
             "ULEA", "USEL", "UISETP", "UPRMT", "UFLO", "UPOPC", "VOTEU")),
    ("branch", ("BRA", "BSSY", "BSYNC", "WARPSYNC", "NOP", "EXIT", "BAR", "MEMBAR", "FENCE", "DEPBAR", "YIELD",
                "ELECT", "CCTL", "ERRBAR")),
]

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.x]+)([^;]*);")


def find_cuobjdump():
    for cand in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump",
                 "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump"):
        if cand and os.path.exists(cand):
            return cand
    sys.exit("cuobjdump not found")


def sass_text(path):
    if path.endswith(".sass") or path.endswith(".txt"):
        return open(path).read()
    return subprocess.run([find_cuobjdump(), "-sass", path], check=True, capture_output=True, text=True).stdout


def functions_by_tag(text, tag_of):
    """{tag: [(address, opcode, operands)]} for each function whose mangled name tag_of maps to a tag
    (None: skip the function)."""
    funcs, cur = {}, None
    for line in text.splitlines():
        if "Function :" in line:
            tag = tag_of(line.split("Function :")[1].strip())
            cur = None if tag is None else funcs.setdefault(tag, [])
            continue
        if cur is None:
            continue
        m = LINE.search(line)
        if m:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return funcs


def kernel_functions(text):
    """{kernel tag: [(address, opcode, operands)]} for each instance of the forward kernel (FlashMLA's
    sparse_attn_fwd_kernel too, for comparison). Tag: 'fused' / 'plain' for our kernel's
    kFusedScale = true / false instance, 'kernel' otherwise."""
    def tag_of(name):
        if "sparse_mla_fwd_kernel" not in name and "sparse_attn_fwd_kernel" not in name:
            return None
        return "fused" if "kernelILb1E" in name else "plain" if "kernelILb0E" in name else "kernel"
    return functions_by_tag(text, tag_of)


def classify(op, classes=None):
    for label, prefixes in classes or CLASSES:
        if op.startswith(prefixes):
            return label
    return "other"


def loops(instrs):
    addr_index = {a: i for i, (a, _, _) in enumerate(instrs)}
    found = []
    for i, (a, op, args) in enumerate(instrs):
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", args)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < a and target in addr_index and i - addr_index[target] + 1 >= 40:
            body = instrs[addr_index[target]:i + 1]
            # A spin-wait retry stub (out of line, after the EXITs) jumps back into the code: not a loop.
            if not any(op.startswith("EXIT") for _, op, _ in body):
                found.append(body)
    return found


def role(body):
    ops = [op for _, op, _ in body]
    if any(op.startswith("LDGSTS") for op in ops):
        return "producer"
    first = next((op for op in ops if op.startswith("HGMMA")), None)
    if first is None:
        return "other"
    return "consumer0" if first.startswith("HGMMA.64x256") else "consumer1"


def main(paths):
    cols = [c for c, _ in CLASSES] + ["other"]
    print("%-24s %-6s %-10s %-13s %6s  %s" % ("cubin", "kernel", "role", "range", "total", "  ".join("%s" % c for c in cols)))
    for path in paths:
        for tag, instrs in sorted(kernel_functions(sass_text(path)).items()):
            for body in loops(instrs):
                counts = collections.Counter(classify(op) for _, op, _ in body)
                rng = "%x-%x" % (body[0][0], body[-1][0])
                print("%-24s %-6s %-10s %-13s %6d  %s" % (os.path.basename(path)[:24], tag, role(body), rng, len(body),
                                                          "  ".join("%*d" % (len(c), counts[c]) for c in cols)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
