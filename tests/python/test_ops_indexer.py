"""flashdsa.indexer_topk vs the float64 reference (scores compared as multisets at the threshold)."""

import pytest
import torch

import flashdsa
import reference as ref

pytestmark = pytest.mark.kernels("indexer_topk")


def check_topk(indices, scores, q_idx, k_idx, weights, k_start, k_end, topk, relu):
    """Checks one indexer_topk result against the reference scores.

    Per row: the first min(K, visible) slots hold distinct visible keys and the rest are -1; the
    returned scores match the reference scores of those keys; and the selected keys' reference
    scores are, as a multiset, the K largest (equal up to a tolerance at the threshold).
    """
    indices, scores = indices.cpu(), scores.cpu()
    expected = ref.indexer_scores(q_idx.cpu(), k_idx.cpu(), weights.cpu(), k_start.cpu(), k_end.cpu(), relu)
    assert indices.dtype == torch.int32 and indices.shape == (q_idx.shape[0], topk)
    assert scores.dtype == weights.dtype and scores.shape == indices.shape
    visible = (k_end - k_start).cpu()
    for t in range(indices.shape[0]):
        n = min(topk, int(visible[t]))
        row, row_scores = indices[t].long(), scores[t]
        assert (row[n:] == -1).all(), f"row {t}: slots after the {n} visible keys must be -1"
        assert torch.isneginf(row_scores[n:]).all(), f"row {t}: empty slots must score -inf"
        chosen = row[:n]
        assert ((chosen >= int(k_start[t])) & (chosen < int(k_end[t]))).all(), f"row {t}: key outside its range"
        assert chosen.unique().numel() == n, f"row {t}: duplicated keys"
        if n == 0:
            continue
        row_ref = expected[t]
        tol = 1e-5 * (1.0 + row_ref[torch.isfinite(row_ref)].abs().max().item())
        assert (row_scores[:n].double() - row_ref[chosen]).abs().max() <= tol, f"row {t}: returned scores"
        best = row_ref.topk(n).values.sort().values
        picked = row_ref[chosen].sort().values
        assert (picked - best).abs().max() <= tol, f"row {t}: selection differs from the top-{n} beyond {tol:.2e}"


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("H_I,D_I", [(32, 64), (64, 128), (32, 128)])
def test_indexer_topk_thd(device, relu, H_I, D_I):
    """Packed causal sequences of odd lengths: early rows see fewer keys than K (-1 padding)."""
    k_start, k_end = ref.causal_ranges([97, 1, 30, 13])
    T = k_start.shape[0]
    case = ref.indexer_case(k_start, k_end, T, H_I, D_I, device=device)
    indices, scores = flashdsa.indexer_topk(case.q_idx, case.k_idx, case.weights, case.k_start, case.k_end,
                                            64, relu=relu)
    check_topk(indices, scores, case.q_idx, case.k_idx, case.weights, k_start, k_end, 64, relu)


@pytest.mark.parametrize("topk", [64, 2048, 4096])
def test_indexer_topk_ranges(device, topk):
    """Arbitrary ranges over many keys: empty rows, rows shorter and longer than K (up to 4096)."""
    T, T_kv = 24, topk + 400
    k_start = torch.randint(0, 300, (T,), dtype=torch.int32)
    k_end = torch.minimum(k_start + torch.randint(0, T_kv, (T,), dtype=torch.int32),
                          torch.tensor(T_kv, dtype=torch.int32))
    k_end[:3] = k_start[:3]                      # empty rows
    k_start[3], k_end[3] = 0, T_kv               # the whole key set
    k_end[4] = k_start[4] + topk                 # exactly K visible
    k_end[5] = k_start[5] + topk - 1             # one fewer than K
    case = ref.indexer_case(k_start, k_end, T_kv, 32, 64, device=device)
    indices, scores = flashdsa.indexer_topk(case.q_idx, case.k_idx, case.weights, case.k_start, case.k_end, topk)
    check_topk(indices, scores, case.q_idx, case.k_idx, case.weights, k_start, k_end, topk, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_indexer_topk_cpu_dtypes_and_small_shapes(dtype):
    """The CPU backend also takes fp32/fp64 and small head counts and dims (used by references)."""
    k_start, k_end = ref.causal_ranges([11, 6])
    case = ref.indexer_case(k_start, k_end, 17, 3, 16, dtype=dtype)
    indices, scores = flashdsa.indexer_topk(case.q_idx, case.k_idx, case.weights, k_start, k_end, 8)
    assert scores.dtype == case.weights.dtype
    check_topk(indices, scores, case.q_idx, case.k_idx, case.weights, k_start, k_end, 8, True)


def test_indexer_topk_strided_inputs_and_weight_cast(device):
    """Views with strided rows and bf16 weights give the result of the contiguous fp32 inputs."""
    k_start, k_end = ref.causal_ranges([40, 9])
    case = ref.indexer_case(k_start, k_end, 49, 32, 64, device=device)
    q_wide = torch.randn(49, 32, 80, device=device, dtype=torch.bfloat16)
    q_wide[..., :64] = case.q_idx
    k_t = case.k_idx.t().contiguous().t()        # last dim strided: copied by the op
    weights_bf16 = case.weights.to(torch.bfloat16)
    indices, scores = flashdsa.indexer_topk(q_wide[..., :64], k_t, weights_bf16, case.k_start, case.k_end, 64)
    check_topk(indices, scores, case.q_idx, case.k_idx, weights_bf16.float(), k_start, k_end, 64, True)


def test_indexer_topk_has_no_grad(device):
    k_start, k_end = ref.causal_ranges([20])
    case = ref.indexer_case(k_start, k_end, 20, 32, 64, device=device)
    q_idx = case.q_idx.requires_grad_()
    _, scores = flashdsa.indexer_topk(q_idx, case.k_idx, case.weights, case.k_start, case.k_end, 64)
    assert not scores.requires_grad
