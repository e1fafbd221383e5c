"""Plain-PyTorch float64 reference of the whole DSA layer (docs/spec.md §3–§6), and the layer tests'
random inputs.

Composes the op references of ``reference.py`` (dense ``[T, T_kv]`` / ``[T, H, K]`` math, gradients
from autograd). The key ranges come from a plain per-token loop (``reference.causal_ranges``), not
from flashdsa.thd, so the layer's packing logic is checked too.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

import reference as op_ref
from reference import ROPE_WIDTH, assert_close  # noqa: F401  (re-exported for the layer tests)


def lengths_of(cu_seqlens) -> list:
    cu = [int(c) for c in cu_seqlens]
    return [b - a for a, b in zip(cu[:-1], cu[1:])]


def causal_mask(cu_seqlens) -> torch.Tensor:
    """bool ``[T, T]``: token ``t`` of sequence ``b`` sees keys ``cu[b] <= s <= t``."""
    k_start, k_end = op_ref.causal_ranges(lengths_of(cu_seqlens))
    return op_ref.range_mask(k_start, k_end, k_start.shape[0])


class LayerResult(NamedTuple):
    out: torch.Tensor  # [T, H, D_v] float64
    loss: Optional[torch.Tensor]  # scalar float64, differentiable in q_idx, k_idx, weights
    scores: Optional[torch.Tensor]  # [T, T_kv] float64 indexer scores, -inf outside the ranges


def dsa_layer(q, kv, q_idx, k_idx, weights, cu_seqlens, scale, indices, *, relu=True, loss_coeff=None,
              loss_formulation="sparse") -> LayerResult:
    """The layer's math for the given top-k ``indices`` (the caller validates the layer's top-k
    against ``scores`` separately: ties may be broken either way).

    ``loss = coeff · Σ_t loss_t / N`` over rows with a non-empty support; its target uses detached
    ``q``/``kv``, so back-propagating ``Σ out·probe + loss`` gives the layer's expected gradients.
    """
    device = q.device
    k_start, k_end = (r.to(device) for r in op_ref.causal_ranges(lengths_of(cu_seqlens)))
    indices = indices.to(device)
    scores = None if q_idx is None else op_ref.indexer_scores(q_idx, k_idx, weights, k_start, k_end, relu)
    out, lse = op_ref.sparse_mla(q, kv, indices, scale)
    loss = None
    if loss_coeff is not None:
        if loss_formulation == "sparse":
            mass = op_ref.attention_mass(q.detach(), kv.detach(), indices, lse.detach(), scale)
            rows = op_ref.sparse_kl_rows(q_idx, k_idx, weights, indices, mass, relu)
            nonempty = op_ref.valid_slots(indices, kv.shape[0]).any(1)
        else:
            rows = op_ref.dense_kl_rows(q.detach(), kv.detach(), scale, q_idx, k_idx, weights, k_start, k_end, relu)
            nonempty = k_end > k_start
        loss = loss_coeff * rows.sum() / nonempty.sum().clamp_min(1)
    return LayerResult(out, loss, scores)


def assert_valid_topk(indices: torch.Tensor, scores: torch.Tensor, k: int, rtol: float = 1e-4) -> None:
    """Asserts ``indices [T, K]`` is a correct top-k of ``scores [T, T_kv]`` (ties either way).

    Per row: min(K, visible) valid entries, all distinct and visible, whose scores are, as a
    sorted list, the K largest scores (within ``rtol`` of the row's largest magnitude).
    """
    indices = indices.cpu().long()
    scores = scores.detach().cpu()
    valid = indices >= 0
    expected_count = torch.isfinite(scores).sum(1).clamp(max=k)
    assert torch.equal(valid.sum(1), expected_count), "wrong number of valid top-k entries per row"
    for t in range(indices.shape[0]):
        chosen = indices[t][valid[t]]
        assert chosen.unique().numel() == chosen.numel(), f"row {t}: duplicated indices"
        got = scores[t, chosen]
        assert torch.isfinite(got).all(), f"row {t}: selected a key outside its range"
        best = scores[t].topk(int(expected_count[t])).values
        tol = rtol * float(best.abs().max().clamp_min(1.0))
        assert torch.allclose(got.sort(descending=True).values, best, atol=tol, rtol=0), (
            f"row {t}: selected scores are not the top-{k}")


# ---------------------------------------------------------------------------------------------
# Random inputs shared by the layer, IndexShare and CP tests.


class LayerInputs(NamedTuple):
    q: torch.Tensor  # [T, H, D_qk] act
    kv: torch.Tensor  # [T, D_qk] act
    q_idx: torch.Tensor  # [T, H_I, D_I] act
    k_idx: torch.Tensor  # [T, D_I] act
    weights: torch.Tensor  # [T, H_I] stat
    cu_seqlens: torch.Tensor  # int32 [B+1]


def dims_for(device) -> dict:
    """Head counts and widths per device: small ones on the CPU (fast tests; the CPU backend takes
    them), the supported production ones on CUDA (H = 16, D_qk = 576, H_I = 32, D_I = 64)."""
    if torch.device(device).type == "cpu":
        return dict(heads=4, d_qk=80, idx_heads=3, idx_dim=16)
    return dict(heads=16, d_qk=576, idx_heads=32, idx_dim=64)


def make_inputs(lengths, *, heads=None, d_qk=None, idx_heads=None, idx_dim=None, dtype=torch.float32,
                device="cpu", seed=0, indexer_shift=0.0) -> LayerInputs:
    """Fresh random packed inputs (drawn in float64 on CPU from ``seed``, then cast and moved).

    Dimensions left as None come from :func:`dims_for` ``(device)``.

    ``indexer_shift`` is added to q_idx and k_idx: a positive shift makes ReLU rarely clip, so
    scores have no ties at 0 and two runs must pick the same top-k (the CP comparison needs that).
    """
    given = dict(heads=heads, d_qk=d_qk, idx_heads=idx_heads, idx_dim=idx_dim)
    dims = {**dims_for(device), **{k: v for k, v in given.items() if v is not None}}
    heads, d_qk, idx_heads, idx_dim = dims["heads"], dims["d_qk"], dims["idx_heads"], dims["idx_dim"]
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    stat = torch.float64 if dtype == torch.float64 else torch.float32

    def rand(*shape, scale=1.0, shift=0.0, to=dtype):
        values = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift
        return values.to(device=device, dtype=to)

    return LayerInputs(
        q=rand(total, heads, d_qk),
        kv=rand(total, d_qk),
        q_idx=rand(total, idx_heads, idx_dim, shift=indexer_shift),
        k_idx=rand(total, idx_dim, shift=indexer_shift),
        # the caller folds H_I^-1/2 D_I^-1/2 into the weights
        weights=rand(total, idx_heads, scale=(idx_heads * idx_dim) ** -0.5, to=stat),
        cu_seqlens=op_ref.random_cu_seqlens(lengths).to(device),
    )


def with_grad(inputs: LayerInputs) -> LayerInputs:
    """Leaf copies of the inputs; the floating ones require grad."""
    return LayerInputs(*(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs))


def as_float64(inputs: LayerInputs) -> LayerInputs:
    """float64 copies (the reference sees exactly the values the layer saw, e.g. bf16-rounded)."""
    return LayerInputs(*(t.detach().double() if t.is_floating_point() else t for t in inputs))
