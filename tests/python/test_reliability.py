"""No silent wrong answers (issue 17): one test per case found by the bad-input survey.

- NaN propagation (docs/reliability.md "The NaN rule"): a NaN in an input reaches every output
  that depends on it (out, lse, selected scores, loss value, gradients); a key with a NaN index
  score is selected (NaN ranks above every number) and reports its NaN score.
- Double backward through every autograd Function raises an error naming the op.
- Tensors on more than one device are refused before any kernel or fake kernel runs.
- One ``cu_seqlens`` contract (integer tensor or sequence of ints, floats refused).
- ``loss_out`` that requires grad: the message says so.

Shapes are within the CUDA kernels' limits, so every test also runs on the GPU (the ``device``
fixture skips the CUDA case without one).
"""

import math

import pytest
import torch

import flashdsa
from flashdsa.layer import DSAAttention, dsa_attention, set_indexer_loss_scale
from flashdsa.thd import causal_key_ranges, check_cu_seqlens, unpack_sequences
from flashdsa.context_parallel import pad_cu_seqlens

ops = torch.ops.flashdsa
NAN = float("nan")
ALL_OPS = flashdsa.ops.OP_NAMES
H, D_QK, K, H_I, D_I = 16, 576, 64, 32, 64
LENGTHS = [70, 30]  # the first sequence is longer than K: the top-k really selects
T = sum(LENGTHS)


@pytest.fixture(autouse=True)
def _reset_loss_scale():
    yield
    set_indexer_loss_scale(1.0)


def make_case(device, dtype=torch.bfloat16):
    """Random inputs of every op (CUDA-sized, bf16) and causal THD ranges/indices."""
    cu = torch.tensor([0, LENGTHS[0], T], dtype=torch.int32)
    k_start, k_end = flashdsa.build_key_ranges(cu, device=device)
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    case = dict(
        cu=cu,
        q=(2 * torch.randn(T, H, D_QK)).to(dtype).to(device),
        kv=torch.randn(T, D_QK).to(dtype).to(device),
        q_idx=torch.randn(T, H_I, D_I).to(dtype).to(device),
        k_idx=torch.randn(T, D_I).to(dtype).to(device),
        weights=(torch.randn(T, H_I) * D_I ** -0.5).to(stat).to(device),
        k_start=k_start,
        k_end=k_end,
        scale=D_QK ** -0.5,
    )
    case["indices"], _ = flashdsa.indexer_topk(case["q_idx"], case["k_idx"], case["weights"], k_start, k_end, K)
    case["mass"] = torch.rand(T, K, dtype=stat, device=device)
    return case


def leaves(case, *names):
    return [case[n].detach().clone().requires_grad_(True) for n in names]


# ---------------------------------------------------------------------------------------------
# NaN propagation


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd")
def test_nan_in_q_gives_nan_lse_not_minus_inf(device):
    c = make_case(device)
    q = c["q"].clone()
    q[80, 3, 7] = NAN  # one element of row 80, head 3: every score of that (row, head) is NaN
    q_leaf = q.requires_grad_(True)
    out, lse = flashdsa.sparse_mla(q_leaf, c["kv"], c["indices"], c["scale"])
    assert torch.isnan(lse[80, 3]), f"lse = {lse[80, 3].item()} (NaN q must not read as an empty row)"
    assert torch.isnan(out[80, 3]).all()
    others = torch.ones_like(lse, dtype=torch.bool)
    others[80, 3] = False
    assert torch.isfinite(lse[others]).all() and torch.isfinite(out[others]).all()
    out.float().sum().backward()
    assert torch.isnan(q_leaf.grad[80, 3]).all()


@pytest.mark.kernels("sparse_mla_fwd")
def test_nan_in_kv_reaches_every_row_that_selects_it(device):
    c = make_case(device)
    kv = c["kv"].clone()
    key = int(c["indices"][50, 0])
    kv[key, 0] = NAN
    out, lse = flashdsa.sparse_mla(c["q"], kv, c["indices"], c["scale"])
    uses = ((c["indices"] == key).any(dim=1))
    assert torch.isnan(lse[uses]).all() and torch.isnan(out[uses]).all()
    assert torch.isfinite(lse[~uses & (c["k_end"] > c["k_start"])]).all()


