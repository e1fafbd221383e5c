"""The DSA layer (flashdsa.layer) against the float64 plain-PyTorch reference of the same math."""

import pytest
import torch

import flashdsa
from flashdsa.layer import DSAAttention, dsa_attention, set_indexer_loss_scale
import layer_reference as ref

LENGTHS = [37, 101, 1, 150, 67]  # odd lengths, several longer than TOPK so the top-k selects
TOPK = 64
DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # relative error (norms) vs float64
LAYER_OPS = ("indexer_topk", "sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass",
             "sparse_kl_fwd", "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd")
GRAD_NAMES = ("dq", "dkv", "dq_idx", "dk_idx", "dweights")


def dtypes_for(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.bfloat16]


@pytest.fixture(autouse=True)
def _reset_loss_scale():
    yield
    set_indexer_loss_scale(1.0)


def run_layer_and_reference(inputs, *, relu, loss_coeff, formulation, topk=TOPK, seed=1, selection="bf16"):
    """Runs the layer and the reference, back-propagates ``Σ out·probe`` through both.

    The reference adds the KL loss to the model loss (auto-scaler with scale 1). Returns
    (layer result, reference result, layer grads, reference grads) with grads in the order
    q, kv, q_idx, k_idx, weights.
    """
    x = ref.with_grad(inputs)
    scale = x.q.shape[-1] ** -0.5
    res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, topk, scale,
                        relu=relu, loss_coeff=loss_coeff, loss_formulation=formulation, selection=selection)
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


@pytest.mark.kernels(*LAYER_OPS, "indexer_topk_fp8", "quantize_fp8")
@pytest.mark.parametrize("formulation", ["sparse", "dense"])
def test_layer_with_fp8_selection(device, formulation):
    """selection="fp8": the layer uses the FP8 selection's indices (rows longer than the 320 default
    candidates, so the quantization decides candidates) and the loss, the output and the gradients
    are the reference's for those indices (the KL loss recomputes from the unquantized inputs)."""
    dtype = torch.bfloat16
    lengths = [700, 150]
    inputs = ref.make_inputs(lengths, dtype=dtype, device=device, seed=5)
    res, expected, grads, ref_grads = run_layer_and_reference(inputs, relu=True, loss_coeff=0.3,
                                                              formulation=formulation, selection="fp8")
    k_start, k_end = flashdsa.build_key_ranges(inputs.cu_seqlens, device=device)
    want, _ = flashdsa.indexer_topk(inputs.q_idx, inputs.k_idx, inputs.weights, k_start, k_end, TOPK, selection="fp8")
    assert torch.equal(res.indices.sort(dim=1).values, want.sort(dim=1).values)
    exact, _ = flashdsa.indexer_topk(inputs.q_idx, inputs.k_idx, inputs.weights, k_start, k_end, TOPK)
    same = (res.indices.sort(dim=1).values == exact.sort(dim=1).values).float().mean().item()
    assert same > 0.95, f"the FP8 selection should mostly agree with the exact one ({same:.3f})"
    tol = DTYPE_TOL[dtype]
    ref.assert_close(res.out, expected.out, tol, "out")
    ref.assert_close(res.indexer_loss, expected.loss, tol, "KL loss")
    for name, g, e in zip(GRAD_NAMES, grads, ref_grads):
        ref.assert_close(g, e, tol, name)
    layer = DSAAttention(TOPK, 0.1, loss_coeff=0.3, selection="fp8")
    assert "selection='fp8'" in repr(layer)
    with pytest.raises(ValueError, match="selection"):
        DSAAttention(TOPK, 0.1, selection="int8")


