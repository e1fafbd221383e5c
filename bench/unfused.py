"""Unfused plain-PyTorch DSA: the baseline that computes the same math as the FlashDSA kernels.

Gather the top-k key rows per chunk of queries, einsum, softmax, and let autograd do the
backward. Not a reference: its GEMMs run in the activation dtype (bf16 tensor cores on the GPU),
as an unfused model would; the masks and the KL pieces come from :mod:`flashdsa.reference`. Chunking over queries bounds the temporaries of one chunk, but autograd keeps every
chunk's gathered keys and probabilities ([T, K, D_qk] and [T, H, K]) for the backward: that is
what runs out of memory at long T, and it is recorded as such by the benchmark.
"""

from __future__ import annotations

from typing import Tuple

import torch
from flashdsa import reference

# Masked scores: exp(MASKED - max) is exactly 0 in fp32, and a row with no valid slot stays finite.
MASKED = -1e30


def stat_dtype(act: torch.dtype) -> torch.dtype:
    """Accumulation / softmax dtype: fp32, or fp64 for fp64 activations (as the CPU reference)."""
    return torch.float64 if act == torch.float64 else torch.float32


def rows_per_chunk(bytes_per_row: int, chunk_bytes: int) -> int:
    """Query rows per chunk so that one chunk's temporaries stay within chunk_bytes."""
    return max(1, chunk_bytes // max(bytes_per_row, 1))


def indexer_topk(q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                 k_end: torch.Tensor, topk: int, *, relu: bool = True,
                 chunk_bytes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indexer scores (chunked matmul) and torch.topk (docs/spec.md §3); no gradient.

    Args:
        q_idx: [T, H_I, D_I] act; k_idx: [T_kv, D_I] act; weights: [T, H_I] fp32.
        k_start, k_end: [T] int32 key ranges.
    Returns:
        indices [T, K] int32 (-1 = empty slot), scores [T, K] stat (-inf for empty slots).
    """
    t, index_heads, _ = q_idx.shape
    stat = stat_dtype(q_idx.dtype)
    indices = torch.full((t, topk), -1, dtype=torch.int32, device=q_idx.device)
    scores = torch.full((t, topk), float("-inf"), dtype=stat, device=q_idx.device)
    step = rows_per_chunk(index_heads * k_idx.shape[0] * 4 * 2, chunk_bytes)
    with torch.no_grad():
        for first in range(0, t, step):
            rows = slice(first, min(t, first + step))
            lo, hi = int(k_start[rows].min()), int(k_end[rows].max())
            if hi <= lo:
                continue
            logits = torch.einsum("chd,sd->chs", q_idx[rows], k_idx[lo:hi]).to(stat)  # [c, H_I, S]
            if relu:
                logits.relu_()
            score = torch.einsum("ch,chs->cs", weights[rows].to(stat), logits)  # [c, S]
            visible = reference.range_mask(k_start[rows] - lo, k_end[rows] - lo, hi - lo)
            score.masked_fill_(~visible, float("-inf"))
            count = min(topk, hi - lo)
            top_scores, top = score.topk(count, dim=1)
            found = top_scores > float("-inf")
            indices[rows, :count] = torch.where(found, top + lo, -1).to(torch.int32)
            scores[rows, :count] = top_scores
    return indices, scores


def sparse_mla(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, d_v: int, *,
               chunk_bytes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA (docs/spec.md §4) by gather + einsum + softmax; differentiable through autograd.

    Args:
        q: [T, H, D_qk] act; kv: [T_kv, D_qk] act (value = kv[:, :d_v]); indices: [T, K] int32.
    Returns:
        out [T, H, d_v] act (0 for rows with no valid slot), and the attention mass
        [T, K] stat = sum_h softmax probability (docs/spec.md §6), detached.
    """
    t, heads, d_qk = q.shape
    topk = indices.shape[1]
    step = rows_per_chunk(topk * d_qk * q.element_size() + heads * topk * 4 * 3, chunk_bytes)
    outs, masses = [], []
    for first in range(0, t, step):
        rows = slice(first, min(t, first + step))
        valid = reference.valid_slots(indices[rows], kv.shape[0]).unsqueeze(1)  # [c, 1, K]
        gathered = kv[indices[rows].clamp(0, kv.shape[0] - 1).long()]  # [c, K, D_qk]
        logits = torch.einsum("chd,ckd->chk", q[rows], gathered).to(stat_dtype(q.dtype)) * scale
        probs = torch.softmax(logits.masked_fill(~valid, MASKED), dim=-1) * valid  # [c, H, K]
        outs.append(torch.einsum("chk,ckd->chd", probs.to(q.dtype), gathered[..., :d_v]))
        masses.append(probs.detach().sum(dim=1))
    return torch.cat(outs), torch.cat(masses)


def sparse_kl_loss(q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                   mass: torch.Tensor, *, relu: bool = True, chunk_bytes: int) -> torch.Tensor:
    """Sparse indexer KL loss (docs/spec.md §6), mean over rows with a non-empty support.

    Differentiable in q_idx, k_idx and weights; the target (mass [T, K] fp32) is detached.
    """
    t, index_heads, index_dim = q_idx.shape
    topk = indices.shape[1]
    step = rows_per_chunk(topk * index_dim * q_idx.element_size() + index_heads * topk * 4 * 3, chunk_bytes)
    rows_loss = []
    for first in range(0, t, step):
        rows = slice(first, min(t, first + step))
        valid = reference.valid_slots(indices[rows], k_idx.shape[0])  # [c, K]
        gathered = k_idx[indices[rows].clamp(0, k_idx.shape[0] - 1).long()]  # [c, K, D_I]
        stat = stat_dtype(q_idx.dtype)
        logits = torch.einsum("chd,ckd->chk", q_idx[rows], gathered).to(stat)
        if relu:
            logits = torch.relu(logits)
        score = torch.einsum("ch,chk->ck", weights[rows].to(stat), logits)
        log_p = reference.masked_log_softmax(score, valid)
        target = reference.kl_target(mass[rows].detach().to(stat), valid)
        rows_loss.append(reference.kl_rows(target, log_p, valid))
    nonempty = reference.valid_slots(indices, k_idx.shape[0]).any(dim=1).sum().clamp_min(1)
    return torch.cat(rows_loss).sum() / nonempty
