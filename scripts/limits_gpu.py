#!/usr/bin/env python3
"""Limits at scale on one GPU (issue 17, item 6; docs/reliability.md). Run on the H200:

    python scripts/limits_gpu.py                 # all configurations, ~2-4 minutes
    python scripts/limits_gpu.py --configs t256k,oom --rows 16

Configurations (each: DSA layer forward + backward with the sparse indexer loss, bf16, one causal
sequence, D_qk = 576, H_I = 64, D_I = 128):

- ``t256k``: T = 256K (262144), H = 64, K = 2048.
- ``k8192``: T = 32K, H = 128, K = 8192 (the largest K and H together).
- ``h128_t128k``: T = 128K, H = 128, K = 2048.
- ``oom``: T = 256K, H = 128, K = 8192: the inputs and the forward fit in 139 GiB, the backward
  (dout, dq, the mass) does not. It must fail with ``torch.OutOfMemoryError`` (a clear error,
  not a crash or a CUDA error), and the process must keep working afterwards: a small layer call
  runs and matches the reference.

For every configuration that runs, ``--rows`` sampled query rows (first, last, random) are checked
against a float64 reference computed here: the indexer's selection (the chosen keys' float64
scores are the K largest, ties either way), ``out`` and ``lse`` of the sparse MLA, and ``dq``
(from ``dout``, the kernel's own ``out`` and ``lse``); every output and gradient must be finite and
the indexer loss finite and positive. Per-step times and peak memory are printed; a summary table
comes last. Results are also written to ``$OUT/limits.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
import traceback

import torch

import flashdsa
from flashdsa.layer import dsa_attention

D_QK, D_V, H_I, D_I = 576, 512, 64, 128
CONFIGS = {
    "t256k": dict(T=262144, H=64, K=2048),
    "k8192": dict(T=32768, H=128, K=8192),
    "h128_t128k": dict(T=131072, H=128, K=2048),
    "oom": dict(T=262144, H=128, K=8192),
}
BF16_TOL = 1e-2
DEVICE = "cuda"  # --smoke: "cpu" with tiny configurations (checks this script without a GPU)
SMOKE_CONFIGS = {"tiny": dict(T=300, H=16, K=128), "tiny_k": dict(T=200, H=16, K=256)}


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _peak_gib():
    return gib(torch.cuda.max_memory_allocated()) if DEVICE == "cuda" else float("nan")


def gib(n_bytes):
    return n_bytes / 2 ** 30


def make_inputs(T, H, seed, device=None):
    """Random layer inputs generated on the device in chunks (no [T, H, D] fp32 temporaries)."""
    device = device or DEVICE
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.empty(T, H, D_QK, dtype=torch.bfloat16, device=device)
    for t0 in range(0, T, 8192):
        q[t0:t0 + 8192] = (2.0 * torch.randn(min(8192, T - t0), H, D_QK, generator=g, device=device)).bfloat16()
    kv = torch.randn(T, D_QK, generator=g, device=device).bfloat16()
    q_idx = torch.randn(T, H_I, D_I, generator=g, device=device).bfloat16()
    k_idx = torch.randn(T, D_I, generator=g, device=device).bfloat16()
    weights = torch.randn(T, H_I, generator=g, device=device) * D_I ** -0.5
    return q, kv, q_idx, k_idx, weights


def reference_rows(rows, q, kv, q_idx, k_idx, weights, indices, out_rows, lse_rows, dout, dq, scale, K):
    """Float64 checks of the sampled rows (out_rows / lse_rows: the kernel's out and lse of those
    rows, in the order of ``rows``); returns (worst relative errors dict, failures list)."""
    fails, worst = [], {"selection": 0.0, "out": 0.0, "lse": 0.0, "dq": 0.0}
    for i, t in enumerate(rows):
        out_t, lse_t = out_rows[i], lse_rows[i]
        # indexer: the chosen keys' float64 scores are the K largest of the visible keys [0, t]
        keys = torch.arange(t + 1, device=q.device)
        dots = torch.einsum("hd,sd->hs", q_idx[t].double(), k_idx[keys].double()).relu()
        score = (weights[t].double()[:, None] * dots).sum(0)
        n = min(K, t + 1)
        idx = indices[t]
        valid = idx[idx >= 0].long()
        if valid.numel() != n or valid.unique().numel() != n or bool((valid > t).any()):
            fails.append(f"row {t}: indices hold {valid.numel()} keys (expected {n}, distinct, <= {t})")
            continue
        best = torch.topk(score, n).values
        chosen = torch.sort(score[valid], descending=True).values
        mag = 1.0 + score.abs().max().item()
        gap = (chosen - best).abs().max().item() / mag
        worst["selection"] = max(worst["selection"], gap)
        if gap > 1e-5:
            fails.append(f"row {t}: selection differs from the top-{n} by {gap:.2e} (relative)")
        # sparse MLA forward and dq of this row
        kvr = kv[valid].double()                                   # [n, D_QK]
        s = scale * q[t].double() @ kvr.T                          # [H, n]
        lse_ref = torch.logsumexp(s, dim=1)
        p = torch.exp(s - lse_ref[:, None])
        out_ref = p @ kvr[:, :D_V]
        p_k = torch.exp(s - lse_t.double()[:, None])               # the kernel's own lse, as its backward
        dp = dout[t].double() @ kvr[:, :D_V].T
        delta = (dout[t].double() * out_t.double()).sum(1)
        dq_ref = scale * (p_k * (dp - delta[:, None])) @ kvr
        # dq cancels (to ~0 for a row with one key: P = 1, dP = Delta up to out's bf16 rounding), so
        # its error is measured against the size of its terms too: scale |P dP| |kv|.
        dq_terms = 0.1 * scale * (p_k * dp).norm().item() * kvr.norm(dim=1).mean().item()
        floors = {"out": 1e-30, "lse": 1e-30, "dq": dq_terms}
        for name, a, e, tol in (("out", out_t, out_ref, BF16_TOL), ("lse", lse_t, lse_ref, 1e-5),
                                ("dq", dq[t], dq_ref, BF16_TOL)):
            rel = (a.double() - e).norm().item() / max(e.norm().item(), floors[name])
            worst[name] = max(worst[name], rel)
            if not rel <= tol:
                fails.append(f"row {t}: {name} relative error {rel:.2e} > {tol:.0e}")
    return worst, fails


def _attempt(cfg, n_rows, seed, res, steps):
    """The body of :func:`run_config`; its tensors die with its frame (also on an exception)."""
    T, H, K = cfg["T"], cfg["H"], cfg["K"]
    t0 = time.time()
    q, kv, q_idx, k_idx, weights = make_inputs(T, H, seed)
    for leaf in (q, q_idx, k_idx, weights):
        leaf.requires_grad_(True)
    _sync()
    steps["inputs"] = time.time() - t0
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
    scale = D_QK ** -0.5
    t0 = time.time()
    result = dsa_attention(q, kv, q_idx, k_idx, weights, cu, K, scale, loss_coeff=0.1)
    _sync()
    steps["forward"] = time.time() - t0
    res["peak_fwd_gib"] = _peak_gib()
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    dout = torch.randn(result.out.shape, generator=gen, device=DEVICE, dtype=torch.bfloat16)
    t0 = time.time()
    result.out.backward(dout)
    _sync()
    steps["backward"] = time.time() - t0
    res["peak_gib"] = _peak_gib()
    loss = result.indexer_loss.item()
    res["indexer_loss"] = loss
    fails = []
    if not (math.isfinite(loss) and loss > 0):
        fails.append(f"indexer loss {loss} is not finite and positive")
    for tname, tensor in (("out", result.out), ("dq", q.grad), ("dq_idx", q_idx.grad), ("dk_idx", k_idx.grad),
                          ("dweights", weights.grad)):
        if not bool(torch.isfinite(tensor).all()):
            fails.append(f"{tname} has non-finite entries")
    t0 = time.time()
    g = torch.Generator().manual_seed(seed + 2)
    rows = sorted({0, T - 1, min(K - 1, T - 1), min(K, T - 1)} |
                  {int(x) for x in torch.randint(0, T, (max(0, n_rows - 4),), generator=g)})
    sel = torch.tensor(rows, device=DEVICE)
    with torch.no_grad():
        # lse of the sampled rows (the layer returns out only): the same kernel on those rows
        out_rows, lse_rows = flashdsa.sparse_mla(q.detach()[sel], kv, result.indices[sel], scale)
        if not torch.equal(out_rows, result.out.detach()[sel]):
            fails.append("sparse_mla on the sampled rows differs from the layer's out on them")
        worst, row_fails = reference_rows(rows, q.detach(), kv, q_idx.detach(), k_idx.detach(), weights.detach(),
                                          result.indices, out_rows, lse_rows, dout, q.grad, scale, K)
    steps["reference"] = time.time() - t0
    res.update(status="ok" if not fails + row_fails else "failed", rows=len(rows), worst=worst,
               failures=fails + row_fails)


def run_config(name, cfg, n_rows, seed):
    """One layer forward + backward; returns a result dict (status ok / oom / failed)."""
    res = dict(config=name, **cfg)
    steps = {}
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        _attempt(cfg, n_rows, seed, res, steps)
    except torch.OutOfMemoryError as err:
        res.update(status="oom", error=f"torch.OutOfMemoryError: {str(err).splitlines()[0][:200]}")
    except RuntimeError as err:  # an out-of-memory error of another type is still clear, but say which
        if "out of memory" not in str(err).lower():
            res.update(status="failed", error=f"{type(err).__name__}: {err}"[:400])
            traceback.print_exc()
        else:
            res.update(status="oom", error=f"{type(err).__name__} (not torch.OutOfMemoryError): "
                                           f"{str(err).splitlines()[0][:200]}")
    except Exception as err:  # noqa: BLE001 - every other error is a failure of this configuration
        res.update(status="failed", error=f"{type(err).__name__}: {err}"[:400])
        traceback.print_exc()
    res["steps_s"] = steps
    gc.collect()  # frees the attempt's tensors (after an OOM too) before the next configuration
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return res


def small_check_after_oom(seed):
    """After an OOM the process must still work: a small layer call matches the float64 reference."""
    T, H, K = 4096, 16, 512
    q, kv, q_idx, k_idx, weights = make_inputs(T, H, seed)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
    scale = D_QK ** -0.5
    q.requires_grad_(True)
    result = dsa_attention(q, kv, q_idx, k_idx, weights, cu, K, scale)
    dout = torch.randn(result.out.shape, device=DEVICE, dtype=torch.bfloat16)
    result.out.backward(dout)
    rows = [0, 100, 4095]
    with torch.no_grad():
        sel = torch.tensor(rows, device=DEVICE)
        out_rows, lse_rows = flashdsa.sparse_mla(q.detach()[sel], kv, result.indices[sel], scale)
        _, fails = reference_rows(rows, q.detach(), kv, q_idx, k_idx, weights, result.indices, out_rows, lse_rows,
                                  dout, q.grad, scale, K)
    return fails


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--rows", type=int, default=8, help="sampled rows checked against float64 per config")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny configurations on the CPU (checks the script)")
    args = ap.parse_args(argv)
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
        CONFIGS.clear()
        CONFIGS.update(SMOKE_CONFIGS)
        args.configs = ",".join(SMOKE_CONFIGS)
    elif not torch.cuda.is_available():
        print("limits_gpu: no CUDA device")
        return 77
    names = args.configs.split(",")
    if DEVICE == "cuda":
        free, total = torch.cuda.mem_get_info()
        print(f"device {torch.cuda.get_device_name()}, {gib(total):.0f} GiB ({gib(free):.0f} free), "
              f"flashdsa {flashdsa.__version__}", flush=True)
    results, ok = [], True
    for name in names:
        cfg = CONFIGS[name]
        print(f"--- {name}: {cfg}", flush=True)
        res = run_config(name, cfg, args.rows, args.seed)
        if name == "oom":
            if res["status"] == "oom":
                fails = small_check_after_oom(args.seed + 7)
                res["status"] = "ok (OutOfMemoryError as expected; process recovered)" if not fails else "failed"
                res["failures"] = fails
            elif res["status"] == "ok":
                res["status"] = "ok (fit in memory: no OOM to check on this device)"
            else:
                ok = False
        if res["status"].startswith("failed"):
            ok = False
        print(json.dumps(res, indent=None, default=str), flush=True)
        results.append(res)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "limits.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    print("\n==== limits summary")
    print(f"{'config':<12}{'T':>8}{'H':>5}{'K':>6}{'fwd s':>8}{'bwd s':>8}{'peak GiB':>10}  status")
    for r in results:
        s = r.get("steps_s", {})
        print(f"{r['config']:<12}{r['T']:>8}{r['H']:>5}{r['K']:>6}{s.get('forward', float('nan')):>8.2f}"
              f"{s.get('backward', float('nan')):>8.2f}{r.get('peak_gib', r.get('peak_fwd_gib', float('nan'))):>10.1f}"
              f"  {r['status']}{'' if not r.get('failures') else ' ' + '; '.join(r['failures'][:3])}"
              f"{'' if 'error' not in r else ' [' + r['error'][:120] + ']'}")
    print(f"RESULT: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
