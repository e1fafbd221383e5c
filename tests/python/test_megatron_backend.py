"""FlashDSA as Megatron Core's ``dsa_kernel_backend="flashdsa"`` (python/flashdsa/megatron, docs/megatron.md).

Parity matrix on a 2-layer Megatron GPT with DSA (fp32, CPU): {SBHD, THD} x {sparse, dense indexer
loss} x {IndexShare off, topk_freq 2} x {CP 1, CP 2 over gloo}, plus the FlashDSAttention layer spec
(fused path with IndexShare, loss in the backward). In every case the LM loss, the logged indexer
losses and every parameter gradient of backend flashdsa equal those of backend none within 1e-5
relative, and FlashDSA's hook counters show which hooks served the case (none declined).
"""

import warnings

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install flashdsa[megatron])")

import megatron_parity as mp_helper  # noqa: E402
import flashdsa  # noqa: E402
from megatron_parity import Case  # noqa: E402

TOL = 1e-5
NUM_LAYERS = 2

HOOK_CASES = [Case(layout, sparse, freq, cp)
              for cp in (1, 2) for layout in ("sbhd", "thd") for sparse in (True, False) for freq in (1, 2)]
SPEC_CASES = [Case(layout, sparse, 2, cp, spec=True)
              for cp in (1, 2) for layout in ("sbhd", "thd") for sparse in (True, False)]
EXTRA_CASES = [Case("thd", True, 1, 1, spec=True), Case("sbhd", True, 1, 1, per_token=True),
               Case("thd", True, 1, 2, spec=True, per_token=True),
               Case("thd", True, 1, 1, relu=True, indexer_heads=16),
               Case("thd", False, 2, 1, spec=True, relu=True, indexer_heads=16),
               Case("sbhd", False, 1, 1, loss_scale=0.25), Case("thd", True, 2, 2, spec=True, loss_scale=0.25),
               Case("thd", True, 1, 1, masked=True), Case("thd", False, 1, 2, masked=True),
               Case("thd", True, 2, 2, masked=True), Case("thd", True, 2, 1, spec=True, masked=True)]
EVAL_CASES = [Case("sbhd", True, 1, 1, eval=True), Case("thd", True, 2, 1, eval=True),
              Case("thd", True, 2, 2, spec=True, eval=True), Case("thd", True, 2, 2, eval=True),
              Case("sbhd", False, 2, 2, eval=True)]
ALL_CASES = HOOK_CASES + SPEC_CASES + EXTRA_CASES + EVAL_CASES
CUDA_CASES = [Case("thd", True, 1, 1, device="cuda"), Case("sbhd", False, 1, 1, device="cuda"),
              Case("thd", True, 2, 1, spec=True, device="cuda"), Case("thd", False, 2, 1, spec=True, device="cuda")]


@pytest.fixture(scope="module")
def parity_results():
    """Runs every case once: CP 1 cases in one spawned process, CP 2 cases in two (gloo)."""
    results = {}
    for cp in (1, 2):
        cases = [c for c in ALL_CASES if c.cp == cp]
        per_rank = mp_helper.run_cases(cases, cp)
        for case in cases:
            results[case] = [rank_result[case] for rank_result in per_rank]
    return results


def expected_hooks(case: Case) -> dict:
    """The hook calls FlashDSA must serve in one training step of the 2-layer model."""
    if case.eval:  # no indexer loss
        if case.topk_freq == 1:
            return {"run_fused_dsa_attention": NUM_LAYERS}
        if case.spec:
            return {"run_fused_dsa_attention": 1, "run_fused_absorbed_sparse_attention": 1}
        return {"run_fused_qk_topk": 1, "run_fused_absorbed_sparse_attention": NUM_LAYERS}
    in_backward = case.spec and case.sparse and not case.masked  # masked rows: forward-time loss
    if case.topk_freq == 1:
        expected = {"run_fused_dsa_attention": NUM_LAYERS}
        if in_backward:
            expected["loss_in_backward"] = NUM_LAYERS
        return expected
    # topk_freq 2: layer 1 computes the top-k, layer 2 reuses it.
    if case.spec:
        expected = {"run_fused_dsa_attention": 1, "run_fused_absorbed_sparse_attention": 1}
        if in_backward:
            expected["loss_in_backward"] = 1
        return expected
    expected = {"run_fused_absorbed_sparse_attention": NUM_LAYERS}
    if case.sparse:  # Megatron's split loss hook; the dense loss with IndexShare reaches no hook
        expected["run_fused_qk_topk_with_loss"] = 1
    return expected


