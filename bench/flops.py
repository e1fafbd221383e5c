"""FLOP counts of docs/spec.md §9 for one causal sequence of T tokens (k_start = 0, k_end = t + 1).

The KL-loss kernels are not in §9; they are counted like the indexer, over the top-k slots:
fwd = 2 · T · K · H_I · D_I (score recompute), bwd = 3 × fwd (score recompute, dq_idx, dk_idx).
"""

from __future__ import annotations

from .config import DenseShape, DsaShape


def causal_pairs(t: int) -> int:
    """Visible (query, key) pairs of one causal sequence: T (T + 1) / 2."""
    return t * (t + 1) // 2


def indexer_flops(t: int, s: DsaShape) -> float:
    return 2.0 * causal_pairs(t) * s.index_heads * s.index_dim


def sparse_fwd_flops(t: int, s: DsaShape) -> float:
    return 2.0 * t * s.heads * s.topk * (s.d_qk + s.d_v)


def sparse_bwd_flops(t: int, s: DsaShape) -> float:
    return 2.0 * t * s.heads * s.topk * (3 * s.d_qk + 2 * s.d_v)


def attention_mass_flops(t: int, s: DsaShape) -> float:
    return 2.0 * t * s.heads * s.topk * s.d_qk


def kl_fwd_flops(t: int, s: DsaShape) -> float:
    return 2.0 * t * s.topk * s.index_heads * s.index_dim


def kl_bwd_flops(t: int, s: DsaShape) -> float:
    return 3.0 * kl_fwd_flops(t, s)


def loss_path_flops(t: int, s: DsaShape) -> float:
    """Indexer-loss path: attention-mass recompute + KL fwd + KL bwd (indexer gradients)."""
    return attention_mass_flops(t, s) + kl_fwd_flops(t, s) + kl_bwd_flops(t, s)


def dsa_layer_flops(t: int, s: DsaShape) -> float:
    """One full DSA layer fwd + bwd: indexer, sparse MLA fwd + bwd, loss path."""
    return indexer_flops(t, s) + sparse_fwd_flops(t, s) + sparse_bwd_flops(t, s) + loss_path_flops(t, s)


def index_share_group_flops(t: int, s: DsaShape) -> float:
    """IndexShare group of s.share_every layers: indexer + loss once, sparse MLA fwd + bwd in every layer."""
    attention = sparse_fwd_flops(t, s) + sparse_bwd_flops(t, s)
    return indexer_flops(t, s) + loss_path_flops(t, s) + s.share_every * attention


def dense_fwd_flops(t: int, d: DenseShape) -> float:
    return 2.0 * causal_pairs(t) * d.heads * (d.d_qk + d.d_v)


def dense_fwd_bwd_flops(t: int, d: DenseShape) -> float:
    """Dense causal attention fwd + bwd, bwd counted as 2.5 × fwd."""
    return 3.5 * dense_fwd_flops(t, d)


def gemm_flops(n: int) -> float:
    return 2.0 * n ** 3
