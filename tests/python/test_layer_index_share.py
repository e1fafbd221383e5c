"""IndexShare: pattern from Megatron's knobs, index reuse, no indexer work on shared layers."""

import math

import pytest
import torch

import flashdsa
from flashdsa.index_share import IndexShareContext, check_index_share_pattern, index_share_pattern
from flashdsa.layer import DSAAttention, dsa_attention
import layer_reference as ref

LENGTHS = [45, 99, 3, 77]
TOPK = 64


def megatron_reuses(layer_1based, freq, offset):
    """Megatron's rule, written out as the issue states it."""
    return max(layer_1based - max(offset, 1), 0) % freq != 0


@pytest.mark.parametrize("freq, offset", [(1, 0), (4, 0), (2, 3), (3, 1), (4, 2)])
def test_pattern_follows_megatron_rule(freq, offset):
    pattern = index_share_pattern(12, topk_freq=freq, skip_topk_offset=offset)
    assert pattern == ["shared" if megatron_reuses(L, freq, offset) else "full" for L in range(1, 13)]
    assert check_index_share_pattern(pattern) == pattern


def test_pattern_examples():
    assert index_share_pattern(8, topk_freq=4) == ["full", "shared", "shared", "shared"] * 2
    assert index_share_pattern(6, topk_freq=2, skip_topk_offset=3) == ["full"] * 3 + ["shared", "full", "shared"]


def test_pattern_errors():
    with pytest.raises(ValueError, match="no preceding layer is 'full'"):
        check_index_share_pattern(["shared", "full"])
    with pytest.raises(ValueError, match="'full' or 'shared'"):
        check_index_share_pattern(["full", "sparse"])
    with pytest.raises(ValueError, match="topk_freq"):
        index_share_pattern(4, topk_freq=0)


