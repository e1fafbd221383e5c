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
import importlib.util
import os
import sys
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
    "tilelang_fp8_example": "tilelang + TileLang's examples/deepseek_v32 (FP8 lightning indexer, top-k selector)",
}


@dataclass
class PeerStatus:
    """Whether one peer package can be used here; `module` is what the adapters call."""

    key: str  # "flashmla" | "cudnn" | "tilelang" | "tilelang_fp8_example"
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


# TileLang's own DeepSeek V3.2 example kernels (tile-ai/tilelang examples/deepseek_v32; not in the
# PyPI wheel): scripts/peers_stage.sh puts them into the tilelang set, under this folder, with the
# upstream commit in its PEERS_COMMITS file.
TILELANG_EXAMPLES = "tilelang_examples"
TILELANG_EXAMPLE_FILES = ("fp8_lighting_indexer.py", "topk_selector.py", "utils.py")


def tilelang_examples_dir() -> str:
    """The folder holding fp8_lighting_indexer.py, topk_selector.py and utils.py: FLASHDSA_TL_EXAMPLES_DIR
    (e.g. a tilelang checkout's examples/deepseek_v32), else <peers dir>/tilelang/tilelang_examples/deepseek_v32."""
    return os.environ.get("FLASHDSA_TL_EXAMPLES_DIR") or os.path.join(peers_dir(), "tilelang", TILELANG_EXAMPLES,
                                                                       "deepseek_v32")


