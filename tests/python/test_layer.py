"""The DSA layer (flashdsa.layer) against the float64 plain-PyTorch reference of the same math."""

import pytest
import torch

import flashdsa
from flashdsa.layer import DSAAttention, dsa_attention, set_indexer_loss_scale
import layer_reference as ref

LENGTHS = [37, 101, 1, 150, 67]  # odd lengths, several longer than TOPK so the top-k selects
TOPK = 64
DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # relative error (norms) vs float64
LAYER_OPS = ("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "attention_mass", "sparse_kl_fwd",
             "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd")
GRAD_NAMES = ("dq", "dkv", "dq_idx", "dk_idx", "dweights")


def dtypes_for(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.bfloat16]


@pytest.fixture(autouse=True)
def _reset_loss_scale():
    yield
    set_indexer_loss_scale(1.0)


def run_layer_and_reference(inputs, *, relu, loss_coeff, formulation, topk=TOPK, seed=1):
    """Runs the layer and the reference, back-propagates ``Σ out·probe`` through both.

    The reference adds the KL loss to the model loss (auto-scaler with scale 1). Returns
    (layer result, reference result, layer grads, reference grads) with grads in the order
    q, kv, q_idx, k_idx, weights.
    """
    x = ref.with_grad(inputs)
    scale = x.q.shape[-1] ** -0.5
    res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, topk, scale,
                        relu=relu, loss_coeff=loss_coeff, loss_formulation=formulation)
    gen = torch.Generator().manual_seed(seed)
    probe = torch.randn(res.out.shape, generator=gen, dtype=torch.float64)
    (res.out.double() * probe.to(res.out.device)).sum().backward()

    r = ref.with_grad(ref.as_float64(inputs))
    expected = ref.dsa_layer(r.q, r.kv, r.q_idx, r.k_idx, r.weights, r.cu_seqlens.cpu(), scale, res.indices,
                             relu=relu, loss_coeff=loss_coeff, loss_formulation=formulation)
    total = (expected.out * probe.to(expected.out.device)).sum()
    if expected.loss is not None:
        total = total + expected.loss
    total.backward()
    return res, expected, [t.grad for t in x[:5]], [t.grad for t in r[:5]]


@pytest.mark.kernels(*LAYER_OPS)
@pytest.mark.parametrize("formulation", ["sparse", "dense"])
@pytest.mark.parametrize("relu", [True, False])
def test_layer_matches_reference(device, formulation, relu):
    for dtype in dtypes_for(device):
        tol = DTYPE_TOL[dtype]
        inputs = ref.make_inputs(LENGTHS, dtype=dtype, device=device, seed=3)
        res, expected, grads, ref_grads = run_layer_and_reference(inputs, relu=relu, loss_coeff=0.3, formulation=formulation)

        assert res.indices.dtype == torch.int32 and res.indices.shape == (sum(LENGTHS), TOPK)
        ref.assert_valid_topk(res.indices, expected.scores, TOPK)
        tag = f"{device}/{dtype}/{formulation}/relu={relu}"
        ref.assert_close(res.out, expected.out, tol, f"{tag} out")
        assert res.indexer_loss is not None and not res.indexer_loss.requires_grad
        assert float(expected.loss.detach()) > 0
        ref.assert_close(res.indexer_loss, expected.loss, tol, f"{tag} KL loss")
        for name, g, e in zip(GRAD_NAMES, grads, ref_grads):
            ref.assert_close(g, e, tol, f"{tag} {name}")


@pytest.mark.kernels(*LAYER_OPS)
def test_layer_full_width_shapes(device):
    """The production widths (D_qk = 576, D_v = 512) at tiny T, short sequences (< K visible keys)."""
    dtype = dtypes_for(device)[0]
    heads = 2 if device == "cpu" else 16
    inputs = ref.make_inputs([3, 6, 1], heads=heads, d_qk=576, idx_dim=64, dtype=dtype, device=device, seed=5)
    res, expected, grads, ref_grads = run_layer_and_reference(inputs, relu=True, loss_coeff=1.0, formulation="sparse")
    assert res.out.shape == (10, heads, 512)
    assert int((res.indices == -1).sum()) == 10 * TOPK - (6 + 21 + 1)  # every visible key, then -1
    tol = DTYPE_TOL[dtype]
    ref.assert_close(res.out, expected.out, tol, "out")
    ref.assert_close(res.indexer_loss, expected.loss, tol, "loss")
    for name, g, e in zip(GRAD_NAMES, grads, ref_grads):
        ref.assert_close(g, e, tol, name)


def _grads_of_layer(inputs, *, loss_coeff, loss_scale=1.0, indices=None):
    set_indexer_loss_scale(loss_scale)
    x = ref.with_grad(inputs)
    res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, TOPK, 0.1, loss_coeff=loss_coeff,
                        indices=indices)
    probe = torch.randn(res.out.shape, generator=torch.Generator().manual_seed(7)).to(res.out)
    (res.out * probe).sum().backward()
    return res, [t.grad for t in x[:5]]


