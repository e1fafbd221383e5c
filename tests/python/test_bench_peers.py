"""The public peers in the benchmark suite (bench/peers), on the CPU.

No peer package runs here (they need CUDA and are not installed): the registry must report each
peer as absent with a reason, never raise. The A/B machinery is exercised with fake peers that are
plain PyTorch functions (bench/unfused's gather + softmax sparse MLA, dense scores + torch.topk),
against FlashDSA's CPU kernels: alternation, medians and ratio, cross-check numbers, recall, the
OOM / n/a / absent rules, and the "vs peers" table of the report, end to end through bench/run.py.
"""

import dataclasses
import io
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import flashdsa  # noqa: E402,F401 - registers torch.ops.flashdsa
from flashdsa import reference  # noqa: E402
from bench import unfused  # noqa: E402
from bench.config import GLM5_DSA, fp8_selection_kwargs, make_config  # noqa: E402
from bench.peers import (ABPrepared, ABResult, ABTimer, PeerPath, PeerPlan, Side, build_peer_cases,  # noqa: E402
                         discover, make_plan, peers_table, rel_err, render_peers_section, run_peers, topk_recall)
from bench.peers import registry  # noqa: E402
from bench.peers.cases import BWD, FWD, INDEXER, PATHS, fwd_check, recall_check, bwd_check, ours_bwd  # noqa: E402
from bench.peers.registry import PeerStatus  # noqa: E402
from bench.timing import CPU_POLICY  # noqa: E402

CPU = torch.device("cpu")
CHUNK = 1 << 30


@pytest.fixture
def cfg():
    return make_config(CPU, quick=True, seq_lens=(64, 128))


@pytest.fixture
def ops():
    return torch.ops.flashdsa


# ---------------------------------------------------------------------- registry

def test_registry_reports_every_peer_absent_without_cuda():
    found = discover()
    assert set(found) == {"flashmla", "cudnn", "tilelang", "tilelang_fp8_example"}
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the peers' presence depends on the installed packages")
    for status in found.values():
        assert not status.present and status.module is None
        assert "CUDA" in status.detail


def test_registry_reports_missing_packages_cleanly(monkeypatch, tmp_path):
    """With CUDA pretended present, missing packages are absent with the import error, not raised."""
    monkeypatch.setattr(registry, "_cuda_required", lambda: None)
    monkeypatch.setenv("FLASHDSA_PEERS_DIR", str(tmp_path))  # no FlashMLA build there
    real_import = registry.importlib.import_module

    def no_peers(name, *args):
        if name.split(".")[0] in ("cudnn", "tilelang", "flash_mla", "megatron"):
            raise ModuleNotFoundError(f"No module named '{name}'")
        return real_import(name, *args)
    monkeypatch.setattr(registry.importlib, "import_module", no_peers)
    found = discover()
    for key, status in found.items():
        assert not status.present, key
        assert status.detail, key
    assert "not importable" in found["cudnn"].detail and "No module named" in found["cudnn"].detail
    assert "not importable" in found["tilelang"].detail
    assert "no example folder" in found["tilelang_fp8_example"].detail  # none under tmp_path/tilelang
    assert str(tmp_path) in found["flashmla"].detail and "flash_mla not importable" in found["flashmla"].detail
    assert all(s.as_dict()["present"] is False for s in found.values())
    with pytest.raises(ValueError, match="unknown peer"):
        discover(["nope"])
    # a run on the CPU never probes: every peer runs on CUDA only
    on_cpu = discover(device=CPU)
    assert all(not s.present and "CUDA only" in s.detail for s in on_cpu.values())


def test_a_failing_probe_is_recorded_not_raised(monkeypatch):
    def broken():
        raise RuntimeError("boom")
    monkeypatch.setitem(registry.PROBES, "cudnn", broken)
    status = discover(["cudnn"])["cudnn"]
    assert not status.present and "probe failed" in status.detail and "boom" in status.detail


# ---------------------------------------------------------------------- cross-check helpers

def test_rel_err_and_recall_on_known_values():
    ref = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert rel_err(ref, ref) == 0.0
    assert rel_err(ref + torch.tensor([[0.0, 0.5], [0.0, 0.0]]), ref) == pytest.approx(0.1)
    # -inf entries of the reference (empty slots) are left out of both norms
    ref_inf = torch.tensor([[3.0, -math.inf], [4.0, 0.0]])
    assert rel_err(torch.tensor([[3.0, 7.0], [4.0, 0.5]]), ref_inf) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        rel_err(ref, ref[:1])

    exact = torch.tensor([[5, 1, 3, -1], [0, 1, 2, 3], [-1, -1, -1, -1]], dtype=torch.int32)
    peer = torch.tensor([[3, 5, 7, -1], [3, 2, 1, 0], [-1, -1, -1, -1]], dtype=torch.int32)
    r = topk_recall(peer, exact, rows_per_chunk=2)  # chunks cross the rows
    # row 0: 2 of 3 valid, row 1: 4 of 4, row 2: no valid entry (not counted)
    assert r["recall_rows"] == 2
    assert r["recall_mean"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert r["recall_min"] == pytest.approx(2 / 3)
    assert topk_recall(exact.flip(1), exact)["recall_mean"] == 1.0  # order inside a row does not matter


def test_ab_result_ratio_is_peer_median_over_ours():
    r = ABResult(ours_ms=[1.0, 2.0, 3.0, 100.0, 2.5], peer_ms=[4.0, 5.0, 6.0, 5.5, 0.1])
    assert r.ours_median == statistics.median(r.ours_ms) == 2.5
    assert r.ratio == pytest.approx(5.0 / 2.5)


def test_ab_timer_alternates_calls_on_the_same_input_sets():
    calls = []

    def side(name):
        def fn(arg):
            calls.append((name, arg))
            return torch.tensor(float(arg))
        return fn
    checked = []
    prepared = ABPrepared(Side(side("ours"), [0, 1, 2]), Side(side("peer"), [0, 1, 2]),
                          check=lambda o, p, i: checked.append((float(o), float(p), i)) or {"same": float(o == p)})
    result = ABTimer(CPU, CPU_POLICY).run(prepared)
    assert len(result.ours_ms) == len(result.peer_ms) >= 10
    assert result.checks == {"same": 1.0} and checked == [(0.0, 0.0, 0)]
    timed = calls[4:]  # after the two warm-up calls of each side
    assert len(timed) == 2 * len(result.ours_ms)
    for r in range(len(result.ours_ms)):
        first, second = timed[2 * r], timed[2 * r + 1]
        assert {first[0], second[0]} == {"ours", "peer"}  # each round runs both ...
        assert first[0] == ("ours" if r % 2 == 0 else "peer")  # ... in alternating order
        assert first[1] == second[1] == r % 3  # on the same input set, rotating the sets
    with pytest.raises(ValueError):
        ABTimer(CPU, CPU_POLICY).run(ABPrepared(Side(side("ours"), [0]), Side(side("peer"), [0, 1])))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the round hold is a CUDA spin kernel")
@pytest.mark.parametrize("hold", ["1", "0"])
def test_ab_timer_round_hold_stays_out_of_the_timed_calls(monkeypatch, hold):
    """On the GPU each round starts behind a ~1 ms spin (FLASHDSA_AB_HOLD, default on): it must never be inside
    either side's timed window — a tiny call measures far below the spin's length with the hold on or off."""
    monkeypatch.setenv("FLASHDSA_AB_HOLD", hold)
    x = torch.ones(16, device="cuda")
    prepared = ABPrepared(Side(lambda a: a + 1, [x, x]), Side(lambda a: a * 2, [x, x]))
    result = ABTimer(torch.device("cuda"), CPU_POLICY).run(prepared)
    assert len(result.ours_ms) == len(result.peer_ms) >= 10
    assert result.ours_median < 0.3 and result.peer_median < 0.3, (result.ours_median, result.peer_median)


# ---------------------------------------------------------------------- fake peers: plain torch functions

def torch_sparse_fwd(q, kv, idx, scale, d_v):
    """Sparse MLA forward in plain PyTorch: (out [T, H, d_v], natural-log lse [T, H])."""
    assert d_v == q.shape[-1] - reference.ROPE_WIDTH
    out, lse, _ = reference.sparse_mla_probs(q, kv, idx, scale, torch.float32)
    return out.to(q.dtype), lse


def fake_fwd(ctx, ours_sets):
    s = ctx.shape

    def call(a):
        return torch_sparse_fwd(a["q"], a["kv"], a["idx"], s.scale, s.d_v)
    return ABPrepared(Side(lambda a: ctx.ops.sparse_mla_fwd(a["q"], a["kv"], a["idx"], s.scale), ours_sets),
                      Side(call, ours_sets), fwd_check())


def fake_bwd(ctx, ours_sets):
    s = ctx.shape

    def call(a):  # autograd through the unfused forward
        q, kv = a["q"].detach().requires_grad_(True), a["kv"].detach().requires_grad_(True)
        out, _ = unfused.sparse_mla(q, kv, a["idx"], s.scale, s.d_v, chunk_bytes=CHUNK)
        return torch.autograd.grad(out, (q, kv), a["dout"])
    return ABPrepared(Side(ours_bwd(ctx), ours_sets), Side(call, ours_sets), bwd_check)


def fake_indexer(ctx, ours_sets):
    s = ctx.shape

    def call(a):
        idx, _ = unfused.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], s.topk,
                                      chunk_bytes=CHUNK)
        return idx
    ours = Side(lambda a: ctx.ops.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"],
                                               s.topk, True), ours_sets)
    return ABPrepared(ours, Side(call, ours_sets), recall_check)


