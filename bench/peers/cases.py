"""The A/B cases: for each kernel, T and head count, FlashDSA against each peer on the same inputs.

Each peer adapter converts our inputs to the peer's layout and conventions *outside* the timed
region (views where possible: kv [T, D] -> [T, 1, D], indices [T, K] -> [T, 1, K]; both use -1 for
empty slots), and cross-checks the peer's outputs against ours:

| kernel | peer | what is compared |
|---|---|---|
| sparse_mla_fwd | FlashMLA SM90 sparse prefill (`sparse_prefill_fwd`) | out (rel. error), lse (natural log, max abs) |
| sparse_mla_fwd | TileLang, megatron-core's `sparse_mla_fwd_interface` | out, lse (TileLang's is log2: × ln 2) |
| sparse_mla_bwd | cuDNN frontend `sparse_attention_backward_wrapper` (our out + lse, sink -inf) | dq, dkv |
| sparse_mla_bwd | TileLang `sparse_mla_bwd` (its own forward's out + lse, made outside the timing) | dq, dkv |
| sparse_mla_bwd | megatron-core `SparseMLA.backward` (re-runs the forward, as Megatron trains) | dq, dkv |
| indexer_topk | cuDNN `indexer_forward_wrapper` (bf16, T×T fp32 scores) + `indexer_top_k_wrapper` | recall of our exact top-k |
| indexer_topk | cuDNN `indexer_forward_wrapper` alone (scores only) | scores at our selected keys |
| indexer_topk | megatron-core TileLang indexer + `torch.topk` in 8192-row blocks | recall of our exact top-k |
| indexer_topk | megatron-core TileLang indexer logits alone (8192-row blocks) | logits at our selected keys (first block) |
| indexer_topk | TileLang's example FP8 indexer (no clean pass) + its radix top-k (row blocks of <= 16 GiB, < 2^31 elements; T <= 64K) | recall of our exact top-k |
| indexer_topk | TileLang's example FP8 indexer logits alone, as its entry point (row blocks of <= 16 GiB, < 2^31 elements) | logits at our selected keys (first block) |

Our indexer side runs the exact bf16 selection (the raw op) by default; with cfg.indexer_selection ==
"fp8" (bench/run.py --indexer-selection fp8) it is the public flashdsa.indexer_topk(..., selection="fp8"),
whose per-row e4m3 quantization is part of the timed call. The cross-checks of the indexer paths then
still compare the peer with our exact bf16 top-k (computed once, on the checked input set, outside the
timing), and add the fp8 selection's recall of it (fp8_recall_mean, fp8_recall_min).

FLOPs are those of bench/flops.py (docs/spec.md §9) for both sides, so TFLOP/s compare like for like
(a peer that recomputes more is charged for it in time, not in FLOPs).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import flops
from ..config import BenchConfig, DsaShape, fp8_selection_kwargs
from ..inputs import causal_ranges, causal_topk_indices, input_set_count
from ..runner import NotApplicable
from .ab import ABPrepared, Side, max_abs_err, rel_err, topk_recall
from .registry import PeerStatus

FWD, BWD, INDEXER = "sparse_mla_fwd", "sparse_mla_bwd", "indexer_topk"
KERNELS = (FWD, BWD, INDEXER)
# megatron-core's TileLang indexer runs in blocks of query rows of this size (its default).
TILELANG_INDEXER_BLOCK = 8192
# TileLang's example FP8 indexer writes an fp32 logits matrix [rows, T]: the adapter calls it on blocks of
# query rows of at most this many GiB (FLASHDSA_TL_FP8_LOGITS_GIB overrides) and fewer than 2^31 elements
# (tilelang_fp8_rows): one call up to T = 32K, 32640-row blocks at 64K, 16256-row blocks at 128K.
TILELANG_FP8_LOGITS_GIB = 16.0
# TileLang's example top-k selector (topk_selector.py at a35008a) collects the threshold bin's entries in a
# 4096-entry shared buffer without a bound check; on the H200 (2026-12-02) the case at T = 128K ended the
# process with an illegal memory access, so its "logits + top-k" path runs up to this T only.
TILELANG_FP8_TOPK_MAX_T = 65536
# That buffer's capacity: before each "logits + top-k" case the adapter counts, on the case's first input set, how
# many entries each row puts into its threshold bin (tilelang_topk_bin_load) and declines the case (n/a) when a row
# would put more; the largest count is reported with the case's checks (tl_bin_max).
TILELANG_TOPK_BIN_CAPACITY = 4096
LN2 = math.log(2.0)


@dataclass(frozen=True)
class PeerPlan:
    """Which (kernel, T, heads) points a peers run measures.

    heads: the head counts measured at every T per kernel (H for the attention kernels, H_I for
    the indexer); extra_heads: more head counts measured only at extra_t (when extra_t is in seq_lens).
    """

    seq_lens: Tuple[int, ...]
    kernels: Tuple[str, ...] = KERNELS
    heads: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    extra_t: Optional[int] = None
    extra_heads: Dict[str, Tuple[int, ...]] = field(default_factory=dict)

    def points(self, kernel: str) -> List[Tuple[int, int]]:
        """(T, heads) pairs of a kernel, T ascending."""
        out = []
        for t in self.seq_lens:
            hs = list(self.heads.get(kernel, ()))
            if t == self.extra_t:
                hs += [h for h in self.extra_heads.get(kernel, ()) if h not in hs]
            out += [(t, h) for h in hs]
        return out


# The standard plan of issues 19-21: H = 64 everywhere, H = 128 for the forward and H = 16/32/128 for
# the backward at 32K, indexer H_I = 32 and 64, T = 4K ... 128K.
PEER_SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072)


def make_plan(cfg: BenchConfig, seq_lens: Optional[Sequence[int]] = None,
              kernels: Sequence[str] = KERNELS) -> PeerPlan:
    """The plan for a run: the standard one on CUDA (T from cfg unless it is the default list), the
    CPU shape's heads at cfg's T on the CPU (only a fake peer runs there)."""
    s = cfg.dsa
    if seq_lens is None:
        seq_lens = cfg.seq_lens
    if cfg.on_cuda:
        return PeerPlan(tuple(seq_lens), tuple(kernels),
                        heads={FWD: (s.heads,), BWD: (s.heads,), INDEXER: (32, 64)},
                        extra_t=32768, extra_heads={FWD: (128,), BWD: (16, 32, 128)})
    return PeerPlan(tuple(seq_lens), tuple(kernels),
                    heads={FWD: (s.heads,), BWD: (s.heads,), INDEXER: (s.index_heads,)})


@dataclass
class PeerCase:
    """One A/B measurement: FlashDSA's `kernel` against one peer at (T, heads)."""

    kernel: str
    peer_key: str  # registry key of the peer package
    peer: str  # display name of the peer's path
    t: int
    heads: int
    flops: float
    prepare: Callable[[], ABPrepared]
    note: str = ""
    unsupported: str = ""  # why the peer cannot run this point (e.g. its head counts), else ""

    @property
    def series(self) -> str:
        """Identifies the case across T (for time predictions and stop rules)."""
        return f"{self.kernel}|{self.peer}|{self.heads}"


