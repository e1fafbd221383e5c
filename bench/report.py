"""Writes the run's outputs: results.json (all numbers) and report.md (the tables)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from .cases import BASELINE, CEILING, DSA_LAYER, UNFUSED_LAYER
from .config import GIB, LAYER_TARGETS, BenchConfig
from .summary import find, shared_name


# ---------------------------------------------------------------------- formatting

def fmt_t(t: Optional[float]) -> str:
    """4096 -> '4K', 131072 -> '128K', 23170.5 -> '22.6K', 100 -> '100'."""
    if t is None:
        return "—"
    if t >= 1024:
        k = t / 1024
        return f"{k:.0f}K" if abs(k - round(k)) < 1e-9 else f"{k:.1f}K"
    return f"{t:.0f}"


def fmt_num(x: Optional[float], digits: int = 1, suffix: str = "") -> str:
    return "—" if x is None else f"{x:,.{digits}f}{suffix}"


def fmt_rate(x: Optional[float]) -> str:
    """TFLOP/s or GB/s: one decimal from 10 up, three significant digits below (CPU mode)."""
    if x is None:
        return "—"
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def fmt_ms(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:,.3f}" if x < 10 else f"{x:,.1f}"


def fmt_gib(x: Optional[float]) -> str:
    return "—" if x is None else f"{x / GIB:.2f}"


def status_text(record: Optional[dict]) -> str:
    """Short cell text for a case that did not produce a number."""
    if record is None:
        return "—"
    status = record["status"]
    if status == "n/a":
        return "n/a (no kernel)" if record["reason"].startswith("no kernel") else "n/a (no flashdsa)"
    return {"oom": "OOM", "skipped": "skipped", "error": "error"}.get(status, "—")


def cell(record: Optional[dict], value: Optional[float], fmt=fmt_ms) -> str:
    return fmt(value) if value is not None else status_text(record)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# ---------------------------------------------------------------------- sections

def _crossover_text(c: dict) -> str:
    if c["kind"] == "none":
        return "not measured"
    if c["kind"] == "below":
        return f"≤ {fmt_t(c['t'])} (DSA faster at every measured T)"
    if c["kind"] == "above":
        return f"> {fmt_t(c['t'])} (DSA slower at every measured T)"
    lo, hi = c["between"]
    return f"≈ {fmt_t(c['t'])} (log-log interpolation between {fmt_t(lo)} and {fmt_t(hi)})"


def _summary_lines(cfg: BenchConfig, summary: dict) -> List[str]:
    h = summary["headline"]
    main = h["dense_reference"]
    gains = ", ".join(f"{fmt_t(int(t))} {g:.2f}×" for t, g in h["index_share_gain"].items()) or "not measured"
    kernel_best = {}
    for k in summary["kernels"]:
        if k["of_gemm"] is not None:
            kernel_best[k["name"]] = k  # the largest measured T wins (records are in T order)
    ratios = ", ".join(f"{name} {k['of_gemm'] * 100:.0f}% (T = {fmt_t(k['t'])})" for name, k in kernel_best.items())
    lines = [
        f"- **Crossover T vs {main}** (DSA layer fwd+bwd faster from here on): "
        f"{_crossover_text(h['crossover_dsa'])}; with IndexShare 1-in-{cfg.dsa.share_every}: "
        f"{_crossover_text(h['crossover_index_share'])}.",
        f"- **Speedup vs {main}** at T = {fmt_t(h['speedup_t'])}: {fmt_num(h['speedup'], 2, '×')}; "
        f"with IndexShare (per layer) at T = {fmt_t(h['speedup_index_share_t'])}: "
        f"{fmt_num(h['speedup_index_share'], 2, '×')}.",
        f"- **IndexShare gain** (full layer time / IndexShare per-layer time): {gains}.",
        f"- **vs unfused PyTorch DSA** at T = {fmt_t(h['vs_unfused_t'])}: {fmt_num(h['vs_unfused'], 1, '×')}.",
        f"- **Extra memory of a DSA layer fwd+bwd at 128K**: {fmt_gib(h['extra_memory_128k'])} GiB "
        "(peak memory at each T: memory table).",
        f"- **Kernels / GEMM ceiling of this run** ({fmt_rate(summary['gemm_tflops'])} TFLOP/s): "
        f"{ratios or 'not measured'}.",
    ]
    if cfg.standard_shape:
        lines += ["", "Targets (PERF.md):", ""] + _target_lines(summary)
    return lines


def _verdict(value: Optional[float], floor: float, goal: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "not measured"
    meets = (lambda bound: value >= bound) if higher_is_better else (lambda bound: value <= bound)
    return "meets goal" if meets(goal) else "meets floor" if meets(floor) else "below floor"


def _target_lines(summary: dict) -> List[str]:
    h, tg = summary["headline"], LAYER_TARGETS
    row_128k = next((row for row in summary["layer"] if row["t"] == 131072), None)
    speed_128k = row_128k["speedup_dense"][h["dense_reference"]] if row_128k else None
    cross = h["crossover_dsa"]
    cross_t = cross["t"] if cross["kind"] in ("interpolated", "below") else (math.inf if cross["kind"] == "above"
                                                                             else None)
    shares = [row["loss_path_share"] for row in summary["layer"] if row["loss_path_share"] is not None]
    lines = [
        f"- crossover vs dense (floor ≤ {fmt_t(tg.crossover_floor)}, goal ≤ {fmt_t(tg.crossover_goal)}): "
        f"{_verdict(cross_t, tg.crossover_floor, tg.crossover_goal, higher_is_better=False)}",
        f"- speedup at 128K (floor {tg.speedup_128k_floor:g}×, goal {tg.speedup_128k_goal:g}×): "
        f"{_verdict(speed_128k, tg.speedup_128k_floor, tg.speedup_128k_goal)}",
        f"- extra memory at 128K (floor ≤ {fmt_gib(tg.extra_memory_128k_floor)} GiB, goal ≤ "
        f"{fmt_gib(tg.extra_memory_128k_goal)} GiB): "
        f"{_verdict(h['extra_memory_128k'], tg.extra_memory_128k_floor, tg.extra_memory_128k_goal, False)}",
        f"- loss-path share (loss path / (sparse MLA fwd + bwd + indexer + loss path), kernel times), worst T (floor ≤ {tg.loss_share_floor:.0%}, goal ≤ {tg.loss_share_goal:.0%}): "
        f"{_verdict(max(shares) if shares else None, tg.loss_share_floor, tg.loss_share_goal, False)}",
        f"- vs unfused (floor {tg.vs_unfused_floor:g}×, goal {tg.vs_unfused_goal:g}×): "
        f"{_verdict(h['vs_unfused'], tg.vs_unfused_floor, tg.vs_unfused_goal)}",
    ]
    for k in summary["kernels"]:
        if k["floor"] is not None:
            lines.append(f"- {k['name']} at {fmt_t(k['t'])} (floor {k['floor']:g}, goal {k['goal']:g} TFLOP/s): "
                         f"{_verdict(k['tflops'], k['floor'], k['goal'])}")
    return lines


def _ceiling_lines(records: List[dict]) -> List[str]:
    rows = []
    for r in records:
        if r["section"] != CEILING:
            continue
        rate = (f"{fmt_rate(r.get('tflops'))} TFLOP/s" if r.get("tflops") is not None
                else f"{fmt_rate(r.get('gbps'))} GB/s" if r.get("gbps") is not None else status_text(r))
        rows.append([r["name"], cell(r, r.get("ms")), rate, r["note"]])
    return table(["ceiling", "ms", "rate", "note"], rows)


def _kernel_lines(summary: dict) -> List[str]:
    rows = []
    for k in summary["kernels"]:
        status = "ok" if k["status"] == "ok" else status_text(k)
        rows.append([k["name"], fmt_t(k["t"]), cell(k, k["ms"]), fmt_rate(k["tflops"]),
                     fmt_num(k["of_gemm"] * 100 if k["of_gemm"] is not None else None, 0, "%"),
                     fmt_num(k["floor"], 0), fmt_num(k["goal"], 0), fmt_num(k["vs_unfused"], 1, "×"), status])
    return table(["kernel", "T", "ms", "TFLOP/s", "% of GEMM", "floor", "goal", "× unfused", "status"], rows)


def _layer_lines(cfg: BenchConfig, summary: dict, records: List[dict]) -> List[str]:
    labels = [d.label for d in cfg.dense]
    shared = shared_name(cfg)
    header = (["T", "DSA layer ms", f"IndexShare 1-in-{cfg.dsa.share_every} ms/layer"] + [f"{x} ms" for x in labels]
              + ["unfused ms"] + [f"× {x}" for x in labels] + [f"× {labels[0]} (IndexShare)", "× unfused",
                                                                "IndexShare gain", "loss path share", "loss path / layer"])
    rows = []
    for row in summary["layer"]:
        t = row["t"]
        rows.append(
            [fmt_t(t), cell(find(records, DSA_LAYER, t), row["dsa_ms"]), cell(find(records, shared, t), row["shared_ms"])]
            + [cell(find(records, x, t, BASELINE), row["dense_ms"][x]) for x in labels]
            + [cell(find(records, UNFUSED_LAYER, t, BASELINE), row["unfused_ms"])]
            + [fmt_num(row["speedup_dense"][x], 2, "×") for x in labels]
            + [fmt_num(row["speedup_dense_shared"][labels[0]], 2, "×"), fmt_num(row["speedup_unfused"], 1, "×"),
               fmt_num(row["index_share_gain"], 2, "×"),
               fmt_num(row["loss_path_share"] * 100 if row["loss_path_share"] is not None else None, 1, "%"),
               fmt_num(row["loss_path_share_of_layer"] * 100 if row["loss_path_share_of_layer"] is not None
                       else None, 1, "%")])
    return table(header, rows)


def _memory_lines(cfg: BenchConfig, summary: dict) -> List[str]:
    names = [DSA_LAYER, shared_name(cfg)] + [d.label for d in cfg.dense] + [UNFUSED_LAYER]
    by_key = {(m["name"], m["t"]): m for m in summary["memory"]}
    rows = []
    for t in cfg.seq_lens:
        row = [fmt_t(t)]
        for name in names:
            m = by_key.get((name, t))
            if m is None or (m["status"] == "ok" and m["peak_bytes"] is None):
                row.append("—")
            elif m["status"] == "oom":
                row.append("OOM")
            else:
                row.append(f"{fmt_gib(m['peak_bytes'])} ({fmt_gib(m['extra_bytes'])})")
        rows.append(row)
    return table(["T"] + [f"{n}: peak (extra) GiB" for n in names], rows)


def _missing_lines(records: List[dict]) -> List[str]:
    rows = [[r["section"], r["name"], fmt_t(r["t"]), r["status"], r["reason"].replace("|", "/")]
            for r in records if r["status"] != "ok"]
    if not rows:
        return ["Every case ran."]
    return table(["section", "case", "T", "status", "reason"], rows)


def _peers_lines(summary: dict) -> List[str]:
    """The vs-peers section (bench/peers) when the run measured the peers, else nothing."""
    if not summary.get("peers"):
        return []
    from .peers.report import render_peers_section
    return render_peers_section(summary["peers"], summary.get("gemm_tflops"))


def _peers_header_lines(cfg: BenchConfig) -> List[str]:
    """The header line naming our indexer's selection pass in the peers A/B (runs with the peers section)."""
    if "peers" not in cfg.sections:
        return []
    return [f"- Peers A/B, ours: indexer_topk selection={cfg.indexer_selection}"]


