#!/usr/bin/env python3
"""Differential fuzz of every FlashDSA op: the device under test (CUDA, bf16) against the CPU
backend in float64 on the same bf16-rounded inputs (issue 17, docs/reliability.md).

Each case draws, from its own seed, random shapes within the CUDA kernels' limits (H in
{16, 32, 64, 128}, D_qk = 576, K a multiple of 64 up to 8192, H_I in {32, 64}, D_I in {64, 128},
T and T_kv), strided views, key ranges (packed THD causal, sliding windows, arbitrary ranges,
context-parallel zigzag rows with padding) and index patterns (-1, duplicates, out-of-range,
all-empty rows, a single key everywhere, exact ties), runs the raw op (torch.ops.flashdsa.*) on
the device and on the CPU in float64, and compares:

- bf16 / fp32 outputs: relative error norm (whole tensor and per row) against a tolerance for
  bf16 inputs; non-finite entries (-inf lse of empty rows) must match exactly.
- indexer_topk: every selected key visible and distinct, min(K, visible) of them, the returned
  scores equal to the float64 scores of those keys, and their multiset equal to the float64
  top-K (ties may be broken either way).

Seeds: case i of op `name` uses seed `--seed0 + i`; a failure prints the op, the seed, what
failed and a one-line repro command. Summary table last; exit 1 if any case failed.

    python tests/cuda/fuzz.py                         # CUDA, 200 cases per op, all ops
    python tests/cuda/fuzz.py --op sparse_mla_fwd --seed 17 -v   # repro one case
    python tests/cuda/fuzz.py --device cpu --cases 2  # CPU bf16 vs CPU float64 (checks the script)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field

import torch

import flashdsa
from flashdsa import reference
from flashdsa.context_parallel import pad_cu_seqlens, zigzag_rows
from flashdsa.thd import key_ranges_for_rows

ops = torch.ops.flashdsa
OPS = ("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass",
       "sparse_kl_fwd", "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd")
D_QK, D_V = 576, 512
HEADS = (16, 32, 64, 128)
INDEXER_HEADS = (32, 64)
INDEXER_DIMS = (64, 128)
BF16_TOL = 1e-2       # relative error norm of bf16 outputs (rounding 2^-9, bf16 P / dS in the GEMMs)
STAT_TOL = 1e-4       # fp32 statistics / losses computed in fp32 from bf16 inputs
GRAD_STAT_TOL = 5e-3  # fp32 gradients built from bf16-rounded intermediates (dkv, dk_idx, dweights)
ROW_FACTOR = 4        # per-row relative errors may reach ROW_FACTOR x the tensor's tolerance
ATOL = 1e-5           # absolute RMS error allowed per element on top (outputs that cancel to ~0,
                      # e.g. KL gradients of a row whose slots all hold one key: sum (p - target) = 0)


# ---------------------------------------------------------------------------------------------
# Random problems


@dataclass
class Problem:
    """One case: the raw op's arguments (on the CPU, bf16/fp32) and a description."""
    desc: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)


def _choice(g, seq):
    return seq[int(torch.randint(len(seq), (1,), generator=g))]


def _randint(g, lo, hi):
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _ranges(g, small):
    """(k_start, k_end, T_kv, kind): int32 [T] key ranges of one of several layouts."""
    kind = _choice(g, ("thd", "thd", "window", "arbitrary", "cp"))
    max_len = 24 if small else 48
    if kind == "cp":
        cp = _choice(g, (2, 4))
        lengths = [_randint(g, 0, max_len) for _ in range(_randint(g, 1, 3))]
        if sum(lengths) == 0:
            lengths[-1] = 1
        cu = flashdsa.cu_seqlens_from_lengths(lengths)
        cu_pad = pad_cu_seqlens(cu, 2 * cp)
        rank = _randint(g, 0, cp - 1)
        rows = zigzag_rows(cu_pad, cp, rank)
        k_start, k_end = key_ranges_for_rows(cu_pad, rows, valid_lengths=torch.tensor(lengths))
        return k_start, k_end, int(cu_pad[-1]), f"cp{cp}/rank{rank}"
    lengths = [_randint(g, 0, max_len) for _ in range(_randint(g, 1, 3))]
    if sum(lengths) == 0:
        lengths[0] = 1
    k_start, k_end = flashdsa.causal_key_ranges(flashdsa.cu_seqlens_from_lengths(lengths))
    T = k_start.shape[0]
    extra = _choice(g, (0, 0, 5, 64))  # trailing keys that no range reaches
    if kind == "window":
        w = _randint(g, 1, 32)
        k_start = torch.maximum(k_start, k_end - w)
    elif kind == "arbitrary":
        T_kv = T + extra
        a = torch.randint(0, T_kv + 1, (T,), generator=g)
        b = torch.randint(0, T_kv + 1, (T,), generator=g)
        return torch.minimum(a, b).int(), torch.maximum(a, b).int(), T_kv, kind
    return k_start.int(), k_end.int(), T + extra, kind


