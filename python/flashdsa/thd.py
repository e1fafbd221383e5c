"""Packed THD helpers (docs/spec.md §2): packing, ``cu_seqlens``, causal key ranges, unpacking.

A packed batch concatenates the sequences of a batch along the token axis (no padding between
them). ``cu_seqlens`` (int32 ``[B+1]``) holds the cumulative lengths: sequence ``b`` occupies rows
``cu_seqlens[b] <= t < cu_seqlens[b+1]``.

One ``cu_seqlens`` contract across the whole API (these helpers, :func:`flashdsa.build_key_ranges`,
the layer, context parallelism): an integer tensor (any integer dtype, any device) **or** a Python
sequence of ints; floating-point, complex or bool values are refused with a ValueError (never
truncated), anything else with a TypeError; 1-D with ``B+1 >= 2`` entries, ``cu_seqlens[0] = 0``,
non-decreasing. Every kernel masks through per-query key ranges
``[k_start[t], k_end[t])``; the helpers here build them in vectorized torch (no Python loop over
tokens), for plain THD and, through :func:`key_ranges_for_rows`, for context parallelism.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = [
    "pack_sequences",
    "cu_seqlens_from_lengths",
    "check_cu_seqlens",
    "as_cu_seqlens",
    "key_ranges_for_rows",
    "causal_key_ranges",
    "unpack_sequences",
]


def as_cu_seqlens(cu_seqlens: torch.Tensor | Sequence[int], what: str = "cu_seqlens") -> torch.Tensor:
    """``cu_seqlens`` as an integer tensor, checking only its type and dtype (no values, no sync).

    Args:
        cu_seqlens: an integer tensor (returned as is) or a sequence of ints (a new int64 CPU tensor).
        what: name used in error messages.

    Raises:
        TypeError: neither a tensor nor a sequence.
        ValueError: floating-point, complex or bool values.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        if isinstance(cu_seqlens, (str, bytes)) or not isinstance(cu_seqlens, Sequence):
            raise TypeError(f"{what} must be an integer tensor or a sequence of ints, got "
                            f"{type(cu_seqlens).__name__}")
        try:
            cu_seqlens = torch.as_tensor(cu_seqlens)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{what} must be a sequence of ints: {err}") from None
        if cu_seqlens.numel() == 0:
            cu_seqlens = cu_seqlens.to(torch.int64)
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"{what} must hold integers (an integer tensor or a sequence of ints), got "
                         f"{cu_seqlens.dtype} values; convert it explicitly if the values are whole numbers")
    return cu_seqlens


def cu_seqlens_from_lengths(
    lengths: Sequence[int] | torch.Tensor, device: Optional[torch.device | str] = None
) -> torch.Tensor:
    """Cumulative sequence lengths.

    Args:
        lengths: ``B`` non-negative sequence lengths (list or integer tensor ``[B]``).
        device: device of the result (default: the tensor's device, else CPU).

    Returns:
        ``cu_seqlens`` int32 ``[B+1]`` with ``cu_seqlens[0] = 0``.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=device)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D, got shape {tuple(lengths.shape)}")
    if bool((lengths < 0).any()):
        raise ValueError(f"sequence lengths must be non-negative, got {lengths.tolist()}")
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=cu[1:])
    if int(cu[-1]) > torch.iinfo(torch.int32).max:
        raise ValueError(f"total token count {int(cu[-1])} does not fit int32 cu_seqlens")
    return cu.to(torch.int32)


def pack_sequences(sequences: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packs sequences into one THD tensor.

    Args:
        sequences: ``B >= 1`` tensors ``[S_b, *feature]`` with the same feature shape, dtype and
            device (``S_b`` may differ and may be 0).

    Returns:
        ``(packed, cu_seqlens)``: ``packed [sum S_b, *feature]`` (same dtype/device; differentiable
        with respect to the inputs) and ``cu_seqlens`` int32 ``[B+1]`` on the same device.
    """
    if len(sequences) == 0:
        raise ValueError("pack_sequences needs at least one sequence")
    feature = sequences[0].shape[1:]
    for b, seq in enumerate(sequences):
        if seq.dim() < 1 or seq.shape[1:] != feature:
            raise ValueError(
                f"sequence {b} has shape {tuple(seq.shape)}; every sequence must be [S_b, "
                f"{', '.join(map(str, feature))}] like sequence 0"
            )
    packed = torch.cat(list(sequences), dim=0)
    cu_seqlens = cu_seqlens_from_lengths([s.shape[0] for s in sequences], device=packed.device)
    return packed, cu_seqlens


