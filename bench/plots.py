"""PNG plots of a run (matplotlib, Agg backend): layer time vs T, kernel TFLOP/s vs T, memory vs T, and
the vs-peers ratios when the run measured the peers.

    python -m bench.plots --peers RUN1/results.json [RUN2/results.json ...] --out peers.png [--title T]

re-draws the vs-peers plot from the results of one or more runs (e.g. the two device calls that
measure different peers), rows of later files replacing equal (kernel, peer, T, heads) rows."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 - after the backend choice

from .cases import BASELINE, DSA_LAYER, KERNEL, LAYER, UNFUSED_LAYER, UNFUSED_PREFIX  # noqa: E402
from .config import GIB, BenchConfig  # noqa: E402
from .report import fmt_rate, fmt_t  # noqa: E402
from .summary import shared_name  # noqa: E402

Series = Tuple[List[int], List[float]]


def _series(records: Sequence[dict], name: str, key: str, section: Optional[str] = None) -> Series:
    """(T values, key values) of the runs of case `name` that produced key."""
    points = [(r["t"], r[key]) for r in records
              if r["name"] == name and (section is None or r["section"] == section)
              and r["status"] == "ok" and r.get(key) is not None and r["t"] is not None]
    return [t for t, _ in points], [v for _, v in points]


def _oom_ts(records: Sequence[dict], name: str) -> List[int]:
    return [r["t"] for r in records if r["name"] == name and r["status"] == "oom"]


def _t_axis(ax, ts: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    if ts:
        ax.set_xlim(ts[0] / 1.3, ts[-1] * 1.3)
        ax.set_xticks(list(ts))
        ax.set_xticklabels([fmt_t(t) for t in ts])
    ax.set_xlabel("T (tokens, one causal sequence)")
    ax.grid(True, which="both", alpha=0.3)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_layer_times(cfg: BenchConfig, records: Sequence[dict], summary: dict, path: Path) -> Path:
    """Layer fwd+bwd time vs T (log-log), baselines, OOM marks, and the crossover vs dense."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    curves = [(DSA_LAYER, "DSA layer (FlashDSA)", "-o"),
              (shared_name(cfg), f"DSA, IndexShare 1-in-{cfg.dsa.share_every} (per layer)", "-s")]
    curves += [(d.label, f"{d.label} (SDPA, H={d.heads})", "--^") for d in cfg.dense]
    curves += [(UNFUSED_LAYER, "unfused PyTorch DSA", ":x")]
    drawn = False
    for i, (name, label, style) in enumerate(curves):
        ts, ms = _series(records, name, "ms_per_layer")
        if ts:
            ax.plot(ts, ms, style, color=f"C{i}", label=label)
            drawn = True
        for t in _oom_ts(records, name):
            ax.axvline(t, color="gray", ls=":", lw=0.8)
            ax.annotate(f"{label}: OOM", (t, 0.95), xycoords=("data", "axes fraction"), rotation=90,
                        fontsize=7, va="top", ha="right")
    for key, color in (("dsa", "C0"), ("index_share", "C1")):
        c = summary["crossover"][cfg.dense[0].label][key]
        if c["kind"] == "interpolated":
            ax.axvline(c["t"], color=color, ls="--", lw=1)
            ax.annotate(f"crossover ≈ {fmt_t(c['t'])}", (c["t"], 0.05), xycoords=("data", "axes fraction"),
                        rotation=90, fontsize=8, color=color, va="bottom", ha="right")
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no layer or baseline time measured")
    _t_axis(ax, cfg.seq_lens)
    ax.set_ylabel("fwd + bwd time per layer (ms)")
    ax.set_title(f"DSA layer vs dense attention ({cfg.device.type})")
    return _save(fig, path)