def oom_peer(ctx, ours_sets):
    def call(_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB")
    return ABPrepared(Side(lambda a: None, ours_sets), Side(call, ours_sets))


FAKE_PATHS = (
    PeerPath(FWD, "fake", "torch gather+softmax", fake_fwd),
    PeerPath(BWD, "fake", "torch autograd", fake_bwd),
    PeerPath(INDEXER, "fake", "torch scores + topk", fake_indexer),
    PeerPath(FWD, "fake", "fake H=64 only", fake_fwd, heads_ok=lambda h: h == 64, heads_rule="H = 64"),
    PeerPath(FWD, "fake", "fake short T only", fake_fwd, t_ok=lambda t: t < 0, t_rule="T < 0"),
    PeerPath(FWD, "missing", "an absent peer", fake_fwd),
)
FAKE_PEERS = {"fake": PeerStatus("fake", "torch", True, "plain torch functions", module=object()),
              "missing": PeerStatus("missing", "nothing", False, "not importable: ModuleNotFoundError")}


def test_fake_peers_run_ab_with_checks(cfg, ops):
    out = io.StringIO()
    result = run_peers(cfg, ops, CPU_POLICY, out, max_seconds=120, plan=make_plan(cfg), peers=FAKE_PEERS,
                       paths=FAKE_PATHS)
    rows = result["rows"]
    s = cfg.dsa
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert len(rows) == len(cfg.seq_lens) * len(FAKE_PATHS)
    by = {(r["peer"], r["t"]): r for r in rows}
    for t in cfg.seq_lens:
        for label in ("torch gather+softmax", "torch autograd", "torch scores + topk"):
            r = by[(label, t)]
            assert r["status"] == "ok", r
            assert r["rounds"] >= 10 and len(r["ours_ms_all"]) == len(r["peer_ms_all"]) == r["rounds"]
            assert r["ratio"] == pytest.approx(r["peer_ms"] / r["ours_ms"])
            assert r["peer_ms"] == pytest.approx(statistics.median(r["peer_ms_all"]))
            assert r["ours_tflops"] == pytest.approx(r["flops"] / (r["ours_ms"] * 1e-3) / 1e12)
            assert r["peer_tflops"] * r["peer_ms"] == pytest.approx(r["ours_tflops"] * r["ours_ms"])
        fwd = by[("torch gather+softmax", t)]
        assert fwd["heads"] == s.heads and fwd["kernel"] == FWD
        # The fake peer runs in float32 through torch's einsum, ours accumulates in double: the difference is float32
        # rounding (≈ 2e-7 here; one CI machine's torch build gave 1.8e-5), far below an indexing error (≈ 1).
        assert fwd["checks"]["out_rel_err"] < 1e-4 and fwd["checks"]["lse_max_abs_err"] < 1e-4
        bwd = by[("torch autograd", t)]
        assert bwd["checks"]["dq_rel_err"] < 1e-4 and bwd["checks"]["dkv_rel_err"] < 1e-4
        idx = by[("torch scores + topk", t)]
        assert idx["heads"] == s.index_heads
        # float32 scores summed in another order can swap two near-equal keys at the K-th place (seen: one of 4096)
        assert idx["checks"]["recall_mean"] >= 0.999 and idx["checks"]["recall_rows"] == t
        assert by[("fake H=64 only", t)]["status"] == "n/a" and "H = 64" in by[("fake H=64 only", t)]["reason"]
        assert by[("fake short T only", t)]["status"] == "n/a" and "T < 0" in by[("fake short T only", t)]["reason"]
        absent = by[("an absent peer", t)]
        assert absent["status"] == "absent" and "not importable" in absent["reason"]
    lines = out.getvalue().splitlines()
    assert any("peer fake" in line and "present" in line for line in lines)
    assert sum("peers    " in line for line in lines) == len(rows)  # one progress line per case


def test_out_of_memory_stops_the_series(cfg, ops):
    plan = PeerPlan((64, 128, 256), (FWD,), heads={FWD: (cfg.dsa.heads,)})
    result = run_peers(cfg, ops, CPU_POLICY, io.StringIO(), max_seconds=60, plan=plan, peers=FAKE_PEERS,
                       paths=(PeerPath(FWD, "fake", "oom", oom_peer),))
    statuses = [(r["t"], r["status"]) for r in result["rows"]]
    assert statuses == [(64, "oom"), (128, "skipped"), (256, "skipped")]
    assert "out of memory" in result["rows"][1]["reason"]


def test_a_declined_case_is_not_applicable_and_a_lost_context_skips_the_rest(cfg, ops, monkeypatch):
    """An adapter raising NotApplicable records n/a with its message and the run goes on; a sticky CUDA error that
    surfaces only in the cleanup after a case (torch.cuda.empty_cache) marks that case an error, the rest skipped,
    and the run still returns its rows (it used to raise out of the cleanup)."""
    from bench.runner import NotApplicable

    def declined(ctx, ours_sets):
        raise NotApplicable("its selector would overflow on these inputs")
    plan = PeerPlan((64, 128), (FWD,), heads={FWD: (cfg.dsa.heads,)})
    result = run_peers(cfg, ops, CPU_POLICY, io.StringIO(), max_seconds=60, plan=plan, peers=FAKE_PEERS,
                       paths=(PeerPath(FWD, "fake", "declined", declined), PeerPath(FWD, "fake", "fine", fake_fwd)))
    by = {(r["peer"], r["t"]): r for r in result["rows"]}
    assert all(by[("declined", t)]["status"] == "n/a" for t in (64, 128))
    assert by[("declined", 64)]["reason"] == "its selector would overflow on these inputs"
    assert all(by[("fine", t)]["status"] == "ok" for t in (64, 128))

    from bench.peers.runner import PeerRunner
    calls = []

    def broken_cleanup():
        calls.append(1)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "empty_cache", broken_cleanup)
    real_init = PeerRunner.__init__

    def on_cuda_init(self, *args, **kwargs):  # the cleanup path of a CUDA run, on the CPU
        real_init(self, *args, **kwargs)
        self.on_cuda = True
    monkeypatch.setattr(PeerRunner, "__init__", on_cuda_init)
    result = run_peers(cfg, ops, CPU_POLICY, io.StringIO(), max_seconds=60, plan=plan, peers=FAKE_PEERS,
                       paths=(PeerPath(FWD, "fake", "fine", fake_fwd),))
    statuses = [(r["t"], r["status"]) for r in result["rows"]]
    assert calls and statuses == [(64, "error"), (128, "skipped")], result["rows"]
    assert "illegal memory access" in result["rows"][0]["reason"]
    assert "context lost" in result["rows"][1]["reason"]


def fp16_threshold_bin_load(row, lo, hi, topk):
    """TileLang's example selector's first pass on one row, in numpy: the entries of its threshold bin."""
    x = row[lo:hi].astype(np.float32)
    bits = x.astype(np.float16).view(np.uint16).astype(np.int64)
    key = np.where(x < 0, ~bits & 0xFFFF, bits | 0x8000) >> 8
    hist = np.bincount(key, minlength=256)
    suffix = np.cumsum(hist[::-1])[::-1]
    reach = np.nonzero(suffix >= topk)[0]
    return int(hist[reach.max()] if reach.size else hist[0])


