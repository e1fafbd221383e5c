"""A small Megatron Core GPT with DSA attention, built by hand, for tests, the bench and the example.

Megatron's own DSA spec helpers need Transformer Engine; :func:`dsa_layer_spec` builds the same
layer (AbsorbedMLASelfAttention + DSAttention + DSAIndexer, RMSNorm, MLP) from Megatron's local
modules (``ColumnParallelLinear``, ``RowParallelLinear``, ``WrappedTorchNorm``), so the model runs on
CPUs (gloo) as well as GPUs. On a machine without CUDA, :func:`install_cpu_shim` makes Megatron's
RoPE and indexer-loss tracker (which allocate on ``torch.cuda.current_device()``) use the CPU.

Also here: the zigzag context-parallel split of a batch (SBHD per sequence, THD per document, as
Megatron's DSA expects with ``cp_comm_type="allgather"``), and one training step that returns the
LM loss, the indexer losses and the gradients.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import torch

__all__ = ["ModelShape", "build_config", "build_gpt", "dsa_layer_spec", "init_parallel", "install_cpu_shim",
           "make_batch", "split_batch_for_cp", "train_step", "eval_logits", "destroy_parallel"]


@dataclasses.dataclass
class ModelShape:
    """Sizes of the test model (defaults: tiny, CPU)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    q_lora_rank: Optional[int] = 32
    kv_lora_rank: int = 32          # D_v (latent); D_qk = kv_lora_rank + 64
    qk_head_dim: int = 16
    v_head_dim: int = 16
    indexer_heads: int = 4
    indexer_head_dim: int = 64      # >= qk_pos_emb_head_dim (the indexer's RoPE part)
    topk: int = 16
    vocab_size: int = 97
    ffn_hidden_size: int = 96


_cpu_shim_installed = False


def install_cpu_shim() -> None:
    """Without CUDA: Megatron's RoPE and indexer-loss tracker run on the CPU (test processes only).

    ``torch.cuda.current_device()`` returns the CPU device, and the CP slice of the RoPE table (which
    Megatron indexes with a CUDA tensor) is taken on the table's device.
    """
    global _cpu_shim_installed
    if _cpu_shim_installed or torch.cuda.is_available():
        return
    torch.cuda.current_device = lambda: torch.device("cpu")

    # Megatron's CP slice of the RoPE table builds its chunk index with .cuda(): the same slice on the CPU.
    from megatron.core.models.common.embeddings import rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding

    def pos_emb_on_this_cp_rank(pos_emb, seq_dim, cp_group):
        cp_size, cp_rank = cp_group.size(), cp_group.rank()
        chunks = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
        mine = torch.tensor([cp_rank, 2 * cp_size - 1 - cp_rank], device=pos_emb.device)
        chunks = chunks.index_select(seq_dim, mine)
        return chunks.view(*chunks.shape[:seq_dim], -1, *chunks.shape[seq_dim + 2:])

    for module in (rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding):
        module.get_pos_emb_on_this_cp_rank = pos_emb_on_this_cp_rank
    _cpu_shim_installed = True


