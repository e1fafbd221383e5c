"""CPU smoke tests of bench/megatron_layer.py and examples/megatron_train.py (tiny shapes, fp32).

Both run as the lead runs them (subprocesses, the package from this checkout); the GPU runs are the
same scripts without --device cpu --tiny (docs/megatron.md).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install flashdsa[megatron])")

ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env.pop("OUT", None)
    return env


def test_megatron_layer_bench_cpu_tiny(tmp_path):
    out = tmp_path / "layer.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "megatron_layer.py"), "--device", "cpu", "--tiny",
                           "--t", "64", "--iters", "1", "--backends", "flashdsa", "flashdsa-spec", "none",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["backend"] for r in rows} == {"flashdsa", "flashdsa-spec", "none"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["ms"] > 0
    hooks = {r["backend"]: r["hooks"] for r in rows}
    assert hooks["flashdsa"]["run_fused_dsa_attention"] == 2  # warm-up + 1 timed step
    assert hooks["flashdsa-spec"]["loss_in_backward"] == 2
    assert hooks["none"] == {}
    assert "| flashdsa | 4 | 64 |" in proc.stdout


def test_megatron_train_example_cpu_tiny(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "megatron_train.py"), "--device", "cpu", "--tiny",
                           "--steps", "3", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "megatron_train.json").read_text())
    summary = result["summary"]
    assert summary["all_finite"]
    # fp32: the two backends train the same model along the same path.
    assert summary["max_rel_lm_loss_diff"] < 1e-4, summary
    assert len(result["runs"]["none"]["lm_loss"]) == 3
    hooks = summary["flashdsa_hooks"]
    # 4 layers, IndexShare 2: 2 computing layers (fused, loss in backward) + 2 reusing layers, 3 steps.
    assert hooks == {"run_fused_dsa_attention": 6, "loss_in_backward": 6, "run_fused_absorbed_sparse_attention": 6}
    assert (tmp_path / "megatron_train.png").stat().st_size > 1000