def test_tilelang_topk_bin_load_matches_the_selector_rule():
    """tilelang_topk_bin_load (chunked torch) = the selector's first pass per row (numpy), with signed values, key
    ranges, a row with fewer entries than topk (its bin 0) and a row of equal values (one bin holds them all)."""
    from bench.peers.cases import tilelang_topk_bin_load
    gen = torch.Generator().manual_seed(3)
    rows, n, topk = 37, 700, 64
    logits = torch.randn(rows, n, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen))
    logits[5] = 0.25  # every entry in one bin
    starts = torch.randint(0, 200, (rows,), generator=gen, dtype=torch.int32)
    ends = torch.clamp(starts + torch.randint(1, 700, (rows,), generator=gen, dtype=torch.int32), max=n)
    ends[7] = starts[7] + 10  # fewer than topk entries
    want = [fp16_threshold_bin_load(logits[r].numpy(), int(starts[r]), int(ends[r]), topk) for r in range(rows)]
    load, row = tilelang_topk_bin_load(logits, starts, ends, topk, rows_per_chunk=8)
    assert load == max(want) and want[row] == load
    assert load == int(ends[5] - starts[5]) and row == 5
    for r in (7, 11):  # (0, -1): no row puts an entry into its threshold bin
        assert tilelang_topk_bin_load(logits[r:r + 1], starts[r:r + 1], ends[r:r + 1], topk)[0] == want[r]


def test_tilelang_fp8_example_top_k_declines_an_overflowing_input(tl_example, cfg, monkeypatch):
    """When a row would put more entries into the selector's threshold bin than its buffer holds, the top-k paths
    are n/a (not run), the logits-alone path still runs; below the capacity the load is reported."""
    from bench.peers import cases as peer_cases
    s = cfg.dsa
    plan = PeerPlan((128,), (INDEXER,), heads={INDEXER: (s.index_heads,)})
    monkeypatch.setattr(peer_cases, "TILELANG_TOPK_BIN_CAPACITY", 1)
    result = run_peers(cfg, torch.ops.flashdsa, CPU_POLICY, io.StringIO(), max_seconds=120, plan=plan,
                       peers={"tilelang_fp8_example": tl_example}, paths=TL_FP8_PATHS)
    by = {r["peer"]: r for r in result["rows"]}
    for label in ("TileLang FP8 example logits + top-k", "TileLang FP8 example quantize + logits + top-k"):
        assert by[label]["status"] == "n/a" and "threshold-bin buffer" in by[label]["reason"], by[label]
    assert by["TileLang FP8 example logits alone"]["status"] == "ok"
    monkeypatch.setattr(peer_cases, "TILELANG_TOPK_BIN_CAPACITY", 4096)
    result = run_peers(cfg, torch.ops.flashdsa, CPU_POLICY, io.StringIO(), max_seconds=120, plan=plan,
                       peers={"tilelang_fp8_example": tl_example}, paths=TL_FP8_PATHS)
    picked = next(r for r in result["rows"] if r["peer"] == "TileLang FP8 example logits + top-k")
    assert picked["status"] == "ok" and 1 <= picked["checks"]["tl_bin_max"] <= 128, picked


def test_standard_plan_covers_the_issue_points():
    gpu_like = dataclasses.replace(make_config(CPU), device=torch.device("cuda", 0), dsa=GLM5_DSA)
    plan = make_plan(gpu_like, (4096, 8192, 16384, 32768, 65536, 131072))
    assert plan.points(FWD) == [(t, 64) for t in (4096, 8192, 16384)] + [(32768, 64), (32768, 128)] + \
        [(65536, 64), (131072, 64)]
    assert [(t, h) for t, h in plan.points(BWD) if t == 32768] == [(32768, 64), (32768, 16), (32768, 32),
                                                                    (32768, 128)]
    assert {h for _, h in plan.points(INDEXER)} == {32, 64} and len(plan.points(INDEXER)) == 12
    # every real peer path is built for every point (absent ones are reported, not dropped)
    cases = build_peer_cases(make_config(CPU, seq_lens=(64,)), make_plan(make_config(CPU, seq_lens=(64,))),
                             {}, None)
    assert {(c.kernel, c.peer) for c in cases} == {(p.kernel, p.label) for p in PATHS}


# ---------------------------------------------------------------------- report

def test_peers_table_renders_ratio_rates_checks_and_status():
    rows = [
        {"kernel": FWD, "t": 8192, "heads": 64, "peer": "FlashMLA SM90 sparse prefill", "status": "ok", "reason": "",
         "peer_ms": 3.73, "ours_ms": 4.18, "ratio": 3.73 / 4.18, "peer_tflops": 627.0, "ours_tflops": 559.4,
         "checks": {"out_rel_err": 4e-5, "lse_max_abs_err": 2e-6}},
        {"kernel": INDEXER, "t": 131072, "heads": 32, "peer": "cuDNN bf16 scores + top-k", "status": "oom",
         "reason": "OutOfMemoryError: Tried to allocate 128.00 GiB", "peer_ms": None, "ours_ms": None,
         "ratio": None, "peer_tflops": None, "ours_tflops": None, "checks": {}},
        {"kernel": INDEXER, "t": 8192, "heads": 32, "peer": "TileLang logits + torch.topk (megatron-core)",
         "status": "ok", "reason": "", "peer_ms": 1.1, "ours_ms": 1.0, "ratio": 1.1, "peer_tflops": 251.0,
         "ours_tflops": 276.1, "checks": {"recall_mean": 0.97812, "recall_min": 0.91, "recall_rows": 8192.0}},
    ]
    lines = peers_table(rows, gemm_tflops=751.2)
    text = "\n".join(lines)
    assert lines[0].startswith("| kernel | T | H | peer | peer ms | ours ms | ratio (peer / ours) |")
    assert len(lines) == 2 + len(rows)
    assert "| sparse_mla_fwd | 8K | 64 | FlashMLA SM90 sparse prefill | 3.730 | 4.180 | 0.89× | 627.0 | 559.4 | 751.2 |" in text
    assert "out rel 4.0e-05, lse abs 2.0e-06" in text
    assert "oom: OutOfMemoryError: Tried to allocate 128.00 GiB" in text and "| 128K | 32 |" in text
    assert "recall 0.97812, min row 0.9100" in text and "| 1.10× |" in text
    section = render_peers_section({"status": [{"key": "cudnn", "package": "cudnn pkg", "present": False,
                                                "detail": "needs a CUDA device"}], "rows": rows}, 751.2)
    assert section[0] == "## vs peers"
    assert "- cudnn pkg: absent (needs a CUDA device)" in section


