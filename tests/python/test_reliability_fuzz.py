"""The GPU differential fuzz (tests/cuda/fuzz.py) checks itself on the CPU: bf16 CPU vs float64 CPU
on a couple of cases, a single-seed repro, and a corrupted op that it must report."""

import importlib.util
import pathlib
import sys

import pytest
import torch

FUZZ_PATH = pathlib.Path(__file__).resolve().parents[1] / "cuda" / "fuzz.py"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("flashdsa_fuzz", FUZZ_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def test_fuzz_cpu_mode_passes_every_op(fuzz, capsys):
    assert fuzz.main(["--device", "cpu", "--cases", "1", "--seed0", "5"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: OK (0 failing cases)" in out
    for op in fuzz.OPS:
        assert f"\n{op} " in out, f"{op} missing from the summary"


def test_fuzz_cases_are_reproducible(fuzz):
    a = fuzz.make_problem("sparse_mla_bwd", 11, small=True)
    b = fuzz.make_problem("sparse_mla_bwd", 11, small=True)
    assert a.desc == b.desc
    for name, x in a.tensors.items():
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, b.tensors[name]) and x.stride() == b.tensors[name].stride(), name
        else:
            assert x == b.tensors[name], name


def test_fuzz_layouts_are_strided_views_on_the_target_device(fuzz):
    x = torch.arange(24.0).reshape(4, 6)
    wide, rows = fuzz.apply_layout(x, "wide"), fuzz.apply_layout(x, "rows")
    assert torch.equal(wide, x) and wide.stride() == (70, 1)
    assert torch.equal(rows, x) and rows.stride() == (12, 1)
    layouts = [m for s in range(20) for m in fuzz.make_problem("sparse_mla_fwd", s, True).tensors["layouts"].values()]
    assert {"contiguous", "wide", "rows"} <= set(layouts)


def test_fuzz_reports_a_wrong_op_with_its_repro(fuzz, capsys, monkeypatch):
    real = fuzz.run_op

    def corrupted(op, tensors, device, float64):
        result = real(op, tensors, device, float64)
        if not float64 and op == "attention_mass":
            mass = result[0].clone()
            mass[0] += 0.5  # one wrong row
            return (mass,)
        return result

    monkeypatch.setattr(fuzz, "run_op", corrupted)
    seed = next(s for s in range(50) if fuzz.make_problem("attention_mass", s, True).tensors["indices"][0].ge(0).any())
    assert fuzz.main(["--device", "cpu", "--op", "attention_mass", "--seed", str(seed)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL attention_mass seed={seed}" in out
    assert f"repro: python tests/cuda/fuzz.py --device cpu --op attention_mass --seed {seed}" in out
    assert "RESULT: FAILED (1 failing cases)" in out


def test_limits_script_smoke_on_cpu(capsys):
    """scripts/limits_gpu.py checks itself on tiny CPU configurations (the GPU run is the lead's)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "limits_gpu.py"
    spec = importlib.util.spec_from_file_location("flashdsa_limits", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--smoke", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: OK" in out and "tiny " in out
