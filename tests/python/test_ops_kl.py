"""flashdsa.indexer_kl_loss (sparse and dense) and indexer_kl_loss_rows vs the float64 reference."""

import pytest
import torch

import flashdsa
import reference as ref

BF16_TOL = 1e-2       # bf16 outputs (dq_idx)
STAT_TOL = 1e-4       # fp32 losses
GRAD_STAT_TOL = 5e-3  # fp32 gradients (dk_idx, dweights) of bf16 inputs


def sparse_case(lengths, H_I, D_I, topk, *, dtype=torch.bfloat16, device="cpu", empty_rows=(0,)):
    """Indexer inputs, top-k indices (with -1, out-of-range and duplicates) and a random target mass
    (positive, with zeros on some valid slots; its values on empty slots must be ignored)."""
    k_start, k_end = ref.causal_ranges(lengths)
    T = k_start.shape[0]
    case = ref.indexer_case(k_start, k_end, T, H_I, D_I, dtype=dtype, device=device)
    indices = ref.random_indices(k_start, k_end, topk, T, junk=0.15)
    indices[list(empty_rows)] = -1
    mass = torch.rand(T, topk, dtype=case.weights.dtype) * 3.0
    mass[torch.rand(T, topk) < 0.1] = 0.0
    return case, indices.to(device), mass.to(device)


def dense_case(lengths, H, H_I, D_I, *, d_qk=576, dtype=torch.bfloat16, device="cpu", empty_rows=(1,)):
    """Indexer inputs plus main-attention q [T, H, d_qk], kv [T, d_qk]; some rows get an empty range."""
    k_start, k_end = ref.causal_ranges(lengths)
    k_end[list(empty_rows)] = k_start[list(empty_rows)]
    T = k_start.shape[0]
    case = ref.indexer_case(k_start, k_end, T, H_I, D_I, dtype=dtype, device=device)
    q = (2.0 * torch.randn(T, H, d_qk)).to(dtype).to(device)
    kv = torch.randn(T, d_qk).to(dtype).to(device)
    return case, q, kv, ref.softmax_scale(d_qk)


def leaves(case):
    """Fresh differentiable copies of (q_idx, k_idx, weights)."""
    return tuple(x.detach().clone().requires_grad_() for x in (case.q_idx, case.k_idx, case.weights))


def reference_leaves(case):
    """float64 CPU copies of (q_idx, k_idx, weights) with requires_grad."""
    return tuple(x.detach().cpu().double().requires_grad_() for x in (case.q_idx, case.k_idx, case.weights))


def check_grads(actual_leaves, expected_leaves):
    names = ("dq_idx", "dk_idx", "dweights")
    for name, actual, expected in zip(names, actual_leaves, expected_leaves):
        assert actual.grad.dtype == actual.dtype, f"{name} must have its input's dtype"
        tol = BF16_TOL if actual.dtype == torch.bfloat16 else GRAD_STAT_TOL
        ref.assert_close(actual.grad, expected.grad, tol, name)


@pytest.mark.kernels("sparse_kl_fwd", "sparse_kl_bwd")
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("H_I,D_I", [(32, 64), (64, 128)])
def test_sparse_kl_loss(device, relu, H_I, D_I):
    case, indices, mass = sparse_case([83, 1, 17, 9], H_I, D_I, 64, device=device, empty_rows=(0, 90))
    q_idx, k_idx, weights = leaves(case)
    loss = flashdsa.indexer_kl_loss(q_idx, k_idx, weights, indices=indices, mass=mass, relu=relu, coeff=0.7)
    loss.backward()

    rq, rk, rw = reference_leaves(case)
    rows_ref = ref.sparse_kl_rows(rq, rk, rw, indices.cpu(), mass.cpu(), relu)
    nonempty = ref.valid_slots(indices.cpu(), k_idx.shape[0]).any(dim=1)
    loss_ref = 0.7 * rows_ref.sum() / nonempty.sum()
    loss_ref.backward()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    ref.assert_close(loss, loss_ref, STAT_TOL, "loss")
    check_grads((q_idx, k_idx, weights), (rq, rk, rw))

    rows = flashdsa.indexer_kl_loss_rows(case.q_idx, case.k_idx, case.weights, indices=indices, mass=mass,
                                         relu=relu)
    assert not rows.requires_grad and rows.shape == (q_idx.shape[0],)
    ref.assert_close(rows, rows_ref, STAT_TOL, "loss_rows")
    assert (rows.cpu()[~nonempty] == 0).all() and (rows_ref > 0).any()


