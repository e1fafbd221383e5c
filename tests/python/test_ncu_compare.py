"""scripts/ncu_compare.py: parsing of Nsight Compute CSV pages and the side-by-side table (no GPU needed)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("ncu_compare", ROOT / "scripts" / "ncu_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nc = _load()

OURS = "void flashdsa::sm90::sparse_mla_bwd_impl::v3::sparse_mla_bwd_main_kernel_v3<false>(flashdsa::sm90::MainParams)"
PEER = "kernel_cutlass_dsa_bwd_sm90_0(cute::Tensor<int>, float)"
SMALL = "void delta_kernel(const bf16 *, float *)"


def _details_csv(rows):
    buf = io.StringIO()
    buf.write("==PROF== Disconnected from process 1234\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"])
    for launch_id, kernel, section, metric, unit, value in rows:
        w.writerow([launch_id, "1", "python3", "h", kernel, "1", "7", "(384, 1, 1)", "(32768, 1, 1)", "0", "9.0",
                    section, metric, unit, value])
    return buf.getvalue()


def _sample_rows():
    return [
        # two launches of ours (durations 30 and 34 ms -> mean 32), one of the peer, one small kernel
        (0, OURS, "GPU Speed Of Light Throughput", "Duration", "msecond", "30.0"),
        (0, OURS, "GPU Speed Of Light Throughput", "L2 Hit Rate", "%", "71.5"),
        (0, OURS, "Launch Statistics", "Registers Per Thread", "register/thread", "168"),
        (1, PEER, "GPU Speed Of Light Throughput", "Duration", "msecond", "26.9"),
        (1, PEER, "GPU Speed Of Light Throughput", "L2 Hit Rate", "%", "80.25"),
        (2, SMALL, "GPU Speed Of Light Throughput", "Duration", "usecond", "40.0"),
        (3, OURS, "GPU Speed Of Light Throughput", "Duration", "msecond", "34.0"),
        (3, OURS, "GPU Speed Of Light Throughput", "L2 Hit Rate", "%", "72.5"),
        (3, OURS, "Launch Statistics", "Registers Per Thread", "register/thread", "168"),
        (3, OURS, "Compute Workload Analysis", "Executed Instructions", "inst", "1,234,567,890"),
        (3, OURS, "Some Section", "Not A Number", "", "n/a"),
    ]


def test_details_csv_is_parsed_and_averaged_per_kernel():
    rows = nc.parse_details_csv(_details_csv(_sample_rows()))
    order, table = nc.summarise(rows, top=2)
    assert order == [OURS, PEER]  # longest first (32 ms mean vs 26.9 ms), the 40 us kernel cut by top=2
    assert table[OURS]["Duration"] == (pytest.approx(32.0), "msecond")
    assert table[OURS]["L2 Hit Rate"][0] == pytest.approx(72.0)
    assert table[OURS]["Executed Instructions"][0] == pytest.approx(1234567890.0)  # thousands separators
    assert table[OURS]["launches profiled"][0] == 2
    assert table[PEER]["launches profiled"][0] == 1
    assert "Not A Number" not in table[OURS]
    text = nc.render(order, table)
    header = text.splitlines()[0]
    assert "sparse_mla_bwd_main_kernel_v3" in header and "kernel_cutlass_dsa_bwd_sm90_0" in header
    duration_row = next(line for line in text.splitlines() if line.startswith("| duration |"))
    assert "32 msecond" in duration_row and "26.9 msecond" in duration_row
    assert "| executed instructions | 1.235e+09 inst | — |" in text


def test_units_order_kernels_across_time_units():
    rows = nc.parse_details_csv(_details_csv([
        (0, "a_kernel()", "S", "Duration", "usecond", "900"),   # 0.9 ms
        (1, "b_kernel()", "S", "Duration", "msecond", "1.5"),   # 1.5 ms
    ]))
    order, _ = nc.summarise(rows, top=5)
    assert order == ["b_kernel()", "a_kernel()"]


def test_raw_page_merges_with_details_without_double_counting():
    raw = io.StringIO()
    w = csv.writer(raw, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Kernel Name", "gpu__time_duration.sum", "lts__t_sectors_op_red.sum"])
    w.writerow(["", "", "nsecond", "sector"])
    w.writerow(["0", OURS, "30000000", "1000"])
    w.writerow(["3", OURS, "34000000", "3000"])
    rows = nc.parse_details_csv(_details_csv(_sample_rows())) + nc.parse_raw_csv(raw.getvalue())
    rows += nc.parse_raw_csv(raw.getvalue())  # the same page twice: ignored the second time
    order, table = nc.summarise(rows, top=1)
    assert order == [OURS]
    assert table[OURS]["lts__t_sectors_op_red.sum"] == (pytest.approx(2000.0), "sector")
    assert table[OURS]["gpu__time_duration.sum"][0] == pytest.approx(32e6)
    assert "| L2 red sectors | 2000 sector |" in nc.render(order, table)


def test_short_name_drops_templates_parameters_and_namespaces():
    assert nc.short_name(OURS) == "sparse_mla_bwd_main_kernel_v3"
    assert nc.short_name("plain") == "plain"
    assert len(nc.short_name("x" * 100, width=20)) == 20


def test_bad_csv_is_rejected():
    with pytest.raises(ValueError):
        nc.parse_details_csv("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError):
        nc.parse_raw_csv("a,b\n1,2\n")


def test_from_csv_command_line_writes_summary(tmp_path, capsys):
    src = tmp_path / "details.csv"
    src.write_text(_details_csv(_sample_rows()))
    out = tmp_path / "out"
    assert nc.main(["--out", str(out), "--from-csv", str(src), "--top", "3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == [OURS, PEER, SMALL]
    assert summary[PEER]["L2 Hit Rate"] == {"value": pytest.approx(80.25), "unit": "%"}
    assert "| L2 hit rate |" in (out / "summary.md").read_text()
    assert "| duration |" in capsys.readouterr().out


def test_command_is_required_without_csv(tmp_path):
    with pytest.raises(SystemExit):
        nc.main(["--out", str(tmp_path)])