@pytest.mark.parametrize("case", EVAL_CASES, ids=lambda c: c.name)
def test_flashdsa_backend_matches_megatron_in_eval(parity_results, case):
    for rank, result in enumerate(parity_results[case]):
        assert "error" not in result, f"rank {rank}:\n{result.get('error')}"
        assert result["stats"] == expected_hooks(case), f"rank {rank}: hooks {result['stats']}"
        assert result["logits_rel"] <= TOL, result["logits_rel"]


@pytest.mark.parametrize("case", HOOK_CASES + SPEC_CASES + EXTRA_CASES, ids=lambda c: c.name)
def test_flashdsa_backend_matches_megatron(parity_results, case):
    for rank, result in enumerate(parity_results[case]):
        assert "error" not in result, f"rank {rank}:\n{result.get('error')}"
        assert result["stats"] == expected_hooks(case), f"rank {rank}: hooks {result['stats']}"
        assert result["stats_none"] == {}, "backend none must not call FlashDSA"
        ref_lm, got_lm = result["lm_loss"]
        assert abs(got_lm - ref_lm) <= TOL * abs(ref_lm), (rank, ref_lm, got_lm)
        ref_idx, got_idx = result["indexer_loss"]
        assert ref_idx[0] > 1e-3, "the indexer loss of the computing layer must be non-trivial"
        assert result["indexer_loss_rel"] <= TOL, (rank, ref_idx, got_idx)
        assert not result["missing_grads"], result["missing_grads"]
        assert len(result["grad_rel"]) > 20
        worst = max(result["grad_rel"].items(), key=lambda kv: kv[1])
        assert worst[1] <= TOL, f"rank {rank}: worst gradient {worst}"


@pytest.fixture(scope="module")
def cuda_results():
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    import flashdsa

    if not flashdsa.built_with_cuda():
        pytest.skip("flashdsa was built without CUDA")
    (per_rank,) = mp_helper.run_cases(CUDA_CASES, 1)
    return per_rank


@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: c.name)
def test_flashdsa_backend_on_cuda_bf16(cuda_results, case):
    """bf16 on the GPU: FlashDSA serves every call (no decline) and the losses track backend none."""
    import math

    result = cuda_results[case]
    assert "error" not in result, result.get("error")
    assert result["stats"] == expected_hooks(case), result["stats"]
    ref_lm, got_lm = result["lm_loss"]
    assert math.isfinite(got_lm) and abs(got_lm - ref_lm) <= 2e-2 * abs(ref_lm), (ref_lm, got_lm)
    ref_idx, got_idx = result["indexer_loss"]
    assert all(math.isfinite(v) for v in got_idx)
    assert result["indexer_loss_rel"] <= 5e-2, (ref_idx, got_idx)
    assert all(math.isfinite(v) for v in result["grad_rel"].values())


# ---------------------------------------------------------------------------------------------
# Registration, declines (in-process: no torch.distributed needed)


def test_register_makes_backend_valid():
    import flashdsa.megatron as fm
    import megatron.core.utils as mcore_utils
    from megatron.core.transformer.experimental_attention_variant import dsa_kernels

    fm.register()
    fm.register()  # idempotent
    assert fm.is_registered()
    assert "flashdsa" in mcore_utils._VALID_DSA_KERNEL_BACKENDS
    assert dsa_kernels._BACKEND_MODULE_NAME_BY_BACKEND["flashdsa"] == "flashdsa.megatron.hooks"
    mcore_utils._validate_dsa_kernel_backend_dependencies("flashdsa")  # no CUDA needed
    mcore_utils._validate_dsa_kernel_backend_dependencies("none")
    with pytest.raises(ValueError):
        mcore_utils._validate_dsa_kernel_backend_dependencies("no-such-backend")