def test_run_py_only_peers_writes_the_vs_peers_table(tmp_path):
    """bench/run.py --only peers on the CPU: every peer absent, the report still has the table."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--device", "cpu", "--quick",
                           "--only", "peers", "--out", str(tmp_path)], capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    peers = results["summary"]["peers"]
    assert {s["key"] for s in peers["status"]} == {"flashmla", "cudnn", "tilelang", "tilelang_fp8_example"}
    assert peers["rows"] and all(r["status"] in ("absent", "n/a") for r in peers["rows"])
    assert {r["section"] for r in results["records"]} == {"ceiling"}
    report = (tmp_path / "report.md").read_text()
    assert "## vs peers" in report and "| kernel | T | H | peer |" in report
    assert report.count("absent: ") >= len(PATHS)
    assert "peers    sparse_mla_fwd" in proc.stdout  # progress lines


# ---------------------------------------------------------------------- GPU-machine set-up script

def _sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True, **kw)


def test_peers_gpu_script_unpacks_parts_arriving_over_several_calls(tmp_path):
    """scripts/peers_gpu.sh keeps parts across calls and unpacks a set only once all its parts (by the
    MANIFEST, sha256-checked) are there; idempotent; writes env.sh with the set on PYTHONPATH."""
    repo, peers = tmp_path / "repo", tmp_path / "peers"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "peers_gpu.sh").write_text((ROOT / "scripts" / "peers_gpu.sh").read_text())
    site = tmp_path / "site" / "fakepkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("VALUE = 42\n")
    (site / "blob.bin").write_bytes(os.urandom(300_000))  # incompressible: the archive splits in parts
    staged = tmp_path / "staged"
    staged.mkdir()
    _sh(["tar", "-cJf", str(tmp_path / "cudnn.tar.xz"), "-C", str(tmp_path / "site"), "."])
    _sh(["split", "-b", "200K", "-d", "-a", "2", str(tmp_path / "cudnn.tar.xz"), str(staged / "cudnn.tar.xz.part")])
    parts = sorted(p.name for p in staged.iterdir())
    assert parts == ["cudnn.tar.xz.part00", "cudnn.tar.xz.part01"]
    manifest = "".join(f"{n} {(staged / n).stat().st_size} "
                       f"{_sh(['sha256sum', str(staged / n)]).stdout.split()[0]}\n" for n in parts)
    env = dict(os.environ, FLASHDSA_PEERS_DIR=str(peers), PEERS_SKIP_BUILD="1")

    def call(*names):
        stage = repo / ".peers"
        if stage.exists():
            for f in stage.iterdir():
                f.unlink()
        stage.mkdir(exist_ok=True)
        (stage / "MANIFEST").write_text(manifest)
        for n in names:
            (stage / n).write_bytes((staged / n).read_bytes())
        return _sh(["bash", str(repo / "scripts" / "peers_gpu.sh")], env=env).stdout

    out = call("cudnn.tar.xz.part00")
    assert "cudnn: waiting for cudnn.tar.xz.part01" in out and not (peers / "cudnn" / ".unpacked").exists()
    out = call("cudnn.tar.xz.part01")
    assert "cudnn: unpacked 2 part(s)" in out
    assert (peers / "cudnn" / "fakepkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert "cudnn: unpacked earlier" in call()
    env_sh = (peers / "env.sh").read_text()
    assert f"PYTHONPATH={peers}/cudnn:" in env_sh and "TILELANG_CACHE_DIR" in env_sh
    check = subprocess.run(["bash", "-c", f"source {peers}/env.sh && python3 -c 'import fakepkg; print(fakepkg.VALUE)'"],
                           capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == "42", check.stderr

    # a corrupted part is refused (and nothing is unpacked)
    bad_peers = tmp_path / "peers_bad"
    env["FLASHDSA_PEERS_DIR"] = str(bad_peers)
    (staged / "cudnn.tar.xz.part01").write_bytes(b"corrupt")
    out = call("cudnn.tar.xz.part00", "cudnn.tar.xz.part01")
    assert "checksum mismatch in cudnn.tar.xz.part01" in out and not (bad_peers / "cudnn").exists()


def test_peers_gpu_script_uses_only_the_parts_its_manifest_lists(tmp_path):
    """A new (slim, one-file) staging replaces an earlier split one: scripts/peers_gpu.sh unpacks the
    file the MANIFEST lists and ignores split parts left in its parts folder by an earlier call."""
    repo, peers = tmp_path / "repo", tmp_path / "peers"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "peers_gpu.sh").write_text((ROOT / "scripts" / "peers_gpu.sh").read_text())
    env = dict(os.environ, FLASHDSA_PEERS_DIR=str(peers), PEERS_SKIP_BUILD="1")

    def archive(value, name):
        site = tmp_path / f"site_{value}" / "fakepkg"
        site.mkdir(parents=True)
        (site / "__init__.py").write_text(f"VALUE = {value}\n")
        _sh(["tar", "-cJf", str(tmp_path / name), "-C", str(site.parent), "."])
        return tmp_path / name

    def stage(files, listed_only=()):
        """Sends `files` with a MANIFEST that lists them and the `listed_only` names (not sent)."""
        stage_dir = repo / ".peers"
        if stage_dir.exists():
            for f in stage_dir.iterdir():
                f.unlink()
        stage_dir.mkdir(exist_ok=True)
        listed = dict(files, **{name: files_all[name] for name in listed_only})
        (stage_dir / "MANIFEST").write_text("".join(
            f"{name} {path.stat().st_size} {_sh(['sha256sum', str(path)]).stdout.split()[0]}\n"
            for name, path in listed.items()))
        for name, path in files.items():
            (stage_dir / name).write_bytes(path.read_bytes())
        return _sh(["bash", str(repo / "scripts" / "peers_gpu.sh")], env=env).stdout

    old = archive(1, "old.tar.xz")
    _sh(["split", "-n", "2", "-d", "-a", "2", str(old), str(tmp_path / "old.part")])
    files_all = {"cudnn.tar.xz.part00": tmp_path / "old.part00", "cudnn.tar.xz.part01": tmp_path / "old.part01"}
    # an earlier split staging: only its first part arrived (the set waits for the second one)
    out = stage({"cudnn.tar.xz.part00": files_all["cudnn.tar.xz.part00"]}, listed_only=["cudnn.tar.xz.part01"])
    assert "cudnn: waiting for cudnn.tar.xz.part01" in out and not (peers / "cudnn" / ".unpacked").exists(), out
    new = archive(7, "cudnn.tar.xz")
    out = stage({"cudnn.tar.xz": new})
    assert (peers / "cudnn" / ".unpacked").exists(), out
    assert (peers / "cudnn" / "fakepkg" / "__init__.py").read_text() == "VALUE = 7\n"


def test_peer_ratio_plot_merges_runs_and_draws(tmp_path):
    """Rows of a later results.json replace equal (kernel, peer, T, heads) rows only when they carry a
    ratio; the plot is written and leaves out rows without a ratio."""
    import json

    from bench import plots

    def row(kernel, peer, t, heads, ratio, status="ok"):
        return dict(kernel=kernel, peer=peer, t=t, heads=heads, ratio=ratio, status=status)

    first = [row("sparse_mla_fwd", "FlashMLA", 8192, 64, 1.03), row("sparse_mla_bwd", "cuDNN", 8192, 64, None, "absent")]
    second = [row("sparse_mla_fwd", "FlashMLA", 8192, 64, None, "absent"), row("sparse_mla_bwd", "cuDNN", 8192, 64, 1.06),
              row("indexer_topk", "cuDNN", 32768, 32, 0.84)]
    paths = []
    for i, rows in enumerate((first, second)):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({"summary": {"peers": {"status": "ok", "rows": rows}}}))
        paths.append(path)
    merged = {(r["kernel"], r["peer"]): r for r in plots.merge_peer_rows(paths)}
    assert merged[("sparse_mla_fwd", "FlashMLA")]["ratio"] == 1.03  # not replaced by the later absent row
    assert merged[("sparse_mla_bwd", "cuDNN")]["ratio"] == 1.06
    assert len(merged) == 3
    out = plots.plot_peer_ratios(list(merged.values()), tmp_path / "peers.png")
    assert out.stat().st_size > 10_000
    # A run on shuffled index rows keeps its own line instead of replacing the ascending rows.
    shuffled = tmp_path / "shuffled.json"
    shuffled.write_text(json.dumps({"meta": {"index_order": "shuffled"},
                                    "summary": {"peers": {"rows": [row("sparse_mla_bwd", "cuDNN", 8192, 64, 1.2)]}}}))
    both = {(r["kernel"], r["peer"]): r for r in plots.merge_peer_rows(paths + [shuffled])}
    assert both[("sparse_mla_bwd", "cuDNN")]["ratio"] == 1.06
    assert both[("sparse_mla_bwd", "cuDNN, shuffled rows")]["ratio"] == 1.2


# ---------------------------------------------------------------------- our indexer on the fp8 selection

class CountingOps:
    """A stand-in for torch.ops.flashdsa: the real ops, counting the calls of the raw (bf16) indexer_topk."""

    def __init__(self):
        self.indexer_calls = 0

    def indexer_topk(self, *args):
        self.indexer_calls += 1
        return torch.ops.flashdsa.indexer_topk(*args)

    def __getattr__(self, name):
        return getattr(torch.ops.flashdsa, name)


class FakeCudnnIndexer:
    """cuDNN frontend's indexer wrappers in plain PyTorch: dense ReLU scores [1, T, T] (-inf above the
    causal diagonal), then torch.topk (-1 for empty slots)."""

    def indexer_forward_wrapper(self, q, k, weights, ratio, sm_scale):
        assert ratio == 1 and sm_scale == 1.0
        logits = torch.einsum("thd,sd->ths", q[0].float(), k[0, :, 0].float()).relu()
        scores = torch.einsum("th,ths->ts", weights[0].float(), logits)
        t = scores.shape[0]
        causal = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
        return {"scores": scores.masked_fill(~causal, -math.inf).unsqueeze(0)}

    def indexer_top_k_wrapper(self, scores, k_end, topk):
        values, indices = scores.topk(topk, dim=1)
        return {"indices": torch.where(torch.isfinite(values), indices, -1).to(torch.int32)}


CUDNN_INDEXER_PATHS = tuple(p for p in PATHS if p.kernel == INDEXER and p.peer_key == "cudnn")
FAKE_CUDNN = {"cudnn": PeerStatus("cudnn", "torch", True, "plain torch functions", module=FakeCudnnIndexer())}


def _index_set(cfg, t):
    from bench.peers.cases import Context, index_inputs
    ctx = Context(cfg, cfg.dsa, t, CountingOps(), None, 1)
    return ctx, index_inputs(ctx)


def test_indexer_selection_option_reaches_config_meta_and_report():
    from bench import run as bench_run
    from bench.report import render_markdown
    from bench.config import INDEXER_SELECTIONS
    assert INDEXER_SELECTIONS == ("bf16", "fp8", "fp8-band", "fp8-fast", "fp8-scaled")
    assert bench_run.parse_args([]).indexer_selection == "bf16"
    args = bench_run.parse_args(["--only", "peers", "--indexer-selection", "fp8"])
    assert args.indexer_selection == "fp8"
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--indexer-selection", "fp4"])
    assert make_config(CPU).indexer_selection == "bf16"
    with pytest.raises(ValueError, match="indexer selection"):
        make_config(CPU, indexer_selection="fp4")
    cfg = make_config(CPU, quick=True, sections=["peers"], indexer_selection="fp8")
    assert cfg.indexer_selection == "fp8"
    meta = bench_run.run_meta(cfg, "imported", CPU_POLICY)
    assert meta["indexer_selection"] == "fp8"
    summary = {"headline": {"dense_reference": "dense 256", "crossover_dsa": {"kind": "none"},
                            "crossover_index_share": {"kind": "none"}, "speedup_t": None, "speedup": None,
                            "speedup_index_share_t": None, "speedup_index_share": None, "index_share_gain": {},
                            "vs_unfused_t": None, "vs_unfused": None, "extra_memory_128k": None},
               "kernels": [], "layer": [], "memory": [], "gemm_tflops": None}
    report = render_markdown(cfg, dict(meta, wall_s=1.0), [], summary)
    assert "- Peers A/B, ours: indexer_topk selection=fp8" in report
    without_peers = dataclasses.replace(cfg, sections=("kernels",))
    assert "Peers A/B" not in render_markdown(without_peers, dict(meta, wall_s=1.0), [], summary)


def test_ours_indexer_routes_to_the_fp8_path(monkeypatch):
    """fp8: ours_indexer calls the public flashdsa.indexer_topk(..., selection="fp8") (not the raw bf16
    op of ctx.ops); bf16 (default): the raw op, exactly as before."""
    from flashdsa import ops as flashdsa_ops
    from bench.peers.cases import ours_indexer
    cfg = make_config(CPU, quick=True, seq_lens=(128,), indexer_selection="fp8")
    ctx, a = _index_set(cfg, 128)
    args = (a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], cfg.dsa.topk, True)
    idx, scores = ours_indexer(ctx)(a)
    assert ctx.ops.indexer_calls == 0
    want_idx, want_scores = flashdsa_ops.indexer_topk(*args, selection="fp8")
    assert torch.equal(idx, want_idx) and torch.equal(scores, want_scores)

    seen = []
    real = flashdsa_ops.indexer_topk

    def spy(*call_args, **kwargs):
        seen.append(kwargs)
        return real(*call_args, **kwargs)
    monkeypatch.setattr(flashdsa_ops, "indexer_topk", spy)
    ours_indexer(ctx)(a)
    assert seen == [{"selection": "fp8", "fp8_band": None}] and ctx.ops.indexer_calls == 0

    # fp8-band: the same public function with the band re-score of K / 4 (indices only).
    band_ctx = dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, indexer_selection="fp8-band"))
    seen.clear()
    monkeypatch.setattr(flashdsa_ops, "indexer_topk", lambda *call_args, **kwargs: seen.append(kwargs))
    ours_indexer(band_ctx)(a)
    assert seen == [{"selection": "fp8", "fp8_band": cfg.dsa.topk // 4}] and band_ctx.ops.indexer_calls == 0
    # fp8-fast: the band of K / 8 over K + K / 8 candidates.
    fast_ctx = dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, indexer_selection="fp8-fast"))
    seen.clear()
    ours_indexer(fast_ctx)(a)
    k = cfg.dsa.topk
    assert seen == [{"selection": "fp8", "fp8_band": k // 8, "fp8_candidates": k + k // 8}]
    # fp8-scaled: fp8-fast with the band scaled to each row's keys.
    scaled_ctx = dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, indexer_selection="fp8-scaled"))
    seen.clear()
    ours_indexer(scaled_ctx)(a)
    assert seen == [{"selection": "fp8", "fp8_band": k // 8, "fp8_candidates": k + k // 8, "fp8_band_scaled": True}]
    with pytest.raises(ValueError, match="not an FP8 selection"):
        fp8_selection_kwargs("bf16", k)
    monkeypatch.setattr(flashdsa_ops, "indexer_topk", spy)

    bf16_ctx = dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, indexer_selection="bf16"))
    idx, scores = ours_indexer(bf16_ctx)(a)
    assert len(seen) == 1 and bf16_ctx.ops.indexer_calls == 1  # the raw op, not the public function
    exact_idx, exact_scores = torch.ops.flashdsa.indexer_topk(*args)
    assert torch.equal(idx, exact_idx) and torch.equal(scores, exact_scores)


def test_fp8_peers_ab_checks_against_the_exact_top_k(cfg, monkeypatch):
    """The cuDNN indexer paths (fake module) A/B with our fp8 selection: the check computes our exact
    bf16 top-k once (outside the timing), compares the peer with it, and adds the fp8 recall of it."""
    fp8_cfg = dataclasses.replace(cfg, indexer_selection="fp8")
    ops = CountingOps()
    plan = PeerPlan((64, 128), (INDEXER,), heads={INDEXER: (cfg.dsa.index_heads,)})
    out = io.StringIO()
    result = run_peers(fp8_cfg, ops, CPU_POLICY, out, max_seconds=120, plan=plan, peers=FAKE_CUDNN,
                       paths=CUDNN_INDEXER_PATHS)
    assert result["indexer_selection"] == "fp8"
    assert "ours: indexer_topk selection=fp8" in out.getvalue()
    rows = result["rows"]
    assert len(rows) == 2 * len(CUDNN_INDEXER_PATHS) and all(r["status"] == "ok" for r in rows)
    assert ops.indexer_calls == len(rows)  # the exact top-k of the checked set only, never timed
    for r in rows:
        checks = r["checks"]
        assert checks["fp8_recall_mean"] == 1.0 and checks["fp8_recall_min"] == 1.0  # T < candidates: exact
        if r["peer"] == "cuDNN bf16 scores + top-k":  # fp32 rounding may swap a key at the K-th place
            assert checks["recall_mean"] > 0.99 and checks["recall_rows"] == r["t"]
        else:
            assert checks["scores_rel_err"] < 1e-5
    section = "\n".join(render_peers_section(result, None))
    assert "ours: indexer_topk selection=fp8 (flashdsa.indexer_topk" in section
    assert "| indexer_topk (ours fp8) | 64 |" in section and "fp8 recall 1.00000, fp8 min row 1.0000" in section

    # A worse fp8 selection (each row's last slot dropped) lowers the fp8 recall only: the peer's recall
    # is still that of our exact top-k.
    from flashdsa import ops as flashdsa_ops
    real = flashdsa_ops.indexer_topk

    def drop_last(*args, **kwargs):
        idx, scores = real(*args, **kwargs)
        return idx[:, :-1], scores[:, :-1]
    monkeypatch.setattr(flashdsa_ops, "indexer_topk", drop_last)
    plan = PeerPlan((128,), (INDEXER,), heads={INDEXER: (cfg.dsa.index_heads,)})
    result = run_peers(fp8_cfg, CountingOps(), CPU_POLICY, io.StringIO(), max_seconds=120, plan=plan,
                       peers=FAKE_CUDNN, paths=CUDNN_INDEXER_PATHS[:1])
    checks = result["rows"][0]["checks"]
    assert checks["recall_mean"] > 0.99
    k = cfg.dsa.topk
    assert checks["fp8_recall_min"] == pytest.approx((k - 1) / k)
    assert (k - 1) / k < checks["fp8_recall_mean"] < 1.0


def test_indexer_check_compares_the_peer_with_the_exact_top_k(cfg):
    """indexer_check (fp8): `check` gets our exact bf16 result, whatever the fp8 side returned; the fp8
    recall is that of the exact top-k. bf16: `check` itself."""
    from bench.peers.cases import indexer_check
    ctx, a = _index_set(dataclasses.replace(cfg, indexer_selection="fp8"), 128)
    exact_idx, exact_scores = torch.ops.flashdsa.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"],
                                                              a["k_end"], cfg.dsa.topk, True)
    wrong = exact_idx.roll(1, dims=0)  # each row holds the previous row's selection
    seen = []

    def check(ours, peer, set_index):
        seen.append(ours)
        return recall_check(ours, peer, set_index)
    checks = indexer_check(ctx, [a], check)((wrong, exact_scores), exact_idx, 0)
    assert torch.equal(seen[0][0], exact_idx) and torch.equal(seen[0][1], exact_scores)
    assert checks["recall_mean"] == 1.0 and checks["recall_min"] == 1.0 and ctx.ops.indexer_calls == 1
    assert checks["fp8_recall_mean"] == pytest.approx(topk_recall(wrong, exact_idx)["recall_mean"])
    assert checks["fp8_recall_mean"] < 0.9 and checks["fp8_recall_min"] < checks["fp8_recall_mean"]
    bf16_ctx = dataclasses.replace(ctx, cfg=cfg)
    assert indexer_check(bf16_ctx, [a], check) is check


def test_bf16_peers_ab_checks_are_unchanged(cfg):
    """Default selection: no extra bf16 call, no fp8 keys, the table and section as before."""
    ops = CountingOps()
    plan = PeerPlan((64,), (INDEXER,), heads={INDEXER: (cfg.dsa.index_heads,)})
    out = io.StringIO()
    result = run_peers(cfg, ops, CPU_POLICY, out, max_seconds=120, plan=plan, peers=FAKE_CUDNN,
                       paths=CUDNN_INDEXER_PATHS)
    assert result["indexer_selection"] == "bf16" and "ours: indexer_topk selection=bf16" in out.getvalue()
    rounds = sum(r["rounds"] + 2 for r in result["rows"])  # warm-ups + timed calls of ours
    assert ops.indexer_calls == rounds
    assert all(not any(key.startswith("fp8") for key in r["checks"]) for r in result["rows"])
    assert result["rows"][0]["checks"]["recall_mean"] == 1.0
    table = "\n".join(peers_table(result["rows"], None))
    assert "| indexer_topk | 64 |" in table and "ours bf16" not in table
    assert "ours: indexer_topk selection=bf16 (the raw op, exact top-k)." in render_peers_section(result, None)


def test_peer_ratio_merge_keeps_fp8_and_bf16_runs_apart(tmp_path):
    """The indexer rows of a run on the fp8 selection get their own line ("<peer>, ours fp8"); its
    attention rows (the same measurement in either run) merge as before."""
    from bench import plots

    def row(kernel, peer, t, heads, ratio):
        return dict(kernel=kernel, peer=peer, t=t, heads=heads, ratio=ratio, status="ok")

    def write(name, rows, meta=None, selection=None):
        peers = {"rows": rows} if selection is None else {"rows": rows, "indexer_selection": selection}
        path = tmp_path / name
        path.write_text(json.dumps({"meta": meta or {}, "summary": {"peers": peers}}))
        return path

    bf16 = write("bf16.json", [row(INDEXER, "cuDNN", 32768, 32, 0.84), row(FWD, "FlashMLA", 8192, 64, 1.03)],
                 meta={"indexer_selection": "bf16"})
    fp8 = write("fp8.json", [row(INDEXER, "cuDNN", 32768, 32, 1.31), row(FWD, "FlashMLA", 8192, 64, 1.05)],
                meta={"indexer_selection": "fp8"})
    merged = {(r["kernel"], r["peer"]): r for r in plots.merge_peer_rows([bf16, fp8])}
    assert merged[(INDEXER, "cuDNN")]["ratio"] == 0.84
    assert merged[(INDEXER, "cuDNN, ours fp8")]["ratio"] == 1.31
    assert merged[(FWD, "FlashMLA")]["ratio"] == 1.05 and len(merged) == 3
    # the fp8 run first: the bf16 run does not overwrite it either
    merged = {(r["kernel"], r["peer"]): r["ratio"] for r in plots.merge_peer_rows([fp8, bf16])}
    assert merged[(INDEXER, "cuDNN")] == 0.84 and merged[(INDEXER, "cuDNN, ours fp8")] == 1.31
    # without the meta, summary.peers.indexer_selection says it; older results (neither) are bf16
    bare = write("bare.json", [row(INDEXER, "cuDNN", 32768, 32, 1.4)], selection="fp8")
    old = write("old.json", [row(INDEXER, "cuDNN", 65536, 32, 0.9)])
    peers = {(r["peer"], r["t"]) for r in plots.merge_peer_rows([bare, old])}
    assert peers == {("cuDNN, ours fp8", 32768), ("cuDNN", 65536)}
    # shuffled rows and the fp8 selection together
    both = write("both.json", [row(INDEXER, "cuDNN", 32768, 32, 1.2)],
                 meta={"index_order": "shuffled", "indexer_selection": "fp8"})
    assert plots.merge_peer_rows([both])[0]["peer"] == "cuDNN, shuffled rows, ours fp8"
    rows = plots.merge_peer_rows([bf16, fp8])
    assert plots.plot_peer_ratios(rows, tmp_path / "peers.png").stat().st_size > 10_000


def test_run_py_only_peers_with_the_fp8_selection(tmp_path):
    """bench/run.py --only peers --peer-kernels indexer_topk --indexer-selection fp8 on the CPU: the
    selection reaches results.json (meta, summary.peers) and the report (header, section, table)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--device", "cpu", "--quick",
                           "--only", "peers", "--peer-kernels", "indexer_topk", "--indexer-selection", "fp8",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ours: indexer_topk selection=fp8" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["indexer_selection"] == "fp8"
    assert results["summary"]["peers"]["indexer_selection"] == "fp8"
    assert {r["kernel"] for r in results["summary"]["peers"]["rows"]} == {INDEXER}
    report = (tmp_path / "report.md").read_text()
    assert "- Peers A/B, ours: indexer_topk selection=fp8" in report
    assert "ours: indexer_topk selection=fp8 (flashdsa.indexer_topk" in report
    assert "| indexer_topk (ours fp8) |" in report


