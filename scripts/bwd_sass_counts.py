#!/usr/bin/env python3
"""Static SASS instruction counts of the sparse MLA backward main kernels' key-block loops, per role.

Usage: python3 scripts/bwd_sass_counts.py OBJ_OR_CUBIN [more ...]   (or .sass text)

For every fast-mode instance (kDeterministic = false) of sparse_mla_bwd_main_kernel (v1),
sparse_mla_bwd_main_kernel_v2 and sparse_mla_bwd_main_kernel_v3 it lists each loop (a backward branch
whose body has no EXIT, >= 40 instructions; scripts/fwd_sass_counts.py's loop finder) with its total
and a breakdown by opcode class, and a role label from the loop's content:
  prologue   17 copies (one Q row + one dO row), no HGMMA: the once-per-CTA Q / dO loop,
  producer   LDGSTS and no HGMMA (v1 WG2, v3 WG2; the 16-row gather loop of v1 too),
  front      HGMMA and LDGSTS (v2: its own gather), or first HGMMA a 64x64 S / dP without transposes,
  back       first HGMMA transposed (dKV chunk, v2) or a 64x256 (v3: dQ first);
  wg0 / wg1  v1's consumers (72 / 76 HGMMA).
The counts are per thread and per key block of the common path plus the out-of-line branches that sit
inside the loop's address range (mass output, sweep), i.e. an upper bound of the common path.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_sass_counts as f  # noqa: E402

CLASSES = f.CLASSES[:12] + [("RED", ("RED",))] + f.CLASSES[12:]  # RED: the dkv / mass / counter reductions


def tag_of(name):
    if "ILb0E" not in name:
        return None
    for tag in ("main_kernel_v3", "main_kernel_v2", "main_kernel"):
        if "sparse_mla_bwd_" + tag in name:
            return {"main_kernel": "v1", "main_kernel_v2": "v2", "main_kernel_v3": "v3"}[tag]
    return None


def role(tag, body):
    ops = [op for _, op, _ in body]
    hg = [(op, args) for _, op, args in body if op.startswith("HGMMA")]
    if not hg:
        copies = sum(op.startswith(("LDGSTS", "LDG.E.NA.128")) for op in ops)
        if copies == 17:  # one Q row (9 pieces) + one dO row (8): the per-CTA prologue loop
            return "prologue"
        return "producer" if copies else "other"
    if tag == "v1":  # WG0: 72 HGMMA (S, dQ SS, dKV SS), WG1: 76 (dP, dQ RS, dKV RS)
        return "wg0" if len(hg) == 72 else "wg1"
    if any(op.startswith("LDGSTS") for op in ops):
        return "front"
    op, args = hg[0]
    if "tnspA" in args or op.startswith("HGMMA.64x256"):
        return "back"
    return "front"


def main(paths):
    cols = [c for c, _ in CLASSES] + ["other"]
    print("%-4s %-9s %-11s %6s  %s" % ("ker", "role", "range", "total", "  ".join(cols)))
    for path in paths:
        for tag, instrs in sorted(f.functions_by_tag(f.sass_text(path), tag_of).items()):
            for body in f.loops(instrs):
                c = collections.Counter(f.classify(op, CLASSES) for _, op, _ in body)
                rng = "%x-%x" % (body[0][0], body[-1][0])
                print("%-4s %-9s %-11s %6d  %s" % (tag, role(tag, body), rng, len(body),
                                                  "  ".join("%*d" % (len(k), c[k]) for k in cols)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
