"""FlashDSA for Megatron Core (megatron-core 0.19.2): a ``dsa_kernel_backend`` and a layer spec.

Usage (docs/megatron.md)::

    import flashdsa.megatron
    flashdsa.megatron.register()                    # once per process, before building the config
    config = MLATransformerConfig(..., experimental_attention_variant="dsa",
                                  dsa_kernel_backend="flashdsa")

The hooks Megatron calls live in :mod:`flashdsa.megatron.hooks`; :data:`stats` counts which of them
FlashDSA served and which it declined (Megatron's PyTorch path then runs). For what the hooks cannot
reach (the fused path with IndexShare, IndexShare with the dense loss, the loss computed in the
backward) use :class:`FlashDSAttention` through :func:`use_flashdsa_attention`.
"""

from __future__ import annotations

from .hooks import reset_stats, stats

__all__ = ["BACKEND_NAME", "FlashDSAttention", "is_registered", "register", "reset_stats", "stats",
           "use_flashdsa_attention"]

#: The value of ``TransformerConfig.dsa_kernel_backend`` that selects FlashDSA.
BACKEND_NAME = "flashdsa"
_HOOKS_MODULE = "flashdsa.megatron.hooks"
_registered = False


def _missing_flashdsa_dependencies() -> list[str]:
    """What the flashdsa backend lacks in this process (empty when it can run)."""
    try:
        from .. import _C  # noqa: F401
    except ImportError as error:  # pragma: no cover - the package import above already needs it
        return [f"the FlashDSA extension ({error})"]
    return []


def register() -> None:
    """Makes ``dsa_kernel_backend="flashdsa"`` valid in an unmodified Megatron Core; idempotent.

    Adds the backend to Megatron's hook registry (``dsa_kernels._BACKEND_MODULE_NAME_BY_BACKEND``),
    to ``megatron.core.utils._VALID_DSA_KERNEL_BACKENDS``, and wraps the config's dependency check
    so that ``flashdsa`` is accepted on CPU and CUDA (Megatron's own check requires CUDA for every
    fused backend). Other backends are checked by Megatron's original function, unchanged. Call it
    in every process (also in spawned ranks) before the ``TransformerConfig`` is built.
    """
    global _registered
    if _registered:
        return
    import megatron.core.transformer.transformer_config as transformer_config
    import megatron.core.utils as mcore_utils
    from megatron.core.transformer.experimental_attention_variant import dsa_kernels

    dsa_kernels._BACKEND_MODULE_NAME_BY_BACKEND[BACKEND_NAME] = _HOOKS_MODULE
    if BACKEND_NAME not in mcore_utils._VALID_DSA_KERNEL_BACKENDS:
        mcore_utils._VALID_DSA_KERNEL_BACKENDS = tuple(mcore_utils._VALID_DSA_KERNEL_BACKENDS) + (BACKEND_NAME,)
    original = mcore_utils._validate_dsa_kernel_backend_dependencies

    def _validate_dsa_kernel_backend_dependencies(dsa_kernel_backend: str) -> None:
        """Megatron's check, plus the flashdsa backend (CPU or CUDA)."""
        if dsa_kernel_backend != BACKEND_NAME:
            return original(dsa_kernel_backend)
        missing = _missing_flashdsa_dependencies()
        if missing:
            raise ValueError(f"dsa_kernel_backend={BACKEND_NAME} requires {', '.join(missing)}. "
                             "Install flashdsa or set dsa_kernel_backend=none to use the PyTorch fallback.")

    _validate_dsa_kernel_backend_dependencies._flashdsa_original = original
    mcore_utils._validate_dsa_kernel_backend_dependencies = _validate_dsa_kernel_backend_dependencies
    transformer_config._validate_dsa_kernel_backend_dependencies = _validate_dsa_kernel_backend_dependencies
    _registered = True


def is_registered() -> bool:
    """Whether :func:`register` ran in this process."""
    return _registered


def __getattr__(name: str):
    # The layer spec imports Megatron's DSAttention: load it only when asked for.
    if name in ("FlashDSAttention", "use_flashdsa_attention"):
        from . import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