def render_markdown(cfg: BenchConfig, meta: dict, records: List[dict], summary: dict) -> str:
    s = cfg.dsa
    lines = [
        "# FlashDSA benchmark report",
        "",
        f"- Date: {meta['date']}; device: {meta['device_name']}; commit: {meta['commit']}",
        f"- GPU clocks (SM, max SM, memory, power limit): {meta['clocks'] or 'n/a'}",
        f"- torch {meta['torch']}, CUDA {meta['cuda']}; flashdsa: {meta['flashdsa']}",
        f"- Mode: {meta['mode']}; wall time {meta['wall_s']:.0f} s of a {cfg.max_seconds:.0f} s budget",
        f"- DSA shape: H={s.heads}, D_qk={s.d_qk}, D_v={s.d_v}, K={s.topk}, H_I={s.index_heads}, D_I={s.index_dim}, "
        f"{cfg.dtype_name}, one causal sequence of T tokens; sparse-attention index rows: {cfg.index_order}",
        *_peers_header_lines(cfg),
        "",
        "## Summary",
        "",
        *_summary_lines(cfg, summary),
        "",
        "## Machine ceilings (this run)",
        "",
        *_ceiling_lines(records),
        "",
        "## Kernels",
        "",
        f"TFLOP/s by docs/spec.md §9; % of GEMM = kernel TFLOP/s / {cfg.dtype_name} GEMM TFLOP/s of this run; floor and goal "
        "from PERF.md where they apply; × unfused = unfused PyTorch time / kernel time.",
        "",
        *_kernel_lines(summary),
        "",
        *_peers_lines(summary),
        "## DSA layer forward + backward vs baselines",
        "",
        "Times per layer (an IndexShare group's time divided by its layers). × X = X's time / DSA layer time. "
        "Loss path = the mass output's extra time in the sparse MLA backward (sparse_mla_bwd_mass − sparse_mla_bwd; the attention_mass recompute when that is not measured) + sparse_kl_fwd + sparse_kl_bwd. Loss path share = loss path / (sparse_mla_fwd + sparse_mla_bwd + indexer_topk + loss path), kernel times (issue 7); loss path / layer = loss path / DSA layer time.",
        "",
        *_layer_lines(cfg, summary, records),
        "",
        "![layer time vs T](time_vs_T.png)",
        "",
        "![kernel TFLOP/s vs T](kernel_tflops.png)",
        "",
        "## Memory",
        "",
        "peak = torch.cuda.max_memory_allocated during one call (inputs included); extra = peak − memory "
        "allocated before the call − bytes of what the call returns (output, loss, gradients): the workspace "
        "and everything saved between forward and backward. Not measured on the CPU.",
        "",
        *_memory_lines(cfg, summary),
        "",
        "![peak memory vs T](memory_vs_T.png)",
        "",
        "## Not measured",
        "",
        *_missing_lines(records),
        "",
        "## Method",
        "",
        f"- Timing: {meta['timing']}",
        "- Kernels whose inputs fit in L2 rotate several input sets; inputs are random (never zeros); "
        "sparse-MLA kernel inputs use distinct random causal top-k indices, the layer uses the indexer's own.",
        "- IndexShare 1-in-4: four layers, the first runs indexer + top-k + loss, all four run sparse MLA "
        "fwd + bwd; each layer's forward is followed by its backward.",
        "- KL kernels are counted as 2·T·K·H_I·D_I (fwd) and 3× that (bwd); dense attention fwd+bwd as 3.5 × "
        "fwd (§9).",
        "",
    ]
    return "\n".join(lines)


def write_outputs(out_dir: Path, cfg: BenchConfig, meta: dict, records: List[dict], summary: dict) -> dict:
    """Writes results.json and report.md; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "report.md"}
    payload = {"meta": meta, "config": config_dict(cfg), "records": records, "summary": summary}
    paths["json"].write_text(json.dumps(payload, indent=1, default=str) + "\n")
    paths["markdown"].write_text(render_markdown(cfg, meta, records, summary))
    return paths


def config_dict(cfg: BenchConfig) -> dict:
    return {
        "device": str(cfg.device), "dtype": str(cfg.dtype), "quick": cfg.quick, "seq_lens": list(cfg.seq_lens),
        "dsa": vars(cfg.dsa) | {"scale": cfg.dsa.scale}, "dense": [vars(d) for d in cfg.dense],
        "sections": list(cfg.sections), "max_seconds": cfg.max_seconds, "gemm_n": cfg.gemm_n,
        "copy_bytes": cfg.copy_bytes, "unfused_max_t": cfg.unfused_max_t,
    }
