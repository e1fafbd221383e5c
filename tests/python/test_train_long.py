"""Tests of examples/train_long.py (CPU, tiny sizes, seconds): the long-range task generator, the
dense attention path, the stages of the two-stage recipe (what is frozen, what trains), the T x T
memory check's logic and a tiny end-to-end --compare run.
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import flashdsa

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def tl():
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("train_long", EXAMPLES / "train_long.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    sys.path.remove(str(EXAMPLES))


@pytest.mark.parametrize("geometry", [dict(), dict(seq_len=4096, queries=100, dist_min=1000, dist_max=3000,
                                                   num_keys=200, seqs=2)])
def test_long_task_places_each_pair_in_the_requested_distance_range(tl, geometry):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], **geometry)
    vocab = tl.tr.Vocab.of(cfg)
    batch = tl.make_long_batch(cfg, vocab, torch.Generator().manual_seed(5))
    assert batch.tokens.shape[0] == cfg.tokens == cfg.seq_len * cfg.seqs
    assert batch.cu_seqlens.tolist() == [b * cfg.seq_len for b in range(cfg.seqs + 1)]
    assert len(batch.answers) == cfg.queries * cfg.seqs
    dist = batch.answer_rows - batch.relevant_rows
    assert int(dist.min()) >= cfg.dist_min and int(dist.max()) <= cfg.dist_max
    # The range is used, not just respected: distances spread over most of it.
    assert int(dist.min()) < cfg.dist_min + 0.2 * (cfg.dist_max - cfg.dist_min)
    assert int(dist.max()) > cfg.dist_max - 0.2 * (cfg.dist_max - cfg.dist_min)
    query_keys = batch.tokens[batch.answer_rows]
    assert ((query_keys >= vocab.key0) & (query_keys < vocab.value0)).all()
    assert torch.equal(batch.tokens[batch.relevant_rows - 1], query_keys)  # the pair: key, then its value
    assert torch.equal(batch.tokens[batch.relevant_rows], batch.answers)
    assert torch.equal(batch.tokens[batch.answer_rows + 1], batch.answers)
    seq_of = lambda rows: torch.div(rows, cfg.seq_len, rounding_mode="floor")  # noqa: E731
    assert torch.equal(seq_of(batch.relevant_rows), seq_of(batch.answer_rows))
    assert torch.equal(batch.visible, batch.answer_rows - seq_of(batch.answer_rows) * cfg.seq_len + 1)
    for row, rel in zip(batch.answer_rows.tolist(), batch.relevant_rows.tolist()):
        start = seq_of(torch.tensor(row)).item() * cfg.seq_len
        earlier = (batch.tokens[start:row] == batch.tokens[row]).nonzero().flatten() + start
        assert earlier.tolist() == [rel - 1], "the queried key occurs once before its query"
    task = tl.describe_long_task(cfg)
    assert task["chance_accuracy"] == 1 / cfg.num_values
    assert cfg.dist_min <= task["distance_min"] <= task["distance_max"] <= cfg.dist_max
    assert 0 < task["random_topk_recall"] < 1


def test_long_task_rejects_a_geometry_that_does_not_fit(tl):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], seq_len=512, dist_min=400, dist_max=450)
    with pytest.raises(ValueError, match="do not fit"):
        tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(0))


def test_dense_attention_equals_the_dsa_layer_with_every_key_selected(tl):
    # K >= the sequence length: the sparse MLA attends to every visible key, which is what the
    # un-absorbed dense path computes with the same parameters.
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], seq_len=128, queries=4, dist_min=20, dist_max=100, topk=128)
    batch = tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    with torch.no_grad():
        sparse_logits, sparse_idx = model(batch, torch.float32)
        model.set_attention("dense")
        dense_logits, dense_idx = model(batch, torch.float32)
    torch.testing.assert_close(dense_logits, sparse_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(dense_idx[0].sort(dim=1).values, sparse_idx[0].sort(dim=1).values)  # the metric's top-k


def test_dense_causal_attention_handles_mixed_lengths(tl):
    T, H, D, Dv = 50, 2, 16, 8
    q, k, v = torch.randn(T, H, D), torch.randn(T, H, D), torch.randn(T, H, Dv)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    out = tl.tr.dense_causal_attention(q, k, v, cu, 0.3)
    expect = []
    for a, b in ((0, 20), (20, 50)):
        s = torch.einsum("thd,shd->hts", q[a:b], k[a:b]) * 0.3
        s = s.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
        expect.append(torch.einsum("hts,shv->thv", s.softmax(-1), v[a:b]))
    torch.testing.assert_close(out, torch.cat(expect), rtol=1e-5, atol=1e-5)


def test_sample_rows(tl):
    assert tl.tr.sample_rows(100, 1.0, "cpu") is None
    rows = tl.tr.sample_rows(100, 0.25, "cpu")
    assert len(rows) == 25 and len(set(rows.tolist())) == 25 and torch.equal(rows, rows.sort().values)
    assert 0 <= int(rows.min()) and int(rows.max()) < 100
    with pytest.raises(ValueError):
        tl.tr.sample_rows(100, 0.0, "cpu")


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_stages_freeze_and_train_the_right_parameters(tl):
    cfg = tl.PRESETS["tiny"]
    run = tl.tr.Run(cfg, "two-stage", "cpu", torch.float32, backend="fused")
    gen = torch.Generator().manual_seed(1)
    vocab = tl.tr.Vocab.of(cfg)
    stages = {s.name: s for s in tl.recipe_stages(cfg, "two-stage")}
    assert [s.attention for s in stages.values()] == ["dense", "dense", "sparse"]
    is_indexer = {n: ".indexer." in n for n, _ in run.model.named_parameters()}
    assert any(is_indexer.values()) and not all(is_indexer.values())
    for name, trains_indexer, trains_model in (("dense", False, True), ("warmup", True, False), ("sparse", True, True)):
        tl.apply_stage(run.model, stages[name])
        before = _params(run.model)
        for _ in range(2):
            run.step(0, tl.make_long_batch(cfg, vocab, gen), torch.float32, lr=1e-2)
        after = _params(run.model)
        for n, idx in is_indexer.items():
            changed = not torch.equal(before[n], after[n])
            # A frozen parameter must not move at all; a trained one (a norm gain may stay put for a
            # step, so check the group as a whole below).
            if not (trains_indexer if idx else trains_model):
                assert not changed, f"stage {name}: frozen parameter {n} changed"
        moved = lambda group: [n for n, idx in is_indexer.items() if idx == group and not torch.equal(before[n], after[n])]  # noqa: E731
        assert bool(moved(True)) == trains_indexer, f"stage {name}: indexer parameters moved: {moved(True)}"
        assert bool(moved(False)) == trains_model, f"stage {name}: model parameters moved: {moved(False)}"
        kl = run.hist["kl_loss"][-1]
        assert all(math.isnan(v) for v in kl) if name == "dense" else all(math.isfinite(v) and v >= 0 for v in kl)
    # The warm-up's indexer gradient comes from the dense KL loss alone: the model had none.
    assert run.hist["grad_norm"][-3] == 0 and run.hist["indexer_grad_norm"][-3] > 0


def test_warmup_dense_kl_on_a_row_subset_is_the_mean_over_those_rows(tl, monkeypatch):
    cfg = tl.PRESETS["tiny"]
    batch = tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    seen = []
    real = flashdsa.indexer_kl_loss
    monkeypatch.setattr(tl.tr.flashdsa, "indexer_kl_loss", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    model.set_attention("dense", dense_kl=True, kl_rows=1.0)
    model(batch, torch.float32)
    full = model.pending_indexer_losses()[0]
    (args, kwargs), = seen
    assert kwargs["formulation"] == "dense" and args[0].shape[0] == cfg.tokens
    per_row = flashdsa.indexer_kl_loss_rows(*args, **{k: v for k, v in kwargs.items() if k != "coeff"})
    torch.testing.assert_close(full.detach(), per_row.mean() * cfg.loss_coeff, rtol=1e-6, atol=1e-9)
    model.set_attention("dense", dense_kl=True, kl_rows=0.25)
    torch.manual_seed(7)
    model(batch, torch.float32)
    subset = model.pending_indexer_losses()[0]
    torch.manual_seed(7)
    rows = tl.tr.sample_rows(cfg.tokens, 0.25, "cpu")
    assert len(rows) == cfg.tokens // 4
    torch.testing.assert_close(subset.detach(), per_row[rows].mean() * cfg.loss_coeff, rtol=1e-5, atol=1e-9)
    subset.backward()
    indexer = model.blocks[0].attn.indexer
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (indexer.q.weight, indexer.k.weight, indexer.w.weight))
    assert model.blocks[0].attn.q_nope.weight.grad is None  # the target is detached


def test_quadratic_memory_check_logic(tl):
    L = 32768
    square = L * L * 2
    linear = [L * 16 * 576 * 2, L * 512 * 4, 1 << 20]  # q [T, H, 576] bf16, activations, small
    ok = tl.quadratic_memory_check(linear, peak_bytes=6 << 30, base_bytes=1 << 30, seq_len=L)
    assert ok["ok"] and ok["largest_alloc_bytes"] == linear[0] and ok["largest_over_square"] < 1
    assert ok["square_bytes"] == square and ok["step_rise_bytes"] == 5 << 30
    bad = tl.quadratic_memory_check(linear + [L * L * 2], peak_bytes=8 << 30, base_bytes=1 << 30, seq_len=L)
    assert not bad["ok"] and bad["largest_over_square"] == 1.0  # one bf16 [L, L] score matrix
    assert not tl.quadratic_memory_check([16 * L * L * 4], 0, 0, L)["ok"]  # fp32 scores of 16 heads
    with pytest.raises(ValueError):
        tl.quadratic_memory_check([], 0, 0, L)
    snapshot = {"device_traces": [[{"action": "alloc", "size": 10}, {"action": "free_requested", "size": 999},
                                   {"action": "segment_alloc", "size": 4096}, {"action": "alloc", "size": 30}]]}
    assert tl.alloc_sizes_from_snapshot(snapshot) == [10, 30]


def test_compare_runs_both_recipes_and_writes_the_plot(tl, tmp_path):
    result = tl.main(["--preset", "tiny", "--compare", "--log-every", "1000", "--out", str(tmp_path)])
    runs = result["runs"]
    assert set(runs) == {"two-stage", "scratch"}
    two, scratch = runs["two-stage"], runs["scratch"]
    assert [s["name"] for s in two["stages"]] == ["dense", "warmup", "sparse"]
    assert [s["steps"] for s in two["stages"]] == [4, 3, 3]
    assert [s["name"] for s in scratch["stages"]] == ["sparse"] and scratch["stages"][0]["steps"] == 10
    for res in runs.values():
        h = res["history"]
        assert len(h["lm_loss"]) == 10 and all(math.isfinite(v) for v in h["lm_loss"])
        assert all(0 <= r <= 1 for step in h["recall"] for r in step)
        assert all(v > 0 for v in h["tokens_per_second"])
        assert all(not s["frozen_parameters_changed"] for s in res["stages"])
    assert two["history"]["stage"] == ["dense"] * 4 + ["warmup"] * 3 + ["sparse"] * 3
    assert two["stages"][1]["frozen"] > two["stages"][1]["trainable"] > 0  # the warm-up trains the indexer only
    # Same data stream and initialization: the first step's batch and loss are the same.
    assert two["history"]["chance_recall"][:4] == scratch["history"]["chance_recall"][:4]
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["task"]["chance_accuracy"] == 1 / 8 and "summary" in saved["runs"]["scratch"]


def test_stage0_length_curriculum(tl):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], short_len=256, dense_steps=6, warmup_steps=1, sparse_steps=1)
    assert tl.curriculum_lengths(cfg) == [256, 512, 1024]
    assert tl.curriculum_lengths(tl.dataclasses.replace(cfg, short_len=0)) == [1024]
    short = tl.at_length(cfg, 256)
    assert (short.seq_len, short.seqs, short.tokens) == (256, 4, cfg.tokens)
    assert short.queries == min(cfg.queries, 256 // cfg.short_query_every) and short.dist_min == cfg.dist_min // 4 and short.dist_max == cfg.dist_max // 4
    batch = tl.make_long_batch(short, tl.tr.Vocab.of(short), torch.Generator().manual_seed(0))
    assert batch.cu_seqlens.tolist() == [0, 256, 512, 768, 1024]
    with pytest.raises(ValueError, match="divide"):
        tl.at_length(cfg, 300)
    result = tl.train_recipe(cfg, "two-stage", "cpu", log_every=1000)
    lengths, stages = result["history"]["seq_len"], result["history"]["stage"]
    assert lengths == [256, 256, 512, 512, 1024, 1024, 1024, 1024]  # levels by the stage's progress
    assert stages == ["dense"] * 6 + ["warmup", "sparse"]  # stages 1 and 2 at full length


def test_recipes_run_separately_then_merge(tl, tmp_path):
    steps = ["--dense-steps", "2", "--warmup-steps", "1", "--sparse-steps", "1", "--log-every", "1000"]
    for recipe in ("two-stage", "scratch"):
        tl.main(["--preset", "tiny", "--recipe", recipe, *steps, "--out", str(tmp_path)])
        assert (tmp_path / f"{recipe}.png").exists()
    merged = tl.main(["--merge", str(tmp_path / "two-stage.json"), str(tmp_path / "scratch.json"), "--out", str(tmp_path)])
    assert set(merged["runs"]) == {"two-stage", "scratch"}
    assert len(merged["runs"]["scratch"]["history"]["lm_loss"]) == 4
    assert (tmp_path / "compare.png").stat().st_size > 10_000


@pytest.mark.kernels("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "sparse_kl_fwd",
                     "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd")
def test_two_stage_recipe_on_cuda_at_16k(tl, tmp_path, device):
    """Every stage on the GPU at the kernels' shapes (bf16), with the allocator check: a few steps."""
    if device != "cuda":
        pytest.skip("the CPU runs are above")
    result = tl.main(["--device", "cuda", "--recipe", "two-stage", "--seq-len", "16384", "--queries", "256",
                      "--dist-min", "1024", "--dist-max", "15000", "--num-keys", "512", "--short-len", "8192",
                      "--dense-steps", "4", "--warmup-steps", "2", "--sparse-steps", "2", "--memory-check",
                      "--out", str(tmp_path)])
    res = result["runs"]["two-stage"]
    h = res["history"]
    assert h["stage"] == ["dense"] * 4 + ["warmup"] * 2 + ["sparse"] * 2
    assert h["seq_len"] == [8192, 8192] + [16384] * 6
    assert all(math.isfinite(v) for v in h["lm_loss"])
    assert all(math.isfinite(v) for step in h["kl_loss"][4:] for v in step)
    assert all(not s["frozen_parameters_changed"] for s in res["stages"])
    assert set(res["memory"]) == {"dense", "warmup", "sparse"}
    for stage, m in res["memory"].items():
        assert m["ok"], (stage, m)  # no allocation as large as one 16384^2 bf16 matrix