@pytest.mark.kernels("sparse_kl_fwd", "sparse_kl_bwd")
def test_sparse_kl_row_stats(device):
    """The raw forward's row statistics ({lse of the scores, sum of the mass} over the support,
    {-inf, 0} without a target), and the raw backward from them vs without them."""
    case, indices, mass = sparse_case([83, 1, 17, 9], 32, 128, 64, device=device, empty_rows=(0, 90))
    mass[5] = 0.0  # support but no target
    args = (case.q_idx, case.k_idx, case.weights, indices, mass, True)
    rows, stats = torch.ops.flashdsa.sparse_kl_fwd(*args)

    valid = ref.valid_slots(indices.cpu(), case.k_idx.shape[0])
    scores = ref.indexer_logits(case.q_idx.cpu(), ref.gather_rows(case.k_idx.cpu(), indices.cpu()),
                                case.weights.cpu(), True)
    lse = torch.logsumexp(torch.where(valid, scores, ref.NEG_INF), dim=-1)
    mass_sum = torch.where(valid, mass.cpu().double(), 0.0).sum(dim=-1)
    live = valid.any(dim=-1) & (mass_sum > 0)
    assert not live[0] and not live[5] and live.sum() > 100
    expected = torch.stack([torch.where(live, lse, ref.NEG_INF), torch.where(live, mass_sum, 0.0)], dim=-1)
    ref.assert_close(stats, expected, STAT_TOL, "row_stats")

    grad_rows = torch.rand(rows.shape, dtype=rows.dtype, device=device)
    from_stats = torch.ops.flashdsa.sparse_kl_bwd(*args, grad_rows, stats)
    recomputed = torch.ops.flashdsa.sparse_kl_bwd(*args, grad_rows)
    for name, a, b in zip(("dq_idx", "dk_idx", "dweights"), from_stats, recomputed):
        ref.assert_close(a, b, 1e-5, name)  # dk_idx: fp32 atomics in another order on CUDA


@pytest.mark.kernels("dense_kl_fwd", "dense_kl_bwd")
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("H,H_I,D_I", [(16, 32, 64), (64, 32, 64), (16, 32, 128)])
def test_dense_kl_loss(device, relu, H, H_I, D_I):
    case, q, kv, scale = dense_case([37, 1, 12], H, H_I, D_I, device=device, empty_rows=(1, 40))
    q_idx, k_idx, weights = leaves(case)
    loss = flashdsa.indexer_kl_loss(q_idx, k_idx, weights, formulation="dense", relu=relu, coeff=1.3, q=q, kv=kv,
                                    scale=scale, k_start=case.k_start, k_end=case.k_end)
    loss.backward()

    rq, rk, rw = reference_leaves(case)
    rows_ref = ref.dense_kl_rows(q.cpu(), kv.cpu(), scale, rq, rk, rw, case.k_start.cpu(), case.k_end.cpu(), relu)
    loss_ref = 1.3 * rows_ref.sum() / (case.k_end > case.k_start).sum().item()
    loss_ref.backward()
    ref.assert_close(loss, loss_ref, STAT_TOL, "loss")
    check_grads((q_idx, k_idx, weights), (rq, rk, rw))

    rows = flashdsa.indexer_kl_loss_rows(case.q_idx, case.k_idx, case.weights, formulation="dense", relu=relu,
                                         q=q, kv=kv, scale=scale, k_start=case.k_start, k_end=case.k_end)
    ref.assert_close(rows, rows_ref, STAT_TOL, "loss_rows")
    assert rows[1] == 0 and rows[40] == 0


