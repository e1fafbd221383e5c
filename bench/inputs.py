"""Random benchmark inputs (never zeros) for one causal sequence of T tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
import torch
from flashdsa.thd import causal_key_ranges

from .config import BenchConfig, DsaShape


@dataclass
class DsaInputs:
    """Inputs of one DSA layer; grad-requiring leaves where the layer trains them."""

    q: torch.Tensor  # [T, H, D_qk] act
    kv: torch.Tensor  # [T, D_qk] act
    q_idx: torch.Tensor  # [T, H_I, D_I] act
    k_idx: torch.Tensor  # [T, D_I] act
    weights: torch.Tensor  # [T, H_I] fp32, scales folded in
    k_start: torch.Tensor  # [T] int32, all 0 (one sequence)
    k_end: torch.Tensor  # [T] int32, t + 1
    dout: torch.Tensor  # [T, H, D_v] act, the upstream gradient of the attention output


def causal_ranges(t: int, device: torch.device):
    """Key ranges of one causal sequence (flashdsa.thd): k_start = 0, k_end = t + 1 (int32 [T])."""
    return causal_key_ranges([0, t], device=device)


def _randn(cfg: BenchConfig, *shape, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=cfg.dtype, device=cfg.device).requires_grad_(requires_grad)


def index_inputs(cfg: BenchConfig, t: int, *, requires_grad: bool = False):
    """Random indexer inputs (q_idx, k_idx, weights, k_start, k_end); weights scaled as the model folds them."""
    s = cfg.dsa
    weights = torch.randn(t, s.index_heads, device=cfg.device) * (s.index_heads * s.index_dim) ** -0.5
    return (_randn(cfg, t, s.index_heads, s.index_dim, requires_grad=requires_grad),
            _randn(cfg, t, s.index_dim, requires_grad=requires_grad),
            weights.requires_grad_(requires_grad),
            *causal_ranges(t, cfg.device))


def dsa_inputs(cfg: BenchConfig, t: int, *, requires_grad: bool = False) -> DsaInputs:
    """Random unit-variance layer inputs; q, kv, q_idx, k_idx, weights require grad if asked."""
    s = cfg.dsa
    return DsaInputs(_randn(cfg, t, s.heads, s.d_qk, requires_grad=requires_grad),
                     _randn(cfg, t, s.d_qk, requires_grad=requires_grad),
                     *index_inputs(cfg, t, requires_grad=requires_grad),
                     dout=_randn(cfg, t, s.heads, s.d_v))


INDEX_ORDERS = ("ascending", "shuffled")


def causal_topk_indices(t: int, topk: int, device: torch.device, rows_per_chunk: int = 16384,
                        order: str = "ascending") -> torch.Tensor:
    """Distinct random visible keys per query, as the indexer would pick them (int32 [T, K]).

    Row r sees keys [0, r + 1). Rows with r + 1 <= K take all of them, then -1. Longer rows cut
    [0, r + 1) into K disjoint integer strata and take one key at random from each: distinct keys
    spread over the whole row. Built in row chunks to bound the int64 temporaries.

    order: "ascending" keeps a full row's keys in stratum order (ascending key index);
    "shuffled" permutes each full row's slots at random — the order a top-k selection returns keys
    in (our indexer_topk's rows are in no particular order), which changes how the backward's dkv
    reductions walk the key range. Rows with r + 1 <= K stay ascending with the -1 padding last.
    """
    if order not in INDEX_ORDERS:
        raise ValueError(f"order must be one of {INDEX_ORDERS}, got {order!r}")
    indices = torch.empty(t, topk, dtype=torch.int32, device=device)
    slots = torch.arange(topk, device=device).unsqueeze(0)  # [1, K] int64
    for first in range(0, t, rows_per_chunk):
        visible = torch.arange(first + 1, min(t, first + rows_per_chunk) + 1, device=device).unsqueeze(1)
        lo = slots * visible // topk  # stratum j = [lo_j, hi_j), non-empty when visible >= K
        hi = (slots + 1) * visible // topk
        sampled = lo + (torch.rand(lo.shape, device=device) * (hi - lo)).long().clamp_max(hi - lo - 1)
        if order == "shuffled":
            sampled = sampled.gather(1, torch.rand(sampled.shape, device=device).argsort(dim=1))
        short = torch.where(slots < visible, slots, torch.full_like(slots, -1))
        indices[first:first + visible.shape[0]] = torch.where(visible > topk, sampled, short).to(torch.int32)
    return indices


def random_mass(indices: torch.Tensor) -> torch.Tensor:
    """A positive unnormalized attention mass on the valid slots, 0 on empty ones (fp32 [T, K])."""
    mass = torch.rand(indices.shape, device=indices.device) + 0.05
    return torch.where(indices >= 0, mass, torch.zeros_like(mass))


def input_set_count(bytes_per_set: int, l2_bytes: int) -> int:
    """How many distinct input sets to rotate so that repetitions do not run from a warm L2.

    Inputs much larger than L2 need one set; smaller ones get enough sets to cover 3 × L2
    (at least 2, at most 8).
    """
    if bytes_per_set >= 2 * l2_bytes:
        return 1
    return max(2, min(8, math.ceil(3 * l2_bytes / max(bytes_per_set, 1))))


def index_input_bytes(t: int, s: DsaShape) -> int:
    """Bytes of one set of indexer inputs: q_idx, k_idx, weights, key ranges."""
    return t * (s.index_heads + 1) * s.index_dim * 2 + t * s.index_heads * 4 + 8 * t


def attention_input_bytes(t: int, s: DsaShape) -> int:
    """Bytes of one set of sparse-MLA inputs: q, kv, indices."""
    return t * (s.heads + 1) * s.d_qk * 2 + t * s.topk * 4


def layer_input_bytes(t: int, s: DsaShape) -> int:
    """Bytes of one set of layer inputs (DsaInputs)."""
    return attention_input_bytes(t, s) + index_input_bytes(t, s) + t * s.heads * s.d_v * 2


def layer_memory_bytes(t: int, s: DsaShape, act_bytes: int = 2) -> int:
    """Predicted device memory of one DSA layer fwd+bwd: inputs, outputs, grads, [T, K] buffers."""
    q = t * s.heads * s.d_qk * act_bytes
    out = t * s.heads * s.d_v * act_bytes
    per_topk_slot = t * s.topk * 4  # indices, scores, mass
    return 2 * q + 2 * out + 3 * per_topk_slot