def test_warmup_kl_rows_are_the_answer_rows_plus_a_random_fraction(tl):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], kl_rows=0.125)
    batch = tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    rows = tl.warmup_kl_rows(cfg, batch)
    assert torch.equal(rows, rows.unique())  # increasing, no duplicates
    assert set(batch.answer_rows.tolist()) <= set(rows.tolist())
    extra = len(rows) - len(batch.answer_rows)
    assert 0 < extra <= cfg.tokens // 8 and int(rows.max()) < cfg.tokens
    assert tl.warmup_kl_rows(tl.dataclasses.replace(cfg, kl_rows=1.0), batch) == 1.0  # every row
    assert tl.warmup_kl_rows(tl.dataclasses.replace(cfg, kl_row_mode="random"), batch) == 0.125
    with pytest.raises(ValueError, match="kl_row_mode"):
        tl.warmup_kl_rows(tl.dataclasses.replace(cfg, kl_row_mode="all"), batch)
    # The layer takes the given rows: its dense KL is the mean over exactly those rows.
    torch.manual_seed(0)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    model.set_attention("dense", dense_kl=True, kl_rows=1.0)
    seen = []
    real = flashdsa.indexer_kl_loss
    try:
        flashdsa.indexer_kl_loss = lambda *a, **k: seen.append((a, k)) or real(*a, **k)
        model(batch, torch.float32)
    finally:
        flashdsa.indexer_kl_loss = real
    (args, kwargs), = seen
    per_row = flashdsa.indexer_kl_loss_rows(*args, **{k: v for k, v in kwargs.items() if k != "coeff"})
    model.set_attention("dense", dense_kl=True, kl_rows=rows)
    model(batch, torch.float32)
    torch.testing.assert_close(model.pending_indexer_losses()[0].detach(), per_row[rows].mean() * cfg.loss_coeff,
                               rtol=1e-5, atol=1e-9)


