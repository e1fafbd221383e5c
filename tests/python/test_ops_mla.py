"""flashdsa.sparse_mla (forward, backward) and flashdsa.attention_mass vs the float64 reference."""

import pytest
import torch

import flashdsa
import reference as ref

# Relative-error-norm tolerances: bf16 outputs carry a rounding error of 2^-9 per element; fp32
# statistics are computed from the same bf16 inputs with fp32 accumulation.
BF16_TOL = 1e-2
STAT_TOL = 1e-4
# Packed sequences of odd lengths; the first is longer than K = 64 (full rows), the others shorter.
LENGTHS = [83, 1, 17, 9]


def reference_grads(case, dout):
    """(out, lse, dq, dkv) of the float64 reference on the same (bf16-rounded) inputs."""
    q = case.q.detach().cpu().double().requires_grad_()
    kv = case.kv.detach().cpu().double().requires_grad_()
    out, lse = ref.sparse_mla(q, kv, case.indices.cpu(), case.scale)
    out.backward(dout.cpu().double())
    return out, lse, q.grad, kv.grad


def with_empty_rows(case, rows):
    """The case with every slot of `rows` empty (-1)."""
    case.indices[rows] = -1
    return case


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd")
@pytest.mark.parametrize("H", [16, 32, 64, 128])
def test_sparse_mla_fwd_bwd(device, H):
    """Real dims (D_qk = 576, D_v = 512); -1, out-of-range and duplicated indices; empty rows."""
    case = with_empty_rows(ref.attention_case(LENGTHS, H, 64, device=device, junk=0.15, extra_keys=5), [0, 90])
    q = case.q.clone().requires_grad_()
    kv = case.kv.clone().requires_grad_()
    out, lse = flashdsa.sparse_mla(q, kv, case.indices, case.scale)
    assert out.dtype == torch.bfloat16 and out.shape == (q.shape[0], H, 512)
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], H) and not lse.requires_grad

    dout = torch.randn_like(out)
    out.backward(dout)
    out_ref, lse_ref, dq_ref, dkv_ref = reference_grads(case, dout)
    ref.assert_close(out, out_ref, BF16_TOL, "out")
    ref.assert_close(lse, lse_ref, STAT_TOL, "lse")
    assert torch.isneginf(lse[[0, 90]]).all() and (out[[0, 90]] == 0).all()
    ref.assert_close(q.grad, dq_ref, BF16_TOL, "dq")
    ref.assert_close(kv.grad, dkv_ref, BF16_TOL, "dkv")
    assert q.grad.dtype == torch.bfloat16 and kv.grad.dtype == torch.bfloat16
    # Keys nobody selected get exactly zero gradient.
    selected = torch.zeros(kv.shape[0], dtype=torch.bool)
    idx = case.indices.cpu().long()
    selected[idx[(idx >= 0) & (idx < kv.shape[0])]] = True
    assert (kv.grad.cpu()[~selected] == 0).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_sparse_mla_cpu_dtypes(dtype, tol):
    """fp32/fp64 on the CPU match the reference to their own precision (dq, dkv in the input dtype)."""
    case = ref.attention_case([29, 6], 16, 64, d_qk=576, dtype=dtype, junk=0.2)
    q, kv = case.q.clone().requires_grad_(), case.kv.clone().requires_grad_()
    out, lse = flashdsa.sparse_mla(q, kv, case.indices, case.scale)
    dout = torch.randn_like(out)
    out.backward(dout)
    out_ref, lse_ref, dq_ref, dkv_ref = reference_grads(case, dout)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    for name, actual, expected in [("out", out, out_ref), ("lse", lse, lse_ref), ("dq", q.grad, dq_ref),
                                   ("dkv", kv.grad, dkv_ref)]:
        ref.assert_close(actual, expected, tol, name)


