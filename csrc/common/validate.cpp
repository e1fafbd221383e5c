// Generic host checks of every params struct: what holds for every backend (sizes non-negative,
// pointers present, strides that do not overlap rows, finite scalars, key ranges in bounds). The
// limits of one backend (supported H, D, K, dtypes, alignment) are that backend's supports()
// (csrc/cpu/supports.cpp, csrc/sm90/supports.cpp); csrc/common/ops.cpp runs both.
//
// Strides: non-negative, and rows / heads must not overlap: for [rows, heads, dim],
// stride_h >= dim and stride_t >= (heads - 1) * stride_h + dim; a dimension of size <= 1 (or an
// empty tensor) is not constrained. A tensor with no elements may be null.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/host_copy.h"
#include "common/status_macros.h"
#include "common/validate.h"
#include "flashdsa/ops.h"

namespace flashdsa {

// The production shapes of docs/spec.md §2 (the sizes the sm90 backend runs).
bool is_supported_heads(int h) { return h == 16 || h == 32 || h == 64 || h == 128; }
bool is_supported_indexer_heads(int h) { return h == 32 || h == 64; }
bool is_supported_indexer_dim(int d) { return d == 64 || d == 128; }

namespace {

constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();  // row ids are int32

using detail::Check;

Status check_dtype(const Check& c, DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kFP32 && dtype != DType::kFP64) {
    return c.fail("dtype", static_cast<int64_t>(dtype), "must be kBF16, kFP32 or kFP64");
  }
  return Status::OK();
}

Status check_rows(const Check& c, const char* field, int64_t rows) {
  if (rows < 0 || rows > kMaxRows) return c.fail(field, rows, "must be in [0, 2^31 - 1]");
  return Status::OK();
}

// A size that every backend needs to be at least 1 (backends bound it further in supports()).
Status check_positive(const Check& c, const char* field, int64_t v) {
  if (v < 1) return c.fail(field, v, "must be >= 1");
  return Status::OK();
}

Status check_value_dim(const Check& c, int d_v, int d_qk) {
  if (d_v < 1 || d_v > d_qk) return c.fail("D_v", d_v, "must be in [1, D_qk = " + std::to_string(d_qk) + "]");
  return Status::OK();
}

// A tensor with `numel` elements needs a pointer unless it is empty.
Status check_ptr(const Check& c, const char* field, const void* ptr, int64_t numel) {
  if (ptr == nullptr && numel > 0) {
    return Status::InvalidArgument(std::string(c.op) + ": " + field + " must not be null (it has " +
                                   std::to_string(numel) + " elements)");
  }
  return Status::OK();
}

// Stride (in elements) of the outer dimension of a tensor whose inner block spans `min_stride`
// elements. A dimension of size <= 1 is never stepped over, so its stride is not constrained.
Status check_stride(const Check& c, const std::string& field, int64_t stride, int64_t dim_size, int64_t min_stride) {
  if (stride < 0) return c.fail(field, stride, "must be non-negative");
  if (dim_size > 1 && stride < min_stride) {
    return c.fail(field, stride, "must be >= " + std::to_string(min_stride) + " (rows must not overlap)");
  }
  return Status::OK();
}

// [rows, heads, dim] tensor with strides (stride_t, stride_h, 1).
Status check_strides_3d(const Check& c, const char* name, int64_t stride_t, int64_t stride_h, int64_t rows,
                        int heads, int dim) {
  if (rows == 0) return Status::OK();  // an empty tensor is never indexed
  FLASHDSA_RETURN_IF_ERROR(check_stride(c, std::string(name) + "_stride_h", stride_h, heads, dim));
  const int64_t row_span = heads > 1 ? (heads - 1) * stride_h + dim : dim;
  return check_stride(c, std::string(name) + "_stride_t", stride_t, rows, row_span);
}

Status check_finite(const Check& c, const char* field, double value) {
  if (!std::isfinite(value)) return c.fail(field, std::to_string(value), "must be finite");
  return Status::OK();
}

// The field names of a query tensor [T, heads, dim] (strides <q>_stride_t, <q>_stride_h, 1) and
// its key rows [T_kv, dim] (stride <k>_stride_t), as the error messages name them.
struct QueryKeyNames {
  const char *heads, *dim, *q, *k;
};

// The query / key pair shared by the attention and indexer parts: sizes positive, pointers present
// for non-empty tensors, rows that do not overlap.
Status check_query_key(const Check& c, const QueryKeyNames& n, const void* q, const void* k, int heads, int dim,
                       int64_t q_stride_t, int64_t q_stride_h, int64_t k_stride_t, int64_t T, int64_t T_kv) {
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, n.heads, heads));
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, n.dim, dim));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, n.q, q, T * heads * dim));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, n.k, k, T_kv * dim));
  FLASHDSA_RETURN_IF_ERROR(check_strides_3d(c, n.q, q_stride_t, q_stride_h, T, heads, dim));
  return check_stride(c, std::string(n.k) + "_stride_t", k_stride_t, T_kv, dim);
}

