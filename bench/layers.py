"""The whole DSA layer forward + backward, composed from the FlashDSA ops and from plain PyTorch.

One training step of the attention core, as the DSA layer runs it in training: indexer + top-k →
sparse MLA forward; in the backward, the sparse MLA backward with its attention-mass output (the KL
target) → sparse indexer KL loss forward and backward (`sparse_mla_with_indexer_loss`). Each
function returns what the step keeps (output, loss, gradients), which the memory measurement
counts as outputs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Tuple

import torch

from . import unfused
from .config import DsaShape
from .inputs import DsaInputs

# The raw ops one full DSA layer fwd + bwd runs.
LAYER_OPS = ("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "sparse_kl_fwd",
             "sparse_kl_bwd")


def _indexer_leaves(x: DsaInputs):
    return (x.q_idx, x.k_idx, x.weights)


def _full_layer(fd: ModuleType, x: DsaInputs, s: DsaShape, indices: torch.Tensor) -> Tuple:
    """Sparse MLA + indexer KL loss (computed in the backward), fwd + bwd:
    (out, loss, dq, dkv, dq_idx, dk_idx, dweights)."""
    stat = torch.float64 if x.q.dtype == torch.float64 else torch.float32
    loss = torch.full((), float("nan"), dtype=stat, device=x.q.device)
    out, _ = fd.sparse_mla_with_indexer_loss(x.q, x.kv, indices, s.scale, x.q_idx, x.k_idx, x.weights, loss)
    grads = torch.autograd.grad(out, (x.q, x.kv) + _indexer_leaves(x), x.dout)
    return (out, loss, *grads)


def _shared_layer(fd: ModuleType, x: DsaInputs, s: DsaShape, indices: torch.Tensor) -> Tuple:
    """Sparse MLA only (IndexShare "shared" layer), fwd + bwd: (out, dq, dkv)."""
    out, _ = fd.sparse_mla(x.q, x.kv, indices, s.scale)
    return (out, *torch.autograd.grad(out, (x.q, x.kv), x.dout))


def flashdsa_layers_fwd_bwd(fd: ModuleType, x: DsaInputs, s: DsaShape, *, layers: int = 1) -> Tuple:
    """`layers` DSA layers sharing one indexer (IndexShare when layers > 1), each fwd + bwd.

    The first layer is "full" (indexer, top-k, KL loss); the others are "shared": they reuse its
    indices and run only sparse MLA. Each layer runs its forward then its backward (the total work
    equals all forwards then all backwards; only one layer's activations are alive at a time).
    All layers use the same q / kv: the cost does not depend on the values. Returns the last
    layer's results.
    """
    indices, _ = fd.indexer_topk(x.q_idx, x.k_idx, x.weights, x.k_start, x.k_end, s.topk)
    kept = _full_layer(fd, x, s, indices)
    for _ in range(1, layers):
        kept = ()  # drop the previous layer's results before this one allocates its own
        kept = _shared_layer(fd, x, s, indices)
    return kept


def unfused_layer_fwd_bwd(x: DsaInputs, s: DsaShape, *, chunk_bytes: int) -> Tuple:
    """One full DSA layer fwd + bwd in plain PyTorch (same math as flashdsa_layers_fwd_bwd, layers=1)."""
    indices, _ = unfused.indexer_topk(x.q_idx, x.k_idx, x.weights, x.k_start, x.k_end, s.topk,
                                      chunk_bytes=chunk_bytes)
    out, mass = unfused.sparse_mla(x.q, x.kv, indices, s.scale, s.d_v, chunk_bytes=chunk_bytes)
    loss = unfused.sparse_kl_loss(x.q_idx, x.k_idx, x.weights, indices, mass, chunk_bytes=chunk_bytes)
    grads = torch.autograd.grad((out, loss), (x.q, x.kv) + _indexer_leaves(x), (x.dout, None))
    return (out, loss.detach(), *grads)
