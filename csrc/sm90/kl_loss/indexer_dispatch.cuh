// Internal: host-side helpers of the KL kernels: the first step of every KL launch and the
// (H_I, D_I) dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/status_macros.h"
#include "flashdsa/status.h"
#include "sm90/common/cuda_check.cuh"

namespace flashdsa::sm90::kl_loss_impl {

// Calls fn(std::integral_constant<int, H_I>, std::integral_constant<int, D_I>) for the supported
// indexer shapes (H_I in {32, 64}, D_I in {64, 128}); other shapes are kNotSupported.
template <class Fn>
Status dispatch_indexer_shape(int H_I, int D_I, const char* op, Fn&& fn) {
  using I32 = std::integral_constant<int, 32>;
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  if (H_I == 32 && D_I == 64) return fn(I32{}, I64{});
  if (H_I == 32 && D_I == 128) return fn(I32{}, I128{});
  if (H_I == 64 && D_I == 64) return fn(I64{}, I64{});
  if (H_I == 64 && D_I == 128) return fn(I64{}, I128{});
  return Status::NotSupported(std::string("sm90 ") + op + ": H_I must be 32 or 64 and D_I 64 or 128");
}

// The backward of either KL formulation (SparseKlParams / DenseKlParams) accumulates dk_idx
// [T_kv, D_I] with atomics: it starts from zero. Nothing for the forward.
template <bool kBwd, class Params>
Status clear_dk_idx(const Params& p, cudaStream_t stream) {
  if (kBwd && p.T_kv > 0)
    FLASHDSA_CUDA_TRY(cudaMemsetAsync(p.dk_idx, 0, static_cast<size_t>(p.T_kv) * p.indexer.D_I * sizeof(float), stream));
  return Status::OK();
}

// The backward's gradient fields, one member of both KL kernels' args structs (the same layout as
// the five fields it replaced, so the kernels' parameter offsets are unchanged).
struct IndexerGradArgs {
  const float* grad_rows;  // [T] or nullptr
  float grad_scale;
  __nv_bfloat16* dq_idx;   // [T, H_I, D_I]
  float* dk_idx;           // [T_kv, D_I], zeroed before the launch
  float* dweights;         // [T, H_I]
};

// The kernel-argument fields that both KL formulations' args structs hold under the params' names:
// the indexer inputs and strides, and the loss / gradient outputs and inputs.
template <class Args, class Params>
void set_indexer_args(Args& a, const Params& p) {
  a.q_idx = static_cast<const __nv_bfloat16*>(p.indexer.q_idx);
  a.k_idx = static_cast<const __nv_bfloat16*>(p.indexer.k_idx);
  a.weights = static_cast<const float*>(p.indexer.weights);
  a.relu = p.indexer.relu;
  a.q_idx_stride_t = p.indexer.q_idx_stride_t;
  a.q_idx_stride_h = p.indexer.q_idx_stride_h;
  a.k_idx_stride_t = p.indexer.k_idx_stride_t;
  a.weights_stride_t = p.indexer.weights_stride_t;
  a.loss_rows = static_cast<float*>(p.loss_rows);
  a.grad = IndexerGradArgs{static_cast<const float*>(p.grad_rows), static_cast<float>(p.grad_scale),
                           static_cast<__nv_bfloat16*>(p.dq_idx), static_cast<float*>(p.dk_idx),
                           static_cast<float*>(p.dweights)};
}

// The host flow of a KL launch (either formulation, fwd or bwd): nothing for T = 0; else (bwd) zeroes
// dk_idx on the call's stream, then calls launch(H_I constant, D_I constant, stream) for the
// indexer shape (dispatch_indexer_shape). `op` names the call in messages.
template <bool kBwd, class Params, class Launch>
Status run_kl_launch(const Params& p, const char* op, Launch&& launch) {
  if (p.T == 0) return Status::OK();
  auto stream = static_cast<cudaStream_t>(p.stream);
  FLASHDSA_RETURN_IF_ERROR(clear_dk_idx<kBwd>(p, stream));
  return dispatch_indexer_shape(p.indexer.H_I, p.indexer.D_I, op,
                                [&](auto hi, auto di) -> Status { return launch(hi, di, stream); });
}

}  // namespace flashdsa::sm90::kl_loss_impl
