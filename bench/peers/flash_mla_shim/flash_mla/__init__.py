"""A stand-in for the `flash_mla` Python package, for benchmarks on machines without network.

Megatron Core's `cudnn` DSA backend imports `flash_mla.flash_mla_sparse_fwd` for its sparse MLA
forward (FlashMLA's SM90 sparse prefill kernel). FlashMLA's own package builds every FlashMLA kernel;
the benchmark suite instead builds only that kernel, with our small op around it
(bench/peers/flashmla_binding.cpp, built by scripts/peers_gpu.sh into <peers dir>/flashmla/build).
This module exposes that op under the package's name and signature, so Megatron's `cudnn` backend
runs FlashMLA's real kernel. It is put on PYTHONPATH by scripts/peers_gpu.sh only when the op is
built; it is not part of the flashdsa package.
"""

import glob
import os

import torch

__version__ = "shim (FlashMLA SM90 sparse prefill through flashdsa_peer_flashmla)"

_NAMESPACE = "flashdsa_peer_flashmla"
_op = None


def _load():
    global _op
    if _op is not None:
        return _op
    ns = getattr(torch.ops, _NAMESPACE, None)
    if ns is None or not hasattr(ns, "sparse_prefill_fwd"):
        folder = os.path.join(os.environ.get("FLASHDSA_PEERS_DIR", "/tmp/peers"), "flashmla", "build")
        libraries = sorted(glob.glob(os.path.join(folder, "*.so")))
        if not libraries:
            raise ImportError(f"flash_mla shim: no FlashMLA op library in {folder} (run scripts/peers_gpu.sh)")
        torch.ops.load_library(libraries[0])
    _op = getattr(torch.ops, _NAMESPACE).sparse_prefill_fwd
    return _op


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, indexer_topk=0):
    """FlashMLA's sparse prefill forward (SM90, d_qk = 576, d_v = 512, h_q = 64 or 128).

    q [s_q, h_q, 576] bf16, kv [s_kv, 1, 576] bf16, indices [s_q, 1, topk] int32 (-1 or >= s_kv:
    skipped), sm_scale; attn_sink [h_q] fp32 and topk_length [s_q] int32 optional, as in FlashMLA.
    Returns (out [s_q, h_q, 512] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32).
    `indexer_topk` (a later FlashMLA branch's fused-indexer option) must be 0: not supported here.
    """
    if indexer_topk:
        raise NotImplementedError("flash_mla shim: indexer_topk != 0 is not supported")
    if attn_sink is not None:
        attn_sink = attn_sink.to(torch.float32).contiguous()
    if topk_length is not None:
        topk_length = topk_length.to(torch.int32).contiguous()
    return _load()(q, kv, indices, float(sm_scale), int(d_v), attn_sink, topk_length)
