#!/usr/bin/env python3
"""FlashDSA benchmark suite: one command for ceilings, kernels, the DSA layer and the baselines.

    python bench/run.py                          # GPU if present: the full report in < 10 minutes on an H200
    python bench/run.py --device cpu --quick     # the same code paths at tiny sizes (CI smoke test)
    python bench/run.py --only kernels --seq-lens 4096 16384
    python bench/run.py --only peers             # FlashDSA vs the public peers, A/B (bench/peers)
    python bench/run.py --only peers --peer-kernels indexer_topk --indexer-selection fp8   # ours: FP8 selection

Writes results.json, report.md and three PNG plots to --out (default bench/results/<date>);
prints one progress line per case. See docs/benchmarks.md for how to read the report.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.cases import build_cases  # noqa: E402
from bench.config import DEFAULT_SECTIONS, INDEXER_SELECTIONS, SECTIONS, BenchConfig, make_config  # noqa: E402
from bench.inputs import INDEX_ORDERS  # noqa: E402
from bench.plots import write_plots  # noqa: E402
from bench.report import fmt_t, write_outputs  # noqa: E402
from bench.runner import Runner  # noqa: E402
from bench.summary import summarize  # noqa: E402
from bench.timing import CPU_POLICY, GPU_POLICY, RepPolicy  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when available, else cpu (tiny sizes)")
    p.add_argument("--quick", action="store_true", help="fewer sequence lengths (GPU: 4K, 16K; CPU: 64, 128)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/results/<date>)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="time budget (default 540 on cuda, 300 on cpu): cases predicted to overrun it are "
                        "skipped, largest T first, and reported as skipped")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=None,
                   help=f"sections to run (default: {' '.join(DEFAULT_SECTIONS)}; the machine ceilings always "
                        "run: every ratio needs them)")
    p.add_argument("--peers", action="store_true",
                   help="also run the public peers A/B against FlashDSA (bench/peers; same as adding 'peers' "
                        "to --only)")
    p.add_argument("--peer-kernels", nargs="+", choices=("sparse_mla_fwd", "sparse_mla_bwd", "indexer_topk"),
                   default=None, help="the kernels the peers section measures (default: all three)")
    p.add_argument("--peer-keys", nargs="+", default=None,
                   choices=("flashmla", "cudnn", "tilelang", "tilelang_fp8_example"),
                   help="only these peers (default: all; tilelang_fp8_example = TileLang's example FP8 indexer "
                        "+ top-k)")
    p.add_argument("--peers-max-seconds", type=float, default=None,
                   help="time budget of the peers section (default: --max-seconds' default)")
    p.add_argument("--seq-lens", nargs="+", type=int, default=None, help="override the sequence lengths T")
    p.add_argument("--index-order", choices=INDEX_ORDERS, default="ascending",
                   help="order of each row's sparse-attention indices: ascending key index (default) or "
                        "shuffled, the order a top-k selection returns them in (bench/inputs.py)")
    p.add_argument("--indexer-selection", choices=INDEXER_SELECTIONS, default="bf16",
                   help="selection pass of FlashDSA's indexer_topk in the peers A/B: bf16 (exact, default), "
                        "fp8 (flashdsa.indexer_topk(..., selection='fp8'), the per-row e4m3 quantization "
                        "included in the timed call), fp8-band (fp8_band=K/4, indices only) or fp8-fast "
                        "(fp8_band=K/8, fp8_candidates=K+K/8, indices only) or fp8-scaled (fp8-fast with the band "
                        "scaled to each row's keys)")
    return p.parse_args(argv)


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    return torch.device("cuda", torch.cuda.current_device()) if choice == "cuda" else torch.device("cpu")


def import_flashdsa(on_cuda: bool) -> Tuple[Optional[ModuleType], Optional[str], str]:
    """(module, import error, description). Range checks are turned off on CUDA: they synchronize."""
    try:
        import flashdsa
    except Exception as error:  # noqa: BLE001 - the baselines and ceilings still run without it
        return None, f"{type(error).__name__}: {error}", "not importable"
    description = "imported"
    if on_cuda:
        flashdsa.set_range_checks(False)
        kernels = "all ops" if flashdsa.built_with_cuda() else "none (built without CUDA)"
        description = f"CUDA kernels: {kernels}; host range checks off"
    return flashdsa, None, description


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _gpu_clocks() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit", "--format=csv,noheader",
                 "-i", str(torch.cuda.current_device())]
        return subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_meta(cfg: BenchConfig, fd_description: str, policy: RepPolicy) -> dict:
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (uncommitted changes)"
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "torch": torch.__version__, "cuda": torch.version.cuda or "none",
        "index_order": cfg.index_order,
        "indexer_selection": cfg.indexer_selection,
        "flashdsa": fd_description, "mode": f"{cfg.device.type}{' (quick)' if cfg.quick else ''}",
        "python": platform.python_version(),
    }
    if cfg.on_cuda:
        props = torch.cuda.get_device_properties(cfg.device)
        meta.update(device_name=f"{props.name} ({props.multi_processor_count} SMs, "
                                f"{props.total_memory / 2**30:.0f} GiB, L2 {props.L2_cache_size / 2**20:.0f} MiB)",
                    clocks=_gpu_clocks(), timing=f"CUDA events around each call; {policy.describe()}")
    else:
        meta.update(device_name=f"CPU ({platform.processor() or platform.machine()}, "
                                f"threads: {torch.get_num_threads()})",
                    clocks="", timing=f"time.perf_counter around each call; {policy.describe()}")
    return meta


def run_peers_section(args: argparse.Namespace, cfg: BenchConfig, fd: Optional[ModuleType], policy: RepPolicy) -> dict:
    """The public peers A/B (bench/peers) on the standard plan; T = --seq-lens, else 4K ... 128K on CUDA."""
    from bench.peers import KERNELS, PEER_SEQ_LENS, make_plan, run_peers
    seq_lens = args.seq_lens or (PEER_SEQ_LENS if cfg.on_cuda and not cfg.quick else cfg.seq_lens)
    budget = args.peers_max_seconds or cfg.max_seconds
    print(f"peers: T = {', '.join(fmt_t(t) for t in seq_lens)}; budget {budget:.0f} s", flush=True)
    ops = torch.ops.flashdsa if fd is not None else None
    plan = make_plan(cfg, seq_lens, kernels=args.peer_kernels or KERNELS)
    return run_peers(cfg, ops, policy, sys.stdout, max_seconds=budget, plan=plan, keys=args.peer_keys)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    sections = list(args.only or DEFAULT_SECTIONS) + (["peers"] if args.peers else [])
    seq_lens = args.seq_lens
    if seq_lens is None and sections == ["peers"] and device.type == "cuda" and not args.quick:
        from bench.peers import PEER_SEQ_LENS
        seq_lens = PEER_SEQ_LENS  # the peers' standard T (4K ... 128K)
    cfg = make_config(device, quick=args.quick, seq_lens=seq_lens, max_seconds=args.max_seconds,
                      sections=sections, index_order=args.index_order,
                      indexer_selection=args.indexer_selection)
    out_dir = args.out or REPO / "bench" / "results" / _dt.date.today().isoformat()
    torch.manual_seed(0)
    fd, fd_error, fd_description = import_flashdsa(cfg.on_cuda)
    policy = GPU_POLICY if cfg.on_cuda else CPU_POLICY
    meta = run_meta(cfg, fd_description, policy)
    print(f"flashdsa bench: {meta['device_name']}; commit {meta['commit']}; flashdsa {fd_description}", flush=True)
    print(f"T = {', '.join(fmt_t(t) for t in cfg.seq_lens)}; sections: {', '.join(cfg.sections)}; "
          f"budget {cfg.max_seconds:.0f} s; output {out_dir}", flush=True)

    start = time.perf_counter()
    runner = Runner(cfg, fd, fd_error, policy, sys.stdout)
    records = runner.run_all(build_cases(cfg, fd))
    peers = run_peers_section(args, cfg, fd, policy) if "peers" in cfg.sections else None
    meta["wall_s"] = time.perf_counter() - start

    summary = summarize(cfg, records)
    if peers is not None:
        summary["peers"] = peers
    paths = write_outputs(out_dir, cfg, meta, records, summary)
    paths.update(write_plots(out_dir, cfg, records, summary))
    skipped = sum(r["status"] != "ok" for r in records)
    print(f"done in {meta['wall_s']:.0f} s: {len(records) - skipped} cases measured, {skipped} not "
          f"(see report.md 'Not measured')", flush=True)
    for path in paths.values():
        print(f"  {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