def check_cu_seqlens(
    cu_seqlens: torch.Tensor,
    num_tokens: Optional[int] = None,
    *,
    num_keys: Optional[int] = None,
    what: str = "cu_seqlens",
) -> torch.Tensor:
    """Validates ``cu_seqlens`` and returns a host (CPU, int64) copy of it.

    Args:
        cu_seqlens: integer tensor ``[B+1]`` (any device; a CUDA tensor costs one synchronization)
            or a sequence of ints (see the module docstring: the one contract of the API).
        num_tokens: if given, the last element must equal it (the packed query row count).
        num_keys: if given, the last element must not exceed it (rows of the key tensor).
        what: name used in error messages.

    Returns:
        int64 CPU tensor ``[B+1]`` with the same values.

    Raises:
        TypeError: neither a tensor nor a sequence.
        ValueError: non-integer values, or any inconsistency, naming the offending entry.
    """
    cu_seqlens = as_cu_seqlens(cu_seqlens, what)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{what} must be 1-D with B+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    host = cu_seqlens.detach().to("cpu", torch.int64)
    if int(host[0]) != 0:
        raise ValueError(f"{what}[0] must be 0, got {int(host[0])}")
    steps = host[1:] - host[:-1]
    if bool((steps < 0).any()):
        b = int(torch.nonzero(steps < 0)[0])
        raise ValueError(
            f"{what} must be non-decreasing: {what}[{b + 1}] = {int(host[b + 1])} < "
            f"{what}[{b}] = {int(host[b])}"
        )
    total = int(host[-1])
    if num_tokens is not None and total != num_tokens:
        raise ValueError(
            f"{what}[-1] = {total} must equal the number of packed query tokens ({num_tokens})"
        )
    if num_keys is not None and total > num_keys:
        b = int(torch.nonzero(host[1:] > num_keys)[0])
        raise ValueError(
            f"sequence {b} of {what} (rows {int(host[b])}..{int(host[b + 1])}) is longer than the key "
            f"tensor: {what} describes {total} tokens but the key tensor has only {num_keys} rows"
        )
    return host


def sequence_lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Lengths ``[B]`` (int64, same device) of the sequences described by ``cu_seqlens [B+1]``."""
    cu = cu_seqlens.to(torch.int64)
    return cu[1:] - cu[:-1]


def sequence_ids(cu_seqlens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Sequence index of each packed row.

    Args:
        cu_seqlens: ``[B+1]`` integer tensor (validated).
        rows: integer tensor ``[N]`` of packed rows in ``[0, cu_seqlens[-1])``, same device.

    Returns:
        int64 ``[N]``: ``b`` such that ``cu_seqlens[b] <= rows[i] < cu_seqlens[b+1]``
        (empty sequences are skipped because the search takes the last boundary ``<= row``).
    """
    cu = cu_seqlens.to(torch.int64)
    return torch.searchsorted(cu, rows.to(torch.int64), right=True) - 1


def key_ranges_for_rows(
    cu_seqlens: torch.Tensor,
    rows: torch.Tensor,
    valid_lengths: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal key ranges for query tokens identified by their row in the key numbering.

    Query token ``i`` sits at key row ``g = rows[i]`` of sequence ``b`` (``cu_seqlens[b] <= g <
    cu_seqlens[b+1]``) and sees ``[cu_seqlens[b], g + 1)``. Under context parallelism ``rows`` are
    the global rows of a rank's local tokens and ``cu_seqlens`` describes the padded global batch;
    tokens at position ``>= valid_lengths[b]`` inside their sequence are padding and get an empty
    range ``[cu_seqlens[b], cu_seqlens[b])`` (no output, no loss, never seen by real tokens).

    Args:
        cu_seqlens: ``[B+1]`` integer tensor, on ``rows``' device.
        rows: integer ``[N]`` key rows of the query tokens.
        valid_lengths: optional integer ``[B]``: real (unpadded) length of each sequence.

    Returns:
        ``(k_start, k_end)``, int32 ``[N]`` each, on ``rows``' device.
    """
    rows = rows.to(torch.int64)
    cu = as_cu_seqlens(cu_seqlens).to(device=rows.device, dtype=torch.int64)
    seq = sequence_ids(cu, rows)
    k_start = cu[seq]
    k_end = rows + 1
    if valid_lengths is not None:
        is_real = (rows - k_start) < valid_lengths.to(device=rows.device, dtype=torch.int64)[seq]
        k_end = torch.where(is_real, k_end, k_start)
    return k_start.to(torch.int32), k_end.to(torch.int32)


def causal_key_ranges(cu_seqlens: torch.Tensor, device: Optional[torch.device | str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """THD causal key ranges without CP: token ``t`` of sequence ``b`` sees ``[cu_seqlens[b], t + 1)``.

    Args:
        cu_seqlens: int ``[B+1]`` (validated).
        device: device of the result (default: ``cu_seqlens``' device).

    Returns:
        ``(k_start, k_end)``, int32 ``[T]`` each, ``T = cu_seqlens[-1]``.
    """
    cu_seqlens = as_cu_seqlens(cu_seqlens)
    device = cu_seqlens.device if device is None else torch.device(device)
    total = int(cu_seqlens[-1])
    rows = torch.arange(total, device=device, dtype=torch.int64)
    return key_ranges_for_rows(cu_seqlens.to(device), rows)


def unpack_sequences(packed: torch.Tensor, cu_seqlens: torch.Tensor) -> List[torch.Tensor]:
    """Splits a packed THD tensor back into its sequences.

    Args:
        packed: ``[T, *feature]``.
        cu_seqlens: integer ``[B+1]`` with ``cu_seqlens[-1] == T``.

    Returns:
        ``B`` views ``[S_b, *feature]`` of ``packed`` (differentiable).
    """
    host = check_cu_seqlens(cu_seqlens, packed.shape[0])
    return list(torch.split(packed, sequence_lengths(host).tolist(), dim=0))
