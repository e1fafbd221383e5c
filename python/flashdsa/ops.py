"""FlashDSA ops for PyTorch: fake kernels, autograd and the public functions (docs/python-api.md).

The kernels are C++ ops registered as ``torch.ops.flashdsa.<name>`` (csrc/torch/ops.cpp), with CPU
kernels and, in CUDA builds (:func:`built_with_cuda`), CUDA kernels for compute capability 9.0
GPUs (on any other GPU the ops raise ``NotImplementedError`` naming the device). This module
registers their fake (meta) kernels, so the ops trace under ``torch.compile`` (fullgraph), and wraps
them in differentiable functions.

Notation: T query tokens, T_kv key tokens (packed THD), H attention heads, D_qk = 576 latent key
width, D_v = D_qk - 64 = 512 value width, K top-k slots, H_I indexer heads, D_I indexer head dim.
"act" is the activation dtype (bfloat16 on both devices; float32/float64 on the CPU only) and
"stat" is float64 for float64 activations, else float32. Index and range tensors are int32; an
index outside [0, T_kv) (e.g. -1) is an empty slot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from . import _C  # noqa: F401  (loading the library registers torch.ops.flashdsa.*)
from .thd import check_cu_seqlens

__all__ = [
    "attention_mass",
    "build_key_ranges",
    "built_with_cuda",
    "indexer_kl_loss",
    "indexer_kl_loss_rows",
    "indexer_topk",
    "fp8_selection_candidates",
    "quantize_indexer_fp8",
    "set_range_checks",
    "sparse_mla",
    "sparse_mla_with_indexer_loss",
]

_ops = torch.ops.flashdsa

# Raw op names (torch.ops.flashdsa.<name>).
OP_NAMES = (
    "indexer_topk",
    "indexer_topk_fp8",
    "quantize_fp8",
    "sparse_mla_fwd",
    "sparse_mla_bwd",
    "sparse_mla_bwd_mass",
    "attention_mass",
    "sparse_kl_fwd",
    "sparse_kl_bwd",
    "dense_kl_fwd",
    "dense_kl_bwd",
)

# D_v = D_qk - _ROPE_WIDTH: the value is the first columns of the latent key (as in csrc/torch/ops.cpp).
_ROPE_WIDTH = 64


def _stat_dtype(activation: torch.dtype) -> torch.dtype:
    return torch.float64 if activation == torch.float64 else torch.float32


def _check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    """Raises ValueError unless every given tensor (None entries are skipped) is on one device.

    Runs before any kernel or fake kernel: with mixed devices (e.g. q on the CPU, kv on meta) the
    dispatcher could otherwise pick the fake kernel and return uninitialised memory.
    """
    present = [(name, t) for name, t in tensors.items() if t is not None]
    if len({t.device for _, t in present}) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in present)
        raise ValueError(f"flashdsa.{op}: all tensors must be on one device, got {where}")


def _first_order_only(op: str):
    """Decorator of an autograd Function's ``backward``: the gradients it returns cannot be
    differentiated again, and trying raises a RuntimeError that names ``op``.

    The backward runs without autograd recording. With ``create_graph=True`` its outputs are
    aliases whose grad_fn raises the error when (and only when) a second backward reaches it, so
    first-order use under ``create_graph=True`` (e.g. a gradient penalty elsewhere in the model)
    keeps working; without this, second-order gradients through the op would silently be zero.
    """
    message = (f"flashdsa.{op} does not support double backward: its backward is not differentiable "
               f"(gradients computed with create_graph=True cannot be differentiated through {op} "
               f"again)").encode()

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # create_graph=False: nothing can differentiate them
                return outputs
            single = not isinstance(outputs, tuple)
            outputs = (outputs,) if single else outputs
            positions = [i for i, g in enumerate(outputs) if isinstance(g, torch.Tensor)]
            if not positions:
                return outputs[0] if single else outputs
            aliases = []
            for i in positions:
                alias = outputs[i].detach()
                alias.requires_grad_(True)
                aliases.append(alias)
            guarded = torch._C._functions.DelayedError(message, len(aliases))(*aliases)
            guarded = (guarded,) if isinstance(guarded, torch.Tensor) else guarded
            result = list(outputs)
            for i, g in zip(positions, guarded):
                result[i] = g
            return result[0] if single else tuple(result)

        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------
# Build and process settings


def built_with_cuda() -> bool:
    """Whether the extension was compiled with CUDA kernels (the sm90 backend: every op runs on CUDA
    tensors of a compute capability 9.0 GPU)."""
    return _ops._built_with_cuda()


def set_range_checks(enabled: bool) -> bool:
    """Turns the host check of k_start/k_end on CUDA tensors on or off; returns the previous setting.

    The check copies the ranges to the host (a stream synchronization). It is on by default; callers
    that build the ranges themselves (e.g. with :func:`build_key_ranges`) may turn it off. The
    setting is process-wide; change it outside compiled regions. CPU calls always check.
    """
    return _ops._set_range_checks(bool(enabled))


# ---------------------------------------------------------------------------------------------
# Fake kernels: output shapes and dtypes exactly as the real kernels allocate them (contiguous).


@torch.library.register_fake("flashdsa::indexer_topk")
def _indexer_topk_fake(q_idx, k_idx, weights, k_start, k_end, topk, relu):
    _check_same_device("indexer_topk", q_idx=q_idx, k_idx=k_idx, weights=weights, k_start=k_start, k_end=k_end)
    T = q_idx.shape[0]
    return (q_idx.new_empty((T, topk), dtype=torch.int32),
            q_idx.new_empty((T, topk), dtype=_stat_dtype(q_idx.dtype)))


@torch.library.register_fake("flashdsa::indexer_topk_fp8")
def _indexer_topk_fp8_fake(q8, k8, q_scale, k_scale, q_idx, k_idx, weights, k_start, k_end, topk, relu, candidates,
                           band=0, band_scaled=False):
    _check_same_device("indexer_topk_fp8", q8=q8, k8=k8, q_scale=q_scale, k_scale=k_scale, q_idx=q_idx, k_idx=k_idx,
                       weights=weights, k_start=k_start, k_end=k_end)
    T = q_idx.shape[0]
    return (q_idx.new_empty((T, topk), dtype=torch.int32),
            q_idx.new_empty((T, 0 if band > 0 else topk), dtype=_stat_dtype(q_idx.dtype)))


@torch.library.register_fake("flashdsa::quantize_fp8")
def _quantize_fp8_fake(x):
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("flashdsa::sparse_mla_fwd")
def _sparse_mla_fwd_fake(q, kv, indices, scale):
    _check_same_device("sparse_mla_fwd", q=q, kv=kv, indices=indices)
    T, H, D_qk = q.shape
    return q.new_empty((T, H, D_qk - _ROPE_WIDTH)), q.new_empty((T, H), dtype=_stat_dtype(q.dtype))


@torch.library.register_fake("flashdsa::sparse_mla_bwd")
def _sparse_mla_bwd_fake(q, kv, indices, scale, out, lse, dout, deterministic):
    _check_same_device("sparse_mla_bwd", q=q, kv=kv, indices=indices, out=out, lse=lse, dout=dout)
    return q.new_empty(q.shape), kv.new_empty(kv.shape, dtype=_stat_dtype(q.dtype))


@torch.library.register_fake("flashdsa::sparse_mla_bwd_mass")
def _sparse_mla_bwd_mass_fake(q, kv, indices, scale, out, lse, dout, deterministic):
    _check_same_device("sparse_mla_bwd_mass", q=q, kv=kv, indices=indices, out=out, lse=lse, dout=dout)
    stat = _stat_dtype(q.dtype)
    return (q.new_empty(q.shape), kv.new_empty(kv.shape, dtype=stat),
            q.new_empty(indices.shape, dtype=stat))


@torch.library.register_fake("flashdsa::attention_mass")
def _attention_mass_fake(q, kv, indices, lse, scale):
    _check_same_device("attention_mass", q=q, kv=kv, indices=indices, lse=lse)
    return q.new_empty(indices.shape, dtype=_stat_dtype(q.dtype))


@torch.library.register_fake("flashdsa::sparse_kl_fwd")
def _sparse_kl_fwd_fake(q_idx, k_idx, weights, indices, mass, relu):
    _check_same_device("sparse_kl_fwd", q_idx=q_idx, k_idx=k_idx, weights=weights, indices=indices, mass=mass)
    T, stat = q_idx.shape[0], _stat_dtype(q_idx.dtype)
    return q_idx.new_empty((T,), dtype=stat), q_idx.new_empty((T, 2), dtype=stat)


def _indexer_grads_fake(q_idx, k_idx):
    stat = _stat_dtype(q_idx.dtype)
    return (q_idx.new_empty(q_idx.shape),
            k_idx.new_empty(k_idx.shape, dtype=stat),
            q_idx.new_empty(q_idx.shape[:2], dtype=stat))


@torch.library.register_fake("flashdsa::sparse_kl_bwd")
def _sparse_kl_bwd_fake(q_idx, k_idx, weights, indices, mass, relu, grad_rows, row_stats=None):
    _check_same_device("sparse_kl_bwd", q_idx=q_idx, k_idx=k_idx, weights=weights, indices=indices, mass=mass,
                       grad_rows=grad_rows, row_stats=row_stats)
    return _indexer_grads_fake(q_idx, k_idx)


@torch.library.register_fake("flashdsa::dense_kl_fwd")
def _dense_kl_fwd_fake(q, kv, scale, q_idx, k_idx, weights, k_start, k_end, relu):
    _check_same_device("dense_kl_fwd", q=q, kv=kv, q_idx=q_idx, k_idx=k_idx, weights=weights, k_start=k_start,
                       k_end=k_end)
    return q.new_empty((q.shape[0],), dtype=_stat_dtype(q.dtype))


@torch.library.register_fake("flashdsa::dense_kl_bwd")
def _dense_kl_bwd_fake(q, kv, scale, q_idx, k_idx, weights, k_start, k_end, relu, grad_rows):
    _check_same_device("dense_kl_bwd", q=q, kv=kv, q_idx=q_idx, k_idx=k_idx, weights=weights, k_start=k_start,
                       k_end=k_end, grad_rows=grad_rows)
    return _indexer_grads_fake(q_idx, k_idx)


# ---------------------------------------------------------------------------------------------
# Autograd


class _SparseMla(torch.autograd.Function):
    """sparse_mla_fwd with its backward; gradients to q and kv (dkv returned in kv's dtype)."""

    @staticmethod
    def forward(q, kv, indices, scale, deterministic):
        return _ops.sparse_mla_fwd(q, kv, indices, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, kv, indices, scale, deterministic = inputs
        out, lse = output
        ctx.save_for_backward(q, kv, indices, out, lse)
        ctx.scale = scale
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)

    @staticmethod
    @_first_order_only("sparse_mla")
    def backward(ctx, dout, _dlse):
        q, kv, indices, out, lse = ctx.saved_tensors
        dq, dkv = _ops.sparse_mla_bwd(q, kv, indices, ctx.scale, out, lse, dout, ctx.deterministic)
        return dq, dkv.to(kv.dtype), None, None, None


def _valid_row_count(indices: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Number of rows of ``indices`` with at least one slot in [0, num_keys) (int64 scalar tensor)."""
    return ((indices >= 0) & (indices < num_keys)).any(dim=1).sum()


def _nonempty_rows(indices: torch.Tensor, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """:func:`_valid_row_count`, at least 1, as a ``dtype`` scalar (the sparse loss's mean divisor)."""
    return _valid_row_count(indices, num_keys).clamp_min(1).to(dtype)


class _SparseMlaWithIndexerLoss(torch.autograd.Function):
    """sparse_mla_fwd whose backward also runs the sparse indexer KL loss (forward and backward).

    The target of the loss is the attention mass, which the MLA backward (sparse_mla_bwd_mass)
    emits from the probabilities it forms anyway, so the forward runs no attention_mass and no KL
    forward. The loss value is only known in the backward: it is written into ``loss_out`` (NaN
    from the forward until then). Gradients: q, kv (from ``out``) and q_idx, k_idx, weights (from
    the loss, as if ``loss_grad_scale · loss`` had been added to the model loss, the gradient
    DSAIndexerLossAutoScaler gives the loss in the forward-path autograd chain).
    """

    @staticmethod
    def forward(q, kv, indices, scale, deterministic, q_idx, k_idx, weights, relu, coeff, normalizer, loss_out,
                loss_grad_scale, loss_reduce):
        loss_out.fill_(float("nan"))
        return _ops.sparse_mla_fwd(q, kv, indices, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (q, kv, indices, scale, deterministic, q_idx, k_idx, weights, relu, coeff, normalizer, loss_out,
         loss_grad_scale, loss_reduce) = inputs
        out, lse = output
        ctx.save_for_backward(q, kv, indices, out, lse, q_idx, k_idx, weights, normalizer)
        ctx.scale, ctx.deterministic, ctx.relu, ctx.coeff = scale, deterministic, relu, coeff
        # Not saved with save_for_backward: the backward writes into it (no version check wanted).
        ctx.loss_out = loss_out
        ctx.loss_grad_scale, ctx.loss_reduce = loss_grad_scale, loss_reduce
        ctx.mark_non_differentiable(lse)

    @staticmethod
    @_first_order_only("sparse_mla_with_indexer_loss")
    def backward(ctx, dout, _dlse):
        q, kv, indices, out, lse, q_idx, k_idx, weights, normalizer = ctx.saved_tensors
        dq, dkv, mass = _ops.sparse_mla_bwd_mass(q, kv, indices, ctx.scale, out, lse, dout, ctx.deterministic)
        loss_rows, row_stats = _ops.sparse_kl_fwd(q_idx, k_idx, weights, indices, mass, ctx.relu)
        # The same expressions as indexer_kl_loss(reduction="mean") and the autograd of
        # DSAIndexerLossAutoScaler -> div -> mul -> sum, so both paths agree bitwise on the CPU.
        total = loss_rows.sum()
        if normalizer is None:
            normalizer = _nonempty_rows(indices, k_idx.shape[0], total.dtype)
        loss = total * ctx.coeff / normalizer
        scale = ctx.loss_grad_scale() if callable(ctx.loss_grad_scale) else ctx.loss_grad_scale
        grad_loss = (torch.ones_like(loss) * scale).to(loss.dtype)  # autograd casts the auto-scaler's grad alike
        grad_row = grad_loss / normalizer * ctx.coeff
        grad_rows = grad_row.to(loss_rows.dtype).expand(loss_rows.shape).contiguous()
        dq_idx, dk_idx, dweights = _ops.sparse_kl_bwd(q_idx, k_idx, weights, indices, mass, ctx.relu, grad_rows,
                                                      row_stats)
        if ctx.loss_reduce is not None:
            loss = ctx.loss_reduce(loss)
        ctx.loss_out.copy_(loss)
        return (dq, dkv.to(kv.dtype), None, None, None, dq_idx, dk_idx.to(k_idx.dtype), dweights,
                None, None, None, None, None, None)


class _SparseKlRows(torch.autograd.Function):
    """Per-row sparse KL loss; gradients to q_idx, k_idx, weights (the target `mass` gets none).

    Returns (loss_rows, row_stats); the row statistics [T, 2] are saved so that the backward reads
    the keys once instead of recomputing them (not differentiable).
    """

    @staticmethod
    def forward(q_idx, k_idx, weights, indices, mass, relu):
        return _ops.sparse_kl_fwd(q_idx, k_idx, weights, indices, mass, relu)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q_idx, k_idx, weights, indices, mass, relu = inputs
        _, row_stats = output
        ctx.save_for_backward(q_idx, k_idx, weights, indices, mass, row_stats)
        ctx.relu = relu
        ctx.mark_non_differentiable(row_stats)

    @staticmethod
    @_first_order_only("indexer_kl_loss (sparse)")
    def backward(ctx, grad_rows, _grad_row_stats):
        q_idx, k_idx, weights, indices, mass, row_stats = ctx.saved_tensors
        dq_idx, dk_idx, dweights = _ops.sparse_kl_bwd(q_idx, k_idx, weights, indices, mass, ctx.relu, grad_rows,
                                                      row_stats)
        return dq_idx, dk_idx.to(k_idx.dtype), dweights, None, None, None


class _DenseKlRows(torch.autograd.Function):
    """Per-row dense KL loss; gradients to q_idx, k_idx, weights (the target's q and kv get none)."""

    @staticmethod
    def forward(q_idx, k_idx, weights, q, kv, scale, k_start, k_end, relu):
        return _ops.dense_kl_fwd(q, kv, scale, q_idx, k_idx, weights, k_start, k_end, relu)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q_idx, k_idx, weights, q, kv, scale, k_start, k_end, relu = inputs
        ctx.save_for_backward(q_idx, k_idx, weights, q, kv, k_start, k_end)
        ctx.scale = scale
        ctx.relu = relu

    @staticmethod
    @_first_order_only("indexer_kl_loss (dense)")
    def backward(ctx, grad_rows):
        q_idx, k_idx, weights, q, kv, k_start, k_end = ctx.saved_tensors
        dq_idx, dk_idx, dweights = _ops.dense_kl_bwd(
            q, kv, ctx.scale, q_idx, k_idx, weights, k_start, k_end, ctx.relu, grad_rows)
        return dq_idx, dk_idx.to(k_idx.dtype), dweights, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------
# Public functions


SELECTIONS = ("bf16", "fp8")


def fp8_selection_candidates(topk: int) -> int:
    """The default candidate count of the FP8 selection (docs/spec.md §3): ``topk`` plus a quarter of it
    rounded up to a multiple of 64, at least 256: ``topk + max(64 * ceil(topk / 256), 256)``."""
    return topk + max(64 * ((topk + 255) // 256), 256)


def check_selection(selection: str) -> str:
    """Returns `selection` if it names an indexer selection pass ("bf16" or "fp8"), else raises ValueError."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    return selection


def check_fp8_band(selection: str, fp8_band: int | None, topk: int) -> None:
    """Checks the FP8 band re-score option: None, or (``selection="fp8"`` only) an int in [1, topk - 1];
    else raises ValueError."""
    if fp8_band is None:
        return
    if selection != "fp8":
        raise ValueError(f"fp8_band is only read with selection='fp8' (selection={selection!r})")
    if isinstance(fp8_band, bool) or not isinstance(fp8_band, int) or not 1 <= fp8_band < topk:
        raise ValueError(f"fp8_band must be None or an int in [1, topk - 1 = {topk - 1}], got {fp8_band!r}")


def check_fp8_band_scaled(fp8_band: int | None, fp8_band_scaled: bool) -> None:
    """Checks the option that scales the band re-score to each row's keys: a bool, True only with an ``fp8_band``;
    else raises ValueError."""
    if not isinstance(fp8_band_scaled, bool):
        raise ValueError(f"fp8_band_scaled must be a bool, got {fp8_band_scaled!r}")
    if fp8_band_scaled and fp8_band is None:
        raise ValueError("fp8_band_scaled=True scales the band re-score: it needs fp8_band")


def quantize_indexer_fp8(q_idx: torch.Tensor, k_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                             torch.Tensor, torch.Tensor]:
    """Quantizes the indexer inputs to fp8 e4m3 with per-row scales (docs/spec.md §3, "FP8 selection").

    Every row of D_I elements (q_idx per (token, head), k_idx per token) is scaled by
    ``scale = amax / 448`` (fp32; 1 for an all-zero row) and rounded to nearest even:
    ``x ~= e4m3 * scale``. A row holding a NaN or +-Inf gets scale NaN and NaN codes, so every score
    it enters is NaN (docs/reliability.md).

    Args:
        q_idx: [T, H_I, D_I] bf16 (fp32 / fp64 on the CPU); any row strides.
        k_idx: [T_kv, D_I], same dtype and device.
    Returns:
        (q8, q_scale, k8, k_scale): q8 [T, H_I, D_I] and k8 [T_kv, D_I] torch.float8_e4m3fn,
        q_scale [T, H_I] and k_scale [T_kv] float32. No gradient.
    """
    _check_same_device("quantize_indexer_fp8", q_idx=q_idx, k_idx=k_idx)
    if q_idx.dim() != 3 or k_idx.dim() != 2:
        raise ValueError(f"q_idx must be [T, H_I, D_I] and k_idx [T_kv, D_I], got {tuple(q_idx.shape)} and "
                         f"{tuple(k_idx.shape)}")
    if q_idx.dtype != k_idx.dtype:
        raise ValueError(f"k_idx must have the dtype of q_idx ({q_idx.dtype}), got {k_idx.dtype}")
    q8, q_scale = _ops.quantize_fp8(q_idx.detach())
    k8, k_scale = _ops.quantize_fp8(k_idx.detach())
    return q8, q_scale, k8, k_scale


def indexer_topk(q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                 k_end: torch.Tensor, topk: int, relu: bool = True, *, selection: str = "bf16",
                 fp8_candidates: int | None = None,
                 fp8_band: int | None = None,
                 fp8_band_scaled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Lightning indexer scores and fused top-k selection (no gradient).

    score(t, s) = sum_h weights[t, h] * f(q_idx[t, h] . k_idx[s]), f = relu if `relu` else identity,
    for the visible keys k_start[t] <= s < k_end[t]; row t keeps the `topk` largest.

    With ``selection="fp8"`` the O(T^2) selection pass runs on fp8 e4m3 copies of q_idx / k_idx
    (:func:`quantize_indexer_fp8`): it keeps the ``fp8_candidates`` best keys of each row by the
    quantized score, re-scores them exactly from q_idx / k_idx, and returns the `topk` best of those
    with their exact scores (docs/spec.md §3 "FP8 selection"). The result equals the bf16 selection
    whenever the candidates hold the exact top-k (recall measured in docs/kernels/indexer_topk.md).

    Args:
        q_idx: [T, H_I, D_I] act.
        k_idx: [T_kv, D_I] act (q_idx's dtype).
        weights: [T, H_I] float (cast to stat), all scale factors folded in.
        k_start, k_end: [T] int32 key ranges.
        topk: K, a multiple of 64, at most 8192.
        relu: the activation f.
        selection: "bf16" (exact, the default) or "fp8".
        fp8_candidates: fp8 only: the candidates re-scored per row, in [topk, 16384]; None =
            :func:`fp8_selection_candidates` (topk + max(64 * ceil(topk / 256), 256); CUDA: a
            multiple of 64).
        fp8_band: fp8 only: None (default) re-scores every candidate exactly; b in [1, topk - 1] is the
            *band re-score* (docs/spec.md §3): on a row with more than `topk` candidates the ``topk - b``
            best by the FP8 score are kept as they are and only the other candidates are re-scored
            exactly, their ``b`` best joining (faster: fewer exact re-scores). It returns indices only
            (``scores`` is None). CUDA: D_I = 128.
        fp8_band_scaled: with ``fp8_band`` only: False (default) = every row takes the band ``b`` and the slack
            ``fp8_candidates - topk`` as given; True = both scaled to the row's number of visible keys n (docs/spec.md
            §3 "Band scaled by the row's keys"): a row with n <= 24 * topk takes a share of each, from 23/64 at
            n <= 2 * topk up to 61/64 (the density of scores at its cut relative to a 32 * topk row), the longer rows
            the whole band. Short rows re-score far fewer keys for about the recall of the longest rows (measured in
            docs/kernels/indexer_topk.md: 1.02x faster at 32K, mean recall 0.997 instead of 0.998).
    Returns:
        indices: [T, K] int32, unordered within a row; a row with fewer than K visible keys holds
            all of them followed by -1.
        scores: [T, K] stat, the score of each selected key (-inf for empty slots); None with
            ``fp8_band``.
    """
    _check_same_device("indexer_topk", q_idx=q_idx, k_idx=k_idx, weights=weights, k_start=k_start, k_end=k_end)
    weights = weights.detach().to(_stat_dtype(q_idx.dtype))
    if check_selection(selection) == "bf16":
        if fp8_candidates is not None or fp8_band is not None or fp8_band_scaled:
            raise ValueError("fp8_candidates, fp8_band and fp8_band_scaled are only read with selection='fp8'")
        return _ops.indexer_topk(q_idx.detach(), k_idx.detach(), weights, k_start, k_end, topk, relu)
    candidates = 0 if fp8_candidates is None else int(fp8_candidates)
    check_fp8_band(selection, fp8_band, topk)
    check_fp8_band_scaled(fp8_band, fp8_band_scaled)
    band = 0 if fp8_band is None else fp8_band
    q8, q_scale, k8, k_scale = quantize_indexer_fp8(q_idx, k_idx)
    indices, scores = _ops.indexer_topk_fp8(q8, k8, q_scale, k_scale, q_idx.detach(), k_idx.detach(), weights,
                                            k_start, k_end, topk, relu, candidates, band, fp8_band_scaled)
    return (indices, None) if band else (indices, scores)


def sparse_mla(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float, *,
               deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention over the top-k keys of every query row; differentiable in q and kv.

    s_j = scale * q[t, h] . kv[idx_j], lse = log sum_j exp(s_j), out = sum_j exp(s_j - lse) kv[idx_j, :D_v].

    Args:
        q: [T, H, D_qk] act.
        kv: [T_kv, D_qk] act (q's dtype); the value is kv[:, :D_v].
        indices: [T, K] int32; entries outside [0, T_kv) are empty slots.
        scale: softmax scale, e.g. D_qk ** -0.5.
        deterministic: bitwise-reproducible dkv in the backward (slower on CUDA).
    Returns:
        out: [T, H, D_v] act (0 for rows without a valid index).
        lse: [T, H] stat, natural-log sum of exp (-inf for such rows); not differentiable.
    """
    _check_same_device("sparse_mla", q=q, kv=kv, indices=indices)
    return _SparseMla.apply(q, kv, indices, float(scale), bool(deterministic))


def sparse_mla_with_indexer_loss(
        q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float,
        q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, loss_out: torch.Tensor, *,
        relu: bool = True, coeff: float = 1.0, normalizer: torch.Tensor | None = None,
        deterministic: bool = False,
        loss_grad_scale: float | torch.Tensor | Callable[[], float | torch.Tensor] = 1.0,
        loss_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sparse_mla` whose backward also computes the sparse indexer KL loss (training path).

    Forward: ``out, lse = sparse_mla(q, kv, indices, scale)`` and nothing else. Backward (of
    ``out``): one ``sparse_mla_bwd_mass`` call gives dq, dkv and the attention mass (the KL
    target), then ``sparse_kl_fwd`` / ``sparse_kl_bwd`` give the loss and dq_idx, dk_idx, dweights.
    Values and gradients are those of::

        out, lse = sparse_mla(q, kv, indices, scale)
        mass = attention_mass(q, kv, indices, lse, scale)
        loss = indexer_kl_loss(q_idx, k_idx, weights, indices=indices, mass=mass, relu=relu,
                               coeff=coeff, normalizer=normalizer)          # reduction="mean"
        total = <model loss of out> + loss_grad_scale * loss

    without the mass recompute and the KL forward between the forward and the backward.

    The loss value only exists once the backward has run: it is written (``copy_``) into
    ``loss_out``, which holds NaN from this call until then (and stays NaN if ``out`` gets no
    gradient). Read it after ``backward()``.

    Args:
        q, kv, indices, scale, deterministic: as in :func:`sparse_mla`.
        q_idx, k_idx, weights: as in :func:`indexer_kl_loss` (weights cast to stat here).
        loss_out: 0-dim stat tensor on q's device (written in place; it gets no gradient).
        relu, coeff: as in :func:`indexer_kl_loss`.
        normalizer: the mean's denominator (e.g. the global row count under context parallelism);
            None = the number of rows of ``indices`` with a valid slot (at least 1).
        loss_grad_scale: d total / d loss; a callable is called in the backward (e.g. to read
            :attr:`flashdsa.DSAIndexerLossAutoScaler.main_loss_backward_scale` at backward time).
        loss_reduce: applied to the loss value before it is written into ``loss_out`` (e.g. a sum
            over context-parallel ranks; it then runs in every rank's backward).
    Returns:
        (out, lse) as :func:`sparse_mla`.
    """
    _check_same_device("sparse_mla_with_indexer_loss", q=q, kv=kv, indices=indices, q_idx=q_idx, k_idx=k_idx,
                       weights=weights, loss_out=loss_out)
    stat = _stat_dtype(q.dtype)
    if loss_out.requires_grad:
        raise ValueError("loss_out must not require grad: it is written in place by the backward and gets no "
                         "gradient (create it with torch.full((), float('nan'), dtype=..., device=...), or pass "
                         "loss_out.detach())")
    if loss_out.dim() != 0 or loss_out.dtype != stat:
        raise ValueError(f"loss_out must be a 0-dim {stat} tensor (the stat dtype of q's {q.dtype}), got "
                         f"{loss_out.dtype} of shape {tuple(loss_out.shape)}")
    return _SparseMlaWithIndexerLoss.apply(q, kv, indices, float(scale), bool(deterministic), q_idx, k_idx,
                                           weights.to(_stat_dtype(q_idx.dtype)), bool(relu), float(coeff),
                                           normalizer, loss_out, loss_grad_scale, loss_reduce)


def attention_mass(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lse: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """Unnormalized sparse-KL target (no gradient; inputs are detached).

    mass[t, j] = sum_h exp(scale * q[t, h] . kv[idx_j] - lse[t, h]), 0 for empty slots.

    Args:
        q: [T, H, D_qk] act; kv: [T_kv, D_qk] act; indices: [T, K] int32.
        lse: [T, H] stat, from :func:`sparse_mla` with the same inputs.
    Returns:
        mass: [T, K] stat. Sum it over tensor-parallel head shards before use.
    """
    _check_same_device("attention_mass", q=q, kv=kv, indices=indices, lse=lse)
    return _ops.attention_mass(q.detach(), kv.detach(), indices, lse.detach(), float(scale))


def _kl_rows(q_idx, k_idx, weights, *, formulation, relu, indices, mass, q, kv, scale, k_start, k_end,
             differentiable):
    """Per-row KL loss [T] stat of either formulation, with or without autograd."""
    _check_same_device("indexer_kl_loss", q_idx=q_idx, k_idx=k_idx, weights=weights, indices=indices, mass=mass,
                       q=q, kv=kv, k_start=k_start, k_end=k_end)
    weights = weights.to(_stat_dtype(q_idx.dtype))
    if not differentiable:
        q_idx, k_idx, weights = q_idx.detach(), k_idx.detach(), weights.detach()
    if formulation == "sparse":
        if indices is None or mass is None:
            raise ValueError('formulation="sparse" needs indices= and mass=')
        return _SparseKlRows.apply(q_idx, k_idx, weights, indices, mass.detach(), bool(relu))[0]
    if formulation == "dense":
        if q is None or kv is None or scale is None or k_start is None or k_end is None:
            raise ValueError('formulation="dense" needs q=, kv=, scale=, k_start= and k_end=')
        return _DenseKlRows.apply(q_idx, k_idx, weights, q.detach(), kv.detach(), float(scale), k_start, k_end,
                                  bool(relu))
    raise ValueError(f'formulation must be "sparse" or "dense", got {formulation!r}')


def indexer_kl_loss(q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, *,
                    formulation: str = "sparse", relu: bool = True, coeff: float = 1.0, reduction: str = "mean",
                    normalizer: float | torch.Tensor | None = None,
                    indices: torch.Tensor | None = None, mass: torch.Tensor | None = None,
                    q: torch.Tensor | None = None, kv: torch.Tensor | None = None, scale: float | None = None,
                    k_start: torch.Tensor | None = None, k_end: torch.Tensor | None = None) -> torch.Tensor:
    """Indexer KL loss KL(target || softmax(indexer scores)), differentiable in q_idx, k_idx, weights.

    The target comes from the main attention and is detached (it gets no gradient).

    formulation="sparse" (default): the support of row t is its valid top-k slots `indices` [T, K]
    int32; the target is `mass` [T, K] stat (from :func:`attention_mass`) normalized per row.
    formulation="dense": the support is all visible keys [k_start[t], k_end[t]) (int32 [T]); the
    target is the head-mean dense softmax of scale * q . kv, with q [T, H, D_qk] and kv [T_kv, D_qk] act.

    Args:
        q_idx: [T, H_I, D_I] act; k_idx: [T_kv, D_I] act; weights: [T, H_I] float (computed in stat).
        relu: indexer activation, as in :func:`indexer_topk`.
        coeff: loss coefficient.
        reduction: "mean": coeff * sum_t loss_t / N, N = `normalizer` if given (e.g. the global row
            count under context parallelism) else the number of rows with a non-empty support;
            "sum": coeff * sum_t loss_t.
    Returns:
        A scalar stat tensor. Gradients: dq_idx in q_idx's dtype, dk_idx in k_idx's, dweights in weights'.
    """
    loss_rows = _kl_rows(q_idx, k_idx, weights, formulation=formulation, relu=relu, indices=indices, mass=mass,
                         q=q, kv=kv, scale=scale, k_start=k_start, k_end=k_end, differentiable=True)
    total = loss_rows.sum()
    if reduction == "sum":
        return total * coeff
    if reduction != "mean":
        raise ValueError(f'reduction must be "mean" or "sum", got {reduction!r}')
    if normalizer is None:
        if formulation == "sparse":
            normalizer = _nonempty_rows(indices, k_idx.shape[0], total.dtype)
        else:
            normalizer = (k_end > k_start).sum().clamp_min(1).to(total.dtype)
    return total * coeff / normalizer


def indexer_kl_loss_rows(q_idx: torch.Tensor, k_idx: torch.Tensor, weights: torch.Tensor, *,
                         formulation: str = "sparse", relu: bool = True,
                         indices: torch.Tensor | None = None, mass: torch.Tensor | None = None,
                         q: torch.Tensor | None = None, kv: torch.Tensor | None = None, scale: float | None = None,
                         k_start: torch.Tensor | None = None, k_end: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row indexer KL loss [T] stat, no gradient (for logging). Inputs as in :func:`indexer_kl_loss`.

    loss_rows[t] = sum_j target (log target - log p_I) over the support of row t (0 if it is empty).
    """
    return _kl_rows(q_idx, k_idx, weights, formulation=formulation, relu=relu, indices=indices, mass=mass,
                    q=q, kv=kv, scale=scale, k_start=k_start, k_end=k_end, differentiable=False)


def build_key_ranges(cu_seqlens: torch.Tensor | Sequence[int],
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """THD causal key ranges: token t of sequence b sees keys [cu_seqlens[b], t + 1).

    Args:
        cu_seqlens: [B + 1] integer tensor or sequence of ints (the contract of
            :func:`flashdsa.thd.check_cu_seqlens`, the same everywhere in the API): 0,
            non-decreasing, last element T; floating-point values are refused. It is read on the
            host (a device tensor is copied, which synchronizes).
        device: where to put the ranges; default cu_seqlens' device (CPU for a sequence).
    Returns:
        k_start, k_end: [T] int32.
    Raises:
        TypeError / ValueError: as :func:`flashdsa.thd.check_cu_seqlens`.
    """
    if device is None:
        device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else torch.device("cpu")
    cu = check_cu_seqlens(cu_seqlens)
    if cu[-1] > torch.iinfo(torch.int32).max:
        raise ValueError(f"T = {int(cu[-1])} does not fit int32 ranges")
    lengths = cu[1:] - cu[:-1]
    k_start = torch.repeat_interleave(cu[:-1], lengths)
    k_end = torch.arange(1, int(cu[-1]) + 1)
    return k_start.to(device=device, dtype=torch.int32), k_end.to(device=device, dtype=torch.int32)
