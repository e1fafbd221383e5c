"""IndexShare (docs/spec.md §8): layers that reuse the top-k indices of an earlier layer.

A model declares, per layer, ``"full"`` (runs the indexer, top-k and the KL loss) or ``"shared"``
(reuses the indices of the nearest preceding full layer: no indexer parameters, no indexer work,
no KL loss). The layers of one forward pass hand indices along through an
:class:`IndexShareContext`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

__all__ = [
    "index_share_pattern",
    "check_index_share_pattern",
    "IndexShareContext",
]

FULL = "full"
SHARED = "shared"
_MODES = (FULL, SHARED)


def index_share_pattern(num_layers: int, topk_freq: int = 1, skip_topk_offset: int = 0) -> List[str]:
    """Per-layer IndexShare modes from Megatron's knobs.

    Megatron's ``dsa_indexer_topk_freq`` / ``dsa_indexer_skip_topk_offset``: the 1-based layer
    ``L`` reuses indices (``"shared"``) when ``max(L - max(offset, 1), 0) % freq != 0``, else it
    computes them (``"full"``). So the first ``max(offset, 1)`` layers are full, then one full
    layer every ``freq`` layers.

    Args:
        num_layers: number of layers (>= 1).
        topk_freq: compute the indexer every ``topk_freq`` layers (>= 1; 1 = every layer full).
        skip_topk_offset: number of leading layers that are always full.

    Returns:
        list of ``num_layers`` strings, each ``"full"`` or ``"shared"``.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if topk_freq < 1:
        raise ValueError(f"topk_freq must be >= 1, got {topk_freq}")
    if skip_topk_offset < 0:
        raise ValueError(f"skip_topk_offset must be >= 0, got {skip_topk_offset}")
    first = max(skip_topk_offset, 1)
    return [
        SHARED if max(layer - first, 0) % topk_freq != 0 else FULL
        for layer in range(1, num_layers + 1)
    ]


def check_index_share_pattern(pattern: Sequence[str]) -> List[str]:
    """Validates a per-layer pattern and returns it as a list.

    Raises:
        ValueError: on an unknown mode, or when a ``"shared"`` layer has no preceding full layer.
    """
    pattern = list(pattern)
    for i, mode in enumerate(pattern):
        if mode not in _MODES:
            raise ValueError(f"layer {i}: index_share mode must be 'full' or 'shared', got {mode!r}")
    if pattern and pattern[0] == SHARED:
        raise ValueError(
            "layer 0 is 'shared' but no preceding layer is 'full': a shared layer reuses the "
            "indices of the nearest preceding full layer"
        )
    return pattern


class IndexShareContext:
    """Carries the top-k indices from full layers to the shared layers that follow them.

    Create one per forward pass (per micro-batch) and pass it to every DSA layer: a full layer
    stores its indices with :meth:`publish`, a shared layer reads them with :meth:`fetch`.

    Attributes:
        indices: int32 ``[T, K]`` indices of the latest full layer, or None.
        source_layer: identifier of the layer that published them, or None.
    """

    def __init__(self) -> None:
        self.indices: Optional[torch.Tensor] = None
        self.source_layer: Optional[object] = None

    def publish(self, indices: torch.Tensor, layer: Optional[object] = None) -> None:
        """Stores the indices of a full layer (int32 ``[T, K]``; kept without a copy)."""
        self.indices = indices
        self.source_layer = layer

    def fetch(self, num_tokens: int, layer: Optional[object] = None) -> torch.Tensor:
        """Indices for a shared layer.

        Args:
            num_tokens: query rows of the shared layer; must match the published indices.
            layer: identifier of the shared layer, for error messages.

        Raises:
            RuntimeError: when no full layer ran before in this context, or on a row mismatch.
        """
        who = "shared layer" if layer is None else f"shared layer {layer}"
        if self.indices is None:
            raise RuntimeError(
                f"{who} has no preceding 'full' layer in this IndexShareContext: a shared layer "
                "reuses the indices of the nearest preceding full layer, so a full layer must run "
                "first in the same forward pass (with the same context object)"
            )
        if self.indices.shape[0] != num_tokens:
            raise RuntimeError(
                f"{who} has {num_tokens} query rows but the indices from layer {self.source_layer} "
                f"have {self.indices.shape[0]} rows"
            )
        return self.indices

    def reset(self) -> None:
        """Forgets the stored indices (start of a new forward pass)."""
        self.indices = None
        self.source_layer = None
