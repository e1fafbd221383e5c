"""Runs the A/B cases one by one: absent peers, skip rules, OOM/error capture, a progress line per case.

A case of an absent peer is recorded as "absent" (with the reason) without running; an out-of-memory
stops that series (same kernel, peer and heads) for larger T; any other error is recorded and the run
goes on (unless the CUDA context is lost). Memory is released between cases.
"""

from __future__ import annotations

import gc
from typing import Dict, List, Optional, Sequence, TextIO

import torch

from ..report import fmt_rate
from ..timing import Budget, RepPolicy
from .ab import ABTimer
from .cases import PeerCase
from .registry import PeerStatus

OK, ABSENT, NA, SKIPPED, OOM, ERROR = "ok", "absent", "n/a", "skipped", "oom", "error"
SETUP_OVERHEAD = 1.5  # input generation, conversions and warm-up on top of the timed rounds


def _is_oom(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text.lower()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class PeerRunner:
    """Runs PeerCases with an ABTimer under a wall-clock budget; keeps the records."""

    def __init__(self, device: torch.device, policy: RepPolicy, peers: Dict[str, PeerStatus], out: TextIO,
                 max_seconds: float, min_rounds: int = 10):
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.timer = ABTimer(device, policy, min_rounds)
        self.policy = policy
        self.peers = peers
        self.out = out
        self.budget = Budget(max_seconds)
        self.records: List[dict] = []
        self.last_ok: Dict[str, dict] = {}
        self.stopped: Dict[str, str] = {}
        self.context_lost = False

    def _predicted_seconds(self, case: PeerCase) -> Optional[float]:
        prev = self.last_ok.get(case.series)
        if prev is None:
            return None
        scale = case.flops / prev["flops"]
        call_s = (prev["ours_ms"] + prev["peer_ms"]) / 1e3 * scale
        rounds = max(prev["rounds"], self.timer.min_rounds)
        return call_s * (rounds + 2) * SETUP_OVERHEAD

    def skip(self, case: PeerCase) -> Optional[tuple]:
        """(status, reason) if the case must not run (absent peer, n/a, lost context, stopped, budget)."""
        status = self.peers.get(case.peer_key)
        if status is None or not status.present:
            return ABSENT, status.detail if status else "not probed"
        if case.unsupported:
            return NA, case.unsupported
        if self.context_lost:
            return SKIPPED, "CUDA context lost after an earlier error"
        if case.series in self.stopped:
            return SKIPPED, self.stopped[case.series]
        reason = self.budget.skip_reason(self._predicted_seconds(case))
        if reason:
            self.stopped[case.series] = f"{reason} (at a smaller T)"
            return SKIPPED, reason
        return None

    def run_all(self, cases: Sequence[PeerCase]) -> List[dict]:
        """Runs (or skips) every case in order; returns one record per case."""
        for case in cases:
            self.records.append(self.run_case(case))
        return self.records

    def run_case(self, case: PeerCase) -> dict:
        """One case's record: the A/B numbers and checks, or why it did not run; prints its line."""
        record = {"kernel": case.kernel, "peer": case.peer, "peer_key": case.peer_key, "t": case.t,
                  "heads": case.heads, "flops": case.flops, "status": OK, "reason": "", "note": case.note,
                  "ours_ms": None, "peer_ms": None, "ratio": None, "ours_tflops": None, "peer_tflops": None,
                  "rounds": 0, "checks": {}}
        verdict = self.skip(case)
        if verdict is not None:
            record["status"], record["reason"] = verdict
        else:
            self._measure(case, record)
        self._progress(record)
        return record

    def _measure(self, case: PeerCase, record: dict) -> None:
        prepared = None
        try:
            prepared = case.prepare()
            result = self.timer.run(prepared)
            ours, peer = result.ours_median, result.peer_median
            record.update(ours_ms=ours, peer_ms=peer, ratio=result.ratio, rounds=len(result.ours_ms),
                          ours_tflops=case.flops / (ours * 1e-3) / 1e12, peer_tflops=case.flops / (peer * 1e-3) / 1e12,
                          ours_ms_all=result.ours_ms, peer_ms_all=result.peer_ms, checks=result.checks)
            self.last_ok[case.series] = record
        except Exception as error:  # noqa: BLE001 - every failure is recorded with its case
            record["reason"] = _first_line(error)
            if _is_oom(error):
                record["status"] = OOM
                self.stopped[case.series] = f"out of memory at T = {case.t}"
            else:
                record["status"] = ERROR
                self._check_context()
        finally:
            del prepared
            gc.collect()
            if self.on_cuda:
                torch.cuda.empty_cache()

    def _check_context(self) -> None:
        if not self.on_cuda:
            return
        try:
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 - a sticky CUDA error: every later case would fail
            self.context_lost = True

    def _progress(self, r: dict) -> None:
        head = (f"[{self.budget.elapsed():6.1f}s] peers    {r['kernel']:<14} H={r['heads']:<4} T={r['t']:>7} "
                f"{r['peer']:<44}")
        if r["status"] != OK:
            line = f"{head} {r['status']}: {r['reason']}"
        else:
            checks = ", ".join(f"{k} {v:.3g}" for k, v in r["checks"].items() if k != "recall_rows")
            line = (f"{head} peer {r['peer_ms']:10.3f} ms ({fmt_rate(r['peer_tflops'])}) | ours "
                    f"{r['ours_ms']:10.3f} ms ({fmt_rate(r['ours_tflops'])}) | ratio {r['ratio']:.2f} "
                    f"(median of {r['rounds']}){'; ' + checks if checks else ''}")
        print(line, file=self.out, flush=True)