def test_stage_lr_schedules(tl):
    assert tl.stage_lr(1.0, 0, 0.0, 4) == 0.25 and tl.stage_lr(1.0, 3, 0.0, 4, "constant") == 1.0
    assert tl.stage_lr(1.0, 10, 0.5, 4, "constant") == 1.0 == tl.stage_lr(1.0, 10, 1.0, 4, "constant")
    assert abs(tl.stage_lr(1.0, 10, 1.0, 4) - 0.1) < 1e-12 and abs(tl.stage_lr(1.0, 10, 0.5, 4) - 0.55) < 1e-12
    with pytest.raises(ValueError):
        tl.stage_lr(1.0, 10, 0.5, 4, "linear")


def test_pair_attention_matches_the_dense_softmax(tl):
    # The diagnostic (absorbed q, kv, chunked over answer rows) against the un-absorbed dense
    # attention's full [L, L] softmax per sequence and head, on two packed sequences.
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], seq_len=256, seqs=2, queries=8, dist_min=20, dist_max=200)
    batch = tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(4))
    torch.manual_seed(1)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    model.set_attention("dense")
    got = tl.pair_attention(model, batch, torch.float32, topk=16, chunk=5)
    assert got == tl.pair_attention(model, batch, torch.float32, topk=16, chunk=1000)
    probs = []  # per layer [N, H] probability of the pair
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a)) for b in model.blocks]
    with torch.no_grad():
        model(batch, torch.float32)
    for h in hooks:
        h.remove()
    for block, args in zip(model.blocks, inputs):
        attn, (x, _, rope) = block.attn, args[:3]
        q = torch.cat([attn.q_nope(x).unflatten(-1, (attn.heads, attn.d_nope)),
                       rope.apply(attn.q_rope(x).unflatten(-1, (attn.heads, tl.tr.ROPE_DIM)))], -1)
        k_nope = torch.einsum("hnc,tc->thn", attn.w_uk, attn.kv_norm(attn.kv_down(x)))
        k = torch.cat([k_nope, rope.apply(attn.k_rope(x))[:, None, :].expand(-1, attn.heads, -1)], -1)
        p = torch.zeros(len(batch.answer_rows), attn.heads, cfg.tokens)
        for b in range(cfg.seqs):
            a, e = b * cfg.seq_len, (b + 1) * cfg.seq_len
            s = torch.einsum("thd,shd->hts", q[a:e], k[a:e]) * attn.scale
            s = s.masked_fill(torch.ones(e - a, e - a, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            mine = (batch.answer_rows >= a) & (batch.answer_rows < e)
            p[mine, :, a:e] = s[:, batch.answer_rows[mine] - a].transpose(0, 1)
        probs.append(p)
    n = torch.arange(len(batch.answer_rows))
    for layer, (d, p) in enumerate(zip(got, probs)):
        pair = p[n, :, batch.relevant_rows]
        assert abs(d["pair_mass"] - pair.mean().item()) < 1e-5, layer
        assert abs(d["best_head_mass"] - pair.max(1).values.mean().item()) < 1e-5, layer
        target = p.mean(1)
        rank = (target > target[n, batch.relevant_rows][:, None]).sum(-1)
        assert d["pair_top1"] == (rank == 0).float().mean().item() and d["pair_in_topk"] == (rank < 16).float().mean().item()
        assert 0 <= d["pair_mass"] <= d["best_head_mass"] <= 1 and d["pair_top1"] <= d["pair_in_topk"]


def test_served_and_answering_layers(tl):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], layers=4, topk_freq=2)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    assert tl.served_layers(model) == {0: [0, 1], 2: [2, 3]}
    diag = [{"pair_mass": m} for m in (0.1, 0.3, 0.2, 0.05)]
    assert tl.answering_layers(model, diag) == {0: 1, 2: 2}


