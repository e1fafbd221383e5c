#!/usr/bin/env python3
"""Train a small GLM-5-style DSA decoder on long-range key-value recall; optional parity run.

Model: absorbed-MLA attention through flashdsa's DSA layer (lightning indexer + top-k + sparse MLA
+ indexer KL loss), RoPE, IndexShare (one full layer in every ``--topk-freq``), a tiny MLP.
Task (generated here, no downloads): packed variable-length sequences, each a context of
``key value`` pairs among filler tokens followed by queries ``key -> value`` about pairs hundreds
(CPU size) to thousands (GPU size) of positions back. Only the answers are scored.

Logged per step: LM loss, indexer KL loss, gradient norm, task accuracy, and each full layer's
top-k recall: the fraction of queries whose top-k holds the queried pair (its value token, the
row the answer is read from; the generator knows it).

    python examples/train_recall.py                                    # CPU size, ~4 min on 2 cores
    python examples/train_recall.py --device cuda --time-limit 10      # H200: 16K tokens/step, bf16
    python examples/train_recall.py --parity                           # fused vs plain PyTorch, 200 steps

Writes to ``--out``: ``train.png`` and ``metrics.json``; with ``--parity``: ``parity.png`` (both
runs' curves overlaid and their relative difference) and ``parity.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

import flashdsa
from flashdsa import reference

ROPE_DIM = reference.ROPE_WIDTH  # RoPE width of the main attention: the kernels take D_qk = D_v + 64


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass
class Config:
    """Everything that defines a run; ``PRESETS`` holds the CPU and CUDA sizes."""

    # task
    tokens: int = 1024  # packed tokens per step (T)
    min_len: int = 128  # sequence lengths are drawn uniformly from [min_len, max_len]
    max_len: int = 384
    num_keys: int = 64  # key tokens; keys are unique within a sequence
    num_values: int = 16  # value tokens: chance accuracy is 1 / num_values
    num_fillers: int = 32  # distractor filler tokens
    query_every: int = 8  # one query per this many tokens of a sequence
    distractor_pairs: float = 0.25  # unqueried pairs per queried pair in the context
    context_frac: float = 0.5  # the pairs lie in this leading fraction of each sequence
    # model
    d_model: int = 128
    layers: int = 4
    heads: int = 4  # H
    d_latent: int = 64  # D_v, the latent (c_kv) width; D_qk = D_v + 64
    d_nope: int = 16  # per-head q_nope width, absorbed into the latent through W_uk
    d_head_v: int = 32  # per-head value width after W_uv
    idx_heads: int = 8  # H_I
    idx_dim: int = 64  # D_I
    idx_rope: int = 32  # indexer dims with RoPE (the first ones)
    topk: int = 32  # K
    topk_freq: int = 2  # IndexShare: one full layer every topk_freq layers
    mlp_mult: int = 2
    loss_coeff: float = 1.0  # indexer KL loss coefficient of the full layers
    selection: str = "bf16"  # the indexer's selection pass: "bf16" (exact) or "fp8" (fused core only)
    # training
    steps: int = 1500
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0

    @property
    def d_qk(self) -> int:
        return self.d_latent + ROPE_DIM


PRESETS: Dict[str, Config] = {
    # 2-core CPU, fp32: queries 100-380 positions after their pair, K = 32.
    "cpu": Config(),
    # H200, bf16, the kernels' shapes (D_qk = 576, D_v = 512, H = 16, H_I = 32, D_I = 64) on the
    # CPU preset's task, 16x the sequences per step, K = 64 (the kernels need a multiple of 64).
    # lr 1e-3: at these model dims 3e-3 and 2e-3 stay at the ln(#values) plateau, on the CPU
    # backend as on the GPU (docs/training.md); 1e-3 learns on the CPU backend.
    # Longer range (pairs thousands of rows back), not yet seen to learn: --min-len 2048
    # --max-len 8192 --num-keys 512 --num-values 64 --num-fillers 64 --query-every 32 --topk 512.
    "cuda": Config(
        tokens=16384, d_model=512, heads=16, d_latent=512, d_nope=64, d_head_v=64,
        idx_heads=32, idx_dim=64, idx_rope=32, topk=64, steps=3000, lr=1e-3, warmup=50,
    ),
}


# ---------------------------------------------------------------------------------------------
# Data: packed key-value recall


class Vocab(NamedTuple):
    """Token ids: BOS, then the fillers, the keys and the values."""

    bos: int
    filler0: int
    key0: int
    value0: int
    size: int

    @staticmethod
    def of(cfg: Config) -> "Vocab":
        key0 = 1 + cfg.num_fillers
        value0 = key0 + cfg.num_keys
        return Vocab(0, 1, key0, value0, value0 + cfg.num_values)


class Batch(NamedTuple):
    tokens: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T], position inside the token's sequence
    cu_seqlens: torch.Tensor  # int32 [B+1], stays on the CPU (the layer reads it on the host)
    answer_rows: torch.Tensor  # int64 [N], the query keys: their next token is the answer
    answers: torch.Tensor  # int64 [N], value token to predict at each answer row
    relevant_rows: torch.Tensor  # int64 [N], row of the queried pair's value token
    visible: torch.Tensor  # int64 [N], keys visible to each answer row (for the chance recall)

    def to(self, device) -> "Batch":
        moved = {k: v.to(device) for k, v in self._asdict().items() if k != "cu_seqlens"}
        return Batch(cu_seqlens=self.cu_seqlens, **moved)


def split_lengths(total: int, lo: int, hi: int, gen: torch.Generator) -> List[int]:
    """Sequence lengths in [lo, hi] (uniform while the rest allows) that sum to ``total``."""
    lengths = []
    remaining = total
    while remaining > hi:
        top = min(hi, remaining - lo)  # leave at least lo tokens for the next sequence
        n = int(torch.randint(lo, top + 1, (1,), generator=gen)) if top >= lo else remaining // 2
        lengths.append(n)
        remaining -= n
    return lengths + [remaining]


def make_sequence(cfg: Config, vocab: Vocab, length: int, gen: torch.Generator):
    """One sequence: ``BOS``; ``key value`` pairs at random slots among fillers in its first
    ``context_frac``; more fillers; then the query region (its last ``2·n_q`` tokens): ``key value``
    again for ``n_q`` of the pairs, in random order, so every pair lies at least
    ``(1 − context_frac)·L − 2·n_q`` rows before its query.
    Returns tokens [L], query key positions [n_q], their pairs' value positions [n_q].
    """
    n_q = max(1, length // cfg.query_every)
    n_pairs = n_q + round(n_q * cfg.distractor_pairs)
    context = min(int(cfg.context_frac * length), length - 2 * n_q) - 1  # pairs lie in rows 1 .. context
    if n_pairs > cfg.num_keys or 2 * n_pairs > context:
        raise ValueError(f"a sequence of {length} tokens needs {n_pairs} pairs: "
                         "raise num_keys, query_every or context_frac")
    seq = vocab.filler0 + torch.randint(cfg.num_fillers, (length,), generator=gen)
    seq[0] = vocab.bos
    key_pos = 1 + 2 * torch.randperm(context // 2, generator=gen)[:n_pairs]
    keys = vocab.key0 + torch.randperm(cfg.num_keys, generator=gen)[:n_pairs]
    values = vocab.value0 + torch.randint(cfg.num_values, (n_pairs,), generator=gen)
    seq[key_pos], seq[key_pos + 1] = keys, values
    asked = torch.randperm(n_pairs, generator=gen)[:n_q]
    query_pos = length - 2 * n_q + 2 * torch.arange(n_q)
    seq[query_pos], seq[query_pos + 1] = keys[asked], values[asked]
    return seq, query_pos, key_pos[asked] + 1


def make_batch(cfg: Config, vocab: Vocab, gen: torch.Generator) -> Batch:
    """A packed batch of exactly ``cfg.tokens`` tokens, on the CPU."""
    lengths = split_lengths(cfg.tokens, cfg.min_len, cfg.max_len, gen)
    parts = {k: [] for k in ("tokens", "positions", "answer_rows", "answers", "relevant_rows", "visible")}
    offset = 0
    for n in lengths:
        seq, query_pos, value_pos = make_sequence(cfg, vocab, n, gen)
        parts["tokens"].append(seq)
        parts["positions"].append(torch.arange(n))
        parts["answer_rows"].append(offset + query_pos)
        parts["answers"].append(seq[query_pos + 1])
        parts["relevant_rows"].append(offset + value_pos)
        parts["visible"].append(query_pos + 1)
        offset += n
    return Batch(cu_seqlens=flashdsa.cu_seqlens_from_lengths(lengths), **{k: torch.cat(v) for k, v in parts.items()})


def describe_task(cfg: Config) -> str:
    """Distances from the queries back to their pairs, and chance levels, on one sample batch."""
    batch = make_batch(cfg, Vocab.of(cfg), torch.Generator().manual_seed(cfg.seed + 2))
    dist = (batch.answer_rows - batch.relevant_rows).float()
    chance_recall = float((cfg.topk / batch.visible.float()).clamp(max=1).mean())
    return (f"{len(batch.answers)} queries/step, {len(batch.cu_seqlens) - 1} sequences; query-to-pair distance "
            f"min {dist.min():.0f} median {dist.median():.0f} max {dist.max():.0f}; chance accuracy "
            f"{1 / cfg.num_values:.3f}, recall of a random top-{cfg.topk} {chance_recall:.3f}")


# ---------------------------------------------------------------------------------------------
# Plain-PyTorch reference of the DSA attention core (the parity baseline)
#
# The math of flashdsa.dsa_attention: a threshold top-k (the CPU kernel's tie rule) over dense
# masked scores, then flashdsa.reference's sparse MLA and sparse KL loss, accumulated in fp32 like
# the kernels (fp64 for fp64 activations).


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype == torch.float64 else t.float()


def reference_topk(q_idx, k_idx, weights, k_start, k_end, topk: int, relu: bool = True,
                   chunk_elems: int = 1 << 22) -> torch.Tensor:
    """Indexer top-k (docs/spec.md §3) with the CPU backend's selection rule. No gradient.

    ``score(t, s) = Σ_h w[t,h]·f(q_idx[t,h]·k_idx[s])`` for ``s`` in ``[k_start, k_end)``; keeps
    the K largest, ties to the smaller key; writes them in increasing key order, then ``-1``.
    Query rows go in chunks of about ``chunk_elems`` scores. Returns int32 ``[T, K]``.
    """
    T, H_I, _ = q_idx.shape
    T_kv = k_idx.shape[0]
    keys = torch.arange(T_kv, device=q_idx.device)
    k = _acc(k_idx)
    rows = max(1, chunk_elems // T_kv)
    out = []
    for lo in range(0, T, rows):
        hi = min(T, lo + rows)
        q, w = _acc(q_idx[lo:hi]), _acc(weights[lo:hi])
        # flashdsa.reference.indexer_logits, but one head at a time, summed in the CPU kernel's
        # order (the top-k must equal the kernel's bit for bit) and without a [rows, H_I, T_kv] temporary.
        scores = torch.zeros(hi - lo, T_kv, dtype=k.dtype, device=k.device)  # [rows, T_kv]
        for h in range(H_I):
            dots = q[:, h] @ k.T
            scores += w[:, h, None] * (dots.relu() if relu else dots)
        visible = reference.range_mask(k_start[lo:hi], k_end[lo:hi], T_kv)
        scores = scores.masked_fill(~visible, float("-inf"))
        # Keys above the K-th score are in; keys equal to it fill the rest, smaller keys first.
        kth = scores.topk(min(topk, T_kv), dim=1).values[:, -1:]
        above = scores > kth
        tied = visible & (scores == kth)
        chosen = above | (tied & (tied.cumsum(1) <= topk - above.sum(1, keepdim=True)))
        slot = torch.where(chosen, chosen.cumsum(1) - 1, topk)  # column topk collects the rest
        idx = torch.full((hi - lo, topk + 1), -1, dtype=torch.long, device=k.device)
        idx.scatter_(1, slot, keys.expand(hi - lo, -1))
        out.append(idx[:, :topk].to(torch.int32))
    return torch.cat(out)


class ReferenceDSAAttention(nn.Module):
    """Plain-PyTorch stand-in for :class:`flashdsa.DSAAttention` (sparse KL formulation).

    Uses the same :class:`flashdsa.IndexShareContext` for IndexShare and attaches the KL loss with
    the same :class:`flashdsa.DSAIndexerLossAutoScaler`. A full layer can be told to use given
    indices in its next forward (:meth:`use_indices`): it still computes its own top-k and counts
    the rows where the two differ (``last_topk_mismatch``).
    """

    def __init__(self, topk: int, scale: float, *, index_share: str = "full",
                 loss_coeff: Optional[float] = None, layer_id=None):
        super().__init__()
        # The kernels take the softmax scale as fp32 (include/flashdsa/ops.h): round it alike, or
        # fp64 runs would differ by that rounding (~1e-8).
        self.scale = float(torch.tensor(scale, dtype=torch.float32))
        self.topk, self.index_share = topk, index_share
        self.loss_coeff, self.layer_id = loss_coeff, layer_id
        self.last_indexer_loss: Optional[torch.Tensor] = None
        self.last_topk_mismatch: Optional[torch.Tensor] = None  # rows whose own top-k differs
        self._given: Optional[torch.Tensor] = None

    def use_indices(self, indices: torch.Tensor) -> None:
        """Makes the next forward of this full layer attend to ``indices [T, K]``."""
        self._given = indices

    def forward(self, q, kv, cu_seqlens, q_idx=None, k_idx=None, weights=None, *, index_share_ctx=None):
        """Same contract as :meth:`flashdsa.DSAAttention.forward`."""
        with torch.autocast(q.device.type, enabled=False):  # keep the fp32 accumulation
            if self.index_share == "shared":
                indices = index_share_ctx.fetch(q.shape[0], layer=self.layer_id)
            else:
                k_start, k_end = flashdsa.build_key_ranges(cu_seqlens, device=q.device)
                with torch.no_grad():
                    indices = reference_topk(q_idx, k_idx, weights, k_start, k_end, self.topk)
                if self._given is not None:
                    # Compare as sets: the CUDA top-k writes a row in no particular order.
                    same = indices.sort(dim=1).values == self._given.sort(dim=1).values
                    self.last_topk_mismatch = (~same).any(dim=1).sum()
                    indices, self._given = self._given, None
                if index_share_ctx is not None:
                    index_share_ctx.publish(indices, layer=self.layer_id)
            # The math of flashdsa.reference (docs/spec.md §4, §6), accumulated like the kernels.
            acc = torch.float64 if q.dtype == torch.float64 else torch.float32
            out, _, probs = reference.sparse_mla_probs(q, kv, indices, self.scale, acc)
            out = out.to(q.dtype)
            loss = None
            if self.loss_coeff is not None:
                # Target: the head-summed attention mass of the top-k (detached; the kernels
                # recompute it from q, kv and lse); coeff · mean over rows with a non-empty support.
                rows = reference.sparse_kl_rows(q_idx, k_idx, weights, indices, probs.detach().sum(dim=1),
                                                True, acc)
                nonempty = reference.valid_slots(indices, k_idx.shape[0]).any(dim=1)
                loss = self.loss_coeff * rows.sum() / nonempty.sum().clamp_min(1)
                if torch.is_grad_enabled():
                    out = flashdsa.DSAIndexerLossAutoScaler.apply(out, loss)
                loss = loss.detach()
        self.last_indexer_loss = loss
        return flashdsa.DSAAttentionOutput(out, indices, loss)


ATTENTION_CORES: Dict[str, Callable[..., nn.Module]] = {
    "fused": flashdsa.DSAAttention,
    "reference": ReferenceDSAAttention,
}


# ---------------------------------------------------------------------------------------------
# Dense attention (the dense stages of examples/train_long.py)


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """Causal softmax attention inside each packed sequence, by torch SDPA's flash or
    memory-efficient kernels only (never the math path, which would materialize ``[L, L]`` scores).

    ``q, k [T, H, D]``, ``v [T, H, D_v]`` (``D_v <= D``; zero-padded to ``D`` for the flash
    kernels), ``cu_seqlens`` int ``[B+1]`` on the host. Returns ``[T, H, D_v]``. Sequences of one
    length run as one batch, others one by one.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.dim() != 3 or k.shape != q.shape or v.shape[:2] != q.shape[:2] or v.shape[-1] > q.shape[-1]:
        raise ValueError(f"q, k must be [T, H, D] and v [T, H, D_v <= D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    d_v = v.shape[-1]
    if d_v < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - d_v))
    cu = [int(c) for c in cu_seqlens.tolist()]
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]

    def attend(qs, ks, vs):  # [B, L, H, D] each -> [B, L, H, D]
        o = F.scaled_dot_product_attention(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2),
                                           is_causal=True, scale=scale)
        return o.transpose(1, 2)

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        if len(set(lengths)) == 1:
            B, L = len(lengths), lengths[0]
            out = attend(*(t.reshape(B, L, *t.shape[1:]) for t in (q, k, v))).reshape(q.shape)
        else:
            out = torch.cat([attend(q[a:b][None], k[a:b][None], v[a:b][None])[0] for a, b in zip(cu[:-1], cu[1:])])
    return out[..., :d_v]