def _indexer_inputs(sq=40, b=2, h_i=4, d_i=16, dtype=torch.float32):
    q = torch.randn(sq, b, h_i, d_i, dtype=dtype)
    k = torch.randn(sq, b, d_i, dtype=dtype)
    w = torch.randn(sq, b, h_i, dtype=dtype)
    starts, ends = flashdsa.causal_key_ranges([0, sq])  # one causal sequence
    return q, k, w, starts, ends


def test_topk_hook_matches_megatron_naive_topk_sbhd_batch():
    """Batched SBHD top-k equals Megatron's naive top-k as a set per row (GLM-5 scoring, no ReLU)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import fused_qk_topk_naive

    from flashdsa.megatron import hooks

    q, k, w, starts, ends = _indexer_inputs()
    got, length = hooks.run_fused_qk_topk(q, k, w, 8, starts, ends, 0, use_relu=False, unknown_future_kwarg=1)
    assert length is None and got.shape == (2, 40, 8) and got.dtype == torch.int32
    _, ref = fused_qk_topk_naive(q, k, w, 8, varlen_starts=starts.long(), varlen_ends=ends.long(), use_relu=False)
    for bi in range(2):
        for t in range(40):
            assert set(got[bi, t].tolist()) - {-1} == set(ref[bi, t].tolist()) - {-1}


def test_topk_tie_rule_prefers_smaller_key():
    """Equal scores (e.g. ReLU zeros): the smaller key index is selected (documented in docs/megatron.md)."""
    from flashdsa.megatron import hooks

    sq, d_i = 10, 8
    q = torch.zeros(sq, 1, 1, d_i)
    q[..., 0] = 1.0
    k = torch.zeros(sq, 1, d_i)
    k[:, 0, 0] = -1.0  # every ReLU score is 0: all keys tie
    k[6, 0, 0] = 2.0   # except key 6
    w = torch.ones(sq, 1, 1)
    starts = torch.zeros(sq, dtype=torch.int32)
    ends = torch.full((sq,), sq, dtype=torch.int32)
    got, _ = hooks.run_fused_qk_topk(q, k, w, 3, starts, ends, 0, use_relu=True)
    for t in range(sq):
        assert sorted(got[0, t].tolist()) == [0, 1, 6]


def test_declines_unsupported_config_once_and_counts():
    import flashdsa.megatron as fm
    from flashdsa.megatron import hooks

    fm.reset_stats()
    q, k, w, starts, ends = _indexer_inputs(dtype=torch.float16)  # fp16 is not a FlashDSA dtype
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hooks.run_fused_qk_topk(q, k, w, 8, starts, ends, 0) is None
        assert hooks.run_fused_qk_topk(q, k, w, 8, starts, ends, 0) is None
    assert fm.stats["declined:run_fused_qk_topk"] == 2
    assert len([c for c in caught if "flashdsa.megatron" in str(c.message)]) == 1
    # Absorbed attention with a rope width other than 64 (D_v != D_qk - 64) declines too.
    query = torch.randn(8, 1, 2, 48)
    key = torch.randn(8, 1, 1, 48)
    idx = torch.zeros(1, 8, 4, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert hooks.run_fused_absorbed_sparse_attention(query, key, idx, 0.1, 32) is None
    assert fm.stats["declined:run_fused_absorbed_sparse_attention"] == 1
    assert fm.stats["run_fused_absorbed_sparse_attention"] == 0


def test_use_flashdsa_attention_rewrites_block_specs_in_place():
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAttention
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from flashdsa.megatron import FlashDSAttention, use_flashdsa_attention
    from flashdsa.megatron.testing import dsa_layer_spec

    layer = dsa_layer_spec()
    block = TransformerBlockSubmodules(layer_specs=[layer, dsa_layer_spec()])

    def core(spec):
        return spec.submodules.self_attention.submodules.core_attention

    assert core(layer).module is DSAttention
    assert use_flashdsa_attention(block, indexer_loss_in_backward=False) is block
    for spec in block.layer_specs:
        assert core(spec).module is FlashDSAttention
        assert core(spec).params["indexer_loss_in_backward"] is False
    assert issubclass(FlashDSAttention, DSAttention)
