"""Context parallelism: zigzag layout helpers, and the layer under cp = 2, 4 (spawned processes)
against the cp = 1 run on the same data: outputs, indices, losses and all gradients."""

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashdsa
from flashdsa.context_parallel import ZigzagLayout, pad_cu_seqlens, zigzag_rows
from flashdsa.index_share import IndexShareContext
from flashdsa.layer import DSAAttention
import layer_reference as ref

LENGTHS = [37, 101, 1, 150, 67]
TOPK = 64
SPAWN_TIMEOUT_S = 300
# Where layer A computes its sparse indexer loss: result-key suffix -> indexer_loss_in_backward.
# "" = the default in training (the backward), "@forward_loss" = the forward path.
LOSS_PATHS = {"": None, "@forward_loss": False}


# ---------------------------------------------------------------------------------------------
# Layout helpers (single process).

def test_zigzag_rows_small_example():
    cu_pad = torch.tensor([0, 8, 12])
    assert zigzag_rows(cu_pad, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert zigzag_rows(cu_pad, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    assert pad_cu_seqlens(torch.tensor([0, 5, 6, 6]), 4).tolist() == [0, 8, 12, 12]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_split_merge_roundtrip_and_ranges(cp):
    x = ref.make_inputs(LENGTHS, seed=1)
    layouts = [ZigzagLayout(x.cu_seqlens, cp, r) for r in range(cp)]
    shares = [lay.split(x.kv) for lay in layouts]
    assert all(s.shape[0] == layouts[0].num_local_tokens for s in shares)
    assert torch.equal(layouts[0].merge(torch.cat(shares)), x.kv)

    # Ranges of the local queries, mapped back to real rows, are the causal THD mask.
    mask = ref.causal_mask(x.cu_seqlens)
    for lay in layouts:
        k_start, k_end = lay.key_ranges()
        padded_keys = torch.arange(lay.num_padded_tokens)
        real_key = lay.padded_to_real_rows(padded_keys)
        real_query = lay.padded_to_real_rows(lay.local_rows)
        for i in range(lay.num_local_tokens):
            seen = real_key[int(k_start[i]):int(k_end[i])]
            if real_query[i] < 0:
                assert seen.numel() == 0, "a padding query must see nothing"
                continue
            assert (seen >= 0).all(), "a real query must not see padding keys"
            assert torch.equal(seen, torch.nonzero(mask[real_query[i]]).flatten())


# ---------------------------------------------------------------------------------------------
# The layer under CP, in spawned processes.

def run_scenarios(data, cp_group, loss_in_backward=None):
    """The model used by both the cp = 1 run and every rank: returns a dict of results.

    Layers: A (full, sparse KL, relu; ``loss_in_backward`` as its indexer_loss_in_backward) → B
    (shared, reuses A's indices), backward of Σ out_A·probe_A + Σ out_B·probe_B; then C (full,
    dense KL, no relu) with its own backward. ``data`` holds either the global tensors (cp = 1) or
    this rank's zigzag share.
    """
    a, b, c = (ref.with_grad(ref.LayerInputs(*data[k], data["cu_seqlens"])) for k in ("a", "b", "c"))
    scale = a.q.shape[-1] ** -0.5
    ctx = IndexShareContext()
    full = DSAAttention(TOPK, scale, loss_coeff=0.3, cp_group=cp_group, indexer_loss_in_backward=loss_in_backward)
    shared = DSAAttention(TOPK, scale, index_share="shared", cp_group=cp_group)
    dense = DSAAttention(TOPK, scale, loss_coeff=0.7, loss_formulation="dense", relu=False, cp_group=cp_group)

    out_a = full(a.q, a.kv, a.cu_seqlens, a.q_idx, a.k_idx, a.weights, index_share_ctx=ctx)
    out_b = shared(b.q, b.kv, b.cu_seqlens, index_share_ctx=ctx)
    # Whether A's loss is still pending (NaN: it is computed in the backward).
    pending_a = torch.isnan(out_a.indexer_loss).reshape(1)
    ((out_a.out.double() * data["probe_a"]).sum() + (out_b.out.double() * data["probe_b"]).sum()).backward()
    out_c = dense(c.q, c.kv, c.cu_seqlens, c.q_idx, c.k_idx, c.weights)
    (out_c.out.double() * data["probe_c"]).sum().backward()

    results = {"out_a": out_a.out, "out_b": out_b.out, "out_c": out_c.out, "indices_a": out_a.indices,
               "indices_c": out_c.indices, "loss_a": out_a.indexer_loss, "loss_c": out_c.indexer_loss,
               "pending_a": pending_a}
    for name, x in (("a", a), ("b", b), ("c", c)):
        for field in ("q", "kv", "q_idx", "k_idx", "weights"):
            grad = getattr(x, field).grad
            if grad is not None:
                results[f"d{field}_{name}"] = grad
    return {k: v.detach().cpu() for k, v in results.items()}


def run_loss_paths(data, cp_group):
    """run_scenarios with each of LOSS_PATHS for layer A; the keys carry the path's suffix."""
    results = {}
    for suffix, loss_in_backward in LOSS_PATHS.items():
        results.update({k + suffix: v for k, v in run_scenarios(data, cp_group, loss_in_backward).items()})
    return results


ROW_TENSORS = ("q", "kv", "q_idx", "k_idx", "weights")


def make_data(dtype, device):
    """Global inputs of the three layers and the probes (float64 [T, H, D_v])."""
    data = {"cu_seqlens": ref.make_inputs(LENGTHS).cu_seqlens.to(device)}
    for i, name in enumerate("abc"):
        # Shifted indexer inputs: no score ties at 0 under ReLU, so every cp picks the same top-k.
        data[name] = tuple(ref.make_inputs(LENGTHS, dtype=dtype, device=device, seed=40 + i, indexer_shift=1.0)[:5])
        probe_shape = data[name][0].shape[:2] + (data[name][0].shape[2] - ref.ROPE_WIDTH,)
        gen = torch.Generator().manual_seed(50 + i)
        data[f"probe_{name}"] = torch.randn(probe_shape, generator=gen, dtype=torch.float64).to(device)
    return data


def local_share(data, layout):
    """This rank's zigzag share of every row tensor in ``data`` (cu_seqlens stays global)."""
    share = {"cu_seqlens": data["cu_seqlens"]}
    for key, value in data.items():
        if key in "abc":
            share[key] = tuple(layout.split(t) for t in value)
        elif key.startswith("probe"):
            share[key] = layout.split(value)
    return share


def error_scenarios(data, layout, group):
    """Calls that must fail identically on every rank (no hang); returns the error messages."""
    rank = dist.get_rank(group)
    a = ref.LayerInputs(*data["a"], data["cu_seqlens"])
    layer = DSAAttention(TOPK, 0.1, cp_group=group)
    cases = {
        "cu_seqlens differ": lambda: layer(a.q, a.kv, a.cu_seqlens + (rank == 1) * torch.tensor(
            [0, 0, 1, 1, 1, 1], dtype=torch.int32, device=a.q.device), a.q_idx, a.k_idx, a.weights),
        "kv sizes differ": lambda: layer(a.q, a.kv[: a.kv.shape[0] - rank], a.cu_seqlens, a.q_idx,
                                         a.k_idx[: a.k_idx.shape[0] - rank], a.weights),
        "not the zigzag share": lambda: layer(a.q[:-2], a.kv[:-2], a.cu_seqlens, a.q_idx[:-2], a.k_idx[:-2], a.weights[:-2]),
    }
    messages = {}
    for name, call in cases.items():
        try:
            call()
            messages[name] = "no error"
        except ValueError as err:
            messages[name] = str(err)
    return messages


def _worker(rank, world, backend, device_kind, dtype, store_path, data_path, out_dir, with_errors):
    torch.set_num_threads(1)  # the CI machine has 2 cores for up to 4 processes
    device = torch.device(f"cuda:{rank}") if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        group = dist.group.WORLD
        data = {k: (tuple(t.to(device) for t in v) if isinstance(v, tuple) else v.to(device))
                for k, v in torch.load(data_path).items()}
        layout = ZigzagLayout.for_group(data["cu_seqlens"], group, device)
        share = local_share(data, layout)
        results = run_loss_paths(share, group)
        if with_errors:
            results["errors"] = error_scenarios(share, layout, group)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn(world, *args):
    """Runs _worker on ``world`` processes; fails the test (killing them) after SPAWN_TIMEOUT_S."""
    ctx = mp.start_processes(_worker, args=(world, *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"cp={world} workers did not finish within {SPAWN_TIMEOUT_S} s")


def cp_cases():
    cuda_ready = torch.cuda.is_available() and flashdsa.built_with_cuda()
    cases = []
    for world in (2, 4):
        cases.append(pytest.param(world, "cpu", id=f"cp{world}-gloo-cpu"))
        enough_gpus = cuda_ready and torch.cuda.device_count() >= world
        cases.append(pytest.param(world, "cuda", id=f"cp{world}-nccl-cuda", marks=pytest.mark.skipif(
            not enough_gpus, reason=f"needs {world} GPUs with FlashDSA CUDA kernels")))
    return cases


@pytest.mark.parametrize("world, device_kind", cp_cases())
def test_cp_matches_cp1(world, device_kind, tmp_path):
    dtype, backend, rtol = (torch.float32, "gloo", 1e-5) if device_kind == "cpu" else (torch.bfloat16, "nccl", 2e-2)
    device = torch.device("cuda:0" if device_kind == "cuda" else "cpu")
    data = make_data(dtype, device)
    expected = run_loss_paths(data, None)
    # cp = 1: the loss computed in the backward equals the forward path's; gradients alike.
    assert bool(expected["pending_a"]) and not bool(expected["pending_a@forward_loss"])
    for key in (k for k in expected if "@" not in k and not k.startswith(("indices", "pending"))):
        ref.assert_close(expected[key], expected[key + "@forward_loss"], rtol,
                         f"cp=1 {key}: loss in backward vs forward")
    torch.save({k: (tuple(t.cpu() for t in v) if isinstance(v, tuple) else v.cpu()) for k, v in data.items()},
               tmp_path / "data.pt")
    with_errors = world == 2
    spawn(world, backend, device_kind, dtype, str(tmp_path / "store"), str(tmp_path / "data.pt"), str(tmp_path), with_errors)

    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        layout = ZigzagLayout(data["cu_seqlens"].cpu(), world, rank)
        is_real = layout.split(torch.ones(sum(LENGTHS))) > 0
        assert set(got) - {"errors"} == set(expected), f"rank {rank}: different set of results/gradients"
        for key, value in expected.items():
            what = f"cp={world} rank {rank} {key}"
            if key.startswith("loss"):
                ref.assert_close(got[key], value, rtol, what)
            elif key.startswith("pending"):
                assert torch.equal(got[key], value), what
            elif key.startswith("indices"):
                local = layout.padded_to_real_rows(got[key])
                assert (local[~is_real] == -1).all(), f"{what}: padding queries must select nothing"
                assert torch.equal(local[is_real].sort(1).values, layout.split(value.long())[is_real].sort(1).values), what
            else:
                # Padding rows: zero outputs and gradients, like the zero rows that split() inserts.
                ref.assert_close(got[key], layout.split(value), rtol, what)
        if with_errors:
            errors = got["errors"]
            assert "disagree on cu_seqlens" in errors["cu_seqlens differ"]
            assert "disagree on kv.shape" in errors["kv sizes differ"] and "rank 1: (" in errors["kv sizes differ"]
            assert "zigzag share" in errors["not the zigzag share"]