def sample_rows(num_rows: int, fraction: float, device) -> Optional[torch.Tensor]:
    """A uniform random subset of ``ceil(fraction · num_rows)`` query rows, increasing (None = all).

    The dense KL loss of a subset is an unbiased estimate of the mean over all rows at that
    fraction of the cost (the kernel works per query row over all its visible keys).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"kl_rows must be in (0, 1], got {fraction}")
    if fraction >= 1:
        return None
    n = max(1, math.ceil(fraction * num_rows))
    return torch.randperm(num_rows, device=device)[:n].sort().values


# ---------------------------------------------------------------------------------------------
# Model: a small GLM-5-style decoder


class RMSNorm(nn.Module):
    """RMS normalization over the last dim (computed in fp32, or fp64), with a learned gain."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _acc(x)
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Rope(NamedTuple):
    """Rotary tables ``cos, sin [T, dim/2]`` for one width; non-interleaved (rotate-half) pairs."""

    cos: torch.Tensor
    sin: torch.Tensor

    @staticmethod
    def of(positions: torch.Tensor, dim: int, theta: float = 10000.0) -> "Rope":
        inv_freq = theta ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
        angles = positions.float()[:, None] * inv_freq[None, :]
        return Rope(angles.cos(), angles.sin())

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotates the first ``dim`` channels of ``x [T, C]`` or ``[T, heads, C]``; keeps the rest."""
        dim = 2 * self.cos.shape[-1]
        cos, sin = (t if x.dim() == 2 else t[:, None, :] for t in (self.cos, self.sin))
        x1, x2 = _acc(x[..., : dim // 2]), _acc(x[..., dim // 2: dim])
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([rotated, x[..., dim:]], dim=-1) if dim < x.shape[-1] else rotated


class Indexer(nn.Module):
    """Lightning-indexer projections (DeepSeek-V3.2 style): q_idx, LayerNorm'd k_idx, head weights.

    Its input is detached, as in DeepSeek-V3.2: the indexer learns only from its KL loss, the
    language model only from the LM loss.
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.heads, self.dim = cfg.idx_heads, cfg.idx_dim
        self.q = nn.Linear(cfg.d_model, cfg.idx_heads * cfg.idx_dim, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.idx_dim, bias=False)
        self.k_norm = nn.LayerNorm(cfg.idx_dim)
        self.w = nn.Linear(cfg.d_model, cfg.idx_heads, bias=False)

    def forward(self, x: torch.Tensor, rope: Rope, act_dtype: torch.dtype):
        """``x [T, d]`` → ``q_idx [T, H_I, D_I]``, ``k_idx [T, D_I]`` (act dtype), ``weights [T, H_I]``
        (fp32; fp64 in fp64 runs)."""
        x = x.detach()
        q_idx = rope.apply(self.q(x).unflatten(-1, (self.heads, self.dim)))
        k_idx = rope.apply(self.k_norm(self.k(x)))
        weights = _acc(self.w(x)) * (self.heads * self.dim) ** -0.5  # scale factors folded in
        return q_idx.to(act_dtype), k_idx.to(act_dtype), weights


