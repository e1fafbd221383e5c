"""The attention core of an absorbed-MLA DSA layer (docs/spec.md §2–§8) on packed THD batches.

One call does: key ranges from ``cu_seqlens`` (or from global positions under context
parallelism) → indexer top-k (unless indices are given, e.g. by IndexShare) → sparse MLA →
optional indexer KL loss, attached to the attention output like Megatron's
``DSAIndexerLossAutoScaler``: the forward returns the output unchanged, and the backward of the
model loss also back-propagates the KL loss (scaled by :func:`set_indexer_loss_scale`) into
``q_idx``, ``k_idx`` and ``weights``. The KL target is detached, so ``q`` and ``kv`` get no
gradient from the loss.

Training with the sparse loss (the default when gradients reach the indexer): the loss is computed
in the backward, from the attention mass that the sparse MLA backward emits
(:func:`flashdsa.ops.sparse_mla_with_indexer_loss`), so the forward runs no attention-mass
recompute and no KL forward. Its value is then only known after ``backward()``: the returned
``indexer_loss`` tensor holds NaN until the backward fills it in (see :func:`dsa_attention`,
``indexer_loss_in_backward``).

Shapes (absorbed MLA): ``q [T, H, D_qk]``, ``kv [T_kv, D_qk]`` (``V = kv[:, :D_v]``),
``q_idx [T, H_I, D_I]``, ``k_idx [T_kv, D_I]``, ``weights [T, H_I]`` fp32, ``indices [T, K]``
int32. Activations bf16 on CUDA; bf16/fp32/fp64 on CPU.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import ops as _ops  # looked up at call time, so tests can count calls by patching it
from .context_parallel import ZigzagLayout, all_reduce_sum, check_cp_agreement
from .index_share import FULL, SHARED, IndexShareContext
from .thd import as_cu_seqlens, causal_key_ranges, check_cu_seqlens

__all__ = [
    "DSAAttentionOutput",
    "DSAIndexerLossAutoScaler",
    "set_indexer_loss_scale",
    "dsa_attention",
    "DSAAttention",
]

_FORMULATIONS = ("sparse", "dense")


def _check_fp8_candidates(selection: str, fp8_candidates: Optional[int], topk: int) -> None:
    """Checks the selection pass and the FP8 candidate count (None, or an int in [topk, 16384] with fp8)."""
    _ops.check_selection(selection)
    if fp8_candidates is None:
        return
    if selection != "fp8":
        raise ValueError(f"fp8_candidates is only read with selection='fp8' (selection={selection!r})")
    if isinstance(fp8_candidates, bool) or not isinstance(fp8_candidates, int):
        raise ValueError(f"fp8_candidates must be an int or None, got {fp8_candidates!r}")
    if not topk <= fp8_candidates <= 16384:
        raise ValueError(f"fp8_candidates must be in [topk={topk}, 16384], got {fp8_candidates}")


class DSAAttentionOutput(NamedTuple):
    """Result of :func:`dsa_attention` / :class:`DSAAttention`.

    Attributes:
        out: ``[T, H, D_v]``, q's dtype. Carries the KL loss's gradient hook when a loss was
            computed with grad enabled.
        indices: int32 ``[T, K]``: the top-k rows of the (under CP: gathered, global padded) keys
            used by the attention; ``-1`` = empty slot.
        indexer_loss: detached fp32/fp64 scalar (the global loss under CP), or None when no loss
            was computed. For logging only; its gradient flows through ``out``. When the loss is
            computed in the backward (``indexer_loss_in_backward``, the default for training with
            the sparse loss) this tensor holds **NaN until** ``backward()`` **has run** through
            ``out``; the backward then writes the loss into it in place. Read it after the backward
            (e.g. when logging the step); it stays NaN if ``out`` never gets a gradient.
    """

    out: torch.Tensor
    indices: torch.Tensor
    indexer_loss: Optional[torch.Tensor]


class DSAIndexerLossAutoScaler(torch.autograd.Function):
    """Attaches an auxiliary loss to an activation (Megatron's loss auto-scaler pattern).

    ``forward(output, loss)`` returns ``output`` unchanged; ``backward`` passes the output's
    gradient through and gives ``loss`` the gradient ``main_loss_backward_scale`` (default 1.0), as
    if ``main_loss_backward_scale * loss`` had been added to the model loss. Set the scale with
    :func:`set_indexer_loss_scale` (e.g. to ``1 / num_microbatches`` or the AMP loss scale); it is
    read at backward time. Double backward raises (the backward is first-order only).
    """

    main_loss_backward_scale: Union[float, torch.Tensor] = 1.0

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(loss)
        return output

    @staticmethod
    @_ops._first_order_only("DSAIndexerLossAutoScaler")
    def backward(ctx, grad_output: torch.Tensor):
        # First order only: differentiated again, any path through the output would inject the
        # loss's gradient a second time (a silently wrong second-order gradient).
        (loss,) = ctx.saved_tensors
        scale = DSAIndexerLossAutoScaler.main_loss_backward_scale
        return grad_output, torch.ones_like(loss) * scale


def set_indexer_loss_scale(scale: Union[float, torch.Tensor]) -> None:
    """Sets the factor applied to the indexer KL loss's gradient in backward (default 1.0)."""
    DSAIndexerLossAutoScaler.main_loss_backward_scale = scale


class _Geometry(NamedTuple):
    """What the kernels need about the packing: ranges of the local queries and the key tensors."""

    k_start: torch.Tensor  # int32 [T]
    k_end: torch.Tensor  # int32 [T]
    layout: Optional[ZigzagLayout]  # None without CP


def _check_rows(name: str, t: Optional[torch.Tensor], expected: int, meaning: str) -> None:
    if t is not None and t.shape[0] != expected:
        raise ValueError(f"{name} has {t.shape[0]} rows but {meaning} is {expected}")


def _thd_geometry(q, kv, q_idx, k_idx, weights, cu_seqlens) -> _Geometry:
    """Key ranges without CP, after checking that cu_seqlens fits the tensors."""
    host = check_cu_seqlens(cu_seqlens, q.shape[0], num_keys=kv.shape[0])
    _check_rows("q_idx", q_idx, q.shape[0], "the number of query tokens (q rows)")
    _check_rows("weights", weights, q.shape[0], "the number of query tokens (q rows)")
    _check_rows("k_idx", k_idx, kv.shape[0], "the number of key rows (kv rows)")
    k_start, k_end = causal_key_ranges(host, device=q.device)
    return _Geometry(k_start, k_end, None)


def _cp_geometry(q, kv, q_idx, k_idx, weights, indices, cu_seqlens, group) -> _Geometry:
    """Zigzag layout and key ranges of this rank's queries, after the group agreed on sizes."""
    check_cp_agreement(
        group,
        cu_seqlens,
        {"q": q.shape, "kv": kv.shape, "q_idx": _shape(q_idx), "k_idx": _shape(k_idx),
         "weights": _shape(weights), "indices": _shape(indices)},
        q.device,
    )
    layout = ZigzagLayout.for_group(cu_seqlens, group, q.device)
    local = layout.num_local_tokens
    meaning = (
        f"the zigzag share of one rank ({layout.num_padded_tokens} padded tokens of the global "
        f"cu_seqlens / cp={layout.cp_size})"
    )
    for name, t in (("q", q), ("kv", kv), ("q_idx", q_idx), ("k_idx", k_idx), ("weights", weights)):
        _check_rows(name, t, local, meaning)
    k_start, k_end = layout.key_ranges()
    return _Geometry(k_start, k_end, layout)


def _shape(t: Optional[torch.Tensor]) -> Optional[torch.Size]:
    return None if t is None else t.shape


def _loss_in_backward(requested: Optional[bool], loss_coeff, formulation, q_idx, k_idx, weights) -> bool:
    """Whether the indexer loss is computed in the backward (see ``indexer_loss_in_backward``)."""
    if requested is False:
        return False
    why_not = None
    if loss_coeff is None:
        why_not = "there is no indexer loss (loss_coeff is None)"
    elif formulation != "sparse":
        why_not = f'it needs loss_formulation="sparse" (got {formulation!r})'
    elif not torch.is_grad_enabled():
        why_not = "gradients are disabled (torch.no_grad / inference mode): there is no backward"
    elif not any(t is not None and t.requires_grad for t in (q_idx, k_idx, weights)):
        why_not = "none of q_idx, k_idx, weights requires grad"
    if why_not is None:
        return True
    if requested:
        raise ValueError(f"indexer_loss_in_backward=True, but the loss cannot be computed in the backward: {why_not}")
    return False


def dsa_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_idx: Optional[torch.Tensor],
    k_idx: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    cu_seqlens: Union[torch.Tensor, Sequence[int]],
    topk: int,
    scale: float,
    *,
    relu: bool = True,
    loss_coeff: Optional[float] = None,
    loss_formulation: str = "sparse",
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    cp_group: Optional[dist.ProcessGroup] = None,
    indexer_loss_in_backward: Optional[bool] = None,
    selection: str = "bf16",
    fp8_candidates: Optional[int] = None,
    fp8_band: Optional[int] = None,
    fp8_band_scaled: bool = False,
) -> DSAAttentionOutput:
    """DSA attention core on a packed (THD) batch, optionally context-parallel.

    Args:
        q: ``[T, H, D_qk]`` queries (absorbed MLA), bf16 (fp32/fp64 on CPU).
        kv: ``[T_kv, D_qk]`` latent keys; ``kv[:, :D_v]`` are the values. Same dtype as q.
        q_idx: ``[T, H_I, D_I]`` indexer queries, or None when ``indices`` is given and no loss.
        k_idx: ``[T_kv, D_I]`` indexer keys, or None likewise.
        weights: ``[T, H_I]`` fp32 (fp64 with fp64 activations) indexer head weights (scale
            factors folded in), or None likewise.
        cu_seqlens: integer tensor ``[B+1]`` (any device) or sequence of ints, the packed batch
            (the one contract of :mod:`flashdsa.thd`; floats are refused). Without CP: ``cu_seqlens[-1] == T`` and
            ``<= T_kv``. With ``cp_group``: the *global, unpadded* batch, the same on every rank;
            the local tensors hold this rank's zigzag share (see
            :class:`flashdsa.context_parallel.ZigzagLayout`; ``T = T_kv = T_pad / cp``).
        topk: ``K``, number of keys kept per query.
        scale: softmax scale of the main attention (e.g. ``D_qk ** -0.5``).
        relu: indexer activation ``f`` (ReLU if True, identity otherwise).
        loss_coeff: if not None, the indexer KL loss is computed with this coefficient and attached
            to ``out`` (see :class:`DSAIndexerLossAutoScaler`); needs q_idx, k_idx, weights.
        loss_formulation: ``"sparse"`` (support = the top-k; GLM-5) or ``"dense"`` (support = all
            visible keys; indexer warm-up).
        indices: optional int32 ``[T, K]`` indices to reuse (IndexShare); skips the indexer.
            Under CP they are global padded rows, as returned by a previous call.
        deterministic: bitwise-reproducible ``dkv`` in the sparse MLA backward.
        cp_group: process group for context parallelism (None = no CP).
        indexer_loss_in_backward: where the sparse indexer loss is computed. True: in the
            backward, from the attention mass that the sparse MLA backward emits (no mass
            recompute, no KL forward in the forward; same value and gradients); the returned
            ``indexer_loss`` is then **NaN until** ``backward()`` has run through ``out`` and
            written the loss into it (under CP the backward also all-reduces it, on every rank).
            False: in the forward, as ``attention_mass`` + ``indexer_kl_loss`` attached to
            ``out`` (the value is available at once). None (default): True when it applies —
            ``loss_coeff`` set, ``loss_formulation="sparse"``, grad mode enabled and one of
            q_idx, k_idx, weights requiring grad — else False (so ``torch.no_grad()`` evaluation
            still reports the loss from the forward).
        selection: the indexer's selection pass, ``"bf16"`` (exact, default) or ``"fp8"`` (e4m3
            scores, then the exact re-score of ``flashdsa.fp8_selection_candidates(topk)`` candidates; see
            :func:`flashdsa.indexer_topk`). The KL loss always uses the unquantized inputs.
        fp8_candidates: with ``selection="fp8"``, the candidates re-scored per row (in [topk, 16384];
            None = ``flashdsa.fp8_selection_candidates(topk)``). Fewer is faster and recalls less of
            the exact top-k (measured trade-off: docs/kernels/indexer_topk.md). Must be None with bf16.
        fp8_band: with ``selection="fp8"``, the band re-score (docs/spec.md §3; see
            :func:`flashdsa.indexer_topk`): only the candidates below the ``topk - fp8_band`` best by the FP8
            score are re-scored exactly (an int in [1, topk - 1]; None = every candidate). The layer uses the
            indices only, so nothing else changes. Must be None with bf16.
        fp8_band_scaled: with ``fp8_band``, the band scaled to each row's number of visible keys (see
            :func:`flashdsa.indexer_topk`). Must be False without ``fp8_band``.

    Returns:
        :class:`DSAAttentionOutput` ``(out [T, H, D_v], indices [T, K] int32, indexer_loss)``.
        The loss is ``coeff · mean`` over rows with a non-empty support (globally under CP); NaN
        until the backward when it is computed there (``indexer_loss_in_backward``).

    Raises:
        ValueError: tensors on more than one device, inconsistent or non-integer ``cu_seqlens``,
            a sequence longer than the key tensor, row
            mismatches, ranks of a CP group that disagree, missing indexer inputs, or
            ``indexer_loss_in_backward=True`` where it does not apply (no loss, the dense
            formulation, gradients disabled, or no indexer input requiring grad).
    """
    if loss_formulation not in _FORMULATIONS:
        raise ValueError(f"loss_formulation must be 'sparse' or 'dense', got {loss_formulation!r}")
    _check_fp8_candidates(selection, fp8_candidates, topk)
    _ops.check_fp8_band(selection, fp8_band, topk)
    _ops.check_fp8_band_scaled(fp8_band, fp8_band_scaled)
    needs_indexer_inputs = indices is None or loss_coeff is not None
    if needs_indexer_inputs and (q_idx is None or k_idx is None or weights is None):
        why = "indices is None (the indexer must run)" if indices is None else "loss_coeff is set"
        raise ValueError(f"q_idx, k_idx and weights are required when {why}")
    if q.dim() != 3 or kv.dim() != 2:
        raise ValueError(f"q must be [T, H, D_qk] and kv [T_kv, D_qk], got {tuple(q.shape)} and {tuple(kv.shape)}")
    # cu_seqlens is read on the host and may live anywhere; every other input shares q's device.
    _ops._check_same_device("dsa_attention", q=q, kv=kv, q_idx=q_idx, k_idx=k_idx, weights=weights,
                            indices=indices)
    cu_seqlens = as_cu_seqlens(cu_seqlens)
    loss_in_backward = _loss_in_backward(indexer_loss_in_backward, loss_coeff, loss_formulation, q_idx, k_idx, weights)

    if cp_group is None:
        geo = _thd_geometry(q, kv, q_idx, k_idx, weights, cu_seqlens)
        kv_all, k_idx_all = kv, k_idx
    else:
        geo = _cp_geometry(q, kv, q_idx, k_idx, weights, indices, cu_seqlens, cp_group)
        kv_all = geo.layout.gather(kv)
        k_idx_all = geo.layout.gather(k_idx) if needs_indexer_inputs else None

    if indices is None:
        with torch.no_grad():
            indices, _ = _ops.indexer_topk(q_idx, k_idx_all, weights, geo.k_start, geo.k_end, topk, relu,
                                           selection=selection, fp8_candidates=fp8_candidates, fp8_band=fp8_band,
                                           fp8_band_scaled=fp8_band_scaled)
    elif indices.dim() != 2 or indices.shape[0] != q.shape[0] or indices.dtype != torch.int32:
        raise ValueError(
            f"indices must be int32 [T={q.shape[0]}, K], got {indices.dtype} {tuple(indices.shape)}"
        )

    if loss_in_backward:
        out, loss_value = _sparse_mla_with_loss_in_backward(
            q, kv_all, q_idx, k_idx_all, weights, indices, scale, relu, loss_coeff, deterministic, cp_group)
        return DSAAttentionOutput(out, indices, loss_value)

    out, lse = _ops.sparse_mla(q, kv_all, indices, scale, deterministic=deterministic)

    loss_value = None
    if loss_coeff is not None:
        loss = _indexer_loss(
            q, kv_all, q_idx, k_idx_all, weights, indices, lse, geo, scale, relu, loss_coeff,
            loss_formulation, cp_group,
        )
        if torch.is_grad_enabled() and loss.requires_grad:
            out = DSAIndexerLossAutoScaler.apply(out, loss)
        loss_value = loss.detach()
        if cp_group is not None:
            loss_value = all_reduce_sum(loss_value, cp_group)
    return DSAAttentionOutput(out, indices, loss_value)


