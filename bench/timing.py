"""Timing (CUDA events or perf_counter), adaptive repetitions, peak memory, and the time budget.

Method (PERF.md "How to measure"): warm-up calls first, then the median of the timed repetitions;
the repetitions cycle through the case's input sets (several sets when they would fit in L2).
Repetitions are adaptive (RepPolicy) so that the whole GPU run fits in its budget: every case
under 0.5 s per call gets at least 10 repetitions; longer ones get at least 3, enough to fill
about 5 s.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch

@dataclass(frozen=True)
class RepPolicy:
    """How many warm-up calls and timed repetitions a case gets, from its time per call.

    Calls shorter than long_call_s get at least min_reps repetitions (more, up to max_reps, to
    fill short_case_s); longer calls get at least min_reps_long, enough to fill long_case_s.
    """

    min_reps: int = 10
    max_reps: int = 100
    min_reps_long: int = 3
    long_call_s: float = 0.5
    short_case_s: float = 0.5
    long_case_s: float = 5.0
    max_warmups: int = 3
    warmup_s: float = 0.25

    def reps(self, call_s: float) -> int:
        """Timed repetitions for a call of about call_s seconds."""
        if call_s < self.long_call_s:
            wanted = math.ceil(self.short_case_s / max(call_s, 1e-6))
            return max(self.min_reps, min(self.max_reps, wanted))
        wanted = math.ceil(self.long_case_s / call_s)
        return max(min(self.min_reps_long, self.min_reps), min(self.min_reps, wanted))

    def warmups(self, call_s: float) -> int:
        """Warm-up calls: one for long calls, up to max_warmups for short ones."""
        return max(1, min(self.max_warmups, math.ceil(self.warmup_s / max(call_s, 1e-6))))

    def describe(self) -> str:
        return (f"median of >= {self.min_reps} repetitions for calls under {self.long_call_s:g} s, "
                f">= {min(self.min_reps_long, self.min_reps)} (about {self.long_case_s:g} s worth) for longer ones; "
                f"up to {self.max_warmups} warm-up calls first")

    def planned_seconds(self, call_s: float) -> float:
        """Predicted wall time of a whole measurement (warm-up + repetitions)."""
        return call_s * (self.warmups(call_s) + self.reps(call_s))


GPU_POLICY = RepPolicy()
# CPU mode only checks that the script works: fewer, shorter repetitions.
CPU_POLICY = RepPolicy(min_reps=3, max_reps=10, min_reps_long=2, long_call_s=0.2, short_case_s=0.1,
                       long_case_s=0.5, max_warmups=1, warmup_s=0.0)


def tensor_bytes(obj: Any) -> int:
    """Bytes of all distinct tensors in a (nested) tuple/list/dict of results."""
    seen = {}

    def visit(x):
        if isinstance(x, torch.Tensor):
            seen[x.data_ptr()] = max(seen.get(x.data_ptr(), 0), x.untyped_storage().nbytes())
        elif isinstance(x, (list, tuple)):
            for item in x:
                visit(item)
        elif isinstance(x, dict):
            for item in x.values():
                visit(item)

    visit(obj)
    return sum(seen.values())


@dataclass
class Measurement:
    """One case's timing; memory fields are None off CUDA."""

    times_ms: List[float]
    warmups: int
    input_sets: int
    peak_bytes: Optional[int]  # max_memory_allocated during the last call (inputs included)
    extra_bytes: Optional[int]  # peak - allocated before the call - bytes of what the call returns

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)


class Clock:
    """Times calls on one device: CUDA events on the GPU, perf_counter on the CPU.

    measure() runs a whole case (warm-up, adaptive repetitions, peak memory); mark() / ms() time
    spans inside a program (bench/cp_scaling.py brackets collectives and passes with them).
    """

    def __init__(self, device: torch.device, policy: Optional[RepPolicy] = None):
        self.device = device
        self.policy = policy if policy is not None else RepPolicy()
        self.on_cuda = device.type == "cuda"

    def sync(self) -> None:
        """Waits for the device's queued work (no-op on the CPU), so marks can be read."""
        if self.on_cuda:
            torch.cuda.synchronize(self.device)

    def mark(self):
        """A point on the device's timeline: a CUDA event recorded on the current stream, or a
        perf_counter value on the CPU."""
        if self.on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        """Milliseconds between two marks (after :meth:`sync` on the GPU)."""
        return start.elapsed_time(end) if self.on_cuda else (end - start) * 1e3

    def wall_call(self, fn: Callable[[Any], Any], arg: Any) -> float:
        """Seconds of one synchronized call (used for warm-up and to size the repetitions)."""
        self.sync()
        start = time.perf_counter()
        result = fn(arg)
        self.sync()
        del result
        return time.perf_counter() - start

    def measure(self, fn: Callable[[Any], Any], input_sets: Sequence[Any]) -> Measurement:
        """Warm-up, then timed repetitions cycling through input_sets; memory on the last one."""
        first_s = self.wall_call(fn, input_sets[0])  # includes one-time set-up (plans, workspaces)
        warm_s = first_s
        warmups = self.policy.warmups(first_s)
        for i in range(1, warmups):
            warm_s = self.wall_call(fn, input_sets[i % len(input_sets)])
        reps = self.policy.reps(warm_s)
        times_ms, peak, extra = self._timed(fn, input_sets, reps)
        return Measurement(times_ms, warmups, len(input_sets), peak, extra)

    def _timed(self, fn, input_sets, reps):
        peak = extra = None
        if not self.on_cuda:
            times_ms = []
            for i in range(reps):
                start = time.perf_counter()
                result = fn(input_sets[i % len(input_sets)])
                times_ms.append((time.perf_counter() - start) * 1e3)
                del result
            return times_ms, peak, extra
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        self.sync()
        for i, (start, end) in enumerate(events):
            last = i == reps - 1
            if last:
                # The allocator tracks allocations on the host, so no synchronization is needed.
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            start.record()
            result = fn(input_sets[i % len(input_sets)])
            end.record()
            if last:
                peak = torch.cuda.max_memory_allocated(self.device)
                extra = peak - before - tensor_bytes(result)
            del result
        self.sync()
        return [start.elapsed_time(end) for start, end in events], peak, extra


class Budget:
    """Wall-clock budget of the whole run: predicts whether a case still fits."""

    def __init__(self, max_seconds: float):
        self.max_seconds = max_seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.max_seconds - self.elapsed()

    def skip_reason(self, predicted_s: Optional[float]) -> Optional[str]:
        """Why a case predicted to take predicted_s (None: unknown) must be skipped, or None."""
        left = self.left()
        if left <= 0:
            return f"time budget of {self.max_seconds:.0f} s spent"
        if predicted_s is not None and predicted_s > left:
            return f"time budget: predicted {predicted_s:.0f} s, {left:.0f} s left of {self.max_seconds:.0f} s"
        return None
