"""Plain-PyTorch float64 references of the FlashDSA ops (docs/spec.md §3-§6), and the random inputs of
the op tests.

The references are written for clarity, not speed: they gather and materialize [T, H, K] and
[T, T_kv] tensors freely, and their gradients come from PyTorch autograd. Every function converts
its inputs to float64 (pass float64 leaves with requires_grad=True to get reference gradients).
An index outside [0, T_kv) is an empty slot; a row with no valid slot has an empty support.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROPE_WIDTH = 64  # D_v = D_qk - 64: the op derives the value width from q's last dimension
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------
# Shared pieces


def valid_slots(indices: torch.Tensor, num_keys: int) -> torch.Tensor:
    """bool [T, K]: slots whose index lies in [0, num_keys)."""
    return (indices >= 0) & (indices < num_keys)


def gather_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """x[indices] for [T, K] indices, with empty slots reading row 0 (callers mask them)."""
    safe = torch.where(valid_slots(indices, x.shape[0]), indices, 0).long()
    return x.double()[safe]


def range_mask(k_start: torch.Tensor, k_end: torch.Tensor, num_keys: int) -> torch.Tensor:
    """bool [T, num_keys]: key s visible to row t iff k_start[t] <= s < k_end[t]."""
    s = torch.arange(num_keys, device=k_start.device)
    return (s[None, :] >= k_start.long()[:, None]) & (s[None, :] < k_end.long()[:, None])


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dim restricted to `mask`; 0 outside it and in rows with no entry.

    Rows without entries are replaced by zeros before the softmax so that no NaN appears in the
    forward or the backward.
    """
    row_nonempty = mask.any(dim=-1, keepdim=True)
    masked = torch.where(mask, logits, NEG_INF)
    masked = torch.where(row_nonempty, masked, 0.0)
    return torch.where(mask, torch.log_softmax(masked, dim=-1), 0.0)


