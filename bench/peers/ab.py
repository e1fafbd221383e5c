"""A/B timing of FlashDSA against a peer, and the cross-checks of their outputs.

The two implementations run alternately, call by call, in one process on the same inputs: round r
times ours then the peer (the order flips every round, so neither always runs on a cache the other
warmed). Each side's figure is the median over the rounds; ratio = peer ms / ours ms (> 1: FlashDSA
is faster). Timing uses CUDA events on the GPU and perf_counter on the CPU (bench/timing.py's Clock).
On the GPU each round starts behind a short spin kernel (HOLD_CYCLES, as nvbench's blocking kernel): the
host queues the round's first call while the device spins, so neither side's time includes the host's
launch latency on an idle device (the second call of a round is queued behind the first anyway).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..timing import Clock, RepPolicy

MIN_ROUNDS = 10
# Device cycles of the spin that starts each GPU round (≈ 1 ms at 1.98 GHz): longer than either side's host
# time to queue one call. FLASHDSA_AB_HOLD=0 turns it off (every round then starts on an idle device).
HOLD_CYCLES = 2_000_000


@dataclass
class Side:
    """One implementation of an A/B pair: fn(arg) is one call; args[i] belongs to input set i."""

    fn: Callable[[Any], Any]
    args: List[Any]


@dataclass
class ABPrepared:
    """A prepared A/B case: ours and the peer on the same input sets (converted outside the timed region).

    check(ours_result, peer_result, set_index) returns the cross-check numbers (relative errors,
    recall) of one pair of results; it runs once, on the warm-up results, outside the timing.
    """

    ours: Side
    peer: Side
    check: Optional[Callable[[Any, Any, int], Dict[str, float]]] = None


@dataclass
class ABResult:
    ours_ms: List[float]
    peer_ms: List[float]
    checks: Dict[str, float] = field(default_factory=dict)
    warmups: int = 1

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours_ms)

    @property
    def peer_median(self) -> float:
        return statistics.median(self.peer_ms)

    @property
    def ratio(self) -> float:
        """peer ms / ours ms: > 1 means FlashDSA is faster."""
        return self.peer_median / self.ours_median


def rounds_for(policy: RepPolicy, call_s: float, min_rounds: int = MIN_ROUNDS) -> int:
    """Rounds for a pair whose slower call takes call_s: the policy's repetitions, at least min_rounds."""
    return max(min_rounds, min(policy.max_reps, policy.reps(call_s)))


class ABTimer:
    """Alternates two implementations call by call and times each call."""

    def __init__(self, device: torch.device, policy: RepPolicy, min_rounds: int = MIN_ROUNDS):
        self.clock = Clock(device, policy)
        self.policy = policy
        self.min_rounds = min_rounds
        self.on_cuda = device.type == "cuda"

    def _time_one(self, fn, arg) -> tuple:
        """(ms, result) of one call; the CUDA version returns the events, read after the round."""
        if not self.on_cuda:
            start = time.perf_counter()
            result = fn(arg)
            return (time.perf_counter() - start) * 1e3, result
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn(arg)
        end.record()
        return (start, end), result

    def run(self, prepared: ABPrepared) -> ABResult:
        """Warm-up (one call each, checked), then alternated timed rounds; returns both series."""
        ours, peer = prepared.ours, prepared.peer
        if len(ours.args) != len(peer.args) or not ours.args:
            raise ValueError("ours and the peer need the same, non-zero number of input sets")
        sets = len(ours.args)
        # Warm-up: the first calls compile / plan / allocate; their results are cross-checked. A second
        # call of each (on the next input set) gives the time per call that sizes the rounds.
        self.clock.sync()
        ours_result = ours.fn(ours.args[0])
        peer_result = peer.fn(peer.args[0])
        self.clock.sync()
        checks = prepared.check(ours_result, peer_result, 0) if prepared.check else {}
        del ours_result, peer_result
        ours_s = self.clock.wall_call(ours.fn, ours.args[1 % sets])
        peer_s = self.clock.wall_call(peer.fn, peer.args[1 % sets])
        rounds = rounds_for(self.policy, max(ours_s, peer_s), self.min_rounds)
        ours_ms, peer_ms = [], []
        hold = self.on_cuda and os.environ.get("FLASHDSA_AB_HOLD", "1") != "0"
        for r in range(rounds):
            i = r % sets
            order = ((ours, ours_ms), (peer, peer_ms)) if r % 2 == 0 else ((peer, peer_ms), (ours, ours_ms))
            if hold:
                torch.cuda._sleep(HOLD_CYCLES)  # the first call below is queued while this runs
            pending = []
            for side, series in order:
                timing, result = self._time_one(side.fn, side.args[i])
                del result
                pending.append((timing, series))
            if self.on_cuda:
                self.clock.sync()
                for (start_event, end_event), series in pending:
                    series.append(start_event.elapsed_time(end_event))
            else:
                for ms, series in pending:
                    series.append(ms)
        return ABResult(ours_ms, peer_ms, checks, warmups=2)