def _loss_backward_scale():
    """The auto-scaler's factor, read when the backward runs (as DSAIndexerLossAutoScaler does)."""
    return DSAIndexerLossAutoScaler.main_loss_backward_scale


def _sparse_mla_with_loss_in_backward(q, kv_all, q_idx, k_idx_all, weights, indices, scale, relu, coeff,
                                      deterministic, cp_group):
    """Sparse MLA whose backward computes the sparse KL loss; returns (out, loss tensor, NaN until then).

    Under CP the mean divides by the global number of valid rows (all-reduced here, in the forward,
    as in the forward path) and the backward all-reduces the loss value before writing it, so every
    rank reports the global loss (all ranks run the backward: its reduce-scatters need them anyway).
    """
    normalizer = _cp_normalizer(indices, kv_all.shape[0], None, "sparse", cp_group)
    loss_reduce = None if cp_group is None else (lambda value: all_reduce_sum(value, cp_group))
    loss_value = torch.full((), float("nan"), dtype=_ops._stat_dtype(q.dtype), device=q.device)
    out, _ = _ops.sparse_mla_with_indexer_loss(
        q, kv_all, indices, scale, q_idx, k_idx_all, weights, loss_value, relu=relu, coeff=coeff,
        normalizer=normalizer, deterministic=deterministic, loss_grad_scale=_loss_backward_scale,
        loss_reduce=loss_reduce,
    )
    return out, loss_value


