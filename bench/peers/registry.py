"""Which public peers are present in this process, and how each is found.

A peer is optional: it is "present" only when its package imports (or, for FlashMLA, when a build
of it is found). Nothing here installs or vendors peer code; scripts/peers_stage.sh and
scripts/peers_gpu.sh prepare the packages for the GPU machine (docs/benchmarks.md, "Peers").

Every probe returns a PeerStatus; a missing package gives ``present=False`` with the reason, never
an exception, so a run without any peer reports them all as absent.
"""

from __future__ import annotations

import glob
import importlib
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

# Where scripts/peers_gpu.sh puts the peers on the GPU machine (override with FLASHDSA_PEERS_DIR).
DEFAULT_PEERS_DIR = "/tmp/peers"
# The op library our FlashMLA binding (bench/peers/flashmla_binding.cpp) registers.
FLASHMLA_OP_NAMESPACE = "flashdsa_peer_flashmla"


def peers_dir() -> str:
    """The folder holding the unpacked peers on this machine (FLASHDSA_PEERS_DIR or /tmp/peers)."""
    return os.environ.get("FLASHDSA_PEERS_DIR", DEFAULT_PEERS_DIR)

# What a user installs for each peer (the report lists them).
PACKAGES = {
    "flashmla": "FlashMLA (deepseek-ai/FlashMLA, built from source)",
    "cudnn": "nvidia-cudnn-frontend (cudnn.deepseek_sparse_attention)",
    "tilelang": "tilelang + megatron-core (its TileLang DSA kernels)",
}


@dataclass
class PeerStatus:
    """Whether one peer package can be used here; `module` is what the adapters call."""

    key: str  # "flashmla" | "cudnn" | "tilelang"
    package: str  # what a user installs
    present: bool
    detail: str  # version when present, the reason when absent
    module: Optional[object] = None

    def as_dict(self) -> dict:
        """The JSON-able part (no module)."""
        return {"key": self.key, "package": self.package, "present": self.present, "detail": self.detail}


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:240]


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001 - the version is informative only
        return "unknown version"


def _cuda_required() -> Optional[str]:
    import torch
    if not torch.cuda.is_available():
        return "needs a CUDA device (none here)"
    return None


def probe_flashmla() -> PeerStatus:
    """FlashMLA's SM90 sparse prefill forward: our binding built by scripts/peers_gpu.sh in
    <peers dir>/flashmla, or an installed `flash_mla` package (its flash_mla_sparse_fwd)."""
    package = PACKAGES["flashmla"]
    reason = _cuda_required()
    if reason:
        return PeerStatus("flashmla", package, False, reason)
    import torch
    libraries = sorted(glob.glob(os.path.join(peers_dir(), "flashmla", "build", "*.so")))
    errors = []
    for library in libraries:
        try:
            if not hasattr(torch.ops, FLASHMLA_OP_NAMESPACE) or not hasattr(
                    getattr(torch.ops, FLASHMLA_OP_NAMESPACE), "sparse_prefill_fwd"):
                torch.ops.load_library(library)
            op = getattr(torch.ops, FLASHMLA_OP_NAMESPACE).sparse_prefill_fwd
            commit = _read(os.path.join(peers_dir(), "flashmla", "src", "PEERS_COMMITS")).split()
            where = f"FlashMLA {commit[1][:7]}" if len(commit) > 1 else "FlashMLA"
            return PeerStatus("flashmla", package, True, f"{where}, built in {os.path.dirname(library)}",
                              _FlashMlaOp(op))
        except Exception as error:  # noqa: BLE001
            errors.append(_first_line(error))
    try:
        module = importlib.import_module("flash_mla")
        return PeerStatus("flashmla", package, True, f"flash_mla {_version('flash_mla')} (installed)",
                          _FlashMlaOp(module.flash_mla_sparse_fwd))
    except Exception as error:  # noqa: BLE001
        errors.append(_first_line(error))
    where = os.path.join(peers_dir(), "flashmla", "build")
    return PeerStatus("flashmla", package, False,
                      f"no build in {where} (run scripts/peers_gpu.sh) and flash_mla not importable"
                      + (f": {'; '.join(errors)}" if errors else ""))


