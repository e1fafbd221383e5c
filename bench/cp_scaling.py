#!/usr/bin/env python3
"""Context parallelism (CP) of the FlashDSA layer over several processes: correctness and scaling.

    torchrun --nproc-per-node 4 bench/cp_scaling.py --check              # cp = 4 against cp = 1
    torchrun --nproc-per-node 4 bench/cp_scaling.py --scale --out cp.json # cp = 1, 2, 4 at 128K, 256K
    python bench/cp_scaling.py --nproc 2 --check                         # self-spawned processes
    python bench/cp_scaling.py --nproc 2 --scale --tokens 2048           # CPU smoke run (gloo)

One process per GPU with NCCL when there are at least as many GPUs (with FlashDSA's CUDA kernels) as
processes on the node, otherwise gloo on the CPU. NVLink multicast stays off (_NO_MULTICAST_ENV).

--check: every rank runs ``flashdsa.dsa_attention`` (indexer top-k, sparse MLA, sparse KL loss) with
``cp_group = WORLD`` on its zigzag share of one packed batch of odd-length sequences, then the
backward of ``Σ out · probe`` (which also carries the loss). Rank 0 gathers the results and compares
them with a cp = 1 run of the whole batch: output, top-k (as sets of real rows), indexer loss,
gradients of q, kv, q_idx, k_idx, weights, and zero padding rows. Prints a PASS/FAIL table; the exit
status is 1 on failure.

--scale: for each T_total and each cp (ranks 0..cp-1 of the world; cp = 1 runs without a group, the
other ranks wait), the layer's forward + backward time on every rank (median of --reps after
--warmup; CUDA events on the GPU, perf_counter on the CPU) and the time spent in collectives:
"in layer" brackets every collective the layer issues with events (it includes waiting for slower
ranks), "alone" replays the same collectives on tensors of the same sizes without the layer. Prints
a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

# NVLink SHARP / multicast must stay off on the lent multi-GPU machines. Set before torch is imported
# and before any process group exists; spawned children inherit the environment (and re-run this
# line when they import the script).
_NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(_NO_MULTICAST_ENV)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flashdsa  # noqa: E402
from flashdsa.context_parallel import ZigzagLayout  # noqa: E402
from bench.config import CPU_DSA, GLM5_DSA, DsaShape  # noqa: E402
from bench.timing import Clock  # noqa: E402

ROW_TENSORS = ("q", "kv", "q_idx", "k_idx", "weights")  # the layer's inputs, one row per token
# Defaults per device kind: GPU = PERF.md's standard shape and sizes; CPU = seconds-long smoke runs.
CHECK_LENGTHS = {"cuda": (6143, 1, 2049, 777, 4097, 3001), "cpu": (37, 101, 1, 150, 67, 255)}
SCALE_TOKENS = {"cuda": (131072, 262144), "cpu": (2048,)}
REPS = {"cuda": (2, 5), "cpu": (1, 3)}  # (warm-up calls, timed repetitions)
DTYPES = {"cuda": torch.bfloat16, "cpu": torch.float32}
# Relative error (in norm) allowed between cp = N and cp = 1: fp32 sums in another order; bf16 adds
# roundings of partial gradients before the fp32 reduce-scatter (the tolerance of tests/python/test_cp.py).
TOLERANCES = {torch.bfloat16: 2e-2, torch.float32: 1e-5}
INDEXER_SHIFT = 1.0  # added to q_idx, k_idx: ReLU rarely clips, so no score ties and cp = N picks cp = 1's top-k


# ------------------------------------------------------------------------------------------------
# Launch: torchrun or self-spawned processes; one process group per run.


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="cp = world size against cp = 1 (PASS/FAIL table)")
    mode.add_argument("--scale", action="store_true", help="forward + backward time and communication share")
    p.add_argument("--nproc", type=int, default=1,
                   help="processes to spawn when not launched by torchrun (default 1)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: CUDA + NCCL if every local rank has its own GPU with FlashDSA's CUDA kernels")
    p.add_argument("--lengths", type=int, nargs="+",
                   help=f"--check: sequence lengths (default GPU {CHECK_LENGTHS['cuda']}, CPU {CHECK_LENGTHS['cpu']})")
    p.add_argument("--tokens", type=int, nargs="+",
                   help=f"--scale: T_total values (default GPU {SCALE_TOKENS['cuda']}, CPU {SCALE_TOKENS['cpu']})")
    p.add_argument("--num-seqs", type=int, default=1, help="--scale: equal sequences packed in T_total (default 1)")
    p.add_argument("--cp", type=int, nargs="+", help="--scale: cp sizes (default 1, 2, 4, ... up to the world size)")
    p.add_argument("--warmup", type=int, help="--scale: warm-up calls (default GPU 2, CPU 1)")
    p.add_argument("--reps", type=int, help="--scale: timed repetitions (default GPU 5, CPU 3)")
    p.add_argument("--loss-coeff", type=float, default=0.5, help="indexer KL loss coefficient (default 0.5)")
    p.add_argument("--tol", type=float, help="--check: relative error allowed (default bf16 2e-2, fp32 1e-5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here (rank 0)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds before a collective or the spawned processes are given up (default 1800)")
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error("--nproc must be >= 1")
    if args.num_seqs < 1:
        p.error("--num-seqs must be >= 1")
    if args.reps is not None and args.reps < 1 or args.warmup is not None and args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return args


@dataclass(frozen=True)
class Place:
    """Where one rank runs."""

    rank: int
    local_rank: int
    world: int
    local_world: int  # processes on this node: each needs its own GPU for NCCL


def _launched_by_torchrun() -> bool:
    """Whether torchrun (torch.distributed.run) started this process: it sets the rendezvous variables."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for the self-spawned ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawned_rank(local_rank: int, args: argparse.Namespace, nproc: int) -> None:
    """Entry point of a self-spawned process: torchrun's environment, then the rank's work."""
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc))
    status = run_rank(args, Place(local_rank, local_rank, nproc, nproc))
    if status:
        raise SystemExit(status)


