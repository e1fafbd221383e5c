#!/usr/bin/env python3
"""Long-range retrieval with DSA: the two-stage recipe (dense warm-up of the indexer, then sparse
training) against sparse training from scratch, on one task and one budget.

Task: one (or ``--seqs``) sequence(s) of ``--seq-len`` tokens per step (packed THD); each holds
``key value`` pairs among filler tokens and ends with ``--queries`` queries ``key -> value`` whose
pair lies ``--dist-min`` .. ``--dist-max`` tokens earlier (32K tokens and 1K-30K back on the GPU).
Only the answers are scored. The model is examples/train_recall.py's decoder (absorbed MLA through
flashdsa's DSA layer, IndexShare, a lightning indexer whose input is detached).

Recipes (``--recipe``; ``--compare`` runs both from the same initialization on the same batches):

* ``two-stage``: the stand-in for the dense checkpoint DeepSeek-V3.2 starts from, then its two
  indexer stages:
    - stage 0 ``dense``: dense causal main attention (torch SDPA flash kernels), the model trained
      by the LM loss; the indexer idle and frozen;
    - stage 1 ``warmup`` (the dense warm-up): the same dense attention; everything but the indexers
      frozen; each full layer's indexer trained by flashdsa's fused dense KL loss
      (``indexer_kl_loss(formulation="dense")``: target = the head-averaged dense attention
      distribution, recomputed inside the kernel, nothing of size T x T in memory);
    - stage 2 ``sparse``: flashdsa's DSA layer (indexer top-k, sparse MLA, sparse KL loss in its
      backward), everything trained.
* ``scratch``: stage 2 alone from the random initialization, for the whole budget.

Per step: LM loss, indexer KL, task accuracy, the full layers' top-K recall of the needed key (the
pair's value row: in the dense stages the indexer's top-K is computed for the metric only), the
recall of a random top-K, tokens/s. Writes ``<recipe>.png`` (or ``compare.png``) and
``<recipe>.json`` to ``--out``; ``--memory-check`` (CUDA) measures one training step of each stage
with the allocator (peak, largest single allocation against the size of one T x T matrix).

    python examples/train_long.py --preset tiny --compare            # CI size, seconds
    python examples/train_long.py --preset cpu --compare             # 2K tokens, 100-1500 back, CPU
    python examples/train_long.py --device cuda --compare --budget-minutes 5 --memory-check   # H200, 32K
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_recall as tr  # noqa: E402  (the model, the metrics and the training step live there)

import flashdsa  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass
class LongConfig(tr.Config):
    """A run of this script: the task geometry, the model (tr.Config's fields) and the recipe."""

    seq_len: int = 2048  # tokens per sequence (every sequence of a step has this length)
    seqs: int = 1  # sequences per step; tokens per step = seq_len * seqs
    queries: int = 48  # queries per sequence, at its end
    dist_min: int = 100  # every query's pair lies dist_min .. dist_max rows before it
    dist_max: int = 1500
    # recipe: stage lengths in steps; a stage also ends when its share of --budget-minutes is spent
    dense_steps: int = 300  # stage 0: dense attention, model trained, indexer idle
    warmup_steps: int = 100  # stage 1: dense attention frozen, indexer trained by the dense KL loss
    sparse_steps: int = 100  # stage 2: the DSA layer, everything trained
    indexer_lr: float = 1e-3  # stage 1
    sparse_lr: float = 3e-4  # stage 2 (the scratch recipe uses lr: it starts from random weights)
    kl_rows: float = 1.0  # fraction of query rows in the dense KL loss (a random subset per step)
    # Stage 1's rows: "answers" = the answer rows (the rows the LM loss scores) plus the kl_rows
    # random fraction; "random" = the random fraction only (the first GPU run's recipe).
    kl_row_mode: str = "answers"
    # Stage 1's learning rate after its warm-up steps: "constant" or "cosine" (to 10% at the stage's end)
    warmup_schedule: str = "cosine"
    # Stage 1's target for a full layer's indexer: "own" = that layer's dense attention; "answering"
    # = the attention of the layer, among those it serves (IndexShare), that puts the most weight
    # on the needed key at the stage's first step (pair_attention, answering_layers)
    kl_target: str = "own"
    # Stage 0 length curriculum: sequences of short_len, 2·short_len, ... up to seq_len (same tokens
    # per step, distances and queries scaled with the length); 0 = off. A level ends when its share
    # of stage 0 is spent or the accuracy reaches switch_accuracy.
    short_len: int = 0
    short_query_every: int = 8  # curriculum: at least one query per this many tokens of a short sequence
    switch_accuracy: float = 0.95  # stage 0 ends early at this accuracy (mean of 10 steps) at full length
    switch_recall: float = 0.95  # stage 1 ends early at this top-K recall (mean of 10 steps)

    def __post_init__(self):
        self.tokens = self.seq_len * self.seqs
        self.min_len = self.max_len = self.seq_len


TINY = dict(seq_len=1024, queries=24, dist_min=100, dist_max=800, num_keys=64, num_values=8, num_fillers=16,
            d_model=32, layers=2, heads=2, d_latent=16, d_nope=8, d_head_v=8, idx_heads=2, idx_dim=16, idx_rope=8,
            topk=16, dense_steps=4, warmup_steps=3, sparse_steps=3, warmup=2)

PRESETS: Dict[str, LongConfig] = {
    # CI: seconds on 2 cores.
    "tiny": LongConfig(**TINY),
    # 2-core CPU, fp32: 2 x 1024 tokens, pairs 100-900 back, K = 32 (random top-K recall 0.033);
    # ~10 min per recipe on 2 shared cores (docs/training.md: the measured run).
    "cpu": LongConfig(seq_len=1024, seqs=2, queries=64, dist_min=100, dist_max=900, num_keys=128, num_values=16,
                      layers=4, topk_freq=4, topk=32, lr=3e-3, warmup=20, dense_steps=800, warmup_steps=300,
                      sparse_steps=200, indexer_lr=2e-3, sparse_lr=3e-4, short_len=256, switch_accuracy=0.9),
    # Stage 0 runs a length curriculum 512 -> 32K (the dense model must first form the lookup,
    # which takes a few hundred steps even at short range; see docs/training.md). Stage 1 (second
    # session of 2026-12-02): the dense KL on the answer rows plus 1/32 of all rows, D_I = 128,
    # constant lr; 1280 keys (= the pairs of a 32K sequence; 2048 before): each key is seen more often
    # (docs/training.md, "Recipe changes 2026-12-02 (second session)").
    "cuda": LongConfig(seq_len=32768, queries=1024, dist_min=1024, dist_max=30000, num_keys=1280, num_values=16,
                       num_fillers=64, d_model=512, layers=4, topk_freq=4, heads=16, d_latent=512, d_nope=64,
                       d_head_v=64, idx_heads=32, idx_dim=128, idx_rope=32, topk=512, lr=1e-3, warmup=30,
                       dense_steps=100000, warmup_steps=100000, sparse_steps=100000, indexer_lr=2e-3,
                       sparse_lr=3e-4, kl_rows=1 / 32, kl_row_mode="answers", warmup_schedule="constant",
                       short_len=512, switch_accuracy=0.95),
}


# ---------------------------------------------------------------------------------------------
# Task: key-value recall over long distances


def make_long_sequence(cfg: LongConfig, vocab: tr.Vocab, gen: torch.Generator):
    """One sequence of ``cfg.seq_len`` tokens: ``BOS``, ``key value`` pairs at random slots among
    fillers, then ``cfg.queries`` queries ``key value`` (its last ``2·queries`` tokens) about
    random distinct pairs, in random order. Every pair's value row lies ``dist_min .. dist_max``
    rows before the row of each query that could ask for it (by construction of the pair region).

    Returns tokens [L], the query-key rows [n_q], the rows of their pairs' value tokens [n_q].
    """
    L, n_q = cfg.seq_len, cfg.queries
    n_pairs = n_q + round(n_q * cfg.distractor_pairs)
    first_query = L - 2 * n_q  # answer rows: first_query, first_query + 2, ..., L - 2
    lo = max(2, L - 2 - cfg.dist_max)  # value rows r with dist_min <= a - r <= dist_max for all of them
    hi = first_query - cfg.dist_min
    slots = (hi - lo) // 2 + 1 if hi >= lo else 0  # value rows lo, lo + 2, ...: pairs never overlap
    if n_q < 1 or slots < n_pairs or cfg.num_keys < n_pairs:
        raise ValueError(f"{n_pairs} pairs do not fit: {slots} slots for distances {cfg.dist_min}-{cfg.dist_max} in "
                         f"{L} tokens with {n_q} queries, {cfg.num_keys} keys (raise seq_len/num_keys or lower queries)")
    seq = vocab.filler0 + torch.randint(cfg.num_fillers, (L,), generator=gen)
    seq[0] = vocab.bos
    value_rows = lo + 2 * torch.randperm(slots, generator=gen)[:n_pairs]
    keys = vocab.key0 + torch.randperm(cfg.num_keys, generator=gen)[:n_pairs]
    values = vocab.value0 + torch.randint(cfg.num_values, (n_pairs,), generator=gen)
    seq[value_rows - 1], seq[value_rows] = keys, values
    asked = torch.randperm(n_pairs, generator=gen)[:n_q]
    query_rows = first_query + 2 * torch.arange(n_q)
    seq[query_rows], seq[query_rows + 1] = keys[asked], values[asked]
    return seq, query_rows, value_rows[asked]


def at_length(cfg: LongConfig, length: int) -> LongConfig:
    """The task at sequence length ``length`` (curriculum): same tokens per step (more sequences),
    distances scaled by ``length / seq_len``; queries per sequence scaled likewise, but at least one
    per ``short_query_every`` tokens (at most ``queries``): short sequences carry more queries."""
    if length == cfg.seq_len:
        return cfg
    if cfg.tokens % length:
        raise ValueError(f"curriculum length {length} does not divide the {cfg.tokens} tokens per step")
    f = length / cfg.seq_len
    queries = max(1, round(cfg.queries * f), min(cfg.queries, length // cfg.short_query_every))
    return dataclasses.replace(cfg, seq_len=length, seqs=cfg.tokens // length, queries=queries,
                               dist_min=max(1, round(cfg.dist_min * f)), dist_max=max(2, round(cfg.dist_max * f)))


def curriculum_lengths(cfg: LongConfig) -> List[int]:
    """Stage 0's sequence lengths: short_len doubling up to seq_len (just seq_len when off)."""
    if cfg.short_len <= 0 or cfg.short_len >= cfg.seq_len:
        return [cfg.seq_len]
    lengths = [cfg.short_len]
    while lengths[-1] * 2 < cfg.seq_len:
        lengths.append(lengths[-1] * 2)
    return lengths + [cfg.seq_len]


def make_long_batch(cfg: LongConfig, vocab: tr.Vocab, gen: torch.Generator) -> tr.Batch:
    """``cfg.seqs`` sequences of ``cfg.seq_len`` tokens, packed (THD), on the CPU."""
    parts = {k: [] for k in ("tokens", "positions", "answer_rows", "answers", "relevant_rows", "visible")}
    for b in range(cfg.seqs):
        seq, query_rows, value_rows = make_long_sequence(cfg, vocab, gen)
        offset = b * cfg.seq_len
        parts["tokens"].append(seq)
        parts["positions"].append(torch.arange(cfg.seq_len))
        parts["answer_rows"].append(offset + query_rows)
        parts["answers"].append(seq[query_rows + 1])
        parts["relevant_rows"].append(offset + value_rows)
        parts["visible"].append(query_rows + 1)
    cu = flashdsa.cu_seqlens_from_lengths([cfg.seq_len] * cfg.seqs)
    return tr.Batch(cu_seqlens=cu, **{k: torch.cat(v) for k, v in parts.items()})


def describe_long_task(cfg: LongConfig) -> Dict[str, float]:
    """Distances from the queries back to their pairs on a sample batch, and the chance levels."""
    batch = make_long_batch(cfg, tr.Vocab.of(cfg), torch.Generator().manual_seed(cfg.seed + 2))
    dist = (batch.answer_rows - batch.relevant_rows).float()
    return {"queries_per_step": len(batch.answers), "distance_min": float(dist.min()),
            "distance_median": float(dist.median()), "distance_max": float(dist.max()),
            "chance_accuracy": 1 / cfg.num_values,
            "random_topk_recall": float((cfg.topk / batch.visible.float()).clamp(max=1).mean())}


# ---------------------------------------------------------------------------------------------
# Recipe: stages, frozen parameters, schedule

# Shares of --budget-minutes of the two-stage recipe: stage 0 (dense), 1 (warm-up), 2 (sparse).
# Time a stage leaves unused goes to the next one.
STAGE_FRACTIONS = (0.5, 0.25, 0.25)


class Stage(NamedTuple):
    """One stage of a recipe: how attention runs, which parameters train, how long, how fast."""

    name: str
    attention: str  # "dense" (torch SDPA over all visible keys) or "sparse" (flashdsa's DSA layer)
    dense_kl: bool  # the full layers' indexers trained by the fused dense KL loss
    trains: str  # "model" (all but the indexers), "indexer" (only the indexers) or "all"
    steps: int
    seconds: Optional[float]  # wall-clock cap (None: steps only)
    lr: float


def recipe_stages(cfg: LongConfig, recipe: str, budget_seconds: Optional[float] = None,
                  fractions=STAGE_FRACTIONS) -> List[Stage]:
    """The stages of ``recipe``. With ``budget_seconds`` the two-stage recipe splits it by
    ``fractions`` (stage 0, 1, 2) and the scratch recipe gets all of it; steps are caps."""
    def share(i):
        return None if budget_seconds is None else budget_seconds * fractions[i]

    if recipe == "two-stage":  # (stages 1 and 2 also get the time the stages before left: see train_recipe)
        return [Stage("dense", "dense", False, "model", cfg.dense_steps, share(0), cfg.lr),
                Stage("warmup", "dense", True, "indexer", cfg.warmup_steps, share(1), cfg.indexer_lr),
                Stage("sparse", "sparse", False, "all", cfg.sparse_steps, share(2), cfg.sparse_lr)]
    if recipe == "scratch":
        total = cfg.dense_steps + cfg.warmup_steps + cfg.sparse_steps
        return [Stage("sparse", "sparse", False, "all", total, budget_seconds, cfg.lr)]
    raise ValueError(f"recipe must be 'two-stage' or 'scratch', got {recipe!r}")


def warmup_kl_rows(cfg: LongConfig, batch: tr.Batch):
    """The query rows of this step's dense KL loss (stage 1): with ``kl_row_mode = "answers"`` the
    answer rows (those the LM loss scores: the rows whose attention must find the pair) plus a
    random ``kl_rows`` fraction of all rows (``torch.Tensor`` of increasing row indices); with
    ``"random"`` only the random fraction (``cfg.kl_rows``, drawn by the layer).

    Why: the dense KL averages over its rows, and in this task 97% of all rows are filler rows
    whose attention has nothing to do with the lookup; on random rows the loss falls while the
    recall of the needed key stalls (docs/training.md, "Recipe changes 2026-12-02 (second session)").
    """
    if cfg.kl_row_mode == "random":
        return cfg.kl_rows
    if cfg.kl_row_mode != "answers":
        raise ValueError(f"kl_row_mode must be 'answers' or 'random', got {cfg.kl_row_mode!r}")
    extra = tr.sample_rows(batch.tokens.shape[0], cfg.kl_rows, batch.answer_rows.device)
    if extra is None:  # every row
        return 1.0
    return torch.unique(torch.cat([batch.answer_rows, extra]))  # sorted, no duplicates


def apply_stage(model: tr.Decoder, stage: Stage) -> Dict[str, int]:
    """Switches the model to ``stage``: its attention (dense or sparse, dense KL on or off) and
    which parameters train (``requires_grad``); a frozen parameter gets no gradient, so the
    optimizer leaves it alone. Returns the number of trainable and frozen parameter elements."""
    model.set_attention(stage.attention, dense_kl=stage.dense_kl, kl_rows=model.cfg.kl_rows)
    counts = {"trainable": 0, "frozen": 0}
    for name, p in model.named_parameters():
        is_indexer = ".indexer." in name
        trains = stage.trains == "all" or (stage.trains == "indexer") == is_indexer
        p.requires_grad_(trains)
        counts["trainable" if trains else "frozen"] += p.numel()
    return counts


def stage_lr(base: float, step: int, progress: float, warmup: int, schedule: str = "cosine") -> float:
    """Linear warm-up over ``warmup`` steps, then cosine to 10% at ``progress`` = 1
    (``schedule="cosine"``) or ``base`` (``"constant"``)."""
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    return base * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


# ---------------------------------------------------------------------------------------------
# Diagnostic: where the dense model's attention puts the needed key


@torch.no_grad()
def absorbed_operands(attn: tr.MLAttention, args: tuple):
    """The absorbed ``q [T, H, D_qk]``, ``kv [T, D_qk]`` of an attention layer, from the arguments
    of its forward ``(x, cu_seqlens, rope_main, rope_idx, ctx, act_dtype)`` (a forward pre-hook's)."""
    x, _, rope_main, _, _, act_dtype = args
    q_nope = attn.q_nope(x).unflatten(-1, (attn.heads, attn.d_nope))
    q_pe = rope_main.apply(attn.q_rope(x).unflatten(-1, (attn.heads, tr.ROPE_DIM)))
    c_kv = attn.kv_norm(attn.kv_down(x))
    return attn._absorbed(q_nope, q_pe, c_kv, rope_main.apply(attn.k_rope(x)), act_dtype)


def served_layers(model: tr.Decoder) -> Dict[int, List[int]]:
    """IndexShare: each full layer and the layers that use its top-K (itself and the shared ones after it)."""
    out: Dict[int, List[int]] = {}
    for i, mode in enumerate(model.modes):
        if mode == "full":
            out[i] = [i]
        elif out:
            out[max(out)].append(i)
    return out


def answering_layers(model: tr.Decoder, diag: List[Dict[str, float]]) -> Dict[int, int]:
    """Per full layer, the layer among those it serves whose dense attention puts the most
    head-averaged probability on the needed key (:func:`pair_attention`): the layer that answers."""
    return {full: max(layers, key=lambda l: diag[l]["pair_mass"]) for full, layers in served_layers(model).items()}


class TargetLayerKL:
    """Stage 1 with another layer's attention as the dense KL target of a full layer's indexer.

    With IndexShare the full layer's top-K also serves the shared layers after it; when the
    lookup is done by one of those (:func:`answering_layers`), its attention, not the full
    layer's own, is what the indexer must learn to cover. Hooks (removed by :meth:`remove`): the
    full layer's indexer output and the target layer's absorbed ``q``, ``kv`` are captured during the
    forward; after it, the fused dense KL loss (:func:`flashdsa.indexer_kl_loss`, the same kernel,
    nothing T x T) of the indexer against the target layer's attention on ``rows`` is put where the
    training step reads the full layer's loss (``pending_indexer_loss``). The model must run dense
    attention without ``dense_kl`` (the full layer's own loss off).
    """

    def __init__(self, model: tr.Decoder, full: int, target: int):
        self.model, self.full, self.target = model, full, target
        self.rows = 1.0  # set per step: a fraction or a tensor of rows (warmup_kl_rows)
        self.captured: Dict[str, tuple] = {}
        full_attn, target_attn = model.blocks[full].attn, model.blocks[target].attn
        self.hooks = [full_attn.indexer.register_forward_hook(lambda m, a, out: self.captured.__setitem__("idx", out)),
                      target_attn.register_forward_pre_hook(
                          lambda m, a: self.captured.__setitem__("qkv", absorbed_operands(m, a))),
                      model.register_forward_hook(self._loss)]

    def _loss(self, model, args, output):
        batch = args[0]
        (q_idx, k_idx, weights), (q, kv) = self.captured.pop("idx"), self.captured.pop("qkv")
        rows = self.rows if torch.is_tensor(self.rows) else tr.sample_rows(q.shape[0], self.rows, q.device)
        pick = (lambda t: t) if rows is None else (lambda t: t[rows.to(q.device)])  # noqa: E731
        k_start, k_end = flashdsa.build_key_ranges(batch.cu_seqlens, device=q.device)
        target, full = model.blocks[self.target].attn, model.blocks[self.full].attn
        loss = flashdsa.indexer_kl_loss(pick(q_idx), k_idx, pick(weights), formulation="dense", coeff=full.loss_coeff,
                                        q=pick(q), kv=kv, scale=target.scale, k_start=pick(k_start), k_end=pick(k_end))
        full.pending_indexer_loss, full.last_indexer_loss = loss, loss.detach()

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


@torch.no_grad()
def pair_attention(model: tr.Decoder, batch: tr.Batch, act_dtype: torch.dtype, topk: int,
                   chunk: int = 64) -> List[Dict[str, float]]:
    """Per layer, in dense attention, at the answer rows: the head-averaged attention probability
    of the needed key (the pair's value row; the dense KL target's weight on it), the best head's,
    the fraction of queries whose target ranks it first, and in its top ``topk``.

    This is what the dense KL loss can teach the full layer's indexer: a pair its own layer does
    not attend to is not in its target. Answer rows are processed ``chunk`` at a time over all of
    their sequence's keys (``[chunk, H, L]`` probabilities, never ``[T, T]``). One forward, no update.
    """
    operands = {}

    def grab(module, args):  # the absorbed q, kv of each layer, from its input
        operands[module] = absorbed_operands(module, args)

    hooks = [b.attn.register_forward_pre_hook(grab) for b in model.blocks]
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=batch.tokens.is_cuda):
            model(batch, act_dtype)
    finally:
        for hook in hooks:
            hook.remove()
    cu = batch.cu_seqlens.tolist()
    starts = torch.tensor(cu[:-1], device=batch.answer_rows.device)
    seq = torch.searchsorted(starts, batch.answer_rows, right=True) - 1
    out = []
    for block in model.blocks:
        q, kv = operands[block.attn]
        on_pair, best_head, top1, in_topk = [], [], [], []
        for a in range(0, len(batch.answer_rows), chunk):
            rows, rel, start = batch.answer_rows[a:a + chunk], batch.relevant_rows[a:a + chunk], starts[seq[a:a + chunk]]
            lo, hi = int(start.min()), int(rows.max()) + 1
            s = torch.einsum("nhd,td->nht", q[rows].float(), kv[lo:hi].float()) * block.attn.scale
            keys = torch.arange(lo, hi, device=s.device)
            visible = (keys[None, :] >= start[:, None]) & (keys[None, :] <= rows[:, None])
            p = s.masked_fill(~visible[:, None, :], float("-inf")).softmax(-1)  # [n, H, keys]
            n = torch.arange(len(rows), device=s.device)
            pair = p[n, :, rel - lo]  # [n, H]
            target = p.mean(1)  # the dense KL target (head-averaged)
            rank = (target > target[n, rel - lo][:, None]).sum(-1)
            on_pair.append(pair.mean(1)), best_head.append(pair.max(1).values)
            top1.append(rank == 0), in_topk.append(rank < topk)
        cat = lambda xs: torch.cat(xs).float().mean().item()  # noqa: E731
        out.append({"pair_mass": cat(on_pair), "best_head_mass": cat(best_head), "pair_top1": cat(top1),
                    "pair_in_topk": cat(in_topk)})
    return out


# ---------------------------------------------------------------------------------------------
# Memory: no tensor of size T x T


def quadratic_memory_check(alloc_sizes: List[int], peak_bytes: int, base_bytes: int, seq_len: int,
                           elem_bytes: int = 2) -> Dict[str, float]:
    """Judges one training step's allocations: ``ok`` when the largest single allocation is
    smaller than one ``[seq_len, seq_len]`` matrix of ``elem_bytes`` (a score or probability matrix
    of one sequence and one head, the least a T x T intermediate would take).

    Also reports the step's peak (``peak_bytes``, e.g. ``torch.cuda.max_memory_allocated``), its
    rise over the memory held before the step (``base_bytes``) and both in units of that matrix.
    """
    if not alloc_sizes:
        raise ValueError("no allocations recorded")
    square = seq_len * seq_len * elem_bytes
    largest = max(alloc_sizes)
    return {"seq_len": seq_len, "square_bytes": square, "largest_alloc_bytes": largest,
            "largest_over_square": largest / square, "peak_bytes": peak_bytes,
            "step_rise_bytes": peak_bytes - base_bytes, "step_rise_over_square": (peak_bytes - base_bytes) / square,
            "ok": largest < square}


def alloc_sizes_from_snapshot(snapshot: Dict) -> List[int]:
    """Sizes of every allocation in a ``torch.cuda.memory._snapshot()`` trace."""
    return [e["size"] for trace in snapshot.get("device_traces", []) for e in trace if e.get("action") == "alloc"]


def measure_step_memory(run: tr.Run, batch: tr.Batch, act_dtype: torch.dtype, lr: float, seq_len: int) -> Dict:
    """One training step on CUDA with the allocator's history on: peak memory and the
    :func:`quadratic_memory_check` verdict. (The step trains: call it in place of a regular one.)"""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
    try:
        run.step(0, batch, act_dtype, lr=lr)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return quadratic_memory_check(alloc_sizes_from_snapshot(snapshot), torch.cuda.max_memory_allocated(), base,
                                  seq_len)


# ---------------------------------------------------------------------------------------------
# Training


def train_recipe(cfg: LongConfig, recipe: str, device: str, *, budget_seconds: Optional[float] = None,
                 fractions=STAGE_FRACTIONS, log_every: int = 25, memory_check: bool = False) -> Dict:
    """Trains one model by ``recipe`` (:func:`recipe_stages`) on fresh batches (the data stream
    depends on ``cfg.seed`` only, so two recipes see the same batches). Returns the per-step history
    of :class:`train_recall.Run` plus ``stage``, ``seconds``, ``tokens_per_second``; ``stages``
    (name, first step, steps, seconds, trainable/frozen parameter counts, a frozen-parameter
    check) and, with ``memory_check`` on CUDA, ``memory`` per stage."""
    act_dtype = tr.activation_dtype(device)  # on CUDA: checks for a GPU and a build with the CUDA kernels
    run = tr.Run(cfg, recipe, device, act_dtype, backend="fused")
    vocab = tr.Vocab.of(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    h = run.hist
    h.update(stage=[], tokens_per_second=[])
    stages_out, memory, result_extra, kl_targets = [], {}, {}, []
    global_step, start = 0, time.perf_counter()
    h["seq_len"] = []
    for stage in recipe_stages(cfg, recipe, budget_seconds, fractions):
        if recipe == "two-stage" and budget_seconds is not None and stage.name != "dense":
            # Time a stage leaves unused goes to the next one: stage 1 ends at its cumulative share
            # of the budget, stage 2 at the budget's end.
            deadline = budget_seconds * (sum(fractions[:2]) if stage.name == "warmup" else 1.0)
            stage = stage._replace(seconds=max(0.0, deadline - (time.perf_counter() - start)))
        counts = apply_stage(run.model, stage)
        frozen_before = {n: p.detach().clone() for n, p in run.model.named_parameters() if not p.requires_grad}
        stage_start, i = time.perf_counter(), 0
        lengths = curriculum_lengths(cfg) if stage.name == "dense" else [cfg.seq_len]
        level, level_start = 0, 0
        print(f"[{recipe}] stage {stage.name}: attention {stage.attention}, dense KL {'on' if stage.dense_kl else 'off'}, "
              f"trains {stage.trains} ({counts['trainable']} parameters, {counts['frozen']} frozen), lr {stage.lr:g}, "
              f"up to {stage.steps} steps" + (f" / {stage.seconds:.0f} s" if stage.seconds else "")
              + (f", sequence lengths {lengths}" if len(lengths) > 1 else ""), flush=True)
        while i < stage.steps:
            elapsed = time.perf_counter() - stage_start
            if stage.seconds is not None and elapsed >= stage.seconds:
                break
            progress = max(i / stage.steps, elapsed / stage.seconds if stage.seconds else 0.0)
            recent = h["accuracy"][-10:] if i - level_start >= 10 else []
            reached = bool(recent) and sum(recent) / len(recent) >= cfg.switch_accuracy
            if stage.name == "dense" and reached and level == len(lengths) - 1:
                print(f"[{recipe}] stage dense: accuracy {sum(recent) / len(recent):.3f} >= {cfg.switch_accuracy}: next stage")
                break
            if stage.name == "warmup" and i >= 10:
                recall = [r[0] for r in h["recall"][-10:]]
                if sum(recall) / 10 >= cfg.switch_recall:
                    print(f"[{recipe}] stage warmup: recall {sum(recall) / 10:.3f} >= {cfg.switch_recall}: next stage")
                    break
            if level < len(lengths) - 1 and (reached or progress >= (level + 1) / len(lengths)):
                level, level_start = level + 1, i
                print(f"[{recipe}] stage dense: sequence length {lengths[level]} from step {global_step + 1}", flush=True)
            lr = stage_lr(stage.lr, i, progress, cfg.warmup, cfg.warmup_schedule if stage.name == "warmup" else "cosine")
            batch = make_long_batch(at_length(cfg, lengths[level]), vocab, gen).to(device)
            if stage.dense_kl:
                if i == 0:  # what the dense KL target holds about the needed key, per layer
                    run.model.set_attention("dense")
                    diag = pair_attention(run.model, batch, act_dtype, cfg.topk)
                    result_extra["pair_attention"] = diag
                    for layer, d in enumerate(diag):
                        print(f"[{recipe}] dense attention at the answer rows, layer {layer}: needed key's probability "
                              f"{d['pair_mass']:.3f} head-averaged, {d['best_head_mass']:.3f} best head; first in the "
                              f"target for {d['pair_top1']:.2f}, in its top-{cfg.topk} for {d['pair_in_topk']:.2f} of the "
                              f"queries" + (" (full layer)" if layer in h["full_layers"] else ""), flush=True)
                    if cfg.kl_target == "answering":
                        chosen = answering_layers(run.model, diag)
                        result_extra["kl_target_layers"] = chosen
                        kl_targets = [TargetLayerKL(run.model, full, layer) for full, layer in chosen.items()]
                        print(f"[{recipe}] stage warmup: dense KL target of each full layer's indexer (full layer: "
                              f"target layer) {chosen}", flush=True)
                    elif cfg.kl_target != "own":
                        raise ValueError(f"kl_target must be 'own' or 'answering', got {cfg.kl_target!r}")
                rows = warmup_kl_rows(cfg, batch)
                if kl_targets:  # the targets' hooks compute the loss; the layers' own dense KL off
                    run.model.set_attention("dense")
                    for target in kl_targets:
                        target.rows = rows
                else:
                    run.model.set_attention("dense", dense_kl=True, kl_rows=rows)
            h["seq_len"].append(lengths[level])
            t0 = time.perf_counter()
            full_steps = sum(1 for n in h["seq_len"][len(h["seq_len"]) - (i + 1):] if n == cfg.seq_len)
            if memory_check and device == "cuda" and stage.name not in memory and full_steps == 2:
                # the second step at full length (the first one warmed the kernels up)
                memory[stage.name] = measure_step_memory(run, batch, act_dtype, lr, cfg.seq_len)
            else:
                run.step(global_step, batch, act_dtype, lr=lr)
            now = time.perf_counter()
            h["seconds"].append(now - start)
            h["stage"].append(stage.name)
            h["tokens_per_second"].append(cfg.tokens / (now - t0))
            if i % log_every == 0 or i == stage.steps - 1:
                print(f"[{recipe}/{stage.name}] step {global_step + 1} ({now - start:.0f} s): {status(h)}", flush=True)
            i += 1
            global_step += 1
        if i:
            print(f"[{recipe}] end of stage {stage.name}: step {global_step}, {time.perf_counter() - start:.0f} s, "
                  f"mean of its last 20 steps: accuracy {sum(h['accuracy'][-min(i, 20):]) / min(i, 20):.3f}, recall "
                  f"{sum(r[0] for r in h['recall'][-min(i, 20):]) / min(i, 20):.3f}", flush=True)
        for target in kl_targets:
            target.remove()
        kl_targets = []
        changed = [n for n, p in run.model.named_parameters() if n in frozen_before and not torch.equal(p, frozen_before[n])]
        stages_out.append({"name": stage.name, "first_step": global_step - i, "steps": i,
                           "seconds": time.perf_counter() - stage_start, **counts,
                           "frozen_parameters_changed": changed})
    result = {"history": h, "stages": stages_out, **result_extra}
    if memory:
        result["memory"] = memory
    return result


def status(h: Dict[str, list]) -> str:
    """The latest step's numbers, one line."""
    kl = h["kl_loss"][-1]
    return (f"loss {h['lm_loss'][-1]:.3f} acc {h['accuracy'][-1]:.3f} recall {max(h['recall'][-1]):.3f} "
            f"(random {h['chance_recall'][-1]:.3f}) kl {sum(kl):.3f} lr {h['lr'][-1]:.2e} "
            f"{h['tokens_per_second'][-1] / 1e3:.1f}K tok/s")


def summarize(result: Dict, window: int = 20) -> Dict[str, float]:
    """Per recipe: steps, seconds, tokens/s (mean), accuracy, recall (each full layer) and the
    recall of a random top-K averaged over the last ``window`` steps; per stage its steps and seconds."""
    h = result["history"]
    n = len(h["lm_loss"])
    tail = slice(max(0, n - window), n)
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    out = {"steps": n, "seconds": h["seconds"][-1] if n else 0.0, "tokens_per_second": mean(h["tokens_per_second"]),
           "accuracy_last": mean(h["accuracy"][tail]), "lm_loss_last": mean(h["lm_loss"][tail]),
           "random_topk_recall": mean(h["chance_recall"][tail])}
    for j, layer in enumerate(h["full_layers"]):
        out[f"recall_last_L{layer}"] = mean([r[j] for r in h["recall"][tail]])
    for st in result["stages"]:
        out[f"{st['name']}_steps"], out[f"{st['name']}_seconds"] = st["steps"], st["seconds"]
    return out


# ---------------------------------------------------------------------------------------------
# Plot


def plot_runs(results: Dict[str, Dict], cfg: LongConfig, task: Dict, path: Path, title: str) -> None:
    """Accuracy and the first full layer's top-K recall of the needed key over steps for each
    recipe (stage boundaries of the two-stage run dashed), with chance accuracy and the recall of a
    random top-K; LM loss and indexer KL below."""
    plt = tr._pyplot()
    fig, ax = plt.subplots(2, 2, figsize=(13, 8))
    colors = {"two-stage": "C0", "scratch": "C3"}
    for recipe, res in results.items():
        h, c = res["history"], colors.get(recipe, "k")
        steps = list(range(1, len(h["lm_loss"]) + 1))
        w = max(1, len(steps) // 60)
        secs = h["seconds"][-1] if h["seconds"] else 0
        ax[0, 0].plot(steps, tr.smooth(h["accuracy"], w), color=c, lw=2, label=f"{recipe} ({len(steps)} steps, {secs:.0f} s)")
        ax[0, 1].plot(steps, tr.smooth([r[0] for r in h["recall"]], w), color=c, lw=2,
                      label=f"{recipe}: full layer {h['full_layers'][0]}")
        ax[0, 1].plot(steps, h["chance_recall"], color=c, ls=":", lw=1, label=f"{recipe}: random top-{cfg.topk}")
        short = [s for s, n in zip(steps, h.get("seq_len", [])) if n < cfg.seq_len]
        if short:  # the curriculum's shorter sequences (the metrics are on those, not the full task)
            for a in (ax[0, 0], ax[0, 1]):
                a.axvspan(short[0] - 0.5, short[-1] + 0.5, color=c, alpha=0.07)
            ax[0, 0].text(short[-1], 0.92, f"curriculum: sequences < {cfg.seq_len}", color=c, fontsize=8, ha="right")
        ax[1, 0].plot(steps, tr.smooth(h["lm_loss"], w), color=c, label=recipe)
        kl = [sum(v) for v in h["kl_loss"]]
        ax[1, 1].plot([s for s, v in zip(steps, kl) if math.isfinite(v)], [v for v in kl if math.isfinite(v)],
                      color=c, lw=0.8, label=recipe)
        for st in res["stages"][1:]:
            for a in ax.flat:
                a.axvline(st["first_step"] + 0.5, color=c, ls="--", lw=0.8, alpha=0.6)
        if len(res["stages"]) > 1:
            for st in res["stages"]:
                ax[0, 0].text(st["first_step"] + 1, 1.0, f"stage {st['name']}", color=c, fontsize=8, va="top")
    ax[0, 0].axhline(task["chance_accuracy"], ls=":", color="gray", label=f"chance (1/{cfg.num_values})")
    ax[0, 0].set(title="task accuracy", xlabel="step", ylim=(0, 1.03))
    ax[0, 1].set(title=f"top-{cfg.topk} recall of the needed key\n(the indexer's top-K; in the dense stages measured only)",
                 xlabel="step", ylim=(0, 1.03))
    ax[1, 0].axhline(math.log(cfg.num_values), ls=":", color="gray", label="ln(#values)")
    ax[1, 0].set(title="LM loss on the answers", xlabel="step")
    ax[1, 1].set(title="indexer KL (stage 1: dense, stage 2 / scratch: sparse)", xlabel="step", yscale="log")
    for a in ax.flat:
        a.legend(fontsize=8)
    tr.save_figure(fig, title, path)


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default: cpu or cuda, as --device")
    ap.add_argument("--recipe", default="two-stage", choices=["two-stage", "scratch"])
    ap.add_argument("--compare", action="store_true", help="run both recipes (same init, batches and budget)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                    help="no training: plot and summarize the runs of these output JSONs together (compare.png/json)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="wall-clock budget of each recipe (two-stage: split by --stage-fractions); steps are caps")
    ap.add_argument("--stage-fractions", type=float, nargs=3, default=list(STAGE_FRACTIONS), metavar=("DENSE", "WARMUP", "SPARSE"))
    ap.add_argument("--memory-check", action="store_true", help="CUDA: allocator peak and T x T check, one step per stage")
    ap.add_argument("--out", type=Path, default=Path("train_long_out"), help="output folder")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    tr.add_config_options(ap, LongConfig, PRESETS)
    return ap.parse_args(argv)


def build_config(args: argparse.Namespace) -> LongConfig:
    """The preset with the options given on the command line applied over it."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(LongConfig) if getattr(args, f.name) is not None}
    return dataclasses.replace(PRESETS[args.preset or args.device], **given)


def describe_run(cfg: LongConfig, device: str) -> tuple:
    """(where, shape): the device line and the shape line of the plots' titles."""
    where = "CPU backend, fp32" if device == "cpu" else f"{torch.cuda.get_device_name()}, bf16"
    shape = (f"{cfg.seqs} x {cfg.seq_len} tokens/step, H={cfg.heads} D_qk={cfg.d_qk} K={cfg.topk} H_I={cfg.idx_heads} "
             f"D_I={cfg.idx_dim}, {cfg.layers} layers, IndexShare 1-in-{cfg.topk_freq}")
    return where, shape


def main(argv=None) -> Dict:
    """Runs the example; returns what it writes to the JSON file (the tests use it)."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        saved = [json.loads(path.read_text()) for path in args.merge]
        cfg = LongConfig(**{k: v for k, v in saved[0]["config"].items() if k in {f.name for f in dataclasses.fields(LongConfig)}})
        task, results, where = saved[0]["task"], {}, saved[0].get("where", args.device)
        for entry in saved:
            results.update(entry["runs"])
        name = "compare"
        shape = describe_run(cfg, "cpu")[1]
    else:
        cfg = build_config(args)
        task = describe_long_task(cfg)
        where, shape = describe_run(cfg, args.device)
        print(f"long-range recall on {where}: {shape}")
        print(f"{task['queries_per_step']} queries/step; query-to-pair distance min {task['distance_min']:.0f} median "
              f"{task['distance_median']:.0f} max {task['distance_max']:.0f}; chance accuracy {task['chance_accuracy']:.4f}; "
              f"recall of a random top-{cfg.topk} {task['random_topk_recall']:.4f}", flush=True)
        budget = None if args.budget_minutes is None else 60 * args.budget_minutes
        recipes = ["two-stage", "scratch"] if args.compare else [args.recipe]
        results = {}
        for recipe in recipes:
            results[recipe] = train_recipe(cfg, recipe, args.device, budget_seconds=budget,
                                           fractions=tuple(args.stage_fractions), log_every=args.log_every,
                                           memory_check=args.memory_check)
            results[recipe]["summary"] = summarize(results[recipe])
        name = "compare" if args.compare else args.recipe
    plot_runs(results, cfg, task, args.out / f"{name}.png",
              f"long-range recall, {where}\n{shape}; pairs {cfg.dist_min}-{cfg.dist_max} back")
    out = {"config": dataclasses.asdict(cfg), "task": task, "where": where, "runs": results}
    (args.out / f"{name}.json").write_text(json.dumps(out))
    print(f"{'recipe':10s} {'steps':>6s} {'seconds':>8s} {'tok/s':>9s} {'accuracy':>9s} {'recall L0':>10s} {'random':>7s}")
    for recipe, res in results.items():
        s = res["summary"]
        layer = res["history"]["full_layers"][0]
        print(f"{recipe:10s} {s['steps']:6d} {s['seconds']:8.1f} {s['tokens_per_second']:9.0f} {s['accuracy_last']:9.3f} "
              f"{s[f'recall_last_L{layer}']:10.3f} {s['random_topk_recall']:7.3f}")
        for stage, m in res.get("memory", {}).items():
            print(f"  memory, {stage} step: peak {m['peak_bytes'] / 2**30:.2f} GiB, largest allocation "
                  f"{m['largest_alloc_bytes'] / 2**20:.0f} MiB = {m['largest_over_square']:.3f} x one {cfg.seq_len}^2 bf16 "
                  f"matrix -> {'no T^2 tensor' if m['ok'] else 'T^2 TENSOR'}")
    print(f"wrote {args.out / (name + '.png')}")
    return out


if __name__ == "__main__":
    main()
