"""FlashDSA as a Megatron Core ``dsa_kernel_backend``: the four hooks Megatron looks up by name.

Megatron Core 0.19.2 (``megatron/core/transformer/experimental_attention_variant/dsa_kernels.py``)
imports the module registered for ``config.dsa_kernel_backend`` and calls these functions (by
keyword, so extra keyword arguments of later versions are accepted and ignored). A hook that returns
``None`` makes Megatron run its own PyTorch path instead; every decline is counted in
:data:`flashdsa.megatron.stats` and warned about once per reason.

Layouts (Megatron's, all handled here): SBHD ``[s, b, h, d]`` with the key ranges shared by the
batch, and packed THD (``b = 1``). Under context parallelism (``cp_comm_type="allgather"``)
Megatron passes the local queries and the gathered keys in global order, with key ranges in global
rows, which is exactly FlashDSA's contract (docs/megatron.md).

Batches (``b > 1``) are run as one packed THD problem: batch ``i``'s keys are rows
``[i * s_kv, (i + 1) * s_kv)`` of the flattened key tensor, so the key ranges and the top-k indices
are shifted by ``i * s_kv`` on the way in and back on the way out.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import warnings
from collections import Counter
from typing import Any, Callable, Optional

import torch

from .. import ops as _ops

__all__ = [
    "run_fused_absorbed_sparse_attention",
    "run_fused_dsa_attention",
    "run_fused_qk_topk",
    "run_fused_qk_topk_with_loss",
    "stats",
    "reset_stats",
]

#: Counters: ``<hook>`` = calls that FlashDSA served, ``declined:<hook>`` = calls handed back to
#: Megatron (returned None), ``loss_in_backward`` = fused calls whose indexer loss ran in the backward.
stats: Counter = Counter()

_ROPE_WIDTH = 64  # FlashDSA's D_v = D_qk - 64 (the value is the first D_v latent columns)
_warned: set = set()


#: Environment variable that picks the indexer's selection pass in every hook: "bf16" (default) or
#: "fp8" (e4m3 scores + exact re-score of the candidates; docs/spec.md §3). Read at each call.
SELECTION_ENV = "FLASHDSA_INDEXER_SELECTION"


def indexer_selection() -> str:
    """The selection pass the hooks use: ``$FLASHDSA_INDEXER_SELECTION`` ("bf16" when unset).

    Raises:
        ValueError: the variable holds anything but "bf16" or "fp8".
    """
    return _ops.check_selection(os.environ.get(SELECTION_ENV, "bf16").strip().lower() or "bf16")


#: Environment variable read with ``FLASHDSA_INDEXER_SELECTION=fp8``: the candidates re-scored per row
#: (an integer in [topk, 16384]; CUDA: a multiple of 64). Unset or empty: the library's default,
#: ``flashdsa.fp8_selection_candidates(topk)``. Read at each call; ignored with the bf16 selection.
FP8_CANDIDATES_ENV = "FLASHDSA_FP8_CANDIDATES"


def fp8_candidates() -> Optional[int]:
    """The FP8 candidate count the hooks pass on: ``$FLASHDSA_FP8_CANDIDATES`` as an int, None when unset.

    Raises:
        ValueError: the variable is set to something that is not an integer (the range is checked by
            :func:`flashdsa.indexer_topk` against the call's topk).
    """
    return _int_env(FP8_CANDIDATES_ENV)


#: Environment variable read with ``FLASHDSA_INDEXER_SELECTION=fp8``: the band re-score's b (an integer in
#: [1, topk - 1]: only the candidates below the topk - b best by the FP8 score are re-scored exactly; docs/spec.md
#: §3). Unset or empty: every candidate is re-scored. Read at each call; ignored with the bf16 selection.
FP8_BAND_ENV = "FLASHDSA_FP8_BAND"


def _int_env(name: str) -> Optional[int]:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}") from None


def fp8_band() -> Optional[int]:
    """The band re-score option the hooks pass on: ``$FLASHDSA_FP8_BAND`` as an int, None when unset.

    Raises:
        ValueError: the variable is set to something that is not an integer (the range is checked by
            :func:`flashdsa.indexer_topk` against the call's topk).
    """
    return _int_env(FP8_BAND_ENV)


#: Environment variable read with ``FLASHDSA_INDEXER_SELECTION=fp8`` and ``FLASHDSA_FP8_BAND`` set: ``1`` scales the
#: band re-score to each row's number of visible keys (``fp8_band_scaled=True`` of :func:`flashdsa.indexer_topk`;
#: docs/spec.md §3), ``0`` / unset / empty keeps it fixed. Read at each call.
FP8_BAND_SCALED_ENV = "FLASHDSA_FP8_BAND_SCALED"


def fp8_band_scaled() -> bool:
    """Whether the hooks scale the band re-score to each row's keys: ``$FLASHDSA_FP8_BAND_SCALED`` (``0`` or ``1``).

    Raises:
        ValueError: the variable is set to something other than 0 or 1.
    """
    value = _int_env(FP8_BAND_SCALED_ENV)
    if value not in (None, 0, 1):
        raise ValueError(f"${FP8_BAND_SCALED_ENV} must be 0 or 1, got {value!r}")
    return value == 1


def _selection_kwargs() -> dict:
    """selection=, fp8_candidates=, fp8_band= and fp8_band_scaled= for flashdsa.indexer_topk, from the environment
    variables."""
    selection = indexer_selection()
    fp8 = selection == "fp8"
    return {"selection": selection, "fp8_candidates": fp8_candidates() if fp8 else None,
            "fp8_band": fp8_band() if fp8 else None, "fp8_band_scaled": fp8_band_scaled() if fp8 else False}


def reset_stats() -> None:
    """Zeroes :data:`stats` (and lets every decline reason warn again)."""
    stats.clear()
    _warned.clear()


def _decline(hook: str, reason: str) -> None:
    """Counts a decline and warns once per (hook, reason); the caller then returns None."""
    stats[f"declined:{hook}"] += 1
    if (hook, reason) not in _warned:
        _warned.add((hook, reason))
        warnings.warn(f"flashdsa.megatron: {hook} declined, Megatron's PyTorch path runs instead: {reason}",
                      RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# What FlashDSA supports (docs/spec.md §2; the backends' limits: csrc/cpu/backend.cpp, csrc/sm90/backend.cpp)


def _device_reason(t: torch.Tensor, op: str) -> Optional[str]:
    if t.device.type == "cpu":
        if t.dtype not in (torch.bfloat16, torch.float32, torch.float64):
            return f"dtype {t.dtype} (the CPU backend takes bf16, fp32, fp64)"
        return None
    if t.device.type == "cuda":
        if not _ops.built_with_cuda():
            return f"this FlashDSA build has no CUDA kernels ({op})"
        if t.dtype != torch.bfloat16:
            return f"dtype {t.dtype} on CUDA (the CUDA kernels take bf16 only)"
        return None
    return f"device {t.device} (FlashDSA runs on CPU and CUDA)"


def _cuda_ops_reason(device: torch.device, ops: tuple[str, ...]) -> Optional[str]:
    """On CUDA: which of the raw ops ``ops`` this build cannot run (None when all run)."""
    if device.type != "cuda":
        return None
    if _ops.built_with_cuda():
        return None
    return f"this FlashDSA build has no CUDA kernels ({', '.join(ops)})"


_SPARSE_LOSS_OPS = ("sparse_mla_fwd", "attention_mass", "sparse_kl_fwd", "sparse_kl_bwd")
_DENSE_LOSS_OPS = ("dense_kl_fwd", "dense_kl_bwd")


def _topk_reason(topk: int, device: torch.device) -> Optional[str]:
    if not 1 <= topk <= 8192:
        return f"index_topk={topk} (must be in [1, 8192])"
    if device.type == "cuda" and topk % 64:
        return f"index_topk={topk} on CUDA (must be a multiple of 64)"
    return None


def _indexer_reason(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, topk: int) -> Optional[str]:
    """Why FlashDSA cannot run the indexer on Megatron's q [sq,b,H_I,D_I], k [skv,b,D_I], w [sq,b,H_I]."""
    if q.dim() != 4 or k.dim() != 3 or weights.dim() != 3:
        return f"indexer ranks q {q.dim()}D, k {k.dim()}D, weights {weights.dim()}D (expected 4, 3, 3)"
    sq, b, h_i, d_i = q.shape
    if k.shape[1] != b or k.shape[2] != d_i or tuple(weights.shape) != (sq, b, h_i):
        return f"indexer shapes q {tuple(q.shape)}, k {tuple(k.shape)}, weights {tuple(weights.shape)}"
    if k.dtype != q.dtype:
        return f"indexer q {q.dtype} and k {k.dtype} differ"
    reason = _device_reason(q, "indexer_topk") or _topk_reason(topk, q.device)
    if reason:
        return reason
    if q.device.type == "cuda":
        if h_i not in (32, 64):
            return f"H_I={h_i} on CUDA (must be 32 or 64)"
        if d_i not in (64, 128):
            return f"D_I={d_i} on CUDA (must be 64 or 128)"
    else:
        if not 1 <= h_i <= 128:
            return f"H_I={h_i} (must be in [1, 128])"
        if d_i % 8 or not 8 <= d_i <= 256:
            return f"D_I={d_i} (must be a multiple of 8 in [8, 256])"
    return None


def _attention_reason(query: torch.Tensor, key: torch.Tensor, v_channels: int) -> Optional[str]:
    """Why FlashDSA cannot run absorbed sparse MLA on query [sq,b,H,D_qk], key [skv,b,1,D_qk]."""
    if query.dim() != 4 or key.dim() != 4:
        return f"attention ranks query {query.dim()}D, key {key.dim()}D (expected 4D SBHD)"
    _, b, h, d_qk = query.shape
    if key.shape[1] != b or key.shape[2] != 1 or key.shape[3] != d_qk:
        return f"not absorbed MQA: query {tuple(query.shape)}, key {tuple(key.shape)}"
    if key.dtype != query.dtype:
        return f"query {query.dtype} and key {key.dtype} differ"
    if v_channels != d_qk - _ROPE_WIDTH:
        return (f"latent value width {v_channels} with D_qk={d_qk}: FlashDSA needs D_v = D_qk - 64 "
                f"(qk_pos_emb_head_dim=64)")
    reason = _device_reason(query, "sparse_mla_fwd")
    if reason:
        return reason
    if query.device.type == "cuda":
        if d_qk != 576:
            return f"D_qk={d_qk} on CUDA (must be 576: kv_lora_rank=512, qk_pos_emb_head_dim=64)"
        if h not in (16, 32, 64, 128):
            return f"{h} heads per rank on CUDA (must be 16, 32, 64 or 128)"
    else:
        if d_qk % 8 or not 8 <= d_qk <= 1024:
            return f"D_qk={d_qk} (must be a multiple of 8 in [8, 1024])"
        if not 1 <= h <= 128:
            return f"{h} heads (must be in [1, 128])"
    return None


# ---------------------------------------------------------------------------------------------
# Layout: Megatron's [s, b, ...] tensors and [b, sq, K] indices <-> FlashDSA's packed rows


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[s, b, ...] -> [b * s, ...] (batch-major rows), contiguous."""
    if x.shape[1] == 1:
        return x.squeeze(1).contiguous()
    return x.transpose(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def _unrows(x: torch.Tensor, s: int, b: int) -> torch.Tensor:
    """[b * s, ...] -> [s, b, ...]."""
    if b == 1:
        return x.unsqueeze(1)
    return x.view(b, s, *x.shape[1:]).transpose(0, 1)


def _flat_ranges(starts: torch.Tensor, ends: torch.Tensor, b: int, skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron's per-row key bounds [sq] (shared by the batch) -> FlashDSA's [b * sq] int32 ranges."""
    starts = starts.to(torch.int64).reshape(-1)
    ends = ends.to(torch.int64).reshape(-1)
    if b > 1:
        offset = (torch.arange(b, device=starts.device, dtype=torch.int64) * skv).unsqueeze(1)
        starts = (starts.unsqueeze(0) + offset).reshape(-1)
        ends = (ends.unsqueeze(0) + offset).reshape(-1)
    return starts.to(torch.int32).contiguous(), ends.to(torch.int32).contiguous()


def _indices_to_megatron(indices: torch.Tensor, b: int, sq: int, skv: int) -> torch.Tensor:
    """FlashDSA's [b * sq, K] rows of the flattened keys -> Megatron's [b, sq, K] per-batch key rows."""
    idx = indices.view(b, sq, -1)
    if b > 1:
        offset = (torch.arange(b, device=idx.device, dtype=idx.dtype) * skv).view(b, 1, 1)
        idx = torch.where(idx >= 0, idx - offset, idx)
    return idx


def _indices_from_megatron(topk_indices: torch.Tensor, skv: int,
                           topk_length: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Megatron's [b, sq, K] top-k (-1 = empty; optional valid-prefix lengths) -> [b * sq, K] int32."""
    idx = topk_indices
    if idx.dim() == 2:
        idx = idx.unsqueeze(0)
    b = idx.shape[0]
    valid = (idx >= 0) & (idx < skv)
    if topk_length is not None:
        slots = torch.arange(idx.shape[-1], device=idx.device)
        valid = valid & (slots < topk_length.to(device=idx.device, dtype=torch.int64).unsqueeze(-1))
    idx = idx.to(torch.int64)
    if b > 1:
        idx = idx + (torch.arange(b, device=idx.device, dtype=torch.int64) * skv).view(b, 1, 1)
    idx = torch.where(valid, idx, torch.full_like(idx, -1))
    return idx.reshape(-1, idx.shape[-1]).to(torch.int32).contiguous()


# ---------------------------------------------------------------------------------------------
# The indexer loss with Megatron's semantics (dsa.py compute_dsa_indexer_loss / dsa_indexer_loss.py)


def _row_mask(query_valid_rows: Optional[torch.Tensor], b: int, sq: int, device) -> Optional[torch.Tensor]:
    """Megatron's query_valid_rows ([sq], [1, sq] or [b, sq]) as a [b * sq] bool, or None."""
    if query_valid_rows is None:
        return None
    rows = query_valid_rows.to(device=device, dtype=torch.bool)
    if rows.dim() == 1:
        rows = rows.unsqueeze(0)
    return rows.expand(b, sq).reshape(-1)


def _loss_normalizer(rows: Optional[torch.Tensor], num_rows: int, per_token: bool,
                     dtype: torch.dtype, device) -> Optional[torch.Tensor]:
    """Megatron's divisor: none in per-token mode, else the valid-row count (at least 1), else all rows.

    Under context parallelism these are the LOCAL rows (Megatron averages the logged value over the
    CP group instead).
    """
    if per_token:
        return None
    if rows is not None:
        return rows.sum().clamp_min(1).to(dtype)
    return torch.tensor(float(max(num_rows, 1)), dtype=dtype, device=device)


def _tp_group(pg_collection: Any):
    group = getattr(pg_collection, "tp", None) if pg_collection is not None else None
    if group is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    return group if group.size() > 1 else None


def _indexer_loss(*, q_i: torch.Tensor, k_i: torch.Tensor, w_i: torch.Tensor, indices: torch.Tensor,
                  q_main: torch.Tensor, kv_main: torch.Tensor, lse: Optional[torch.Tensor], scale: float,
                  coeff: float, sparse: bool, relu: bool, rows: Optional[torch.Tensor], per_token: bool,
                  k_start: torch.Tensor, k_end: torch.Tensor, tp_group) -> torch.Tensor:
    """Megatron's indexer KL loss on FlashDSA rows, differentiable in q_i, k_i, w_i (target detached)."""
    stat = torch.float64 if q_i.dtype == torch.float64 else torch.float32
    normalizer = _loss_normalizer(rows, q_i.shape[0], per_token, stat, q_i.device)
    reduction = "sum" if per_token else "mean"
    if sparse:
        if lse is None:
            with torch.no_grad():
                _, lse = _ops.sparse_mla(q_main.detach(), kv_main.detach(), indices, scale)
        mass = _ops.attention_mass(q_main, kv_main, indices, lse, scale)
        if tp_group is not None:  # the target sums all heads: heads are sharded over TP ranks
            torch.distributed.all_reduce(mass, group=tp_group)
        loss_indices = indices if rows is None else torch.where(rows.unsqueeze(1), indices,
                                                                torch.full_like(indices, -1))
        return _ops.indexer_kl_loss(q_i, k_i, w_i, formulation="sparse", relu=relu, coeff=coeff,
                                    reduction=reduction, normalizer=normalizer, indices=loss_indices, mass=mass)
    if rows is not None:
        k_end = torch.where(rows, k_end, k_start)
    return _ops.indexer_kl_loss(q_i, k_i, w_i, formulation="dense", relu=relu, coeff=coeff, reduction=reduction,
                                normalizer=normalizer, q=q_main, kv=kv_main, scale=scale, k_start=k_start,
                                k_end=k_end)


# ---------------------------------------------------------------------------------------------
# Options set by the FlashDSA layer spec (flashdsa.megatron.spec) around one DSAttention forward


@dataclasses.dataclass
class _FusedCallOptions:
    """Per-forward requests of :class:`flashdsa.megatron.FlashDSAttention` to the fused hook."""

    topk_holder: Optional[dict] = None      # IndexShare: store this layer's top-k here (Megatron's format)
    layer_number: int = 0
    loss_in_backward: bool = False          # sparse loss from the MLA backward (sparse_mla_with_indexer_loss)
    log_loss: Optional[Callable[[torch.Tensor], None]] = None  # records the loss value once it exists


_CALL_OPTIONS: contextvars.ContextVar[Optional[_FusedCallOptions]] = contextvars.ContextVar(
    "flashdsa_megatron_call_options", default=None)


def _loss_grad_scale() -> torch.Tensor | float:
    """The indexer loss's gradient scale Megatron's DSAIndexerLossAutoScaler would use (read at backward)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossAutoScaler

    scale = DSAIndexerLossAutoScaler.main_loss_backward_scale
    return 1.0 if scale is None else scale


# ---------------------------------------------------------------------------------------------
# The hooks


def run_fused_qk_topk(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, index_topk: int,
                      starts: torch.Tensor, ends: torch.Tensor, block_size: int = 0, use_relu: bool = True,
                      **_ignored: Any) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Megatron hook: lightning indexer + top-k (no loss).

    Args (Megatron's): q [sq, b, H_I, D_I], k [skv, b, D_I] (CP: gathered, global order), weights
        [sq, b, H_I] (scales folded in), index_topk, starts/ends [sq] int32 key bounds in key rows,
        use_relu. Other keyword arguments (block size, CP metadata) are not needed and ignored.
    Returns:
        (topk_indices [b, sq, index_topk] int32, -1 = empty slot; None) or None to decline.
    """
    reason = _indexer_reason(q, k, weights, index_topk)
    if reason is None and (starts is None or ends is None):
        reason = "no row-wise key bounds"
    if reason:
        _decline("run_fused_qk_topk", reason)
        return None
    sq, b = q.shape[:2]
    skv = k.shape[0]
    k_start, k_end = _flat_ranges(starts, ends, b, skv)
    indices, _ = _ops.indexer_topk(_rows(q), _rows(k), _rows(weights), k_start, k_end, index_topk, relu=use_relu,
                                   **_selection_kwargs())
    stats["run_fused_qk_topk"] += 1
    return _indices_to_megatron(indices, b, sq, skv), None


def run_fused_qk_topk_with_loss(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, index_topk: int,
                                starts: torch.Tensor, ends: torch.Tensor, block_size: int = 0, *,
                                query: torch.Tensor, key: torch.Tensor, softmax_scale: float,
                                loss_coeff: float, pg_collection: Any = None,
                                query_valid_rows: Optional[torch.Tensor] = None,
                                calculate_per_token_loss: bool = False, use_relu: bool = True,
                                config: Any = None, **_ignored: Any
                                ) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]]:
    """Megatron hook: indexer + top-k + the SPARSE indexer KL loss (the split path, e.g. IndexShare).

    The loss (a differentiable scalar, Megatron's value and normalization: mean over the local valid
    rows, or the sum in per-token mode, times loss_coeff) has gradients to q, k, weights; its target
    is the head-summed sparse attention of the detached query [sq, b, H, D_qk] and key
    [skv, b, 1, D_qk] over the selected keys.

    Returns:
        (topk_indices [b, sq, index_topk] int32, None, loss) or None to decline.
    """
    hook = "run_fused_qk_topk_with_loss"
    v_channels = int(getattr(config, "kv_lora_rank", 0) or 0) if config is not None else query.shape[-1] - _ROPE_WIDTH
    reason = _indexer_reason(q, k, weights, index_topk) or _attention_reason(query, key, v_channels)
    if reason is None and (starts is None or ends is None):
        reason = "no row-wise key bounds"
    if reason is None and loss_coeff <= 0:
        reason = "loss_coeff <= 0"
    if reason is None:
        reason = _cuda_ops_reason(q.device, _SPARSE_LOSS_OPS)
    if reason is None and (query.shape[0] != q.shape[0] or key.shape[0] != k.shape[0]):
        reason = f"indexer rows {q.shape[0]}/{k.shape[0]} differ from attention rows {query.shape[0]}/{key.shape[0]}"
    if reason:
        _decline(hook, reason)
        return None
    sq, b = q.shape[:2]
    skv = k.shape[0]
    k_start, k_end = _flat_ranges(starts, ends, b, skv)
    q_i, k_i, w_i = _rows(q), _rows(k), _rows(weights)
    indices, _ = _ops.indexer_topk(q_i, k_i, w_i, k_start, k_end, index_topk, relu=use_relu,
                                   **_selection_kwargs())
    loss = _indexer_loss(q_i=q_i, k_i=k_i, w_i=w_i, indices=indices, q_main=_rows(query).detach(),
                         kv_main=_rows(key.squeeze(2)).detach(), lse=None, scale=float(softmax_scale),
                         coeff=float(loss_coeff), sparse=True, relu=use_relu,
                         rows=_row_mask(query_valid_rows, b, sq, q.device), per_token=calculate_per_token_loss,
                         k_start=k_start, k_end=k_end, tp_group=_tp_group(pg_collection))
    stats[hook] += 1
    return _indices_to_megatron(indices, b, sq, skv), None, loss


def run_fused_absorbed_sparse_attention(query: torch.Tensor, key: torch.Tensor, topk_indices: torch.Tensor,
                                        softmax_scale: float, v_channels: int,
                                        topk_length: Optional[torch.Tensor] = None,
                                        *_extra: Any, **_ignored: Any) -> Optional[torch.Tensor]:
    """Megatron hook: absorbed sparse MLA over given top-k indices (Megatron calls it positionally).

    Args: query [sq, b, H, D_qk], key [skv, b, 1, D_qk] (CP: gathered, global order), topk_indices
        [b, sq, K] (-1 = empty; entries >= skv are empty too), softmax_scale, v_channels (latent
        value width = kv_lora_rank), topk_length [b, sq] (optional valid-prefix length per row).
    Returns:
        The latent output [sq, b, H, v_channels] (differentiable in query and key), or None.
    """
    hook = "run_fused_absorbed_sparse_attention"
    reason = _attention_reason(query, key, int(v_channels))
    if reason is None:
        k_width = topk_indices.shape[-1]
        if topk_indices.dim() not in (2, 3):
            reason = f"topk_indices rank {topk_indices.dim()}"
        else:
            reason = _topk_reason(k_width, query.device)
    if reason is None and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        reason = _cuda_ops_reason(query.device, ("sparse_mla_bwd",))
    if reason:
        _decline(hook, reason)
        return None
    sq, b = query.shape[:2]
    skv = key.shape[0]
    indices = _indices_from_megatron(topk_indices, skv, topk_length)
    out, _ = _ops.sparse_mla(_rows(query), _rows(key.squeeze(2)), indices, float(softmax_scale))
    stats[hook] += 1
    return _unrows(out, sq, b)


def run_fused_dsa_attention(*, config: Any, query: torch.Tensor, key: torch.Tensor, value: Optional[torch.Tensor],
                            up_v_weight: Optional[torch.Tensor], q_indexer: torch.Tensor, k_indexer: torch.Tensor,
                            indexer_weights: torch.Tensor, indexer_topk: int, softmax_scale: float,
                            loss_coeff: float, sparse_loss: bool, calculate_per_token_loss: bool,
                            absorbed_mla: bool, cp_size: int = 1, attn_mask_type: Any = None,
                            packed_seq_params: Any = None, varlen_starts: Optional[torch.Tensor] = None,
                            varlen_ends: Optional[torch.Tensor] = None,
                            key_positions: Optional[torch.Tensor] = None,
                            query_valid_rows: Optional[torch.Tensor] = None, use_relu: bool = True,
                            pg_collection: Any = None, **_ignored: Any
                            ) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Megatron hook: the whole DSA core attention (indexer, top-k, sparse MLA, indexer loss) fused.

    Megatron calls it when IndexShare is off (:class:`flashdsa.megatron.FlashDSAttention` also calls
    it with IndexShare on). Both loss formulations run: sparse (the target over the selected keys,
    from the MLA's own log-sum-exp) and dense (FlashDSA's fused dense KL, O(T) memory).

    Returns:
        (output [sq, b, H * v_head_dim] after the latent-to-value projection ``up_v_weight``
        [H, v_head_dim, kv_lora_rank], indexer loss scalar or None when loss_coeff is 0), or None.
    """
    hook = "run_fused_dsa_attention"
    latent = int(getattr(config, "kv_lora_rank", 0) or 0)
    reason = None
    if not absorbed_mla or value is not None or up_v_weight is None:
        reason = "not the absorbed-MLA layout (value given or no up_v_weight)"
    elif key_positions is not None:
        reason = "explicit non-identity key positions"
    elif varlen_starts is None or varlen_ends is None:
        reason = "additive attention mask instead of row-wise key bounds"
    else:
        reason = _attention_reason(query, key, latent) or _indexer_reason(q_indexer, k_indexer, indexer_weights,
                                                                           indexer_topk)
    if reason is None and torch.is_grad_enabled():
        needed = ("sparse_mla_bwd",) if (query.requires_grad or key.requires_grad) else ()
        if loss_coeff > 0:
            needed += _SPARSE_LOSS_OPS if sparse_loss else _DENSE_LOSS_OPS
        reason = _cuda_ops_reason(query.device, needed)
    if reason is None and (q_indexer.shape[0] != query.shape[0] or k_indexer.shape[0] != key.shape[0]):
        reason = (f"indexer rows {q_indexer.shape[0]}/{k_indexer.shape[0]} differ from attention rows "
                  f"{query.shape[0]}/{key.shape[0]}")
    tp_group = _tp_group(pg_collection)
    if reason is None and loss_coeff > 0 and not sparse_loss and tp_group is not None:
        reason = "dense indexer loss with tensor parallelism (the fused dense KL needs all heads)"
    if reason:
        _decline(hook, reason)
        return None

    options = _CALL_OPTIONS.get()
    sq, b, heads, _ = query.shape
    skv = key.shape[0]
    k_start, k_end = _flat_ranges(varlen_starts, varlen_ends, b, skv)
    q_i, k_i, w_i = _rows(q_indexer), _rows(k_indexer), _rows(indexer_weights)
    indices, _ = _ops.indexer_topk(q_i, k_i, w_i, k_start, k_end, indexer_topk, relu=use_relu,
                                   **_selection_kwargs())
    if options is not None and options.topk_holder is not None:
        options.topk_holder[options.layer_number] = _indices_to_megatron(indices, b, sq, skv)

    q_main, kv_main = _rows(query), _rows(key.squeeze(2))
    scale = float(softmax_scale)
    rows = _row_mask(query_valid_rows, b, sq, query.device)
    loss: Optional[torch.Tensor] = None
    want_loss = loss_coeff > 0 and torch.is_grad_enabled()
    if (want_loss and sparse_loss and options is not None and options.loss_in_backward and rows is None
            and tp_group is None and _cuda_ops_reason(query.device, ("sparse_mla_bwd_mass",)) is None):
        stat = torch.float64 if query.dtype == torch.float64 else torch.float32
        loss_out = torch.zeros((), dtype=stat, device=query.device)
        normalizer = _loss_normalizer(None, q_main.shape[0], calculate_per_token_loss, stat, query.device)
        if normalizer is None:  # per-token mode: the sum, i.e. a divisor of 1
            normalizer = torch.ones((), dtype=stat, device=query.device)
        out, _ = _ops.sparse_mla_with_indexer_loss(
            q_main, kv_main, indices, scale, q_i, k_i, w_i, loss_out, relu=use_relu, coeff=float(loss_coeff),
            normalizer=normalizer, loss_grad_scale=_loss_grad_scale, loss_reduce=options.log_loss)
        # Megatron logs the returned value at forward time: return 0 there; options.log_loss records
        # the real value in the backward (before Megatron reduces its tracker at the logging step).
        loss = torch.zeros((), dtype=stat, device=query.device)
        stats["loss_in_backward"] += 1
    else:
        out, lse = _ops.sparse_mla(q_main, kv_main, indices, scale)
        if want_loss:
            loss = _indexer_loss(q_i=q_i, k_i=k_i, w_i=w_i, indices=indices, q_main=q_main.detach(),
                                 kv_main=kv_main.detach(), lse=lse.detach(), scale=scale, coeff=float(loss_coeff),
                                 sparse=sparse_loss, relu=use_relu, rows=rows, per_token=calculate_per_token_loss,
                                 k_start=k_start, k_end=k_end, tp_group=tp_group)
    output = _unrows(out, sq, b)  # [sq, b, H, latent]
    output = torch.einsum("sbhc,hdc->sbhd", output, up_v_weight).contiguous()
    stats[hook] += 1
    return output.view(sq, b, -1), loss
