#!/usr/bin/env python3
"""Profile a command's kernels with Nsight Compute and print one side-by-side table per kernel.

Made for "profile first" on the GPU machine: run our kernel and a peer's in one process (the peers A/B
of bench/run.py does exactly that), profile a window of their launches with a fixed set of sections
and metrics, and compare the kernels column by column (duration, issue, tensor pipe, L2 / DRAM traffic,
reductions into L2, warp stalls)::

    python3 scripts/ncu_compare.py --out $OUT/ncu_bwd16k --launch-skip 20 --launch-count 24 -- \\
        python3 bench/run.py --only peers --peer-kernels sparse_mla_bwd --seq-lens 16384 \\
            --peers-max-seconds 60 --out /tmp/ncu_bwd_bench

Steps: (1) ``ncu --query-metrics`` keeps the wanted raw metrics this ncu knows (an unknown name would
abort the whole profile); (2) ``ncu -o DIR/profile --section ... --metrics ... --launch-skip S
--launch-count C [-k regex:R] [--target-processes all] -- CMD``; (3) ``ncu --import ... --csv --page
details`` (and ``--page raw`` for the metrics); (4) the table: one column per kernel name (the
``--top`` longest kernels, metrics averaged over that kernel's profiled launches), written to
DIR/summary.md and DIR/summary.json and printed last.

``--from-csv DETAILS.csv`` skips steps 1-3 (re-summarise a copied report; also what the unit test
uses). Exit status: ncu's when it failed, else 0.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import OrderedDict, defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# Sections of `ncu --list-sections` present in every recent Nsight Compute (2023+).
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "WarpStateStats",
            "LaunchStats", "Occupancy", "InstructionStats")

# Raw metrics (kept only when `ncu --query-metrics` lists their base name).
RAW_METRICS = (
    "gpu__time_duration.sum",
    "sm__inst_executed.sum",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "lts__t_sectors_op_read.sum",
    "lts__t_sectors_op_write.sum",
    "lts__t_sectors_op_red.sum",
    "lts__t_sectors_op_atom.sum",
    "lts__t_sectors_op_red_lookup_hit.sum",
    "lts__t_sectors_op_red_lookup_miss.sum",
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct",
    "smsp__warp_issue_stalled_membar_per_warp_active.pct",
    "smsp__warp_issue_stalled_wait_per_warp_active.pct",
    "smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct",
)

# Rows of the table, in order: (label, metric name as the details / raw page spells it).
TABLE_ROWS = (
    ("duration", "Duration"),
    ("duration (raw)", "gpu__time_duration.sum"),
    ("SM frequency", "SM Frequency"),
    ("compute (SM) throughput", "Compute (SM) Throughput"),
    ("memory throughput", "Memory Throughput"),
    ("DRAM throughput", "DRAM Throughput"),
    ("L2 hit rate", "L2 Hit Rate"),
    ("executed IPC active", "Executed Ipc Active"),
    ("issue slots busy", "Issue Slots Busy"),
    ("executed instructions", "Executed Instructions"),
    ("tensor pipe (gmma) active", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("tensor pipe (hmma) active", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("L2 read sectors", "lts__t_sectors_op_read.sum"),
    ("L2 write sectors", "lts__t_sectors_op_write.sum"),
    ("L2 red sectors", "lts__t_sectors_op_red.sum"),
    ("L2 red sectors, hit", "lts__t_sectors_op_red_lookup_hit.sum"),
    ("L2 red sectors, miss", "lts__t_sectors_op_red_lookup_miss.sum"),
    ("L2 atom sectors", "lts__t_sectors_op_atom.sum"),
    ("L2 sector hit rate (raw)", "lts__t_sector_hit_rate.pct"),
    ("DRAM bytes read", "dram__bytes_read.sum"),
    ("DRAM bytes written", "dram__bytes_write.sum"),
    ("warp cycles per issued instruction", "Warp Cycles Per Issued Instruction"),
    ("stall long scoreboard %", "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct"),
    ("stall lg throttle %", "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct"),
    ("stall barrier %", "smsp__warp_issue_stalled_barrier_per_warp_active.pct"),
    ("stall membar %", "smsp__warp_issue_stalled_membar_per_warp_active.pct"),
    ("stall wait %", "smsp__warp_issue_stalled_wait_per_warp_active.pct"),
    ("stall math pipe throttle %", "smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct"),
    ("registers per thread", "Registers Per Thread"),
    ("block size", "Block Size"),
    ("grid size", "Grid Size"),
    ("achieved occupancy", "Achieved Occupancy"),
)


def short_name(kernel: str, width: int = 48) -> str:
    """A readable kernel name: template arguments and parameter lists dropped, namespaces cut."""
    name = kernel
    for open_c, close_c in (("(", ")"), ("<", ">")):
        out, depth = [], 0
        for ch in name:
            if ch == open_c:
                depth += 1
            elif ch == close_c and depth:
                depth -= 1
            elif depth == 0:
                out.append(ch)
        name = "".join(out)
    name = name.strip().split(" ")[-1].split("::")[-1] or kernel
    return name if len(name) <= width else name[: width - 1] + "…"


def _number(text: str) -> Optional[float]:
    text = (text or "").strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse_details_csv(text: str) -> List[dict]:
    """Rows of `ncu --import R --csv --page details` as dicts (ID, Kernel Name, Metric Name/Unit/Value)."""
    # ncu may print "==PROF==" / "==WARNING==" lines before the CSV header.
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    needed = {"ID", "Kernel Name", "Metric Name", "Metric Value"}
    if reader.fieldnames is None or not needed.issubset(reader.fieldnames):
        raise ValueError(f"not an ncu details CSV (columns: {reader.fieldnames})")
    return [row for row in reader if row.get("Metric Name")]


def parse_raw_csv(text: str) -> List[dict]:
    """`ncu --import R --csv --page raw`: one row per launch, one column per metric, a units row first.

    Returned in the details layout (one dict per launch and metric) so both pages merge."""
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2 or "ID" not in rows[0] or "Kernel Name" not in rows[0]:
        raise ValueError("not an ncu raw CSV")
    header, out = rows[0], []
    id_col, name_col = header.index("ID"), header.index("Kernel Name")
    units = rows[1] if len(rows) > 1 and not _number(rows[1][id_col] or "x") else None
    for row in rows[2 if units else 1:]:
        if len(row) != len(header):
            continue
        for col, metric in enumerate(header):
            if "__" in metric:  # raw metric columns (unit__counter.rollup)
                out.append({"ID": row[id_col], "Kernel Name": row[name_col], "Metric Name": metric,
                            "Metric Unit": units[col] if units else "", "Metric Value": row[col]})
    return out


def summarise(rows: Iterable[dict], top: int = 4) -> Tuple[List[str], "OrderedDict[str, Dict[str, Tuple[float, str]]]"]:
    """Averages every metric per kernel name over its launches; returns (kernel order, table).

    Kernel order: by mean duration, longest first, at most `top`. table[kernel][metric] = (mean, unit).
    """
    acc: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    units: Dict[Tuple[str, str], str] = {}
    launches: Dict[str, set] = defaultdict(set)
    seen = set()
    for row in rows:
        kernel, metric = row["Kernel Name"], row["Metric Name"]
        key = (row["ID"], kernel, metric)
        if key in seen:  # the same metric in two sections, or in both pages
            continue
        seen.add(key)
        value = _number(row.get("Metric Value", ""))
        if value is None:
            continue
        acc[kernel][metric].append(value)
        units[(kernel, metric)] = row.get("Metric Unit", "") or ""
        launches[kernel].add(row["ID"])

    def duration(kernel: str) -> float:
        for metric in ("gpu__time_duration.sum", "Duration"):
            values = acc[kernel].get(metric)
            if values:
                return sum(values) / len(values) * _unit_scale(units.get((kernel, metric), ""))
        return 0.0

    order = sorted(acc, key=duration, reverse=True)[:top]
    table: "OrderedDict[str, Dict[str, Tuple[float, str]]]" = OrderedDict()
    for kernel in order:
        table[kernel] = {m: (sum(v) / len(v), units[(kernel, m)]) for m, v in acc[kernel].items()}
        table[kernel]["launches profiled"] = (float(len(launches[kernel])), "")
    return order, table


def _unit_scale(unit: str) -> float:
    """Seconds-based scale of a time unit (to order kernels by duration across units)."""
    return {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
            "s": 1.0, "second": 1.0}.get(unit.strip().lower(), 1e-9)


def _fmt(value: float, unit: str) -> str:
    if abs(value) >= 1e6:
        text = f"{value:.4g}"
    elif value == int(value):
        text = f"{int(value)}"
    else:
        text = f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return f"{text} {unit}".strip()


def render(order: Sequence[str], table: Dict[str, Dict[str, Tuple[float, str]]]) -> str:
    """Markdown table: rows = TABLE_ROWS present in at least one kernel, columns = kernels."""
    if not order:
        return "(no kernel profiled)"
    head = "| metric | " + " | ".join(short_name(k) for k in order) + " |"
    lines = [head, "|---|" + "---|" * len(order)]
    rows = list(TABLE_ROWS) + [("launches profiled", "launches profiled")]
    for label, metric in rows:
        cells = [table[k].get(metric) for k in order]
        if all(c is None for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join("—" if c is None else _fmt(*c) for c in cells) + " |")
    return "\n".join(lines)


def available_metrics(ncu: str, wanted: Sequence[str]) -> List[str]:
    """The wanted raw metrics whose base counter this ncu lists (`--query-metrics`)."""
    try:
        proc = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return []
    known = set(re.findall(r"^([a-z0-9_]+__[a-z0-9_]+)", proc.stdout, flags=re.M))
    return [m for m in wanted if m.split(".")[0] in known]


def profile(args: argparse.Namespace) -> int:
    ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    os.makedirs(args.out, exist_ok=True)
    metrics = available_metrics(ncu, RAW_METRICS)
    print(f"[ncu_compare] {len(metrics)} of {len(RAW_METRICS)} raw metrics known to {ncu}", flush=True)
    report = os.path.join(args.out, "profile")
    cmd = [ncu, "-f", "-o", report, "--target-processes", "all", "--launch-skip", str(args.launch_skip),
           "--launch-count", str(args.launch_count)]
    for section in SECTIONS:
        cmd += ["--section", section]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    if args.kernel_regex:
        cmd += ["-k", f"regex:{args.kernel_regex}"]
    cmd += ["--"] + args.command
    print("[ncu_compare] " + " ".join(cmd), flush=True)
    with open(os.path.join(args.out, "ncu.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if rc != 0 and not os.path.exists(report + ".ncu-rep"):
        print(f"[ncu_compare] ncu failed (exit {rc}); see {args.out}/ncu.log", flush=True)
        return rc
    for page in ("details", "raw"):
        out = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", page],
                             capture_output=True, text=True, timeout=600)
        with open(os.path.join(args.out, f"{page}.csv"), "w") as f:
            f.write(out.stdout)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the report, the CSVs and the summary")
    parser.add_argument("--launch-skip", type=int, default=0, help="kernel launches not profiled first")
    parser.add_argument("--launch-count", type=int, default=12, help="kernel launches profiled")
    parser.add_argument("--kernel-regex", default=None, help="profile only kernels whose name matches")
    parser.add_argument("--top", type=int, default=4, help="columns: the longest kernels (default 4)")
    parser.add_argument("--timeout", type=int, default=540, help="seconds for the profiled command")
    parser.add_argument("--ncu", default=None, help="the ncu binary (default: on PATH, else /usr/local/cuda/bin)")
    parser.add_argument("--from-csv", default=None, help="summarise this details CSV (no profiling)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to profile")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]

    rows: List[dict] = []
    if args.from_csv:
        with open(args.from_csv) as f:
            rows = parse_details_csv(f.read())
        os.makedirs(args.out, exist_ok=True)
    else:
        if not args.command:
            parser.error("give the command to profile after --, or --from-csv")
        rc = profile(args)
        if rc != 0:
            return rc
        with open(os.path.join(args.out, "details.csv")) as f:
            rows = parse_details_csv(f.read())
        raw_path = os.path.join(args.out, "raw.csv")
        if os.path.exists(raw_path):
            try:
                with open(raw_path) as f:
                    rows += parse_raw_csv(f.read())
            except ValueError as error:
                print(f"[ncu_compare] raw page skipped: {error}", flush=True)
    order, table = summarise(rows, top=args.top)
    text = render(order, table)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text + "\n\nKernels (full names):\n" + "\n".join(f"- {k}" for k in order) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({k: {m: {"value": v, "unit": u} for m, (v, u) in table[k].items()} for k in order}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
