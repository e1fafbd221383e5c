"""THD helpers: packing, cu_seqlens checks, causal key ranges, unpacking."""

import pytest
import torch

from flashdsa.thd import (
    causal_key_ranges,
    check_cu_seqlens,
    cu_seqlens_from_lengths,
    key_ranges_for_rows,
    pack_sequences,
    sequence_ids,
    unpack_sequences,
)
from flashdsa.reference import range_mask


def test_pack_unpack_roundtrip_and_cu_seqlens():
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 0, 17, 1, 9]
    seqs = [torch.randn(n, 3, 2, generator=gen) for n in lengths]
    packed, cu = pack_sequences(seqs)
    assert packed.shape == (32, 3, 2)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 5, 22, 23, 32]
    back = unpack_sequences(packed, cu)
    assert [b.shape[0] for b in back] == lengths
    for a, b in zip(seqs, back):
        assert torch.equal(a, b)


def test_pack_keeps_gradients():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(2, 4, requires_grad=True)
    packed, _ = pack_sequences([a, b])
    (packed * torch.arange(5.0)[:, None]).sum().backward()
    assert torch.equal(a.grad, torch.arange(3.0)[:, None].expand(3, 4))
    assert torch.equal(b.grad, torch.arange(3.0, 5.0)[:, None].expand(2, 4))


def test_pack_rejects_mismatched_features():
    with pytest.raises(ValueError, match="sequence 1"):
        pack_sequences([torch.randn(2, 4), torch.randn(2, 5)])


def test_causal_key_ranges_match_reference_mask():
    cu = cu_seqlens_from_lengths([7, 1, 0, 12, 3])
    k_start, k_end = causal_key_ranges(cu)
    assert k_start.dtype == torch.int32 and k_end.dtype == torch.int32
    # the mask written out independently: one lower triangle per sequence on the diagonal
    blocks = [torch.ones(n, n, dtype=torch.bool).tril() for n in (7, 1, 0, 12, 3)]
    assert torch.equal(range_mask(k_start, k_end, 23), torch.block_diag(*blocks))


def test_key_ranges_for_rows_pads_to_empty():
    cu_pad = torch.tensor([0, 8, 16])
    rows = torch.tensor([0, 5, 6, 7, 8, 13, 15])
    k_start, k_end = key_ranges_for_rows(cu_pad, rows, valid_lengths=torch.tensor([6, 6]))
    assert k_start.tolist() == [0, 0, 0, 0, 8, 8, 8]
    # rows 6, 7 (positions 6, 7 of seq 0) and 15 (position 7 of seq 1) are padding: empty ranges
    assert k_end.tolist() == [1, 6, 0, 0, 9, 14, 8]


def test_sequence_ids_skip_empty_sequences():
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    assert sequence_ids(cu, torch.arange(5)).tolist() == [0, 0, 0, 2, 2]


@pytest.mark.parametrize(
    "cu, kwargs, message",
    [
        ([1, 4], {}, r"cu_seqlens\[0\] must be 0"),
        ([0, 5, 3], {}, "non-decreasing"),
        ([0, 3, 5], {"num_tokens": 6}, "must equal the number of packed query tokens"),
        ([0, 3, 9], {"num_keys": 8}, "key tensor has only 8 rows"),
        ([0], {}, "B\\+1 >= 2"),
    ],
)
def test_check_cu_seqlens_errors(cu, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_cu_seqlens(torch.tensor(cu, dtype=torch.int32), **kwargs)


def test_check_cu_seqlens_rejects_float():
    with pytest.raises(ValueError, match="integer"):
        check_cu_seqlens(torch.tensor([0.0, 2.0]))
