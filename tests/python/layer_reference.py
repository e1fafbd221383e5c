"""The layer tests' helpers: random packed inputs, a top-k checker, and the float64 reference of
the whole layer (:func:`flashdsa.reference.dsa_layer`, re-exported with the rest of
:mod:`flashdsa.reference` through ``reference.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashdsa.thd import cu_seqlens_from_lengths
from reference import *  # noqa: F401,F403  (the reference math and assert_close, re-exported for the layer tests)


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
        cu_seqlens=cu_seqlens_from_lengths(lengths).to(device),
    )


def with_grad(inputs: LayerInputs) -> LayerInputs:
    """Leaf copies of the inputs; the floating ones require grad."""
    return LayerInputs(*(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs))


def as_float64(inputs: LayerInputs) -> LayerInputs:
    """float64 copies (the reference sees exactly the values the layer saw, e.g. bf16-rounded)."""
    return LayerInputs(*(t.detach().double() if t.is_floating_point() else t for t in inputs))
