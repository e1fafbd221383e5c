#!/usr/bin/env python3
"""CPU emulation (numpy) of a *value* band for the FP8 selection's band re-score (a candidate design, not built;
docs/perf-notes.md, eighteenth session), beside today's *rank* band.

Rank band (fp8_band_recall_sim.py, the kernel's `fp8_band`): the K - b best keys by the FP8 score are kept as they
are, the keys ranked K - b + 1 .. C are re-scored exactly and the b best of them fill the row — always C - K + b
re-scores per row. Value band: with s8_K the K-th best FP8 score of the row and a margin d = alpha * sigma, every key
with s8 > s8_K + d is kept, the keys with |s8 - s8_K| <= d are re-scored, and the best of those fill the row. The
number re-scored then follows the row's density of scores near its cut (fewer where the cut is sparse), and the
split needs one radix select (s8_K) instead of two. sigma here is an ORACLE (the standard deviation of s8 - exact
over the row's FP8 top 4096): a kernel would need an estimate from the row's inputs (open question).

Usage: python3 scripts/fp8_value_band_sim.py [--seed S] [--rows R] [--n 8192,32768,131072] [--alphas 2,3,4]

Data, quantization and the packed bf16x2 epilogue as scripts/fp8_v2_recall_sim.py / fp8_band_recall_sim.py.
Prints, per n and plan, the recall of the exact top K (mean / min over rows) and the keys re-scored per row.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_band_recall_sim import emulated_row  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--n", default="8192,32768,131072")
    ap.add_argument("--alphas", default="2,3,4,5")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    H, D, K = 32, 128, 2048
    res = {}
    for n in [int(v) for v in args.n.split(",")]:
        for _ in range(args.rows):
            exact, s8 = emulated_row(rng, n, H, D)
            top = set(np.argsort(-exact)[:K].tolist())
            order = np.argsort(-s8)
            for b, c in ((128, 2176), (192, 2240), (256, 2304)):
                band = order[K - b:c]
                got = set(order[:K - b].tolist()) | set(band[np.argsort(-exact[band])[:b]].tolist())
                res.setdefault((n, "rank b=%d C=%d" % (b, c)), []).append((len(top & got) / K, c - (K - b)))
            sel = order[:4096]
            sigma = np.std(s8[sel] - exact[sel])  # the oracle error scale of this row
            s8k = s8[order[K - 1]]
            for alpha in [float(a) for a in args.alphas.split(",")]:
                d = alpha * sigma
                sure = np.where(s8 > s8k + d)[0]
                cand = np.where(np.abs(s8 - s8k) <= d)[0]
                need = max(K - len(sure), 0)
                got = set(sure.tolist()) | set(cand[np.argsort(-exact[cand])[:need]].tolist())
                res.setdefault((n, "value alpha=%g" % alpha), []).append((len(top & got) / K, len(cand)))
    for key in sorted(res):
        v = np.array(res[key])
        print("n %7d %-20s recall mean %.5f min %.5f  re-scored per row mean %4.0f max %4.0f" %
              (key[0], key[1], v[:, 0].mean(), v[:, 0].min(), v[:, 1].mean(), v[:, 1].max()))


if __name__ == "__main__":
    main()