@pytest.mark.kernels("indexer_topk_fp8", "quantize_fp8", "sparse_mla_fwd")
def test_layer_fp8_candidates(device):
    """fp8_candidates reaches the selection (the layer's indices are the op's for that count) and is
    checked up front: fp8 only, an int in [topk, 16384]."""
    inputs = ref.make_inputs([700, 150], dtype=torch.bfloat16, device=device, seed=6)
    k_start, k_end = flashdsa.build_key_ranges(inputs.cu_seqlens, device=device)
    with torch.no_grad():
        for c in (TOPK, 128):
            res = dsa_attention(inputs.q, inputs.kv, inputs.q_idx, inputs.k_idx, inputs.weights, inputs.cu_seqlens,
                                TOPK, 0.1, selection="fp8", fp8_candidates=c)
            want, _ = flashdsa.indexer_topk(inputs.q_idx, inputs.k_idx, inputs.weights, k_start, k_end, TOPK,
                                            selection="fp8", fp8_candidates=c)
            assert torch.equal(res.indices.sort(dim=1).values, want.sort(dim=1).values), c
    layer = DSAAttention(TOPK, 0.1, selection="fp8", fp8_candidates=128)
    assert "fp8_candidates=128" in repr(layer)
    for bad, match in (({"fp8_candidates": 128}, "only read with selection='fp8'"),
                       ({"selection": "fp8", "fp8_candidates": TOPK - 1}, r"\[topk=64, 16384\]"),
                       ({"selection": "fp8", "fp8_candidates": 128.0}, "must be an int")):
        with pytest.raises(ValueError, match=match):
            DSAAttention(TOPK, 0.1, **bad)