def test_sparse_mla_gradcheck_small():
    """float64 gradcheck in q and kv at small CPU dims (D_qk = 72, D_v = 8), junk indices included."""
    case = ref.attention_case([4, 3], 2, 5, d_qk=72, dtype=torch.float64, junk=0.3, extra_keys=2)
    q, kv = case.q.requires_grad_(), case.kv.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, kv: flashdsa.sparse_mla(q, kv, case.indices, case.scale)[0], (q, kv))


def test_sparse_mla_gradcheck_real_dims():
    """float64 gradcheck (fast mode: random directions) at D_qk = 576, H = 16."""
    case = ref.attention_case([3, 2], 16, 64, dtype=torch.float64, junk=0.1)
    q, kv = case.q.requires_grad_(), case.kv.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, kv: flashdsa.sparse_mla(q, kv, case.indices, case.scale)[0], (q, kv), fast_mode=True)


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd")
def test_sparse_mla_deterministic_dkv(device):
    """deterministic=True: dkv is bitwise identical over runs (many rows hit the same keys)."""
    H = 64 if device == "cuda" else 16  # the CPU backend is deterministic by construction: keep it cheap
    case = ref.attention_case([120, 7], H, 128, device=device, junk=0.1)
    dout = torch.randn(case.q.shape[0], H, 512, device=device, dtype=torch.bfloat16)
    grads = []
    for _ in range(3):
        kv = case.kv.clone().requires_grad_()
        out, _ = flashdsa.sparse_mla(case.q, kv, case.indices, case.scale, deterministic=True)
        out.backward(dout)
        grads.append(kv.grad)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def causal_packed_indices(T, K, seq_len, generator):
    """Top-k-like rows of packed causal sequences: row t draws min(K, visible) keys of its own
    sequence's prefix (with repeats); the other slots are -1."""
    t = torch.arange(T)
    start = t - t % seq_len
    visible = (t - start + 1)[:, None]
    draw = (torch.rand(T, K, generator=generator) * visible).long().clamp_max(visible - 1)
    idx = start[:, None] + draw
    return torch.where(torch.arange(K)[None, :] < visible, idx, torch.full_like(idx, -1)).int()


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd")
def test_sparse_mla_bwd_at_scale_fast_equals_deterministic(device):
    """T_kv = 20480 >= the sweep threshold (16384): the CUDA fast mode sorts each row and sweeps the key range
    (rotated row starts), the deterministic mode does not; both must give the same dq and dkv on
    training-like rows (packed causal sequences, -1 padding, H = 16 padded to 64 in the kernel)."""
    if device != "cuda":
        pytest.skip("the CPU backend has one code path (covered by the float64 tests above)")
    T, H, K = 20480, 16, 512
    g = torch.Generator().manual_seed(7)
    q = (torch.randn(T, H, 576, generator=g) * 0.5).to(device, torch.bfloat16)
    kv = (torch.randn(T, 576, generator=g) * 0.5).to(device, torch.bfloat16)
    indices = causal_packed_indices(T, K, 2048, g).to(device)
    dout = torch.randn(T, H, 512, generator=g).to(device, torch.bfloat16)
    grads = {}
    for det in (False, True):
        qq, kk = q.clone().requires_grad_(), kv.clone().requires_grad_()
        out, _ = flashdsa.sparse_mla(qq, kk, indices, 576 ** -0.5, deterministic=det)
        out.backward(dout)
        grads[det] = (qq.grad.float(), kk.grad.float())
    for name, fast, det in zip(("dq", "dkv"), grads[False], grads[True]):
        assert torch.isfinite(fast).all(), name
        rel = ((fast - det).norm() / det.norm()).item()
        assert rel < 1e-2, f"{name}: fast (sweep) vs deterministic rel. error {rel:.2e}"


