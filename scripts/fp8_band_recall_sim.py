#!/usr/bin/env python3
"""CPU emulation (numpy) of a *band* re-score for the FP8 selection (a candidate design, not built;
docs/perf-notes.md, seventh session): instead of re-scoring all C candidates exactly, keep the K - b best
by the FP8 score as they are and re-score only the next B ranks (the band), taking the b best of the band
by the exact score. The exact re-score is 25-47% of the FP8 pass at 8K-32K (attribution builds), and the
layer discards the returned scores, so the band would re-score B instead of C rows per query.

Usage: python3 scripts/fp8_band_recall_sim.py [--seed S] [--heads 32] [--rows 4] [--n 8192,32768]

Data, quantization and the packed bf16x2 epilogue as scripts/fp8_v2_recall_sim.py (imported from it).
Reports the recall of the exact top K for the full re-score (C = 2560) and for each (b, B).
"""
import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_v2_recall_sim import bf16, quantize, spread_rows  # noqa: E402


def packed_scores(q8, k8, wq, kscale, H):
    """The FP8 pass's scores with the packed bf16x2 epilogue (fp8_kernel_v2.cuh)."""
    dot8 = (q8 @ k8.T).astype(np.float32)
    xb, wb = bf16(np.maximum(dot8, 0)).astype(np.float64), bf16(wq).astype(np.float64)
    tot = np.zeros(k8.shape[0])
    for lane, parity in itertools.product(range(4), range(2)):
        p = np.zeros(k8.shape[0], np.float32)
        for j in range(H // 8):
            h = 8 * j + 2 * lane + parity
            p = bf16((wb[h] * xb[h] + p.astype(np.float64)).astype(np.float32))
        tot += p
    return (tot.astype(np.float32) * kscale).astype(np.float64)


def emulated_row(rng, n, H, D):
    """One query row against n keys (the check program's data model): (exact bf16 scores, FP8 pass scores), both
    float64 [n]; draws the keys, the row's H query heads and its weights from rng in that order."""
    k, q = spread_rows(rng, n, D), spread_rows(rng, H, D)
    w = (0.25 * (rng.uniform(-1, 1, H) + 0.6)).astype(np.float32)
    exact = (np.maximum(bf16(q).astype(np.float64) @ bf16(k).astype(np.float64).T, 0) * w[:, None]).sum(0)
    k8, kscale = quantize(k)
    q8, qscale = quantize(q)
    return exact, packed_scores(q8, k8, (w * qscale).astype(np.float32), kscale, H)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--n", default="8192,32768")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    H, D, K = args.heads, 128, 2048
    C = K + max(64 * ((K + 255) // 256), 256)
    plans = [(0, 0)] + [(b, B) for b in (64, 128, 256, 512) for B in (b + 256, b + 512)]

    stats = {}
    for n, _ in itertools.product([int(v) for v in args.n.split(",")], range(args.rows)):
        exact, s8 = emulated_row(rng, n, H, D)
        top = set(np.argsort(-exact)[:K].tolist())
        order = np.argsort(-s8)
        cand = order[:C]
        full = set(cand[np.argsort(-exact[cand])[:K]].tolist())
        stats.setdefault((n, "full re-score", C), []).append(len(top & full) / K)
        for b, B in plans:
            kept = order[:K - b]
            band = order[K - b:K - b + B]
            got = set(kept.tolist()) | (set(band[np.argsort(-exact[band])[:b]].tolist()) if b else set())
            stats.setdefault((n, "band b=%d" % b if b else "no re-score", B), []).append(len(top & got) / K)
    for (n, name, rescored), v in sorted(stats.items()):
        print("H_I %d n %6d %-14s re-scored %5d  recall mean %.5f  min %.5f" % (H, n, name, rescored, np.mean(v),
                                                                             np.min(v)))


if __name__ == "__main__":
    main()
