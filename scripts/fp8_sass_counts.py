#!/usr/bin/env python3
"""Static SASS counts of the fused indexer + top-k kernels (bf16 and FP8), per loop.

Usage: python3 scripts/fp8_sass_counts.py KERNEL.cubin [more.cubin ...]   (or .sass text)

For every instance of the bf16 kernel (indexer_topk_v2_kernel, kernel_v2.cuh) and of
indexer_topk_fp8_kernel it lists each loop (a backward branch, body without EXIT, >= 40
instructions) with its instruction count by opcode class (the classes of scripts/fwd_sass_counts.py).
The key walk's steady-state loop is the one holding HGMMA / QGMMA instructions: its counts are the
per-tile SASS of one warp (bf16: its warpgroup's 128 columns and their appends; FP8: both column
halves and the appends of the previous tile). The compaction is out of line behind a branch and
counted only if the body contains it. (The first bf16 kernel, indexer_topk_kernel, is matched too,
for cubins of older revisions.)
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_sass_counts as f  # noqa: E402

CLASSES = [("HGMMA", ("HGMMA", "QGMMA"))] + f.CLASSES[1:]  # QGMMA: the e4m3 wgmma


def functions(text):
    """{mangled name: [(address, opcode, operands)]} of the indexer top-k kernels (bf16 and FP8)."""
    tags = ("indexer_topk_v2_kernel", "indexer_topk_fp8_kernel", "indexer_topk_kernel")
    return f.functions_by_tag(text, lambda name: name if any(t in name for t in tags) else None)


def main(paths):
    cols = [c for c, _ in CLASSES] + ["other"]
    print("%-70s %-13s %6s  %s" % ("kernel", "loop range", "total", "  ".join(cols)))
    for path in paths:
        for name, instrs in sorted(functions(f.sass_text(path)).items()):
            short = name.replace("_ZN8flashdsa4sm9017indexer_topk_impl", "")[:70]
            print("%-70s %-13s %6d  (whole kernel)" % (short, "-", len(instrs)))
            for body in f.loops(instrs):
                c = collections.Counter(f.classify(op, CLASSES) for _, op, _ in body)
                if not c["HGMMA"]:
                    continue
                rng = "%x-%x" % (body[0][0], body[-1][0])
                print("%-70s %-13s %6d  %s" % (short, rng, len(body), "  ".join("%*d" % (len(k), c[k]) for k in cols)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