@pytest.mark.kernels("indexer_topk_fp8", "quantize_fp8", "sparse_mla_fwd")
def test_layer_fp8_band(device):
    """fp8_band reaches the selection (the layer's indices are the op's band re-score) and is checked up front:
    fp8 only, an int in [1, topk - 1]."""
    inputs = ref.make_inputs([700, 150], dtype=torch.bfloat16, device=device, seed=7)
    if device == "cuda" and inputs.k_idx.shape[-1] != 128:
        pytest.skip("the CUDA band re-score takes D_I = 128")
    k_start, k_end = flashdsa.build_key_ranges(inputs.cu_seqlens, device=device)
    with torch.no_grad():
        res = dsa_attention(inputs.q, inputs.kv, inputs.q_idx, inputs.k_idx, inputs.weights, inputs.cu_seqlens,
                            TOPK, 0.1, selection="fp8", fp8_band=TOPK // 4)
        want, none = flashdsa.indexer_topk(inputs.q_idx, inputs.k_idx, inputs.weights, k_start, k_end, TOPK,
                                           selection="fp8", fp8_band=TOPK // 4)
    assert none is None and torch.equal(res.indices.sort(dim=1).values, want.sort(dim=1).values)
    layer = DSAAttention(TOPK, 0.1, selection="fp8", fp8_band=16)
    assert "fp8_band=16" in repr(layer)
    for bad, match in (({"fp8_band": 16}, "only read with selection='fp8'"),
                       ({"selection": "fp8", "fp8_band": TOPK}, r"\[1, topk - 1"),
                       ({"selection": "fp8", "fp8_band": 0}, r"\[1, topk - 1"),
                       ({"selection": "fp8", "fp8_band": True}, r"\[1, topk - 1")):
        with pytest.raises(ValueError, match=match):
            DSAAttention(TOPK, 0.1, **bad)


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
    # Training (grad enabled, the indexer inputs require grad): the loss is computed in the backward.
    assert torch.isnan(layer.last_indexer_loss) and not layer.last_indexer_loss.requires_grad
    res.out.sum().backward()
    assert float(layer.last_indexer_loss) > 0 and not layer.last_indexer_loss.requires_grad
    assert "index_share='full'" in repr(layer)


# ---------------------------------------------------------------------------------------------
# The indexer loss computed in the backward (indexer_loss_in_backward)


def _run_loss_path(inputs, loss_in_backward, *, loss_scale, indices=None, layer=False):
    """Forward with the given loss path, then backward of Σ out·probe with the auto-scaler factor set
    between them (it is read at backward time). Returns (result, loss before backward, grads)."""
    x = ref.with_grad(inputs)
    set_indexer_loss_scale(1.0)
    if layer:
        core = DSAAttention(TOPK, 0.1, loss_coeff=0.3, indexer_loss_in_backward=loss_in_backward)
        res = core(x.q, x.kv, x.cu_seqlens, x.q_idx, x.k_idx, x.weights)
        assert core.last_indexer_loss is res.indexer_loss
    else:
        res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, TOPK, 0.1, loss_coeff=0.3,
                            indices=indices, indexer_loss_in_backward=loss_in_backward)
    before = res.indexer_loss.clone()
    set_indexer_loss_scale(loss_scale)
    probe = torch.randn(res.out.shape, generator=torch.Generator().manual_seed(7)).to(res.out)
    (res.out * probe).sum().backward()
    return res, before, [t.grad for t in x[:5]]


@pytest.mark.kernels(*LAYER_OPS)
@pytest.mark.parametrize("loss_scale", [1.0, 0.37])
def test_loss_in_backward_equals_the_forward_path(device, loss_scale):
    """Same loss (once the backward ran) and same gradients of q, kv, q_idx, k_idx, weights as the
    forward path (attention_mass + indexer_kl_loss + auto-scaler); NaN before the backward."""
    dtype, tol = (torch.float64, 1e-10) if device == "cpu" else (torch.bfloat16, 2e-2)
    inputs = ref.make_inputs(LENGTHS, dtype=dtype, device=device, seed=31)
    fwd, fwd_before, fwd_grads = _run_loss_path(inputs, False, loss_scale=loss_scale)
    # CUDA: the same top-k (the indexer may order a row differently from call to call).
    given = fwd.indices if device == "cuda" else None
    bwd, bwd_before, bwd_grads = _run_loss_path(inputs, None, loss_scale=loss_scale, indices=given)

    assert torch.isfinite(fwd_before) and torch.equal(fwd_before, fwd.indexer_loss)
    assert torch.isnan(bwd_before), "the loss of the backward path is NaN until the backward has run"
    assert bwd.indexer_loss.dtype == fwd.indexer_loss.dtype and not bwd.indexer_loss.requires_grad
    assert torch.equal(bwd.indices, fwd.indices)
    assert torch.equal(bwd.out, fwd.out)
    ref.assert_close(bwd.indexer_loss, fwd.indexer_loss, tol, "loss")
    for name, g, e in zip(GRAD_NAMES, bwd_grads, fwd_grads):
        assert g is not None and g.dtype == e.dtype, name
        ref.assert_close(g, e, tol, name)
    if device == "cpu":  # the same ops on the same values in the same order
        assert torch.equal(bwd.indexer_loss, fwd.indexer_loss)
        assert all(torch.equal(g, e) for g, e in zip(bwd_grads, fwd_grads))


def test_loss_in_backward_module_float32():
    """DSAAttention with indexer_loss_in_backward=True vs False, float32 (CPU)."""
    inputs = ref.make_inputs(LENGTHS, seed=37)
    fwd, _, fwd_grads = _run_loss_path(inputs, False, loss_scale=0.5, layer=True)
    bwd, before, bwd_grads = _run_loss_path(inputs, True, loss_scale=0.5, layer=True)
    assert torch.isnan(before) and torch.isfinite(bwd.indexer_loss)
    assert torch.equal(bwd.indexer_loss, fwd.indexer_loss)
    for name, g, e in zip(GRAD_NAMES, bwd_grads, fwd_grads):
        assert torch.equal(g, e), name


def test_loss_in_backward_skips_the_forward_loss_work(monkeypatch):
    """The backward path runs no attention_mass / KL forward in the forward: the mass comes from the
    MLA backward (sparse_mla_bwd_mass)."""
    calls = []
    for name in ("attention_mass", "indexer_kl_loss"):
        real = getattr(flashdsa.ops, name)
        monkeypatch.setattr(flashdsa.ops, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    x = ref.with_grad(ref.make_inputs(LENGTHS, seed=41))
    res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, TOPK, 0.1, loss_coeff=0.3)
    assert calls == [] and torch.isnan(res.indexer_loss)
    res.out.sum().backward()
    assert calls == [] and float(res.indexer_loss) > 0
    # Forward path on request: the loss is known at once.
    res = dsa_attention(x.q, x.kv, x.q_idx, x.k_idx, x.weights, x.cu_seqlens, TOPK, 0.1, loss_coeff=0.3,
                        indexer_loss_in_backward=False)
    assert calls == ["attention_mass", "indexer_kl_loss"] and float(res.indexer_loss) > 0


def test_loss_path_selection():
    """None picks the backward path only when a backward will need it; elsewhere the loss stays in
    the forward (e.g. evaluation under no_grad still reports it at once)."""
    x = ref.make_inputs(LENGTHS, seed=43)
    args = (x.cu_seqlens, TOPK, 0.1)
    grad_x = ref.with_grad(x)
    # Training: the backward path.
    res = dsa_attention(*grad_x[:5], *args, loss_coeff=0.3)
    assert torch.isnan(res.indexer_loss)
    # No gradients (no_grad, or no indexer input requiring grad): the forward path.
    with torch.no_grad():
        res = dsa_attention(*grad_x[:5], *args, loss_coeff=0.3)
    assert float(res.indexer_loss) > 0 and not res.out.requires_grad
    q = x.q.clone().requires_grad_()  # only the main attention is trained
    res = dsa_attention(q, x.kv, x.q_idx, x.k_idx, x.weights, *args, loss_coeff=0.3)
    assert float(res.indexer_loss) > 0
    # The dense formulation is always computed in the forward.
    res = dsa_attention(*grad_x[:5], *args, loss_coeff=0.3, loss_formulation="dense")
    assert float(res.indexer_loss) > 0


@pytest.mark.parametrize(
    "kwargs, grad, message",
    [
        (dict(loss_coeff=0.3, loss_formulation="dense"), True, 'loss_formulation="sparse"'),
        (dict(), True, "loss_coeff is None"),
        (dict(loss_coeff=0.3), False, "none of q_idx, k_idx, weights requires grad"),
        (dict(loss_coeff=0.3, no_grad=True), True, "gradients are disabled"),
    ],
)
def test_loss_in_backward_true_raises_where_it_does_not_apply(kwargs, grad, message):
    x = ref.make_inputs([9, 40], seed=47)
    if grad:
        x = ref.with_grad(x)
    kwargs = dict(kwargs)
    no_grad = kwargs.pop("no_grad", False)
    with torch.set_grad_enabled(not no_grad), pytest.raises(ValueError, match=message):
        dsa_attention(*x[:5], x.cu_seqlens, TOPK, 0.1, indexer_loss_in_backward=True, **kwargs)


def test_module_rejects_loss_in_backward_without_a_sparse_loss():
    with pytest.raises(ValueError, match="indexer_loss_in_backward=True needs a sparse indexer loss"):
        DSAAttention(TOPK, 0.1, loss_coeff=0.3, loss_formulation="dense", indexer_loss_in_backward=True)
    with pytest.raises(ValueError, match="indexer_loss_in_backward=True needs a sparse indexer loss"):
        DSAAttention(TOPK, 0.1, indexer_loss_in_backward=True)


def test_loss_in_backward_stays_nan_without_a_backward_through_out():
    """Nothing is silently wrong: a loss whose backward never ran reads NaN."""
    x = ref.with_grad(ref.make_inputs(LENGTHS, seed=53))
    res = dsa_attention(*x[:5], x.cu_seqlens, TOPK, 0.1, loss_coeff=0.3)
    other = (x.q.float() ** 2).sum()  # a backward that does not go through res.out
    other.backward()
    assert torch.isnan(res.indexer_loss)


def test_sparse_mla_with_indexer_loss_rejects_a_bad_loss_out():
    case_x = ref.make_inputs([9, 4], seed=59)
    indices = torch.zeros(13, TOPK, dtype=torch.int32)
    for bad in (torch.zeros(1), torch.zeros((), dtype=torch.float64), torch.zeros((), requires_grad=True)):
        with pytest.raises(ValueError, match="loss_out must (be a 0-dim|not require grad)"):
            flashdsa.sparse_mla_with_indexer_loss(case_x.q, case_x.kv, indices, 0.1, case_x.q_idx, case_x.k_idx,
                                                  case_x.weights, bad)


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