class CountingIndexer:
    """Wraps flashdsa.ops.indexer_topk and counts its calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self._real = flashdsa.ops.indexer_topk
        monkeypatch.setattr(flashdsa.ops, "indexer_topk", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)


@pytest.mark.kernels("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass",
                     "sparse_kl_fwd", "sparse_kl_bwd")
def test_shared_layers_reuse_indices_and_skip_the_indexer(device, monkeypatch):
    pattern = ["full", "shared", "shared", "full", "shared"]
    layers = [DSAAttention(TOPK, 0.1, index_share=m, loss_coeff=0.1 if m == "full" else None, layer_id=i)
              for i, m in enumerate(pattern)]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    per_layer = [ref.with_grad(ref.make_inputs(LENGTHS, dtype=dtype, device=device, seed=100 + i))
                 for i in range(len(pattern))]
    counter = CountingIndexer(monkeypatch)
    ctx = IndexShareContext()
    results = []
    for layer, x in zip(layers, per_layer):
        idx_inputs = x[2:5] if layer.index_share == "full" else (None, None, None)
        results.append(layer(x.q, x.kv, x.cu_seqlens, *idx_inputs, index_share_ctx=ctx))

    assert counter.calls == pattern.count("full")
    assert results[1].indices is results[0].indices and results[2].indices is results[0].indices
    assert results[4].indices is results[3].indices
    assert not torch.equal(results[0].indices, results[3].indices), "full layers compute their own indices"
    for layer, r in zip(layers, results):
        assert (r.indexer_loss is None) == (layer.index_share == "shared")
        assert (layer.last_indexer_loss is None) == (layer.index_share == "shared")

    # A shared layer equals the functional call with the reused indices.
    x = per_layer[2]
    direct = dsa_attention(x.q, x.kv, None, None, None, x.cu_seqlens, TOPK, 0.1, indices=results[0].indices)
    assert torch.equal(results[2].out, direct.out)

    # Training: the full layers' losses are computed in the backward (NaN until then).
    full_losses = [r.indexer_loss for r in results if r.indexer_loss is not None]
    assert all(torch.isnan(loss) for loss in full_losses)

    # Backward through all layers: shared layers feed q/kv grads, full layers also the indexer.
    sum(r.out.float().square().sum() for r in results).backward()
    for layer, x in zip(layers, per_layer):
        assert x.q.grad.abs().max() > 0 and x.kv.grad.abs().max() > 0
        assert (x.q_idx.grad is None) == (layer.index_share == "shared")
    assert all(torch.isfinite(loss) and loss > 0 for loss in full_losses)
    for layer, r in zip(layers, results):
        assert layer.last_indexer_loss is r.indexer_loss


@pytest.mark.kernels("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass",
                     "sparse_kl_fwd", "sparse_kl_bwd")
def test_index_share_model_loss_in_backward_equals_forward_path(device):
    """A full, shared, shared, full, shared model: the losses (read after the backward) and every
    gradient are the same with the loss computed in the backward or in the forward."""
    pattern = ["full", "shared", "shared", "full", "shared"]
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    # Shifted indexer inputs: no score ties at 0 under ReLU, so both runs select the same top-k.
    inputs = [ref.make_inputs(LENGTHS, dtype=dtype, device=device, seed=200 + i, indexer_shift=1.0)
              for i in range(len(pattern))]
    runs = []
    for loss_in_backward in (False, True):
        layers = [DSAAttention(TOPK, 0.1, index_share=m, loss_coeff=0.1 if m == "full" else None, layer_id=i,
                               indexer_loss_in_backward=loss_in_backward if m == "full" else None)
                  for i, m in enumerate(pattern)]
        xs = [ref.with_grad(x) for x in inputs]
        ctx = IndexShareContext()
        outs = [layer(x.q, x.kv, x.cu_seqlens, *(x[2:5] if layer.index_share == "full" else ()), index_share_ctx=ctx)
                for layer, x in zip(layers, xs)]
        full_losses = [layer.last_indexer_loss for layer in layers if layer.index_share == "full"]
        assert all(torch.isnan(loss) for loss in full_losses) == loss_in_backward
        sum((r.out.double() * (i + 1)).square().sum() for i, r in enumerate(outs)).backward()
        grads = [getattr(x, f).grad for x in xs for f in ("q", "kv", "q_idx", "k_idx", "weights")]
        runs.append(([float(loss) for loss in full_losses], grads))
    (loss_f, grads_f), (loss_b, grads_b) = runs
    tol = 1e-10 if device == "cpu" else 2e-2
    assert all(math.isfinite(v) for v in loss_b)
    assert loss_b == pytest.approx(loss_f, rel=tol)
    for g_f, g_b in zip(grads_f, grads_b):
        assert (g_f is None) == (g_b is None)
        if g_f is not None:
            ref.assert_close(g_b, g_f, tol, "gradient")


def test_shared_layer_without_preceding_full_layer():
    x = ref.make_inputs(LENGTHS, seed=7)
    shared = DSAAttention(TOPK, 0.1, index_share="shared", layer_id=0)
    with pytest.raises(RuntimeError, match="shared layer 0 has no preceding 'full' layer"):
        shared(x.q, x.kv, x.cu_seqlens, index_share_ctx=IndexShareContext())
    with pytest.raises(ValueError, match="needs the IndexShareContext"):
        shared(x.q, x.kv, x.cu_seqlens)
    with pytest.raises(ValueError, match="takes no q_idx"):
        shared(x.q, x.kv, x.cu_seqlens, x.q_idx, x.k_idx, x.weights, index_share_ctx=IndexShareContext())
    with pytest.raises(ValueError, match="cannot have an indexer loss"):
        DSAAttention(TOPK, 0.1, index_share="shared", loss_coeff=0.1)


def test_context_rejects_indices_of_another_batch():
    ctx = IndexShareContext()
    ctx.publish(torch.zeros(5, TOPK, dtype=torch.int32), layer="a")
    with pytest.raises(RuntimeError, match="has 7 query rows but the indices from layer a have 5 rows"):
        ctx.fetch(7, layer="b")
    ctx.reset()
    with pytest.raises(RuntimeError, match="no preceding 'full' layer"):
        ctx.fetch(5)