@pytest.mark.kernels("sparse_mla_fwd", "attention_mass")
@pytest.mark.parametrize("H", [16, 32, 64, 128])
def test_attention_mass(device, H):
    """mass from the op's own lse matches the reference, and each non-empty row sums to H."""
    case = with_empty_rows(ref.attention_case(LENGTHS, H, 64, device=device, junk=0.15, extra_keys=3), [5])
    _, lse = flashdsa.sparse_mla(case.q, case.kv, case.indices, case.scale)
    mass = flashdsa.attention_mass(case.q, case.kv, case.indices, lse, case.scale)
    assert mass.dtype == torch.float32 and mass.shape == case.indices.shape
    expected = ref.attention_mass(case.q.cpu(), case.kv.cpu(), case.indices.cpu(), lse.cpu(), case.scale)
    ref.assert_close(mass, expected, STAT_TOL, "mass")
    valid = ref.valid_slots(case.indices, case.kv.shape[0])
    assert (mass[~valid] == 0).all()
    nonempty = valid.any(dim=1)
    assert nonempty[0] and not nonempty[5]
    torch.testing.assert_close(mass.sum(dim=1)[nonempty], torch.full_like(mass[:, 0], H)[nonempty],
                               rtol=1e-4, atol=0)


def test_attention_mass_fp64_and_no_grad():
    case = ref.attention_case([10, 5], 3, 8, d_qk=72, dtype=torch.float64, junk=0.2)
    q = case.q.requires_grad_()
    _, lse = flashdsa.sparse_mla(q, case.kv, case.indices, case.scale)
    mass = flashdsa.attention_mass(q, case.kv, case.indices, lse, case.scale)
    assert not mass.requires_grad
    expected = ref.attention_mass(case.q.detach(), case.kv, case.indices, lse.detach(), case.scale)
    ref.assert_close(mass, expected, 1e-12, "mass")


# ---------------------------------------------------------------------------------------------
# sparse_mla_bwd_mass: the backward with the attention mass as a by-product (the layer's training path)


def _bwd_with_and_without_mass(case, dout, deterministic):
    """(dq, dkv) of sparse_mla_bwd, (dq, dkv, mass) of sparse_mla_bwd_mass and attention_mass, from
    one forward."""
    ops = torch.ops.flashdsa
    args = (case.q, case.kv, case.indices, case.scale)
    out, lse = ops.sparse_mla_fwd(*args)
    plain = ops.sparse_mla_bwd(*args, out, lse, dout, deterministic)
    fused = ops.sparse_mla_bwd_mass(*args, out, lse, dout, deterministic)
    return plain, fused, ops.attention_mass(*args[:3], lse, case.scale)


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass")
@pytest.mark.parametrize("H", [16, 64])
@pytest.mark.parametrize("K", [64, 128])
def test_sparse_mla_bwd_mass(device, H, K):
    """Packed THD rows with -1, out-of-range and duplicated indices and empty rows: dq and dkv are
    those of sparse_mla_bwd (bitwise; deterministic mode on CUDA, whose fast mode sums dkv in any
    order) and mass is attention_mass's (CPU: bitwise; CUDA: relative error <= 1e-3)."""
    case = with_empty_rows(ref.attention_case(LENGTHS, H, K, device=device, junk=0.15, extra_keys=5), [0, 90])
    dout = torch.randn(case.q.shape[0], H, 512, device=device).to(torch.bfloat16)
    valid = ref.valid_slots(case.indices, case.kv.shape[0])
    for deterministic in ((False, True) if device == "cuda" else (False,)):
        (dq, dkv), (dq_m, dkv_m, mass), expected = _bwd_with_and_without_mass(case, dout, deterministic)
        tag = f"{device} H={H} K={K} deterministic={deterministic}"
        assert mass.dtype == torch.float32 and mass.shape == case.indices.shape and mass.is_contiguous(), tag
        assert dq_m.dtype == dq.dtype and dkv_m.dtype == dkv.dtype, tag
        assert (mass[~valid] == 0).all(), f"{tag}: empty slots must have zero mass"
        assert (mass[[0, 90]] == 0).all(), f"{tag}: empty rows"
        if device == "cpu":
            assert torch.equal(mass, expected), f"{tag}: mass differs from attention_mass"
        else:
            ref.assert_close(mass, expected, 1e-3, f"{tag} mass")
        if device == "cpu" or deterministic:
            assert torch.equal(dq_m, dq) and torch.equal(dkv_m, dkv), f"{tag}: gradients differ from sparse_mla_bwd"
        else:
            ref.assert_close(dq_m, dq, 1e-2, f"{tag} dq")
            ref.assert_close(dkv_m, dkv, 1e-2, f"{tag} dkv")


