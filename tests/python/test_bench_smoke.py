"""The benchmark suite (bench/): a CPU run at tiny sizes, its parts, and the unfused baseline's math.

The end-to-end test runs `bench/run.py --device cpu --quick` in a subprocess (as a user would) and
checks that the JSON, Markdown and PNG outputs are produced with sane positive numbers. The
unfused PyTorch DSA must compute the same math as the kernels, so it is checked against dense
references and against the FlashDSA ops.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import flashdsa  # noqa: E402
from flashdsa import reference  # noqa: E402
from bench import unfused  # noqa: E402
from bench.cases import build_cases  # noqa: E402
from bench.config import make_config  # noqa: E402
from bench.inputs import causal_topk_indices, dsa_inputs  # noqa: E402
from bench.layers import flashdsa_layers_fwd_bwd, unfused_layer_fwd_bwd  # noqa: E402
from bench.runner import Runner  # noqa: E402
from bench.summary import crossover  # noqa: E402
from bench.timing import CPU_POLICY, GPU_POLICY, Budget  # noqa: E402

CPU = torch.device("cpu")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHUNK = 1 << 30  # one chunk unless a test asks for several


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # One thread: the smoke run checks the script, and intra-op threads crawl on a loaded 2-core machine.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--device", "cpu", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout, json.loads((out / "results.json").read_text())


# ---------------------------------------------------------------------- end to end

def test_run_writes_json_markdown_and_pngs(bench_run):
    out, _, _ = bench_run
    for name in ("time_vs_T.png", "kernel_tflops.png", "memory_vs_T.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
    report = (out / "report.md").read_text()
    for heading in ("## Summary", "## Machine ceilings", "## Kernels", "## DSA layer forward + backward",
                    "## Memory", "## Not measured", "## Method"):
        assert heading in report


def test_every_case_ran_with_positive_numbers(bench_run):
    _, _, results = bench_run
    records = results["records"]
    names = {r["name"] for r in records}
    assert {"copy d2d", "sparse_mla_fwd", "sparse_mla_bwd", "indexer_topk", "dsa layer", "dense 256",
            "dense 192/128", "unfused layer"} <= names
    for r in records:
        assert r["status"] == "ok", r  # on the CPU every FlashDSA op has a kernel
        assert r["ms"] > 0 and r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["reps"] >= CPU_POLICY.min_reps_long
        rate = r["tflops"] if r["flops"] else r["gbps"]
        assert rate > 0, r
    shared = [r for r in records if r["name"].startswith("dsa layer, IndexShare")]
    assert shared and all(r["layers"] == 4 and r["ms_per_layer"] == pytest.approx(r["ms"] / 4) for r in shared)


def test_progress_line_per_case(bench_run):
    _, stdout, results = bench_run
    lines = [line for line in stdout.splitlines() if re.match(r"\[\s*[\d.]+s\] ", line)]
    assert len(lines) == len(results["records"])
    assert all(" ms " in line for line in lines)


def test_summary_has_the_acceptance_numbers(bench_run):
    _, _, results = bench_run
    summary = results["summary"]
    assert summary["gemm_tflops"] > 0 and summary["copy_gbps"] > 0
    assert all(k["of_gemm"] > 0 for k in summary["kernels"])
    rows = summary["layer"]
    assert [row["t"] for row in rows] == results["config"]["seq_lens"]
    for row in rows:
        assert row["speedup_dense"]["dense 256"] > 0 and row["speedup_unfused"] > 0
        assert row["index_share_gain"] > 0 and 0 < row["loss_path_share"]
    headline = summary["headline"]
    assert headline["crossover_dsa"]["kind"] in ("below", "above", "interpolated")
    assert headline["speedup_t"] == max(results["config"]["seq_lens"]) and headline["speedup"] > 0


# ---------------------------------------------------------------------- parts of the runner

def test_budget_guard_skips_and_says_so():
    cfg = make_config(CPU, seq_lens=[64], max_seconds=0.0)
    lines = []

    class Sink:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    records = Runner(cfg, flashdsa, None, CPU_POLICY, Sink()).run_all(build_cases(cfg, flashdsa))
    assert records and all(r["status"] == "skipped" and "time budget" in r["reason"] for r in records)
    assert sum("skipped: time budget" in line for line in lines) == len(records)


def test_budget_prediction_skips_a_case_that_would_overrun():
    budget = Budget(100.0)
    assert budget.skip_reason(None) is None and budget.skip_reason(10.0) is None
    assert "predicted 500 s" in budget.skip_reason(500.0)

    cfg = make_config(CPU, seq_lens=[64, 128], sections=["baselines"], max_seconds=100.0)
    small, large = [c for c in build_cases(cfg, flashdsa) if c.name == "dense 256"]
    runner = Runner(cfg, flashdsa, None, CPU_POLICY, sys.stdout)
    assert runner.skip(small) is None and runner.skip(large) is None  # nothing known yet
    # 10 s per call at T = 64 predicts about 4 x 10 s per call at T = 128 (quadratic FLOPs): over budget.
    runner.last_ok["dense 256"] = {"t": 64, "flops": small.flops, "ms": 10_000.0}
    status, reason = runner.skip(large)
    assert status == "skipped" and "predicted" in reason
    runner.last_ok["dense 256"]["ms"] = 1.0
    assert runner.skip(large) == ("skipped", runner.stopped["dense 256"])  # larger T stay skipped


def _run_quietly(cfg, fd=flashdsa, fd_error=None, **runner_args):
    with open(os.devnull, "w") as sink:
        return Runner(cfg, fd, fd_error, CPU_POLICY, sink, **runner_args).run_all(build_cases(cfg, fd))


def test_missing_flashdsa_is_not_applicable_but_ceilings_run():
    cfg = make_config(CPU, seq_lens=[64], sections=["layer"])
    records = _run_quietly(cfg, fd=None, fd_error="ImportError: test")
    layer = [r for r in records if r["section"] == "layer"]
    assert layer and all(r["status"] == "n/a" and "not importable" in r["reason"] for r in layer)
    assert all(r["status"] == "ok" for r in records if r["section"] == "ceiling")


def test_op_without_kernel_is_not_applicable_and_its_rows_are_skipped():
    cfg = make_config(CPU, seq_lens=[64], sections=["kernels", "layer"])
    records = _run_quietly(cfg, has_kernel=lambda op: op != "sparse_mla_bwd")
    by_name = {r["name"]: r for r in records}
    for name in ("sparse_mla_bwd", "dsa layer", "dsa layer, IndexShare 1-in-4"):
        assert by_name[name]["status"] == "n/a" and by_name[name]["reason"] == "no kernel: sparse_mla_bwd"
    for name in ("indexer_topk", "indexer_topk fp8", "sparse_mla_fwd", "attention_mass", "sparse_kl_fwd",
                 "sparse_kl_bwd"):
        assert by_name[name]["status"] == "ok" and by_name[name]["ms"] > 0


def test_cases_that_cannot_fit_in_memory_are_skipped():
    cfg = make_config(CPU, seq_lens=[64], sections=["layer", "baselines"])
    records = _run_quietly(cfg, device_memory=1024)
    sized = [r for r in records if r["name"] in ("dsa layer", "dense 256", "dense 192/128")]
    assert len(sized) == 3 and all(r["status"] == "skipped" and r["reason"].startswith("memory") for r in sized)
    assert next(r for r in records if r["name"] == "unfused layer")["status"] == "ok"


def test_rep_policy():
    assert GPU_POLICY.reps(1e-4) >= 10 and GPU_POLICY.reps(0.4) >= 10
    assert 3 <= GPU_POLICY.reps(0.6) <= 10 and GPU_POLICY.reps(20.0) == 3
    assert GPU_POLICY.warmups(20.0) == 1 and GPU_POLICY.warmups(1e-4) == GPU_POLICY.max_warmups


def test_crossover_interpolates_in_log_log():
    ts = [1024, 2048, 4096, 8192]
    fast = [4.0, 8.0, 16.0, 32.0]  # DSA: linear in T
    slow = [1.0, 4.0, 16.0, 64.0]  # dense: quadratic, equal at 4096
    assert crossover(ts, fast, slow) == {"t": pytest.approx(4096.0), "kind": "interpolated", "between": [2048, 4096]}
    # Speedups 0.75 at 2048 and 1.25 at 4096: log(speedup) is linear in log(T) between them.
    frac = math.log(1 / 0.75) / math.log(1.25 / 0.75)
    assert crossover(ts, fast, [2.0, 6.0, 20.0, 64.0])["t"] == pytest.approx(2048 * 2 ** frac)
    assert crossover(ts, [1.0] * 4, [2.0] * 4)["kind"] == "below"
    assert crossover(ts, [2.0] * 4, [1.0] * 4)["kind"] == "above"
    assert crossover(ts, [None] * 4, [1.0] * 4)["kind"] == "none"


def test_causal_topk_indices_are_distinct_and_visible():
    t, k = 200, 64
    idx = causal_topk_indices(t, k, CPU, rows_per_chunk=37)
    for r in range(t):
        row = idx[r]
        valid = row[row >= 0]
        assert len(valid) == min(r + 1, k) and len(set(valid.tolist())) == len(valid)
        assert int(valid.max()) <= r and int(valid.min()) >= 0
        assert bool((row[len(valid):] == -1).all())


def test_causal_topk_indices_shuffled_is_a_permutation_of_the_strata():
    """order="shuffled": each full row holds one key per stratum, in a random slot order; short rows
    keep every visible key in order, padded with -1 last."""
    t, k = 300, 32
    idx = causal_topk_indices(t, k, CPU, rows_per_chunk=41, order="shuffled")
    unsorted_rows = 0
    for r in range(t):
        row = idx[r]
        if r + 1 <= k:
            assert row[: r + 1].tolist() == list(range(r + 1)) and bool((row[r + 1:] == -1).all())
            continue
        keys = sorted(row.tolist())
        strata = [(j * (r + 1) // k, (j + 1) * (r + 1) // k) for j in range(k)]
        assert all(lo <= key < hi for key, (lo, hi) in zip(keys, strata)), r
        unsorted_rows += int(row.tolist() != keys)
    assert unsorted_rows > 0.9 * (t - k)  # a random order is almost never ascending
    with pytest.raises(ValueError, match="order"):
        causal_topk_indices(4, 2, CPU, order="descending")


# ---------------------------------------------------------------------- the unfused baseline's math

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread is faster, most of all on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fp64_inputs(t: int, topk: int, requires_grad: bool = True, index_heads: int = 4):
    cfg = make_config(CPU)
    dsa = dataclasses.replace(cfg.dsa, topk=topk, index_heads=index_heads)
    cfg = dataclasses.replace(cfg, dtype=torch.float64, dsa=dsa)
    return cfg, dsa_inputs(cfg, t, requires_grad=requires_grad)


def test_unfused_sparse_mla_with_every_key_is_dense_causal_attention():
    t = 48
    cfg, x = _fp64_inputs(t, topk=64)
    s = cfg.dsa
    indices = causal_topk_indices(t, s.topk, CPU)  # every visible key, then -1
    out, mass = unfused.sparse_mla(x.q, x.kv, indices, s.scale, s.d_v, chunk_bytes=4_000_000)  # 4 chunks
    assert s.d_v == s.d_qk - reference.ROPE_WIDTH
    ref, lse = reference.sparse_mla(x.q, x.kv, indices, s.scale)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out, (x.q, x.kv), x.dout)
    ref_grads = torch.autograd.grad(ref, (x.q, x.kv), x.dout)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(mass, reference.attention_mass(x.q, x.kv, indices, lse, s.scale))
    assert bool((mass[indices < 0] == 0).all())


def test_unfused_indexer_topk_keeps_the_largest_visible_scores():
    t, topk = 150, 64
    _, x = _fp64_inputs(t, topk, requires_grad=False)
    indices, scores = unfused.indexer_topk(x.q_idx, x.k_idx, x.weights, x.k_start, x.k_end, topk,
                                           chunk_bytes=100_000)
    full = reference.indexer_scores(x.q_idx, x.k_idx, x.weights, x.k_start, x.k_end, relu=True)
    for r in range(t):
        valid = indices[r] >= 0
        assert int(valid.sum()) == min(r + 1, topk) and int(indices[r][valid].max()) <= r
        want = full[r, : r + 1].sort(descending=True).values[: min(r + 1, topk)]
        got = full[r, indices[r][valid].long()].sort(descending=True).values
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(scores[r][valid].sort(descending=True).values, want)


def test_unfused_kl_loss_matches_a_row_by_row_reference():
    t, topk = 72, 64
    _, x = _fp64_inputs(t, topk)
    indices = causal_topk_indices(t, topk, CPU)
    mass = torch.rand(t, topk, dtype=torch.float64) * (indices >= 0)
    loss = unfused.sparse_kl_loss(x.q_idx, x.k_idx, x.weights, indices, mass, chunk_bytes=50_000)
    ref = reference.sparse_kl_rows(x.q_idx, x.k_idx, x.weights, indices, mass, relu=True).mean()  # no empty row
    torch.testing.assert_close(loss, ref)
    grads = torch.autograd.grad(loss, (x.q_idx, x.k_idx, x.weights))
    ref_grads = torch.autograd.grad(ref, (x.q_idx, x.k_idx, x.weights))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def test_unfused_layer_matches_the_flashdsa_layer():
    t = 160
    # 16 indexer heads: with 4, a key's ReLU score is exactly 0 for 1 in 16 keys, and such ties at
    # the top-k boundary may be broken either way (docs/spec.md §3), changing the selection.
    cfg, x = _fp64_inputs(t, topk=64, index_heads=16)
    got = unfused_layer_fwd_bwd(x, cfg.dsa, chunk_bytes=CHUNK)
    want = flashdsa_layers_fwd_bwd(flashdsa, x, cfg.dsa)
    names = ("out", "loss", "dq", "dkv", "dq_idx", "dk_idx", "dweights")
    assert len(got) == len(want) == len(names)
    for name, a, b in zip(names, got, want):
        # fp64 data, but the C++ API takes the softmax scale as fp32: agreement to ~1e-7 relative.
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    shared = flashdsa_layers_fwd_bwd(flashdsa, x, cfg.dsa, layers=4)
    torch.testing.assert_close(shared[0], want[0])  # shared layers reuse the same indices