def test_target_layer_kl_is_the_dense_kl_against_that_layers_attention(tl):
    cfg = tl.dataclasses.replace(tl.PRESETS["tiny"], layers=2, topk_freq=2)  # layer 0 full, layer 1 shared
    batch = tl.make_long_batch(cfg, tl.tr.Vocab.of(cfg), torch.Generator().manual_seed(6))
    torch.manual_seed(2)
    model = tl.tr.Decoder(cfg, flashdsa.DSAAttention)
    rows = batch.answer_rows
    model.set_attention("dense", dense_kl=True, kl_rows=rows)
    model(batch, torch.float32)
    own = model.pending_indexer_losses()[0].detach()
    model.set_attention("dense")
    for target_layer in (0, 1):
        target = tl.TargetLayerKL(model, 0, target_layer)
        target.rows = rows
        model(batch, torch.float32)
        target.remove()
        loss, = model.pending_indexer_losses()
        if target_layer == 0:  # the full layer's own attention: the layer's own dense KL
            torch.testing.assert_close(loss.detach(), own, rtol=1e-6, atol=1e-9)
        else:  # against layer 1's attention: the per-row kernel with layer 1's q, kv
            seen = []
            grab = model.blocks[1].attn.register_forward_pre_hook(lambda m, a: seen.append(tl.absorbed_operands(m, a)))
            idx = []
            grab2 = model.blocks[0].attn.indexer.register_forward_hook(lambda m, a, out: idx.append(out))
            with torch.no_grad():
                model(batch, torch.float32)
            grab.remove(), grab2.remove()
            (q, kv), (q_idx, k_idx, w) = seen[0], idx[0]
            ks, ke = flashdsa.build_key_ranges(batch.cu_seqlens)
            per_row = flashdsa.indexer_kl_loss_rows(q_idx[rows], k_idx, w[rows], formulation="dense", q=q[rows], kv=kv,
                                                    scale=model.blocks[1].attn.scale, k_start=ks[rows], k_end=ke[rows])
            torch.testing.assert_close(loss.detach(), per_row.mean() * cfg.loss_coeff, rtol=1e-5, atol=1e-9)
            assert not torch.allclose(loss.detach(), own)
            loss.backward()
            indexer = model.blocks[0].attn.indexer
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in indexer.parameters() if p.dim() == 2)
            assert model.blocks[1].attn.q_nope.weight.grad is None  # the target is detached
    assert not model.blocks[0].attn.indexer._forward_hooks and not model._forward_hooks  # removed


def test_two_stage_with_the_answering_layer_target(tl, tmp_path):
    result = tl.main(["--preset", "tiny", "--recipe", "two-stage", "--kl-target", "answering", "--kl-rows", "0.25",
                      "--warmup-schedule", "constant", "--log-every", "1000", "--out", str(tmp_path)])
    res = result["runs"]["two-stage"]
    assert len(res["pair_attention"]) == 2 and set(res["pair_attention"][0]) >= {"pair_mass", "pair_in_topk"}
    assert res["kl_target_layers"] == {0: 0} or res["kl_target_layers"] == {0: 1}
    warm = [v for v, st in zip(res["history"]["kl_loss"], res["history"]["stage"]) if st == "warmup"]
    assert len(warm) == 3 and all(math.isfinite(v[0]) and v[0] >= 0 for v in warm)
    assert all(not s["frozen_parameters_changed"] for s in res["stages"])
