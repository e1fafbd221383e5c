#!/usr/bin/env python3
"""Train a small GLM-5-shaped Megatron Core GPT with DSA twice: dsa_kernel_backend flashdsa vs none.

Same seed, same data, same optimizer; IndexShare on (``dsa_indexer_topk_freq=2``: every second layer
reuses the previous layer's top-k). The flashdsa run uses the FlashDSAttention layer spec (fused
path also on IndexShare layers, sparse indexer loss computed in the MLA backward; ``--hooks-only``
uses plain DSAttention + the backend hooks). Logs LM loss, indexer loss (Megatron's tracker: sum over
layers / layers) and the gradient norm per step; writes a PNG overlay and JSON, and prints the maximum
relative LM-loss difference between the two runs.

The data: the first half of each sequence is a noisy Markov chain (learnable locally), the second
half repeats the first (learnable by attending exactly half a sequence back, i.e. once the indexer
selects those keys).

GPU (H200, bf16; defaults: 4 layers, 16 heads, D_qk = 576, H_I = 32, D_I = 128, K = 512, T = 4096)::

    python3 examples/megatron_train.py --out-dir $OUT

CPU smoke run (fp32, tiny): ``python3 examples/megatron_train.py --device cpu --tiny --steps 4``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings


def _shape(tiny: bool):
    from flashdsa.megatron.testing import ModelShape

    if tiny:
        return ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
                          qk_head_dim=16, v_head_dim=16, indexer_heads=4, indexer_head_dim=64, topk=16,
                          vocab_size=64, ffn_hidden_size=128)
    return ModelShape(num_layers=4, hidden_size=1024, num_attention_heads=16, q_lora_rank=512, kv_lora_rank=512,
                      qk_head_dim=128, v_head_dim=128, indexer_heads=32, indexer_head_dim=128, topk=512,
                      vocab_size=256, ffn_hidden_size=2816)


def _copy_batch(step: int, seq_len: int, docs: int, vocab: int, seed: int, device):
    """Packed THD batch of ``docs`` sequences: a noisy Markov chain for the first half, then its copy.

    The first half follows a fixed random permutation (next = perm[current]) with probability 0.8,
    a uniform token otherwise (learnable locally); the second half repeats the first (learnable only
    by attending exactly half a sequence back, i.e. by selecting the right keys).
    """
    import torch

    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 100003 + step)
    half = seq_len // 2
    first = torch.empty(docs, half, dtype=torch.int64)
    first[:, 0] = torch.randint(0, vocab, (docs,), generator=g)
    noise = torch.randint(0, vocab, (docs, half), generator=g)
    keep = torch.rand(docs, half, generator=g) < 0.8
    for i in range(1, half):
        first[:, i] = torch.where(keep[:, i], perm[first[:, i - 1]], noise[:, i])
    seqs = torch.cat([first, first], dim=1)                       # [docs, seq_len]
    tokens = seqs.reshape(1, -1)
    labels = torch.cat([seqs[:, 1:], seqs[:, :1]], dim=1).reshape(1, -1)
    cu = torch.arange(docs + 1, dtype=torch.int32) * seq_len
    pos = torch.arange(seq_len).repeat(docs).unsqueeze(0)
    return {"input_ids": tokens.to(device), "labels": labels.to(device), "position_ids": pos.to(device),
            "cu_seqlens": cu.to(device)}


def train(backend: str, args, shape, device, dtype) -> dict:
    """``args.steps`` optimizer steps; returns the per-step histories."""
    import torch

    from flashdsa import megatron as fm
    from flashdsa.megatron import testing as T

    config = T.build_config(shape, backend=backend, sparse_loss=not args.dense_loss, topk_freq=2,
                            loss_coeff=args.indexer_loss_coeff, dtype=dtype, init_method_std=0.02)
    model = T.build_gpt(config, shape, seed=args.seed, flashdsa_attention=backend == "flashdsa" and not args.hooks_only,
                        max_seq_len=args.seq_len)
    params = [p for p in model.parameters() if p.requires_grad]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]  # fp32 master weights
    opt = torch.optim.AdamW(master, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    hist = {"lm_loss": [], "indexer_loss": [], "grad_norm": [], "step_ms": []}
    fm.reset_stats()
    for step in range(args.steps):
        batch = _copy_batch(step, args.seq_len, args.docs, shape.vocab_size, args.seed, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        r = T.train_step(model, batch)
        grads = [p.grad.float() if p.grad is not None else torch.zeros_like(m) for p, m in zip(params, master)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        clip = min(1.0, args.clip / (float(norm) + 1e-6))
        for m, g in zip(master, grads):
            m.grad = g * clip
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)
        if device.type == "cuda":
            torch.cuda.synchronize()
        hist["step_ms"].append((time.perf_counter() - start) * 1e3)
        hist["lm_loss"].append(float(r["lm_loss"]))
        hist["indexer_loss"].append(float(r["indexer_loss"].sum()) / shape.num_layers)
        hist["grad_norm"].append(float(norm))
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"[{backend}] step {step:4d}  lm {hist['lm_loss'][-1]:.4f}  indexer {hist['indexer_loss'][-1]:.4g}  "
                  f"grad-norm {hist['grad_norm'][-1]:.3f}  {hist['step_ms'][-1]:.0f} ms", flush=True)
    hist["hooks"] = dict(fm.stats)
    return hist


def _plot(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, title in zip(axes, ("lm_loss", "indexer_loss", "grad_norm"),
                              ("LM loss", "indexer loss (tracker, per layer)", "gradient norm")):
        for backend, style in (("none", "-"), ("flashdsa", "--")):
            ax.plot(runs[backend][key], style, label=backend)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.suptitle("Megatron Core GPT with DSA (IndexShare 2): dsa_kernel_backend flashdsa vs none")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="default 200 (tiny: 20)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 4096; tiny 64)")
    parser.add_argument("--docs", type=int, default=1, help="sequences packed per batch (THD)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--indexer-loss-coeff", type=float, default=0.1)
    parser.add_argument("--dense-loss", action="store_true", help="dense indexer loss (default sparse)")
    parser.add_argument("--hooks-only", action="store_true", help="flashdsa through the hooks, not the layer spec")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    args.steps = args.steps or (20 if args.tiny else 200)
    args.seq_len = args.seq_len or (64 if args.tiny else 4096)

    warnings.filterwarnings("ignore")
    import torch

    from flashdsa.megatron import testing as T

    device = torch.device(args.device)
    if device.type == "cpu":
        T.install_cpu_shim()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    os.environ.setdefault("MASTER_PORT", "29577")
    T.init_parallel(0, 1, 1)
    shape = _shape(args.tiny)
    runs = {backend: train(backend, args, shape, device, dtype) for backend in ("flashdsa", "none")}
    T.destroy_parallel()

    a, b = runs["none"]["lm_loss"], runs["flashdsa"]["lm_loss"]
    rel = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)]
    finite = all(math.isfinite(v) for r in runs.values() for k in ("lm_loss", "indexer_loss") for v in r[k])
    summary = {
        "steps": args.steps, "seq_len": args.seq_len, "dtype": str(dtype), "shape": vars(shape),
        "max_rel_lm_loss_diff": max(rel), "max_rel_lm_loss_diff_step": rel.index(max(rel)),
        "final_lm_loss": {"none": a[-1], "flashdsa": b[-1]},
        "first_lm_loss": {"none": a[0], "flashdsa": b[0]},
        "final_indexer_loss": {k: runs[k]["indexer_loss"][-1] for k in runs},
        "median_step_ms": {k: sorted(runs[k]["step_ms"])[len(runs[k]["step_ms"]) // 2] for k in runs},
        "flashdsa_hooks": runs["flashdsa"]["hooks"], "all_finite": finite,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "megatron_train.json"), "w") as f:
        json.dump({"summary": summary, "runs": runs}, f, indent=1)
    png = os.path.join(args.out_dir, "megatron_train.png")
    _plot(runs, png)
    print("\n| | none | flashdsa |\n|---|---|---|")
    for key in ("first_lm_loss", "final_lm_loss", "final_indexer_loss", "median_step_ms"):
        print(f"| {key} | {summary[key]['none']:.4f} | {summary[key]['flashdsa']:.4f} |")
    print(f"max relative LM-loss difference: {summary['max_rel_lm_loss_diff']:.3e} "
          f"(step {summary['max_rel_lm_loss_diff_step']}); flashdsa hooks: {summary['flashdsa_hooks']}; plot: {png}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