@dataclass
class Context:
    """What an adapter needs: the device, dtype, the shape at this point, our ops, the peer module."""

    cfg: BenchConfig
    shape: DsaShape
    t: int
    ops: Any  # torch.ops.flashdsa (or a stand-in with the same methods)
    peer: Any  # the present peer's module (PeerStatus.module)
    sets: int  # input sets to rotate

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, dtype=self.cfg.dtype, device=self.cfg.device)


# ---------------------------------------------------------------------- our sides and inputs

def attention_inputs(ctx: Context, with_forward: bool, with_dout: bool = False) -> dict:
    """Random q [T, H, D_qk], kv [T, D_qk], distinct causal indices [T, K] (-1 padded); optionally
    our forward's out and lse, and an upstream gradient dout [T, H, D_v]."""
    s, t = ctx.shape, ctx.t
    a = {"q": ctx.randn(t, s.heads, s.d_qk), "kv": ctx.randn(t, s.d_qk),
         "idx": causal_topk_indices(t, s.topk, ctx.cfg.device, order=ctx.cfg.index_order)}
    if with_forward:
        a["out"], a["lse"] = ctx.ops.sparse_mla_fwd(a["q"], a["kv"], a["idx"], s.scale)
    if with_dout:
        a["dout"] = ctx.randn(t, s.heads, s.d_v)
    return a


