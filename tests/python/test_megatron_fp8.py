"""The Megatron backend's FP8 selection switch ($FLASHDSA_INDEXER_SELECTION, docs/megatron.md): the
hooks run the indexer's selection pass the variable names (CPU; Megatron itself is not needed)."""

import pytest
import torch

import flashdsa
from flashdsa.megatron import hooks

pytestmark = pytest.mark.kernels("indexer_topk", "indexer_topk_fp8", "quantize_fp8")


def megatron_indexer_inputs(sq=900, b=1, h_i=4, d_i=32, seed=0):
    """Megatron's layouts: q [sq, b, H_I, D_I], k [sq, b, D_I], weights [sq, b, H_I], causal bounds."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sq, b, h_i, d_i, generator=gen).to(torch.bfloat16)
    k = (torch.randn(sq, b, d_i, generator=gen) * torch.exp(torch.randn(sq, b, 1, generator=gen))).to(torch.bfloat16)
    w = torch.randn(sq, b, h_i, generator=gen) * 0.2
    starts = torch.zeros(sq, dtype=torch.int32)
    ends = torch.arange(1, sq + 1, dtype=torch.int32)
    return q, k, w, starts, ends


def test_selection_variable(monkeypatch):
    monkeypatch.delenv(hooks.SELECTION_ENV, raising=False)
    assert hooks.indexer_selection() == "bf16"
    monkeypatch.setenv(hooks.SELECTION_ENV, "FP8")
    assert hooks.indexer_selection() == "fp8"
    monkeypatch.setenv(hooks.SELECTION_ENV, "int4")
    with pytest.raises(ValueError, match="selection"):
        hooks.indexer_selection()


def test_qk_topk_hook_follows_the_variable(monkeypatch):
    q, k, w, starts, ends = megatron_indexer_inputs()
    topk = 64
    k_start, k_end = starts, ends
    fp8, _ = flashdsa.indexer_topk(q[:, 0], k[:, 0], w[:, 0], k_start, k_end, topk, selection="fp8")
    bf16, _ = flashdsa.indexer_topk(q[:, 0], k[:, 0], w[:, 0], k_start, k_end, topk)
    # The hook's indexer call, recorded (the selections may well agree on such data).
    seen = []
    real = hooks._ops.indexer_topk

    def spy(*args, **kwargs):
        seen.append(kwargs.get("selection", "bf16"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hooks._ops, "indexer_topk", spy)
    for selection, want in (("bf16", bf16), ("fp8", fp8)):
        monkeypatch.setenv(hooks.SELECTION_ENV, selection)
        got, _ = hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
        assert torch.equal(got[0], want), selection
        assert seen[-1] == selection


def spy_indexer_topk(monkeypatch, option: str) -> list:
    """Wraps the hooks' flashdsa.indexer_topk: every call appends (selection, kwargs[option]) to the returned list."""
    seen = []
    real = hooks._ops.indexer_topk

    def spy(*args, **kwargs):
        seen.append((kwargs.get("selection"), kwargs.get(option)))
        return real(*args, **kwargs)

    monkeypatch.setattr(hooks._ops, "indexer_topk", spy)
    return seen