def _indices(g, k_start, k_end, K, T_kv):
    """int32 [T, K] of one index pattern, and its name."""
    T = k_start.shape[0]
    pattern = _choice(g, ("topk", "topk", "junk", "empty_rows", "all_empty", "one_key", "oob"))
    idx = torch.full((T, K), -1, dtype=torch.int32)
    for t in range(T):
        lo, hi = int(k_start[t]), int(k_end[t])
        chosen = lo + torch.randperm(hi - lo, generator=g)[:K]
        idx[t, :chosen.numel()] = chosen.int()
    idx = idx[:, torch.randperm(K, generator=g)]  # -1 anywhere in the row
    if pattern == "junk":
        hit = torch.rand(T, K, generator=g) < 0.3
        bad = torch.tensor([-1, -7, T_kv, T_kv + 1000, -(2 ** 31)], dtype=torch.int32)
        junk = bad[torch.randint(len(bad), (T, K), generator=g)]
        dup = idx[:, :1].expand(T, K)  # duplicates of slot 0
        idx = torch.where(hit, torch.where(torch.rand(T, K, generator=g) < 0.5, dup, junk), idx)
    elif pattern == "empty_rows":
        idx[torch.rand(T, generator=g) < 0.4] = -1
    elif pattern == "all_empty":
        idx.fill_(-1)
    elif pattern == "one_key":
        idx[:] = _randint(g, 0, T_kv - 1) if T_kv > 0 else -1
    elif pattern == "oob":
        idx = torch.where(torch.rand(T, K, generator=g) < 0.5, idx, T_kv + torch.randint(0, 9, (T, K), generator=g).int())
    return idx, pattern


def _layout(g, p, name):
    """Draws the memory layout of tensor `name` (applied on the target device by :func:`apply_layout`)."""
    p.tensors.setdefault("layouts", {})[name] = _choice(g, ("contiguous", "contiguous", "wide", "rows"))


def apply_layout(x, mode):
    """x, or a view of a copy of x with padded strides (a slice of a wider / longer tensor on x's
    device): "wide" pads the last dimension by 64 elements (row stride > width, 16-byte aligned),
    "rows" takes every other row of a tensor twice as long."""
    if mode == "contiguous" or x.numel() == 0:
        return x
    if mode == "wide":
        big = torch.zeros(*x.shape[:-1], x.shape[-1] + 64, dtype=x.dtype, device=x.device)
        big[..., :x.shape[-1]] = x
        return big[..., :x.shape[-1]]
    big = torch.zeros(x.shape[0] * 2, *x.shape[1:], dtype=x.dtype, device=x.device)
    big[::2] = x
    return big[::2]