def index_inputs(ctx: Context) -> dict:
    """Random indexer inputs: q_idx [T, H_I, D_I], k_idx [T, D_I], weights [T, H_I] fp32, causal ranges."""
    s, t = ctx.shape, ctx.t
    weights = torch.randn(t, s.index_heads, device=ctx.cfg.device) * (s.index_heads * s.index_dim) ** -0.5
    k_start, k_end = causal_ranges(t, ctx.cfg.device)
    return {"q_idx": ctx.randn(t, s.index_heads, s.index_dim), "k_idx": ctx.randn(t, s.index_dim),
            "weights": weights, "k_start": k_start, "k_end": k_end}


def ours_fwd(ctx: Context) -> Callable:
    """FlashDSA's sparse_mla_fwd on an attention input set."""
    scale = ctx.shape.scale
    return lambda a: ctx.ops.sparse_mla_fwd(a["q"], a["kv"], a["idx"], scale)


def ours_bwd(ctx: Context) -> Callable:
    """FlashDSA's sparse_mla_bwd (fast, non-deterministic mode) from our forward's out and lse."""
    scale = ctx.shape.scale
    return lambda a: ctx.ops.sparse_mla_bwd(a["q"], a["kv"], a["idx"], scale, a["out"], a["lse"], a["dout"], False)


def ours_indexer(ctx: Context) -> Callable:
    """FlashDSA's fused indexer_topk (ReLU): the raw op's exact bf16 selection, or with
    an FP8 cfg.indexer_selection the public flashdsa.indexer_topk(..., selection="fp8", ...) with that selection's
    settings (config.fp8_selection_kwargs: e4m3 selection, exact re-score of the candidates or of the band; the
    quantization of q_idx / k_idx is in the call)."""
    k = ctx.shape.topk
    if ctx.cfg.indexer_selection != "bf16":
        from flashdsa import ops as flashdsa_ops  # the public function, as a user calls it
        indexer_topk = flashdsa_ops.indexer_topk
        kwargs = fp8_selection_kwargs(ctx.cfg.indexer_selection, k)  # a band: indices only (scores None)
        return lambda a: indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], k, True,
                                      **kwargs)
    return lambda a: ctx.ops.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], k, True)


def fwd_check(lse_to_natural: float = 1.0, out_at: int = 0, lse_at: Optional[int] = 1):
    """Cross-check of a forward: rel. error of out, max abs error of lse (peer lse × lse_to_natural)."""
    def check(ours, peer, _set):
        result = {"out_rel_err": rel_err(peer[out_at], ours[0])}
        if lse_at is not None:
            result["lse_max_abs_err"] = max_abs_err(peer[lse_at].float() * lse_to_natural, ours[1])
        return result
    return check


def bwd_check(ours, peer, _set) -> Dict[str, float]:
    """Cross-check of a backward: rel. errors of dq and dkv (peer results as (dq, dkv))."""
    dq, dkv = peer
    return {"dq_rel_err": rel_err(dq.reshape(ours[0].shape), ours[0]),
            "dkv_rel_err": rel_err(dkv.reshape(ours[1].shape), ours[1])}


def recall_check(ours, peer, _set) -> Dict[str, float]:
    """Recall of our exact top-k by the peer's indices ([T, K] or [1, T, K])."""
    return topk_recall(peer.reshape(ours[0].shape[0], -1), ours[0])


def indexer_check(ctx: Context, ours_sets: List[dict], check: Callable) -> Callable:
    """The cross-check of an indexer path: `check` itself with the bf16 selection. With the fp8 one
    (cfg.indexer_selection), our exact bf16 top-k (the raw op) is computed on the checked input set,
    outside the timing; `check` compares the peer with it, as in a bf16 run, and the fp8 selection's
    recall of it is added: fp8_recall_mean (over rows) and fp8_recall_min (the worst row)."""
    if ctx.cfg.indexer_selection == "bf16":
        return check
    k = ctx.shape.topk

    def checked(ours, peer, set_index: int) -> Dict[str, float]:
        a = ours_sets[set_index]
        exact = ctx.ops.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], k, True)
        result = dict(check(exact, peer, set_index))
        fp8 = topk_recall(ours[0], exact[0])
        del exact
        result.update(fp8_recall_mean=fp8["recall_mean"], fp8_recall_min=fp8["recall_min"])
        return result
    return checked


def selected_scores_check(rows: Optional[int] = None):
    """rel. error of the peer's dense scores [rows, T_kv] gathered at our selected keys vs our scores."""
    def check(ours, peer, _set):
        idx, scores = ours
        n = peer.shape[-2] if rows is None else rows
        dense = peer.reshape(-1, peer.shape[-1])[:n]
        idx, scores = idx[:n], scores[:n]
        gathered = dense.gather(1, idx.clamp_min(0).long())
        gathered = torch.where(idx >= 0, gathered, torch.full_like(gathered, -math.inf))
        return {"scores_rel_err": rel_err(gathered, scores.float())}
    return check