@pytest.mark.kernels("indexer_topk")
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("where", ["q_idx", "k_idx"])
def test_nan_index_score_is_selected_and_reported(device, relu, where):
    c = make_case(device)
    q_idx, k_idx = c["q_idx"].clone(), c["k_idx"].clone()
    t, bad_key = 69, 5  # row 69 sees keys [0, 70): more than K, so the selection matters
    if where == "k_idx":
        k_idx[bad_key, 0] = NAN
    else:
        q_idx[t, 0, 0] = NAN
    indices, scores = flashdsa.indexer_topk(q_idx, k_idx, c["weights"], c["k_start"], c["k_end"], K, relu=relu)
    if where == "k_idx":
        # every row that sees the key selects it first, with a NaN score; nothing else is NaN
        sees = (c["k_start"] <= bad_key) & (bad_key < c["k_end"])
        selected = (indices == bad_key)
        assert selected.any(dim=1)[sees].all(), "a key with a NaN score must be selected"
        assert torch.isnan(scores[selected]).all()
        assert not torch.isnan(scores[~selected]).any()
    else:
        assert torch.isnan(scores[t]).all(), "a NaN query row reports NaN scores"
        assert not torch.isnan(scores[:t]).any()


@pytest.mark.kernels("sparse_kl_fwd", "sparse_kl_bwd")
@pytest.mark.parametrize("relu", [True, False])
def test_nan_index_input_makes_the_sparse_loss_nan(device, relu):
    c = make_case(device)
    q_idx = c["q_idx"].clone()
    q_idx[10, 2, 3] = NAN
    q_leaf, k_leaf, w_leaf = leaves(dict(c, q_idx=q_idx), "q_idx", "k_idx", "weights")
    rows = flashdsa.indexer_kl_loss_rows(q_leaf, k_leaf, w_leaf, indices=c["indices"], mass=c["mass"], relu=relu)
    assert torch.isnan(rows[10]) and torch.isfinite(rows[torch.arange(T) != 10]).all()
    loss = flashdsa.indexer_kl_loss(q_leaf, k_leaf, w_leaf, indices=c["indices"], mass=c["mass"], relu=relu)
    assert torch.isnan(loss)
    loss.backward()
    assert torch.isnan(q_leaf.grad[10].float()).any() and torch.isnan(w_leaf.grad[10]).any()


@pytest.mark.kernels("sparse_kl_fwd", "sparse_kl_bwd")
def test_nan_in_mass_makes_the_loss_nan(device):
    c = make_case(device)
    mass = c["mass"].clone()
    mass[20, :] = NAN  # a whole row: no valid-looking target is left in it
    mass[40, 0] = NAN  # one slot
    q_leaf, k_leaf, w_leaf = leaves(c, "q_idx", "k_idx", "weights")
    rows = flashdsa.indexer_kl_loss_rows(q_leaf, k_leaf, w_leaf, indices=c["indices"], mass=mass)
    assert torch.isnan(rows[20]) and torch.isnan(rows[40])
    assert torch.isfinite(rows[[t for t in range(T) if t not in (20, 40)]]).all()
    loss = flashdsa.indexer_kl_loss(q_leaf, k_leaf, w_leaf, indices=c["indices"], mass=mass)
    assert torch.isnan(loss), "the loss value must be NaN when its gradient is"
    loss.backward()
    assert torch.isnan(w_leaf.grad[20]).all() and torch.isnan(q_leaf.grad[20].float()).all()


@pytest.mark.kernels("dense_kl_fwd", "dense_kl_bwd")
def test_nan_in_q_makes_the_dense_loss_nan(device):
    c = make_case(device)
    q = c["q"].clone()
    q[15, 0, 0] = NAN
    q_leaf, k_leaf, w_leaf = leaves(c, "q_idx", "k_idx", "weights")
    rows = flashdsa.indexer_kl_loss_rows(q_leaf, k_leaf, w_leaf, formulation="dense", q=q, kv=c["kv"],
                                         scale=c["scale"], k_start=c["k_start"], k_end=c["k_end"])
    assert torch.isnan(rows[15]) and torch.isfinite(rows[torch.arange(T) != 15]).all()


