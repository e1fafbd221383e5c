"""scripts/bwd_fixed_point_sim.py: the numpy model behind the fixed-point deterministic backward's unit margin
(docs/perf-notes.md, twenty-third session). Small sizes, CPU only: a margin that fits the data re-runs no row and stays
far below the bf16 error; a margin far beyond it re-runs every row; a sink key re-runs its own rows only."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> dict[int, tuple[int, int, float | None]]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bwd_fixed_point_sim.py"), "--T", "16", "--T-kv",
                          "512", "--K", "128", *args], capture_output=True, text=True, check=True).stdout
    rows = {}
    pattern = r"margin 2\^(\d+): rows re-run (\d+) / (\d+), fixed-point rel-L2 of the proven rows ([^,\s]+)"
    for m in re.finditer(pattern, out):
        err = None if m.group(4) == "-" else float(m.group(4))
        rows[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), err)
    return rows


def test_margin_fits_diffuse_attention():
    r = _run("--margins", "5", "20")
    rerun, used, err = r[5]
    assert used > 400 and rerun == 0
    assert err is not None and err < 2e-5  # dkv's bf16 error is ~2e-3
    assert r[20][0] == r[20][1]  # every row fails its check at 2^20 and would re-run


def test_sink_keys_rerun_alone():
    rerun, used, err = _run("--margins", "5", "--peaky", "0.5")[5]
    assert 0 < rerun <= 16 + 2  # one sink key per token (16 tokens), nothing else
    assert err is not None and err < 2e-5


def test_one_large_token_coarsens_only_its_own_rows():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bwd_fixed_point_sim.py"), "--skew-case"],
                         capture_output=True, text=True, check=True).stdout
    err = {}
    pattern = r"skew 2\^14 (global B / 2\^12|per row \(2\^5, 2\^4\)): .*fixed-point rel-L2 ([0-9.e+-]+)"
    for m in re.finditer(pattern, out):
        err[m.group(1)] = float(m.group(2))
    assert err["global B / 2^12"] > 1e-2  # the former rule: one bound for all rows
    assert err["per row (2^5, 2^4)"] < 1e-5  # the rows the large token does not select keep their precision
