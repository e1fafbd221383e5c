"""Derived numbers of a run: ratios to the ceilings, speedups, crossover T, IndexShare gain, memory."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

from .cases import (BASELINE, CEILING, COPY, DSA_LAYER, DSA_SHARED, GEMM, KERNEL, LAYER, LOSS_PATH_KERNELS,
                    LOSS_PATH_RECOMPUTE, MASS_FROM_BWD, UNFUSED_LAYER, UNFUSED_PREFIX)
from .config import KERNEL_TARGETS, LAYER_TARGETS, BenchConfig

OK = "ok"


def find(records: Sequence[dict], name: str, t: Optional[int] = None, section: Optional[str] = None) -> Optional[dict]:
    """The record of case `name` at `t` (None if absent)."""
    for r in records:
        if r["name"] == name and r["t"] == t and (section is None or r["section"] == section):
            return r
    return None


def ok_value(record: Optional[dict], key: str) -> Optional[float]:
    """record[key] if the case ran, else None."""
    if record is None or record["status"] != OK:
        return None
    return record.get(key)


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den == 0:
        return None
    return num / den


def crossover(ts: Sequence[int], fast_ms: Sequence[Optional[float]], slow_ms: Sequence[Optional[float]]) -> dict:
    """The T from which `fast` (DSA) stays faster than `slow` (dense), interpolated in log-log.

    Returns {"t": float or None, "kind": ...}; kind is "interpolated" (crossover between two
    measured T), "below" (faster at every measured T: crossover <= the smallest), "above" (never
    faster: crossover > the largest), or "none" (fewer than one common point).
    """
    points = [(t, s / f) for t, f, s in zip(ts, fast_ms, slow_ms) if f and s]
    if not points:
        return {"t": None, "kind": "none"}
    slower = [i for i, (_, speedup) in enumerate(points) if speedup < 1.0]
    if not slower:
        return {"t": points[0][0], "kind": "below"}
    last = slower[-1]
    if last == len(points) - 1:
        return {"t": points[-1][0], "kind": "above"}
    (t0, r0), (t1, r1) = points[last], points[last + 1]
    frac = -math.log(r0) / (math.log(r1) - math.log(r0))
    return {"t": math.exp(math.log(t0) + frac * (math.log(t1) - math.log(t0))), "kind": "interpolated",
            "between": [t0, t1]}


def shared_name(cfg: BenchConfig) -> str:
    return DSA_SHARED.format(cfg.dsa.share_every)


def summarize(cfg: BenchConfig, records: List[dict]) -> dict:
    """All derived numbers the report prints, as plain JSON-able values."""
    gemm = next((r for r in records if r["section"] == CEILING and r["name"].startswith(GEMM)), None)
    copy = find(records, COPY, None, CEILING)
    gemm_tflops = ok_value(gemm, "tflops")
    ts = list(cfg.seq_lens)

    kernels = []
    for r in records:
        if r["section"] != KERNEL:
            continue
        target = KERNEL_TARGETS.get(r["name"])
        applies = bool(cfg.standard_shape and target and r["t"] >= target.min_t)
        unfused = find(records, UNFUSED_PREFIX + r["name"], r["t"], BASELINE)
        kernels.append({
            "name": r["name"], "t": r["t"], "status": r["status"], "reason": r["reason"],
            "ms": ok_value(r, "ms"), "tflops": ok_value(r, "tflops"),
            "of_gemm": ratio(ok_value(r, "tflops"), gemm_tflops),
            "floor": target.floor if applies else None, "goal": target.goal if applies else None,
            "vs_unfused": ratio(ok_value(unfused, "ms"), ok_value(r, "ms")),
        })

    dense_labels = [d.label for d in cfg.dense]
    layer_rows = []
    for t in ts:
        full = ok_value(find(records, DSA_LAYER, t, LAYER), "ms_per_layer")
        shared = ok_value(find(records, shared_name(cfg), t, LAYER), "ms_per_layer")
        dense = {label: ok_value(find(records, label, t, BASELINE), "ms") for label in dense_labels}
        unfused = ok_value(find(records, UNFUSED_LAYER, t, BASELINE), "ms")
        loss_ms, attention_ms = _loss_path_ms(records, t)
        layer_rows.append({
            "t": t, "dsa_ms": full, "shared_ms": shared, "dense_ms": dense, "unfused_ms": unfused,
            "speedup_dense": {label: ratio(ms, full) for label, ms in dense.items()},
            "speedup_dense_shared": {label: ratio(ms, shared) for label, ms in dense.items()},
            "speedup_unfused": ratio(unfused, full),
            "index_share_gain": ratio(full, shared),
            "loss_path_ms": loss_ms,
            # Issue 7's definition: loss path / (sparse MLA fwd + bwd + indexer + loss path), kernel times.
            "loss_path_share": ratio(loss_ms, None if attention_ms is None or loss_ms is None
                                     else attention_ms + loss_ms),
            "loss_path_share_of_layer": ratio(loss_ms, full),
        })

    crossovers = {}
    for label in dense_labels:
        dense_ms = [row["dense_ms"][label] for row in layer_rows]
        crossovers[label] = {
            "dsa": crossover(ts, [row["dsa_ms"] for row in layer_rows], dense_ms),
            "index_share": crossover(ts, [row["shared_ms"] for row in layer_rows], dense_ms),
        }

    layer_level = {DSA_LAYER, shared_name(cfg), UNFUSED_LAYER, *dense_labels}
    memory = []
    for r in records:
        if r["name"] in layer_level and r["status"] in (OK, "oom"):
            memory.append({"name": r["name"], "t": r["t"], "status": r["status"],
                           "peak_bytes": r.get("peak_bytes"), "extra_bytes": r.get("extra_bytes")})

    summary = {
        "gemm_tflops": gemm_tflops, "copy_gbps": ok_value(copy, "gbps"),
        "kernels": kernels, "layer": layer_rows, "crossover": crossovers, "memory": memory,
        "headline": _headline(cfg, layer_rows, crossovers, records),
    }
    return summary


def _loss_path_ms(records: List[dict], t: int) -> Tuple[Optional[float], Optional[float]]:
    """(loss path ms, sparse MLA fwd + bwd + indexer ms) at T = t from the kernel cases.

    The loss path is the mass output's extra cost in the sparse MLA backward plus the KL forward and
    backward (what the layer runs in training); without a sparse_mla_bwd_mass measurement, the
    attention-mass recompute instead.
    """
    def ms(name: str) -> Optional[float]:
        return ok_value(find(records, name, t, KERNEL), "ms")

    kl = [ms(k) for k in LOSS_PATH_KERNELS]
    with_mass, without = (ms(k) for k in MASS_FROM_BWD)
    mass = ms(LOSS_PATH_RECOMPUTE[0])
    mass_cost = max(0.0, with_mass - without) if with_mass is not None and without is not None else mass
    loss = sum(kl) + mass_cost if mass_cost is not None and all(k is not None for k in kl) else None
    rest = [ms("sparse_mla_fwd"), without, ms("indexer_topk")]
    return loss, (sum(rest) if all(r is not None for r in rest) else None)


def _at_or_largest(rows: List[dict], t: int, key) -> Optional[dict]:
    """The row at T = t if it has a value for key(row), else the largest T that has one."""
    exact = [row for row in rows if row["t"] == t and key(row) is not None]
    if exact:
        return exact[0]
    measured = [row for row in rows if key(row) is not None]
    return measured[-1] if measured else None


def _headline(cfg: BenchConfig, rows: List[dict], crossovers: dict, records: List[dict]) -> Dict[str, object]:
    """The acceptance numbers: crossover vs dense, speedup at 128K, IndexShare gain, memory at 128K."""
    main = cfg.dense[0].label
    speed = _at_or_largest(rows, 131072, lambda row: row["speedup_dense"][main])
    speed_shared = _at_or_largest(rows, 131072, lambda row: row["speedup_dense_shared"][main])
    unfused = _at_or_largest(rows, 131072, lambda row: row["speedup_unfused"])
    mem = find(records, DSA_LAYER, 131072, LAYER)
    headline = {
        "dense_reference": main,
        "crossover_dsa": crossovers[main]["dsa"], "crossover_index_share": crossovers[main]["index_share"],
        "speedup_t": speed["t"] if speed else None,
        "speedup": speed["speedup_dense"][main] if speed else None,
        "speedup_index_share_t": speed_shared["t"] if speed_shared else None,
        "speedup_index_share": speed_shared["speedup_dense_shared"][main] if speed_shared else None,
        "index_share_gain": {row["t"]: row["index_share_gain"] for row in rows if row["index_share_gain"]},
        "vs_unfused_t": unfused["t"] if unfused else None,
        "vs_unfused": unfused["speedup_unfused"] if unfused else None,
        "extra_memory_128k": ok_value(mem, "extra_bytes"),
    }
    if cfg.standard_shape:
        headline["targets"] = dataclasses.asdict(LAYER_TARGETS)
    return headline