@pytest.mark.kernels(*ALL_OPS)
@pytest.mark.parametrize("in_backward", [False, True])
def test_nan_in_q_makes_the_layer_loss_nan(device, in_backward):
    c = make_case(device)
    q = c["q"].clone()
    q[80, 0, 0] = NAN
    q_leaf, kv_leaf, qi_leaf, ki_leaf, w_leaf = leaves(dict(c, q=q), "q", "kv", "q_idx", "k_idx", "weights")
    res = dsa_attention(q_leaf, kv_leaf, qi_leaf, ki_leaf, w_leaf, c["cu"], K, c["scale"], loss_coeff=0.5,
                        indexer_loss_in_backward=in_backward)
    res.out.float().sum().backward()
    assert torch.isnan(res.indexer_loss), f"indexer loss {res.indexer_loss.item()} with a NaN in q"
    assert torch.isnan(w_leaf.grad[80]).any()


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd_mass", "sparse_kl_fwd", "sparse_kl_bwd")
def test_nan_mass_from_the_mla_backward_makes_the_loss_nan(device):
    c = make_case(device)
    dout_nan = torch.zeros(T, H, D_QK - 64, dtype=c["q"].dtype, device=device)
    q = c["q"].clone()
    q[30, 5, 0] = NAN
    q_leaf, qi_leaf, ki_leaf, w_leaf = leaves(dict(c, q=q), "q", "q_idx", "k_idx", "weights")
    loss_out = torch.zeros((), dtype=torch.float32, device=device)
    out, _ = flashdsa.sparse_mla_with_indexer_loss(q_leaf, c["kv"], c["indices"], c["scale"], qi_leaf, ki_leaf,
                                                   w_leaf, loss_out)
    out.backward(dout_nan)
    assert torch.isnan(loss_out)


def test_nan_rule_on_the_cpu_in_float64():
    """The same rule in float64 (CPU only): all-NaN rows, NaN weights, NaN-only candidates."""
    c = make_case("cpu", torch.float64)
    w = c["weights"].clone()
    w[5, 0] = NAN
    indices, scores = flashdsa.indexer_topk(c["q_idx"], c["k_idx"], w, c["k_start"], c["k_end"], K)
    visible = int(c["k_end"][5] - c["k_start"][5])
    assert torch.isnan(scores[5, :visible]).all() and (scores[5, visible:] == -math.inf).all()
    assert sorted(indices[5, :visible].tolist()) == list(range(visible))


# ---------------------------------------------------------------------------------------------
# Double backward


def _second_order(fn, *inputs):
    """First-order grads with create_graph=True, then a backward through them."""
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, create_graph=True, allow_unused=True)
    total = sum(g.float().sum() for g in grads if g is not None)
    total.backward()


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd")
def test_double_backward_sparse_mla_raises(device):
    c = make_case(device)
    q, kv = leaves(c, "q", "kv")
    # deterministic: the two first-order runs below must agree bitwise (CUDA dkv uses atomics otherwise)
    fn = lambda q, kv: flashdsa.sparse_mla(q, kv, c["indices"], c["scale"], deterministic=True)[0].float().pow(2).sum()
    with pytest.raises(RuntimeError, match="flashdsa.sparse_mla does not support double backward"):
        _second_order(fn, q, kv)
    # create_graph=True for first-order use keeps working and gives the same gradients
    q2, kv2 = leaves(c, "q", "kv")
    g_graph = torch.autograd.grad(fn(q2, kv2), (q2, kv2), create_graph=True)
    g_plain = torch.autograd.grad(fn(q2, kv2), (q2, kv2))
    for a, b in zip(g_graph, g_plain):
        assert torch.equal(a.detach(), b)


@pytest.mark.kernels("sparse_kl_fwd", "sparse_kl_bwd", "dense_kl_fwd", "dense_kl_bwd")
@pytest.mark.parametrize("formulation", ["sparse", "dense"])
def test_double_backward_indexer_kl_loss_raises(device, formulation):
    c = make_case(device)
    qi, ki, w = leaves(c, "q_idx", "k_idx", "weights")
    extra = (dict(indices=c["indices"], mass=c["mass"]) if formulation == "sparse" else
             dict(q=c["q"], kv=c["kv"], scale=c["scale"], k_start=c["k_start"], k_end=c["k_end"]))
    fn = lambda qi, ki, w: flashdsa.indexer_kl_loss(qi, ki, w, formulation=formulation, **extra)
    with pytest.raises(RuntimeError, match=rf"flashdsa.indexer_kl_loss \({formulation}\) does not support double"):
        _second_order(fn, qi, ki, w)


@pytest.mark.kernels(*ALL_OPS)
@pytest.mark.parametrize("in_backward", [False, True])
def test_double_backward_layer_raises(device, in_backward):
    c = make_case(device)
    q, kv, qi, ki, w = leaves(c, "q", "kv", "q_idx", "k_idx", "weights")
    layer = DSAAttention(K, c["scale"], loss_coeff=0.1, indexer_loss_in_backward=in_backward)
    fn = lambda q, kv, qi, ki, w: layer(q, kv, c["cu"], qi, ki, w).out.float().pow(2).sum()
    with pytest.raises(RuntimeError, match="does not support double backward"):
        _second_order(fn, q, kv, qi, ki, w)


