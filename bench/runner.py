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


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class Runner:
    """Runs cases in order and keeps what it learns (times, OOMs) to predict and skip later ones."""

    def __init__(self, cfg: BenchConfig, fd: Optional[ModuleType], fd_error: Optional[str], policy: RepPolicy,
                 out: TextIO, *, has_kernel: Optional[Callable[[str], bool]] = None,
                 device_memory: Optional[int] = None):
        """has_kernel(op): whether the raw op can run on cfg.device (default: flashdsa.built_with_cuda() on
        CUDA, always on the CPU); device_memory: bytes cases may use (default: the GPU's, none on the CPU)."""
        self.cfg = cfg
        self.fd = fd
        self.fd_error = fd_error
        self.clock = Clock(cfg.device, policy)
        self.policy = policy
        self.budget = Budget(cfg.max_seconds)
        self.out = out
        self.records: List[dict] = []
        self.last_ok: Dict[str, dict] = {}  # name -> record of its last measured T
        self.stopped: Dict[str, str] = {}  # name -> why larger T of it are skipped
        self.context_lost = False
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
        if self.context_lost:
            return SKIPPED, "CUDA context lost after an earlier error"
        if case.name in self.stopped:
            return SKIPPED, self.stopped[case.name]
        if self.device_memory and case.memory_bytes and case.memory_bytes > MEMORY_HEADROOM * self.device_memory:
            return SKIPPED, (f"memory: needs about {case.memory_bytes / 2**30:.0f} GiB of "
                             f"{self.device_memory / 2**30:.0f} GiB")
        reason = self.budget.skip_reason(self._predicted_seconds(case))
        if reason:
            self.stopped[case.name] = f"{reason} (at a smaller T)"
            return SKIPPED, reason
        return None

    # ------------------------------------------------------------------ running

    def run_all(self, cases: Sequence[Case]) -> List[dict]:
        for case in cases:
            self.records.append(self.run_case(case))
        return self.records

    def run_case(self, case: Case) -> dict:
        record = {
            "section": case.section, "name": case.name, "t": case.t, "status": OK, "reason": "",
            "flops": case.flops, "bytes_moved": case.bytes_moved, "layers": case.layers, "note": case.note,
        }
        verdict = self.skip(case)
        if verdict is not None:
            record["status"], record["reason"] = verdict
        else:
            self._measure(case, record)
        self._progress(record)
        return record

    def _measure(self, case: Case, record: dict) -> None:
        prepared = None
        try:
            prepared = case.prepare()
            measurement = self.clock.measure(prepared.fn, prepared.input_sets)
            record.update(self._numbers(case, measurement))
            self.last_ok[case.name] = record
        except Exception as error:  # noqa: BLE001 - every failure is recorded with its case
            record["reason"] = _first_line(error)
            if _is_oom(error):
                record["status"] = OOM
                self.stopped[case.name] = f"out of memory at T = {case.t}"
            else:
                record["status"] = ERROR
                self._check_context()
        finally:
            del prepared
            gc.collect()
            if self.cfg.on_cuda:
                torch.cuda.empty_cache()

    def _check_context(self) -> None:
        """After an error on the GPU, checks that the CUDA context still works."""
        if not self.cfg.on_cuda:
            return
        try:
            torch.cuda.synchronize(self.cfg.device)
        except Exception:  # noqa: BLE001 - a sticky CUDA error: every later case would fail
            self.context_lost = True

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
