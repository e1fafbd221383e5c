// Internal: host-side pieces shared by the bf16 (indexer_topk.cu) and FP8 (indexer_topk_fp8.cu)
// launches of the fused indexer + top-k: the workspace layout (block counter, then the candidate
// lists: scores, then key indices), the persistent grid and the dispatch over (H_I, D_I, relu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

}  // namespace flashdsa::sm90::indexer_topk_impl