def test_double_backward_through_the_loss_auto_scaler_raises():
    """Differentiated again, a path through the output would inject the loss's gradient twice
    (second-order gradient off by d loss / dx): the auto-scaler refuses instead."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = flashdsa.DSAIndexerLossAutoScaler.apply(x * 2, (x ** 3).sum())
    (g,) = torch.autograd.grad((y ** 2).sum(), x, create_graph=True)
    torch.testing.assert_close(g.detach(), 8 * x.detach() + 3 * x.detach() ** 2)  # first order is right
    with pytest.raises(RuntimeError, match="DSAIndexerLossAutoScaler does not support double backward"):
        g.sum().backward()


# ---------------------------------------------------------------------------------------------
# One device per call


def _device_cases(c):
    """(name, raw, call) for every public function and raw op, each given kv / k_idx on another device."""
    lse = torch.zeros(T, H, device=c["q"].device)
    return [
        ("sparse_mla", False, lambda kv, ki: flashdsa.sparse_mla(c["q"], kv, c["indices"], c["scale"])),
        ("attention_mass", False, lambda kv, ki: flashdsa.attention_mass(c["q"], kv, c["indices"], lse, 1.0)),
        ("indexer_topk", False, lambda kv, ki: flashdsa.indexer_topk(c["q_idx"], ki, c["weights"], c["k_start"],
                                                                     c["k_end"], K)),
        ("indexer_topk", False, lambda kv, ki: flashdsa.indexer_topk(c["q_idx"], ki, c["weights"], c["k_start"],
                                                                     c["k_end"], K, selection="fp8")),
        ("quantize_indexer_fp8", False, lambda kv, ki: flashdsa.quantize_indexer_fp8(c["q_idx"], ki)),
        ("indexer_kl_loss", False, lambda kv, ki: flashdsa.indexer_kl_loss(c["q_idx"], ki, c["weights"],
                                                                           indices=c["indices"], mass=c["mass"])),
        ("indexer_kl_loss", False, lambda kv, ki: flashdsa.indexer_kl_loss(
            c["q_idx"], c["k_idx"], c["weights"], formulation="dense", q=c["q"], kv=kv, scale=1.0,
            k_start=c["k_start"], k_end=c["k_end"])),
        ("sparse_mla_with_indexer_loss", False, lambda kv, ki: flashdsa.sparse_mla_with_indexer_loss(
            c["q"], kv, c["indices"], 1.0, c["q_idx"], c["k_idx"], c["weights"],
            torch.zeros((), device=c["q"].device))),
        ("dsa_attention", False, lambda kv, ki: dsa_attention(c["q"], kv, c["q_idx"], c["k_idx"], c["weights"],
                                                              c["cu"], K, 1.0)),
        ("sparse_mla_fwd", True, lambda kv, ki: ops.sparse_mla_fwd(c["q"], kv, c["indices"], 1.0)),
        ("attention_mass", True, lambda kv, ki: ops.attention_mass(c["q"], kv, c["indices"], lse, 1.0)),
        ("indexer_topk", True, lambda kv, ki: ops.indexer_topk(c["q_idx"], ki, c["weights"], c["k_start"],
                                                               c["k_end"], K, True)),
        ("sparse_kl_fwd", True, lambda kv, ki: ops.sparse_kl_fwd(c["q_idx"], ki, c["weights"], c["indices"],
                                                                 c["mass"], True)),
        ("dense_kl_fwd", True, lambda kv, ki: ops.dense_kl_fwd(c["q"], kv, 1.0, c["q_idx"], c["k_idx"],
                                                               c["weights"], c["k_start"], c["k_end"], True)),
    ]


@pytest.mark.kernels(*ALL_OPS)
def test_mixed_devices_are_refused(device):
    """CPU run: the other device is meta (which used to return uninitialised memory). CUDA run: CPU
    (raw ops then reach the C++ binding, whose own check raises a RuntimeError naming the device)."""
    c = make_case(device)
    other = "meta" if device == "cpu" else "cpu"
    kv, k_idx = c["kv"].to(other), c["k_idx"].to(other)
    for name, raw, call in _device_cases(c):
        with pytest.raises((ValueError, RuntimeError), match="device") as info:
            call(kv, k_idx)
        if not raw or other == "meta":
            assert info.type is ValueError and f"flashdsa.{name}: all tensors must be on one device" in str(
                info.value), f"{name}: {info.value}"


def test_fake_kernels_refuse_mixed_devices_under_meta_dispatch():
    """All-meta inputs still trace (torch.compile's fake kernels); mixing is refused in every fake kernel."""
    q, kv = torch.empty(4, 2, 72, device="meta"), torch.empty(4, 72, device="meta")
    idx = torch.zeros(4, 8, dtype=torch.int32, device="meta")
    out, lse = ops.sparse_mla_fwd(q, kv, idx, 1.0)
    assert out.shape == (4, 2, 8) and out.device.type == "meta"
    idx_cpu, lse_cpu = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 2)
    for call in (lambda: ops.sparse_mla_bwd(q, kv, idx_cpu, 1.0, out, lse, out, False),
                 lambda: ops.sparse_mla_bwd_mass(q, kv, idx, 1.0, out, lse_cpu, out, False),
                 lambda: ops.sparse_kl_bwd(q, kv[:, :8], torch.zeros(4, 2), idx, torch.zeros(4, 8), True,
                                           torch.zeros(4))):
        with pytest.raises(ValueError, match="all tensors must be on one device"):
            call()


