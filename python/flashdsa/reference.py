"""Plain-PyTorch reference of the DSA math (docs/spec.md §3-§6): the one Python reference of the
project, imported by the tests, the benchmarks, the examples and the GPU fuzz.

Written for clarity, not speed: the functions gather and materialize ``[T, H, K]`` and
``[T, T_kv]`` tensors freely, and their gradients come from PyTorch autograd. They compute in
``dtype`` (float64 unless told otherwise: pass float64 leaves with ``requires_grad=True`` to get
reference gradients; the examples pass float32 to accumulate like the kernels). An index outside
``[0, T_kv)`` is an empty slot; a row with no valid slot has an empty support. Key ranges come from
:mod:`flashdsa.thd` (one implementation in Python); this module only turns them into masks.

Not re-exported at the package top level (its names would shadow the ops): import it as
``flashdsa.reference``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .thd import causal_key_ranges

ROPE_WIDTH = 64  # D_v = D_qk - 64: the ops derive the value width from q's last dimension
NEG_INF = float("-inf")

__all__ = [
    "ROPE_WIDTH",
    "NEG_INF",
    "valid_slots",
    "gather_rows",
    "range_mask",
    "causal_mask",
    "masked_log_softmax",
    "kl_rows",
    "kl_target",
    "indexer_logits",
    "indexer_scores",
    "FP8_E4M3_MAX",
    "quantize_fp8",
    "fp8_selection_scores",
    "fp8_candidates",
    "sparse_mla",
    "sparse_mla_probs",
    "attention_mass",
    "sparse_kl_rows",
    "dense_kl_rows",
    "LayerResult",
    "dsa_layer",
]


# ---------------------------------------------------------------------------------------------
# Shared pieces


def valid_slots(indices: torch.Tensor, num_keys: int) -> torch.Tensor:
    """bool ``[T, K]``: slots whose index lies in ``[0, num_keys)``."""
    return (indices >= 0) & (indices < num_keys)


def gather_rows(x: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``x[indices]`` in ``dtype`` for ``[T, K]`` indices, empty slots reading row 0 (callers mask them)."""
    safe = torch.where(valid_slots(indices, x.shape[0]), indices, 0).long()
    return x.to(dtype)[safe]


def range_mask(k_start: torch.Tensor, k_end: torch.Tensor, num_keys: int) -> torch.Tensor:
    """bool ``[T, num_keys]``: key ``s`` visible to row ``t`` iff ``k_start[t] <= s < k_end[t]``."""
    s = torch.arange(num_keys, device=k_start.device)
    return (s[None, :] >= k_start.long()[:, None]) & (s[None, :] < k_end.long()[:, None])


def causal_mask(cu_seqlens) -> torch.Tensor:
    """bool ``[T, T]``: token ``t`` of sequence ``b`` sees keys ``cu_seqlens[b] <= s <= t``."""
    k_start, k_end = causal_key_ranges(cu_seqlens)
    return range_mask(k_start, k_end, k_start.shape[0])


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dim restricted to ``mask``; 0 outside it and in rows with no entry.

    Rows without entries are replaced by zeros before the softmax so that no NaN appears in the
    forward or the backward.
    """
    row_nonempty = mask.any(dim=-1, keepdim=True)
    masked = torch.where(mask, logits, NEG_INF)
    masked = torch.where(row_nonempty, masked, 0.0)
    return torch.where(mask, torch.log_softmax(masked, dim=-1), 0.0)


def kl_rows(target: torch.Tensor, log_p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over the support of ``target · (log target − log p)``, with 0 log 0 = 0. ``[T]``."""
    positive = mask & (target > 0)
    log_target = torch.log(torch.where(positive, target, 1.0))
    return torch.where(positive, target * (log_target - log_p), 0.0).sum(dim=-1)