def make_problem(op, seed, small):
    """The raw op's arguments for case `seed` (CPU tensors, bf16 activations, fp32 statistics)."""
    g = torch.Generator().manual_seed(seed * 1000003 + zlib.crc32(op.encode()))
    k_start, k_end, T_kv, range_kind = _ranges(g, small)
    T = k_start.shape[0]
    big_k = (64, 128, 192, 256) if small else (64, 128, 256, 512, 1024, 2048, 8192)
    K = _choice(g, big_k)
    if K >= 2048:  # large K: 4 rows over more keys than K (the float64 reference stays fast)
        T, T_kv, range_kind = 4, K + _randint(g, 0, 2048), "wide"
        width = torch.randint(K - 64, T_kv + 1, (T,), generator=g)
        k_start = (torch.rand(T, generator=g) * (T_kv - width + 1)).long().clamp(max=T_kv - width)
        k_end = (k_start + width).int()
        k_start = k_start.int()
    H = _choice(g, HEADS[:1] if small else HEADS)
    H_I, D_I = _choice(g, INDEXER_HEADS), _choice(g, INDEXER_DIMS)
    ties = _choice(g, (False, False, False, True))
    p = Problem(desc=dict(T=T, T_kv=T_kv, K=K, ranges=range_kind))
    relu = _choice(g, (True, False))

    def act(*shape, scale=1.0):
        if ties:  # small integers: exact products, many equal scores
            return torch.randint(-1, 2, shape, generator=g).to(torch.bfloat16)
        return (scale * torch.randn(*shape, generator=g)).to(torch.bfloat16)

    if op in ("indexer_topk", "sparse_kl_fwd", "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd"):
        p.desc.update(H_I=H_I, D_I=D_I, relu=relu, ties=ties)
        w = torch.randn(T, H_I, generator=g) * D_I ** -0.5
        if ties:
            w = torch.randint(-2, 3, (T, H_I), generator=g).float() / 4
        p.tensors.update(q_idx=act(T, H_I, D_I), k_idx=act(T_kv, D_I), weights=w.float(), relu=relu)
        for name in ("q_idx", "k_idx", "weights"):
            _layout(g, p, name)
    if op in ("sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass", "dense_kl_fwd",
              "dense_kl_bwd"):
        p.desc.update(H=H)
        p.tensors.update(q=act(T, H, D_QK, scale=2.0), kv=act(T_kv, D_QK), scale=D_QK ** -0.5)
        for name in ("q", "kv"):
            _layout(g, p, name)
    if op == "indexer_topk":
        p.tensors.update(k_start=k_start, k_end=k_end, topk=K)
    elif op.startswith("dense_kl"):
        p.tensors.update(k_start=k_start, k_end=k_end)
        if op == "dense_kl_bwd":
            p.tensors["grad_rows"] = torch.rand(T, generator=g)
    else:
        indices, pattern = _indices(g, k_start, k_end, K, T_kv)
        p.desc["indices"] = pattern
        p.tensors["indices"] = indices
        _layout(g, p, "indices")
        if op.startswith("sparse_kl"):
            mass = torch.rand(T, K, generator=g)
            mass[torch.rand(T, K, generator=g) < 0.1] = 0  # zero-mass slots (0 log 0)
            p.tensors["mass"] = mass
            if op == "sparse_kl_bwd":
                p.tensors["grad_rows"] = torch.rand(T, generator=g)
                p.tensors["use_row_stats"] = _choice(g, (False, True))
        if op in ("sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass"):
            # out / lse of the float64 forward, rounded like the device's outputs
            out, lse = ops.sparse_mla_fwd(p.tensors["q"].double(), p.tensors["kv"].double(), indices,
                                          p.tensors["scale"])
            p.tensors["lse"] = lse.float()
            if op != "attention_mass":
                p.tensors["out"] = out.to(torch.bfloat16)
                p.tensors["dout"] = act(T, H, D_V)
                p.tensors["deterministic"] = _choice(g, (False, True))
    return p


# ---------------------------------------------------------------------------------------------
# Running one op on a device / in float64


def _to(x, device, dtype_map):
    if not isinstance(x, torch.Tensor):
        return x
    y = x.to(device)
    return y.to(dtype_map[x.dtype]) if x.dtype in dtype_map else y