# ---------------------------------------------------------------------- TileLang's example FP8 indexer (fake)

# Stand-ins for tile-ai/tilelang's examples/deepseek_v32 files, in plain PyTorch: the same file names,
# entry points and argument conventions (fp32 logits [S, S_kv] from e4m3 q [S, H, D], e4m3 k [S_kv, D] with
# per-token fp32 scales, fp32 weights [S, H], int32 ranges [ks, ke); -inf outside with clean_logits; the
# top-k reads only [starts, ends) and pads short rows with 0), and the indexer file imports its sibling
# `utils` as the real one does. Uncleaned entries are +1e30, so a selector fed wrong ranges would pick them.
FAKE_TL_UTILS = '''
import torch


def per_custom_dims_cast_to_fp8(x, dims, use_ue8m0):
    assert tuple(dims) == (0,) and not use_ue8m0
    scale = x.float().abs().amax(dim=1).clamp_min(1e-4) / 448.0
    return (x.float() / scale[:, None]).to(torch.float8_e4m3fn), scale
'''
FAKE_TL_INDEXER = '''
import math

import torch
from utils import per_custom_dims_cast_to_fp8  # noqa: F401 - as the example imports its sibling

CALLS = []


def _meta(x):
    return (tuple(x.shape), x.dtype, x.is_contiguous())


def mqa_attn_return_logits_interface(q, kv, kv_scales, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=True):
    CALLS.append(dict(q=_meta(q), kv=_meta(kv), scales=_meta(kv_scales), weights=_meta(weights),
                      ks=_meta(cu_seqlen_ks), ke=_meta(cu_seqlen_ke), clean=clean_logits))
    score = torch.einsum("shd,nd->shn", q.float(), kv.float() * kv_scales[:, None])
    logits = (score.relu() * weights[:, :, None]).sum(dim=1)
    cols = torch.arange(kv.shape[0])[None, :]
    inside = (cols >= cu_seqlen_ks[:, None].long()) & (cols < cu_seqlen_ke[:, None].long())
    return logits.masked_fill(~inside, -math.inf if clean_logits else 1e30)
'''
FAKE_TL_TOPK = '''
import math

import torch

CALLS = []


def tl_topk(input, starts, ends, topk):
    CALLS.append(dict(input=(tuple(input.shape), input.dtype), starts=tuple(starts.shape), topk=topk))
    cols = torch.arange(input.shape[1])[None, :]
    inside = (cols >= starts[:, None].long()) & (cols < ends[:, None].long())
    values, idx = input.masked_fill(~inside, -math.inf).topk(topk, dim=1)
    return torch.where(torch.isfinite(values), idx, 0).to(torch.int32)
'''
FAKE_TL_FILES = {"fp8_lighting_indexer.py": FAKE_TL_INDEXER, "topk_selector.py": FAKE_TL_TOPK,
                 "utils.py": FAKE_TL_UTILS, "README.md": "fake\n"}