@pytest.mark.kernels(*LAYER_OPS)
def test_loss_gradient_only_reaches_the_indexer_and_follows_the_scale(device):
    inputs = ref.make_inputs(LENGTHS, dtype=dtypes_for(device)[0], device=device, seed=11)
    res_none, g_none = _grads_of_layer(inputs, loss_coeff=None)
    # The same indices for all three runs: the CUDA indexer may order (and break exact ties at the
    # threshold) differently from call to call, which would change the output's summation order.
    res_one, g_one = _grads_of_layer(inputs, loss_coeff=0.5, indices=res_none.indices)
    res_quarter, g_quarter = _grads_of_layer(inputs, loss_coeff=0.5, loss_scale=0.25, indices=res_none.indices)

    assert res_none.indexer_loss is None
    assert torch.equal(res_none.out, res_one.out), "attaching the loss must not change the output"
    # Main attention: no gradient from the KL loss (equal up to the summation order of dkv).
    same_tol = 1e-6 if device == "cpu" else 1e-2
    for g0, g1, name in zip(g_none[:2], g_one[:2], GRAD_NAMES[:2]):
        ref.assert_close(g1, g0, same_tol, name)
    # Indexer: gradients exist only through the loss, and scale with the auto-scaler's factor.
    assert all(g is None for g in g_none[2:])
    for g1, gq, name in zip(g_one[2:], g_quarter[2:], GRAD_NAMES[2:]):
        assert g1.abs().max() > 0, name
        ref.assert_close(gq, 0.25 * g1.double(), same_tol, name)
    ref.assert_close(res_quarter.indexer_loss, res_one.indexer_loss, same_tol, "the scale must not change the loss")


@pytest.mark.kernels(*LAYER_OPS)
def test_given_indices_skip_the_indexer(device, monkeypatch):
    inputs = ref.make_inputs(LENGTHS, dtype=dtypes_for(device)[0], device=device, seed=13)
    first = dsa_attention(*inputs[:5], inputs.cu_seqlens, TOPK, 0.1)
    calls = []
    real = flashdsa.ops.indexer_topk
    monkeypatch.setattr(flashdsa.ops, "indexer_topk", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = dsa_attention(inputs.q, inputs.kv, None, None, None, inputs.cu_seqlens, TOPK, 0.1, indices=first.indices)
    assert calls == []
    assert again.indices is first.indices
    assert torch.equal(again.out, first.out)


def test_no_grad_still_reports_the_loss():
    inputs = ref.make_inputs(LENGTHS, seed=17)
    with torch.no_grad():
        res = dsa_attention(*inputs[:5], inputs.cu_seqlens, TOPK, 0.1, loss_coeff=1.0)
    assert res.indexer_loss is not None and float(res.indexer_loss) > 0
    assert not res.out.requires_grad


def test_module_exposes_loss_for_logging():
    inputs = ref.with_grad(ref.make_inputs(LENGTHS, seed=19))
    layer = DSAAttention(TOPK, 0.1, loss_coeff=0.2)
    res = layer(inputs.q, inputs.kv, inputs.cu_seqlens, inputs.q_idx, inputs.k_idx, inputs.weights)
    assert layer.last_indexer_loss is res.indexer_loss
    assert float(layer.last_indexer_loss) > 0 and not layer.last_indexer_loss.requires_grad
    assert "index_share='full'" in repr(layer)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda x: x._replace(cu_seqlens=torch.tensor([0, 200, 150, 356], dtype=torch.int32)), "non-decreasing"),
        (lambda x: x._replace(cu_seqlens=torch.tensor([0, 100, 300], dtype=torch.int32)),
         "must equal the number of packed query tokens"),
        (lambda x: x._replace(q=x.q[:300], q_idx=x.q_idx[:300], weights=x.weights[:300],
                              cu_seqlens=torch.tensor([0, 100, 300], dtype=torch.int32), kv=x.kv[:250], k_idx=x.k_idx[:250]),
         "longer than|key tensor has only 250 rows"),
        (lambda x: x._replace(k_idx=x.k_idx[:-1]), "k_idx has 355 rows"),
        (lambda x: x._replace(weights=None), "q_idx, k_idx and weights are required"),
    ],
)
def test_clear_errors(mutate, message):
    x = mutate(ref.make_inputs(LENGTHS, seed=23))
    with pytest.raises(ValueError, match=message):
        dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, TOPK, 0.1)


def test_bad_indices_and_formulation_are_rejected():
    x = ref.make_inputs([9, 4], seed=29)
    with pytest.raises(ValueError, match="int32"):
        dsa_attention(x.q, x.kv, None, None, None, x.cu_seqlens, TOPK, 0.1, indices=torch.zeros(13, TOPK, dtype=torch.int64))
    with pytest.raises(ValueError, match="loss_formulation"):
        dsa_attention(*x[:5], x.cu_seqlens, TOPK, 0.1, loss_coeff=1.0, loss_formulation="kl")