def spawn(args: argparse.Namespace) -> int:
    """Runs --nproc ranks on this machine; 0 if all of them exit cleanly."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if args.nproc == 1:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        return run_rank(args, Place(0, 0, 1, 1))
    ctx = mp.start_processes(_spawned_rank, args=(args, args.nproc), nprocs=args.nproc, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for proc in ctx.processes:  # only the processes started above
                    proc.kill()
                    proc.join(timeout=10)
                print(f"error: the {args.nproc} processes did not finish within {args.timeout:g} s", file=sys.stderr)
                return 1
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as error:  # a failed check (exit status) or a raise
        print(f"error: a rank failed ({error}); see its output above", file=sys.stderr)
        return 1
    return 0


def pick_device(choice: str, place: Place) -> torch.device:
    """This rank's device: its own GPU (cuda:local_rank) or the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    kernels = flashdsa.built_with_cuda()
    usable = gpus >= place.local_world and kernels
    if choice == "cuda" and not usable:
        why = ("flashdsa was built without CUDA" if not kernels
               else f"{gpus} GPUs for {place.local_world} processes")
        raise SystemExit(f"--device cuda: cannot give every rank its own GPU ({why})")
    if choice == "cpu" or not usable:
        return torch.device("cpu")
    return torch.device("cuda", place.local_rank)


