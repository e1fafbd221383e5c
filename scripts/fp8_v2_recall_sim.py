#!/usr/bin/env python3
"""CPU emulation (numpy) of the FP8 selection's recall with the f32 epilogue vs the packed bf16x2
epilogue of fp8_kernel_v2.cuh (docs/kernels/indexer_topk.md, "FP8 selection pass", the packed
epilogue's error bound).

Usage: python3 scripts/fp8_v2_recall_sim.py [--seed S] [--heads 32] [--rows 6]

Data as the check program's benchmark ("spread": uniform [-1, 1] x a per-row factor 2^[-2, 2], 8x on
three outlier channels; weights 0.25 (u + 0.6)); one query row against n = 8K and 32K keys, D_I = 128,
K = 2048. Quantization: per-row amax / 448, e4m3 round-to-nearest-even with saturation (emulated in
float64). FP8 scores: the e4m3 dot products (exact here), then
  f32:    sum_h (w_h a) relu(dot_h), times b_s;
  bf16x2: relu(dot) and w a rounded to bf16, per lane of a quad the H/8 terms of one head parity summed
          with one bf16 rounding per fma (emulated: the fp32 result rounded to bf16), the 8 lane sums
          added in fp32, times b_s.
Reports the recall of the exact top K (bf16 inputs, float64) after the C best FP8 candidates are
re-scored exactly, for C = K (no slack) and the default C = K + max(64 ceil(K / 256), 256), and the rms
of (bf16x2 - f32) over the rms of the FP8 scores' own error (after a least-squares scale).
"""
import argparse
import itertools

import numpy as np


def bf16(x):
    """float32 -> bf16 (round to nearest even) -> float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def e4m3(x):
    """Values of the e4m3 codes nearest to x (3 mantissa bits, min normal exponent -6, saturating)."""
    a = np.abs(x).astype(np.float64)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)
    quantum = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / quantum) * quantum, 448.0)


def quantize(x):
    s = (np.abs(x).max(axis=-1, keepdims=True) / 448).astype(np.float32)
    return e4m3(x / s), s[:, 0]


def spread_rows(rng, n, d):
    """n rows of d values, the check program's "spread" data: uniform [-1, 1] times a per-row 2^[-2, 2], 8x on
    three outlier channels (float32)."""
    x = rng.uniform(-1, 1, (n, d)).astype(np.float32)
    x *= np.exp2(2 * rng.uniform(-1, 1, (n, 1))).astype(np.float32)
    x[:, :3] *= 8
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rows", type=int, default=6)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    H, D, K = args.heads, 128, 2048
    C = K + max(64 * ((K + 255) // 256), 256)

    def rows(n):
        return spread_rows(rng, n, D)

    stats = {}
    for n, _ in itertools.product((8192, 32768), range(args.rows)):
        k, q = rows(n), rows(H)
        w = (0.25 * (rng.uniform(-1, 1, H) + 0.6)).astype(np.float32)
        exact = (np.maximum(bf16(q).astype(np.float64) @ bf16(k).astype(np.float64).T, 0) * w[:, None]).sum(0)
        k8, kscale = quantize(k)
        q8, qscale = quantize(q)
        dot8 = (q8 @ k8.T).astype(np.float32)
        wq = (w * qscale).astype(np.float32)
        f32 = (np.maximum(dot8, 0) * wq[:, None]).sum(0) * kscale
        xb, wb = bf16(np.maximum(dot8, 0)).astype(np.float64), bf16(wq).astype(np.float64)
        tot = np.zeros(n)
        for lane, parity in itertools.product(range(4), range(2)):
            p = np.zeros(n, np.float32)
            for j in range(H // 8):
                h = 8 * j + 2 * lane + parity
                p = bf16((wb[h] * xb[h] + p.astype(np.float64)).astype(np.float32))
            tot += p
        packed = (tot.astype(np.float32) * kscale).astype(np.float64)
        top = set(np.argsort(-exact)[:K].tolist())
        for name, s in (("f32", f32), ("bf16x2", packed)):
            for cc in (K, C):
                cand = np.argsort(-s)[:cc]
                got = set(cand[np.argsort(-exact[cand])[:K]].tolist())
                stats.setdefault((n, name, cc), []).append(len(top & got) / K)
        a = (f32 @ exact) / (f32 @ f32)
        stats.setdefault((n, "noise ratio", 0), []).append(
            np.sqrt(np.mean((packed - f32) ** 2)) / np.sqrt(np.mean((a * f32 - exact) ** 2)))
    for key, v in sorted(stats.items()):
        print("H_I %d n %5d %-12s C %5d  mean %.5f  min %.5f" % (H, key[0], key[1], key[2], np.mean(v), np.min(v)))


if __name__ == "__main__":
    main()