# ---------------------------------------------------------------------------------------------
# cu_seqlens contract, messages


@pytest.mark.parametrize("bad", [torch.tensor([0.0, 2.5]), torch.tensor([0.0, 2.0]), [0, 2.0], [0.0, 2.0],
                                 torch.tensor([False, True])])
def test_float_cu_seqlens_are_refused_everywhere(bad):
    calls = [lambda: flashdsa.build_key_ranges(bad), lambda: check_cu_seqlens(bad),
             lambda: causal_key_ranges(bad), lambda: pad_cu_seqlens(bad, 2),
             lambda: unpack_sequences(torch.zeros(2, 3), bad)]
    for call in calls:
        with pytest.raises(ValueError, match="integer"):
            call()


def test_cu_seqlens_lists_are_accepted_everywhere():
    cu_list = [0, 3, 3, 7]
    cu = torch.tensor(cu_list, dtype=torch.int32)
    assert torch.equal(check_cu_seqlens(cu_list), check_cu_seqlens(cu))
    for a, b in zip(flashdsa.build_key_ranges(cu_list), flashdsa.build_key_ranges(cu)):
        assert torch.equal(a, b)
    for a, b in zip(causal_key_ranges(cu_list), causal_key_ranges(cu)):
        assert torch.equal(a, b)
    assert torch.equal(pad_cu_seqlens(cu_list, 4), pad_cu_seqlens(cu, 4))
    assert [p.shape[0] for p in unpack_sequences(torch.zeros(7, 2), cu_list)] == [3, 0, 4]
    with pytest.raises(TypeError, match="sequence of ints"):
        check_cu_seqlens("0,3")


@pytest.mark.kernels("indexer_topk", "sparse_mla_fwd")
def test_layer_accepts_a_cu_seqlens_list(device):
    c = make_case(device)
    with torch.no_grad():
        from_list = dsa_attention(c["q"], c["kv"], c["q_idx"], c["k_idx"], c["weights"], c["cu"].tolist(), K,
                                  c["scale"])
        from_tensor = dsa_attention(c["q"], c["kv"], c["q_idx"], c["k_idx"], c["weights"], c["cu"], K, c["scale"])
    # (the CUDA indexer's slot order may differ between calls: compare the sets, and out up to summation order)
    assert torch.equal(from_list.indices.sort(dim=1).values, from_tensor.indices.sort(dim=1).values)
    torch.testing.assert_close(from_list.out, from_tensor.out, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="integer"):
        dsa_attention(c["q"], c["kv"], c["q_idx"], c["k_idx"], c["weights"], c["cu"].float(), K, c["scale"])


def test_loss_out_requiring_grad_is_named():
    c = make_case("cpu")
    loss_out = torch.zeros((), requires_grad=True)
    with pytest.raises(ValueError, match="loss_out must not require grad"):
        flashdsa.sparse_mla_with_indexer_loss(c["q"], c["kv"], c["indices"], 1.0, c["q_idx"], c["k_idx"],
                                              c["weights"], loss_out)
    with pytest.raises(ValueError, match=r"0-dim torch.float32 tensor .* got torch.float64"):
        flashdsa.sparse_mla_with_indexer_loss(c["q"], c["kv"], c["indices"], 1.0, c["q_idx"], c["k_idx"],
                                              c["weights"], torch.zeros((), dtype=torch.float64))