TL_FP8_PATHS = tuple(p for p in PATHS if p.peer_key == "tilelang_fp8_example")


def _fake_tl_examples(root: Path, commit: str = "0123456789abcdef") -> Path:
    """The staged layout (<root>/tilelang_examples/{PEERS_COMMITS, deepseek_v32/...}) with the fakes."""
    folder = root / "tilelang_examples" / "deepseek_v32"
    folder.mkdir(parents=True)
    for name, text in FAKE_TL_FILES.items():
        (folder / name).write_text(text)
    (folder.parent / "PEERS_COMMITS").write_text(f"tilelang {commit}\n")
    return folder


@pytest.fixture
def tl_example(monkeypatch, tmp_path):
    """Probes the tilelang_fp8_example peer on the fake files, with CUDA and `tilelang` pretended present."""
    monkeypatch.setattr(registry, "_cuda_required", lambda: None)
    monkeypatch.setenv("FLASHDSA_PEERS_DIR", str(tmp_path / "peers"))
    monkeypatch.delenv("FLASHDSA_TL_EXAMPLES_DIR", raising=False)
    real_import = registry.importlib.import_module

    def fake_tilelang(name, *args):
        if name == "tilelang":
            return sys.modules.setdefault("flashdsa_test_fake_tilelang", type(sys)("tilelang"))
        return real_import(name, *args)
    monkeypatch.setattr(registry.importlib, "import_module", fake_tilelang)
    _fake_tl_examples(tmp_path / "peers" / "tilelang")
    sentinel = type(sys)("utils")  # some other `utils` module of the process: must stay in place
    monkeypatch.setitem(sys.modules, "utils", sentinel)
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert sys.modules["utils"] is sentinel
    return status


