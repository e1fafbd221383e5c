#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from an Nsight Compute report's source page.

On the GPU machine, profile one launch with the warp-state sampling sections and export the source page::

    ncu --section WarpStateStats --section SourceCounters -k regex:indexer_topk_v2 -s 1 -c 1 -o OUT/itk \\
        build/indexer_topk_check --bench-only --bench-T 32768 --bench-H 32
    ncu -i OUT/itk.ncu-rep --page source --csv --print-source sass > OUT/itk_sass.csv

then, anywhere (no GPU, no ncu needed)::

    python3 scripts/ncu_source_stalls.py OUT/itk_sass.csv --top 40

It prints the total of the warp-state samples, the share of each stall reason over the whole kernel, and the
instructions with the most samples (address, SASS text, times executed, their three largest stall reasons).
This is how docs/kernels/indexer_topk.md located the indexer's per-tile barrier and wgmma waits (2026-12-03).
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
from typing import Dict, List, Sequence, Tuple

SAMPLES = "Warp Stall Sampling (All Samples)"


def parse(lines: Sequence[str]) -> Tuple[str, List[dict]]:
    """(kernel name, rows) of an `ncu --page source --csv` export: one dict per SASS instruction with the
    address, the source text, the sample count, the execution count and the per-reason stall samples."""
    rows = list(csv.reader(lines))
    kernel = ""
    start = 0
    for i, r in enumerate(rows):
        if r and r[0] == "Kernel Name" and len(r) > 1:
            kernel = r[1]
        if r and r[0] == "Address":
            start = i
            break
    else:
        raise ValueError("no 'Address' header row: not an ncu source-page CSV")
    hdr = rows[start]
    col = {h: i for i, h in enumerate(hdr)}
    if SAMPLES not in col:
        raise ValueError(f"no '{SAMPLES}' column: profile with --section WarpStateStats --section SourceCounters")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(hdr) or not r[col[SAMPLES]].strip().isdigit():
            continue
        executed = r[col["Instructions Executed"]] if "Instructions Executed" in col else "0"
        out.append({
            "address": r[col["Address"]],
            "source": r[col["Source"]].strip() if "Source" in col else "",
            "samples": int(r[col[SAMPLES]]),
            "executed": int(executed) if executed.strip().isdigit() else 0,
            "stalls": {h[len("stall_"):]: int(r[col[h]]) if r[col[h]].strip().isdigit() else 0 for h in reasons},
        })
    return kernel, out


def summarise(rows: List[dict], top: int) -> str:
    total = sum(r["samples"] for r in rows)
    if total == 0:
        return "no samples\n"
    by_reason: Dict[str, int] = collections.Counter()
    for r in rows:
        by_reason.update(r["stalls"])
    lines = [f"total samples {total}"]
    for name, n in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        if n:
            lines.append(f"  {name:22s} {n:10d} {100.0 * n / total:5.1f}%")
    lines.append(f"top {top} instructions by samples:")
    for r in sorted(rows, key=lambda r: -r["samples"])[:top]:
        worst = sorted(r["stalls"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"{100.0 * r['samples'] / total:6.2f}% {r['address']:>16s}  {r['source'][:58]:58s} "
                     f"executed {r['executed']:>10d}  " + " ".join(f"{k}={v}" for k, v in worst if v))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass export")
    ap.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        kernel, rows = parse(f.read().splitlines())
    if kernel:
        print(f"kernel: {kernel}")
    sys.stdout.write(summarise(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
