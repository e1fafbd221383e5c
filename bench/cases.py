"""The benchmark cases: machine ceilings, FlashDSA kernels, the DSA layer, and the baselines.

A Case names what it measures and how to count it; its `prepare` builds the inputs on the device
only when the runner decides to run it, and returns the function to time with its input sets.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import flops, unfused
from .config import BenchConfig, DenseShape, fp8_selection_kwargs
from .inputs import (attention_input_bytes, causal_topk_indices, dsa_inputs, index_input_bytes, index_inputs,
                     input_set_count, layer_input_bytes, layer_memory_bytes, random_mass)
from .layers import LAYER_OPS, flashdsa_layers_fwd_bwd, unfused_layer_fwd_bwd

CEILING, KERNEL, LAYER, BASELINE = "ceiling", "kernel", "layer", "baseline"

DSA_LAYER = "dsa layer"
DSA_SHARED = "dsa layer, IndexShare 1-in-{}"
UNFUSED_LAYER = "unfused layer"
UNFUSED_PREFIX = "unfused "
GEMM = "gemm"
COPY = "copy d2d"
# The indexer-loss path as the layer runs it in training: the attention mass comes out of the sparse
# MLA backward (its extra cost = sparse_mla_bwd_mass - sparse_mla_bwd), then the KL forward and
# backward. LOSS_PATH_RECOMPUTE: the path with the separate mass recompute (no-grad / forward loss).
LOSS_PATH_KERNELS = ("sparse_kl_fwd", "sparse_kl_bwd")
# The FP8 selection setting of the kernels section's "indexer_topk fp8" case (bench/config.py INDEXER_SELECTIONS).
FP8_SUITE_SELECTION = "fp8-scaled"
MASS_FROM_BWD = ("sparse_mla_bwd_mass", "sparse_mla_bwd")  # (with the mass output, without)
LOSS_PATH_RECOMPUTE = ("attention_mass", "sparse_kl_fwd", "sparse_kl_bwd")


@dataclass
class Prepared:
    """A case ready to time: fn(input_set) is one call; the input sets are rotated."""

    fn: Callable[[Any], Any]
    input_sets: List[Any]


@dataclass
class Case:
    section: str  # CEILING | KERNEL | LAYER | BASELINE
    name: str
    t: Optional[int]  # sequence length (None for the ceilings)
    prepare: Callable[[], Prepared]
    flops: Optional[float] = None  # docs/spec.md §9 count of one call
    bytes_moved: Optional[float] = None  # for bandwidth cases (read + write)
    requires: Tuple[str, ...] = ()  # raw flashdsa ops it runs
    layers: int = 1  # layers in one call (IndexShare group); per-layer time = time / layers
    memory_bytes: Optional[int] = None  # predicted device memory, to skip what cannot fit
    note: str = ""


class CaseBuilder:
    """Builds the cases of one run for a config (fd: the flashdsa module, or None if not importable)."""

    def __init__(self, cfg: BenchConfig, fd: Optional[ModuleType]):
        self.cfg = cfg
        self.fd = fd
        self.ops = torch.ops.flashdsa if fd is not None else None
        self.l2_bytes = (torch.cuda.get_device_properties(cfg.device).L2_cache_size if cfg.on_cuda else 0)

    # ------------------------------------------------------------------ helpers

    def _sets(self, make: Callable[[], Tuple], bytes_per_set: int) -> List[Tuple]:
        """Input sets to rotate: enough to defeat L2 on the GPU; two on the CPU (exercises rotation)."""
        count = input_set_count(bytes_per_set, self.l2_bytes) if self.cfg.on_cuda else 2
        return [make() for _ in range(count)]

    def _rand(self, *shape, dtype=None) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype or self.cfg.dtype, device=self.cfg.device)

    # ------------------------------------------------------------------ ceilings

    def ceilings(self) -> List[Case]:
        cfg, n = self.cfg, self.cfg.gemm_n
        element = torch.empty((), dtype=cfg.dtype).element_size()

        def gemm() -> Prepared:
            return Prepared(lambda ab: ab[0] @ ab[1], self._sets(lambda: (self._rand(n, n), self._rand(n, n)),
                                                                  2 * n * n * element))

        def copy() -> Prepared:
            elements = cfg.copy_bytes // element
            src, dst = self._rand(elements), torch.empty(elements, dtype=cfg.dtype, device=cfg.device)

            def run(pair):
                pair[1].copy_(pair[0])  # returns nothing: dst is an input, not a new output
            return Prepared(run, [(src, dst)])

        return [
            Case(CEILING, f"{GEMM} {cfg.dtype_name} {n}^3", None, gemm, flops=flops.gemm_flops(n)),
            Case(CEILING, COPY, None, copy, bytes_moved=2.0 * cfg.copy_bytes,
                 note=f"{cfg.copy_bytes / 2**30:.2f} GiB read + written"),
        ]

    # ------------------------------------------------------------------ kernels

    def kernels(self, t: int) -> List[Case]:
        s, cfg = self.cfg.dsa, self.cfg
        ops = self.ops
        dev = cfg.device

        def indexer() -> Prepared:
            return Prepared(lambda a: ops.indexer_topk(*a, s.topk, True),
                            self._sets(lambda: index_inputs(cfg, t), index_input_bytes(t, s)))

        def indexer_fp8() -> Prepared:  # the public function: its per-row e4m3 quantization is in the call
            kwargs = fp8_selection_kwargs(FP8_SUITE_SELECTION, s.topk)
            return Prepared(lambda a: self.fd.indexer_topk(*a, s.topk, True, **kwargs),
                            self._sets(lambda: index_inputs(cfg, t), index_input_bytes(t, s)))

        def attention_inputs(with_forward: bool):
            q, kv = self._rand(t, s.heads, s.d_qk), self._rand(t, s.d_qk)
            idx = causal_topk_indices(t, s.topk, dev, order=cfg.index_order)
            if not with_forward:
                return q, kv, idx
            out, lse = ops.sparse_mla_fwd(q, kv, idx, s.scale)
            return q, kv, idx, out, lse

        attention_set_bytes = attention_input_bytes(t, s)

        def sparse_fwd() -> Prepared:
            return Prepared(lambda a: ops.sparse_mla_fwd(*a, s.scale),
                            self._sets(lambda: attention_inputs(False), attention_set_bytes))

        def backward(name: str) -> Callable[[], Prepared]:  # sparse_mla_bwd, or sparse_mla_bwd_mass (+ mass)
            def prepare() -> Prepared:
                op = getattr(ops, name)
                def make():
                    q, kv, idx, out, lse = attention_inputs(True)
                    return q, kv, idx, out, lse, self._rand(t, s.heads, s.d_v)
                return Prepared(lambda a: op(a[0], a[1], a[2], s.scale, a[3], a[4], a[5], False),
                                self._sets(make, 2 * attention_set_bytes))
            return prepare

        def mass() -> Prepared:
            return Prepared(lambda a: ops.attention_mass(a[0], a[1], a[2], a[4], s.scale),
                            self._sets(lambda: attention_inputs(True), 2 * attention_set_bytes))

        def kl_inputs():
            q_idx, k_idx, weights, _, _ = index_inputs(cfg, t)
            idx = causal_topk_indices(t, s.topk, dev, order=cfg.index_order)
            grad_rows = torch.full((t,), 1.0 / t, device=dev)
            mass = random_mass(idx)
            # The backward starts from the forward's row statistics, as the autograd does.
            _, row_stats = ops.sparse_kl_fwd(q_idx, k_idx, weights, idx, mass, True)
            return q_idx, k_idx, weights, idx, mass, grad_rows, row_stats

        kl_set_bytes = index_input_bytes(t, s) + 2 * t * s.topk * 4 + 8 * t

        def kl_fwd() -> Prepared:
            return Prepared(lambda a: ops.sparse_kl_fwd(*a[:5], True), self._sets(kl_inputs, kl_set_bytes))

        def kl_bwd() -> Prepared:
            return Prepared(lambda a: ops.sparse_kl_bwd(*a[:5], True, a[5], a[6]), self._sets(kl_inputs, kl_set_bytes))

        return [
            Case(KERNEL, "indexer_topk", t, indexer, flops=flops.indexer_flops(t, s), requires=("indexer_topk",),
                 note="FLOPs of the scores; time includes the top-k selection"),
            Case(KERNEL, "indexer_topk fp8", t, indexer_fp8, flops=flops.indexer_flops(t, s),
                 requires=("quantize_fp8", "indexer_topk_fp8"),
                 note=f"FP8 selection ({FP8_SUITE_SELECTION}: flashdsa.indexer_topk with "
                      f"{fp8_selection_kwargs(FP8_SUITE_SELECTION, s.topk)}, indices only), quantization included; "
                      "FLOPs of the scores"),
            Case(KERNEL, "sparse_mla_fwd", t, sparse_fwd, flops=flops.sparse_fwd_flops(t, s),
                 requires=("sparse_mla_fwd",)),
            Case(KERNEL, "sparse_mla_bwd", t, backward("sparse_mla_bwd"),
                 flops=flops.sparse_bwd_flops(t, s),
                 requires=("sparse_mla_fwd", "sparse_mla_bwd")),
            Case(KERNEL, "sparse_mla_bwd_mass", t, backward("sparse_mla_bwd_mass"),
                 flops=flops.sparse_bwd_flops(t, s),
                 requires=("sparse_mla_fwd", "sparse_mla_bwd_mass"),
                 note="sparse_mla_bwd + the attention-mass output (the KL target, no recompute)"),
            Case(KERNEL, "attention_mass", t, mass, flops=flops.attention_mass_flops(t, s),
                 requires=("sparse_mla_fwd", "attention_mass")),
            Case(KERNEL, "sparse_kl_fwd", t, kl_fwd, flops=flops.kl_fwd_flops(t, s), requires=("sparse_kl_fwd",)),
            Case(KERNEL, "sparse_kl_bwd", t, kl_bwd, flops=flops.kl_bwd_flops(t, s), requires=("sparse_kl_bwd",)),
        ]

    # ------------------------------------------------------------------ the DSA layer

    def layer(self, t: int) -> List[Case]:
        cfg, s = self.cfg, self.cfg.dsa

        def prepare(layers: int) -> Callable[[], Prepared]:
            def build() -> Prepared:
                return Prepared(lambda x: flashdsa_layers_fwd_bwd(self.fd, x, s, layers=layers),
                                self._sets(lambda: dsa_inputs(cfg, t, requires_grad=True), layer_input_bytes(t, s)))
            return build

        memory = layer_memory_bytes(t, s)
        return [
            Case(LAYER, DSA_LAYER, t, prepare(1), flops=flops.dsa_layer_flops(t, s), requires=LAYER_OPS,
                 memory_bytes=memory, note="indexer + top-k, sparse MLA fwd, bwd with the mass output, KL fwd+bwd"),
            Case(LAYER, DSA_SHARED.format(s.share_every), t, prepare(s.share_every),
                 flops=flops.index_share_group_flops(t, s), requires=LAYER_OPS, layers=s.share_every,
                 memory_bytes=memory,
                 note=f"{s.share_every} layers, indexer + loss in the first only; time per layer"),
        ]

    # ------------------------------------------------------------------ baselines

    def baselines(self, t: int) -> List[Case]:
        cases = [self._dense(t, d) for d in self.cfg.dense]
        if t <= self.cfg.unfused_max_t:
            cases += self._unfused(t)
        return cases

    def _sdpa_context(self):
        if not self.cfg.on_cuda:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])

    def _dense(self, t: int, d: DenseShape) -> Case:
        cfg = self.cfg

        def make():
            def leaf(width):  # [1, T, H, width] (BSHD), viewed as [1, H, T, width] for SDPA
                return self._rand(1, t, d.heads, width).requires_grad_(True)
            return leaf(d.d_qk), leaf(d.d_qk), leaf(d.d_v), self._rand(1, t, d.heads, d.d_v)

        def fwd_bwd(a):
            q, k, v, dout = a
            with self._sdpa_context():
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True)
                grads = torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2))
            return (out, *grads)

        bytes_per_set = t * d.heads * (2 * d.d_qk + 2 * d.d_v) * 2
        backend = "cuDNN" if cfg.on_cuda else "CPU default"
        return Case(BASELINE, d.label, t, lambda: Prepared(fwd_bwd, self._sets(make, bytes_per_set)),
                    flops=flops.dense_fwd_bwd_flops(t, d), memory_bytes=2 * bytes_per_set,
                    note=f"torch SDPA ({backend}), causal, H={d.heads}, D_qk={d.d_qk}, D_v={d.d_v}, fwd+bwd")

    def _unfused(self, t: int) -> List[Case]:
        cfg, s = self.cfg, self.cfg.dsa
        chunk = cfg.unfused_chunk_bytes

        def layer() -> Prepared:
            return Prepared(lambda x: unfused_layer_fwd_bwd(x, s, chunk_bytes=chunk),
                            self._sets(lambda: dsa_inputs(cfg, t, requires_grad=True), layer_input_bytes(t, s)))

        def indexer() -> Prepared:
            return Prepared(lambda a: unfused.indexer_topk(*a, s.topk, chunk_bytes=chunk),
                            self._sets(lambda: index_inputs(cfg, t), index_input_bytes(t, s)))

        def sparse_fwd() -> Prepared:
            def make():
                return self._rand(t, s.heads, s.d_qk), self._rand(t, s.d_qk), causal_topk_indices(
                    t, s.topk, cfg.device, order=cfg.index_order)

            def run(a):
                with torch.no_grad():
                    return unfused.sparse_mla(*a, s.scale, s.d_v, chunk_bytes=chunk)
            return Prepared(run, self._sets(make, attention_input_bytes(t, s)))

        return [
            Case(BASELINE, UNFUSED_PREFIX + "indexer_topk", t, indexer, flops=flops.indexer_flops(t, s),
                 note="chunked matmul + torch.topk"),
            Case(BASELINE, UNFUSED_PREFIX + "sparse_mla_fwd", t, sparse_fwd, flops=flops.sparse_fwd_flops(t, s),
                 note="gather + einsum + softmax, no grad"),
            Case(BASELINE, UNFUSED_LAYER, t, layer, flops=flops.dsa_layer_flops(t, s),
                 note="plain PyTorch, chunked over queries, autograd backward"),
        ]


def build_cases(cfg: BenchConfig, fd: Optional[ModuleType]) -> List[Case]:
    """All cases of the run: the ceilings, then for each T (ascending) kernels, layer, baselines.

    Ordering by T means that a run cut short by its time budget loses the largest cases first.
    """
    builder = CaseBuilder(cfg, fd)
    cases = builder.ceilings()
    sections: Sequence[Tuple[str, Callable[[int], List[Case]]]] = (
        ("kernels", builder.kernels), ("layer", builder.layer), ("baselines", builder.baselines))
    for t in cfg.seq_lens:
        for section, make in sections:
            if section in cfg.sections:
                cases += make(t)
    return cases
