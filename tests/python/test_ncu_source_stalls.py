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


SOURCE = """// header comment
#include <x>

__device__ void produce(int a) {
  helper(a);
}

template <bool k>
__device__ void front(int b) {
  if (b) {
    wait(b);
  }
}

__device__ __forceinline__ int tiny(int c) { return c; }
"""


def test_function_ranges_span_to_the_next_top_level_definition():
    r = mod.function_ranges(SOURCE, ["produce", "front", "tiny"])
    assert r["produce"] == (4, 8)  # to the line before front's declarator (a `template <...>` line has no "(")
    assert r["front"] == (9, 14)
    assert r["tiny"] == (15, 15)
    with pytest.raises(ValueError):
        mod.function_ranges(SOURCE, ["back"])


def _row(addr, loc, samples, stalls):
    return {"address": addr, "source": "NOP", "samples": samples, "executed": 1, "stalls": stalls, "location": loc}


def test_roles_are_set_by_the_role_functions_and_inherited_by_inlined_helpers():
    ranges = {"produce": (4, 8), "front": (9, 14)}
    roles = {"produce": "producer", "front": "front"}
    rows = [
        _row("0x00", "other.cuh:1", 5, {"wait": 5}),            # before any role line
        _row("0x10", "k.cuh:5", 10, {"wait": 10}),              # producer
        _row("0x20", "helpers.cuh:77", 30, {"long_scoreboard": 30}),  # inlined into the producer
        _row("0x30", "k.cuh:11", 40, {"barrier": 40}),          # front
        _row("0x40", "k.cuh:99", 15, {"wait": 15}),             # same file, outside every role: inherits front
    ]
    got = mod.attribute_roles(rows, "k.cuh", ranges, roles)
    assert got == [None, "producer", "producer", "front", "front"]
    text = mod.summarise_roles(rows, got, top=3)
    lines = text.splitlines()
    assert lines[0].startswith("== producer: 40 samples, 40.0% of all")
    assert "long_scoreboard 75.0%" in lines[1]
    front = lines.index(next(l for l in lines if l.startswith("== front")))
    assert lines[front].startswith("== front: 55 samples, 55.0% of all")
    assert any(l.startswith("== (before any role): 5 samples") for l in lines)


def test_parse_roles_and_its_errors():
    assert mod.parse_roles("a/k.cuh=produce:producer,front:front") == ("a/k.cuh", {"produce": "producer", "front": "front"})
    with pytest.raises(ValueError):
        mod.parse_roles("a/k.cuh=produce")
    with pytest.raises(ValueError):
        mod.parse_roles("=produce:p")


def test_roles_need_a_report(tmp_path):
    f = tmp_path / "src.csv"
    f.write_text(CSV)
    with pytest.raises(SystemExit):
        mod.main([str(f), "--roles", "k.cuh=front:front"])