// The AttentionTensors part: q [T, H, D_qk], kv [T_kv, D_qk], the softmax scale and the dtype.
// D_v is checked by the ops that read it (check_value_dim).
Status check_attention(const Check& c, const AttentionTensors& a, int64_t T, int64_t T_kv) {
  FLASHDSA_RETURN_IF_ERROR(check_dtype(c, a.dtype));
  FLASHDSA_RETURN_IF_ERROR(check_query_key(c, {"H", "D_qk", "q", "kv"}, a.q, a.kv, a.H, a.D_qk, a.q_stride_t,
                                           a.q_stride_h, a.kv_stride_t, T, T_kv));
  return check_finite(c, "scale", a.scale);
}

// The IndexerTensors part: q_idx [T, H_I, D_I], k_idx [T_kv, D_I], weights [T, H_I], the dtype.
// kFP8E4M3 only where `fp8_ok` (indexer_topk's selection pass); then both scales are required,
// otherwise both must be null.
Status check_indexer(const Check& c, const IndexerTensors& in, int64_t T, int64_t T_kv, bool fp8_ok = false) {
  if (fp8_ok && in.dtype == DType::kFP8E4M3) {
    FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "q_idx_scale (required for kFP8E4M3)", in.q_idx_scale, T * in.H_I));
    FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "k_idx_scale (required for kFP8E4M3)", in.k_idx_scale, T_kv));
  } else {
    if (in.dtype == DType::kFP8E4M3) {
      return c.fail("dtype", dtype_name(in.dtype), "kFP8E4M3 is only an indexer_topk selection dtype");
    }
    FLASHDSA_RETURN_IF_ERROR(check_dtype(c, in.dtype));
    if (in.q_idx_scale != nullptr || in.k_idx_scale != nullptr) {
      return c.fail("q_idx_scale / k_idx_scale", "non-null", "the scales belong to a kFP8E4M3 indexer only");
    }
  }
  FLASHDSA_RETURN_IF_ERROR(check_query_key(c, {"H_I", "D_I", "q_idx", "k_idx"}, in.q_idx, in.k_idx, in.H_I, in.D_I,
                                           in.q_idx_stride_t, in.q_idx_stride_h, in.k_idx_stride_t, T, T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "weights", in.weights, T * in.H_I));
  return check_stride(c, "weights_stride_t", in.weights_stride_t, T, in.H_I);
}

// The TopkIndices part: indices [T, K] read by an op.
Status check_topk(const Check& c, const TopkIndices& k, int64_t T) {
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, "K", k.K));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "indices", k.indices, T * k.K));
  return check_stride(c, "indices_stride_t", k.stride_t, T, k.K);
}

// 0 <= k_start[t] <= k_end[t] <= T_kv for every row (read from the device for CUDA calls).
Status check_key_ranges(const Check& c, const CallContext& ctx, const int32_t* k_start, const int32_t* k_end,
                        int64_t T, int64_t T_kv) {
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "k_start", k_start, T));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "k_end", k_end, T));
  const bool on_device = ctx.device == Device::kCUDA;
  if (T == 0 || (on_device && !ctx.check_ranges)) return Status::OK();
  std::vector<int32_t> host_start, host_end;
  if (on_device) {
    host_start.resize(T);
    host_end.resize(T);
    const size_t bytes = static_cast<size_t>(T) * sizeof(int32_t);
    FLASHDSA_RETURN_IF_ERROR(detail::copy_device_to_host(k_start, bytes, host_start.data(), ctx.stream));
    FLASHDSA_RETURN_IF_ERROR(detail::copy_device_to_host(k_end, bytes, host_end.data(), ctx.stream));
    k_start = host_start.data();
    k_end = host_end.data();
  }
  for (int64_t t = 0; t < T; ++t) {
    if (k_start[t] < 0 || k_start[t] > k_end[t] || k_end[t] > T_kv) {
      const std::string row = std::to_string(t);
      return Status::InvalidArgument(std::string(c.op) + ": invalid key range of row " + row + ": k_start[" +
                                     row + "] = " + std::to_string(k_start[t]) + ", k_end[" + row +
                                     "] = " + std::to_string(k_end[t]) +
                                     " (need 0 <= k_start <= k_end <= T_kv = " + std::to_string(T_kv) + ")");
    }
  }
  return Status::OK();
}

