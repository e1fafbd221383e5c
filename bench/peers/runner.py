"""Runs the A/B cases one by one: absent peers, skip rules, OOM/error capture, a progress line per case.

A case of an absent peer is recorded as "absent" (with the reason) without running; an out-of-memory
stops that series (same kernel, peer and heads) for larger T; any other error is recorded and the run
goes on (unless the CUDA context is lost). Memory is released between cases.
"""

from __future__ import annotations

from typing import Dict, Optional, TextIO

import torch

from ..report import fmt_rate
from ..runner import CaseLoop
from ..timing import RepPolicy
from .ab import ABTimer
from .cases import PeerCase
from .registry import PeerStatus

OK, ABSENT, NA, SKIPPED, OOM, ERROR = "ok", "absent", "n/a", "skipped", "oom", "error"
SETUP_OVERHEAD = 1.5  # input generation, conversions and warm-up on top of the timed rounds


class PeerRunner(CaseLoop):
    """Runs PeerCases with an ABTimer under a wall-clock budget; keeps the records."""

    def __init__(self, device: torch.device, policy: RepPolicy, peers: Dict[str, PeerStatus], out: TextIO,
                 max_seconds: float, min_rounds: int = 10):
        super().__init__(device, max_seconds)
        self.timer = ABTimer(device, policy, min_rounds)
        self.policy = policy
        self.peers = peers
        self.out = out

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
        return self._history_skip(case.series, self._predicted_seconds(case))

    @staticmethod
    def _new_record(case: PeerCase) -> dict:
        return {"kernel": case.kernel, "peer": case.peer, "peer_key": case.peer_key, "t": case.t,
                "heads": case.heads, "flops": case.flops, "status": OK, "reason": "", "note": case.note,
                "ours_ms": None, "peer_ms": None, "ratio": None, "ours_tflops": None, "peer_tflops": None,
                "rounds": 0, "checks": {}}

    @staticmethod
    def _series(case: PeerCase) -> str:
        return case.series

    def _time(self, case: PeerCase, prepared, record: dict) -> None:
        result = self.timer.run(prepared)
        ours, peer = result.ours_median, result.peer_median
        record.update(ours_ms=ours, peer_ms=peer, ratio=result.ratio, rounds=len(result.ours_ms),
                      ours_tflops=case.flops / (ours * 1e-3) / 1e12, peer_tflops=case.flops / (peer * 1e-3) / 1e12,
                      ours_ms_all=result.ours_ms, peer_ms_all=result.peer_ms, checks=result.checks)

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