class MLAttention(nn.Module):
    """Absorbed MLA with DSA: ``q = [q_nope·W_uk, RoPE(q_rope)]``, ``kv = [RMSNorm(c_kv), RoPE(k_rope)]``.

    The attention core (the fused flashdsa layer or the reference) returns the latent output
    ``[T, H, D_v]``; W_uv lifts it to per-head values and W_o back to the model width.
    """

    def __init__(self, cfg: Config, mode: str, layer_id: int, core: Callable[..., nn.Module]):
        super().__init__()
        d, H = cfg.d_model, cfg.heads
        self.heads, self.d_nope = H, cfg.d_nope
        self.q_nope = nn.Linear(d, H * cfg.d_nope, bias=False)
        self.q_rope = nn.Linear(d, H * ROPE_DIM, bias=False)
        self.w_uk = nn.Parameter(torch.randn(H, cfg.d_nope, cfg.d_latent) * cfg.d_nope ** -0.5)
        self.kv_down = nn.Linear(d, cfg.d_latent, bias=False)
        self.kv_norm = RMSNorm(cfg.d_latent)
        self.k_rope = nn.Linear(d, ROPE_DIM, bias=False)
        self.w_uv = nn.Parameter(torch.randn(H, cfg.d_latent, cfg.d_head_v) * cfg.d_latent ** -0.5)
        self.o_proj = nn.Linear(H * cfg.d_head_v, d, bias=False)
        full = mode == "full"
        self.indexer = Indexer(cfg) if full else None
        # MLA's softmax scale: the un-absorbed q·k has d_nope + 64 dims.
        self.scale = (d_nope_scale := (cfg.d_nope + ROPE_DIM) ** -0.5)
        self.topk, self.loss_coeff = cfg.topk, cfg.loss_coeff
        # The FP8 selection pass is an option of the fused core (flashdsa.DSAAttention) only.
        selection = {} if cfg.selection == "bf16" else {"selection": cfg.selection}
        if selection and core is not flashdsa.DSAAttention:
            raise ValueError(f"--selection {cfg.selection} needs the fused backend")
        self.selection = cfg.selection
        self.core = core(cfg.topk, d_nope_scale, index_share=mode,
                         loss_coeff=cfg.loss_coeff if full else None, layer_id=layer_id, **selection)
        # How the main attention runs (see set_attention): "sparse" = the DSA core over the top-k;
        # "dense" = causal attention over every visible key (torch SDPA), the indexer trained by the
        # fused dense KL loss when dense_kl is set (examples/train_long.py, the dense warm-up).
        self.attention, self.dense_kl, self.kl_rows = "sparse", False, 1.0
        self.last_indexer_loss: Optional[torch.Tensor] = None  # plain KL times coeff, detached
        self.pending_indexer_loss: Optional[torch.Tensor] = None  # dense KL with grad, for the step's backward

    def forward(self, x, cu_seqlens, rope_main: Rope, rope_idx: Rope, ctx, act_dtype):
        """``x [T, d]`` → ``[T, d]`` and the top-k indices ``[T, K]`` this layer used (dense
        attention: the indexer's top-k of a full layer, for the metrics; None for a shared layer)."""
        q_nope = self.q_nope(x).unflatten(-1, (self.heads, self.d_nope))
        q_pe = rope_main.apply(self.q_rope(x).unflatten(-1, (self.heads, ROPE_DIM)))
        c_kv = self.kv_norm(self.kv_down(x))
        k_pe = rope_main.apply(self.k_rope(x))
        idx = self.indexer(x, rope_idx, act_dtype) if self.indexer is not None else ()
        if self.attention == "dense":
            return self._forward_dense(q_nope, q_pe, c_kv, k_pe, idx, cu_seqlens, act_dtype)
        q, kv = self._absorbed(q_nope, q_pe, c_kv, k_pe, act_dtype)
        res = self.core(q, kv, cu_seqlens, *idx, index_share_ctx=ctx)
        self.last_indexer_loss, self.pending_indexer_loss = res.indexer_loss, None
        heads = torch.einsum("thc,hcv->thv", res.out, self.w_uv)  # [T, H, d_head_v]
        return self.o_proj(heads.flatten(1)), res.indices

    def _absorbed(self, q_nope, q_pe, c_kv, k_pe, act_dtype):
        """The DSA kernels' operands: ``q = [q_nope·W_uk, q_pe]`` ``[T, H, D_qk]``, ``kv = [c_kv, k_pe]`` ``[T, D_qk]``."""
        q_latent = torch.einsum("thn,hnc->thc", q_nope, self.w_uk)
        q = torch.cat([q_latent.to(q_pe.dtype), q_pe], dim=-1).to(act_dtype)
        return q, torch.cat([c_kv.to(act_dtype), k_pe.to(act_dtype)], dim=-1)

    def _forward_dense(self, q_nope, q_pe, c_kv, k_pe, idx, cu_seqlens, act_dtype):
        """Dense causal MLA, un-absorbed (head dim ``d_nope + 64``: the flash kernels' sizes) with
        the same parameters and the same function as the absorbed sparse path with every visible
        key selected: ``k_nope = W_uk·c_kv``, ``v = c_kv·W_uv`` per head.

        A full layer also runs its indexer's top-k (no gradient; the recall metric) and, with
        ``dense_kl``, the fused dense KL loss (:func:`flashdsa.indexer_kl_loss`,
        ``formulation="dense"``: its target is this attention's head-averaged softmax over all
        visible keys, recomputed inside the kernel from the absorbed ``q``, ``kv``; no ``[T, T]``
        tensor) on a random ``kl_rows`` fraction of the query rows. That loss is kept in
        ``pending_indexer_loss`` for the step's backward (it is not attached to the output: in the
        dense warm-up the rest of the model is frozen, and its backward would be wasted work).
        """
        k_nope = torch.einsum("hnc,tc->thn", self.w_uk, c_kv)  # [T, H, d_nope]
        q_d = torch.cat([q_nope.to(act_dtype), q_pe.to(act_dtype)], dim=-1)  # [T, H, d_nope + 64]
        k_d = torch.cat([k_nope.to(act_dtype), k_pe.to(act_dtype)[:, None, :].expand(-1, self.heads, -1)], dim=-1)
        v = torch.einsum("tc,hcv->thv", c_kv, self.w_uv).to(act_dtype)  # [T, H, d_head_v]
        heads = dense_causal_attention(q_d, k_d, v, cu_seqlens, self.scale)
        indices, self.last_indexer_loss, self.pending_indexer_loss = None, None, None
        if self.indexer is not None:
            q_idx, k_idx, weights = idx
            k_start, k_end = flashdsa.build_key_ranges(cu_seqlens, device=q_d.device)
            with torch.no_grad():
                indices, _ = flashdsa.indexer_topk(q_idx, k_idx, weights, k_start, k_end, self.topk,
                                                   selection=self.selection)
            if self.dense_kl:
                with torch.no_grad():
                    q, kv = self._absorbed(q_nope, q_pe, c_kv, k_pe, act_dtype)
                rows = (self.kl_rows.to(q.device) if torch.is_tensor(self.kl_rows)  # given rows (train_long.py)
                        else sample_rows(q.shape[0], self.kl_rows, q.device))
                pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
                loss = flashdsa.indexer_kl_loss(
                    pick(q_idx), k_idx, pick(weights), formulation="dense", coeff=self.loss_coeff,
                    q=pick(q), kv=kv, scale=self.scale, k_start=pick(k_start), k_end=pick(k_end))
                self.pending_indexer_loss, self.last_indexer_loss = loss, loss.detach()
        return self.o_proj(heads.flatten(1)), indices


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: Config, mode: str, layer_id: int, core):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        self.attn = MLAttention(cfg, mode, layer_id, core)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_mult * cfg.d_model, bias=False), nn.GELU(),
                                 nn.Linear(cfg.mlp_mult * cfg.d_model, cfg.d_model, bias=False))

    def forward(self, x, cu_seqlens, rope_main, rope_idx, ctx, act_dtype):
        a, indices = self.attn(self.attn_norm(x), cu_seqlens, rope_main, rope_idx, ctx, act_dtype)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), indices


