"""The "vs peers" section of report.md, from the A/B records of bench/peers/runner.py."""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..report import fmt_ms, fmt_num, fmt_rate, fmt_t, table
from .cases import INDEXER

CHECK_LABELS = (
    ("out_rel_err", "out rel {:.1e}"),
    ("lse_max_abs_err", "lse abs {:.1e}"),
    ("dq_rel_err", "dq rel {:.1e}"),
    ("dkv_rel_err", "dkv rel {:.1e}"),
    ("scores_rel_err", "scores rel {:.1e}"),
    ("recall_mean", "recall {:.5f}"),
    ("recall_min", "min row {:.4f}"),
    ("fp8_recall_mean", "fp8 recall {:.5f}"),
    ("fp8_recall_min", "fp8 min row {:.4f}"),
    ("tl_bin_max", "its threshold bin {:.0f} of 4096"),
)


def check_text(checks: dict) -> str:
    """Short text of a case's cross-check numbers, e.g. 'out rel 4.0e-05, lse abs 1.2e-06'."""
    parts = [fmt.format(checks[key]) for key, fmt in CHECK_LABELS if checks.get(key) is not None]
    return ", ".join(parts) or "—"


def _status_text(r: dict) -> str:
    if r["status"] == "ok":
        return "ok"
    reason = r["reason"].replace("|", "/")
    return f"{r['status']}: {reason}" if reason else r["status"]


def kernel_label(kernel: str, indexer_selection: str = "bf16") -> str:
    """The kernel cell of a row: 'indexer_topk (ours fp8)' when our indexer ran the fp8 selection."""
    return f"{kernel} (ours {indexer_selection})" if kernel == INDEXER and indexer_selection != "bf16" else kernel


def peers_table(rows: Sequence[dict], gemm_tflops: Optional[float], indexer_selection: str = "bf16") -> List[str]:
    """Markdown table: kernel, T, heads, peer, peer ms, ours ms, ratio, TFLOP/s of each, GEMM ceiling, check.

    indexer_selection: our indexer_topk's selection pass; other than "bf16", the indexer rows' kernel
    cell names it (kernel_label)."""
    gemm = fmt_rate(gemm_tflops)
    body = []
    for r in rows:
        ok = r["status"] == "ok"
        body.append([kernel_label(r["kernel"], indexer_selection), fmt_t(r["t"]), str(r["heads"]), r["peer"],
                     fmt_ms(r["peer_ms"]) if ok else "—", fmt_ms(r["ours_ms"]) if ok else "—",
                     fmt_num(r["ratio"], 2, "×") if ok else "—",
                     fmt_rate(r["peer_tflops"]) if ok else "—", fmt_rate(r["ours_tflops"]) if ok else "—",
                     gemm, check_text(r.get("checks") or {}) if ok else "—", _status_text(r)])
    return table(["kernel", "T", "H", "peer", "peer ms", "ours ms", "ratio (peer / ours)", "peer TFLOP/s",
                  "ours TFLOP/s", "GEMM TFLOP/s (this run)", "cross-check vs ours", "status"], body)


def selection_text(indexer_selection: str) -> str:
    """The report line saying which selection pass our indexer_topk ran, and what its checks compare."""
    if indexer_selection == "bf16":
        return "ours: indexer_topk selection=bf16 (the raw op, exact top-k)."
    how = {"fp8-band": "selection=\"fp8\", fp8_band=topk // 4 (indices only), default candidate count",
           "fp8-fast": "selection=\"fp8\", fp8_band=topk // 8, fp8_candidates=topk + topk // 8 (indices only)",
           "fp8-scaled": "selection=\"fp8\", fp8_band=topk // 8, fp8_candidates=topk + topk // 8, "
                         "fp8_band_scaled=True (indices only)"}.get(
               indexer_selection, f"selection=\"{indexer_selection}\", default candidate count")
    return (f"ours: indexer_topk selection={indexer_selection} (flashdsa.indexer_topk(..., "
            f"{how}); the per-row e4m3 quantization of q_idx / "
            "k_idx is inside the timed call). The indexer cross-checks compare the peer with our exact bf16 "
            "top-k, computed on the same inputs outside the timing; fp8 recall = the fp8 selection's recall "
            "of that exact top-k (mean over rows, worst row).")


def render_peers_section(peers: dict, gemm_tflops: Optional[float]) -> List[str]:
    """The whole '## vs peers' section from summary['peers'] ({'status': [...], 'rows': [...]})."""
    lines = ["## vs peers", "",
             "FlashDSA and each public peer alternated call by call in one process on the same inputs "
             "(converted to the peer's layout outside the timed region); on the GPU each round starts behind a "
             "≈ 1 ms spin kernel, so the host queues the first call before the device reaches it (no host "
             "launch latency in either side's time; FLASHDSA_AB_HOLD=0 turns it off); median over the rounds; ratio = "
             "peer ms / ours ms (> 1: FlashDSA is faster). H is the attention heads (the indexer's H_I for "
             "indexer_topk). TFLOP/s of both sides by docs/spec.md §9 (bench/flops.py). Cross-check: relative "
             "Frobenius error of the peer's output vs ours, max abs error of the natural-log lse, recall of "
             "our exact top-k (mean over rows, worst row).", ""]
    rows = peers.get("rows", [])
    selection = peers.get("indexer_selection", "bf16")
    if any(r["kernel"] == INDEXER for r in rows):
        lines += [selection_text(selection), ""]
    for s in peers.get("status", []):
        lines.append(f"- {s['package']}: {'present, ' + s['detail'] if s['present'] else 'absent (' + s['detail'] + ')'}")
    lines += ["", *peers_table(rows, gemm_tflops, selection), ""]
    return lines