def test_tilelang_fp8_example_is_found_where_the_tilelang_set_puts_it(tl_example, tmp_path, monkeypatch):
    assert tl_example.present, tl_example.detail
    assert "tile-ai/tilelang 012345678" in tl_example.detail
    assert str(tmp_path / "peers" / "tilelang" / "tilelang_examples" / "deepseek_v32") in tl_example.detail
    ex = tl_example.module
    assert ex.indexer.per_custom_dims_cast_to_fp8 is ex.cast_to_fp8  # its `utils` was the sibling file
    assert ex.indexer.__name__ in sys.modules  # TileLang's JIT reads the function source through it
    # FLASHDSA_TL_EXAMPLES_DIR points elsewhere (e.g. a tilelang checkout): no commit file there
    other = _fake_tl_examples(tmp_path / "checkout")
    (other.parent / "PEERS_COMMITS").unlink()
    monkeypatch.setenv("FLASHDSA_TL_EXAMPLES_DIR", str(other))
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert status.present and "commit unknown" in status.detail and str(other) in status.detail


def test_tilelang_fp8_example_absent_reasons(tl_example, tmp_path, monkeypatch):
    folder = tmp_path / "peers" / "tilelang" / "tilelang_examples" / "deepseek_v32"
    (folder / "topk_selector.py").write_text("def other():\n    pass\n")  # the entry point renamed upstream
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert not status.present and "not importable" in status.detail and "no callable tl_topk" in status.detail
    (folder / "utils.py").unlink()
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert not status.present and "utils.py not in" in status.detail
    monkeypatch.setenv("FLASHDSA_TL_EXAMPLES_DIR", str(tmp_path / "nowhere"))
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert not status.present and "no example folder" in status.detail
    monkeypatch.setattr(registry, "_cuda_required", lambda: "needs a CUDA device (none here)")
    assert "CUDA" in discover(["tilelang_fp8_example"])["tilelang_fp8_example"].detail


def test_tilelang_fp8_rows_keep_the_logits_within_the_budget(monkeypatch):
    from bench.peers.cases import tilelang_fp8_rows
    monkeypatch.delenv("FLASHDSA_TL_FP8_LOGITS_GIB", raising=False)
    # 32K: 4 GiB, 2^30 elements, one call; 64K / 128K: blocks of fewer than 2^31 elements (int32 offsets)
    assert [tilelang_fp8_rows(t) for t in (8192, 32768, 65536, 131072)] == [8192, 32768, 32640, 16256]
    assert all(tilelang_fp8_rows(t) * t < 2 ** 31 for t in (65536, 131072, 262144))
    monkeypatch.setenv("FLASHDSA_TL_FP8_LOGITS_GIB", "64")
    assert tilelang_fp8_rows(131072) == 16256  # the element bound holds whatever the byte budget
    monkeypatch.setenv("FLASHDSA_TL_FP8_LOGITS_GIB", "1")
    assert tilelang_fp8_rows(32768) == 8192
    monkeypatch.setenv("FLASHDSA_TL_FP8_LOGITS_GIB", "0.000001")
    assert tilelang_fp8_rows(4096) == 128  # never below one 128-row tile
    assert all(p.heads_ok(32) and p.heads_ok(64) and not p.heads_ok(256) and not p.heads_ok(48)
               for p in TL_FP8_PATHS)
    assert {p.label for p in TL_FP8_PATHS} == {"TileLang FP8 example logits + top-k",
                                               "TileLang FP8 example quantize + logits + top-k",
                                               "TileLang FP8 example logits alone"}
    # its top-k overran its selector's shared buffer at 128K on the H200: those paths stop at 64K
    by_label = {p.label: p for p in TL_FP8_PATHS}
    for label in ("TileLang FP8 example logits + top-k", "TileLang FP8 example quantize + logits + top-k"):
        assert by_label[label].t_ok(65536) and not by_label[label].t_ok(131072)
    assert by_label["TileLang FP8 example logits alone"].t_ok(131072)


@pytest.mark.parametrize("selection", ["bf16", "fp8"])
def test_tilelang_fp8_example_adapters_call_shapes_and_checks(tl_example, cfg, monkeypatch, selection):
    """Both paths through the real loader on the fake files: the example's e4m3 inputs (quantized outside
    the timing), its entry point on row blocks (one call at T = 128, two 128-row blocks at T = 256 with
    the budget set to 128 KiB), clean_logits as documented, the top-k per block, and the checks."""
    ex = tl_example.module
    monkeypatch.setenv("FLASHDSA_TL_FP8_LOGITS_GIB", str(128 * 256 * 4 / 2 ** 30))
    run_cfg = dataclasses.replace(cfg, indexer_selection=selection)
    s = run_cfg.dsa
    plan = PeerPlan((128, 256), (INDEXER,), heads={INDEXER: (s.index_heads,)})
    out = io.StringIO()
    result = run_peers(run_cfg, torch.ops.flashdsa, CPU_POLICY, out, max_seconds=120, plan=plan,
                       peers={"tilelang_fp8_example": tl_example}, paths=TL_FP8_PATHS)
    rows = {(r["peer"], r["t"]): r for r in result["rows"]}
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows.values()), result["rows"]
    for t in (128, 256):
        picked = rows[("TileLang FP8 example logits + top-k", t)]["checks"]
        assert picked["recall_rows"] == t and picked["recall_mean"] > 0.9, picked
        # like for like (its quantization inside the timed call; each row has its own random inputs)
        timed = rows[("TileLang FP8 example quantize + logits + top-k", t)]["checks"]
        assert timed["recall_rows"] == t and timed["recall_mean"] > 0.9, timed
        alone = rows[("TileLang FP8 example logits alone", t)]["checks"]
        assert 0 < alone["scores_rel_err"] < 0.1, alone  # e4m3 q and k vs our exact bf16 scores
        if selection == "fp8":
            assert "fp8_recall_mean" in picked and "fp8_recall_mean" in alone
    calls = ex.indexer.CALLS
    h, d = s.index_heads, s.index_dim
    for c in calls:
        n = c["q"][0][0]
        assert n in (128,) and c["q"][1:] == (torch.float8_e4m3fn, True) and c["q"][0] == (n, h, d)
        t = c["kv"][0][0]
        assert c["kv"] == ((t, d), torch.float8_e4m3fn, True) and c["scales"] == ((t,), torch.float32, True)
        assert c["weights"] == ((n, h), torch.float32, True)
        assert c["ks"] == c["ke"] == ((n,), torch.int32, True)
    assert {c["kv"][0][0] for c in calls} == {128, 256}
    assert {c["clean"] for c in calls} == {True, False}  # alone: the entry point as is; + top-k: no clean pass
    topk_calls = ex.topk_module.CALLS
    assert topk_calls and all(c["topk"] == s.topk and c["input"][1] == torch.float32 for c in topk_calls)
    assert {c["input"][0] for c in topk_calls} == {(128, 128), (128, 256)}  # T = 256 in two row blocks
    table = "\n".join(peers_table(result["rows"], None, selection))
    assert "TileLang FP8 example logits + top-k" in table and "recall " in table
    assert "peer tilelang_fp8_example present" in out.getvalue()


