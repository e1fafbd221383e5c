"""The op tests' helpers: random inputs (packed THD, bf16-rounded where the op is bf16) and the
comparison. The float64 reference math itself is :mod:`flashdsa.reference` (docs/spec.md §3-§6),
re-exported here so that a test reads ``ref.sparse_mla(...)`` next to ``ref.attention_case(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashdsa.reference import *  # noqa: F401,F403  (the reference math, re-exported for the tests)
from flashdsa.thd import causal_key_ranges, cu_seqlens_from_lengths


# ---------------------------------------------------------------------------------------------
# Random inputs of the op tests (fresh random data, packed THD, bf16-rounded where the op is bf16)


def causal_ranges(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """THD causal key ranges (int32 [T], CPU) of packed sequences of the given lengths (flashdsa.thd)."""
    return causal_key_ranges(cu_seqlens_from_lengths(lengths))


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
