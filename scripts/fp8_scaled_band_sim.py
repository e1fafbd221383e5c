#!/usr/bin/env python3
"""CPU emulation (numpy) of the FP8 band re-score with the band scaled to each row's keys (`fp8_band_scaled`,
docs/spec.md §3) beside the fixed band, on the peers bench's data model: q_idx, k_idx ~ N(0, 1) in bf16, weights
~ N(0, 1) / sqrt(H_I D_I) (signed), one causal sequence of T keys (row t sees keys 0 .. t).

The FP8 scores follow the CUDA walk at H_I = 32: per-row e4m3 quantization, exact e4m3 dot products, ReLU, the
scores and the folded weights w' = w * q_scale rounded to bf16 (the head-sum MMA's operands), f32 sums, times the
key scale. Rows are spread evenly over (K, T]; rows with at most K keys (recall 1, nothing re-scored) are weighted
in, so the mean is that of the whole sequence, as the bench reports it.

Usage: python3 scripts/fp8_scaled_band_sim.py [--seed S] [--T 8192,32768,131072] [--rows 48] [--band 256]
                                             [--slack 256]
Prints per T the recall of the exact top K (mean / min row) and the keys re-scored per row (rows > K) for the
fixed and the scaled band.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_v2_recall_sim import bf16, quantize  # noqa: E402

# docs/spec.md §3 "Band scaled by the row's keys": (upper end of n / K, share in 64ths); beyond 24: 64.
SHARES = ((2, 23), (3, 31), (4, 37), (6, 43), (8, 47), (12, 53), (16, 56), (24, 61))


def band_part(width, n, k):
    share = next((s for m, s in SHARES if n <= m * k), 64)
    return -(-width * share // 64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--T", default="8192,32768,131072")
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--band", type=int, default=256)
    ap.add_argument("--slack", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    H, D, K = 32, 128, 2048
    for T in [int(v) for v in args.T.split(",")]:
        keys = bf16(rng.standard_normal((T, D)).astype(np.float32))
        k8, kscale = quantize(keys)
        stats = {"fixed": ([], []), "scaled": ([], [])}
        for i in range(args.rows):
            n = int(K + (T - K) * (i + 0.5) / args.rows)
            q = bf16(rng.standard_normal((H, D)).astype(np.float32))
            w = (rng.standard_normal(H) * (H * D) ** -0.5).astype(np.float32)
            exact = (np.maximum(q.astype(np.float64) @ keys[:n].astype(np.float64).T, 0) * w[:, None]).sum(0)
            q8, qscale = quantize(q)
            dot8 = (q8.astype(np.float64) @ k8[:n].astype(np.float64).T).astype(np.float32)
            wq = bf16((w * qscale).astype(np.float32)).astype(np.float64)
            s8 = (bf16(np.maximum(dot8, 0)).astype(np.float64) * wq[:, None]).sum(0).astype(np.float32)
            s8 = (s8 * kscale[:n]).astype(np.float64)
            top = set(np.argsort(-exact)[:K].tolist())
            order = np.argsort(-s8, kind="stable")
            for name, (b, slack) in (("fixed", (args.band, args.slack)),
                                     ("scaled", (band_part(args.band, n, K), band_part(args.slack, n, K)))):
                band = order[K - b:K + slack]
                got = set(order[:K - b].tolist()) | set(band[np.argsort(-exact[band])[:b]].tolist())
                stats[name][0].append(len(top & got) / K)
                stats[name][1].append(b + slack)
        short = K / T  # rows with at most K keys: all of them returned, nothing re-scored
        for name, (rec, cnt) in stats.items():
            rec = np.array(rec)
            print("T %6d %-6s band %d / slack %d: recall mean %.5f min row %.4f  re-scored per row (rows > K) %.0f"
                  % (T, name, args.band, args.slack, (1 - short) * rec.mean() + short, rec.min(), np.mean(cnt)),
                  flush=True)


if __name__ == "__main__":
    main()
