#!/usr/bin/env python3
"""Static SASS instruction counts of the sparse MLA backward main kernel's key-block loops, per role.

Usage: python3 scripts/bwd_sass_counts.py OBJ_OR_CUBIN [more ...]   (or .sass text, or a linked binary)
  e.g. python3 scripts/bwd_sass_counts.py build-bwddesc/bwd_main build-bwddesc/bwd_ab   (an A/B pair from
  scripts/bwd_gpu.sh AB_FLAGS=...: one block of rows per file, headed by its path)

For both instances of sparse_mla_bwd_main_kernel (main: the fast mode, det: the deterministic mode) it lists each loop (a
backward branch whose body has no EXIT, >= 40 instructions; scripts/fwd_sass_counts.py's loop finder) with
its total and a breakdown by opcode class, and a role label from the loop's content:
  prologue   17 copies (one Q row + one dO row), no HGMMA: the once-per-CTA Q / dO loop,
  producer   LDGSTS and no HGMMA (WG2: the kv gather),
  front      first HGMMA a 64x64 S without transposes (WG0),
  back       first HGMMA a 64x256 (WG1: its dQ GEMM comes first) or transposed (a dKV chunk).
The counts are per thread and per key block of the common path plus the out-of-line branches that sit
inside the loop's address range (mass output, sweep), i.e. an upper bound of the common path.
(The v1 / v2 kernels that this script also labelled were removed on 2026-12-02; their counts are in
docs/kernels/sparse_mla_bwd.md.)
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_sass_counts as f  # noqa: E402

CLASSES = f.CLASSES[:12] + [("RED", ("RED",))] + f.CLASSES[12:]  # RED: the dkv / mass / counter reductions


def tag_of(name):
    if "sparse_mla_bwd_main_kernel" not in name:
        return None
    return "main" if "ILb0E" in name else "det" if "ILb1E" in name else None


def role(tag, body):
    ops = [op for _, op, _ in body]
    hg = [(op, args) for _, op, args in body if op.startswith("HGMMA")]
    if not hg:
        copies = sum(op.startswith(("LDGSTS", "LDG.E.NA.128")) for op in ops)
        if copies == 17:  # one Q row (9 pieces) + one dO row (8): the per-CTA prologue loop
            return "prologue"
        return "producer" if copies else "other"
    op, args = hg[0]
    if "tnspA" in args or op.startswith("HGMMA.64x256"):
        return "back"
    return "front"


def main(paths):
    cols = [c for c, _ in CLASSES] + ["other"]
    print("%-4s %-9s %-11s %6s  %s" % ("ker", "role", "range", "total", "  ".join(cols)))
    for path in paths:
        if len(paths) > 1:
            print("== %s" % path)
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
