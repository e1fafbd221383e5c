// Internal: host-side pieces shared by the bf16 (indexer_topk.cu) and FP8 (indexer_topk_fp8.cu)
// launches of the fused indexer + top-k: the workspace layout (block counter, then the candidate
// lists: scores, then key indices), the persistent grid and the dispatch over (H_I, D_I, relu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "flashdsa/ops.h"
#include "sm90/heuristics.h"
#include "sm90/indexer_topk/kernel.cuh"

namespace flashdsa::sm90::indexer_topk_impl {

constexpr size_t kCounterBytes = 256;  // workspace header: the block scheduler's counter
constexpr int kSmemPerCtaBudget = 228 * 1024 / kCtasPerSm - 1024;  // per-CTA share minus the reserved 1 KB

struct LaunchShape {
  int tokens;      // query rows per block
  int num_blocks;  // blocks of query rows
  int grid;        // persistent CTAs: at most one full wave (kCtasPerSm x SMs of the current device)
};

// The launch shape of p on the current device.
inline Status launch_shape(const IndexerTopkParams& p, LaunchShape* shape) {
  int sms = 0;
  const Status st = tuning::sm_count(&sms);
  if (!st.ok()) return st;
  shape->tokens = kCols / p.indexer.H_I;
  shape->num_blocks = static_cast<int>((p.T + shape->tokens - 1) / shape->tokens);
  shape->grid = std::min(shape->num_blocks, kCtasPerSm * sms);
  return Status::OK();
}

// Bytes of one half (scores or key indices) of the candidate lists: a list of cap per row in flight.
inline size_t list_bytes(const LaunchShape& s, int cap) {
  return static_cast<size_t>(s.grid) * s.tokens * cap * sizeof(float);
}

// Bytes of the whole workspace.
inline size_t workspace_bytes(const LaunchShape& s, int cap) { return kCounterBytes + 2 * list_bytes(s, cap); }

// InvalidArgument unless p's workspace holds `need` bytes; `who` names the op in the message.
inline Status check_workspace(const IndexerTopkParams& p, size_t need, const char* who) {
  if (p.workspace == nullptr || p.workspace_bytes < need)
    return Status::InvalidArgument(std::string(who) + ": workspace needs " + std::to_string(need) + " bytes, got " +
                                   std::to_string(p.workspace_bytes));
  return Status::OK();
}

// Fills the fields that the bf16 and FP8 kernel arguments share: ranges, outputs, workspace (p's
// workspace laid out for `shape` and `cap`), sizes.
template <class Args>
void fill_shared_args(const IndexerTopkParams& p, const LaunchShape& shape, int cap, Args* args) {
  char* ws = static_cast<char*>(p.workspace);
  args->k_start = p.k_start;
  args->k_end = p.k_end;
  args->out_idx = p.indices;
  args->out_scores = static_cast<float*>(p.scores);
  args->block_counter = reinterpret_cast<int*>(ws);
  args->cand_scores = reinterpret_cast<float*>(ws + kCounterBytes);
  args->cand_idx = reinterpret_cast<int32_t*>(ws + kCounterBytes + list_bytes(shape, cap));
  args->T = static_cast<int>(p.T);
  args->T_kv = static_cast<int>(p.T_kv);
  args->K = p.K;
  args->cap = cap;
  args->num_blocks = shape.num_blocks;
}

// Fills the bf16 inputs of the scores (the bf16 kernel's only inputs; the FP8 pass's re-score inputs).
template <class Args>
void fill_bf16_inputs(const IndexerTensors& in, Args* args) {
  args->q = static_cast<const __nv_bfloat16*>(in.q_idx);
  args->k = static_cast<const __nv_bfloat16*>(in.k_idx);
  args->w = static_cast<const float*>(in.weights);
  args->q_st = in.q_idx_stride_t;
  args->q_sh = in.q_idx_stride_h;
  args->k_st = in.k_idx_stride_t;
  args->w_st = in.weights_stride_t;
}

// A kernel variant's compile-time shape, handed to the callable of dispatch_variant.
template <int H_, int D_, bool kRelu_>
struct Variant {
  static constexpr int H = H_;
  static constexpr int D = D_;
  static constexpr bool kRelu = kRelu_;
};

// Calls f(Variant<H, D, relu>{}) for h (32, else 64), d (64, else 128) and relu; the callers have
// checked h and d.
template <class F>
Status dispatch_variant(int h, int d, bool relu, F&& f) {
  if (h == 32) {
    if (d == 64) return relu ? f(Variant<32, 64, true>{}) : f(Variant<32, 64, false>{});
    return relu ? f(Variant<32, 128, true>{}) : f(Variant<32, 128, false>{});
  }
  if (d == 64) return relu ? f(Variant<64, 64, true>{}) : f(Variant<64, 64, false>{});
  return relu ? f(Variant<64, 128, true>{}) : f(Variant<64, 128, false>{});
}


// The tensor map of a key tensor of `rows` rows of `cols` elements (row stride stride_bytes) for the v2
// walks (kernel_v2.cuh bf16, fp8_kernel_v2.cuh e4m3): boxes of kTileKeys keys x box_cols elements (one
// 128-byte row of the 128-byte swizzle), zero fill past the last row; all zero when rows <= 0 (no key
// tile is ever loaded). The driver entry point is looked up through the runtime, so nothing links
// libcuda directly. `who` prefixes the error messages.
inline Status make_key_rows_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, const void* base, uint64_t cols,
                                       int64_t rows, uint64_t stride_bytes, uint32_t box_cols, const std::string& who) {
  std::memset(map, 0, sizeof(*map));
  if (rows <= 0) return Status::OK();
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return Status::CudaError(who + ": cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(kTileKeys)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::NotSupported(who + ": k_idx cannot be described by a TMA tensor map (error " +
                                std::to_string(static_cast<int>(r)) + "): needs a 16-byte aligned base and stride");
  return Status::OK();
}

}  // namespace flashdsa::sm90::indexer_topk_impl
