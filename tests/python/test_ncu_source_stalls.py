"""scripts/ncu_source_stalls.py: parsing of an Nsight Compute source-page CSV and the stall summary (no GPU)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ncu_source_stalls as mod  # noqa: E402  (a script, not a package module)


CSV = '''"Kernel Name","void k<(int)32>(Args)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_wait","stall_math","stall_barrier (Not Issued)"
"0x10","  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ","30","25","100","0","20","10","0"
"0x20","  BAR.RED.OR.DEFER_BLOCKING 0x0, P0","60","60","100","55","5","0","55"
"0x30","  FFMA R1, R2, R3, R4","10","2","6400","0","1","9","0"
'''


def test_parse_and_summary_ranks_instructions_and_reasons():
    kernel, rows = mod.parse(CSV.splitlines())
    assert kernel.startswith("void k")
    assert [r["samples"] for r in rows] == [30, 60, 10]
    assert rows[1]["stalls"] == {"barrier": 55, "wait": 5, "math": 0}  # "(Not Issued)" columns are left out
    text = mod.summarise(rows, top=2)
    lines = text.splitlines()
    assert lines[0] == "total samples 100"
    # reasons in decreasing order of samples: barrier 55, wait 26, math 19
    assert [l.split()[0] for l in lines[1:4]] == ["barrier", "wait", "math"]
    assert "55.0%" in lines[1]
    # the two instructions with most samples, the barrier first
    assert "BAR.RED.OR" in lines[5] and lines[5].lstrip().startswith("60.00%")
    assert "HGMMA" in lines[6]
    assert len(lines) == 7


def test_rejects_other_pages():
    with pytest.raises(ValueError):
        mod.parse(['"ID","Kernel Name","Metric Name"', '"0","k","Duration"'])
    with pytest.raises(ValueError):
        mod.parse(['"Address","Source","Instructions Executed"', '"0x10","NOP","1"'])


def test_command_line(tmp_path, capsys):
    f = tmp_path / "src.csv"
    f.write_text(CSV)
    assert mod.main([str(f), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "kernel: void k" in out and "BAR.RED.OR" in out and "HGMMA" not in out.split("top 1")[1]