class _FlashMlaOp:
    """Calls FlashMLA's sparse prefill forward: (q, kv[s_kv,1,d], indices[s_q,1,k], sm_scale, d_v)
    -> (out, max_logits, lse)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, q, kv, indices, sm_scale: float, d_v: int):
        """One sparse prefill forward: (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q] natural log)."""
        return self.fn(q, kv, indices, sm_scale, d_v)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def probe_cudnn() -> PeerStatus:
    """cuDNN frontend's DeepSeek sparse attention module (PyPI nvidia-cudnn-frontend >= 1.32)."""
    package = PACKAGES["cudnn"]
    reason = _cuda_required()
    if reason:
        return PeerStatus("cudnn", package, False, reason)
    try:
        module = importlib.import_module("cudnn.deepseek_sparse_attention")
        for name in ("sparse_attention_backward_wrapper", "indexer_forward_wrapper", "indexer_top_k_wrapper"):
            getattr(module, name)  # lazily imported: fails here if a dependency is missing
    except Exception as error:  # noqa: BLE001
        return PeerStatus("cudnn", package, False, f"not importable: {_first_line(error)}")
    return PeerStatus("cudnn", package, True, f"nvidia-cudnn-frontend {_version('nvidia-cudnn-frontend')}, "
                                              f"nvidia-cutlass-dsl {_version('nvidia-cutlass-dsl')}", module)


TILELANG_MODULE = "megatron.core.transformer.experimental_attention_variant.ops"


class _TileLangKernels:
    """The TileLang DSA kernels megatron-core ships, and the Megatron functions around them."""

    def __init__(self):
        ops = TILELANG_MODULE
        self.sparse_mla_fwd = importlib.import_module(f"{ops}.tilelang_sparse_mla_fwd").sparse_mla_fwd_interface
        bwd = importlib.import_module(f"{ops}.tilelang_sparse_mla_bwd")
        self.sparse_mla_bwd, self.sparse_mla_delta = bwd.sparse_mla_bwd, bwd.sparse_mla_delta
        self.SparseMLA = importlib.import_module(f"{ops}.sparse_mla").SparseMLA
        self.indexer_fwd = importlib.import_module(f"{ops}.tilelang_indexer_fwd").indexer_fwd_interface
        self.fused_qk_topk = importlib.import_module(f"{ops}.tilelang_dsa").fused_qk_topk_lighting
        if self.SparseMLA is None:
            raise ImportError("megatron-core found no TileLang (SparseMLA is None)")


def probe_tilelang() -> PeerStatus:
    """TileLang through the DSA kernels of megatron-core (PyPI tilelang + megatron-core)."""
    package = PACKAGES["tilelang"]
    reason = _cuda_required()
    if reason:
        return PeerStatus("tilelang", package, False, reason)
    os.environ.setdefault("TILELANG_CACHE_DIR", os.path.join(peers_dir(), "tilelang_cache"))
    try:
        importlib.import_module("tilelang")
        kernels = _TileLangKernels()
    except Exception as error:  # noqa: BLE001
        return PeerStatus("tilelang", package, False, f"not importable: {_first_line(error)}")
    return PeerStatus("tilelang", package, True,
                      f"tilelang {_version('tilelang')}, megatron-core {_version('megatron-core')}", kernels)


PROBES: Dict[str, Callable[[], PeerStatus]] = {
    "flashmla": probe_flashmla,
    "cudnn": probe_cudnn,
    "tilelang": probe_tilelang,
}


def discover(keys: Optional[List[str]] = None, device=None) -> Dict[str, PeerStatus]:
    """Probes the peers (all, or `keys`) and returns their status by key; never raises.

    device: the device of the run; every peer runs on CUDA only, so a run on another device reports
    them all absent without probing (None: probe whatever this machine has).
    """
    found = {}
    for key in keys or list(PROBES):
        if key not in PROBES:
            raise ValueError(f"unknown peer {key!r}; known: {', '.join(PROBES)}")
        if device is not None and getattr(device, "type", str(device)) != "cuda":
            found[key] = PeerStatus(key, PACKAGES[key], False, f"runs on CUDA only; this run is on {device}")
            continue
        try:
            found[key] = PROBES[key]()
        except Exception as error:  # noqa: BLE001 - a probe must never stop the run
            found[key] = PeerStatus(key, PACKAGES.get(key, key), False, f"probe failed: {_first_line(error)}")
    return found

