"""Parity runs for tests/python/test_megatron_backend.py: Megatron GPT with DSA, backend flashdsa vs none.

Every case trains one step of the same 2-layer model (same seed, same batch) with
``dsa_kernel_backend="none"`` and with ``"flashdsa"`` (hooks only, or through the FlashDSAttention
layer spec) and reports the relative differences of the LM loss, the logged indexer losses and every
parameter gradient, plus FlashDSA's hook counters. Cases of one context-parallel size run in one
spawned process group (gloo), so the pytest process never initializes torch.distributed.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
import traceback
import warnings


@dataclasses.dataclass(frozen=True)
class Case:
    """One cell of the parity matrix."""

    layout: str        # "sbhd" or "thd"
    sparse: bool       # sparse (True) or dense indexer loss
    topk_freq: int     # 1 = IndexShare off; 2 = every second layer reuses the top-k
    cp: int            # context-parallel size (allgather)
    spec: bool = False  # FlashDSAttention layer spec (else: plain DSAttention + hooks)
    relu: bool = False
    per_token: bool = False
    masked: bool = False     # THD only: real_token_mask_q marks each document's last 8 tokens as padding
    device: str = "cpu"      # "cuda": bf16, CUDA kernel shapes (D_qk 576, 16 heads, H_I 32); loose checks
    eval: bool = False       # inference forward only (no indexer loss): compare the logits
    loss_scale: float = 1.0  # DSAIndexerLossAutoScaler's main-loss scale (e.g. 1 / micro-batches)
    indexer_heads: int = 4  # ReLU cases use 16: an exact score tie at the K-th place (all heads' ReLU = 0)
    #                         is then improbable; ties may be broken differently by torch.topk (see docs)

    @property
    def name(self) -> str:
        """Short id for pytest."""
        return (f"{self.layout}-{'sparse' if self.sparse else 'dense'}-freq{self.topk_freq}-cp{self.cp}"
                f"{'-spec' if self.spec else ''}{'-relu' if self.relu else ''}{'-pertoken' if self.per_token else ''}"
                f"{f'-scale{self.loss_scale:g}' if self.loss_scale != 1.0 else ''}{'-masked' if self.masked else ''}{'-eval' if self.eval else ''}{'-cuda' if self.device == 'cuda' else ''}")


def _rel(a, b) -> float:
    import torch

    a, b = a.double(), b.double()
    return float((a - b).norm() / a.norm().clamp_min(1e-30))


def run_case(case: Case, rank: int) -> dict:
    """Runs both backends for ``case`` in an initialized process group; returns the comparison."""
    import torch
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossAutoScaler

    from flashdsa import megatron as fm
    from flashdsa.megatron import testing as T

    shape = T.ModelShape(indexer_heads=case.indexer_heads)
    dtype = torch.float32
    if case.device == "cuda":
        shape = T.ModelShape(hidden_size=256, num_attention_heads=16, q_lora_rank=128, kv_lora_rank=512,
                             qk_head_dim=32, v_head_dim=32, indexer_heads=32, indexer_head_dim=64, topk=64)
        dtype = torch.bfloat16
    if case.layout == "thd":
        batch = T.make_batch([32, 64], shape.vocab_size, thd=True, seed=7)
        if case.masked:
            mask = torch.ones(1, 96, dtype=torch.bool)
            mask[0, 24:32] = mask[0, 88:96] = False
            batch["real_token_mask"] = mask
    else:
        batch = T.make_batch([48, 48], shape.vocab_size, thd=False, seed=7)
    if case.device == "cuda":
        batch = T.make_batch([128, 256] if case.layout == "thd" else [192, 192], shape.vocab_size,
                             thd=case.layout == "thd", seed=7, device="cuda")
    batch = T.split_batch_for_cp(batch, case.cp, rank)
    results, counters = {}, {}
    for backend in ("none", "flashdsa"):
        config = T.build_config(shape, backend=backend, sparse_loss=case.sparse, topk_freq=case.topk_freq,
                                cp=case.cp, relu=case.relu, loss_coeff=1.0, init_method_std=0.1,
                                per_token_loss=case.per_token, dtype=dtype)
        model = T.build_gpt(config, shape, seed=1234, flashdsa_attention=case.spec and backend == "flashdsa")
        DSAIndexerLossAutoScaler.set_loss_scale(torch.tensor(case.loss_scale))
        fm.reset_stats()
        results[backend] = T.eval_logits(model, batch) if case.eval else T.train_step(model, batch)
        counters[backend] = dict(fm.stats)
    if case.eval:
        return {"logits_rel": _rel(results["none"], results["flashdsa"]), "stats": counters["flashdsa"],
                "stats_none": counters["none"]}
    ref, got = results["none"], results["flashdsa"]
    grad_rel = {name: _rel(ref["grads"][name], got["grads"][name]) for name in ref["grads"]}
    return {
        "lm_loss": (float(ref["lm_loss"]), float(got["lm_loss"])),
        "indexer_loss": (ref["indexer_loss"].tolist(), got["indexer_loss"].tolist()),
        "indexer_loss_rel": _rel(ref["indexer_loss"], got["indexer_loss"]),
        "grad_rel": grad_rel,
        "missing_grads": sorted(set(ref["grads"]) ^ set(got["grads"])),
        "stats": counters["flashdsa"],
        "stats_none": counters["none"],
    }


def _worker(rank: int, world: int, cp: int, cases: list, init_file: str, out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from flashdsa.megatron import testing as T

    cuda = any(case.device == "cuda" for case in cases)
    if not cuda:
        T.install_cpu_shim()
    T.init_parallel(rank, world, cp, init_file=init_file, backend="nccl" if cuda else "gloo")
    out = {}
    for case in cases:
        try:
            out[case] = run_case(case, rank)
        except Exception:  # reported per case by the test
            out[case] = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)
    T.destroy_parallel()


def run_cases(cases: list, cp: int) -> list[dict]:
    """Runs ``cases`` (all with this ``cp``) in ``cp`` spawned gloo processes; one result dict per rank."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.start_processes(_worker, args=(cp, cp, list(cases), init_file, tmp), nprocs=cp, join=True,
                           start_method="spawn")
        per_rank = []
        for rank in range(cp):
            with open(os.path.join(tmp, f"rank{rank}.pkl"), "rb") as f:
                per_rank.append(pickle.load(f))
    return per_rank


if __name__ == "__main__":  # quick manual run: python tests/python/megatron_parity.py
    cases = [Case("thd", True, 1, 1), Case("sbhd", False, 2, 1, spec=True)]
    for rank_result in run_cases(cases, 1):
        for case, r in rank_result.items():
            print(case.name, {k: v for k, v in r.items() if k != "grad_rel"},
                  max(r.get("grad_rel", {0: 0}).values()), file=sys.stderr)