Status check_sizes(const Check& c, int64_t T, int64_t T_kv) {
  FLASHDSA_RETURN_IF_ERROR(check_rows(c, "T", T));
  return check_rows(c, "T_kv", T_kv);
}

// Shared by the forward and backward validation of the sparse KL loss.
Status check_sparse_kl_inputs(const Check& c, const SparseKlParams& p) {
  FLASHDSA_RETURN_IF_ERROR(check_sizes(c, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_topk(c, p.topk, p.T));
  return check_ptr(c, "mass", p.mass, p.T * p.topk.K);
}

// Shared by the forward and backward validation of the dense KL loss (ranges come last: they may
// need a device copy).
Status check_dense_kl_inputs(const Check& c, const DenseKlParams& p) {
  FLASHDSA_RETURN_IF_ERROR(check_sizes(c, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer, p.T, p.T_kv));
  if (p.indexer.dtype != p.attn.dtype) {
    return c.fail("indexer.dtype", dtype_name(p.indexer.dtype),
                  std::string("must equal attn.dtype = ") + dtype_name(p.attn.dtype));
  }
  return Status::OK();
}

// Backward outputs shared by both KL formulations, plus the upstream gradient scale.
template <class P>
Status check_kl_grads(const Check& c, const P& p) {
  FLASHDSA_RETURN_IF_ERROR(check_finite(c, "grad_scale", p.grad_scale));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "dq_idx", p.dq_idx, p.T * p.indexer.H_I * p.indexer.D_I));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "dk_idx", p.dk_idx, p.T_kv * p.indexer.D_I));
  return check_ptr(c, "dweights", p.dweights, p.T * p.indexer.H_I);
}

}  // namespace

namespace detail {

Status check_generic(const IndexerTopkParams& p) {
  const Check c{"indexer_topk"};
  FLASHDSA_RETURN_IF_ERROR(check_sizes(c, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_indexer(c, p.indexer, p.T, p.T_kv, /*fp8_ok=*/true));
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, "K", p.K));
  if (p.indexer.dtype == DType::kFP8E4M3) {
    // The FP8 selection re-scores its candidates from the unquantized tensors.
    const Check r{"indexer_topk (rescore)"};
    FLASHDSA_RETURN_IF_ERROR(check_indexer(r, p.rescore, p.T, p.T_kv));
    if (p.rescore.H_I != p.indexer.H_I || p.rescore.D_I != p.indexer.D_I || p.rescore.relu != p.indexer.relu) {
      return c.fail("rescore", "H_I " + std::to_string(p.rescore.H_I) + ", D_I " + std::to_string(p.rescore.D_I),
                    "must have the H_I, D_I and relu of the fp8 indexer (H_I " + std::to_string(p.indexer.H_I) +
                        ", D_I " + std::to_string(p.indexer.D_I) + ")");
    }
    if (p.candidates != 0 && (p.candidates < p.K || p.candidates > 2 * kMaxTopK)) {
      return c.fail("candidates", p.candidates, "must be 0 (default) or in [K, 16384]");
    }
  }
  if (p.rescore_band != 0) {
    if (p.indexer.dtype != DType::kFP8E4M3) {
      return c.fail("rescore_band", p.rescore_band, "is an option of the FP8 selection (indexer dtype fp8_e4m3)");
    }
    if (p.rescore_band < 0 || p.rescore_band >= p.K) {
      return c.fail("rescore_band", p.rescore_band, "must be 0 (re-score every candidate) or in [1, K - 1]");
    }
    if (p.scores != nullptr) {
      return c.fail("scores", "non-null",
                    "must be null with rescore_band (the band re-score returns indices only: the other scores are "
                    "FP8 estimates)");
    }
  }
  if (p.rescore_band_scaled && p.rescore_band == 0) {
    return c.fail("rescore_band_scaled", "true", "scales the band re-score: it needs rescore_band in [1, K - 1]");
  }
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "indices", p.indices, p.T * p.K));
  return check_key_ranges(c, p, p.k_start, p.k_end, p.T, p.T_kv);
}

