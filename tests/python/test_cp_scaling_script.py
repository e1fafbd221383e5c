"""bench/cp_scaling.py, run as a user would (subprocess, 2 self-spawned gloo processes on the CPU).

--check must pass (cp = 2 equals cp = 1 on every quantity), report failure through its exit status
when the tolerance cannot be met, and --scale must write sane timings. The multi-GPU (NCCL) runs of
the same script are documented in docs/context-parallel.md.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cp_scaling.py"
TIMEOUT_S = 120
CHECKED = ("out", "dq", "dkv", "dq_idx", "dk_idx", "dweights", "indices", "indexer loss", "padding rows")


def run_script(*args: str) -> subprocess.CompletedProcess:
    # One thread per process: the CI machine has 2 cores.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(SCRIPT), "--nproc", "2", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)


def test_check_cp2_matches_cp1(tmp_path):
    out = tmp_path / "check.json"
    proc = run_script("--check", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: cp = 2 equals cp = 1" in proc.stdout
    assert "NCCL_NVLS_ENABLE=0" in proc.stdout  # multicast stays off, also for the children

    result = json.loads(out.read_text())
    check = result["check"]
    assert check["passed"] and check["cp"] == 2 and result["meta"]["backend"] == "gloo"
    rows = {r["quantity"]: r for r in check["rows"]}
    assert set(rows) == set(CHECKED)
    for name, row in rows.items():
        assert row["passed"] and 0 <= row["error"] <= row["tolerance"], (name, row)
    assert rows["indices"]["error"] == 0 and rows["padding rows"]["error"] == 0


def test_check_fails_with_exit_status(tmp_path):
    # With tolerance 0, quantities summed in another order under CP (dkv, dk_idx, the loss) must fail.
    out = tmp_path / "check.json"
    proc = run_script("--check", "--tol", "0", "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: cp = 2 differs from cp = 1" in proc.stdout
    failed = {r["quantity"] for r in json.loads(out.read_text())["check"]["rows"] if not r["passed"]}
    assert "dkv" in failed, failed


def test_scale_writes_timings(tmp_path):
    out = tmp_path / "scale.json"
    proc = run_script("--scale", "--tokens", "512", "--warmup", "1", "--reps", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries = {e["cp"]: e for e in json.loads(out.read_text())["scale"]}
    assert set(entries) == {1, 2}
    assert entries[1]["comm_ms"] == 0 and len(entries[1]["ranks"]) == 1
    two = entries[2]
    assert [r["rank"] for r in two["ranks"]] == [0, 1] and two["local_tokens"] == 256
    for rank in two["ranks"]:
        assert rank["fwd_ms"] > 0 and rank["bwd_ms"] > 0 and len(rank["samples_ms"]) == 2
        ops = rank["comm_by_op_ms"]
        # kv and k_idx are gathered forward and reduce-scattered backward; the loss needs all-reduces.
        assert ops["all_gather_into_tensor"] > 0 and ops["reduce_scatter_tensor"] > 0 and ops["all_reduce"] > 0
        assert 0 < rank["comm_ms"] < rank["total_ms"] and rank["comm_alone_ms"] > 0
    assert two["speedup"] > 0 and abs(two["efficiency"] - two["speedup"] / 2) < 1e-12