def plot_kernel_tflops(cfg: BenchConfig, records: Sequence[dict], summary: dict, path: Path) -> Path:
    """TFLOP/s of each kernel (and the unfused kernels, dashed) vs T, with the GEMM ceiling."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    kernel_names = list(dict.fromkeys(r["name"] for r in records if r["section"] == KERNEL))
    drawn = False
    for i, name in enumerate(kernel_names):
        ts, tf = _series(records, name, "tflops", KERNEL)
        if ts:
            ax.plot(ts, tf, "-o", color=f"C{i}", label=name)
            drawn = True
        uts, utf = _series(records, UNFUSED_PREFIX + name, "tflops", BASELINE)
        if uts:
            ax.plot(uts, utf, ":", marker="x", color=f"C{i}", label=f"{name} (unfused)")
            drawn = True
    for name, style in ((DSA_LAYER, "-"), (shared_name(cfg), "-.")):
        ts, tf = _series(records, name, "tflops", LAYER)
        if ts:
            ax.plot(ts, tf, style, color="black", lw=1, label=f"{name} (all §9 FLOPs)")
            drawn = True
    if summary["gemm_tflops"]:
        ax.axhline(summary["gemm_tflops"], color="red", ls="--", lw=1,
                   label=f"{cfg.dtype_name} GEMM ceiling {fmt_rate(summary['gemm_tflops'])}")
    if drawn:
        ax.legend(fontsize=7, ncol=2)
    else:
        _empty(ax, "no kernel measured (no kernels in this build?)")
    _t_axis(ax, cfg.seq_lens)
    ax.set_ylabel("TFLOP/s (docs/spec.md §9)")
    ax.set_title(f"FlashDSA kernels ({cfg.device.type})")
    return _save(fig, path)


def plot_memory(cfg: BenchConfig, records: Sequence[dict], path: Path) -> Path:
    """Peak (solid) and extra (dashed) device memory of the layer-level cases vs T."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    names = [DSA_LAYER, shared_name(cfg)] + [d.label for d in cfg.dense] + [UNFUSED_LAYER]
    drawn = False
    for i, name in enumerate(names):
        for key, style, what in (("peak_bytes", "-o", "peak"), ("extra_bytes", "--", "extra")):
            ts, values = _series(records, name, key)
            points = [(t, v / GIB) for t, v in zip(ts, values) if v > 0]
            if points:
                ax.plot([t for t, _ in points], [v for _, v in points], style, color=f"C{i}", label=f"{name} {what}")
                drawn = True
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=2)
    else:
        _empty(ax, "device memory is measured on CUDA only" if not cfg.on_cuda else "no memory measured")
    _t_axis(ax, cfg.seq_lens)
    ax.set_ylabel("GiB")
    ax.set_title("Device memory of one fwd + bwd call")
    return _save(fig, path)


_PEER_KERNEL_TITLES = {"sparse_mla_fwd": "sparse MLA forward", "sparse_mla_bwd": "sparse MLA backward",
                       "indexer_topk": "indexer + top-k"}


_PEER_PLOT_HEADS = {"sparse_mla_fwd": (64,), "sparse_mla_bwd": (64,), "indexer_topk": (32, 64)}


