// The sm90 backend's table and its limits, all in one place. Sizes outside the production shapes
// of docs/spec.md §2 are kInvalidArgument (as on every backend, the message names the field);
// inputs the kernels cannot read (rows not 16-byte aligned) are kNotSupported.
#include "sm90/backend.h"

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/check.h"
#include "common/status_macros.h"
#include "sm90/indexer_topk/fp8.h"

namespace flashdsa::sm90 {
namespace {

using detail::Check;

Status check_dtype(const Check& c, DType dtype) {
  if (dtype != DType::kBF16) {
    return c.fail("dtype", dtype_name(dtype), "the CUDA backend supports only bf16 (fp32/fp64 are CPU only)");
  }
  return Status::OK();
}

Status check_attention(const Check& c, int H, int D_qk) {
  if (!is_supported_heads(H)) return c.fail("H", H, "must be one of 16, 32, 64, 128 on CUDA");
  if (D_qk != kDqk) return c.fail("D_qk", D_qk, "must be 576 on CUDA");
  return Status::OK();
}

Status check_value_dim(const Check& c, int D_v) {
  if (D_v != kDv) return c.fail("D_v", D_v, "must be 512 on CUDA");
  return Status::OK();
}

// The indexer part: bf16 q_idx/k_idx without dequantization scales (an fp8 indexer is not
// implemented on sm90), H_I and D_I of the production shapes.
Status check_indexer(const Check& c, const IndexerTensors& in) {
  FLASHDSA_RETURN_IF_ERROR(check_dtype(c, in.dtype));
  if (in.q_idx_scale != nullptr || in.k_idx_scale != nullptr) {
    return c.unsupported("indexer q_idx_scale / k_idx_scale are not supported on CUDA sm90 (bf16 indexer only; "
                         "leave them null)");
  }
  if (!is_supported_indexer_heads(in.H_I)) return c.fail("H_I", in.H_I, "must be 32 or 64 on CUDA");
  if (!is_supported_indexer_dim(in.D_I)) return c.fail("D_I", in.D_I, "must be 64 or 128 on CUDA");
  return Status::OK();
}

Status check_topk(const Check& c, int k) {
  if (k < kTopKMultiple || k > kMaxTopK || k % kTopKMultiple != 0) {
    return c.fail("K", k, "must be a multiple of 64 in [64, 8192] on CUDA");
  }
  return Status::OK();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The kernels copy bf16 rows with 16-byte cp.async: the base and every row stride (in elements)
// must keep rows 16-byte aligned.
bool rows_aligned(const void* base, std::initializer_list<int64_t> strides) {
  if (!aligned16(base)) return false;
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  return true;
}

// An output the kernels store 16 bytes at a time.
Status check_aligned_output(const Check& c, const char* field, const void* ptr) {
  if (!aligned16(ptr)) {
    return Status::InvalidArgument(std::string(c.op) + ": " + field +
                                   " must be 16-byte aligned on CUDA (address % 16 = " +
                                   std::to_string(reinterpret_cast<uintptr_t>(ptr) % 16) + ")");
  }
  return Status::OK();
}

Status supports_indexer_topk(const IndexerTopkParams& p, const char* op) {
  if (p.indexer.dtype == DType::kFP8E4M3) return indexer_topk_fp8_impl::supports(p, op);  // FP8 selection
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer));
  FLASHDSA_RETURN_IF_ERROR(check_topk(c, p.K));
  if (p.T > 0 && (!rows_aligned(p.indexer.q_idx, {p.indexer.q_idx_stride_t, p.indexer.q_idx_stride_h}) ||
                  (p.T_kv > 0 && !rows_aligned(p.indexer.k_idx, {p.indexer.k_idx_stride_t})))) {
    return c.unsupported("q_idx / k_idx rows must be 16-byte aligned (base aligned, strides multiples of 8)");
  }
  return Status::OK();
}

// dtype, heads, widths and K of sparse_mla_fwd, sparse_mla_bwd and attention_mass.
template <class P>
Status check_sparse_attention(const Check& c, const P& p) {
  FLASHDSA_RETURN_IF_ERROR(check_dtype(c, p.attn.dtype));
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn.H, p.attn.D_qk));
  return check_topk(c, p.topk.K);
}

Status supports_sparse_mla_fwd(const SparseMlaFwdParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_attention(c, p));
  FLASHDSA_RETURN_IF_ERROR(check_value_dim(c, p.attn.D_v));
  if (p.T == 0) return Status::OK();
  if (!rows_aligned(p.attn.q, {p.attn.q_stride_t, p.attn.q_stride_h}) || !rows_aligned(p.attn.kv, {p.attn.kv_stride_t})) {
    return c.unsupported("q / kv rows must be 16-byte aligned (strides multiples of 8)");
  }
  // One CTA per token and group of 64 heads: the grid must fit in one launch.
  const int64_t ctas = p.T * (p.attn.H > 64 ? p.attn.H / 64 : 1);
  if (ctas > INT_MAX) return c.unsupported("T too large for one launch");
  return Status::OK();
}

