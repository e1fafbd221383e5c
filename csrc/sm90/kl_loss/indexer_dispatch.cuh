// Internal: host-side helpers of the KL kernels: the first step of every KL launch and the
// (H_I, D_I) dispatch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

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

}  // namespace flashdsa::sm90::kl_loss_impl