def kl_target(mass: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The sparse KL target (docs/spec.md §6): ``mass [T, K]`` restricted to ``valid`` and
    normalized per row; 0 in rows whose mass sums to 0."""
    mass = torch.where(valid, mass, 0.0)
    total = mass.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, mass / torch.where(total > 0, total, 1.0), 0.0)


def indexer_logits(q_idx, k_rows, weights, relu: bool, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``score = Σ_h weights[t, h] · f(q_idx[t, h] · k)`` for keys ``k_rows [T, S, D_I]`` -> ``[T, S]``,
    computed in ``dtype`` (``f`` = ReLU if ``relu``, else the identity)."""
    dots = torch.einsum("thd,tsd->ths", q_idx.to(dtype), k_rows.to(dtype))
    if relu:
        dots = torch.relu(dots)
    return torch.einsum("th,ths->ts", weights.to(dtype), dots)


# ---------------------------------------------------------------------------------------------
# §3 Indexer


def indexer_scores(q_idx, k_idx, weights, k_start, k_end, relu: bool) -> torch.Tensor:
    """All indexer scores ``[T, T_kv]`` float64; -inf for keys outside ``[k_start, k_end)``."""
    T = q_idx.shape[0]
    k_rows = k_idx.double()[None].expand(T, -1, -1)
    scores = indexer_logits(q_idx, k_rows, weights, relu)
    return scores.masked_fill(~range_mask(k_start, k_end, k_idx.shape[0]), NEG_INF)


# ---------------------------------------------------------------------------------------------
# §3 FP8 selection (the contract of docs/spec.md §3 "FP8 selection", bitwise where it says exact)

FP8_E4M3_MAX = 448.0


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization of ``x [..., D]`` with torch's own float8 cast.

    ``scale = amax / 448`` in fp32 (1 for a zero row), codes = ``e4m3(fp32(x) / scale)`` (round to
    nearest even); a row with a NaN or +-Inf gets scale NaN and NaN codes. Returns
    ``(codes float8_e4m3fn [..., D], scale float32 [...])``.
    """
    xf = x.detach().float()
    finite = torch.isfinite(xf).all(dim=-1)
    amax = xf.abs().amax(dim=-1) if xf.shape[-1] else torch.zeros(xf.shape[:-1])
    scale = amax / FP8_E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    # |x / scale| <= 448 up to one rounding of the division, which the cast rounds back to 448.
    codes = (xf / scale[..., None]).to(torch.float8_e4m3fn)
    return codes, scale


def fp8_selection_scores(q_idx, k_idx, weights, k_start, k_end, relu: bool) -> torch.Tensor:
    """The FP8 selection scores ``[T, T_kv]`` float64 (-inf outside ``[k_start, k_end)``):
    ``k_scale[s] · Σ_h (w[t,h]·q_scale[t,h]) · f(q^[t,h] · k^[s])``, the head sum in increasing h,
    the dot products exact; bitwise what the CPU backend computes."""
    q8, qs = quantize_fp8(q_idx)
    k8, ks = quantize_fp8(k_idx)
    dots = torch.einsum("thd,sd->ths", q8.double(), k8.double())  # exact: e4m3 products fit a double
    if relu:
        dots = torch.where(dots <= 0, torch.zeros_like(dots), dots)  # keeps NaN
    wq = weights.float().double() * qs.double()
    acc = torch.zeros(dots.shape[0], dots.shape[2], dtype=torch.float64)
    for h in range(dots.shape[1]):
        acc = acc + wq[:, h, None] * dots[:, h, :]
    acc = acc * ks.double()[None, :]
    return acc.masked_fill(~range_mask(k_start, k_end, k_idx.shape[0]), NEG_INF)


def fp8_candidates(q_idx, k_idx, weights, k_start, k_end, relu: bool, candidates: int) -> list[torch.Tensor]:
    """Per row, the sorted int64 keys the FP8 selection re-scores: every visible key when at most
    ``candidates`` are visible, else the ``candidates`` best by :func:`fp8_selection_scores` (NaN
    first, then the larger score, then the smaller key)."""
    scores = fp8_selection_scores(q_idx, k_idx, weights, k_start, k_end, relu)
    out = []
    for t in range(scores.shape[0]):
        lo, hi = int(k_start[t]), int(k_end[t])
        keys = torch.arange(lo, hi)
        if hi - lo > candidates:
            row = scores[t, lo:hi]
            nan = torch.isnan(row)
            # lexicographic (NaN first, larger score, smaller key) with stable sorts, last key first
            order = torch.sort(torch.where(nan, torch.zeros_like(row), row), descending=True, stable=True).indices
            order = order[torch.sort(nan[order].to(torch.int8), descending=True, stable=True).indices]
            keys = keys[order[:candidates]].sort().values
        out.append(keys)
    return out


# ---------------------------------------------------------------------------------------------
# §4-§5 Sparse MLA (backward = autograd of this)


def sparse_mla_probs(q, kv, indices, scale: float, dtype: torch.dtype = torch.float64):
    """Sparse MLA forward with its softmax probabilities, computed in ``dtype``.

    Returns:
        ``out [T, H, D_v]`` (0 for rows without a valid index), ``lse [T, H]`` (-inf for those
        rows) and ``probs [T, H, K]`` (0 in empty slots), all in ``dtype``.
    """
    d_v = q.shape[-1] - ROPE_WIDTH
    kv_rows = gather_rows(kv, indices, dtype)                            # [T, K, D_qk]
    valid = valid_slots(indices, kv.shape[0])[:, None, :]                # [T, 1, K]
    logits = scale * torch.einsum("thd,tkd->thk", q.to(dtype), kv_rows)  # [T, H, K]
    logits = torch.where(valid, logits, NEG_INF)
    row_nonempty = valid.any(dim=-1)                                     # [T, 1]
    # Empty rows get a finite stand-in so that no NaN reaches the backward.
    lse = torch.logsumexp(torch.where(row_nonempty[..., None], logits, 0.0), dim=-1)
    probs = torch.exp(logits - lse[..., None])
    out = torch.einsum("thk,tkd->thd", probs, kv_rows[..., :d_v])
    return out, torch.where(row_nonempty, lse, NEG_INF), probs


def sparse_mla(q, kv, indices, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``out [T, H, D_v]``, ``lse [T, H]`` float64 (out = 0, lse = -inf for rows without a valid index)."""
    out, lse, _ = sparse_mla_probs(q, kv, indices, scale)
    return out, lse


# ---------------------------------------------------------------------------------------------
# §6 Indexer KL loss


def attention_mass(q, kv, indices, lse, scale: float) -> torch.Tensor:
    """``mass[t, j] = Σ_h exp(scale q[t, h] · kv[idx_j] − lse[t, h])``; 0 for empty slots. ``[T, K]`` float64."""
    kv_rows = gather_rows(kv, indices)
    logits = scale * torch.einsum("thd,tkd->thk", q.double(), kv_rows)
    valid = valid_slots(indices, kv.shape[0])
    lse = lse.double()
    finite_lse = torch.where(torch.isfinite(lse), lse, 0.0)
    mass = torch.exp(logits - finite_lse[..., None]).sum(dim=1)
    return torch.where(valid, mass, 0.0)


def sparse_kl_rows(q_idx, k_idx, weights, indices, mass, relu: bool,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Per-row sparse KL loss ``[T]`` in ``dtype`` (differentiable in q_idx, k_idx, weights; ``mass``
    is the unnormalized target)."""
    valid = valid_slots(indices, k_idx.shape[0])
    logits = indexer_logits(q_idx, gather_rows(k_idx, indices, dtype), weights, relu, dtype)   # [T, K]
    return kl_rows(kl_target(mass.to(dtype), valid), masked_log_softmax(logits, valid), valid)


def dense_kl_rows(q, kv, scale: float, q_idx, k_idx, weights, k_start, k_end, relu: bool) -> torch.Tensor:
    """Per-row dense KL loss ``[T]`` float64: target = head-mean softmax of ``scale q · kv`` over
    ``[k_start, k_end)``."""
    mask = range_mask(k_start, k_end, kv.shape[0])                       # [T, T_kv]
    attn_logits = scale * torch.einsum("thd,sd->ths", q.double(), kv.double())
    target = masked_log_softmax(attn_logits, mask[:, None, :]).exp().mean(dim=1)
    target = torch.where(mask, target, 0.0)
    T = q_idx.shape[0]
    logits = indexer_logits(q_idx, k_idx.double()[None].expand(T, -1, -1), weights, relu)
    return kl_rows(target, masked_log_softmax(logits, mask), mask)


# ---------------------------------------------------------------------------------------------
# The whole layer (composition of the above)


class LayerResult(NamedTuple):
    """Result of :func:`dsa_layer`."""
    out: torch.Tensor  # [T, H, D_v] float64
    loss: Optional[torch.Tensor]  # scalar float64, differentiable in q_idx, k_idx, weights
    scores: Optional[torch.Tensor]  # [T, T_kv] float64 indexer scores, -inf outside the ranges


def dsa_layer(q, kv, q_idx, k_idx, weights, cu_seqlens, scale, indices, *, relu=True, loss_coeff=None,
              loss_formulation="sparse") -> LayerResult:
    """The layer's math (docs/spec.md §3-§6) on packed THD causal sequences, for the given top-k
    ``indices`` (a caller checks a layer's own top-k against ``scores`` separately: ties may be
    broken either way).

    ``loss = coeff · Σ_t loss_t / N`` over rows with a non-empty support; its target uses detached
    ``q``/``kv``, so back-propagating ``Σ out·probe + loss`` gives the layer's expected gradients.
    """
    if loss_formulation not in ("sparse", "dense"):
        raise ValueError(f"loss_formulation must be 'sparse' or 'dense', got {loss_formulation!r}")
    k_start, k_end = causal_key_ranges(cu_seqlens, device=q.device)
    indices = indices.to(q.device)
    scores = None if q_idx is None else indexer_scores(q_idx, k_idx, weights, k_start, k_end, relu)
    out, lse = sparse_mla(q, kv, indices, scale)
    loss = None
    if loss_coeff is not None:
        if loss_formulation == "sparse":
            mass = attention_mass(q.detach(), kv.detach(), indices, lse.detach(), scale)
            rows = sparse_kl_rows(q_idx, k_idx, weights, indices, mass, relu)
            nonempty = valid_slots(indices, kv.shape[0]).any(1)
        else:
            rows = dense_kl_rows(q.detach(), kv.detach(), scale, q_idx, k_idx, weights, k_start, k_end, relu)
            nonempty = k_end > k_start
        loss = loss_coeff * rows.sum() / nonempty.sum().clamp_min(1)
    return LayerResult(out, loss, scores)