Status supports_sparse_mla_bwd(const SparseMlaBwdParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_attention(c, p));
  FLASHDSA_RETURN_IF_ERROR(check_value_dim(c, p.attn.D_v));
  // mass [T, K] is optional; when given, the kernel stores it 16 bytes at a time.
  if (p.mass != nullptr) FLASHDSA_RETURN_IF_ERROR(check_aligned_output(c, "mass", p.mass));
  if (p.T_kv >= (int64_t(1) << 31) - 1) return c.unsupported("T_kv must be < 2^31 - 1");
  if (p.T == 0) return Status::OK();
  if (!rows_aligned(p.attn.q, {p.attn.q_stride_t, p.attn.q_stride_h}) || !rows_aligned(p.attn.kv, {p.attn.kv_stride_t}) ||
      !aligned16(p.out) || !aligned16(p.dout) || !aligned16(p.dq) || !aligned16(p.dkv)) {
    return c.unsupported("q, kv, out, dout, dq, dkv must be 16-byte aligned and q/kv strides multiples of 8");
  }
  return Status::OK();
}

Status supports_attention_mass(const AttnMassParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_attention(c, p));
  if (p.T > 0 && (!rows_aligned(p.attn.q, {p.attn.q_stride_t, p.attn.q_stride_h}) || !rows_aligned(p.attn.kv, {p.attn.kv_stride_t}))) {
    return c.unsupported("q/kv rows must be 16-byte aligned");
  }
  return Status::OK();
}

// The backward also reduces into dk_idx 16 bytes at a time.
template <bool kBackward>
Status supports_sparse_kl(const SparseKlParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer));
  FLASHDSA_RETURN_IF_ERROR(check_topk(c, p.topk.K));
  if (p.T == 0) return Status::OK();
  if (!rows_aligned(p.indexer.q_idx, {p.indexer.q_idx_stride_t, p.indexer.q_idx_stride_h}) || !rows_aligned(p.indexer.k_idx, {p.indexer.k_idx_stride_t})) {
    return c.unsupported("q_idx/k_idx rows must be 16-byte aligned");
  }
  if (kBackward && !aligned16(p.dk_idx)) return c.unsupported("dk_idx must be 16-byte aligned");
  return Status::OK();
}

Status supports_dense_kl(const DenseKlParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_dtype(c, p.attn.dtype));
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn.H, p.attn.D_qk));
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer));
  if (p.T == 0) return Status::OK();
  if (!rows_aligned(p.attn.q, {p.attn.q_stride_t, p.attn.q_stride_h}) || !rows_aligned(p.attn.kv, {p.attn.kv_stride_t}) ||
      !rows_aligned(p.indexer.q_idx, {p.indexer.q_idx_stride_t, p.indexer.q_idx_stride_h}) || !rows_aligned(p.indexer.k_idx, {p.indexer.k_idx_stride_t})) {
    return c.unsupported("q/kv/q_idx/k_idx rows must be 16-byte aligned");
  }
  return Status::OK();
}

// indexer_topk with an e4m3 indexer runs the FP8 selection pass (csrc/sm90/indexer_topk/fp8.h).
Status indexer_topk_any(const IndexerTopkParams& p) {
  return p.indexer.dtype == DType::kFP8E4M3 ? indexer_topk_fp8_impl::run(p) : sm90::indexer_topk(p);
}
size_t indexer_topk_any_workspace_size(const IndexerTopkParams& p) {
  return p.indexer.dtype == DType::kFP8E4M3 ? indexer_topk_fp8_impl::workspace_size(p) : sm90::indexer_topk_workspace_size(p);
}

const detail::Backend kBackend = {
    "sm90",
    {&supports_indexer_topk, &indexer_topk_any, &indexer_topk_any_workspace_size},
    {&supports_sparse_mla_fwd, &sparse_mla_fwd, nullptr},
    {&supports_sparse_mla_bwd, &sparse_mla_bwd, &sparse_mla_bwd_workspace_size},
    {&supports_attention_mass, &attention_mass, nullptr},
    {&supports_sparse_kl<false>, &sparse_kl_fwd, nullptr},
    {&supports_sparse_kl<true>, &sparse_kl_bwd, nullptr},
    {&supports_dense_kl, &dense_kl_fwd, nullptr},
    {&supports_dense_kl, &dense_kl_bwd, nullptr},
    {&indexer_topk_fp8_impl::supports_quantize, &indexer_topk_fp8_impl::run_quantize, nullptr},
};

}  // namespace

const detail::Backend& backend() { return kBackend; }

}  // namespace flashdsa::sm90