// The inputs and forward outputs (out, lse) the sparse MLA forward and backward share.
template <typename P>
Status check_sparse_mla_common(const Check& c, const P& p) {
  FLASHDSA_RETURN_IF_ERROR(check_sizes(c, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_value_dim(c, p.attn.D_v, p.attn.D_qk));
  FLASHDSA_RETURN_IF_ERROR(check_topk(c, p.topk, p.T));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "out", p.out, p.T * p.attn.H * p.attn.D_v));
  return check_ptr(c, "lse", p.lse, p.T * p.attn.H);
}

Status check_generic(const SparseMlaFwdParams& p) { return check_sparse_mla_common(Check{"sparse_mla_fwd"}, p); }

Status check_generic(const SparseMlaBwdParams& p) {
  const Check c{"sparse_mla_bwd"};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_mla_common(c, p));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "dout", p.dout, p.T * p.attn.H * p.attn.D_v));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "dq", p.dq, p.T * p.attn.H * p.attn.D_qk));
  // mass [T, K] is optional (null = not requested).
  return check_ptr(c, "dkv", p.dkv, p.T_kv * p.attn.D_qk);
}

Status check_generic(const AttnMassParams& p) {
  const Check c{"attention_mass"};
  FLASHDSA_RETURN_IF_ERROR(check_sizes(c, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_attention(c, p.attn, p.T, p.T_kv));
  FLASHDSA_RETURN_IF_ERROR(check_topk(c, p.topk, p.T));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "lse", p.lse, p.T * p.attn.H));
  return check_ptr(c, "mass", p.mass, p.T * p.topk.K);
}

Status check_generic_fwd(const SparseKlParams& p) {
  const Check c{"sparse_kl_fwd"};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_kl_inputs(c, p));
  return check_ptr(c, "loss_rows", p.loss_rows, p.T);
}

Status check_generic_bwd(const SparseKlParams& p) {
  const Check c{"sparse_kl_bwd"};
  FLASHDSA_RETURN_IF_ERROR(check_sparse_kl_inputs(c, p));
  return check_kl_grads(c, p);
}

Status check_generic_fwd(const DenseKlParams& p) {
  const Check c{"dense_kl_fwd"};
  FLASHDSA_RETURN_IF_ERROR(check_dense_kl_inputs(c, p));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "loss_rows", p.loss_rows, p.T));
  return check_key_ranges(c, p, p.k_start, p.k_end, p.T, p.T_kv);
}

Status check_generic_bwd(const DenseKlParams& p) {
  const Check c{"dense_kl_bwd"};
  FLASHDSA_RETURN_IF_ERROR(check_dense_kl_inputs(c, p));
  FLASHDSA_RETURN_IF_ERROR(check_kl_grads(c, p));
  return check_key_ranges(c, p, p.k_start, p.k_end, p.T, p.T_kv);
}

Status check_generic(const QuantizeFp8Params& p) {
  const Check c{"quantize_fp8"};
  FLASHDSA_RETURN_IF_ERROR(check_dtype(c, p.dtype));
  FLASHDSA_RETURN_IF_ERROR(check_rows(c, "N0", p.N0));
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, "N1", p.N1));
  FLASHDSA_RETURN_IF_ERROR(check_positive(c, "D", p.D));
  const int64_t rows = p.N0 * p.N1;
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "x", p.x, rows * p.D));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "out", p.out, rows * p.D));
  FLASHDSA_RETURN_IF_ERROR(check_ptr(c, "scale", p.scale, rows));
  return check_strides_3d(c, "x", p.stride0, p.stride1, p.N0, p.N1, p.D);
}

Status check_workspace(const char* op, size_t needed, const void* workspace, size_t bytes) {
  if (needed == 0) return Status::OK();
  if (workspace == nullptr || bytes < needed) {
    return Check{op}.fail("workspace_bytes", static_cast<int64_t>(workspace ? bytes : 0),
                          "workspace must be non-null and hold at least " + std::to_string(needed) + " bytes");
  }
  return Status::OK();
}

}  // namespace detail
}  // namespace flashdsa
