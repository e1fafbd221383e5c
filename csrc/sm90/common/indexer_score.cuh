// Internal: the indexer score of docs/spec.md §3 on the wgmma accumulator layout, shared by the
// indexer top-k kernel (csrc/sm90/indexer_topk) and the KL-loss kernels (csrc/sm90/kl_loss):
//   score(t, s) = sum_h w[t, h] f(q_idx[t, h] . k_idx[s]),  f = ReLU (keeping NaN) or the identity.
// Both kernels compute the q.k products with wgmma, keys as the accumulator rows and heads as its
// columns (hopper.cuh: this thread holds rows r0 and r0 + 8, columns 8j + 2q + {0, 1}), then apply f,
// the weights and the head sum in registers:
//   for each accumulator chunk j of a query row's heads, e in {0, 1}:
//     p(r0)     += w[8j + 2q + e] f(acc[4j + e]),   p(r0 + 8) += w[8j + 2q + e] f(acc[4j + 2 + e])
//   then the 4 lanes of a quad add their partials.
// f is here, once. The head-sum loop itself stays written in each kernel
// (indexer_topk/kernel.cuh partial_head_sums: 256 (token, head) columns, weights read in pairs;
// kl_loss/kl_common.cuh IndexerBlock::reduce_scores: one token's heads, f chosen at run time): a
// shared helper gave the same math but moved ptxas's instruction schedule in both kernels
// (scripts/sass_diff.sh), and their machine code is kept as it was.
#pragma once

#include <cstdint>

namespace flashdsa::sm90::hw {

// ReLU that keeps a NaN (fmaxf(NaN, 0) would be 0: a NaN score would look valid and could be
// selected with a finite score; docs/reliability.md); one instruction (max.NaN).
__device__ __forceinline__ float relu_keep_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
  return y;
}

// f of the score formula, chosen at compile time.
template <bool kRelu>
__device__ __forceinline__ float indexer_activation(float x) {
  return kRelu ? relu_keep_nan(x) : x;
}

}  // namespace flashdsa::sm90::hw