def run_op(op, tensors, device, float64):
    """Runs raw op `op`; float64=True upcasts bf16 activations and fp32 statistics to float64."""
    dmap = {torch.bfloat16: torch.float64, torch.float32: torch.float64} if float64 else {}
    layouts = tensors.get("layouts", {})
    a = {k: apply_layout(_to(v, device, dmap), layouts.get(k, "contiguous")) for k, v in tensors.items()
         if k != "layouts"}
    if op == "indexer_topk":
        return ops.indexer_topk(a["q_idx"], a["k_idx"], a["weights"], a["k_start"], a["k_end"], a["topk"], a["relu"])
    if op == "sparse_mla_fwd":
        return ops.sparse_mla_fwd(a["q"], a["kv"], a["indices"], a["scale"])
    if op in ("sparse_mla_bwd", "sparse_mla_bwd_mass"):
        fn = getattr(ops, op)
        return fn(a["q"], a["kv"], a["indices"], a["scale"], a["out"], a["lse"], a["dout"], a["deterministic"])
    if op == "attention_mass":
        return (ops.attention_mass(a["q"], a["kv"], a["indices"], a["lse"], a["scale"]),)
    if op == "sparse_kl_fwd":
        return ops.sparse_kl_fwd(a["q_idx"], a["k_idx"], a["weights"], a["indices"], a["mass"], a["relu"])
    if op == "sparse_kl_bwd":
        stats = None
        if a["use_row_stats"]:
            stats = ops.sparse_kl_fwd(a["q_idx"], a["k_idx"], a["weights"], a["indices"], a["mass"], a["relu"])[1]
        return ops.sparse_kl_bwd(a["q_idx"], a["k_idx"], a["weights"], a["indices"], a["mass"], a["relu"],
                                 a["grad_rows"], stats)
    if op == "dense_kl_fwd":
        return (ops.dense_kl_fwd(a["q"], a["kv"], a["scale"], a["q_idx"], a["k_idx"], a["weights"], a["k_start"],
                                 a["k_end"], a["relu"]),)
    if op == "dense_kl_bwd":
        return ops.dense_kl_bwd(a["q"], a["kv"], a["scale"], a["q_idx"], a["k_idx"], a["weights"], a["k_start"],
                                a["k_end"], a["relu"], a["grad_rows"])
    raise ValueError(op)


OUTPUT_NAMES = {
    "sparse_mla_fwd": (("out", BF16_TOL), ("lse", STAT_TOL)),
    "sparse_mla_bwd": (("dq", BF16_TOL), ("dkv", BF16_TOL)),
    # the backward's mass: 1e-3, as in tests/python/test_ops_mla.py (vs attention_mass on CUDA)
    "sparse_mla_bwd_mass": (("dq", BF16_TOL), ("dkv", BF16_TOL), ("mass", 1e-3)),
    "attention_mass": (("mass", STAT_TOL),),
    "sparse_kl_fwd": (("loss_rows", STAT_TOL), ("row_stats", STAT_TOL)),
    "sparse_kl_bwd": (("dq_idx", BF16_TOL), ("dk_idx", GRAD_STAT_TOL), ("dweights", GRAD_STAT_TOL)),
    "dense_kl_fwd": (("loss_rows", STAT_TOL),),
    "dense_kl_bwd": (("dq_idx", BF16_TOL), ("dk_idx", GRAD_STAT_TOL), ("dweights", GRAD_STAT_TOL)),
}


# ---------------------------------------------------------------------------------------------
# Comparisons: each returns (worst relative error, list of failure messages)


