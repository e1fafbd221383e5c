#!/usr/bin/env python3
"""Per-layer forward + backward time and peak memory of Megatron Core's DSAttention, by kernel backend.

Runs Megatron's own ``DSAttention`` (megatron-core 0.19.2: indexer, top-k, sparse MLA, sparse indexer
KL loss, training mode) on packed THD input (one causal sequence of T tokens) with each
``dsa_kernel_backend``:

- ``flashdsa``       FlashDSA through Megatron's hooks (``flashdsa.megatron.register()``);
- ``flashdsa-spec``  FlashDSA through the FlashDSAttention layer spec (indexer loss in the MLA backward);
- ``none``           Megatron's PyTorch path (materializes S x S scores: runs up to the T that fits);
- ``tilelang``, ``cudnn``  Megatron's other backends, when their packages import (docs/megatron.md).

Every backend runs in its own subprocess (an illegal memory access or OOM of one cannot affect the
others); a backend that does not run records why (missing package, config check, OOM, error).
Prints a table (ms, peak GiB, ratio = backend ms / flashdsa ms) and writes JSON.

GPU (H200, bf16, H = 64, D_qk = 576, D_v = 512, K = 2048, H_I = 32 and 64, D_I = 128)::

    python3 bench/megatron_layer.py --out $OUT/megatron_layer.json

CPU smoke run (fp32, tiny shapes): ``python3 bench/megatron_layer.py --device cpu --tiny``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings

BACKENDS = ("flashdsa", "flashdsa-spec", "none", "tilelang", "cudnn")


def _shape(tiny: bool, h_i: int) -> dict:
    if tiny:
        return dict(heads=4, kv_lora_rank=64, hidden=64, q_lora_rank=32, topk=16, h_i=h_i, d_i=64, v_head_dim=16,
                    qk_head_dim=16)
    return dict(heads=64, kv_lora_rank=512, hidden=6144, q_lora_rank=2048, topk=2048, h_i=h_i, d_i=128,
                v_head_dim=128, qk_head_dim=192)


def _build(backend: str, shape: dict, device: str):
    import torch
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module

    from flashdsa.megatron import testing as T

    mg_backend = "flashdsa" if backend.startswith("flashdsa") else backend
    ms = T.ModelShape(num_layers=1, hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
                      q_lora_rank=shape["q_lora_rank"], kv_lora_rank=shape["kv_lora_rank"],
                      qk_head_dim=shape["qk_head_dim"], v_head_dim=shape["v_head_dim"], indexer_heads=shape["h_i"],
                      indexer_head_dim=shape["d_i"], topk=shape["topk"])
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    # Weights are initialized on the CPU (no CUDA RNG tracker needed), then moved.
    config = T.build_config(ms, backend=mg_backend, sparse_loss=True, loss_coeff=0.01, dtype=dtype,
                            relu=True)  # Megatron's default scoring (DeepSeek-V3.2); cuDNN's kernels require it
    spec = T.dsa_layer_spec(flashdsa_attention=backend == "flashdsa-spec")
    core_spec = spec.submodules.self_attention.submodules.core_attention
    d_qk = shape["kv_lora_rank"] + 64
    module = build_module(core_spec, config=config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                          attention_type="self", softmax_scale=d_qk ** -0.5, k_channels=d_qk,
                          v_channels=shape["kv_lora_rank"], cp_comm_type="p2p")
    return module.to(device=device, dtype=dtype), config, dtype


def _measure(module, shape: dict, t: int, dtype, device: str, iters: int, backend: str) -> dict:
    """Median fwd+bwd ms (and peak GiB above the inputs on CUDA) of one DSAttention call at T = t."""
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from flashdsa import megatron as fm

    g = torch.Generator(device=device).manual_seed(0)
    heads, d_qk = shape["heads"], shape["kv_lora_rank"] + 64

    def rand(*size, grad=False, std=0.5):
        x = (torch.randn(*size, generator=g, device=device, dtype=torch.float32) * std).to(dtype)
        return x.requires_grad_(grad)

    query = rand(t, heads, d_qk, grad=True)
    key = rand(t, 1, d_qk, grad=True)
    x = rand(t, 1, shape["hidden"])
    qr = rand(t, 1, shape["q_lora_rank"])
    up_v = rand(heads, shape["v_head_dim"], shape["kv_lora_rank"], std=0.02)
    dout = rand(t, 1, heads * shape["v_head_dim"])
    cu = torch.tensor([0, t], dtype=torch.int32, device=device)

    def step():
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                                 cu_seqlens_kv_padded=cu, max_seqlen_q=t, max_seqlen_kv=t)
        out = module(query, key, None, None, x, qr, attn_mask_type=AttnMaskType.causal,
                     packed_seq_params=packed, up_v_weight=up_v)
        out.backward(dout.view_as(out))
        query.grad = key.grad = None
        for p in module.parameters():
            p.grad = None

    fm.reset_stats()
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    step()  # warm-up (JIT, autotune, caches)
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    row = dict(status="ok", ms=times[len(times) // 2], ms_min=times[0], hooks=dict(fm.stats))
    if device == "cuda":
        row["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    if backend.startswith("flashdsa") and any(k.startswith("declined") for k in fm.stats):
        row.update(status="declined", reason=f"FlashDSA declined: {dict(fm.stats)}")
    return row


def _run_backend(backend: str, args) -> list[dict]:
    """All (H_I, T) cases of one backend, in this process."""
    warnings.filterwarnings("ignore")
    import torch

    from flashdsa.megatron import testing as T

    device = args.device
    if device == "cpu":
        T.install_cpu_shim()
    os.environ["MASTER_PORT"] = str(29600 + BACKENDS.index(backend))
    T.init_parallel(0, 1, 1)
    rows = []
    for h_i in args.h_i:
        shape = _shape(args.tiny, h_i)
        try:
            module, config, dtype = _build(backend, shape, device)
        except Exception as error:  # e.g. the config's dependency check for tilelang / cudnn
            for t in args.t:
                rows.append(dict(backend=backend, h_i=h_i, T=t, status="not run",
                                 reason=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"))
            continue
        module.train()
        failed_smaller = None
        for t in args.t:
            row = dict(backend=backend, h_i=h_i, T=t)
            if failed_smaller is not None:
                row.update(status="not run", reason=f"failed at a smaller T ({failed_smaller})")
                rows.append(row)
                continue
            try:
                row.update(_measure(module, shape, t, dtype, device, args.iters, backend))
            except Exception as error:
                oom = "out of memory" in str(error).lower()
                row.update(status="OOM" if oom else "error",
                           reason=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
                if not oom:
                    row["traceback"] = traceback.format_exc()[-2000:]
                failed_smaller = t
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), file=sys.stderr, flush=True)
    return rows


def _table(rows: list[dict]) -> str:
    ref = {(r["h_i"], r["T"]): r["ms"] for r in rows if r["backend"] == "flashdsa" and r.get("status") == "ok"}
    lines = ["| backend | H_I | T | fwd+bwd ms | peak GiB | ms / flashdsa ms | status |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r.get("ms")
        ratio = f"{ms / ref[(r['h_i'], r['T'])]:.2f}" if ms and (r["h_i"], r["T"]) in ref else "-"
        peak = f"{r['peak_gib']:.2f}" if "peak_gib" in r else "-"
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:120]}"
        lines.append(f"| {r['backend']} | {r['h_i']} | {r['T']} | {f'{ms:.2f}' if ms else '-'} | {peak} | {ratio} "
                     f"| {status} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--backends", nargs="+", default=None, choices=BACKENDS)
    parser.add_argument("--t", nargs="+", type=int, default=None, help="tokens (default 8K 32K 128K; tiny: 64 128)")
    parser.add_argument("--h-i", nargs="+", type=int, default=None, help="indexer heads (default 32 64; tiny: 4)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per backend subprocess")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/megatron_layer.json when OUT is set)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.t is None:
        args.t = [64, 128] if args.tiny else [8192, 32768, 131072]
    if args.h_i is None:
        args.h_i = [4] if args.tiny else [32, 64]
    if args.backends is None:
        args.backends = ["flashdsa", "flashdsa-spec", "none"] if args.tiny else list(BACKENDS)

    if args.worker:  # child: one backend, rows as JSON on the last stdout line
        print(json.dumps(_run_backend(args.worker, args)))
        return 0

    rows = []
    for backend in args.backends:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", backend, "--device", args.device,
               "--iters", str(args.iters), "--t", *map(str, args.t), "--h-i", *map(str, args.h_i)]
        if args.tiny:
            cmd.append("--tiny")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
            if proc.returncode == 0 and lines:
                rows.extend(json.loads(lines[-1]))
            else:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                reason = f"exit {proc.returncode}: {' | '.join(tail)[:400]}"
                rows.extend(dict(backend=backend, h_i=h, T=t, status="error", reason=reason)
                            for h in args.h_i for t in args.t)
        except subprocess.TimeoutExpired:
            rows.extend(dict(backend=backend, h_i=h, T=t, status="timeout", reason=f"> {args.timeout} s")
                        for h in args.h_i for t in args.t)
        print(f"[megatron_layer] {backend} done", file=sys.stderr, flush=True)

    out = args.out or (os.path.join(os.environ["OUT"], "megatron_layer.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump({"device": args.device, "tiny": args.tiny, "rows": rows}, f, indent=1)
    print(_table(rows))
    return 0 if any(r["status"] == "ok" and r["backend"].startswith("flashdsa") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