def test_sparse_mla_bwd_mass_cpu_fp64():
    """float64 on the CPU: the same bitwise equalities, and mass matches the float64 reference."""
    case = ref.attention_case([29, 6, 1, 40], 16, 64, dtype=torch.float64, junk=0.2, extra_keys=3)
    dout = torch.randn(case.q.shape[0], 16, 512, dtype=torch.float64)
    (dq, dkv), (dq_m, dkv_m, mass), expected = _bwd_with_and_without_mass(case, dout, False)
    assert mass.dtype == torch.float64
    assert torch.equal(mass, expected) and torch.equal(dq_m, dq) and torch.equal(dkv_m, dkv)
    _, lse = flashdsa.sparse_mla(case.q, case.kv, case.indices, case.scale)
    ref.assert_close(mass, ref.attention_mass(case.q, case.kv, case.indices, lse, case.scale), 1e-12, "mass")


@pytest.mark.kernels("sparse_mla_fwd", "sparse_mla_bwd", "sparse_mla_bwd_mass", "attention_mass")
def test_sparse_mla_bwd_mass_far_keys(device):
    """T_kv = 20480, above the sweep threshold (CUDA fast mode: the sorted key sweep, whose mass must land in
    the right slots): 64 query rows whose indices point anywhere in the key tensor, with -1, out-of-range and
    duplicated entries."""
    T, T_kv, H, K = 64, 20480, 16, 512
    g = torch.Generator().manual_seed(3)
    q = (2.0 * torch.randn(T, H, 576, generator=g)).to(torch.bfloat16).to(device)
    kv = torch.randn(T_kv, 576, generator=g).to(torch.bfloat16).to(device)
    indices = torch.randint(0, T_kv, (T, K), generator=g, dtype=torch.int32)
    junk = torch.rand(T, K, generator=g)
    indices = torch.where(junk < 0.05, torch.full_like(indices, -1), indices)
    indices = torch.where((junk >= 0.05) & (junk < 0.08), torch.full_like(indices, T_kv + 2), indices)
    indices[:, -8:] = indices[:, :8]  # duplicated keys
    indices[5] = -1  # an empty row
    case = ref.AttentionCase(q, kv, indices.to(device), ref.softmax_scale(576))
    dout = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(device)
    (dq, dkv), (dq_m, dkv_m, mass), expected = _bwd_with_and_without_mass(case, dout, False)
    assert (mass[5] == 0).all() and (mass[~ref.valid_slots(case.indices, T_kv)] == 0).all()
    if device == "cpu":
        assert torch.equal(mass, expected) and torch.equal(dq_m, dq) and torch.equal(dkv_m, dkv)
    else:
        ref.assert_close(mass, expected, 1e-3, "mass")
        ref.assert_close(dq_m, dq, 1e-2, "dq")
        ref.assert_close(dkv_m, dkv, 1e-2, "dkv")
    # Each non-empty row's mass sums to H (the softmax of every head sums to 1).
    nonempty = ref.valid_slots(case.indices, T_kv).any(dim=1)
    torch.testing.assert_close(mass.sum(dim=1)[nonempty], torch.full_like(mass[:, 0], H)[nonempty],
                               rtol=1e-3, atol=0)