class Decoder(nn.Module):
    """Token-shift embedding → blocks (IndexShare pattern) → norm → LM head on the answer rows.

    The embedding of token ``t`` is ``E[x_t] + E_prev[x_{t-1}]`` (a one-step token shift, reset at
    sequence starts), so a pair's value token also carries its key: answering a query is one
    lookup, which the DSA layers must find among all earlier positions.
    """

    def __init__(self, cfg: Config, core: Callable[..., nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.modes = flashdsa.index_share_pattern(cfg.layers, topk_freq=cfg.topk_freq)
        vocab = Vocab.of(cfg).size
        self.embed = nn.Embedding(vocab, cfg.d_model)
        self.embed_prev = nn.Embedding(vocab + 1, cfg.d_model)  # the last row: no previous token
        self.blocks = nn.ModuleList(Block(cfg, m, i, core) for i, m in enumerate(self.modes))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab, bias=False)

    def full_layers(self) -> List[int]:
        return [i for i, m in enumerate(self.modes) if m == "full"]

    def forward(self, batch: Batch, act_dtype: torch.dtype):
        """Returns the answer logits ``[N, vocab]`` and ``{full layer: its indices [T, K]}``."""
        rope_main = Rope.of(batch.positions, ROPE_DIM)
        rope_idx = Rope.of(batch.positions, self.cfg.idx_rope)
        prev = torch.roll(batch.tokens, 1).masked_fill(batch.positions == 0, self.embed_prev.num_embeddings - 1)
        x = self.embed(batch.tokens) + self.embed_prev(prev)
        ctx = flashdsa.IndexShareContext()  # carries each full layer's top-k to the shared layers
        full_indices = {}
        for i, block in enumerate(self.blocks):
            x, indices = block(x, batch.cu_seqlens, rope_main, rope_idx, ctx, act_dtype)
            if self.modes[i] == "full":
                full_indices[i] = indices
        return self.head(self.norm(x[batch.answer_rows])), full_indices

    def indexer_losses(self) -> torch.Tensor:
        """Latest KL loss of each full layer divided by its coefficient (the plain KL), ``[#full]``.

        Call it after the step's backward: the fused layer computes its loss in the backward (from
        the sparse MLA backward's attention mass) and reports NaN until then. NaN also for a layer
        that computed no loss (dense attention without ``dense_kl``). Sparse attention: the sparse
        KL; dense attention with ``dense_kl``: the dense KL.
        """
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        losses = [self.blocks[i].attn.last_indexer_loss for i in self.full_layers()]
        return torch.stack([nan if loss is None else loss.detach().double().cpu() for loss in losses]) / self.cfg.loss_coeff

    def pending_indexer_losses(self) -> List[torch.Tensor]:
        """The dense KL losses of this forward (with grad) that the step's backward must include."""
        return [b.attn.pending_indexer_loss for b in self.blocks if b.attn.pending_indexer_loss is not None]

    def set_attention(self, attention: str, dense_kl: bool = False, kl_rows=1.0) -> None:
        """Switches every layer's main attention: ``"sparse"`` (the DSA core: indexer top-k, sparse
        MLA, sparse KL loss) or ``"dense"`` (causal attention over all visible keys); with
        ``dense_kl`` the full layers' indexers get the dense KL loss on a ``kl_rows`` fraction of rows
        (a float in (0, 1], a fresh random subset every forward) or on the rows ``kl_rows`` lists
        (an int64 tensor of row indices)."""
        if attention not in ("sparse", "dense"):
            raise ValueError(f"attention must be 'sparse' or 'dense', got {attention!r}")
        if dense_kl and attention != "dense":
            raise ValueError("dense_kl needs dense attention")
        for block in self.blocks:
            block.attn.attention, block.attn.dense_kl, block.attn.kl_rows = attention, dense_kl, kl_rows


# ---------------------------------------------------------------------------------------------
# Training


def pair_selected(indices: torch.Tensor, batch: Batch) -> torch.Tensor:
    """bool ``[N]``: whether each answer row's top-k holds the row of its pair's value token."""
    picked = indices[batch.answer_rows].long()  # [N, K]
    return (picked == batch.relevant_rows[:, None]).any(dim=1)


def index_digest(indices: torch.Tensor) -> int:
    """Order-independent fingerprint of a top-k selection (two runs compare selections with it)."""
    return int((indices.long() * 1_000_003 + 7).remainder(2_147_483_647).sum())


def lr_at(step: int, cfg: Config) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


class Progress:
    """A tqdm bar when tqdm is installed, else one printed line every ``every`` steps."""

    def __init__(self, total: int, label: str, every: int):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, desc=label, dynamic_ncols=True, file=sys.stdout) if tqdm else None
        self.total, self.label, self.every = total, label, every

    def update(self, step: int, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif step % self.every == 0 or step == self.total - 1:
            print(f"[{self.label}] step {step + 1}/{self.total}  {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def activation_dtype(device: str, fp64: bool = False) -> torch.dtype:
    """fp32 (or fp64) on the CPU; bf16 on CUDA, after checking that this build runs the layer's ops there."""
    if device == "cpu":
        return torch.float64 if fp64 else torch.float32
    if fp64:
        raise SystemExit("--fp64 is for the CPU backend only")
    if not torch.cuda.is_available() or not flashdsa.built_with_cuda():
        missing = "a GPU" if not torch.cuda.is_available() else "a build with CUDA"
        raise SystemExit(f"--device cuda needs a GPU and flashdsa's CUDA kernels (missing: {missing})")
    flashdsa.set_range_checks(False)  # the layer builds the key ranges itself
    torch.backends.cuda.matmul.allow_tf32 = True
    return torch.bfloat16


METRICS = ("lm_loss", "kl_loss", "grad_norm", "indexer_grad_norm", "accuracy", "recall", "selected_split",
           "chance_recall", "lr", "seconds", "index_digest", "topk_mismatch")


# Run name -> (attention core, whether it attends to the first run's top-k instead of its own).
RUN_KINDS = {
    "fused": ("fused", False),
    "reference": ("reference", False),
    "reference-shared-topk": ("reference", True),
}


class Run:
    """One model (initialized from ``cfg.seed``), its optimizer and its per-step metrics."""

    def __init__(self, cfg: Config, name: str, device: str, dtype: torch.dtype, backend: Optional[str] = None):
        torch.manual_seed(cfg.seed)
        self.cfg, self.name = cfg, name
        # A name of RUN_KINDS, or any name with an explicit attention core (examples/train_long.py).
        backend, self.follows_leader = RUN_KINDS[name] if backend is None else (backend, False)
        # Parameters in fp32 (bf16 autocast on CUDA), or fp64 for an fp64 run.
        self.model = Decoder(cfg, ATTENTION_CORES[backend]).to(device, torch.float64 if dtype == torch.float64 else None)
        # The indexer learns only from its KL loss (detached input): its gradient is clipped on its
        # own, so that a burst in one loss does not shrink the other's update.
        named = list(self.model.named_parameters())
        self.indexer_params = [p for n, p in named if ".indexer." in n]
        self.lm_params = [p for n, p in named if ".indexer." not in n]
        matrices = [p for p in self.model.parameters() if p.dim() >= 2]
        vectors = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": matrices, "weight_decay": cfg.weight_decay},
                                      {"params": vectors, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
        self.hist: Dict[str, list] = {k: [] for k in METRICS}
        self.hist["full_layers"] = self.model.full_layers()

    def full_cores(self) -> List[nn.Module]:
        return [self.model.blocks[i].attn.core for i in self.model.full_layers()]

    def forward_backward(self, batch: Batch, act_dtype: torch.dtype,
                         given_indices: Optional[List[torch.Tensor]] = None):
        """Forward on ``batch`` (the full layers attend to ``given_indices`` when given: reference
        core only) and backward of the LM loss; returns (loss, logits, the full layers' indices)."""
        if given_indices is not None:
            for core, indices in zip(self.full_cores(), given_indices):
                core.use_indices(indices)
        with self.autocast:
            logits, full_indices = self.model(batch, act_dtype)
        loss = F.cross_entropy(_acc(logits), batch.answers)
        # Also back-propagates the full layers' KL losses (attached to their outputs; the fused
        # layer computes them here, so their values exist only after this call), and the dense KL
        # losses of a dense warm-up, which are not attached (the frozen model has no gradient).
        objective = ([loss] if loss.requires_grad else []) + self.model.pending_indexer_losses()
        if objective:
            sum(objective).backward()
        return loss, logits, full_indices

    def step(self, step: int, batch: Batch, act_dtype: torch.dtype,
             given_indices: Optional[List[torch.Tensor]] = None, lr: Optional[float] = None) -> List[torch.Tensor]:
        """One optimizer step on ``batch``; records the metrics; returns the full layers' indices.

        ``given_indices`` (reference core only): the full layers attend to these instead of their
        own top-k. ``lr``: this step's learning rate (default: :func:`lr_at` of the run's config).
        Parameters with ``requires_grad=False`` (a frozen stage) get no gradient and no update.
        """
        lr = lr_at(step, self.cfg) if lr is None else lr
        for group in self.opt.param_groups:
            group["lr"] = lr
        loss, logits, full_indices = self.forward_backward(batch, act_dtype, given_indices)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.lm_params, self.cfg.clip)
        indexer_grad_norm = torch.nn.utils.clip_grad_norm_(self.indexer_params, self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

        indices = list(full_indices.values())
        with torch.no_grad():  # one host transfer for the step's numbers
            correct = logits.argmax(-1) == batch.answers
            chance = (self.cfg.topk / batch.visible.float()).clamp(max=1).mean()
            # (clip_grad_norm_ returns a CPU zero when no parameter has a gradient: a frozen stage)
            norms = [n.to(loss.device) for n in (grad_norm, indexer_grad_norm)]
            numbers = [loss.detach(), *norms, correct.float().mean(), chance]  # fp64 stays exact
            scalars = torch.stack([t.double() for t in numbers]).tolist()
            selected = torch.stack([pair_selected(ix, batch) for ix in indices])  # [#full, N]
            recall = selected.float().mean(dim=1).tolist()
            in_any = selected.any(dim=0)
            split = torch.stack([in_any.sum(), (correct & in_any).sum(), (~in_any).sum(), (correct & ~in_any).sum()])
        h = self.hist
        for key, value in zip(("lm_loss", "grad_norm", "indexer_grad_norm", "accuracy", "chance_recall"), scalars):
            h[key].append(value)
        h["kl_loss"].append(self.model.indexer_losses().tolist())
        h["recall"].append(recall)
        h["selected_split"].append(split.tolist())
        h["index_digest"].append([index_digest(ix) for ix in indices])
        if given_indices is not None:
            rows = batch.tokens.shape[0]
            h["topk_mismatch"].append([int(core.last_topk_mismatch) / rows for core in self.full_cores()])
        h["lr"].append(lr)
        return indices

    def status(self) -> str:
        h = self.hist
        return (f"loss {h['lm_loss'][-1]:.3f} acc {h['accuracy'][-1]:.3f} recall {max(h['recall'][-1]):.3f} "
                f"kl {sum(h['kl_loss'][-1]):.3f} gn {h['grad_norm'][-1]:.2f}")


def train(cfg: Config, names: List[str], device: str, *, fp64: bool = False, time_limit: Optional[float] = None,
          log_every: int = 50) -> Dict[str, Dict[str, list]]:
    """Trains one fresh model per run name (:data:`RUN_KINDS`) in lockstep on the same batches.

    Every model starts from the same initialization (``cfg.seed``); batches are fresh every step
    (seeded likewise). ``fp64`` (CPU only): fp64 parameters and activations instead of fp32.
    A ``reference-shared-topk`` run attends to the top-k of the first run (its
    own top-k is still computed: ``topk_mismatch`` counts the rows per full layer where it differs).

    Returns ``{name: metrics}``, each metric a per-step list: lm_loss, kl_loss (per full layer,
    plain KL), grad_norm and indexer_grad_norm (of the model's and the indexers' parameters, before
    clipping), accuracy, recall (per full layer), selected_split
    (queries whose pair some full layer selected, how many of them were answered right, the other
    queries, how many of them were right), chance_recall (of a random top-k), lr, seconds,
    index_digest (per full layer), topk_mismatch (per full layer, the fraction of rows; shared-top-k
    runs only); and full_layers.
    """
    act_dtype = activation_dtype(device, fp64)
    runs = [Run(cfg, name, device, act_dtype) for name in names]
    vocab = Vocab.of(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    progress = Progress(cfg.steps, "+".join(names), log_every)
    start = time.perf_counter()
    for step in range(cfg.steps):
        batch = make_batch(cfg, vocab, gen).to(device)
        leader = None  # the first run's indices, for the runs that follow them
        for run in runs:
            indices = run.step(step, batch, act_dtype, leader if run.follows_leader else None)
            leader = indices if leader is None else leader
            run.hist["seconds"].append(time.perf_counter() - start)
        others = "".join(f" | {run.name} loss {run.hist['lm_loss'][-1]:.4f}" for run in runs[1:])
        progress.update(step, runs[0].status() + others)
        if time_limit is not None and runs[0].hist["seconds"][-1] > time_limit:
            print(f"time limit reached after {step + 1} steps")
            break
    progress.close()
    return {run.name: run.hist for run in runs}


def gradient_check(cfg: Config, device: str, *, fp64: bool = False) -> Dict[str, Dict[str, float]]:
    """One forward + backward (no optimizer step) of the fused model and of the reference model
    attending to the fused model's top-k, from the same initialization and batch.

    Returns, per parameter: ``rel_diff`` = |g_fused - g_ref| / |g_ref|, ``cosine`` of the two
    gradients and ``norm`` = |g_ref|; plus ``"lm_loss"``: the two LM losses. A wrong kernel gradient
    shows here at once, where a training run would only plateau.
    """
    act_dtype = activation_dtype(device, fp64)
    runs = [Run(cfg, name, device, act_dtype) for name in ("fused", "reference-shared-topk")]
    batch = make_batch(cfg, Vocab.of(cfg), torch.Generator().manual_seed(cfg.seed + 1)).to(device)
    leader, losses = None, []
    for run in runs:
        loss, _, full_indices = run.forward_backward(batch, act_dtype, leader)
        losses.append(float(loss.detach()))
        leader = leader or list(full_indices.values())
    report: Dict[str, Dict[str, float]] = {"lm_loss": {"fused": losses[0], "reference": losses[1]}}
    for (name, p_fused), (_, p_ref) in zip(runs[0].model.named_parameters(), runs[1].model.named_parameters()):
        if p_ref.grad is None:
            continue
        g_f, g_r = p_fused.grad.double().flatten(), p_ref.grad.double().flatten()
        norm = float(g_r.norm())
        report[name] = {"rel_diff": float((g_f - g_r).norm()) / max(norm, 1e-300),
                        "cosine": float(F.cosine_similarity(g_f, g_r, dim=0)), "norm": norm}
    return report


# ---------------------------------------------------------------------------------------------
# Reporting


def smooth(values: List[float], window: int) -> List[float]:
    """Trailing moving average."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def summarize(hist: Dict[str, list], tokens: int, window: int = 50) -> Dict[str, float]:
    """Averages over the first and the last ``window`` steps: accuracy, LM loss, each full layer's
    recall; over the last window, the accuracy on queries whose pair some full layer's top-k held
    and on the others; the chance recall over the whole run; steps, seconds and throughput
    (``tokens`` per step)."""
    def first_last(values):
        head, tail = values[:window], values[-window:]
        return sum(head) / len(head), sum(tail) / len(tail)

    out = {"steps": len(hist["lm_loss"]), "seconds": hist["seconds"][-1],
           "tokens_per_second": len(hist["lm_loss"]) * tokens / hist["seconds"][-1]}
    out["accuracy_first"], out["accuracy_last"] = first_last(hist["accuracy"])
    out["lm_loss_first"], out["lm_loss_last"] = first_last(hist["lm_loss"])
    out["chance_recall"] = sum(hist["chance_recall"]) / len(hist["chance_recall"])
    for j, layer in enumerate(hist["full_layers"]):
        out[f"recall_first_L{layer}"], out[f"recall_last_L{layer}"] = first_last([r[j] for r in hist["recall"]])
    # Accuracy of the last window's queries split by whether their pair was in a top-k.
    sel, sel_right, missed, missed_right = (sum(col) for col in zip(*hist["selected_split"][-window:]))
    out["accuracy_last_pair_selected"] = sel_right / max(sel, 1)
    out["accuracy_last_pair_missed"] = missed_right / max(missed, 1)
    return out


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, title: str, path) -> None:
    """Titles, lays out, writes (PNG, 100 dpi) and closes a matplotlib figure."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def plot_training(hist: Dict[str, list], cfg: Config, path: Path, title: str) -> None:
    """Four panels: LM loss, indexer KL loss, gradient norm, accuracy with top-k recall."""
    plt = _pyplot()
    steps = list(range(1, len(hist["lm_loss"]) + 1))
    w = max(1, len(steps) // 50)
    per_layer = lambda key, j: smooth([v[j] for v in hist[key]], w)  # noqa: E731
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    ax[0, 0].plot(steps, hist["lm_loss"], alpha=0.25, color="C0")
    ax[0, 0].plot(steps, smooth(hist["lm_loss"], w), color="C0", label="LM loss")
    ax[0, 0].axhline(math.log(cfg.num_values), ls=":", color="gray", label="ln(#values): a guess among values")
    ax[0, 0].set(title="LM loss on the answers", xlabel="step")
    ax[0, 0].legend()
    for j, layer in enumerate(hist["full_layers"]):
        ax[0, 1].plot(steps, per_layer("kl_loss", j), label=f"full layer {layer}")
    ax[0, 1].set(title="indexer KL loss (sparse, per full layer)", xlabel="step")
    ax[0, 1].legend()
    ax[1, 0].plot(steps, hist["grad_norm"], color="C2", lw=0.8, label="model (LM loss)")
    ax[1, 0].plot(steps, hist["indexer_grad_norm"], color="C4", lw=0.8, alpha=0.7, label="indexers (KL loss)")
    ax[1, 0].legend()
    ax[1, 0].set(title=f"gradient norm before clipping (clip {cfg.clip})", xlabel="step", yscale="log")
    ax[1, 1].plot(steps, smooth(hist["accuracy"], w), color="k", lw=2, label="task accuracy")
    sel, sel_right = ([split[i] for split in hist["selected_split"]] for i in (0, 1))
    ax[1, 1].plot(steps, [r / max(n, 1e-9) for r, n in zip(smooth(sel_right, w), smooth(sel, w))], color="k",
                  lw=0.8, ls="-.", label="accuracy on queries whose pair is in a top-k")
    ax[1, 1].axhline(1 / cfg.num_values, ls=":", color="k", label=f"chance accuracy (1/{cfg.num_values})")
    for j, layer in enumerate(hist["full_layers"]):
        ax[1, 1].plot(steps, per_layer("recall", j), label=f"top-{cfg.topk} recall, full layer {layer}")
    ax[1, 1].plot(steps, smooth(hist["chance_recall"], w), ls="--", color="gray", label="recall of a random top-k")
    ax[1, 1].set(title="accuracy; indexer recall of the queried pair", xlabel="step", ylim=(0, 1.02))
    ax[1, 1].legend(fontsize=8, loc="upper left")
    save_figure(fig, title, path)


def plot_overlay(runs: Dict[str, Dict], path: Path, title: str) -> None:
    """Overlays several runs' ``metrics.json`` contents (label -> dict with ``config`` and ``history``):
    LM loss, task accuracy and the first full layer's top-k recall of the queried pair, per step."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.5))
    for i, (label, run) in enumerate(runs.items()):
        hist, color = run["history"], f"C{i}"
        steps = list(range(1, len(hist["lm_loss"]) + 1))
        w = max(1, len(steps) // 50)
        ax[0].plot(steps, smooth(hist["lm_loss"], w), color=color, label=label)
        ax[1].plot(steps, smooth(hist["accuracy"], w), color=color, label=label)
        ax[2].plot(steps, smooth([v[0] for v in hist["recall"]], w), color=color, label=label)
        ax[2].plot(steps, smooth(hist["chance_recall"], w), color=color, ls=":", lw=0.8,
                   label=f"{label}: random top-k")
    first = next(iter(runs.values()))["config"]
    ax[0].set(title="LM loss on the answers", xlabel="step", yscale="log")
    ax[1].axhline(1 / first["num_values"], ls=":", color="gray", label="chance")
    ax[1].set(title="task accuracy", xlabel="step", ylim=(0, 1.02))
    ax[2].set(title=f"top-{first['topk']} recall of the queried pair, full layer 0", xlabel="step", ylim=(0, 1.02))
    for a in ax:
        a.legend(fontsize=8)
    save_figure(fig, title, path)


def overlay(paths: List[Path], out: Path) -> Dict[str, Dict[str, float]]:
    """Reads ``metrics.json`` files of earlier runs, writes ``out / overlay.png`` and returns each run's
    summary keyed by its label (the run's ``selection`` and the file's folder name)."""
    runs = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        if "history" not in run or "config" not in run:
            raise ValueError(f"{path}: not a metrics.json of examples/train_recall.py (no history / config)")
        label = f"{Path(path).parent.name or Path(path).stem} (selection {run['config'].get('selection', 'bf16')})"
        runs[label] = run
    out.mkdir(parents=True, exist_ok=True)
    plot_overlay(runs, out / "overlay.png", "key-value recall: runs overlaid")
    print(f"wrote {out / 'overlay.png'}")
    return {label: run.get("summary", {}) for label, run in runs.items()}


PARITY_RUNS = ["fused", "reference", "reference-shared-topk"]


def parity_report(runs: Dict[str, Dict[str, list]], first: Optional[int] = None) -> Dict[str, Dict]:
    """For each reference run against the fused run, over the first ``first`` steps (default:
    all): max relative difference of the LM loss (and its median), of the KL loss (sum over full
    layers) and of the model's gradient norm before clipping (max, median), steps
    on which every full layer selected the same top-k, and, for a shared-top-k run, the fraction of
    (row, full layer) pairs where the reference's own top-k would have differed."""
    fused = runs["fused"]
    report = {}
    for name, ref in runs.items():
        if name == "fused":
            continue
        n = min(len(fused["lm_loss"]), len(ref["lm_loss"]), first or len(fused["lm_loss"]))
        rel = lambda a, b: abs(a - b) / abs(b)  # noqa: E731
        lm = [rel(a, b) for a, b in zip(fused["lm_loss"][:n], ref["lm_loss"][:n])]
        kl = [rel(sum(a), sum(b)) for a, b in zip(fused["kl_loss"][:n], ref["kl_loss"][:n])]
        same = [a == b for a, b in zip(fused["index_digest"][:n], ref["index_digest"][:n])]
        gn = [rel(a, b) for a, b in zip(fused["grad_norm"][:n], ref["grad_norm"][:n])]
        entry = {
            "steps": n,
            "max_rel_lm_loss_diff": max(lm),
            "median_rel_lm_loss_diff": sorted(lm)[n // 2],
            "max_rel_kl_loss_diff": max(kl),
            "max_rel_grad_norm_diff": max(gn),
            "median_rel_grad_norm_diff": sorted(gn)[n // 2],
            "steps_with_identical_topk": sum(same),
            "first_step_with_different_topk": next((i + 1 for i, s in enumerate(same) if not s), None),
            "lm_rel_diff": lm,
            "kl_rel_diff": kl,
        }
        if ref["topk_mismatch"]:
            fractions = [f for step in ref["topk_mismatch"][:n] for f in step]
            entry["own_topk_mismatch_fraction"] = sum(fractions) / len(fractions)
        report[name] = entry
    return report


def plot_parity(runs: Dict[str, Dict[str, list]], report: Dict[str, Dict], path: Path, title: str) -> None:
    """The runs' LM loss, KL loss and gradient-norm curves overlaid, and each reference's relative
    difference per step."""
    plt = _pyplot()
    n = min(entry["steps"] for entry in report.values())
    steps = list(range(1, n + 1))
    styles = {"fused": dict(color="C0", lw=3.5, alpha=0.45), "reference": dict(color="C3", lw=1.2, ls="--"),
              "reference-shared-topk": dict(color="k", lw=0.8, ls=":")}
    fig, axes = plt.subplots(2, 2, figsize=(15, 9))
    ax = [axes[0, 0], axes[0, 1], axes[1, 1], axes[1, 0]]  # ax[3]: gradient norms
    for key, axis, name in (("lm_loss", ax[0], "LM loss"), ("kl_loss", ax[1], "indexer KL loss (sum over full layers)")):
        for run, hist in runs.items():
            axis.plot(steps, [v if key == "lm_loss" else sum(v) for v in hist[key][:n]], label=run, **styles[run])
        axis.set(title=name, xlabel="step")
        axis.legend()
    for run, hist in runs.items():
        ax[3].plot(steps, hist["grad_norm"][:n], label=f"{run}: model (LM loss)", **styles[run])
        ax[3].plot(steps, hist["indexer_grad_norm"][:n], label=f"{run}: indexers (KL loss)",
                   **{**styles[run], "lw": styles[run]["lw"] * 0.5})
    ax[3].set(title="gradient norm before clipping", xlabel="step", yscale="log")
    ax[3].legend(fontsize=8)
    diffs = [r for entry in report.values() for key in ("lm_rel_diff", "kl_rel_diff") for r in entry[key][:n]]
    floor = min([r for r in diffs if r > 0], default=1e-18) / 2  # where equal losses are drawn
    for run, entry in report.items():
        color = styles[run]["color"]
        ax[2].semilogy(steps, [max(r, floor) for r in entry["lm_rel_diff"][:n]], color=color, lw=1,
                       label=f"{run}: LM loss (max {entry['max_rel_lm_loss_diff']:.1e})")
        ax[2].semilogy(steps, [max(r, floor) for r in entry["kl_rel_diff"][:n]], color=color, lw=0.6, alpha=0.5,
                       label=f"{run}: KL loss (max {entry['max_rel_kl_loss_diff']:.1e})")
    ax[2].set(title=f"|fused − reference| / reference (equal: drawn at {floor:.0e})", xlabel="step")
    ax[2].legend(fontsize=8)
    save_figure(fig, title, path)


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="fused", choices=sorted(ATTENTION_CORES),
                    help="attention core of a plain training run (default: fused)")
    ap.add_argument("--parity", action="store_true",
                    help="train fused, reference and reference-shared-topk in lockstep from the same seed and data")
    ap.add_argument("--grad-check", action="store_true",
                    help="compare the fused model's gradients with the reference's on one batch (no training)")
    ap.add_argument("--out", type=Path, default=Path("train_recall_out"), help="output folder")
    ap.add_argument("--time-limit", type=float, default=None, help="stop each run after this many minutes")
    ap.add_argument("--log-every", type=int, default=50, help="steps between printed lines (without tqdm)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--fp64", action="store_true", help="CPU only: fp64 parameters and activations (fp32 by default)")
    ap.add_argument("--overlay", type=Path, nargs="+", default=None, metavar="JSON",
                    help="no training: overlay the curves of earlier runs' metrics.json files into --out/overlay.png")
    add_config_options(ap, Config, PRESETS)
    return ap.parse_args(argv)


def add_config_options(ap: argparse.ArgumentParser, config_cls, presets: Dict[str, Config]) -> None:
    """One ``--field-name`` option per field of the dataclass ``config_cls`` (default None: the
    preset's value); the help lists each preset's value."""
    for field in dataclasses.fields(config_cls):
        values = ", ".join(f"{name} {getattr(cfg, field.name)}" for name, cfg in presets.items())
        ap.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=None,
                        help=f"preset: {values}")


PARITY_STEPS = 200  # default --steps of --parity


def build_config(args: argparse.Namespace) -> Config:
    """The ``--device`` preset with the options given on the command line applied over it."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if getattr(args, f.name) is not None}
    if args.parity:
        given.setdefault("steps", PARITY_STEPS)
    return dataclasses.replace(PRESETS[args.device], **given)


def main(argv=None) -> Dict:
    """Runs the example; returns what it writes to the JSON file (the tests use it)."""
    args = parse_args(argv)
    if args.overlay:
        return {"overlay": overlay(args.overlay, args.out)}
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = build_config(args)
    args.out.mkdir(parents=True, exist_ok=True)
    limit = None if args.time_limit is None else 60 * args.time_limit
    where = f"CPU backend, {'fp64' if args.fp64 else 'fp32'}" if args.device == "cpu" else f"{torch.cuda.get_device_name()}, bf16"
    shape = (f"T={cfg.tokens} (seqs {cfg.min_len}-{cfg.max_len}) H={cfg.heads} D_qk={cfg.d_qk} K={cfg.topk} "
             f"H_I={cfg.idx_heads} D_I={cfg.idx_dim}, {cfg.layers} layers, IndexShare 1-in-{cfg.topk_freq}")
    print(f"key-value recall on {where}: {shape}")
    print(describe_task(cfg))

    if args.grad_check:
        report = gradient_check(cfg, args.device, fp64=args.fp64)
        (args.out / "grad_check.json").write_text(json.dumps(report, indent=1))
        print(f"LM loss: fused {report['lm_loss']['fused']:.6f}, reference {report['lm_loss']['reference']:.6f}")
        params = sorted((k for k in report if k != "lm_loss"), key=lambda k: -report[k]["rel_diff"])
        print(f"{'parameter':48s} {'|g_ref|':>10s} {'rel diff':>10s} {'cosine':>9s}")
        for name in params:
            e = report[name]
            print(f"{name:48s} {e['norm']:10.3e} {e['rel_diff']:10.2e} {e['cosine']:9.6f}")
        print(f"wrote {args.out / 'grad_check.json'}")
        return {"config": dataclasses.asdict(cfg), "grad_check": report}

    if args.parity:
        runs = train(cfg, PARITY_RUNS, args.device, fp64=args.fp64, time_limit=limit, log_every=args.log_every)
        report = parity_report(runs)
        plot_parity(runs, report, args.out / "parity.png", f"fused vs plain-PyTorch reference, {where}\n{shape}")
        summary = {name: {k: v for k, v in entry.items() if not k.endswith("rel_diff")} for name, entry in report.items()}
        result = {"config": dataclasses.asdict(cfg), "parity": summary, "runs": runs}
        (args.out / "parity.json").write_text(json.dumps(result))
        for name, entry in summary.items():
            print(f"{name}: over {entry['steps']} steps, max relative difference to fused of the LM loss "
                  f"{entry['max_rel_lm_loss_diff']:.2e} (median {entry['median_rel_lm_loss_diff']:.2e}), of the KL loss "
                  f"{entry['max_rel_kl_loss_diff']:.2e}, of the gradient norm {entry['max_rel_grad_norm_diff']:.2e} "
                  f"(median {entry['median_rel_grad_norm_diff']:.2e}); "
                  f"identical top-k on {entry['steps_with_identical_topk']} steps")
        print(f"wrote {args.out / 'parity.png'}")
        return result

    hist = train(cfg, [args.backend], args.device, fp64=args.fp64, time_limit=limit, log_every=args.log_every)[args.backend]
    summary = summarize(hist, cfg.tokens)
    plot_training(hist, cfg, args.out / "train.png", f"key-value recall, {args.backend} DSA, {where}\n{shape}")
    result = {"config": dataclasses.asdict(cfg), "summary": summary, "history": hist}
    (args.out / "metrics.json").write_text(json.dumps(result))
    print(" ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    print(f"wrote {args.out / 'train.png'}")
    return result


if __name__ == "__main__":
    main()