def _cp_normalizer(indices, num_keys, geo, formulation, cp_group) -> Optional[torch.Tensor]:
    """Under CP: the global number of rows with a non-empty support (at least 1), the divisor of the
    loss's mean on every rank; None without CP (each op then counts its own rows).

    A tensor, not a Python number: no host synchronization on CUDA.
    """
    if cp_group is None:
        return None
    if formulation == "sparse":
        local = _ops._valid_row_count(indices, num_keys)
    else:
        local = (geo.k_end > geo.k_start).sum()
    return all_reduce_sum(local, cp_group).clamp_min(1)


def _indexer_loss(q, kv_all, q_idx, k_idx_all, weights, indices, lse, geo, scale, relu, coeff, formulation, cp_group):
    """This rank's share of the indexer KL loss (differentiable in q_idx, k_idx_all, weights).

    The target is built from detached main-attention inputs. Under CP the mean divides by the
    global number of valid rows, so the shares of all ranks sum to the cp=1 loss.
    """
    normalizer = _cp_normalizer(indices, kv_all.shape[0], geo, formulation, cp_group)
    if formulation == "sparse":
        mass = _ops.attention_mass(q.detach(), kv_all.detach(), indices, lse, scale)
        return _ops.indexer_kl_loss(
            q_idx, k_idx_all, weights, formulation="sparse", relu=relu, coeff=coeff,
            normalizer=normalizer, indices=indices, mass=mass,
        )
    return _ops.indexer_kl_loss(
        q_idx, k_idx_all, weights, formulation="dense", relu=relu, coeff=coeff,
        normalizer=normalizer, q=q.detach(), kv=kv_all.detach(), scale=scale,
        k_start=geo.k_start, k_end=geo.k_end,
    )