def plot_peer_ratios(rows: Sequence[dict], path: Path, title: str = "FlashDSA vs public peers") -> Path:
    """One panel per kernel: ratio = peer ms / ours ms vs T, a line per (peer, heads); > 1: FlashDSA faster.

    `rows` are the vs-peers rows of bench/peers (summary["peers"]["rows"]); rows without a ratio
    (absent peer, skipped case) are left out, and so are head counts other than the production ones
    (H = 64; H_I = 32, 64), which the report's table lists."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ratio")
          and r["heads"] in _PEER_PLOT_HEADS.get(r["kernel"], (r["heads"],))]
    kernels = [k for k in _PEER_KERNEL_TITLES if any(r["kernel"] == k for r in ok)]
    fig, axes = plt.subplots(1, max(1, len(kernels)), figsize=(5.2 * max(1, len(kernels)), 4.6), squeeze=False)
    if not kernels:
        _empty(axes[0][0], "no peer measured")
    for ax, kernel in zip(axes[0], kernels):
        mine = [r for r in ok if r["kernel"] == kernel]
        ts = sorted({r["t"] for r in mine})
        lines = sorted({(r["peer"], r["heads"]) for r in mine}, key=lambda x: (x[0], x[1]))
        for peer, heads in lines:
            pts = sorted((r["t"], r["ratio"]) for r in mine if r["peer"] == peer and r["heads"] == heads)
            label = f"{peer}, {'H_I' if kernel == 'indexer_topk' else 'H'}={heads}"
            ax.plot([t for t, _ in pts], [v for _, v in pts], "-o", label=label)
            for t, v in pts:
                ax.annotate(f"{v:.2f}", (t, v), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
        _t_axis(ax, ts)
        ax.set_yscale("log", base=2)
        ax.set_ylabel("peer ms / FlashDSA ms (> 1: FlashDSA faster)")
        ax.set_title(_PEER_KERNEL_TITLES[kernel])
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def write_plots(out_dir: Path, cfg: BenchConfig, records: Sequence[dict], summary: dict) -> Dict[str, Path]:
    plots = {
        "time_vs_T": plot_layer_times(cfg, records, summary, out_dir / "time_vs_T.png"),
        "kernel_tflops": plot_kernel_tflops(cfg, records, summary, out_dir / "kernel_tflops.png"),
        "memory_vs_T": plot_memory(cfg, records, out_dir / "memory_vs_T.png"),
    }
    peers = (summary.get("peers") or {}).get("rows")
    if peers:
        title = "FlashDSA vs public peers"
        if cfg.indexer_selection != "bf16":
            title += f" (ours: indexer_topk selection={cfg.indexer_selection})"
        plots["vs_peers"] = plot_peer_ratios(peers, out_dir / "vs_peers.png", title)
    return plots


def merge_peer_rows(paths: Sequence[Path]) -> List[dict]:
    """The vs-peers rows of several results.json files; a later file's row replaces an earlier one with the
    same (kernel, peer, T, heads) when it has a ratio. Rows of a run on shuffled index rows (meta
    index_order, bench/run.py --index-order) keep their own line: the peer is named "<peer>, shuffled rows";
    so do the indexer_topk rows of a run whose indexer used the fp8 selection (meta indexer_selection,
    bench/run.py --indexer-selection): "<peer>, ours fp8"."""
    merged: Dict[tuple, dict] = {}
    for path in paths:
        import json
        with open(path) as f:
            data = json.load(f)
        peers = (data.get("summary") or {}).get("peers") or {}
        rows = peers.get("rows") or []
        order = (data.get("meta") or {}).get("index_order", "ascending")
        if order != "ascending":
            rows = [dict(r, peer=f"{r['peer']}, {order} rows") for r in rows]
        selection = (data.get("meta") or {}).get("indexer_selection") or peers.get("indexer_selection") or "bf16"
        if selection != "bf16":
            rows = [dict(r, peer=f"{r['peer']}, ours {selection}") if r["kernel"] == "indexer_topk" else r
                    for r in rows]
        for r in rows:
            key = (r["kernel"], r["peer"], r["t"], r["heads"])
            if key not in merged or r.get("ratio"):
                merged[key] = r
    return list(merged.values())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: re-draw the vs-peers plot from one or more results.json files."""
    import argparse
    p = argparse.ArgumentParser(description="re-draw the vs-peers plot from bench results")
    p.add_argument("--peers", nargs="+", type=Path, required=True, help="results.json files of bench/run.py")
    p.add_argument("--out", type=Path, required=True, help="PNG path")
    p.add_argument("--title", default="FlashDSA vs public peers (ratio = peer ms / ours)")
    args = p.parse_args(argv)
    rows = merge_peer_rows(args.peers)
    if not rows:
        raise SystemExit("no vs-peers rows in " + ", ".join(map(str, args.peers)))
    print(plot_peer_ratios(rows, args.out, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