def test_reductions_and_normalizer():
    """mean divides by the non-empty rows or by `normalizer`; sum does not divide; gradients scale alike."""
    case, indices, mass = sparse_case([9, 5], 2, 8, 6, dtype=torch.float64, empty_rows=(0, 3))
    kwargs = dict(indices=indices, mass=mass)
    rows = flashdsa.indexer_kl_loss_rows(case.q_idx, case.k_idx, case.weights, **kwargs)
    n = int(ref.valid_slots(indices, case.k_idx.shape[0]).any(dim=1).sum())
    assert 0 < n <= case.q_idx.shape[0] - 2
    expected = {"mean": 0.5 * rows.sum() / n, "normalizer": 0.5 * rows.sum() / 20.0, "sum": 0.5 * rows.sum()}
    grads = {}
    for name, value in expected.items():
        q_idx, k_idx, weights = leaves(case)
        loss = flashdsa.indexer_kl_loss(
            q_idx, k_idx, weights, coeff=0.5, reduction="sum" if name == "sum" else "mean",
            normalizer=20.0 if name == "normalizer" else None, **kwargs)
        torch.testing.assert_close(loss, value, rtol=1e-12, atol=0)
        loss.backward()
        grads[name] = (q_idx.grad, k_idx.grad, weights.grad)
    for g_sum, g_mean, g_norm in zip(grads["sum"], grads["mean"], grads["normalizer"]):
        torch.testing.assert_close(g_mean, g_sum / n, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(g_norm, g_sum / 20.0, rtol=1e-12, atol=1e-15)


def test_target_is_detached():
    """The target's inputs get no gradient, in both formulations."""
    case, indices, mass = sparse_case([12, 7], 3, 16, 8, dtype=torch.float64)
    mass.requires_grad_()
    q_idx, k_idx, weights = leaves(case)
    flashdsa.indexer_kl_loss(q_idx, k_idx, weights, indices=indices, mass=mass).backward()
    assert mass.grad is None and q_idx.grad is not None

    case, q, kv, scale = dense_case([12, 7], 2, 3, 16, d_qk=32, dtype=torch.float64)
    q.requires_grad_()
    kv.requires_grad_()
    q_idx, k_idx, weights = leaves(case)
    flashdsa.indexer_kl_loss(q_idx, k_idx, weights, formulation="dense", q=q, kv=kv, scale=scale,
                             k_start=case.k_start, k_end=case.k_end).backward()
    assert q.grad is None and kv.grad is None and k_idx.grad is not None


@pytest.mark.parametrize("relu", [True, False])
def test_sparse_kl_gradcheck(relu):
    case, indices, mass = sparse_case([5, 3], 2, 8, 6, dtype=torch.float64, empty_rows=(4,))
    inputs = leaves(case)
    assert torch.autograd.gradcheck(
        lambda q_idx, k_idx, w: flashdsa.indexer_kl_loss(q_idx, k_idx, w, indices=indices, mass=mass, relu=relu),
        inputs)


@pytest.mark.parametrize("relu", [True, False])
def test_dense_kl_gradcheck(relu):
    case, q, kv, scale = dense_case([5, 3], 2, 2, 8, d_qk=16, dtype=torch.float64, empty_rows=(2,))
    inputs = leaves(case)
    assert torch.autograd.gradcheck(
        lambda q_idx, k_idx, w: flashdsa.indexer_kl_loss(
            q_idx, k_idx, w, formulation="dense", relu=relu, q=q, kv=kv, scale=scale, k_start=case.k_start,
            k_end=case.k_end),
        inputs)


def test_kl_loss_argument_errors():
    case, indices, mass = sparse_case([6], 2, 8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs indices= and mass="):
        flashdsa.indexer_kl_loss(case.q_idx, case.k_idx, case.weights, indices=indices)
    with pytest.raises(ValueError, match="needs q=, kv="):
        flashdsa.indexer_kl_loss(case.q_idx, case.k_idx, case.weights, formulation="dense")
    with pytest.raises(ValueError, match="formulation"):
        flashdsa.indexer_kl_loss(case.q_idx, case.k_idx, case.weights, formulation="topk", indices=indices,
                                 mass=mass)
    with pytest.raises(ValueError, match="reduction"):
        flashdsa.indexer_kl_loss(case.q_idx, case.k_idx, case.weights, reduction="max", indices=indices,
                                 mass=mass)