def compare(name, actual, expected, tol, extra=0.0):
    """Relative error norm of the whole tensor (<= tol) and of every row (<= ROW_FACTOR * tol, rows
    measured against max(own norm, RMS row norm)), each plus ATOL per element (RMS); non-finite
    entries must match exactly. Returns the worst error in units of the allowed error."""
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    if a.shape != e.shape:
        return math.inf, [f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"]
    fails = []
    finite = torch.isfinite(e)
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(a[torch.isinf(e)], e[torch.isinf(e)]):
        fails.append(f"{name}: non-finite entries differ ({int((~torch.isfinite(a)).sum())} vs {int((~finite).sum())})")
    if not torch.isfinite(a[finite]).all():
        fails.append(f"{name}: {int((~torch.isfinite(a[finite])).sum())} non-finite values where the reference is finite")
        return math.inf, fails
    d = torch.where(finite, a - e, 0.0)
    e0 = torch.where(finite, e, 0.0)
    total = e0.norm().item()
    allowed = tol * total + ATOL * math.sqrt(max(a.numel(), 1)) + extra
    worst = d.norm().item() / allowed
    if worst > 1:
        fails.append(f"{name}: error norm {d.norm().item():.3e} > {allowed:.3e} (relative "
                     f"{d.norm().item() / max(total, 1e-300):.2e}, tol {tol:.0e})")
    if a.dim() >= 1 and a.shape[0] > 0 and a.numel() > 0:
        rows_d = d.reshape(a.shape[0], -1).norm(dim=1)
        rows_e = e0.reshape(a.shape[0], -1).norm(dim=1)
        floor = total / math.sqrt(a.shape[0])
        row_len = a.numel() // a.shape[0]
        # `extra` bounds the norm of the whole error tensor, hence of any one row's error too.
        row_allowed = ROW_FACTOR * tol * torch.clamp(rows_e, min=floor) + ATOL * math.sqrt(max(row_len, 1)) + extra
        ratio = rows_d / row_allowed
        r = int(ratio.argmax())
        if ratio[r] > 1:
            fails.append(f"{name}: row {r} error {rows_d[r]:.3e} > {row_allowed[r]:.3e}")
        worst = max(worst, ratio[r].item())
    return worst, fails


def index_scores64(t, keys):
    """float64 index scores of (row, key) pairs [T, K] (flashdsa.reference); keys must be valid (callers mask)."""
    return reference.indexer_logits(t["q_idx"], reference.gather_rows(t["k_idx"], keys), t["weights"], t["relu"])


def compare_topk(t, actual, expected):
    """The selection rules of docs/spec.md §3, with ties allowed either way (see the module doc)."""
    idx, scores = (x.cpu() for x in actual)
    ref_idx, ref_scores = expected
    fails, worst = [], 0.0
    T, K = idx.shape
    k_start, k_end = t["k_start"].long(), t["k_end"].long()
    visible = (k_end - k_start).clamp(min=0)
    expect_n = torch.minimum(visible, torch.tensor(K))
    valid = idx >= 0
    n = valid.sum(dim=1)
    if not torch.equal(n, expect_n):
        r = int((n != expect_n).nonzero()[0])
        return math.inf, [f"indices: row {r} has {int(n[r])} keys, expected {int(expect_n[r])}"]
    in_range = (idx.long() >= k_start[:, None]) & (idx.long() < k_end[:, None])
    if not bool((in_range | ~valid).all()):
        r = int((~(in_range | ~valid)).any(dim=1).nonzero()[0])
        return math.inf, [f"indices: row {r} holds a key outside its range"]
    srt = torch.sort(torch.where(valid, idx, torch.iinfo(torch.int32).max), dim=1).values
    if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] != torch.iinfo(torch.int32).max)).any()):
        return math.inf, ["indices: a key is selected twice in a row"]
    if not bool((scores[~valid] == -math.inf).all()):
        fails.append("scores: empty slots must hold -inf")
    ref_at = index_scores64(t, torch.where(valid, idx, 0))      # float64 scores of the chosen keys
    mag = 1.0 + ref_scores.abs().masked_fill(~torch.isfinite(ref_scores), 0).amax(dim=1, keepdim=True)
    tol = 1e-5 * mag                                            # fp32 accumulation of bf16 products
    err = ((scores.double() - ref_at).abs() / mag).masked_fill(~valid, 0)
    worst = max(worst, err.max().item() if err.numel() else 0.0)
    if bool((err * mag > tol).any()):
        r = int((err * mag > tol).any(dim=1).nonzero()[0])
        fails.append(f"scores: row {r} returned score differs from the float64 score by {(err[r].max()):.2e} (rel)")
    # multiset of chosen float64 scores == float64 top-K (sorted, within tol)
    chosen = torch.sort(ref_at.masked_fill(~valid, -math.inf), dim=1, descending=True).values
    best = torch.sort(ref_scores.double(), dim=1, descending=True).values
    ok = torch.isfinite(best)
    gap = ((chosen - best).abs() / mag).masked_fill(~ok, 0)
    worst = max(worst, gap.max().item() if gap.numel() else 0.0)
    if bool((gap * mag > tol).any()):
        r = int((gap * mag > tol).any(dim=1).nonzero()[0])
        fails.append(f"selection: row {r} is not the top-{K} (score gap {(gap[r].max()):.2e} rel)")
    return worst, fails