# ---------------------------------------------------------------------- cross-checks

def rel_err(value: torch.Tensor, reference: torch.Tensor, rows_per_chunk: int = 4096) -> float:
    """||value - reference||_F / ||reference||_F in float64, over row chunks (no full fp32 copies)."""
    if value.shape != reference.shape:
        raise ValueError(f"shape mismatch: {tuple(value.shape)} vs {tuple(reference.shape)}")
    num = den = 0.0
    for first in range(0, reference.shape[0], rows_per_chunk):
        a = value[first:first + rows_per_chunk].double()
        b = reference[first:first + rows_per_chunk].double()
        finite = torch.isfinite(b)  # empty slots (-inf in the reference) are left out of both norms
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        num += float(torch.where(finite, a - b, zero).nan_to_num(nan=math.inf).square().sum())
        den += float(torch.where(finite, b, zero).square().sum())
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def max_abs_err(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| over the entries where the reference is finite."""
    finite = torch.isfinite(reference)
    if not bool(finite.any()):
        return 0.0
    return float((value.double() - reference.double())[finite].abs().max())


def topk_recall(selected: torch.Tensor, exact: torch.Tensor, rows_per_chunk: int = 8192) -> Dict[str, float]:
    """Recall of the exact top-k: per row |selected ∩ exact| / |exact|, over rows with a valid entry.

    selected, exact: [T, K] integer indices, -1 (or any negative) for empty slots; order inside a row
    does not matter. Returns mean and minimum recall over the rows, and the rows counted.
    """
    if selected.shape[0] != exact.shape[0]:
        raise ValueError(f"row count mismatch: {selected.shape[0]} vs {exact.shape[0]}")
    total, rows, worst = 0.0, 0, 1.0
    for first in range(0, exact.shape[0], rows_per_chunk):
        e = exact[first:first + rows_per_chunk].long()
        s = selected[first:first + rows_per_chunk].long()
        s = torch.where(s >= 0, s, torch.full_like(s, -1)).sort(dim=1).values
        pos = torch.searchsorted(s, e).clamp_max(s.shape[1] - 1)
        hit = (s.gather(1, pos) == e) & (e >= 0)
        valid = (e >= 0).sum(dim=1)
        keep = valid > 0
        recall = hit.sum(dim=1)[keep].double() / valid[keep].double()
        if recall.numel():
            total += float(recall.sum())
            rows += recall.numel()
            worst = min(worst, float(recall.min()))
    return {"recall_mean": total / rows if rows else math.nan, "recall_min": worst if rows else math.nan,
            "recall_rows": float(rows)}


def summarize_errors(pairs: Sequence[tuple]) -> Dict[str, float]:
    """{name: rel_err(value, reference)} for (name, value, reference) triples (None values skipped)."""
    return {name: rel_err(value, reference) for name, value, reference in pairs if value is not None}