def run_rank(args: argparse.Namespace, place: Place) -> int:
    """One rank: process group, the chosen mode, teardown. Returns the exit status (the same on every rank)."""
    device = pick_device(args.device, place)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Share the cores between the ranks of this node: torch's pool and FlashDSA's CPU backend pool
        # (sized from FLASHDSA_NUM_THREADS when it first runs; a value set by the user is kept).
        threads = max(1, (os.cpu_count() or 1) // place.local_world)
        torch.set_num_threads(threads)
        os.environ.setdefault("FLASHDSA_NUM_THREADS", str(threads))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method="env://", rank=place.rank, world_size=place.world,
                            timeout=_dt.timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    try:
        meta = run_meta(device, backend, place.world)
        if place.rank == 0:
            env = " ".join(f"{k}={v}" for k, v in _NO_MULTICAST_ENV.items())
            print(f"# {meta['mode']} on {meta['device_name']}; {place.world} ranks, {backend}, "
                  f"{meta['dtype']}; commit {meta['commit']}; {env}", flush=True)
        run = run_check if args.check else run_scale
        return run(args, device, meta)
    finally:
        dist.destroy_process_group()


def _git(*git_args: str) -> str:
    """Output of a read-only git command in the repository, or "" if git is unavailable."""
    try:
        return subprocess.run(["git", *git_args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_meta(device: torch.device, backend: str, world: int) -> dict:
    """Date, commit, machine and run settings, recorded in the JSON."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (uncommitted changes)"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_name = f"{torch.cuda.device_count()}x {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    shape = layer_shape(device)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "torch": torch.__version__, "device_name": device_name,
        "mode": device.type, "backend": backend, "world_size": world,
        "dtype": str(DTYPES[device.type]).replace("torch.", ""),
        "shape": {"H": shape.heads, "D_qk": shape.d_qk, "D_v": shape.d_v, "K": shape.topk,
                  "H_I": shape.index_heads, "D_I": shape.index_dim},
        "env": dict(_NO_MULTICAST_ENV),
    }


def layer_shape(device: torch.device) -> DsaShape:
    """PERF.md's standard shape on the GPU; narrow heads on the CPU (bench/config.py)."""
    return GLM5_DSA if device.type == "cuda" else CPU_DSA


# ------------------------------------------------------------------------------------------------
# The layer and its inputs.


def random_inputs(shape: DsaShape, rows: int, dtype: torch.dtype, device: torch.device,
                  seed: int) -> Dict[str, torch.Tensor]:
    """Fresh random inputs of one full DSA layer for ``rows`` tokens, plus the output probe.

    Drawn on ``device`` from ``seed`` (the same values on every rank with the same seed):
    q [rows, H, D_qk], kv [rows, D_qk], q_idx [rows, H_I, D_I], k_idx [rows, D_I] (activation dtype),
    weights [rows, H_I] fp32 (scaled as the model folds H_I^-1/2 D_I^-1/2 in), probe [rows, H, D_v]
    (the upstream gradient of the output).
    """
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*dims: int, scale: float = 1.0, shift: float = 0.0, to: torch.dtype = dtype) -> torch.Tensor:
        values = torch.randn(dims, generator=gen, device=device, dtype=to)
        return values.mul_(scale).add_(shift)  # in place: at 256K tokens q alone is 19 GB

    return {
        "q": randn(rows, shape.heads, shape.d_qk),
        "kv": randn(rows, shape.d_qk),
        "q_idx": randn(rows, shape.index_heads, shape.index_dim, shift=INDEXER_SHIFT),
        "k_idx": randn(rows, shape.index_dim, shift=INDEXER_SHIFT),
        "weights": randn(rows, shape.index_heads, scale=(shape.index_heads * shape.index_dim) ** -0.5,
                         to=torch.float32),
        "probe": randn(rows, shape.heads, shape.d_v),
    }


def as_leaves(inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Detached copies; the layer's inputs require grad (the probe does not)."""
    return {k: v.detach().clone().requires_grad_(k in ROW_TENSORS) for k, v in inputs.items()}


def layer_forward(inputs: Dict[str, torch.Tensor], cu_seqlens: torch.Tensor, shape: DsaShape, loss_coeff: float,
                  group: Optional[dist.ProcessGroup]) -> flashdsa.DSAAttentionOutput:
    """One full DSA layer: indexer top-k, sparse MLA, sparse KL loss attached to the output."""
    return flashdsa.dsa_attention(
        inputs["q"], inputs["kv"], inputs["q_idx"], inputs["k_idx"], inputs["weights"], cu_seqlens,
        shape.topk, shape.scale, loss_coeff=loss_coeff, loss_formulation="sparse", cp_group=group)


def layer_results(inputs: Dict[str, torch.Tensor], cu_seqlens: torch.Tensor, shape: DsaShape, loss_coeff: float,
                  group: Optional[dist.ProcessGroup]) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Forward + backward of ``Σ out · probe``; returns ({out, indices, dq, dkv, ...}, global loss)."""
    result = layer_forward(inputs, cu_seqlens, shape, loss_coeff, group)
    result.out.backward(inputs["probe"])
    tensors = {"out": result.out.detach(), "indices": result.indices}
    for name in ROW_TENSORS:
        grad = inputs[name].grad
        if grad is None:
            raise RuntimeError(f"the layer's backward gave no gradient to {name}")
        tensors[f"d{name}"] = grad
    return tensors, result.indexer_loss


# ------------------------------------------------------------------------------------------------
# --check: cp = world size against cp = 1.


@dataclass
class CheckRow:
    """One line of the PASS/FAIL table."""

    quantity: str
    shape: str
    error: Union[float, int]  # relative error in norm, or a count (indices, padding)
    detail: str
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> Tuple[float, float]:
    """(‖a − e‖ / ‖e‖, max|a − e| / max|e|), in float64 on the tensors' device; inf if the shapes differ."""
    if actual.shape != expected.shape:
        return float("inf"), float("inf")
    a, e = actual.detach().double(), expected.detach().double()
    diff = (a - e).reshape(-1)
    e = e.reshape(-1)
    norm, peak = e.norm().item(), e.abs().max().item()
    return diff.norm().item() / (norm or 1.0), diff.abs().max().item() / (peak or 1.0)


def gather_rows(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenation in rank order of every rank's ``local [N, ...]`` (same N everywhere)."""
    local = local.detach().contiguous()
    out = local.new_empty((dist.get_world_size(group) * local.shape[0],) + local.shape[1:])
    dist.all_gather_into_tensor(out, local, group=group)
    return out


def padding_leaks(tensors: Dict[str, torch.Tensor], layout: ZigzagLayout) -> Tuple[float, int]:
    """On this rank's padding rows: max |value| of outputs/gradients, and how many top-k slots are used.

    Padding rows must stay empty: zero output and gradients, no selected key.
    """
    is_padding = layout.padded_to_real_rows(layout.local_rows) < 0
    if not bool(is_padding.any()):
        return 0.0, 0
    largest = max(float(t[is_padding].abs().max()) for k, t in tensors.items() if k != "indices")
    selected = int((tensors["indices"][is_padding] >= 0).sum())
    return largest, selected


def run_check(args: argparse.Namespace, device: torch.device, meta: dict) -> int:
    """Runs the layer at cp = world size and, on rank 0, at cp = 1; compares. Returns the exit status."""
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    shape, dtype = layer_shape(device), DTYPES[device.type]
    tol = args.tol if args.tol is not None else TOLERANCES[dtype]
    lengths = tuple(args.lengths or CHECK_LENGTHS[device.type])
    cu_seqlens = flashdsa.cu_seqlens_from_lengths(lengths)  # int32 CPU [B+1]: no synchronization per call
    batch = random_inputs(shape, sum(lengths), dtype, device, args.seed)  # global, identical on every rank

    layout = ZigzagLayout.for_group(cu_seqlens, group, device)
    local = as_leaves({k: layout.split(v) for k, v in batch.items()})
    mine, loss = layer_results(local, cu_seqlens, shape, args.loss_coeff, group)
    pad_value, pad_selected = padding_leaks(mine, layout)
    mine["indices"] = layout.padded_to_real_rows(mine["indices"])  # comparable with cp = 1's rows
    merged = {k: layout.merge(gather_rows(v, group)) for k, v in mine.items()}
    losses = gather_rows(loss.reshape(1), group)
    pad = torch.tensor([pad_value, float(pad_selected)], dtype=torch.float64, device=device)
    dist.all_reduce(pad, op=dist.ReduceOp.MAX, group=group)
    del local, mine

    status = torch.zeros(1, dtype=torch.int32, device=device)
    if rank == 0:
        expected, expected_loss = layer_results(as_leaves(batch), cu_seqlens, shape, args.loss_coeff, None)
        rows = compare(merged, losses, expected, expected_loss, float(pad[0]), int(pad[1]), tol)
        print(f"\ncp = {world} vs cp = 1: {len(lengths)} sequences {lengths}, T = {sum(lengths)} "
              f"(padded {layout.num_padded_tokens}), {meta['dtype']}, tolerance {tol:.0e}")
        print(format_check_table(rows))
        status[0] = 0 if all(r.passed for r in rows) else 1
        print(f"\n{'PASS' if status[0] == 0 else 'FAIL'}: cp = {world} "
              f"{'equals' if status[0] == 0 else 'differs from'} cp = 1", flush=True)
        if args.out:
            write_json(args.out, {"meta": meta, "check": {
                "cp": world, "lengths": list(lengths), "tolerance": tol, "passed": bool(status[0] == 0),
                "rows": [dict(vars(r), passed=r.passed) for r in rows]}})
    dist.broadcast(status, src=0, group=group)
    return int(status[0])


def compare(merged: Dict[str, torch.Tensor], losses: torch.Tensor, expected: Dict[str, torch.Tensor],
            expected_loss: torch.Tensor, pad_value: float, pad_selected: int, tol: float) -> List[CheckRow]:
    """The table's rows: every tensor, the indices as sets, the loss on every rank, the padding rows."""
    rows = []
    for name, value in expected.items():
        if name == "indices":
            continue
        rel, peak = relative_error(merged[name], value)
        rows.append(CheckRow(name, str(list(value.shape)), rel, f"max|diff|/max|ref| {peak:.2e}", tol))
    got_sets = merged["indices"].sort(dim=1).values
    want_sets = expected["indices"].long().sort(dim=1).values
    differ = int((got_sets != want_sets).any(dim=1).sum())
    rows.append(CheckRow("indices", str(list(want_sets.shape)), differ,
                         f"rows whose top-k set differs, of {want_sets.shape[0]}", 0))
    loss_errors = [relative_error(l, expected_loss)[0] for l in losses]
    rows.append(CheckRow("indexer loss", "every rank", max(loss_errors),
                         f"cp=1 {float(expected_loss):.6g}, ranks {', '.join(f'{float(l):.6g}' for l in losses)}", tol))
    rows.append(CheckRow("padding rows", "all ranks", pad_value + pad_selected,
                         f"max|out, grads| {pad_value:g}, top-k slots used {pad_selected}", 0))
    return rows


def format_check_table(rows: List[CheckRow]) -> str:
    """The PASS/FAIL table, one line per row."""
    lines = [f"{'quantity':<13} {'shape':<18} {'error':>9} {'tolerance':>9}  result  detail"]
    for r in rows:
        error = f"{r.error:.2e}" if isinstance(r.error, float) else str(r.error)
        lines.append(f"{r.quantity:<13} {r.shape:<18} {error:>9} {r.tolerance:>9.0e}  "
                     f"{'PASS' if r.passed else 'FAIL':<6}  {r.detail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Timing: collective recording (the clock is bench/timing.py's).


@dataclass
class Collective:
    """One recorded collective: which one, its tensor arguments' (shape, dtype, device), its marks."""

    op: str
    tensors: List[Tuple[torch.Size, torch.dtype, torch.device]]
    start: object
    end: object


class CollectiveRecorder:
    """While active, brackets the collectives flashdsa.context_parallel issues with clock marks.

    ``torch.distributed``'s functions are replaced by timed wrappers (flashdsa calls them through the
    module, so the wrappers see every call) and restored on exit. On the GPU the marks are events on
    the current stream, so an interval is the collective's duration on the stream, including any wait
    for slower ranks.
    """

    OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: List[Collective] = []
        self._originals: Dict[str, Callable] = {}

    def __enter__(self) -> "CollectiveRecorder":
        for op in self.OPS:
            self._originals[op] = getattr(dist, op)
            setattr(dist, op, self._timed(op, self._originals[op]))
        return self

    def __exit__(self, *exc) -> None:
        for op, original in self._originals.items():
            setattr(dist, op, original)
        self._originals.clear()

    def _timed(self, op: str, original: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = self.clock.mark()
            result = original(*args, **kwargs)
            tensors = [(a.shape, a.dtype, a.device) for a in args if isinstance(a, torch.Tensor)]
            self.calls.append(Collective(op, tensors, start, self.clock.mark()))
            return result
        return timed

    def take_ms(self) -> Dict[str, float]:
        """Milliseconds per op of the calls recorded so far (after a sync); clears the record."""
        totals = {op: 0.0 for op in self.OPS}
        for call in self.calls:
            totals[call.op] += self.clock.ms(call.start, call.end)
        self.calls = []
        return totals


def replay_ms(calls: List[Collective], group: dist.ProcessGroup, clock: Clock, reps: int) -> float:
    """Median time of the same collectives on fresh tensors of the same sizes, without the layer.

    Each repetition starts after a barrier, so it measures the transfers rather than rank skew.
    """
    tensors = [[torch.ones(shape, dtype=dtype, device=device) for shape, dtype, device in call.tensors]
               for call in calls]
    samples = []
    for _ in range(reps + 1):  # the first one warms up
        dist.barrier(group=group)
        clock.sync()
        marks = []
        for call, args in zip(calls, tensors):
            start = clock.mark()
            getattr(dist, call.op)(*args, group=group)
            marks.append((start, clock.mark()))
        clock.sync()
        samples.append(sum(clock.ms(s, e) for s, e in marks))
    return statistics.median(samples[1:])


# ------------------------------------------------------------------------------------------------
# --scale: forward + backward time per rank and communication share.


@dataclass
class RankTiming:
    """Medians over the timed repetitions on one rank."""

    rank: int
    local_tokens: int
    fwd_ms: float
    bwd_ms: float
    total_ms: float
    comm_ms: float  # collectives inside the layer (fwd + bwd)
    comm_by_op_ms: Dict[str, float]
    comm_alone_ms: float  # the same collectives replayed alone
    peak_gib: Optional[float]  # peak GPU memory, inputs included (None on the CPU)
    samples_ms: List[float] = field(default_factory=list)  # fwd + bwd of every timed repetition


def rep_counts(args: argparse.Namespace, device: torch.device) -> Tuple[int, int]:
    """(warm-up calls, timed repetitions): the options, or the device's defaults."""
    default_warmup, default_reps = REPS[device.type]
    return (default_warmup if args.warmup is None else args.warmup,
            default_reps if args.reps is None else args.reps)


def equal_sequences(total: int, count: int) -> torch.Tensor:
    """cu_seqlens (int32 CPU) of ``count`` sequences of about total / count tokens."""
    lengths = [total // count] * count
    lengths[-1] += total - sum(lengths)
    return flashdsa.cu_seqlens_from_lengths(lengths)


def time_layer(args: argparse.Namespace, device: torch.device, total: int, cp: int,
               group: Optional[dist.ProcessGroup], rank: int) -> RankTiming:
    """Times this rank's share of the layer at T_total = ``total`` under ``cp`` (group None: cp = 1)."""
    shape, dtype = layer_shape(device), DTYPES[device.type]
    warmup, reps = rep_counts(args, device)
    cu_seqlens = equal_sequences(total, args.num_seqs)
    # cp = 1 is the plain layer (no padding); under CP every rank holds T_pad / cp rows.
    rows = total if group is None else ZigzagLayout(cu_seqlens, cp, rank).num_local_tokens
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the previous case's blocks: the peak below is this case's alone
        torch.cuda.reset_peak_memory_stats(device)
    # Timing needs no cp = 1 twin: every rank draws its own share directly (memory scales as 1 / cp).
    inputs = as_leaves(random_inputs(shape, rows, dtype, device, args.seed + 1000 * cp + rank))
    clock = Clock(device)
    fwd, bwd, comm = [], [], []
    with CollectiveRecorder(clock) as recorder:
        for _ in range(warmup + reps):
            for name in ROW_TENSORS:
                inputs[name].grad = None
            if group is not None:
                dist.barrier(group=group)  # every repetition starts together
            clock.sync()
            start = clock.mark()
            result = layer_forward(inputs, cu_seqlens, shape, args.loss_coeff, group)
            middle = clock.mark()
            result.out.backward(inputs["probe"])
            end = clock.mark()
            clock.sync()
            fwd.append(clock.ms(start, middle))
            bwd.append(clock.ms(middle, end))
            last_calls = recorder.calls  # the replay below uses the last repetition's; take_ms starts a new list
            comm.append(recorder.take_ms())
            del result
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    timed = slice(warmup, None)
    totals = [f + b for f, b in zip(fwd[timed], bwd[timed])]
    by_op = {op: statistics.median(c[op] for c in comm[timed]) for op in CollectiveRecorder.OPS}
    comm_alone = replay_ms(last_calls, group, clock, reps) if group is not None else 0.0
    return RankTiming(rank=rank, local_tokens=rows, fwd_ms=statistics.median(fwd[timed]),
                      bwd_ms=statistics.median(bwd[timed]), total_ms=statistics.median(totals),
                      comm_ms=statistics.median(sum(c.values()) for c in comm[timed]), comm_by_op_ms=by_op,
                      comm_alone_ms=comm_alone, peak_gib=peak, samples_ms=totals)


def default_cp_sizes(world: int) -> List[int]:
    """1, 2, 4, ... up to the world size."""
    sizes, cp = [], 1
    while cp <= world:
        sizes.append(cp)
        cp *= 2
    return sizes


def run_scale(args: argparse.Namespace, device: torch.device, meta: dict) -> int:
    """Times every (T_total, cp); rank 0 prints the tables and writes the JSON. Returns 0."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cp_sizes = sorted(set(args.cp)) if args.cp else default_cp_sizes(world)
    if not all(1 <= cp <= world for cp in cp_sizes):
        raise SystemExit(f"--cp sizes must be in [1, {world}] (the world size), got {cp_sizes}")
    tokens = list(args.tokens or SCALE_TOKENS[device.type])
    if device.type == "cuda":
        flashdsa.set_range_checks(False)  # the layer builds its own ranges; the host check synchronizes
    # Every rank creates every group, in the same order (torch.distributed's rule); cp uses ranks 0..cp-1.
    groups = {cp: dist.new_group(list(range(cp))) for cp in cp_sizes if cp > 1}
    entries = []
    for total in tokens:
        for cp in cp_sizes:
            timing = time_layer(args, device, total, cp, groups.get(cp), rank) if rank < cp else None
            every: List[Optional[dict]] = [None] * world
            dist.all_gather_object(every, None if timing is None else vars(timing))
            if rank == 0:
                entries.append(summarize(total, cp, [t for t in every if t is not None]))
                print(f"  T_total={total} cp={cp}: fwd+bwd {entries[-1]['step_ms']:.1f} ms (slowest rank)", flush=True)
    if rank == 0:
        add_speedups(entries)
        print(format_scale_table(entries, meta))
        if args.out:
            warmup, reps = rep_counts(args, device)
            write_json(args.out, {"meta": dict(meta, num_seqs=args.num_seqs, loss_coeff=args.loss_coeff, warmup=warmup,
                                               reps=reps, timing=TIMING_METHOD[device.type]),
                                  "scale": entries})
    return 0


TIMING_METHOD = {
    "cuda": "CUDA events on the current stream; median of the timed repetitions after warm-up",
    "cpu": "time.perf_counter; median of the timed repetitions after warm-up",
}


def summarize(total: int, cp: int, ranks: List[dict]) -> dict:
    """One (T_total, cp) entry: the slowest rank's times (the step waits for it) and mean comm shares."""
    slowest = max(ranks, key=lambda t: t["total_ms"])
    return {
        "T_total": total, "cp": cp, "local_tokens": slowest["local_tokens"],
        "fwd_ms": slowest["fwd_ms"], "bwd_ms": slowest["bwd_ms"], "step_ms": slowest["total_ms"],
        "fastest_ms": min(t["total_ms"] for t in ranks),
        "comm_ms": statistics.mean(t["comm_ms"] for t in ranks),
        "comm_share": statistics.mean(t["comm_ms"] / t["total_ms"] for t in ranks),
        "comm_alone_ms": statistics.mean(t["comm_alone_ms"] for t in ranks),
        "comm_alone_share": statistics.mean(t["comm_alone_ms"] / t["total_ms"] for t in ranks),
        "peak_gib": max(t["peak_gib"] for t in ranks) if ranks[0]["peak_gib"] is not None else None,
        "ranks": ranks,
    }


def add_speedups(entries: List[dict]) -> None:
    """speedup = step time at cp = 1 / step time at cp (same T_total); efficiency = speedup / cp."""
    base = {e["T_total"]: e["step_ms"] for e in entries if e["cp"] == 1}
    for e in entries:
        e["speedup"] = base[e["T_total"]] / e["step_ms"] if e["T_total"] in base else None
        e["efficiency"] = e["speedup"] / e["cp"] if e["speedup"] is not None else None


def format_scale_table(entries: List[dict], meta: dict) -> str:
    """The scaling table (one line per T_total and cp) and the per-rank list."""
    shape = ", ".join(f"{k}={v}" for k, v in meta["shape"].items())
    lines = [f"\nDSA layer forward + backward per rank ({meta['dtype']}, {shape}; {meta['backend']}); "
             "times of the slowest rank; comm = mean over ranks",
             f"{'T_total':>8} {'cp':>3} {'tok/rank':>9} {'fwd ms':>9} {'bwd ms':>9} {'fwd+bwd':>9} {'fastest':>9} "
             f"{'speedup':>7} {'eff.':>5} {'comm in layer':>16} {'comm alone':>16} {'peak GiB':>8}"]
    for e in entries:
        speed = f"{e['speedup']:7.2f} {e['efficiency']:5.2f}" if e["speedup"] is not None else f"{'-':>7} {'-':>5}"
        peak = f"{e['peak_gib']:8.1f}" if e["peak_gib"] is not None else f"{'-':>8}"
        lines.append(
            f"{e['T_total']:>8} {e['cp']:>3} {e['local_tokens']:>9} {e['fwd_ms']:9.1f} {e['bwd_ms']:9.1f} "
            f"{e['step_ms']:9.1f} {e['fastest_ms']:9.1f} {speed} "
            f"{e['comm_ms']:8.2f} ({e['comm_share']:5.1%}) "
            f"{e['comm_alone_ms']:8.2f} ({e['comm_alone_share']:5.1%}) {peak}")
    lines.append("\nper rank: fwd+bwd ms [comm in layer: all-gather / reduce-scatter / all-reduce ms]")
    for e in entries:
        per_rank = "  ".join(f"r{t['rank']} {t['total_ms']:.1f} [{_comm_by_op(t)}]" for t in e["ranks"])
        lines.append(f"{e['T_total']:>8} cp={e['cp']}: {per_rank}")
    return "\n".join(lines)


def _comm_by_op(timing: dict) -> str:
    """'all-gather / reduce-scatter / all-reduce' milliseconds of one rank."""
    return " / ".join(f"{timing['comm_by_op_ms'][op]:.2f}" for op in CollectiveRecorder.OPS)


def write_json(path: Path, payload: dict) -> None:
    """Writes ``payload`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs this rank (under torchrun) or spawns --nproc ranks; returns the exit status."""
    args = parse_args(argv)
    if _launched_by_torchrun():
        if args.nproc != 1:
            raise SystemExit("--nproc spawns processes itself; under torchrun use --nproc-per-node instead")
        world = int(os.environ["WORLD_SIZE"])
        place = Place(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world,
                      int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        return run_rank(args, place)
    return spawn(args)


if __name__ == "__main__":
    sys.exit(main())
