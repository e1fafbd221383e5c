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

A report file itself (``.ncu-rep``, e.g. from ``ncu --set full -o``) is read directly with NVIDIA's report
interface (PyPI ``ncu-report``, pinned: ``pip install ncu-report==2026.3.1`` in any venv; no GPU, no ncu CLI)::

    python3 scripts/ncu_source_stalls.py OUT/bwd8192.ncu-rep --top 30 \
        --roles csrc/sm90/sparse_mla_bwd/main_kernel.cuh=load_q_do:prologue,produce:producer,front:front,back:back

``--roles`` (report files only: they carry each instruction's source line) splits the samples by warp role of a
warp-specialised kernel: an instruction whose line lies in one of the named functions of that source file sets the
current role, and the instructions that follow in address order (inlined helpers from other files) inherit it. Each
role's warps are sampled in proportion to their resident time, so a role's shares are where its warps spend their
time (e.g. 21% of the front's samples at its kv_full wait = the front waits for the gather 21% of the time). The
source file must be the version the profiled binary was built from (``git show REV:path > file``).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

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


STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


def load_report(path: str, kernel_regex: str = "") -> Tuple[str, List[dict]]:
    """(kernel name, rows) of the first profiled launch in an ``.ncu-rep`` whose name matches kernel_regex: the
    same rows as parse(), plus "location" ("file:line" of the instruction, "" without line info), addresses
    relative to the kernel's first sampled instruction."""
    try:
        import ncu_report  # NVIDIA's report interface (PyPI ncu-report)
    except ImportError as e:
        raise SystemExit("reading a .ncu-rep needs NVIDIA's report interface: pip install ncu-report==2026.3.1") from e
    report = ncu_report.load_report(path)
    action = None
    for ri in range(report.num_ranges()):
        rng = report.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            a = rng.action_by_idx(ai)
            if re.search(kernel_regex, a.name()):
                action = a
                break
        if action is not None:
            break
    if action is None:
        raise ValueError(f"no profiled kernel matches {kernel_regex!r} in {path}")
    per: Dict[int, Dict[str, int]] = collections.defaultdict(dict)
    names = [n for n in action.metric_names() if n.startswith(STALL_PREFIX) and not n.endswith("_not_issued")]
    for name in names + ["smsp__pcsamp_sample_count", "sass__inst_executed"]:
        m = action.metric_by_name(name)
        if m is None or not m.has_correlation_ids():
            continue
        ids = m.correlation_ids()
        key = name[len(STALL_PREFIX):] if name.startswith(STALL_PREFIX) else name
        for i in range(m.num_instances()):
            per[ids.as_uint64(i)][key] = m.as_uint64(i)
    if not per:
        raise ValueError(f"{path}: no per-instruction samples (profile with the SourceCounters section)")
    base = min(per)
    rows = []
    for pc in sorted(per):
        d = per[pc]
        info = action.source_info(pc)
        loc = f"{info.file_name().rsplit('/', 1)[-1]}:{info.line()}" if info is not None else ""
        rows.append({
            "address": f"{pc - base:#07x}",
            "source": action.sass_by_pc(pc),
            "samples": d.get("smsp__pcsamp_sample_count", 0),
            "executed": d.get("sass__inst_executed", 0),
            "stalls": {k: v for k, v in d.items() if k not in ("smsp__pcsamp_sample_count", "sass__inst_executed")},
            "location": loc,
        })
    return action.name(), rows


def function_ranges(source: str, functions: Sequence[str]) -> Dict[str, Tuple[int, int]]:
    """1-based [first, last] line of each named function in a C++ source: from the line of its definition (the
    name followed by '(' on a line that is not a call, i.e. the line holds a return type or a declarator at
    column 0) to the line before the next top-level definition or the end."""
    lines = source.splitlines()
    starts = []  # (line, name or "") of every top-level definition
    for i, line in enumerate(lines, 1):
        if not line or line[0].isspace() or line.startswith(("//", "#", "}", "{")):
            continue
        m = re.search(r"(\w+)\s*\(", line)
        if m and not line.rstrip().endswith(";"):
            starts.append((i, m.group(1)))
    out = {}
    for k, (line, name) in enumerate(starts):
        if name in functions and name not in out:
            end = starts[k + 1][0] - 1 if k + 1 < len(starts) else len(lines)
            out[name] = (line, end)
    missing = [f for f in functions if f not in out]
    if missing:
        raise ValueError(f"no top-level definition of {missing}")
    return out


def attribute_roles(rows: List[dict], file_name: str, ranges: Dict[str, Tuple[int, int]],
                    roles: Dict[str, str]) -> List[Optional[str]]:
    """The role of each row (rows in address order): set by a row located in file_name inside the line range of
    a function mapped to that role, inherited by the rows after it; None before the first such row."""
    out: List[Optional[str]] = []
    cur: Optional[str] = None
    for r in rows:
        fname, _, line = r.get("location", "").rpartition(":")
        if fname == file_name and line.isdigit():
            for func, role in roles.items():
                lo, hi = ranges[func]
                if lo <= int(line) <= hi:
                    cur = role
                    break
        out.append(cur)
    return out


def summarise_roles(rows: List[dict], row_roles: List[Optional[str]], top: int) -> str:
    """Per role: its share of all samples, its stall reasons, its source lines and instructions with the most
    samples (shares of the role's own samples)."""
    total = sum(r["samples"] for r in rows)
    order: List[str] = []
    for role in row_roles:
        if role is not None and role not in order:
            order.append(role)
    lines = []
    for role in order + [None]:
        mine = [r for r, k in zip(rows, row_roles) if k == role]
        n = sum(r["samples"] for r in mine)
        if n == 0:
            continue
        reasons: Dict[str, int] = collections.Counter()
        by_loc: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in mine:
            reasons.update(r["stalls"])
            by_loc[r.get("location", "")].update(r["stalls"])
        lines.append(f"== {role or '(before any role)'}: {n} samples, {100.0 * n / max(total, 1):.1f}% of all")
        lines.append("   reasons: " + ", ".join(f"{k} {100.0 * v / n:.1f}%" for k, v in reasons.most_common(6) if v))
        for loc, c in sorted(by_loc.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
            s = sum(c.values())
            lines.append(f"   {loc or '?':32s} {100.0 * s / n:5.1f}%  " +
                         " ".join(f"{k}={100.0 * v / n:.1f}" for k, v in c.most_common(3) if v))
        for r in sorted(mine, key=lambda r: -r["samples"])[:min(top, 5)]:
            lines.append(f"     {100.0 * r['samples'] / n:5.1f}% {r['address']} {r.get('location', ''):28s} "
                         f"{r['source'].strip()[:64]}")
    return "\n".join(lines) + "\n"


def parse_roles(spec: str) -> Tuple[str, Dict[str, str]]:
    """'path=func:role,func:role' -> (path, {func: role})."""
    path, _, pairs = spec.partition("=")
    roles = {}
    for item in filter(None, pairs.split(",")):
        func, _, role = item.partition(":")
        if not func or not role:
            raise ValueError(f"--roles item {item!r} is not func:role")
        roles[func] = role
    if not path or not roles:
        raise ValueError("--roles needs path=func:role[,func:role...]")
    return path, roles


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="ncu --page source --csv --print-source sass export, or a .ncu-rep report")
    ap.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    ap.add_argument("--kernel", default="", help="regex of the kernel name in a .ncu-rep (default: the first)")
    ap.add_argument("--roles", default="", help="report files: SOURCE=func:role[,func:role...] (see above)")
    args = ap.parse_args(argv)
    if args.input.endswith(".ncu-rep"):
        kernel, rows = load_report(args.input, args.kernel)
    else:
        if args.roles:
            raise SystemExit("--roles needs a .ncu-rep report (the CSV export has no source lines)")
        with open(args.input, newline="") as f:
            kernel, rows = parse(f.read().splitlines())
    if kernel:
        print(f"kernel: {kernel}")
    if args.roles:
        path, roles = parse_roles(args.roles)
        with open(path) as f:
            ranges = function_ranges(f.read(), list(roles))
        sys.stdout.write(summarise_roles(rows, attribute_roles(rows, path.rsplit("/", 1)[-1], ranges, roles),
                                         args.top))
    else:
        sys.stdout.write(summarise(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
