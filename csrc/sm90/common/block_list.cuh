// Internal: the list of non-empty key blocks of a top-k row (constants.h: block b = slots
// [64 b, 64 b + 64)), built in shared memory by a whole CTA. Used by the attention-mass and KL-loss
// kernels. (The sparse MLA backward's producer builds its own list inline: it also rotates the list
// for its L2 sweep, build_block_list in csrc/sm90/sparse_mla_bwd/kernel_common.cuh.)
#pragma once

#include <cstdint>

#include "sm90/common/constants.h"

namespace flashdsa::sm90::hw {

constexpr int kMaskWords = kMaxBlocks / 32;

// Whether i is a row index of a tensor of n rows (a valid top-k index: 0 <= i < T_kv).
__device__ __forceinline__ bool valid_row(int64_t i, int64_t n) { return i >= 0 && i < n; }



// Shared memory of build_block_list.
struct BlockList {
  uint32_t words[kMaskWords];  // bit b: block b (slots [64b, 64b+64)) holds a valid index
  uint8_t ids[kMaxBlocks];     // ids of the non-empty blocks, increasing
};

__device__ __forceinline__ bool block_nonempty(const BlockList& bl, int b) {
  return (bl.words[b >> 5] >> (b & 31)) & 1u;
}

// Builds the list of 64-slot blocks of idx_row [K] that hold at least one index in [0, T_kv) and
// returns their number. Called by all `nthreads` threads of the block (contains __syncthreads).
// Blocks with no valid index are skipped by every kernel: no loads, no math.
__device__ __forceinline__ int build_block_list(const int32_t* idx_row, int K, int64_t T_kv, BlockList& bl, int tid,
                                                int nthreads) {
  constexpr int kUnroll = 4;  // loads in flight per warp
  if (tid < kMaskWords) bl.words[tid] = 0u;
  __syncthreads();
  const int lane = tid & 31, nwarps = nthreads >> 5, nchunks = K / 32;  // chunks of 32 slots
  for (int c0 = tid >> 5; c0 < nchunks; c0 += kUnroll * nwarps) {
    int32_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * nwarps;
      v[u] = c < nchunks ? __ldg(idx_row + c * 32 + lane) : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * nwarps;
      const uint32_t any = __ballot_sync(0xffffffffu, valid_row(v[u], T_kv));
      if (lane == 0 && any) atomicOr(&bl.words[c >> 6], 1u << ((c >> 1) & 31));
    }
  }
  __syncthreads();
  uint32_t w[kMaskWords];
  int total = 0;
#pragma unroll
  for (int i = 0; i < kMaskWords; ++i) {
    w[i] = bl.words[i];
    total += __popc(w[i]);
  }
  for (int b = tid; b < K / kBlockKeys; b += nthreads) {
    const int wi = b >> 5, bit = b & 31;
    uint32_t word = 0u;
    int pos = 0;  // set bits before b
#pragma unroll
    for (int i = 0; i < kMaskWords; ++i) {  // no dynamic indexing: w stays in registers
      word = i == wi ? w[i] : word;
      pos += i < wi ? __popc(w[i]) : 0;
    }
    if ((word >> bit) & 1u) bl.ids[pos + __popc(word & ((1u << bit) - 1u))] = static_cast<uint8_t>(b);
  }
  __syncthreads();
  return total;
}


}  // namespace flashdsa::sm90::hw
