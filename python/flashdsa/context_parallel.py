"""Context parallelism for the DSA layer (docs/spec.md §7), over any ``torch.distributed`` backend.

Layout (Megatron / Transformer Engine *zigzag*): every sequence of the global packed batch is padded
to a multiple of ``2·cp`` tokens and cut into ``2·cp`` equal chunks; rank ``r`` holds chunk ``r``
then chunk ``2·cp−1−r`` of each sequence, sequences in order. This balances causal work.

Forward: each rank all-gathers the key tensors (``kv``, ``k_idx``) and reorders them into global
(padded) order, builds key ranges of its local queries from their global rows and runs the usual
kernels; top-k indices are therefore global rows of the gathered keys. Backward: the autograd of
the all-gather is a reduce-scatter, returning to each rank the summed gradient of its own rows.
Padding tokens get empty key ranges: no output, no loss, invisible to real tokens.

Works with gloo on CPU tensors and NCCL on CUDA tensors (anything that implements all-gather and
all-reduce; reduce-scatter is used when the backend has it).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .ops import _first_order_only
from .thd import as_cu_seqlens, check_cu_seqlens, key_ranges_for_rows, sequence_ids, sequence_lengths

__all__ = [
    "pad_cu_seqlens",
    "zigzag_rows",
    "ZigzagLayout",
    "all_gather_rows",
]


def pad_cu_seqlens(cu_seqlens: torch.Tensor, multiple: int) -> torch.Tensor:
    """``cu_seqlens`` of the same sequences, each padded up to a multiple of ``multiple``.

    Args:
        cu_seqlens: integer ``[B+1]`` (validated).
        multiple: >= 1 (``2·cp`` for the zigzag layout).

    Returns:
        int64 ``[B+1]`` on ``cu_seqlens``' device.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    cu_seqlens = as_cu_seqlens(cu_seqlens)
    lengths = sequence_lengths(cu_seqlens)
    padded = (lengths + multiple - 1) // multiple * multiple
    cu = torch.zeros_like(cu_seqlens, dtype=torch.int64)
    torch.cumsum(padded, 0, out=cu[1:])
    return cu


