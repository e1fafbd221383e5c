"""Optional public peers in the benchmark suite, measured A/B against FlashDSA (issues 19, 20, 21).

    python bench/run.py --only peers              # the peers alone (standard plan on the GPU)
    python bench/run.py --peers                   # the default sections, then the peers

Peers (each present only when its package imports or its build is found; see registry.py):
FlashMLA's SM90 sparse prefill forward, cuDNN frontend's DSA backward and indexer (+ top-k),
the TileLang DSA kernels megatron-core ships, and TileLang's own example FP8 lightning indexer + top-k
(examples/deepseek_v32 of tile-ai/tilelang, key tilelang_fp8_example). scripts/peers_stage.sh /
scripts/peers_gpu.sh bring them to a GPU machine without network; docs/benchmarks.md ("Peers") says how.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, TextIO

from ..config import BenchConfig
from ..timing import RepPolicy
from .ab import ABPrepared, ABResult, ABTimer, Side, rel_err, topk_recall
from .cases import INDEXER, KERNELS, PATHS, PEER_SEQ_LENS, PeerCase, PeerPath, PeerPlan, build_peer_cases, make_plan
from .registry import PeerStatus, discover
from .report import peers_table, render_peers_section
from .runner import PeerRunner

__all__ = ["ABPrepared", "ABResult", "ABTimer", "KERNELS", "PATHS", "PEER_SEQ_LENS", "PeerCase", "PeerPath",
           "PeerPlan", "PeerRunner", "PeerStatus", "Side", "build_peer_cases", "discover", "make_plan",
           "peers_table", "rel_err", "render_peers_section", "run_peers", "topk_recall"]


def run_peers(cfg: BenchConfig, ops: Any, policy: RepPolicy, out: TextIO, *, max_seconds: float,
              plan: Optional[PeerPlan] = None, peers: Optional[Dict[str, PeerStatus]] = None,
              paths: Sequence[PeerPath] = PATHS, keys: Optional[Sequence[str]] = None) -> dict:
    """Probes the peers (unless given), runs every A/B case of the plan, returns summary['peers'].

    ops: FlashDSA's raw ops (torch.ops.flashdsa); plan: default make_plan(cfg); peers: default
    discover(device=cfg.device). Returns {"status": [peer status dicts], "rows": [one record per case],
    "indexer_selection": our indexer_topk's selection pass ("bf16" or "fp8", cfg.indexer_selection)}.
    keys: only these peers (registry keys, bench/run.py --peer-keys): the others are neither probed nor run.
    """
    if keys:
        paths = [p for p in paths if p.peer_key in keys]
        if peers is not None:
            peers = {k: v for k, v in peers.items() if k in keys}
    peers = discover(list(keys) if keys else None, device=cfg.device) if peers is None else peers
    for status in peers.values():
        state = f"present: {status.detail}" if status.present else f"absent: {status.detail}"
        print(f"peer {status.key:<9} {state}", file=out, flush=True)
    plan = plan or make_plan(cfg)
    if INDEXER in plan.kernels:
        print(f"ours: indexer_topk selection={cfg.indexer_selection}", file=out, flush=True)
    cases = build_peer_cases(cfg, plan, peers, ops, paths)
    runner = PeerRunner(cfg.device, policy, peers, out, max_seconds)
    rows = runner.run_all(cases)
    return {"status": [s.as_dict() for s in peers.values()], "rows": rows, "indexer_selection": cfg.indexer_selection}
