// The CPU backend's table and its limits. The CPU backend takes the production shapes and small
// ones, so tests and references can run at tiny sizes:
//   H, H_I in [1, 128];  D_I a multiple of 8 in [8, 256];  D_qk a multiple of 8 in [8, 1024];
//   K in [1, 8192];  dtype bf16, fp32 or fp64 (indexer_topk also takes a kFP8E4M3 indexer);  any alignment.
// (D_v in [1, D_qk] and the rest are generic checks, csrc/common/validate.cpp.)
#include "cpu/backend.h"

#include <string>

#include "common/check.h"
#include "common/status_macros.h"

namespace flashdsa::cpu {
namespace {

using detail::Check;

constexpr int kMaxHeads = 128;
constexpr int kMaxIndexerDim = 256;
constexpr int kMaxDqk = 1024;
constexpr int kDimMultiple = 8;

Status check_heads(const Check& c, const char* field, int h) {
  if (h < 1 || h > kMaxHeads) return c.fail(field, h, "must be in [1, 128]");
  return Status::OK();
}

Status check_dim(const Check& c, const char* field, int d, int max_d) {
  if (d < kDimMultiple || d > max_d || d % kDimMultiple != 0) {
    return c.fail(field, d, "must be a multiple of 8 in [8, " + std::to_string(max_d) + "]");
  }
  return Status::OK();
}

Status check_topk(const Check& c, int k) {
  if (k < 1 || k > kMaxTopK) return c.fail("K", k, "must be in [1, 8192]");
  return Status::OK();
}

Status check_attention(const Check& c, int H, int D_qk) {
  FLASHDSA_RETURN_IF_ERROR(check_heads(c, "H", H));
  return check_dim(c, "D_qk", D_qk, kMaxDqk);
}

// The indexer part. Dequantization scales belong to the fp8 indexer of indexer_topk only.
Status check_indexer(const Check& c, const IndexerTensors& in, bool fp8_ok = false) {
  if (!(fp8_ok && in.dtype == DType::kFP8E4M3) && (in.q_idx_scale != nullptr || in.k_idx_scale != nullptr)) {
    return c.unsupported("indexer q_idx_scale / k_idx_scale are only read by indexer_topk with a kFP8E4M3 "
                         "indexer (leave them null)");
  }
  FLASHDSA_RETURN_IF_ERROR(check_heads(c, "H_I", in.H_I));
  return check_dim(c, "D_I", in.D_I, kMaxIndexerDim);
}

// Every dtype of types.h runs on the CPU; the generic checks reject values outside the enum.
// indexer_topk; sparse_kl_fwd, sparse_kl_bwd.
Status supports_indexer_topk(const IndexerTopkParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer, /*fp8_ok=*/true));
  if (p.indexer.dtype == DType::kFP8E4M3) FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.rescore));
  return check_topk(c, p.K);
}

Status supports_sparse_kl(const SparseKlParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer));
  return check_topk(c, p.topk.K);
}

// sparse_mla_fwd, sparse_mla_bwd, attention_mass.
template <class P>
Status supports_sparse_attention(const P& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn.H, p.attn.D_qk));
  return check_topk(c, p.topk.K);
}

Status supports_dense_kl(const DenseKlParams& p, const char* op) {
  const Check c{op};
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn.H, p.attn.D_qk));
  return check_indexer(c, p.indexer);
}

const detail::Backend kBackend = {
    "cpu",
    {&supports_indexer_topk, &indexer_topk, nullptr},
    {&supports_sparse_attention<SparseMlaFwdParams>, &sparse_mla_fwd, nullptr},
    {&supports_sparse_attention<SparseMlaBwdParams>, &sparse_mla_bwd, nullptr},
    {&supports_sparse_attention<AttnMassParams>, &attention_mass, nullptr},
    {&supports_sparse_kl, &sparse_kl_fwd, nullptr},
    {&supports_sparse_kl, &sparse_kl_bwd, nullptr},
    {&supports_dense_kl, &dense_kl_fwd, nullptr},
    {&supports_dense_kl, &dense_kl_bwd, nullptr},
    {nullptr, &quantize_fp8, nullptr},
};

}  // namespace

const detail::Backend& backend() { return kBackend; }

}  // namespace flashdsa::cpu
