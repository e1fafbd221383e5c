#!/usr/bin/env python3
"""FlashDSA main job: one DSA attention layer forward + backward on the default device.

On a GPU with FlashDSA's Hopper kernels: the standard shape (H=64, K=2048, H_I=32, D_I=128) on a
packed batch of long sequences. Otherwise the CPU backend at T=4096, H=16, K=512. Prints the shapes,
the time of each phase, and the error of sampled rows against a plain-PyTorch float64 reference.

    python examples/dsa_layer_demo.py [--device cpu|cuda] [--tokens T] [--heads H] [--topk K]
"""
import argparse
import math
import time

import torch

import flashdsa
from flashdsa import reference

# The raw ops of the layer's training step (the KL loss runs in the backward, from the mass that
# sparse_mla_bwd_mass emits: no attention_mass).


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if not torch.cuda.is_available():
        return "cpu"
    if not flashdsa.built_with_cuda():
        print("note: a GPU is present but flashdsa was built without CUDA; running on the CPU backend instead")
        return "cpu"
    return "cuda"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_inputs(T: int, H: int, HI: int, DI: int, device: str, gen: torch.Generator):
    """Random bf16 layer inputs on a packed batch of 3 sequences of uneven lengths."""
    lengths = [T // 2 + 17, T // 3 - 5]
    lengths.append(T - sum(lengths))
    cu = flashdsa.cu_seqlens_from_lengths(lengths)

    def rnd(*shape, std=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen) * std).to(dtype).to(device).requires_grad_()

    return dict(
        q=rnd(T, H, 576), kv=rnd(T, 576), q_idx=rnd(T, HI, DI), k_idx=rnd(T, DI),
        weights=rnd(T, HI, std=(HI * DI) ** -0.5, dtype=torch.float32), cu_seqlens=cu.to(device),
    )


def reference_rows(x, rows, indices, scale, dout):
    """float64 sparse MLA output and dq for the sampled query rows (flashdsa.reference)."""
    q = x["q"].detach()[rows].double().requires_grad_()
    out, _ = reference.sparse_mla(q, x["kv"].detach(), indices[rows], scale)
    (dq,) = torch.autograd.grad(out, q, dout[rows].double())
    return out, dq


def topk_threshold_ok(x, rows, indices, k_start, k_end, relu=True):
    """Checks that each sampled row's selection holds the K largest visible scores (up to ties)."""
    bad = 0
    for r in rows.tolist():
        s0, s1 = int(k_start[r]), int(k_end[r])
        scores = reference.indexer_logits(x["q_idx"].detach()[r:r + 1], x["k_idx"].detach()[None, s0:s1],
                                          x["weights"].detach()[r:r + 1], relu)[0]   # [n] float64
        sel = indices[r][indices[r] >= 0].long() - s0
        if sel.numel() != min(indices.shape[1], s1 - s0):
            bad += 1
            continue
        if sel.numel() < scores.numel():
            kth = scores[sel].min()
            best_unselected = scores[torch.ones_like(scores, dtype=torch.bool).index_fill_(0, sel, False)].max()
            bad += int(best_unselected > kth + 1e-3 * (1 + kth.abs()))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--topk", type=int, default=None)
    ap.add_argument("--indexer-heads", type=int, default=32)
    ap.add_argument("--indexer-dim", type=int, default=128)
    ap.add_argument("--sample-rows", type=int, default=48)
    args = ap.parse_args()

    device = pick_device(args.device)
    big = device == "cuda"
    T = args.tokens or (32768 if big else 4096)
    H = args.heads or (64 if big else 16)
    K = args.topk or (2048 if big else 512)
    HI, DI = args.indexer_heads, args.indexer_dim
    scale = 576 ** -0.5
    gen = torch.Generator().manual_seed(0)
    x = make_inputs(T, H, HI, DI, device, gen)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU backend ({torch.get_num_threads()} threads)"
    print(f"FlashDSA {flashdsa.__version__} on {name}")
    print(f"packed batch: cu_seqlens={x['cu_seqlens'].tolist()}  T={T}  H={H}  K={K}  H_I={HI}  D_I={DI}")
    print(f"q {tuple(x['q'].shape)} {x['q'].dtype} | kv {tuple(x['kv'].shape)} | q_idx {tuple(x['q_idx'].shape)} "
          f"| k_idx {tuple(x['k_idx'].shape)} | weights {tuple(x['weights'].shape)} {x['weights'].dtype}")

    if device == "cuda":  # one untimed call: CUDA context, kernel attributes, workspaces, allocator
        warm = flashdsa.dsa_attention(x["q"], x["kv"], x["q_idx"], x["k_idx"], x["weights"], x["cu_seqlens"], K,
                                      scale, loss_coeff=1e-3)
        warm.out.backward(torch.ones_like(warm.out))
        for t in x.values():
            t.grad = None
    # The upstream gradient is drawn before timing (a CPU randn of T*H*512 values takes seconds).
    dout = torch.randn((T, H, 512), generator=gen).to(x["q"].dtype).to(device)
    sync(device)
    t0 = time.perf_counter()
    res = flashdsa.dsa_attention(x["q"], x["kv"], x["q_idx"], x["k_idx"], x["weights"], x["cu_seqlens"], K, scale,
                                 loss_coeff=1e-3)
    sync(device)
    t1 = time.perf_counter()
    res.out.backward(dout)
    sync(device)
    t2 = time.perf_counter()
    # The layer computes the KL loss in the backward (from the sparse MLA backward's attention
    # mass): its value exists only now.
    print(f"out {tuple(res.out.shape)} {res.out.dtype} | indices {tuple(res.indices.shape)} {res.indices.dtype} "
          f"| indexer KL loss {float(res.indexer_loss.detach()):.6f}")
    print(f"{'forward (indexer+top-k, sparse MLA):':<66}{t1 - t0:8.3f} s")
    print(f"{'backward (sparse MLA bwd + attention mass, KL loss fwd and bwd):':<66}{t2 - t1:8.3f} s")

    # Check sampled rows against float64 PyTorch.
    idx = res.indices.cpu()
    k_start, k_end = flashdsa.build_key_ranges(x["cu_seqlens"].cpu())
    rows = torch.randperm(T, generator=gen)[: args.sample_rows]
    cpu_x = {k: v.detach().cpu() for k, v in x.items()}
    ref_out, ref_dq = reference_rows(cpu_x, rows, idx, scale, dout.cpu())
    got_out = res.out.detach().cpu()[rows].double()
    got_dq = x["q"].grad.cpu()[rows].double()
    rel = lambda a, b: float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))  # noqa: E731
    res_loss = float(res.indexer_loss.detach())
    bad_rows = topk_threshold_ok(cpu_x, rows, idx, k_start, k_end)
    e_out, e_dq = rel(got_out, ref_out), rel(got_dq, ref_dq)
    print(f"check on {len(rows)} sampled rows vs float64 PyTorch: out rel.err {e_out:.2e}, dq rel.err {e_dq:.2e}, "
          f"top-k rows violating the threshold: {bad_rows}")
    flops = 2 * T * H * K * (576 + 512) + 2 * T * H * K * (3 * 576 + 2 * 512)
    print(f"sparse MLA fwd+bwd FLOPs {flops / 1e12:.2f} TFLOP")
    ok = e_out < 2e-2 and e_dq < 2e-2 and bad_rows == 0 and math.isfinite(res_loss)
    print("RESULT:", "OK" if ok else "MISMATCH")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
