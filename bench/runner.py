"""Runs the cases one by one: skip rules, timing, error capture, one progress line per case.

Every case is isolated: an exception is recorded with the case (out of memory as "oom", anything
else as "error") and the run goes on; memory is released between cases.
"""

from __future__ import annotations

import gc
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence, TextIO

import torch

from .cases import Case
from .config import BenchConfig
from .report import fmt_rate
from .timing import Budget, Clock, Measurement, RepPolicy

OK, NA, SKIPPED, OOM, ERROR = "ok", "n/a", "skipped", "oom", "error"
# Memory the predicted footprint of a case may take, as a share of the device's memory.
MEMORY_HEADROOM = 0.9
# Input generation and allocation on top of the timed calls, for the budget prediction.
SETUP_OVERHEAD = 1.2


def _is_oom(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


class NotApplicable(Exception):
    """Raised by a case's preparation when the case cannot run on its inputs (e.g. a peer kernel that would read out
    of bounds on them): the case is recorded as n/a with this message, and the run goes on."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class CaseLoop:
    """What every case runner shares: the run-in-order loop, the skip rules that follow from earlier
    cases (lost CUDA context, a series stopped by an OOM or the budget), error capture with memory
    release, and the CUDA context check. Subclasses give `_new_record`, `skip`, `_time` (measures a
    prepared case into its record), `_series` (the key a failure stops) and `_progress`."""

    def __init__(self, device: torch.device, max_seconds: Optional[float]):
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.budget = Budget(max_seconds)
        self.records: List[dict] = []
        self.last_ok: Dict[str, dict] = {}  # series -> record of its last measured T
        self.stopped: Dict[str, str] = {}  # series -> why larger T of it are skipped
        self.context_lost = False

    def _history_skip(self, series: str, predicted_seconds: Optional[float]) -> Optional[tuple]:
        """(SKIPPED, reason) after a lost context, in a stopped series, or when the budget is short."""
        if self.context_lost:
            return SKIPPED, "CUDA context lost after an earlier error"
        if series in self.stopped:
            return SKIPPED, self.stopped[series]
        reason = self.budget.skip_reason(predicted_seconds)
        if reason:
            self.stopped[series] = f"{reason} (at a smaller T)"
            return SKIPPED, reason
        return None

    def run_all(self, cases: Sequence) -> List[dict]:
        """Runs (or skips) every case in order; returns one record per case."""
        for case in cases:
            self.records.append(self.run_case(case))
        return self.records

    def run_case(self, case) -> dict:
        """One case's record: its numbers, or why it did not run; prints its progress line."""
        record = self._new_record(case)
        verdict = self.skip(case)
        if verdict is not None:
            record["status"], record["reason"] = verdict
        else:
            self._measure(case, record)
        self._progress(record)
        return record

    def _measure(self, case, record: dict) -> None:
        prepared = None
        try:
            prepared = case.prepare()
            self._time(case, prepared, record)
            self.last_ok[self._series(case)] = record
        except NotApplicable as why:
            record["status"], record["reason"] = NA, str(why)
        except Exception as error:  # noqa: BLE001 - every failure is recorded with its case
            record["reason"] = _first_line(error)
            if _is_oom(error):
                record["status"] = OOM
                self.stopped[self._series(case)] = f"out of memory at T = {case.t}"
            else:
                record["status"] = ERROR
                self._check_context()
        finally:
            del prepared
            gc.collect()
            if self.on_cuda:
                try:
                    torch.cuda.empty_cache()
                except Exception as error:  # noqa: BLE001 - a sticky CUDA error (e.g. a kernel's illegal address)
                    self.context_lost = True
                    if record["status"] == OK:  # the fault surfaced only here: the case's numbers are not trusted
                        record["status"], record["reason"] = ERROR, _first_line(error)
                        self.last_ok.pop(self._series(case), None)

    def _check_context(self) -> None:
        """After an error on the GPU, checks that the CUDA context still works."""
        if not self.on_cuda:
            return
        try:
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 - a sticky CUDA error: every later case would fail
            self.context_lost = True


class Runner(CaseLoop):
    """Runs cases in order and keeps what it learns (times, OOMs) to predict and skip later ones."""

    def __init__(self, cfg: BenchConfig, fd: Optional[ModuleType], fd_error: Optional[str], policy: RepPolicy,
                 out: TextIO, *, has_kernel: Optional[Callable[[str], bool]] = None,
                 device_memory: Optional[int] = None):
        """has_kernel(op): whether the raw op can run on cfg.device (default: flashdsa.built_with_cuda() on
        CUDA, always on the CPU); device_memory: bytes cases may use (default: the GPU's, none on the CPU)."""
        super().__init__(torch.device(cfg.device), cfg.max_seconds)
        self.cfg = cfg
        self.fd = fd
        self.fd_error = fd_error
        self.clock = Clock(cfg.device, policy)
        self.policy = policy
        self.out = out
        if has_kernel is None:
            cuda_kernels = fd is not None and fd.built_with_cuda()
            has_kernel = (lambda op: cuda_kernels) if cfg.on_cuda else (lambda op: True)
        self.has_kernel = has_kernel
        if device_memory is None and cfg.on_cuda:
            device_memory = torch.cuda.get_device_properties(cfg.device).total_memory
        self.device_memory = device_memory

    # ------------------------------------------------------------------ skip rules

    def _predicted_seconds(self, case: Case) -> Optional[float]:
        """Wall time of the case's measurement, scaled from the same case at the last smaller T."""
        prev = self.last_ok.get(case.name)
        if prev is None or case.t is None:
            return None
        if case.flops and prev["flops"]:
            ratio = case.flops / prev["flops"]
        else:
            ratio = case.t / prev["t"]
        call_s = prev["ms"] / 1e3 * ratio
        return self.policy.planned_seconds(call_s) * SETUP_OVERHEAD

    def skip(self, case: Case) -> Optional[tuple]:
        """(status, reason) if the case must not run, else None."""
        if case.requires and self.fd is None:
            return NA, f"flashdsa not importable ({self.fd_error})"
        missing = [op for op in case.requires if not self.has_kernel(op)]
        if missing:
            return NA, f"no kernel: {', '.join(missing)}"
        if self.device_memory and case.memory_bytes and case.memory_bytes > MEMORY_HEADROOM * self.device_memory:
            if not self.context_lost and case.name not in self.stopped:
                return SKIPPED, (f"memory: needs about {case.memory_bytes / 2**30:.0f} GiB of "
                                 f"{self.device_memory / 2**30:.0f} GiB")
        return self._history_skip(case.name, self._predicted_seconds(case))

    # ------------------------------------------------------------------ running

    def _new_record(self, case: Case) -> dict:
        return {
            "section": case.section, "name": case.name, "t": case.t, "status": OK, "reason": "",
            "flops": case.flops, "bytes_moved": case.bytes_moved, "layers": case.layers, "note": case.note,
        }

    @staticmethod
    def _series(case: Case) -> str:
        return case.name

    def _time(self, case: Case, prepared, record: dict) -> None:
        record.update(self._numbers(case, self.clock.measure(prepared.fn, prepared.input_sets)))

    @staticmethod
    def _numbers(case: Case, m: Measurement) -> dict:
        ms = m.median_ms
        numbers = {
            "ms": ms, "ms_min": min(m.times_ms), "ms_max": max(m.times_ms), "reps": len(m.times_ms),
            "warmups": m.warmups, "input_sets": m.input_sets, "ms_per_layer": ms / case.layers,
            "tflops": case.flops / (ms * 1e-3) / 1e12 if case.flops else None,
            "gbps": case.bytes_moved / (ms * 1e-3) / 1e9 if case.bytes_moved else None,
            "peak_bytes": m.peak_bytes, "extra_bytes": m.extra_bytes,
        }
        return numbers

    def _progress(self, r: dict) -> None:
        t = f"T={r['t']:>7}" if r["t"] is not None else " " * 9
        head = f"[{self.budget.elapsed():6.1f}s] {r['section']:<8} {r['name']:<34} {t}"
        if r["status"] != OK:
            line = f"{head}  {r['status']}: {r['reason']}"
        else:
            rate = (f"{fmt_rate(r['tflops']):>8} TFLOP/s" if r["tflops"] is not None
                    else f"{fmt_rate(r['gbps']):>8} GB/s    " if r["gbps"] is not None else "")
            line = f"{head} {r['ms']:11.3f} ms {rate}  (median of {r['reps']})"
        print(line, file=self.out, flush=True)