def test_fp8_candidates_variable(monkeypatch):
    """$FLASHDSA_FP8_CANDIDATES reaches flashdsa.indexer_topk with the fp8 selection only; a bad value is a
    ValueError at the call; fewer candidates give the op's own result for that count."""
    q, k, w, starts, ends = megatron_indexer_inputs()
    topk = 64
    want = {c: flashdsa.indexer_topk(q[:, 0], k[:, 0], w[:, 0], starts, ends, topk, selection="fp8",
                                     fp8_candidates=c)[0] for c in (64, 128)}
    seen = spy_indexer_topk(monkeypatch, "fp8_candidates")
    monkeypatch.setenv(hooks.SELECTION_ENV, "fp8")
    for c in (64, 128):
        monkeypatch.setenv(hooks.FP8_CANDIDATES_ENV, str(c))
        got, _ = hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
        assert torch.equal(got[0], want[c]) and seen[-1] == ("fp8", c)
    monkeypatch.setenv(hooks.SELECTION_ENV, "bf16")  # ignored with bf16 (not an error)
    hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert seen[-1] == ("bf16", None)
    monkeypatch.delenv(hooks.FP8_CANDIDATES_ENV)
    monkeypatch.setenv(hooks.SELECTION_ENV, "fp8")
    hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert seen[-1] == ("fp8", None)
    monkeypatch.setenv(hooks.FP8_CANDIDATES_ENV, "many")
    with pytest.raises(ValueError, match="FLASHDSA_FP8_CANDIDATES"):
        hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)


def test_fp8_band_variable(monkeypatch):
    """$FLASHDSA_FP8_BAND reaches flashdsa.indexer_topk with the fp8 selection only (the op's own band result);
    a bad value is a ValueError at the call."""
    q, k, w, starts, ends = megatron_indexer_inputs()
    topk = 64
    want = flashdsa.indexer_topk(q[:, 0], k[:, 0], w[:, 0], starts, ends, topk, selection="fp8", fp8_band=16)[0]
    seen = spy_indexer_topk(monkeypatch, "fp8_band")
    monkeypatch.setenv(hooks.SELECTION_ENV, "fp8")
    monkeypatch.setenv(hooks.FP8_BAND_ENV, "16")
    got, _ = hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert torch.equal(got[0], want) and seen[-1] == ("fp8", 16)
    monkeypatch.setenv(hooks.SELECTION_ENV, "bf16")  # ignored with bf16 (not an error)
    hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert seen[-1] == ("bf16", None)
    monkeypatch.setenv(hooks.SELECTION_ENV, "fp8")
    monkeypatch.setenv(hooks.FP8_BAND_ENV, "wide")
    with pytest.raises(ValueError, match="FLASHDSA_FP8_BAND"):
        hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)


def test_fp8_band_scaled_variable(monkeypatch):
    """$FLASHDSA_FP8_BAND_SCALED=1 reaches flashdsa.indexer_topk as fp8_band_scaled=True with the fp8 selection and a
    band (the op's own scaled result); 0 / unset is False; another value is a ValueError at the call."""
    q, k, w, starts, ends = megatron_indexer_inputs()
    topk = 64
    want = flashdsa.indexer_topk(q[:, 0], k[:, 0], w[:, 0], starts, ends, topk, selection="fp8", fp8_band=16,
                                 fp8_band_scaled=True)[0]
    seen = spy_indexer_topk(monkeypatch, "fp8_band_scaled")
    monkeypatch.setenv(hooks.SELECTION_ENV, "fp8")
    monkeypatch.setenv(hooks.FP8_BAND_ENV, "16")
    monkeypatch.setenv(hooks.FP8_BAND_SCALED_ENV, "1")
    got, _ = hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert torch.equal(got[0], want) and seen[-1] == ("fp8", True)
    monkeypatch.setenv(hooks.FP8_BAND_SCALED_ENV, "0")
    hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert seen[-1] == ("fp8", False)
    monkeypatch.delenv(hooks.FP8_BAND_SCALED_ENV)
    hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    assert seen[-1] == ("fp8", False)
    monkeypatch.setenv(hooks.FP8_BAND_SCALED_ENV, "2")
    with pytest.raises(ValueError, match="FLASHDSA_FP8_BAND_SCALED"):
        hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
    monkeypatch.setenv(hooks.FP8_BAND_SCALED_ENV, "1")  # without a band: the op refuses it
    monkeypatch.delenv(hooks.FP8_BAND_ENV)
    with pytest.raises(ValueError, match="fp8_band_scaled"):
        hooks.run_fused_qk_topk(q, k, w, topk, starts, ends)