class DSAAttention(torch.nn.Module):
    """Module wrapper of :func:`dsa_attention` with an IndexShare mode (no parameters).

    Projections (q, kv, the indexer's q_idx, k_idx, weights) belong to the surrounding model; this
    module is the attention core. A ``"full"`` layer runs the indexer (and the KL loss when
    ``loss_coeff`` is set) and publishes its indices to the :class:`IndexShareContext`; a
    ``"shared"`` layer takes them from the context and does no indexer work.

    Args:
        topk: ``K``.
        scale: softmax scale of the main attention.
        index_share: ``"full"`` or ``"shared"``.
        relu, loss_coeff, loss_formulation, deterministic, cp_group, indexer_loss_in_backward,
            selection, fp8_candidates, fp8_band, fp8_band_scaled: as in :func:`dsa_attention` (``loss_coeff``
            must be None for a shared layer; ``selection`` is ``"bf16"`` or ``"fp8"``, the indexer's selection
            pass).
        layer_id: name used in error messages (e.g. the layer number).

    Attributes:
        last_indexer_loss: detached scalar loss of the latest forward (None if none), for logging.
            When the loss is computed in the backward (the default in training with the sparse
            loss, see ``indexer_loss_in_backward``) it is **NaN until** ``backward()`` has run;
            read it after the backward of the step.
    """

    def __init__(
        self,
        topk: int,
        scale: float,
        *,
        index_share: str = FULL,
        relu: bool = True,
        loss_coeff: Optional[float] = None,
        loss_formulation: str = "sparse",
        deterministic: bool = False,
        cp_group: Optional[dist.ProcessGroup] = None,
        layer_id: Optional[object] = None,
        indexer_loss_in_backward: Optional[bool] = None,
        selection: str = "bf16",
        fp8_candidates: Optional[int] = None,
        fp8_band: Optional[int] = None,
        fp8_band_scaled: bool = False,
    ) -> None:
        super().__init__()
        _check_fp8_candidates(selection, fp8_candidates, topk)
        _ops.check_fp8_band(selection, fp8_band, topk)
        _ops.check_fp8_band_scaled(fp8_band, fp8_band_scaled)
        if index_share not in (FULL, SHARED):
            raise ValueError(f"index_share must be 'full' or 'shared', got {index_share!r}")
        if index_share == SHARED and loss_coeff is not None:
            raise ValueError("a 'shared' layer has no indexer, so it cannot have an indexer loss (loss_coeff)")
        if loss_formulation not in _FORMULATIONS:
            raise ValueError(f"loss_formulation must be 'sparse' or 'dense', got {loss_formulation!r}")
        if indexer_loss_in_backward and (loss_coeff is None or loss_formulation != "sparse"):
            raise ValueError("indexer_loss_in_backward=True needs a sparse indexer loss (loss_coeff set and "
                             'loss_formulation="sparse")')
        self.topk = topk
        self.scale = scale
        self.index_share = index_share
        self.relu = relu
        self.loss_coeff = loss_coeff
        self.loss_formulation = loss_formulation
        self.deterministic = deterministic
        self.cp_group = cp_group
        self.layer_id = layer_id
        self.indexer_loss_in_backward = indexer_loss_in_backward
        self.selection = selection
        self.fp8_candidates = fp8_candidates
        self.fp8_band = fp8_band
        self.fp8_band_scaled = fp8_band_scaled
        self.last_indexer_loss: Optional[torch.Tensor] = None

    def forward(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        cu_seqlens: Union[torch.Tensor, Sequence[int]],
        q_idx: Optional[torch.Tensor] = None,
        k_idx: Optional[torch.Tensor] = None,
        weights: Optional[torch.Tensor] = None,
        *,
        index_share_ctx: Optional[IndexShareContext] = None,
    ) -> DSAAttentionOutput:
        """Runs the layer. Shapes as in :func:`dsa_attention`.

        A full layer needs ``q_idx, k_idx, weights`` and publishes to ``index_share_ctx`` when
        given; a shared layer takes none of them and requires ``index_share_ctx``.
        """
        indices = None
        if self.index_share == SHARED:
            if q_idx is not None or k_idx is not None or weights is not None:
                raise ValueError(f"{self._name()} is 'shared': it takes no q_idx/k_idx/weights")
            if index_share_ctx is None:
                raise ValueError(f"{self._name()} is 'shared' and needs the IndexShareContext of this forward pass")
            indices = index_share_ctx.fetch(q.shape[0], layer=self.layer_id)
        result = dsa_attention(
            q, kv, q_idx, k_idx, weights, cu_seqlens, self.topk, self.scale,
            relu=self.relu, loss_coeff=self.loss_coeff, loss_formulation=self.loss_formulation,
            indices=indices, deterministic=self.deterministic, cp_group=self.cp_group,
            indexer_loss_in_backward=self.indexer_loss_in_backward, selection=self.selection,
            fp8_candidates=self.fp8_candidates, fp8_band=self.fp8_band, fp8_band_scaled=self.fp8_band_scaled,
        )
        if self.index_share == FULL and index_share_ctx is not None:
            index_share_ctx.publish(result.indices, layer=self.layer_id)
        self.last_indexer_loss = result.indexer_loss
        return result

    def _name(self) -> str:
        return "layer" if self.layer_id is None else f"layer {self.layer_id}"

    def extra_repr(self) -> str:
        return (
            f"topk={self.topk}, scale={self.scale:g}, index_share={self.index_share!r}, relu={self.relu}, "
            f"loss_coeff={self.loss_coeff}, loss_formulation={self.loss_formulation!r}, selection={self.selection!r}, "
            + (f"fp8_candidates={self.fp8_candidates}, " if self.fp8_candidates is not None else "")
            + (f"fp8_band={self.fp8_band}, " if self.fp8_band is not None else "")
            + ("fp8_band_scaled=True, " if self.fp8_band_scaled else "") +
            f"cp={'off' if self.cp_group is None else dist.get_world_size(self.cp_group)}"
        )