def test_tilelang_fp8_example_quantization_is_outside_the_timed_call(tl_example, cfg):
    """prepare() quantizes each input set once; a timed call only runs the entry point (+ top-k)."""
    from bench.peers.cases import Context, index_inputs, tilelang_fp8_indexer
    ex = tl_example.module
    quantized = []
    real = ex.cast_to_fp8
    ex.cast_to_fp8 = lambda *a: quantized.append(1) or real(*a)
    ctx = Context(cfg, cfg.dsa, 128, torch.ops.flashdsa, ex, 2)
    sets = [index_inputs(ctx) for _ in range(2)]
    prepared = tilelang_fp8_indexer(False)(ctx, sets)
    assert len(quantized) == 2
    q8, k8, scales, w, ks, ke = prepared.peer.args[0]
    assert q8.dtype == k8.dtype == torch.float8_e4m3fn and scales.dtype == w.dtype == torch.float32
    assert torch.equal(ks, sets[0]["k_start"]) and torch.equal(ke, sets[0]["k_end"])
    assert torch.equal(q8.float(), sets[0]["q_idx"].to(torch.float8_e4m3fn).float())  # cast as it is
    selected = prepared.peer.fn(prepared.peer.args[1])
    assert selected.shape == (128, cfg.dsa.topk) and selected.dtype == torch.int32 and len(quantized) == 2


def test_peer_keys_limit_the_peers_probed_and_run(cfg, ops):
    from bench import run as bench_run
    assert set(bench_run.parse_args(["--peer-keys", "tilelang_fp8_example"]).peer_keys) == {"tilelang_fp8_example"}
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--peer-keys", "nope"])
    src = (ROOT / "bench" / "run.py").read_text()
    assert all(f'"{key}"' in src for key in registry.PROBES)  # every registry key is a --peer-keys choice
    plan = PeerPlan((64,), (FWD,), heads={FWD: (cfg.dsa.heads,)})
    result = run_peers(cfg, ops, CPU_POLICY, io.StringIO(), max_seconds=60, plan=plan, peers=FAKE_PEERS,
                       paths=FAKE_PATHS, keys=["fake"])
    assert {r["peer_key"] for r in result["rows"]} == {"fake"}
    assert [s["key"] for s in result["status"]] == ["fake"]
    plan = PeerPlan((64,), (FWD, INDEXER), heads={FWD: (cfg.dsa.heads,), INDEXER: (cfg.dsa.index_heads,)})
    on_cpu = run_peers(cfg, ops, CPU_POLICY, io.StringIO(), max_seconds=60, plan=plan, keys=["tilelang_fp8_example"])
    assert [s["key"] for s in on_cpu["status"]] == ["tilelang_fp8_example"]
    assert {r["peer"] for r in on_cpu["rows"]} == {p.label for p in TL_FP8_PATHS}
    assert all(r["status"] == "absent" for r in on_cpu["rows"])


def test_peers_stage_puts_the_pinned_examples_where_the_registry_looks(tmp_path, monkeypatch):
    """scripts/peers_stage.sh --examples-into (the tilelang set's example step) on a fake tile-ai/tilelang
    mirror: the files at the pinned commit, PEERS_COMMITS, and the registry loads the result."""
    mirror = tmp_path / "mirror"
    (mirror / "examples" / "deepseek_v32").mkdir(parents=True)
    for name, text in FAKE_TL_FILES.items():
        (mirror / "examples" / "deepseek_v32" / name).write_text(text)
    (mirror / "examples" / "deepseek_v32" / "sparse_mla_fwd.py").write_text("# not staged\n")
    (mirror / "LICENSE").write_text("MIT\n")
    git = ["git", "-C", str(mirror), "-c", "user.name=t", "-c", "user.email=t@t"]
    _sh(["git", "init", "-q", str(mirror)])
    _sh(git + ["add", "-A"])
    _sh(git + ["commit", "-q", "-m", "examples"])
    commit = _sh(git + ["rev-parse", "HEAD"]).stdout.strip()
    (mirror / "examples" / "deepseek_v32" / "utils.py").write_text("raise SystemExit('a later commit')\n")
    _sh(git + ["commit", "-q", "-am", "later"])
    env = dict(os.environ, TILELANG_MIRROR=str(mirror / ".git"), TILELANG_EXAMPLES_REF=commit)
    script = str(ROOT / "scripts" / "peers_stage.sh")
    dest = tmp_path / "set"
    out = _sh(["bash", script, "--examples-into", str(dest)], env=env).stdout
    assert f"examples/deepseek_v32 of tile-ai/tilelang {commit}" in out
    staged = dest / "tilelang_examples"
    assert sorted(p.name for p in (staged / "deepseek_v32").iterdir()) == sorted(FAKE_TL_FILES)
    assert (staged / "deepseek_v32" / "utils.py").read_text() == FAKE_TL_UTILS  # the pinned commit's
    assert (staged / "LICENSE").read_text() == "MIT\n"
    lines = (staged / "PEERS_COMMITS").read_text().splitlines()
    assert lines[0] == f"tilelang {commit}" and len(lines) == 1 + 1 + len(FAKE_TL_FILES)
    assert all(line.startswith("blob ") for line in lines[1:])
    # where scripts/peers_gpu.sh unpacks the set, the registry finds and loads it
    monkeypatch.setattr(registry, "_cuda_required", lambda: None)
    monkeypatch.setenv("FLASHDSA_PEERS_DIR", str(tmp_path))
    monkeypatch.delenv("FLASHDSA_TL_EXAMPLES_DIR", raising=False)
    dest.rename(tmp_path / "tilelang")
    real_import = registry.importlib.import_module
    monkeypatch.setattr(registry.importlib, "import_module",
                        lambda name, *a: type(sys)("tilelang") if name == "tilelang" else real_import(name, *a))
    status = discover(["tilelang_fp8_example"])["tilelang_fp8_example"]
    assert status.present and f"tile-ai/tilelang {commit[:9]}" in status.detail, status.detail
    # an unknown ref, a missing mirror, and the opt-out
    bad = subprocess.run(["bash", script, "--examples-into", str(tmp_path / "x")], capture_output=True, text=True,
                         timeout=60, env=dict(env, TILELANG_EXAMPLES_REF="f" * 40))
    assert bad.returncode != 0 and "is not a commit of" in bad.stdout
    bad = subprocess.run(["bash", script, "--examples-into", str(tmp_path / "y")], capture_output=True, text=True,
                         timeout=60, env=dict(env, TILELANG_MIRROR=str(tmp_path / "none")))
    assert bad.returncode != 0 and "no mirror at" in bad.stdout
    skipped = _sh(["bash", script, "--examples-into", str(tmp_path / "z")], env=dict(env, PEERS_TL_EXAMPLES="0"))
    assert "left out (PEERS_TL_EXAMPLES=0)" in skipped.stdout and not (tmp_path / "z" / "tilelang_examples").exists()


def test_tilelang_fp8_example_utils_loads_without_triton(tmp_path, monkeypatch):
    """utils.py imports triton and packaging without using them: when they are not installed, empty
    stand-ins serve its load only (sys.modules is as before afterwards), and the status says so."""
    folder = _fake_tl_examples(tmp_path)
    utils = folder / "utils.py"
    utils.write_text("import triton\nimport triton.language as tl\nfrom packaging import version\n" + FAKE_TL_UTILS)
    real_find = sys.meta_path

    class NoTriton:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in ("triton", "packaging"):
                raise ModuleNotFoundError(f"No module named '{name}'", name=name)
            return None
    monkeypatch.setattr(sys, "meta_path", [NoTriton()] + list(real_find))
    for name in ("triton", "triton.language", "packaging", "packaging.version"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ex = registry.TileLangFp8Example(str(folder))
    assert ex.stand_ins == ["triton", "triton.language", "packaging", "packaging.version"]
    assert not any(n in sys.modules for n in ("triton", "triton.language", "packaging", "packaging.version"))
    assert ex.utils.tl is ex.utils.triton.language
    (folder / "utils.py").write_text("import nosuchmodule_xyz\n" + FAKE_TL_UTILS)
    with pytest.raises(ModuleNotFoundError, match="nosuchmodule_xyz"):
        registry.TileLangFp8Example(str(folder))
