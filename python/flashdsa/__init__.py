"""FlashDSA: fused DeepSeek Sparse Attention (DSA) training kernels with a PyTorch front end.

The ops (``flashdsa.sparse_mla``, ``flashdsa.indexer_topk``, ...) are defined in
:mod:`flashdsa.ops`; see docs/python-api.md. The higher-level modules (thd, layer,
context_parallel, index_share) are imported as submodules, and the names in their ``__all__``
are re-exported here.
"""

import importlib as _importlib

from ._version import __version__
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all

__all__ = list(_ops_all)


def _import_submodules() -> None:
    """Imports the optional higher-level submodules that exist and re-exports their __all__."""
    for name in ("thd", "layer", "context_parallel", "index_share"):
        qualified = f"{__name__}.{name}"
        try:
            module = _importlib.import_module(qualified)
        except ModuleNotFoundError as error:
            # Only a missing submodule itself is tolerated; a failing import inside it is a real error.
            if error.name != qualified:
                raise
            continue
        globals()[name] = module
        for public in getattr(module, "__all__", ()):
            globals()[public] = getattr(module, public)
            __all__.append(public)


_import_submodules()
