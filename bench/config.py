"""What one benchmark run measures: shapes, sequence lengths, budgets, and the PERF.md targets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

SECTIONS = ("kernels", "layer", "baselines", "peers")
# Run when --only is not given; "peers" (bench/peers: public peers A/B) is opt-in (--peers / --only peers).
DEFAULT_SECTIONS = ("kernels", "layer", "baselines")
# Selection pass of FlashDSA's indexer_topk in the peers A/B (flashdsa.indexer_topk's `selection`).
# "fp8-band": the FP8 selection with the band re-score (fp8_band = topk / 4: indices only, docs/spec.md §3);
# "fp8-fast": the band re-score with the narrower setting fp8_band = topk / 8, fp8_candidates = topk + topk / 8
# (FP8_FAST_SETTINGS; recall measured in docs/kernels/indexer_topk.md); "fp8-scaled": fp8-fast with the band and the
# slack scaled to each row's keys (fp8_band_scaled=True, docs/spec.md §3)
INDEXER_SELECTIONS = ("bf16", "fp8", "fp8-band", "fp8-fast", "fp8-scaled")


def fp8_selection_kwargs(indexer_selection: str, topk: int) -> dict:
    """The keyword arguments of flashdsa.indexer_topk for one of the FP8 INDEXER_SELECTIONS."""
    if indexer_selection == "fp8-band":
        return {"selection": "fp8", "fp8_band": topk // 4}
    if indexer_selection == "fp8-fast":
        return {"selection": "fp8", "fp8_band": topk // 8, "fp8_candidates": topk + topk // 8}
    if indexer_selection == "fp8-scaled":
        return {"selection": "fp8", "fp8_band": topk // 8, "fp8_candidates": topk + topk // 8, "fp8_band_scaled": True}
    if indexer_selection == "fp8":
        return {"selection": "fp8", "fp8_band": None}
    raise ValueError(f"not an FP8 selection: {indexer_selection!r}")

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


@dataclass(frozen=True)
class DsaShape:
    """One DSA layer (absorbed MLA + lightning indexer), docs/spec.md §2 names."""

    heads: int  # H, attention heads on this GPU
    d_qk: int  # latent key width (512 latent + 64 RoPE in GLM-5)
    d_v: int  # value width = first d_v columns of kv
    topk: int  # K
    index_heads: int  # H_I
    index_dim: int  # D_I
    share_every: int = 4  # IndexShare: one "full" layer in every share_every layers

    @property
    def scale(self) -> float:
        return self.d_qk ** -0.5


@dataclass(frozen=True)
class DenseShape:
    """Dense causal attention baseline dims (torch SDPA)."""

    label: str
    heads: int
    d_qk: int
    d_v: int


@dataclass(frozen=True)
class BenchConfig:
    device: torch.device
    dtype: torch.dtype
    quick: bool
    seq_lens: Tuple[int, ...]
    dsa: DsaShape
    dense: Tuple[DenseShape, ...]
    sections: Tuple[str, ...]
    max_seconds: float
    gemm_n: int  # the ceiling GEMM is gemm_n^3
    copy_bytes: int  # bytes of the device-to-device copy ceiling
    unfused_max_t: int  # the unfused baseline stops here (it is out of memory or too slow beyond)
    unfused_chunk_bytes: int  # temporaries budget of one query chunk of the unfused baseline
    standard_shape: bool  # PERF.md targets apply (GLM-5 shape on CUDA)
    index_order: str = "ascending"  # order of each row's sparse-attention indices (bench/inputs.py INDEX_ORDERS)
    indexer_selection: str = "bf16"  # our indexer_topk's selection pass in the peers A/B (INDEXER_SELECTIONS)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype_name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}[self.dtype]


# GLM-5 / DeepSeek-V3.2 shape of PERF.md, and the model's dense dims plus the common 192/128 ones.
GLM5_DSA = DsaShape(heads=64, d_qk=576, d_v=512, topk=2048, index_heads=32, index_dim=128)
GLM5_DENSE = (DenseShape("dense 256", 64, 256, 256), DenseShape("dense 192/128", 64, 192, 128))

# CPU mode: the same code paths at sizes the CPU reference runs in seconds (exercised by CI).
CPU_DSA = DsaShape(heads=4, d_qk=576, d_v=512, topk=64, index_heads=4, index_dim=128)
CPU_DENSE = (DenseShape("dense 256", 4, 256, 256), DenseShape("dense 192/128", 4, 192, 128))

CUDA_SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072, 262144)
CUDA_QUICK_SEQ_LENS = (4096, 16384)
CPU_SEQ_LENS = (64, 128, 256)
CPU_QUICK_SEQ_LENS = (64, 128)


def make_config(device: torch.device, *, quick: bool = False, seq_lens: Optional[Sequence[int]] = None,
                max_seconds: Optional[float] = None, sections: Sequence[str] = DEFAULT_SECTIONS,
                index_order: str = "ascending", indexer_selection: str = "bf16") -> BenchConfig:
    """The run's configuration for `device` (cuda: PERF.md's standard shape; cpu: tiny sizes)."""
    on_cuda = device.type == "cuda"
    if seq_lens is None:
        if on_cuda:
            seq_lens = CUDA_QUICK_SEQ_LENS if quick else CUDA_SEQ_LENS
        else:
            seq_lens = CPU_QUICK_SEQ_LENS if quick else CPU_SEQ_LENS
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    if indexer_selection not in INDEXER_SELECTIONS:
        raise ValueError(f"unknown indexer selection {indexer_selection!r}; known: {', '.join(INDEXER_SELECTIONS)}")
    return BenchConfig(
        device=device,
        # fp32 on the CPU: its bf16 matmuls are emulated and slow, and CPU mode only checks the script.
        dtype=torch.bfloat16 if on_cuda else torch.float32,
        quick=quick,
        seq_lens=tuple(sorted(set(int(t) for t in seq_lens))),
        dsa=GLM5_DSA if on_cuda else CPU_DSA,
        dense=GLM5_DENSE if on_cuda else CPU_DENSE,
        sections=tuple(s for s in SECTIONS if s in sections),
        # 9 minutes on the GPU leaves room for start-up inside the 10-minute acceptance limit.
        max_seconds=float(max_seconds if max_seconds is not None else (540.0 if on_cuda else 300.0)),
        gemm_n=8192 if on_cuda else 512,
        copy_bytes=GIB if on_cuda else 64 * MIB,
        unfused_max_t=65536 if on_cuda else 1 << 30,
        unfused_chunk_bytes=2 * GIB if on_cuda else 64 * MIB,
        standard_shape=on_cuda,
        index_order=index_order,
        indexer_selection=indexer_selection,
    )


@dataclass(frozen=True)
class KernelTarget:
    """PERF.md floor / goal in TFLOP/s, applying from T >= min_t."""

    floor: float
    goal: float
    min_t: int


KERNEL_TARGETS = {
    "indexer_topk": KernelTarget(floor=300.0, goal=550.0, min_t=32768),
    "sparse_mla_fwd": KernelTarget(floor=450.0, goal=640.0, min_t=16384),
    "sparse_mla_bwd": KernelTarget(floor=300.0, goal=480.0, min_t=4096),
}


@dataclass(frozen=True)
class LayerTargets:
    """PERF.md layer-level floor / goal."""

    loss_share_floor: float = 0.20  # loss path time / layer fwd+bwd time
    loss_share_goal: float = 0.10
    crossover_floor: int = 32768  # DSA faster than dense 256 from this T on
    crossover_goal: int = 16384
    speedup_128k_floor: float = 4.0
    speedup_128k_goal: float = 7.0
    speedup_256k_goal: float = 12.0
    extra_memory_128k_floor: int = 4 * GIB
    extra_memory_128k_goal: int = 1 * GIB
    vs_unfused_floor: float = 20.0
    vs_unfused_goal: float = 50.0


LAYER_TARGETS = LayerTargets()