def init_parallel(rank: int = 0, world_size: int = 1, cp: int = 1, *, init_file: Optional[str] = None,
                  backend: Optional[str] = None) -> None:
    """torch.distributed (gloo on CPU, nccl on CUDA) and Megatron's parallel state with CP = ``cp``."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if init_file is None:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            init_method = "env://"
        else:
            init_method = f"file://{init_file}"
        torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(context_parallel_size=cp)


def destroy_parallel() -> None:
    """Undoes :func:`init_parallel`."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build_config(shape: ModelShape, *, backend: str = "none", sparse_loss: bool = True, topk_freq: int = 1,
                 cp: int = 1, relu: bool = False, loss_coeff: float = 0.1, dtype: torch.dtype = torch.float32,
                 per_token_loss: bool = False, **overrides: Any):
    """An ``MLATransformerConfig`` with DSA (``experimental_attention_variant="dsa"``), local modules."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    if backend == "flashdsa":
        from . import register

        register()
    kwargs = dict(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
        ffn_hidden_size=shape.ffn_hidden_size, multi_latent_attention=True, q_lora_rank=shape.q_lora_rank,
        kv_lora_rank=shape.kv_lora_rank, qk_head_dim=shape.qk_head_dim, qk_pos_emb_head_dim=64,
        v_head_dim=shape.v_head_dim, rope_type="rope", rotary_base=10000, apply_rope_fusion=False,
        normalization="RMSNorm", qk_layernorm=True, add_bias_linear=False, transformer_impl="local",
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        use_cpu_initialization=True, perform_initialization=True, params_dtype=dtype,
        bf16=dtype == torch.bfloat16, pipeline_dtype=dtype, init_method_std=0.02,
        experimental_attention_variant="dsa", dsa_indexer_n_heads=shape.indexer_heads,
        dsa_indexer_head_dim=shape.indexer_head_dim, dsa_indexer_topk=shape.topk,
        dsa_indexer_topk_freq=topk_freq, dsa_indexer_loss_coeff=loss_coeff,
        dsa_indexer_use_sparse_loss=sparse_loss, dsa_kernel_backend=backend, dsa_indexer_rotate_activation=False,
        dsa_indexer_scoring_relu=relu, context_parallel_size=cp, cp_comm_type="allgather" if cp > 1 else "p2p",
        calculate_per_token_loss=per_token_loss,
    )
    kwargs.update(overrides)
    return MLATransformerConfig(**kwargs)


def dsa_layer_spec(*, flashdsa_attention: bool = False, indexer_loss_in_backward: bool = True):
    """A TransformerLayer spec: RMSNorm, AbsorbedMLASelfAttention(DSAttention, DSAIndexer), RMSNorm, MLP.

    ``flashdsa_attention=True`` uses :class:`flashdsa.megatron.FlashDSAttention` as core attention.
    """
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.experimental_attention_variant.absorbed_mla import (
        AbsorbedMLASelfAttention,
        AbsorbedMLASelfAttentionSubmodules,
    )
    from megatron.core.transformer.experimental_attention_variant.dsa import (
        DSAIndexer,
        DSAIndexerSubmodules,
        DSAttention,
        DSAttentionSubmodules,
    )
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    class DuplicatedLinear(ColumnParallelLinear):
        """ColumnParallelLinear that accepts (and, at TP = 1, needs nothing for) parallel_mode="duplicated"."""

        def __init__(self, *args: Any, parallel_mode: Optional[str] = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    indexer = ModuleSpec(module=DSAIndexer, submodules=DSAIndexerSubmodules(
        linear_wq_b=DuplicatedLinear, linear_wk=DuplicatedLinear, k_norm=WrappedTorchNorm,
        linear_weights_proj=DuplicatedLinear))
    core_attention = ModuleSpec(module=DSAttention, submodules=DSAttentionSubmodules(indexer=indexer))
    attention = ModuleSpec(
        module=AbsorbedMLASelfAttention, params={"attn_mask_type": AttnMaskType.causal},
        submodules=AbsorbedMLASelfAttentionSubmodules(
            linear_q_proj=ColumnParallelLinear, linear_q_down_proj=ColumnParallelLinear,
            linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=ColumnParallelLinear,
            linear_kv_up_proj=ColumnParallelLinear, core_attention=core_attention, linear_proj=RowParallelLinear,
            q_layernorm=WrappedTorchNorm, kv_layernorm=WrappedTorchNorm))
    spec = ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=WrappedTorchNorm, self_attention=attention, self_attn_bda=get_bias_dropout_add,
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                            linear_fc2=RowParallelLinear)),
        mlp_bda=get_bias_dropout_add))
    if flashdsa_attention:
        from .spec import use_flashdsa_attention

        use_flashdsa_attention(spec, indexer_loss_in_backward=indexer_loss_in_backward)
    return spec


def build_gpt(config, shape: ModelShape, *, seed: int = 1234, max_seq_len: int = 4096,
              flashdsa_attention: bool = False, indexer_loss_in_backward: bool = True):
    """GPTModel with :func:`dsa_layer_spec` layers; identical weights for identical ``seed``."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    torch.manual_seed(seed)
    model = GPTModel(config=config, transformer_layer_spec=dsa_layer_spec(
        flashdsa_attention=flashdsa_attention, indexer_loss_in_backward=indexer_loss_in_backward),
        vocab_size=shape.vocab_size, max_sequence_length=max_seq_len, position_embedding_type="none",
        share_embeddings_and_output_weights=False)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if config.bf16:
        # As Megatron's Float16Module does for bf16 training: every parameter in bf16. Megatron's own
        # DSAIndexer builds its k_norm LayerNorm in fp32, which fails on bf16 activations otherwise
        # (seen on the H200: "expected scalar type BFloat16 but found Float" in forward_before_topk).
        model = model.bfloat16()
    return model.to(device)