def _load_by_path(name: str, path: str):
    """Imports the file `path` as module `name` (registered in sys.modules: TileLang's JIT reads its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class TileLangFp8Example:
    """TileLang's example FP8 lightning indexer and top-k selector, loaded by path from `folder`.

    The example files are scripts, not a package: fp8_lighting_indexer.py does `from utils import ...`
    (its sibling utils.py). That file is loaded under a private name and stands in for `utils` in
    sys.modules only while the indexer module executes, so no other `utils` is shadowed or replaced.
    Module attributes used (checked here, so that an API change reads as "absent"):
    fp8_lighting_indexer.mqa_attn_return_logits_interface(q, kv, kv_scales, weights, cu_seqlen_ks,
    cu_seqlen_ke, clean_logits=True), utils.per_custom_dims_cast_to_fp8(x, dims, use_ue8m0),
    topk_selector.tl_topk(input, starts, ends, topk).
    """

    PREFIX = "flashdsa_peer_tilelang_example_"

    def __init__(self, folder: str):
        self.folder = folder
        paths = {f: os.path.join(folder, f) for f in TILELANG_EXAMPLE_FILES}
        missing = [f for f, p in paths.items() if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{', '.join(missing)} not in {folder}")
        self.utils, self.stand_ins = self._load_utils(paths["utils.py"])
        saved = sys.modules.get("utils")
        sys.modules["utils"] = self.utils
        try:
            self.indexer = _load_by_path(self.PREFIX + "fp8_lighting_indexer", paths["fp8_lighting_indexer.py"])
        finally:
            if saved is None:
                sys.modules.pop("utils", None)
            else:
                sys.modules["utils"] = saved
        self.topk_module = _load_by_path(self.PREFIX + "topk_selector", paths["topk_selector.py"])
        self.logits_interface = self._need(self.indexer, "mqa_attn_return_logits_interface")
        self.cast_to_fp8 = self._need(self.utils, "per_custom_dims_cast_to_fp8")
        self.tl_topk = self._need(self.topk_module, "tl_topk")

    # utils.py imports these at its top without using them (its helpers are plain torch): when one is
    # not installed, an empty stand-in takes its place in sys.modules while utils.py loads, and only then.
    UNUSED_IMPORTS = ("triton", "triton.language", "packaging", "packaging.version")

    def _load_utils(self, path: str):
        """(utils module, names of the stand-ins its load needed)."""
        def absent(name: str) -> bool:
            try:
                return importlib.util.find_spec(name) is None
            except ModuleNotFoundError:  # its parent package is not installed
                return True
        stand_ins = [n for n in self.UNUSED_IMPORTS if n not in sys.modules and absent(n)]
        added = {name: type(sys)(name) for name in stand_ins}
        for name, module in added.items():
            parent, _, child = name.rpartition(".")
            if parent in added:
                setattr(added[parent], child, module)
        sys.modules.update(added)
        try:
            return _load_by_path(self.PREFIX + "utils", path), stand_ins
        finally:
            for name in added:
                sys.modules.pop(name, None)

    @staticmethod
    def _need(module, name: str):
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ImportError(f"{os.path.basename(module.__file__)} has no callable {name}")
        return fn

    def quantize(self, q_idx, k_idx):
        """The example's own quantization (as its test_fp8_lighting_indexer does): q cast to e4m3 as it
        is (the kernel takes no q scale), k per token to e4m3 with an fp32 scale (amax / 448).
        Returns (q_fp8 [T, H, D], k_fp8 [T, D], k_scales [T] fp32)."""
        import torch
        k_fp8, k_scales = self.cast_to_fp8(k_idx, (0,), False)
        return q_idx.to(torch.float8_e4m3fn), k_fp8, k_scales.float().contiguous()

    def logits(self, q_fp8, k_fp8, k_scales, weights, ks, ke, clean_logits: bool = True):
        """fp32 logits [S, S_kv]: sum_h w[s, h] relu(q[s, h] . k[j]) k_scale[j] for ks[s] <= j < ke[s]
        (the example's entry point; with clean_logits, -inf outside the range)."""
        return self.logits_interface(q_fp8, k_fp8, k_scales, weights, ks, ke, clean_logits=clean_logits)

    def topk(self, logits, starts, ends, topk: int):
        """int32 [S, topk]: the top-k columns of each logits row within [starts, ends) (the example's
        radix selector; slots a short row cannot fill stay 0)."""
        return self.tl_topk(logits, starts, ends, topk)


def probe_tilelang_fp8_example() -> PeerStatus:
    """TileLang's example FP8 lightning indexer + top-k selector (examples/deepseek_v32 of tile-ai/tilelang,
    staged by scripts/peers_stage.sh into the tilelang set), with the tilelang package."""
    key = "tilelang_fp8_example"
    package = PACKAGES[key]
    reason = _cuda_required()
    if reason:
        return PeerStatus(key, package, False, reason)
    folder = tilelang_examples_dir()
    if not os.path.isdir(folder):
        return PeerStatus(key, package, False, f"no example folder {folder} (scripts/peers_stage.sh tilelang, "
                                                 "or FLASHDSA_TL_EXAMPLES_DIR)")
    os.environ.setdefault("TILELANG_CACHE_DIR", os.path.join(peers_dir(), "tilelang_cache"))
    try:
        importlib.import_module("tilelang")
        example = TileLangFp8Example(folder)
    except Exception as error:  # noqa: BLE001
        return PeerStatus(key, package, False, f"not importable: {_first_line(error)}")
    commit = _read(os.path.join(os.path.dirname(folder), "PEERS_COMMITS")).split()
    where = f"tile-ai/tilelang {commit[1][:9]}" if len(commit) > 1 else "commit unknown"
    stand_ins = f"; utils.py loaded with empty stand-ins for {', '.join(example.stand_ins)}" if example.stand_ins else ""
    return PeerStatus(key, package, True, f"tilelang {_version('tilelang')}, examples/deepseek_v32 of {where} "
                                          f"({folder}){stand_ins}", example)


PROBES: Dict[str, Callable[[], PeerStatus]] = {
    "flashmla": probe_flashmla,
    "cudnn": probe_cudnn,
    "tilelang": probe_tilelang,
    "tilelang_fp8_example": probe_tilelang_fp8_example,
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