# ---------------------------------------------------------------------- peer adapters

def flashmla_fwd(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
    """FlashMLA's sparse prefill forward on views of our inputs (kv [T, 1, D], indices [T, 1, K])."""
    op, s, t = ctx.peer, ctx.shape, ctx.t
    args = [(a["q"], a["kv"].view(t, 1, s.d_qk), a["idx"].view(t, 1, s.topk)) for a in ours_sets]
    return ABPrepared(Side(ours_fwd(ctx), ours_sets),
                      Side(lambda p: op(p[0], p[1], p[2], s.scale, s.d_v), args),
                      fwd_check(lse_to_natural=1.0, out_at=0, lse_at=2))


def tilelang_fwd(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
    """megatron-core's TileLang sparse MLA forward on views of our inputs; its lse is log2-based."""
    tl, s, t = ctx.peer, ctx.shape, ctx.t
    args = [(a["q"], a["kv"].view(t, 1, s.d_qk), a["idx"].view(t, 1, s.topk)) for a in ours_sets]
    return ABPrepared(Side(ours_fwd(ctx), ours_sets),
                      Side(lambda p: tl.sparse_mla_fwd(p[0], p[1], p[2], sm_scale=s.scale, d_v=s.d_v), args),
                      fwd_check(lse_to_natural=LN2))


def cudnn_bwd(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
    """cuDNN frontend's DSA backward from our forward's out and lse, attention sink disabled (-inf)."""
    m, s = ctx.peer, ctx.shape
    sink = torch.full((s.heads,), -math.inf, dtype=torch.float32, device=ctx.cfg.device)  # no attention sink

    def call(a):
        r = m.sparse_attention_backward_wrapper(a["q"], a["kv"], a["out"], a["dout"], a["lse"], sink, a["idx"],
                                                softmax_scale=s.scale)
        return r["dq"], r["dkv"]
    return ABPrepared(Side(ours_bwd(ctx), ours_sets), Side(call, ours_sets), bwd_check)


def tilelang_bwd(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
    """megatron-core's TileLang sparse MLA backward from its own forward (made outside the timing)."""
    tl, s, t = ctx.peer, ctx.shape, ctx.t
    args = []
    for a in ours_sets:  # TileLang's backward takes its own forward's out and (log2) lse
        kv3, idx3 = a["kv"].view(t, 1, s.d_qk), a["idx"].view(t, 1, s.topk)
        out, lse = tl.sparse_mla_fwd(a["q"], kv3, idx3, sm_scale=s.scale, d_v=s.d_v)
        args.append((a["q"], kv3, out, a["dout"], idx3, lse))
    return ABPrepared(Side(ours_bwd(ctx), ours_sets),
                      Side(lambda p: tl.sparse_mla_bwd(*p, sm_scale=s.scale), args), bwd_check)


def megatron_bwd(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
    """megatron-core's SparseMLA.backward as Megatron trains: re-runs the forward, delta, backward."""
    tl, s, t = ctx.peer, ctx.shape, ctx.t
    args = []
    for a in ours_sets:  # Megatron's SparseMLA saves (q, kv, indices, valid heads) and recomputes out, lse
        q4, kv4 = a["q"].unsqueeze(0), a["kv"].view(1, t, 1, s.d_qk)
        idx4 = a["idx"].view(1, t, 1, s.topk)
        valid_heads = idx4.ge(0).any(dim=-1).repeat_interleave(s.heads, dim=-1)
        saved = types.SimpleNamespace(saved_tensors=(q4, kv4, idx4, valid_heads), scaling=s.scale)
        args.append((saved, a["dout"].unsqueeze(0)))

    def call(p):
        dq, dkv, _, _ = tl.SparseMLA.backward(p[0], p[1], None)
        return dq, dkv
    return ABPrepared(Side(ours_bwd(ctx), ours_sets), Side(call, args), bwd_check)


def cudnn_indexer(scores_only: bool):
    """cuDNN frontend's bf16 indexer scores (T×T fp32), then its top-k unless scores_only."""
    def adapter(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
        m, s, t = ctx.peer, ctx.shape, ctx.t
        args = [(a["q_idx"].unsqueeze(0), a["k_idx"].view(1, t, 1, s.index_dim), a["weights"].unsqueeze(0),
                 a["k_end"]) for a in ours_sets]

        def call(p):
            scores = m.indexer_forward_wrapper(p[0], p[1], p[2], ratio=1, sm_scale=1.0)["scores"]
            if scores_only:
                return scores
            selected = m.indexer_top_k_wrapper(scores.view(t, -1), p[3], s.topk)["indices"]
            del scores
            return selected
        check = selected_scores_check() if scores_only else recall_check
        return ABPrepared(Side(ours_indexer(ctx), ours_sets), Side(call, args), indexer_check(ctx, ours_sets, check))
    return adapter


def tilelang_indexer(logits_only: bool):
    """megatron-core's TileLang indexer in 8192-row blocks, + torch.topk unless logits_only."""
    def adapter(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
        tl, s, t = ctx.peer, ctx.shape, ctx.t
        block = TILELANG_INDEXER_BLOCK
        if logits_only:
            args = [(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"]) for a in ours_sets]

            def call(p):
                first = None
                for start in range(0, t, block):  # as megatron-core's fused_qk_topk_lighting, without the top-k
                    end = min(start + block, t)
                    logits = tl.indexer_fwd(p[0][start:end], p[1], p[2][start:end], p[3][start:end], p[4][start:end])
                    first = logits if first is None else first
                return first
            return ABPrepared(Side(ours_indexer(ctx), ours_sets), Side(call, args),
                              indexer_check(ctx, ours_sets, selected_scores_check(rows=min(block, t))))
        args = [(a["q_idx"].unsqueeze(1), a["k_idx"].unsqueeze(1), a["weights"].unsqueeze(1), a["k_start"],
                 a["k_end"]) for a in ours_sets]
        def call(p):
            selected = tl.fused_qk_topk(p[0], p[1], p[2], s.topk, p[3], p[4], block)
            if selected is None:  # megatron-core's hook returns None for inputs it does not take
                raise RuntimeError("megatron-core's fused_qk_topk_lighting declined the inputs (returned None)")
            return selected
        return ABPrepared(Side(ours_indexer(ctx), ours_sets), Side(call, args),
                          indexer_check(ctx, ours_sets, recall_check))
    return adapter


def tilelang_fp8_rows(t: int) -> int:
    """Query rows per call of TileLang's example FP8 indexer at T = t: all t while the fp32 logits [t, t]
    fit in FLASHDSA_TL_FP8_LOGITS_GIB (default TILELANG_FP8_LOGITS_GIB) and hold fewer than 2^31 elements
    (int32 offsets), else the most rows, a multiple of 128 (the kernel's block_Q * H_I), whose [rows, t]
    logits do."""
    gib = float(os.environ.get("FLASHDSA_TL_FP8_LOGITS_GIB", TILELANG_FP8_LOGITS_GIB))
    rows = min(int(gib * 2 ** 30) // (4 * t), (2 ** 31 - 1) // t)  # and rows * t elements below 2^31
    return t if rows >= t else max(128, rows // 128 * 128)


def tilelang_topk_bin_load(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, topk: int,
                           rows_per_chunk: int = 512) -> Tuple[int, int]:
    """(largest count, its row) of the entries that rows of `logits` [rows, n] put into the threshold bin of the first
    pass of TileLang's example top-k selector (topk_selector.tl_topk at a35008a): each value in [starts[r], ends[r])
    is binned by the top 8 bits of its order-preserving fp16 key (negative values: all 16 bits inverted, others: the
    sign bit set), the threshold bin is the highest bin whose suffix count reaches topk (bin 0 when none does), and
    its entries are collected into a 4096-entry shared buffer with no bound check."""
    n_rows, n = logits.shape
    cols = torch.arange(n, device=logits.device)
    worst, worst_row = 0, -1
    for r0 in range(0, n_rows, rows_per_chunk):
        x = logits[r0:r0 + rows_per_chunk].float()
        bits = x.half().view(torch.int16).to(torch.int32) & 0xFFFF
        key = torch.where(x < 0, ~bits & 0xFFFF, bits | 0x8000) >> 8
        inside = (cols >= starts[r0:r0 + rows_per_chunk, None]) & (cols < ends[r0:r0 + rows_per_chunk, None])
        key = torch.where(inside, key, 256)  # outside the row's range: a bin of its own, never counted
        hist = torch.zeros(x.shape[0], 257, dtype=torch.int32, device=x.device)
        hist.scatter_add_(1, key.long(), torch.ones_like(key))
        del key, inside, bits
        hist = hist[:, :256]
        suffix = hist.flip(1).cumsum(1).flip(1)  # entries in bins >= b
        reach = suffix >= topk
        threshold = torch.where(reach.any(1), 255 - reach.flip(1).to(torch.int32).argmax(1), 0)
        load = hist.gather(1, threshold[:, None].long())[:, 0]
        value, row = load.max(0)
        if int(value) > worst:
            worst, worst_row = int(value), r0 + int(row)
    return worst, worst_row


def tilelang_topk_guard(ex, args: tuple, t: int, rows: int, topk: int, quantize_timed: bool) -> int:
    """The largest threshold-bin load (tilelang_topk_bin_load) of TileLang's example selector on one input set of the
    "logits + top-k" adapter (args: its peer-side tuple; the logits computed here, outside the timing, on the adapter's
    row blocks); raises NotApplicable when a row would overflow the selector's unchecked buffer."""
    q, k, scales = ex.quantize(args[0], args[1]) if quantize_timed else args[:3]
    w, ks, ke = args[3:6]
    load, load_row = 0, -1
    for start in range(0, t, rows):
        end = min(start + rows, t)
        logits = ex.logits(q[start:end].contiguous(), k.contiguous(), scales, w[start:end], ks[start:end],
                           ke[start:end], clean_logits=False)
        block_load, block_row = tilelang_topk_bin_load(logits, ks[start:end], ke[start:end], topk)
        del logits
        if block_load > load:
            load, load_row = block_load, start + block_row
    if load > TILELANG_TOPK_BIN_CAPACITY:
        raise NotApplicable(f"its selector would collect {load} entries of row {load_row} into its "
                            f"{TILELANG_TOPK_BIN_CAPACITY}-entry threshold-bin buffer, which it does not bound: "
                            "out-of-bounds accesses on these inputs")
    return load


def tilelang_fp8_indexer(logits_only: bool, quantize_timed: bool = False):
    """TileLang's example FP8 lightning indexer (fp8_lighting_indexer.mqa_attn_return_logits_interface),
    + its radix top-k selector (topk_selector.tl_topk) unless logits_only.

    The example's own quantization of our bf16 q_idx / k_idx (q cast to e4m3 as it is, k per token with an
    fp32 scale; its utils.per_custom_dims_cast_to_fp8) is a separate step in the example, not part of its
    entry point: it is done here, outside the timing. Timed: the entry point, on blocks of query rows of
    tilelang_fp8_rows(T) (one call while the fp32 logits fit the budget); logits alone: as the example calls
    it (clean_logits=True: the range kernel, then -inf outside [k_start, k_end)), the first block is
    returned for the check; + top-k: clean_logits=False (the selector reads only [k_start, k_end) of each
    row), then tl_topk on each block, into one [T, K] int32 result. Key ranges: our k_start / k_end are the
    example's cu_seqlen_ks / cu_seqlen_ke (start inclusive, end exclusive, int32 [T]).

    quantize_timed (+ top-k only): the like-for-like variant — the example's quantization of the bf16 q_idx / k_idx
    runs inside the timed call, as ours does (both sides then start from the same bf16 tensors)."""
    def adapter(ctx: Context, ours_sets: List[dict]) -> ABPrepared:
        ex, s, t = ctx.peer, ctx.shape, ctx.t
        rows = tilelang_fp8_rows(t)
        args = []
        for a in ours_sets:  # the peer's quantization, outside the timed region (unless quantize_timed)
            w, ks, ke = a["weights"].float().contiguous(), a["k_start"].int().contiguous(), a["k_end"].int().contiguous()
            if quantize_timed:
                args.append((a["q_idx"], a["k_idx"], None, w, ks, ke))
                continue
            q_fp8, k_fp8, k_scales = ex.quantize(a["q_idx"], a["k_idx"])
            args.append((q_fp8.contiguous(), k_fp8.contiguous(), k_scales, w, ks, ke))
        if logits_only:
            def call(p):
                q, k, scales, w, ks, ke = p
                first = None
                for start in range(0, t, rows):
                    end = min(start + rows, t)
                    logits = ex.logits(q[start:end], k, scales, w[start:end], ks[start:end], ke[start:end])
                    if first is None:
                        first = logits
                    del logits  # at most two blocks alive: the first and the current one
                return first
            return ABPrepared(Side(ours_indexer(ctx), ours_sets), Side(call, args),
                              indexer_check(ctx, ours_sets, selected_scores_check(rows=rows)))

        # Its selector's unchecked threshold-bin buffer, on the first input set (outside the timing): decline rather
        # than let it read out of bounds; the largest load joins the checks.
        load = tilelang_topk_guard(ex, args[0], t, rows, s.topk, quantize_timed)
        check = indexer_check(ctx, ours_sets, recall_check)

        def checked(ours, peer, set_index: int) -> Dict[str, float]:
            return {**check(ours, peer, set_index), "tl_bin_max": float(load)}

        def call(p):
            q, k, scales, w, ks, ke = p
            if quantize_timed:
                q, k, scales = ex.quantize(q, k)
                q, k = q.contiguous(), k.contiguous()
            if rows >= t:
                logits = ex.logits(q, k, scales, w, ks, ke, clean_logits=False)
                return ex.topk(logits, ks, ke, s.topk)
            selected = torch.empty(t, s.topk, dtype=torch.int32, device=q.device)
            for start in range(0, t, rows):
                end = min(start + rows, t)
                logits = ex.logits(q[start:end], k, scales, w[start:end], ks[start:end], ke[start:end],
                                   clean_logits=False)
                selected[start:end] = ex.topk(logits, ks[start:end], ke[start:end], s.topk)
                del logits
            return selected
        return ABPrepared(Side(ours_indexer(ctx), ours_sets), Side(call, args), checked)
    return adapter


def _divides_128(h: int) -> bool:
    return 1 <= h <= 128 and 128 % h == 0


@dataclass(frozen=True)
class PeerPath:
    """One way a peer computes one of our kernels."""

    kernel: str
    peer_key: str
    label: str
    adapter: Callable[[Context, List[dict]], ABPrepared]
    note: str = ""
    heads_ok: Callable[[int], bool] = lambda h: True
    heads_rule: str = ""
    t_ok: Callable[[int], bool] = lambda t: True
    t_rule: str = ""


def _pow2_at_least_16(h: int) -> bool:
    return h >= 16 and h & (h - 1) == 0


PATHS: Tuple[PeerPath, ...] = (
    PeerPath(FWD, "flashmla", "FlashMLA SM90 sparse prefill", flashmla_fwd,
             heads_ok=lambda h: h in (64, 128), heads_rule="H = 64 or 128"),
    PeerPath(FWD, "tilelang", "TileLang (megatron-core kernel)", tilelang_fwd,
             heads_ok=_pow2_at_least_16, heads_rule="H a power of two >= 16"),
    PeerPath(BWD, "cudnn", "cuDNN frontend", cudnn_bwd, note="our forward's out + lse, sink -inf"),
    PeerPath(BWD, "tilelang", "TileLang (megatron-core kernel)", tilelang_bwd,
             note="its own forward's out + lse, made outside the timing",
             heads_ok=_pow2_at_least_16, heads_rule="H a power of two >= 16"),
    PeerPath(BWD, "tilelang", "megatron-core SparseMLA.backward", megatron_bwd,
             note="re-runs the TileLang forward, as Megatron trains", heads_ok=_pow2_at_least_16,
             heads_rule="H a power of two >= 16"),
    PeerPath(INDEXER, "cudnn", "cuDNN bf16 scores + top-k", cudnn_indexer(False),
             note="T×T fp32 scores, then indexer_top_k_wrapper"),
    PeerPath(INDEXER, "cudnn", "cuDNN bf16 scores only", cudnn_indexer(True), note="no selection"),
    PeerPath(INDEXER, "tilelang", "TileLang logits + torch.topk (megatron-core)", tilelang_indexer(False),
             note=f"{TILELANG_INDEXER_BLOCK}-row blocks"),
    PeerPath(INDEXER, "tilelang", "TileLang logits only (megatron-core)", tilelang_indexer(True),
             note=f"{TILELANG_INDEXER_BLOCK}-row blocks, no selection"),
    PeerPath(INDEXER, "tilelang_fp8_example", "TileLang FP8 example logits + top-k", tilelang_fp8_indexer(False),
             note="its e4m3 quantization untimed; no clean pass; its radix top-k; fp32 logits in row blocks of "
                  "<= 16 GiB and < 2^31 elements", heads_ok=_divides_128, heads_rule="H_I dividing 128 (block_Q = 128 / H_I)",
             t_ok=lambda t: t <= TILELANG_FP8_TOPK_MAX_T,
             t_rule=f"T <= {TILELANG_FP8_TOPK_MAX_T}: its selector keeps the threshold bin in a 4096-entry shared "
                    "buffer without a bound check; at T = 128K it ended the process with an illegal address"),
    PeerPath(INDEXER, "tilelang_fp8_example", "TileLang FP8 example quantize + logits + top-k",
             tilelang_fp8_indexer(False, quantize_timed=True),
             note="like for like: its e4m3 quantization of the bf16 q_idx / k_idx inside the timed call, as ours; "
                  "otherwise as the row above", heads_ok=_divides_128, heads_rule="H_I dividing 128 (block_Q = 128 / H_I)",
             t_ok=lambda t: t <= TILELANG_FP8_TOPK_MAX_T,
             t_rule=f"T <= {TILELANG_FP8_TOPK_MAX_T}: as the row above"),
    PeerPath(INDEXER, "tilelang_fp8_example", "TileLang FP8 example logits alone", tilelang_fp8_indexer(True),
             note="its entry point with clean_logits; e4m3 quantization untimed; fp32 logits in row blocks of "
                  "<= 16 GiB and < 2^31 elements", heads_ok=_divides_128, heads_rule="H_I dividing 128 (block_Q = 128 / H_I)"),
)

INPUT_MAKERS = {
    FWD: lambda ctx: attention_inputs(ctx, with_forward=False),
    BWD: lambda ctx: attention_inputs(ctx, with_forward=True, with_dout=True),
    INDEXER: index_inputs,
}


def shape_at(s: DsaShape, kernel: str, heads: int) -> DsaShape:
    """The shape with H (attention kernels) or H_I (indexer) set to `heads`."""
    return dataclasses.replace(s, index_heads=heads) if kernel == INDEXER else dataclasses.replace(s, heads=heads)


def kernel_flops(kernel: str, t: int, s: DsaShape) -> float:
    """docs/spec.md §9 FLOPs of one call of `kernel` (bench/flops.py)."""
    return {FWD: flops.sparse_fwd_flops, BWD: flops.sparse_bwd_flops, INDEXER: flops.indexer_flops}[kernel](t, s)


def set_bytes(kernel: str, t: int, s: DsaShape) -> int:
    """Bytes of one input set of a kernel (inputs of both sides; the peer's are views or small)."""
    if kernel == INDEXER:
        return t * (s.index_heads + 1) * s.index_dim * 2 + t * s.index_heads * 4 + 8 * t
    attention = t * (s.heads + 1) * s.d_qk * 2 + t * s.topk * 4
    return attention if kernel == FWD else attention + 2 * t * s.heads * s.d_v * 2


def build_peer_cases(cfg: BenchConfig, plan: PeerPlan, peers: Dict[str, PeerStatus], ops: Any,
                     paths: Sequence[PeerPath] = PATHS) -> List[PeerCase]:
    """Every (path, T, heads) of the plan, T ascending; a case of an absent peer is still built (it
    is reported as absent without running)."""
    l2 = torch.cuda.get_device_properties(cfg.device).L2_cache_size if cfg.on_cuda else 0
    cases = []
    for kernel in plan.kernels:
        for t, heads in plan.points(kernel):
            s = shape_at(cfg.dsa, kernel, heads)
            for path in paths:
                if path.kernel != kernel:
                    continue
                status = peers.get(path.peer_key)

                def prepare(path=path, s=s, t=t, status=status) -> ABPrepared:
                    sets = input_set_count(set_bytes(path.kernel, t, s), l2) if cfg.on_cuda else 2
                    ctx = Context(cfg, s, t, ops, status.module if status else None, sets)
                    ours_sets = [INPUT_MAKERS[path.kernel](ctx) for _ in range(sets)]
                    return path.adapter(ctx, ours_sets)
                unsupported = ("" if path.heads_ok(heads) else f"supports {path.heads_rule}") or \
                              ("" if path.t_ok(t) else f"runs only at {path.t_rule}")
                cases.append(PeerCase(kernel, path.peer_key, path.label, t, heads, kernel_flops(kernel, t, s),
                                      prepare, path.note, unsupported))
    cases.sort(key=lambda c: c.t)  # stable: kernel order kept within a T
    return cases