def make_batch(seq_lens: list[int], vocab_size: int, *, thd: bool, seed: int = 0, device=None) -> dict:
    """A global batch: token ids and shifted labels, SBHD ([b, s], equal lengths) or THD (packed, b = 1)."""
    g = torch.Generator().manual_seed(seed)
    if thd:
        total = sum(seq_lens)
        tokens = torch.randint(0, vocab_size, (1, total + 1), generator=g)
        cu = torch.tensor([0] + list(seq_lens), dtype=torch.int64).cumsum(0).to(torch.int32)
        pos = torch.cat([torch.arange(n) for n in seq_lens]).unsqueeze(0)
        batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "position_ids": pos, "cu_seqlens": cu}
    else:
        if len(set(seq_lens)) != 1:
            raise ValueError("SBHD batches need equal sequence lengths")
        b, s = len(seq_lens), seq_lens[0]
        tokens = torch.randint(0, vocab_size, (b, s + 1), generator=g)
        batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:],
                 "position_ids": torch.arange(s).unsqueeze(0).expand(b, s), "cu_seqlens": None}
    if device is not None:
        batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    return batch


def _zigzag_positions(length: int, cp: int, rank: int) -> torch.Tensor:
    if length % (2 * cp):
        raise ValueError(f"sequence length {length} must be a multiple of 2 * cp = {2 * cp}")
    chunk = length // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


def split_batch_for_cp(batch: dict, cp: int, rank: int) -> dict:
    """This CP rank's tokens: zigzag halves of every sequence (SBHD) or of every document (THD)."""
    if cp == 1:
        return dict(batch)
    out = dict(batch)
    if batch["cu_seqlens"] is None:
        rows = _zigzag_positions(batch["input_ids"].shape[1], cp, rank).to(batch["input_ids"].device)
    else:
        cu = batch["cu_seqlens"].tolist()
        rows = torch.cat([cu[i] + _zigzag_positions(cu[i + 1] - cu[i], cp, rank)
                          for i in range(len(cu) - 1)]).to(batch["input_ids"].device)
    for key in ("input_ids", "labels", "position_ids", "real_token_mask"):
        if batch.get(key) is not None:
            out[key] = batch[key].index_select(1, rows)
    return out


def _packed_params(batch: dict, device):
    from megatron.core.packed_seq_params import PackedSeqParams

    if batch.get("cu_seqlens") is None:
        return None
    cu = batch["cu_seqlens"].to(device=device, dtype=torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max())
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                             cu_seqlens_kv_padded=cu, max_seqlen_q=max_len, max_seqlen_kv=max_len)
    if batch.get("real_token_mask") is not None:  # Megatron reads it with getattr (DSA loss rows)
        packed.real_token_mask_q = batch["real_token_mask"].to(device).reshape(-1)
    return packed


def eval_logits(model, batch: dict) -> torch.Tensor:
    """Inference forward (``model.eval()``, no grad): the logits [b, s, vocab]."""
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        return model(batch["input_ids"], batch["position_ids"], None,
                     packed_seq_params=_packed_params(batch, device)).float()


def train_step(model, batch: dict, *, zero_grad: bool = True) -> dict:
    """One forward + backward; returns the local LM loss (mean over local tokens), indexer losses, grads.

    A THD batch may carry ``real_token_mask`` [1, T] (bool): it becomes
    ``packed_seq_params.real_token_mask_q``, the query rows Megatron's indexer loss counts.

    The indexer losses are Megatron's tracker values per layer (what the training loop logs, before
    its cross-rank reduction) read after the backward.
    """
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

    num_layers = model.config.num_layers
    device = next(model.parameters()).device
    tracker = DSAIndexerLossLoggingHelper.tracker
    tracker["values"] = torch.zeros(num_layers, device=device)
    if zero_grad:
        for p in model.parameters():
            p.grad = None
    packed = _packed_params(batch, device)
    model.train()
    losses = model(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"],
                   packed_seq_params=packed)
    lm_loss = losses.float().mean()
    lm_loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"lm_loss": lm_loss.detach(), "indexer_loss": tracker["values"].detach().clone(), "grads": grads}