def zigzag_rows(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global (padded) rows of the tokens that rank ``cp_rank`` holds, in local order.

    Args:
        cu_seqlens_padded: integer ``[B+1]``, every length a multiple of ``2·cp_size``.
        cp_size, cp_rank: group size and this rank (``0 <= cp_rank < cp_size``).

    Returns:
        int64 ``[T_pad / cp_size]`` on ``cu_seqlens_padded``' device: for each sequence, the rows
        of chunk ``cp_rank`` then of chunk ``2·cp_size−1−cp_rank``.
    """
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    cu_pad = as_cu_seqlens(cu_seqlens_padded, "cu_seqlens_padded").to(torch.int64)
    chunk = sequence_lengths(cu_pad) // (2 * cp_size)  # [B] tokens per chunk
    local_cu = cu_pad // cp_size  # [B+1] where each sequence starts in the local order
    local = torch.arange(int(local_cu[-1]), device=cu_pad.device, dtype=torch.int64)
    seq = sequence_ids(local_cu, local)
    pos = local - local_cu[seq]  # position inside this rank's 2 chunks of the sequence
    c = chunk[seq]
    second = pos >= c
    chunk_id = torch.where(second, 2 * cp_size - 1 - cp_rank, cp_rank)
    return cu_pad[seq] + chunk_id * c + pos - second.to(torch.int64) * c


class ZigzagLayout:
    """Zigzag CP layout of one packed batch, as seen by one rank.

    Built once per batch (host work on ``B``-sized arrays, device work in vectorized torch).

    Attributes:
        cp_size, cp_rank: group size and this rank.
        group: the process group (None only for single-process use of split/merge).
        cu_seqlens: int64 CPU ``[B+1]``, the real (unpadded) global batch.
        cu_seqlens_padded: int64 CPU ``[B+1]``, lengths padded to a multiple of ``2·cp_size``.
        num_local_tokens: rows every rank holds (``T_pad / cp_size``).
        num_padded_tokens: ``T_pad`` = rows of a gathered key tensor.
        local_rows: int64 ``[num_local_tokens]`` on ``device``: global padded row of each local token.
    """

    def __init__(
        self,
        cu_seqlens: torch.Tensor,
        cp_size: int,
        cp_rank: int,
        *,
        device: torch.device | str = "cpu",
        group: Optional[dist.ProcessGroup] = None,
    ) -> None:
        self.cp_size = cp_size
        self.cp_rank = cp_rank
        self.group = group
        self.device = torch.device(device)
        self.cu_seqlens = check_cu_seqlens(cu_seqlens)
        self.cu_seqlens_padded = pad_cu_seqlens(self.cu_seqlens, 2 * cp_size)
        self.num_padded_tokens = int(self.cu_seqlens_padded[-1])
        self.num_local_tokens = self.num_padded_tokens // cp_size
        # Device copies of the [B+1] / [B] arrays (built on the host: no synchronization).
        self._cu = self.cu_seqlens.to(self.device)
        self._cu_pad = self.cu_seqlens_padded.to(self.device)
        self._lengths = sequence_lengths(self.cu_seqlens).to(self.device)
        # Rows of every rank, concatenated in rank order = the row order of an all-gather result.
        gathered_rows = torch.cat([zigzag_rows(self.cu_seqlens_padded, cp_size, r) for r in range(cp_size)])
        self._gathered_rows = gathered_rows.to(self.device)
        self.local_rows = self._gathered_rows[cp_rank * self.num_local_tokens:(cp_rank + 1) * self.num_local_tokens]
        # Inverse permutation: position in the all-gather result of each global padded row.
        self._gather_position = torch.argsort(gathered_rows).to(self.device)

    @classmethod
    def for_group(cls, cu_seqlens: torch.Tensor, group: dist.ProcessGroup, device: torch.device | str) -> "ZigzagLayout":
        """Layout of this process in ``group`` (``cu_seqlens``: the real global batch ``[B+1]``)."""
        return cls(cu_seqlens, dist.get_world_size(group), dist.get_rank(group), device=device, group=group)

    def key_ranges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Causal ranges of the local queries over the gathered keys (global padded order).

        Returns:
            ``(k_start, k_end)``, int32 ``[num_local_tokens]`` on ``device``; padding tokens get
            an empty range.
        """
        return key_ranges_for_rows(self._cu_pad, self.local_rows, self._lengths)

    def _padded_to_real(self, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Real global row of each padded row ([N] int64) and whether it is a real token ([N] bool)."""
        seq = sequence_ids(self._cu_pad, rows)
        pos = rows - self._cu_pad[seq]
        return self._cu[seq] + pos, pos < self._lengths[seq]

    def split(self, packed: torch.Tensor, rank: Optional[int] = None) -> torch.Tensor:
        """The rows of ``packed`` that a rank holds (zeros at padding positions).

        Args:
            packed: ``[T, *feature]``, the real global packed batch (``T = cu_seqlens[-1]``).
            rank: which rank's share (default: this layout's rank).

        Returns:
            ``[num_local_tokens, *feature]`` (same dtype/device as ``packed``, differentiable).
        """
        if packed.shape[0] != int(self.cu_seqlens[-1]):
            raise ValueError(
                f"split expects the global packed batch with {int(self.cu_seqlens[-1])} rows, got {packed.shape[0]}"
            )
        rank = self.cp_rank if rank is None else rank
        rows = self._gathered_rows[rank * self.num_local_tokens:(rank + 1) * self.num_local_tokens]
        real_rows, is_real = self._padded_to_real(rows)
        # Row T of the extended tensor is the zero padding row.
        extended = torch.cat([packed, packed.new_zeros((1,) + packed.shape[1:])])
        return extended[torch.where(is_real, real_rows, packed.shape[0]).to(packed.device)]

    def merge(self, gathered: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`split` over all ranks.

        Args:
            gathered: ``[cp_size * num_local_tokens, *feature]``, the local tensors of all ranks
                concatenated in rank order (what an all-gather returns).

        Returns:
            ``[T, *feature]``, the real global packed batch (padding rows dropped).
        """
        if gathered.shape[0] != self.num_padded_tokens:
            raise ValueError(f"merge expects {self.num_padded_tokens} gathered rows, got {gathered.shape[0]}")
        total = int(self.cu_seqlens[-1])
        real = torch.arange(total, device=self.device, dtype=torch.int64)
        seq = sequence_ids(self._cu, real)
        padded = self._cu_pad[seq] + real - self._cu[seq]
        return gathered[self._gather_position[padded].to(gathered.device)]

    def padded_to_real_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Maps global padded rows (e.g. top-k indices) to real global rows; -1 stays -1.

        Args:
            rows: integer tensor of any shape; entries outside ``[0, num_padded_tokens)`` are empty.

        Returns:
            int64 tensor of the same shape: the real row, or -1 for empty entries and padding rows.
        """
        flat = rows.reshape(-1).to(torch.int64)
        valid = (flat >= 0) & (flat < self.num_padded_tokens)
        real, is_real = self._padded_to_real(torch.where(valid, flat, 0).to(self.device))
        real = torch.where(valid.to(self.device) & is_real, real, -1)
        return real.reshape(rows.shape).to(rows.device)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """Differentiable all-gather of a local key tensor into global padded order.

        Args:
            local: ``[num_local_tokens, *feature]`` on this rank.

        Returns:
            ``[num_padded_tokens, *feature]``; its gradient is reduce-scattered back in backward.
        """
        if self.group is None:
            raise RuntimeError("ZigzagLayout.gather needs a process group")
        if local.shape[0] != self.num_local_tokens:
            raise ValueError(f"gather expects {self.num_local_tokens} local rows, got {local.shape[0]}")
        return all_gather_rows(
            local, self.group, order=self._gather_position.to(local.device),
            inverse_order=self._gathered_rows.to(local.device),
        )


def _is_low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


_REDUCE_SCATTER_UNSUPPORTED: set = set()  # backend names whose reduce_scatter raised "not supported"


def _reduce_scatter_rows(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sums ``grad [cp·N, ...]`` over the group and returns this rank's rows ``[N, ...]``.

    bf16/fp16 gradients are summed in fp32 (one rounding at the end instead of one per rank).
    Uses reduce_scatter_tensor; falls back to all_reduce + slice on backends without it
    (older gloo).
    """
    cp_size, rank = dist.get_world_size(group), dist.get_rank(group)
    out_dtype = grad.dtype
    work = grad.float() if _is_low_precision(grad.dtype) else grad
    work = work.contiguous()
    rows = work.shape[0] // cp_size
    backend = str(dist.get_backend(group))
    if backend not in _REDUCE_SCATTER_UNSUPPORTED:
        out = work.new_empty((rows,) + work.shape[1:])
        try:
            dist.reduce_scatter_tensor(out, work, group=group)
            return out.to(out_dtype)
        except (RuntimeError, NotImplementedError) as err:
            # Raised at dispatch (before any communication) on every rank alike.
            if "support" not in str(err).lower() and "implement" not in str(err).lower():
                raise
            _REDUCE_SCATTER_UNSUPPORTED.add(backend)
    dist.all_reduce(work, group=group)
    return work[rank * rows:(rank + 1) * rows].to(out_dtype)


def _all_gather_rows_raw(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenation in rank order of ``local [N, ...]`` from every rank: ``[cp·N, ...]``."""
    cp_size = dist.get_world_size(group)
    local = local.contiguous()
    out = local.new_empty((cp_size * local.shape[0],) + local.shape[1:])
    dist.all_gather_into_tensor(out, local, group=group)
    return out


class _AllGatherRows(torch.autograd.Function):
    """All-gather along dim 0 (optionally permuted); backward = reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, local, group, order, inverse_order):
        ctx.group = group
        ctx.save_for_backward(inverse_order)
        gathered = _all_gather_rows_raw(local, group)
        return gathered if order is None else gathered.index_select(0, order)

    @staticmethod
    @_first_order_only("all_gather_rows (context parallelism)")
    def backward(ctx, grad):
        (inverse_order,) = ctx.saved_tensors
        if inverse_order is not None:
            grad = grad.index_select(0, inverse_order)
        return _reduce_scatter_rows(grad, ctx.group), None, None, None


def all_gather_rows(
    local: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    order: Optional[torch.Tensor] = None,
    inverse_order: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Differentiable all-gather along rows.

    Args:
        local: ``[N, *feature]``, same shape on every rank.
        group: the process group (size ``cp``).
        order: optional int64 ``[cp·N]`` permutation: output row ``i`` is row ``order[i]`` of the
            rank-order concatenation.
        inverse_order: the inverse permutation of ``order`` (required with it).

    Returns:
        ``[cp·N, *feature]``. In backward, the gradient is summed over the group and each rank
        receives the rows of its own ``local`` (reduce-scatter).
    """
    if (order is None) != (inverse_order is None):
        raise ValueError("order and inverse_order must be given together")
    return _AllGatherRows.apply(local, group, order, inverse_order)


def _comm_device(group: dist.ProcessGroup, data_device: torch.device) -> torch.device:
    """Device for small bookkeeping tensors: CPU for gloo, the data's device otherwise (NCCL)."""
    return torch.device("cpu") if str(dist.get_backend(group)) == "gloo" else data_device


def all_reduce_sum(value: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum of ``value`` (a tensor, any shape) over the group, returned on ``value``'s device (no grad)."""
    work = value.detach().to(_comm_device(group, value.device)).clone()
    dist.all_reduce(work, group=group)
    return work.to(value.device)


_SHAPE_SLOTS = 4  # dims recorded per tensor in the agreement fingerprint


def check_cp_agreement(
    group: dist.ProcessGroup,
    cu_seqlens: torch.Tensor,
    shapes: Dict[str, Optional[Sequence[int]]],
    device: torch.device,
) -> None:
    """Checks that every rank of ``group`` describes the same batch before any data collective.

    All ranks exchange a small fingerprint (cu_seqlens length, total and checksum, plus the given
    tensor shapes) with one all-gather; every rank then raises the same error if they differ, so a
    mismatch fails fast instead of hanging in a later collective.

    Args:
        group: the CP group.
        cu_seqlens: integer ``[B+1]`` as given on this rank (not yet validated).
        shapes: name -> shape (or None for an absent tensor), the same names on every rank.
        device: device of the data (the fingerprint goes through the backend's device).

    Raises:
        ValueError: naming the first quantity on which two ranks disagree.
    """
    cu = as_cu_seqlens(cu_seqlens).detach().to("cpu", torch.int64).reshape(-1)
    weights = torch.arange(1, cu.numel() + 1, dtype=torch.int64)
    fields: List[Tuple[str, int]] = [
        ("len(cu_seqlens)", cu.numel()),
        ("cu_seqlens[-1]", int(cu[-1]) if cu.numel() else -1),
        ("cu_seqlens checksum", int((cu * weights).sum())),
    ]
    for name, shape in shapes.items():
        dims = [-1] * _SHAPE_SLOTS if shape is None else list(shape) + [-2] * (_SHAPE_SLOTS - len(shape))
        if len(dims) != _SHAPE_SLOTS:
            raise ValueError(f"{name} has {len(shape)} dims; at most {_SHAPE_SLOTS} are supported")
        fields += [(f"{name}.shape", d) for d in dims]
    mine = torch.tensor([v for _, v in fields], dtype=torch.int64, device=_comm_device(group, device))
    every = _all_gather_rows_raw(mine[None], group).cpu()  # [cp, F]
    disagree = (every != every[0]).any(0)
    if bool(disagree.any()):
        f = int(torch.nonzero(disagree)[0])
        name = fields[f][0]
        if name.endswith(".shape"):
            start = f - (f - 3) % _SHAPE_SLOTS
            per_rank = {r: _format_shape(every[r, start:start + _SHAPE_SLOTS].tolist()) for r in range(every.shape[0])}
        else:
            per_rank = {r: int(every[r, f]) for r in range(every.shape[0])}
        raise ValueError(
            f"context-parallel ranks disagree on {name}: "
            + ", ".join(f"rank {r}: {v}" for r, v in per_rank.items())
            + ". Every rank must pass the same global cu_seqlens and local tensors of the same sizes"
        )


def _format_shape(dims: List[int]) -> str:
    if all(d == -1 for d in dims):
        return "None"
    return str(tuple(d for d in dims if d != -2))