def kl_rows(target: torch.Tensor, log_p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over the support of target * (log target - log p), with 0 log 0 = 0. [T] float64."""
    positive = mask & (target > 0)
    log_target = torch.log(torch.where(positive, target, 1.0))
    return torch.where(positive, target * (log_target - log_p), 0.0).sum(dim=-1)


def indexer_logits(q_idx, k_rows, weights, relu: bool) -> torch.Tensor:
    """score = sum_h weights[t, h] * f(q_idx[t, h] . k) for keys k_rows [T, S, D_I] -> [T, S]."""
    dots = torch.einsum("thd,tsd->ths", q_idx.double(), k_rows)
    if relu:
        dots = torch.relu(dots)
    return torch.einsum("th,ths->ts", weights.double(), dots)


# ---------------------------------------------------------------------------------------------
# §3 Indexer


def indexer_scores(q_idx, k_idx, weights, k_start, k_end, relu: bool) -> torch.Tensor:
    """All indexer scores [T, T_kv] float64; -inf for keys outside [k_start, k_end)."""
    T = q_idx.shape[0]
    k_rows = k_idx.double()[None].expand(T, -1, -1)
    scores = indexer_logits(q_idx, k_rows, weights, relu)
    return scores.masked_fill(~range_mask(k_start, k_end, k_idx.shape[0]), NEG_INF)


# ---------------------------------------------------------------------------------------------
# §4-§5 Sparse MLA (backward = autograd of this)


def sparse_mla(q, kv, indices, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """out [T, H, D_v], lse [T, H] float64 (out = 0, lse = -inf for rows without a valid index)."""
    d_v = q.shape[-1] - ROPE_WIDTH
    kv_rows = gather_rows(kv, indices)                                   # [T, K, D_qk]
    valid = valid_slots(indices, kv.shape[0])[:, None, :]                # [T, 1, K]
    logits = scale * torch.einsum("thd,tkd->thk", q.double(), kv_rows)   # [T, H, K]
    logits = torch.where(valid, logits, NEG_INF)
    row_nonempty = valid.any(dim=-1)                                     # [T, 1]
    # Empty rows get a finite stand-in so that no NaN reaches the backward.
    lse = torch.logsumexp(torch.where(row_nonempty[..., None], logits, 0.0), dim=-1)
    probs = torch.exp(logits - lse[..., None])
    out = torch.einsum("thk,tkd->thd", probs, kv_rows[..., :d_v])
    return out, torch.where(row_nonempty, lse, NEG_INF)


# ---------------------------------------------------------------------------------------------
# §6 Indexer KL loss


def attention_mass(q, kv, indices, lse, scale: float) -> torch.Tensor:
    """mass[t, j] = sum_h exp(scale q[t, h] . kv[idx_j] - lse[t, h]); 0 for empty slots. [T, K] float64."""
    kv_rows = gather_rows(kv, indices)
    logits = scale * torch.einsum("thd,tkd->thk", q.double(), kv_rows)
    valid = valid_slots(indices, kv.shape[0])
    lse = lse.double()
    finite_lse = torch.where(torch.isfinite(lse), lse, 0.0)
    mass = torch.exp(logits - finite_lse[..., None]).sum(dim=1)
    return torch.where(valid, mass, 0.0)


def sparse_kl_rows(q_idx, k_idx, weights, indices, mass, relu: bool) -> torch.Tensor:
    """Per-row sparse KL loss [T] float64 (differentiable in q_idx, k_idx, weights)."""
    valid = valid_slots(indices, k_idx.shape[0])
    logits = indexer_logits(q_idx, gather_rows(k_idx, indices), weights, relu)     # [T, K]
    mass = torch.where(valid, mass.double(), 0.0)
    total = mass.sum(dim=-1, keepdim=True)
    target = torch.where(total > 0, mass / torch.where(total > 0, total, 1.0), 0.0)
    return kl_rows(target, masked_log_softmax(logits, valid), valid)


def dense_kl_rows(q, kv, scale: float, q_idx, k_idx, weights, k_start, k_end, relu: bool) -> torch.Tensor:
    """Per-row dense KL loss [T] float64: target = head-mean softmax of scale q . kv over [k_start, k_end)."""
    mask = range_mask(k_start, k_end, kv.shape[0])                       # [T, T_kv]
    attn_logits = scale * torch.einsum("thd,sd->ths", q.double(), kv.double())
    target = masked_log_softmax(attn_logits, mask[:, None, :]).exp().mean(dim=1)
    target = torch.where(mask, target, 0.0)
    T = q_idx.shape[0]
    logits = indexer_logits(q_idx, k_idx.double()[None].expand(T, -1, -1), weights, relu)
    return kl_rows(target, masked_log_softmax(logits, mask), mask)


# ---------------------------------------------------------------------------------------------
# Random inputs of the op tests (fresh random data, packed THD, bf16-rounded where the op is bf16)


def random_cu_seqlens(lengths: list[int]) -> torch.Tensor:
    """cu_seqlens int32 [B + 1] of the given sequence lengths."""
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def causal_ranges(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """THD causal key ranges (int32 [T]) of packed sequences, by a plain loop."""
    starts, ends, offset = [], [], 0
    for n in lengths:
        for i in range(n):
            starts.append(offset)
            ends.append(offset + i + 1)
        offset += n
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)


def random_indices(k_start, k_end, topk: int, num_keys: int, *, junk: float = 0.0,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """int32 [T, K]: per row a random subset of its visible keys (all of them if fewer than K), in
    random order, -1 in the remaining slots. A fraction `junk` of the slots is then overwritten with
    invalid entries (-1, negative, >= num_keys) or duplicates of other visible keys."""
    T = k_start.shape[0]
    indices = torch.full((T, topk), -1, dtype=torch.int32)
    for t in range(T):
        lo, hi = int(k_start[t]), int(k_end[t])
        chosen = lo + torch.randperm(hi - lo, generator=generator)[:topk]
        indices[t, :chosen.numel()] = chosen.to(torch.int32)
    if junk > 0:
        hit = torch.rand(T, topk, generator=generator) < junk
        choices = torch.tensor([-1, -7, num_keys, num_keys + 13], dtype=torch.int32)
        bad = choices[torch.randint(len(choices), (T, topk), generator=generator)]
        lo = k_start.long()[:, None].expand(T, topk)
        span = (k_end - k_start).long().clamp_min(1)[:, None]
        dup = (lo + torch.randint(1 << 30, (T, topk), generator=generator) % span).to(torch.int32)
        has_keys = (k_end > k_start)[:, None]
        use_dup = (torch.rand(T, topk, generator=generator) < 0.5) & has_keys
        indices = torch.where(hit, torch.where(use_dup, dup, bad), indices)
    return indices


def softmax_scale(d_qk: int) -> float:
    """D_qk^-0.5 rounded to float32: the ops' params carry the scale as a float."""
    return float(torch.tensor(d_qk ** -0.5, dtype=torch.float32))


@dataclass
class AttentionCase:
    """Inputs of sparse MLA / attention mass: q [T, H, D_qk], kv [T_kv, D_qk], indices [T, K]."""
    q: torch.Tensor
    kv: torch.Tensor
    indices: torch.Tensor
    scale: float


def attention_case(lengths: list[int], H: int, topk: int, *, d_qk: int = 576, dtype=torch.bfloat16,
                   device="cpu", junk: float = 0.1, extra_keys: int = 0) -> AttentionCase:
    """Random attention inputs over packed causal sequences of the given lengths, plus `extra_keys`
    trailing keys outside every range (never selected: their gradient must be 0)."""
    k_start, k_end = causal_ranges(lengths)
    T = k_start.shape[0]
    T_kv = T + extra_keys
    indices = random_indices(k_start, k_end, topk, T_kv, junk=junk)
    # Logits scale * q . kv ~ N(0, 4): softmaxes that are neither flat nor one-hot.
    q = (2.0 * torch.randn(T, H, d_qk)).to(dtype)
    kv = torch.randn(T_kv, d_qk).to(dtype)
    return AttentionCase(q.to(device), kv.to(device), indices.to(device), softmax_scale(d_qk))


@dataclass
class IndexerCase:
    """Indexer inputs: q_idx [T, H_I, D_I], k_idx [T_kv, D_I], weights [T, H_I] (stat), ranges [T]."""
    q_idx: torch.Tensor
    k_idx: torch.Tensor
    weights: torch.Tensor
    k_start: torch.Tensor
    k_end: torch.Tensor


def indexer_case(k_start, k_end, T_kv: int, H_I: int, D_I: int, *, dtype=torch.bfloat16,
                 device="cpu") -> IndexerCase:
    """Random indexer inputs; signed weights scaled so that scores spread over a few units."""
    T = k_start.shape[0]
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    q_idx = torch.randn(T, H_I, D_I).to(dtype)
    k_idx = torch.randn(T_kv, D_I).to(dtype)
    weights = (torch.randn(T, H_I) * D_I ** -0.5).to(stat)
    return IndexerCase(q_idx.to(device), k_idx.to(device), weights.to(device), k_start.to(device),
                       k_end.to(device))


# ---------------------------------------------------------------------------------------------
# Comparison


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> float:
    """Asserts ||actual - expected|| <= tol * ||expected|| (float64, over finite entries) and that
    both have the same non-finite entries (e.g. -inf lse of empty rows). Returns the relative error."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    finite = torch.isfinite(expected)
    assert torch.equal(actual[~finite], expected[~finite]), f"{what}: non-finite entries differ"
    diff = (actual[finite] - expected[finite]).norm().item()
    scale = expected[finite].norm().item()
    rel = diff / scale if scale > 0 else diff
    assert rel <= tol, f"{what}: relative error {rel:.3e} > {tol:.1e}"
    return rel
