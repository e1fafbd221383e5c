"""A Megatron ``DSAttention`` subclass for what the hook seam of megatron-core 0.19.2 cannot reach.

Megatron's DSAttention skips the fully fused hook when IndexShare is on (``dsa_indexer_topk_freq >
1``), so its computing layers run the split path, and IndexShare with the dense indexer loss always
runs Megatron's O(S^2 * H) PyTorch loss. Megatron also logs the indexer loss at forward time, so a
hook cannot defer the loss to the backward. :class:`FlashDSAttention` fixes all three without
copying Megatron's forward: around ``DSAttention.forward`` it

- lets computing layers of an IndexShare model take the fused hook (the hook stores the layer's
  top-k in Megatron's IndexShare holder, so the following skip layers find it as usual), which also
  gives IndexShare + dense loss FlashDSA's fused dense KL (no S x S memory);
- with ``indexer_loss_in_backward=True`` (default), computes the sparse indexer loss inside the
  sparse MLA backward (:func:`flashdsa.sparse_mla_with_indexer_loss`: the target comes from the
  probabilities the backward forms anyway); the loss value is added to Megatron's indexer-loss
  tracker when the backward runs, i.e. before the training loop reduces and logs it, and its
  gradient uses the auto-scaler's loss scale read at backward time.

Select it with :func:`use_flashdsa_attention` on any layer spec that contains DSAttention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from megatron.core.transformer.experimental_attention_variant import dsa_kernels
from megatron.core.transformer.experimental_attention_variant.dsa import (
    DSAIndexerLossLoggingHelper,
    DSAttention,
)
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.spec_utils import ModuleSpec

from . import BACKEND_NAME
from . import hooks as _hooks

__all__ = ["FlashDSAttention", "use_flashdsa_attention"]


class FlashDSAttention(DSAttention):
    """Megatron ``DSAttention`` that runs FlashDSA's fused path also with IndexShare (see module doc).

    Behaves exactly like DSAttention unless ``config.dsa_kernel_backend == "flashdsa"``.

    Args:
        indexer_loss_in_backward: compute the sparse indexer loss in the MLA backward (the loss
            value reaches Megatron's tracker in the backward). Rows masked by
            ``real_token_mask_q`` and tensor parallelism use the forward-time loss instead.
        Other arguments: as DSAttention.
    """

    def __init__(self, *args: Any, indexer_loss_in_backward: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.indexer_loss_in_backward = bool(indexer_loss_in_backward)

    def _fused_index_share_reason(self, query: torch.Tensor, key: torch.Tensor,
                                  attn_mask_type: Optional[AttnMaskType]) -> Optional[str]:
        """Why this computing layer cannot take the fused hook under IndexShare (None = it can)."""
        if attn_mask_type != AttnMaskType.causal:
            return "an explicit attention mask"
        q4 = query if query.dim() == 4 else query.unsqueeze(1)
        k4 = key if key.dim() == 4 else key.unsqueeze(1)
        latent = int(getattr(self.config, "kv_lora_rank", 0) or 0)
        reason = _hooks._attention_reason(q4, k4, latent)
        if reason:
            return reason
        c = self.config
        probe = q4.new_empty((1, 1, int(c.dsa_indexer_n_heads), int(c.dsa_indexer_head_dim)))
        reason = _hooks._indexer_reason(probe, probe.new_empty((1, 1, probe.shape[-1])),
                                        probe.new_empty((1, 1, probe.shape[2])), int(self.index_topk))
        if reason:
            return reason
        tp = getattr(self.pg_collection, "tp", None)
        if tp is not None and tp.size() > 1:
            return "tensor parallelism"
        return None

    def _log_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Adds the backward-time loss value to Megatron's indexer-loss tracker; returns it unchanged."""
        tracker = DSAIndexerLossLoggingHelper.tracker
        values = tracker.get("values")
        if values is not None and self.layer_number is not None:
            values[self.layer_number - 1] += loss.detach().to(device=values.device, dtype=values.dtype)
        return loss

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: Optional[torch.Tensor],
                attention_mask: Optional[torch.Tensor], x: torch.Tensor, qr: torch.Tensor,
                position_ids: Optional[torch.Tensor] = None, attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Optional[torch.Tensor] = None, packed_seq_params: Any = None,
                up_v_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """DSAttention.forward (same arguments and result), with the FlashDSA options of this class."""
        call = lambda: super(FlashDSAttention, self).forward(  # noqa: E731
            query, key, value, attention_mask, x, qr, position_ids=position_ids, attn_mask_type=attn_mask_type,
            attention_bias=attention_bias, packed_seq_params=packed_seq_params, up_v_weight=up_v_weight)
        if self.config.dsa_kernel_backend != BACKEND_NAME or not dsa_kernels.use_fused_dsa_kernels(self.config):
            return call()
        options = _hooks._FusedCallOptions(layer_number=self.layer_number,
                                           loss_in_backward=self.indexer_loss_in_backward, log_loss=self._log_loss)
        flip_index_share = False
        if self.index_share and not self.skip_topk:
            reason = self._fused_index_share_reason(query, key, attn_mask_type)
            if reason is None:
                options.topk_holder = self._get_index_share_topk_holder(packed_seq_params, attention_mask)
                flip_index_share = True
            else:
                _hooks._decline("FlashDSAttention(index share fused)", reason)
        token = _hooks._CALL_OPTIONS.set(options)
        try:
            if flip_index_share:
                # DSAttention only tries the fused hook when index_share is off; the hook then stores
                # the top-k in the holder itself (options.topk_holder) for the skip layers.
                self.index_share = False
            output = call()
        finally:
            self.index_share = self.index_share or flip_index_share
            _hooks._CALL_OPTIONS.reset(token)
        if flip_index_share and self.layer_number not in options.topk_holder:
            raise RuntimeError(f"FlashDSAttention layer {self.layer_number}: the fused hook did not run, so no top-k "
                               "was stored for the IndexShare skip layers (see the flashdsa.megatron warning)")
        return output


def _replace(obj: Any, seen: set) -> Any:
    if id(obj) in seen:
        return obj
    seen.add(id(obj))
    if isinstance(obj, ModuleSpec):
        if obj.module is DSAttention:
            obj.module = FlashDSAttention
        _replace(obj.submodules, seen)
        return obj
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _replace(item, seen)
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            _replace(getattr(obj, field.name), seen)
    return obj


def use_flashdsa_attention(spec: Any, *, indexer_loss_in_backward: bool = True) -> Any:
    """Replaces Megatron's DSAttention by :class:`FlashDSAttention` in a layer / block spec, in place.

    Args:
        spec: a ModuleSpec, a list of them, or a TransformerBlockSubmodules (e.g. the result of
            ``get_transformer_block_with_experimental_attention_variant_spec``).
        indexer_loss_in_backward: passed to every FlashDSAttention (see the class).
    Returns:
        ``spec`` (modified in place).
    """
    _replace(spec, set())

    def set_param(obj: Any, seen: set) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, ModuleSpec):
            if obj.module is FlashDSAttention:
                obj.params = dict(obj.params or {}, indexer_loss_in_backward=indexer_loss_in_backward)
            set_param(obj.submodules, seen)
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                set_param(item, seen)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for field in dataclasses.fields(obj):
                set_param(getattr(obj, field.name), seen)

    set_param(spec, set())
    return spec