def kl_rounding_allowance(t):
    """Error norms the CUDA sparse KL backward adds by design, emulated in float64.

    The kernel rounds its per-slot products d(q.k)[t, j, h] = g[t, j] w[t, h] f'(x[t, j, h]) to bf16
    for the tensor-core gradient GEMMs (dq_idx = d(q.k) K, dk_idx = d(q.k)^T Q) and accumulates in
    fp32. Rows whose slots all hold one key have an exact gradient of 0 (sum_j g = 0), so only that
    rounding remains, and with repeated values it does not average out like random noise. The
    allowance is twice the norm of the exactly emulated rounding error (it matched the H200's errors
    to three digits on every such case, docs/reliability.md), plus, for the fp32 dweights =
    sum_j g f(x), 2^-20 times the norm of sum_j |g| |f(x)| (fp32 rounding of the cancelling terms).
    """
    idx = t["indices"]
    T_kv = t["k_idx"].shape[0]
    valid = (idx >= 0) & (idx < T_kv)
    safe = torch.where(valid, idx, 0).long()
    s = index_scores64(t, safe).masked_fill(~valid, -math.inf)
    has = valid.any(dim=1, keepdim=True)
    lse = torch.logsumexp(torch.where(has, s, 0.0), dim=1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(~valid, 0)
    mass = t["mass"].double().masked_fill(~valid, 0)
    total = mass.sum(dim=1, keepdim=True)
    tg = torch.where(total != 0, mass / torch.where(total != 0, total, 1.0), 0.0)
    g = (t["grad_rows"].double()[:, None] * (p - tg)).masked_fill(total == 0, 0)       # [T, K]
    q = t["q_idx"].double()                                                               # [T, H, D]
    k = t["k_idx"].double()[safe]                                                         # [T, K, D]
    w = t["weights"].double()                                                             # [T, H]
    x = torch.einsum("thd,tjd->tjh", q, k)                                                # [T, K, H]
    f = x.clamp(min=0) if t["relu"] else x
    fprime = (x > 0).double() if t["relu"] else torch.ones_like(x)
    prod = g[:, :, None] * w[:, None, :] * fprime                                         # [T, K, H]
    err = prod.to(torch.bfloat16).double() - prod
    dq_err = torch.einsum("tjh,tjd->thd", err, k)
    dk_err = torch.zeros(T_kv, q.shape[2], dtype=torch.float64)
    dk_err.index_add_(0, safe.reshape(-1), torch.einsum("tjh,thd->tjd", err, q).reshape(-1, q.shape[2])
                      * valid.reshape(-1, 1))
    dw_scale = torch.einsum("tj,tjh->th", g.abs(), f.abs())
    return {"dq_idx": 2.0 * float(dq_err.norm()), "dk_idx": 2.0 * float(dk_err.norm()),
            "dweights": 2.0 ** -20 * float(dw_scale.norm())}


def check_case(op, seed, device, small, verbose):
    """Runs one case; returns (worst error, failure messages, description)."""
    p = make_problem(op, seed, small)
    if device == "cpu":  # the device under test is the CPU backend in bf16
        actual = run_op(op, p.tensors, "cpu", float64=False)
    else:
        actual = run_op(op, p.tensors, device, float64=False)
        torch.cuda.synchronize()
    expected = run_op(op, p.tensors, "cpu", float64=True)
    if op == "indexer_topk":
        worst, fails = compare_topk(p.tensors, actual, expected)
        worst /= 1e-5  # in units of the tolerance
    else:
        worst, fails = 0.0, []
        extra = kl_rounding_allowance(p.tensors) if op == "sparse_kl_bwd" else {}
        for (name, tol), a, e in zip(OUTPUT_NAMES[op], actual, expected):
            w, f = compare(name, a, e, tol, extra.get(name, 0.0))
            worst = max(worst, w)
            fails += f
    if verbose:
        print(f"  {op} seed={seed} {p.desc}: worst {worst:.3g}{' FAIL' if fails else ''}")
    return worst, fails, p.desc


# ---------------------------------------------------------------------------------------------


def _worker_init(threads: int) -> None:
    """A --jobs worker: its share of the CPU threads for the float64 reference."""
    torch.set_num_threads(threads)


def _run_case(op, seed, device, small, verbose, deadline):
    """check_case, with an exception counted as a failure of the case; (None, [], {}) past the deadline."""
    if deadline is not None and time.time() > deadline:
        return None, [], {}
    try:
        return check_case(op, seed, device, small, verbose)
    except Exception as err:  # an exception is a failure of this case, not of the run
        if verbose:
            traceback.print_exc()
        return math.inf, [f"exception {type(err).__name__}: {err}"], {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cases", type=int, default=None, help="cases per op (default 200 on cuda, 3 on cpu)")
    ap.add_argument("--seed0", type=int, default=0, help="first seed: case i uses seed0 + i")
    ap.add_argument("--seed", type=int, default=None, help="run only this seed (repro)")
    ap.add_argument("--op", action="append", choices=OPS, help="ops to fuzz (repeatable; default all)")
    ap.add_argument("--small", action="store_true", help="small shapes only (default on cpu)")
    ap.add_argument("--full-shapes", action="store_true", help="full shapes on cpu too (slow)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="time budget of the run, shared evenly by the ops (an op's unused share passes on); "
                         "cases past an op's share are not run")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes the seeds are spread over (each gets cpu_count / jobs threads)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("fuzz: no CUDA device (use --device cpu)")
        return 77
    small = args.small or (args.device == "cpu" and not args.full_shapes)
    cases = args.cases if args.cases is not None else (200 if args.device == "cuda" else 3)
    seeds = [args.seed] if args.seed is not None else list(range(args.seed0, args.seed0 + cases))
    chosen = args.op or list(OPS)
    if args.device == "cuda":
        if not flashdsa.built_with_cuda():
            print("fuzz: flashdsa was built without CUDA (use --device cpu)")
            return 77
    jobs = max(1, args.jobs)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
    t_start = time.time()
    rows, total_fail = [], 0
    pool = None
    if jobs > 1:  # seeds spread over worker processes (spawned: CUDA cannot be forked)
        import concurrent.futures as cf
        import multiprocessing as mp
        pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                      initargs=(max(1, (os.cpu_count() or 1) // jobs),))
    for i_op, op in enumerate(chosen):
        t0, n_run, n_fail, worst = time.time(), 0, 0, 0.0
        deadline = None if args.max_seconds is None else t_start + args.max_seconds * (i_op + 1) / len(chosen)
        if pool is None:
            results = (_run_case(op, seed, args.device, small, args.verbose, deadline) for seed in seeds)
        else:
            results = pool.map(_run_case, *zip(*[(op, seed, args.device, small, args.verbose, deadline)
                                                  for seed in seeds]))
        for seed, (w, fails, desc) in zip(seeds, results):
            if w is None:  # past the deadline: not run
                continue
            n_run += 1
            worst = max(worst, w)
            if fails:
                n_fail += 1
                repro = (f"python tests/cuda/fuzz.py --device {args.device} --op {op} --seed {seed}"
                         f"{' --small' if args.small else ''} -v")
                print(f"FAIL {op} seed={seed} {desc}: {'; '.join(fails)}\n  repro: {repro}", flush=True)
        total_fail += n_fail
        rows.append((op, n_run, n_fail, worst, time.time() - t0))
        print(f"{op}: {n_run} cases, {n_fail} failed, {time.time() - t0:.1f} s", flush=True)
    print(f"\n==== fuzz summary ({args.device}, seeds {seeds[0]}..{seeds[-1]}, {'small' if small else 'full'} "
          f"shapes, {time.time() - t_start:.0f} s)")
    print(f"{'op':<22}{'cases':>7}{'failed':>8}{'worst/allowed':>14}{'time s':>9}")
    for op, n, f, w, dt in rows:
        print(f"{op:<22}{n:>7}{f:>8}{w:>14.3g}{dt:>9.1f}")
    print(f"RESULT: {'OK' if total_fail == 0 else 'FAILED'} ({total_fail} failing cases)")
    if pool is not None:
        pool.shutdown()
    return 0 if total_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
