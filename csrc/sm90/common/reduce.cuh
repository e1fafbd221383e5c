// Internal: reductions over the wgmma accumulator layout (hopper.cuh) and over warps / warpgroups:
// quad and warp sums and maxima, a deterministic warpgroup all-reduce, column sums of an
// accumulator tile, and the coordinates of a thread's accumulator elements.
#pragma once

#include <cstdint>

#include "sm90/common/constants.h"
#include "sm90/common/hopper.cuh"

namespace flashdsa::sm90::hw {

// Where this thread's accumulator elements lie (m64nN layout of hopper.cuh): rows r0 and r0 + 8,
// columns 8j + 2q + {0, 1}.
struct AccCoord {
  int warp, lane, r0, q;
  __device__ __forceinline__ explicit AccCoord(int wg_tid)
      : warp(wg_tid >> 5), lane(wg_tid & 31), r0(16 * (wg_tid >> 5) + ((wg_tid & 31) >> 2)), q(wg_tid & 3) {}
};


// Sums / maxima over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (kMax: maximum) over the 128 threads of a warpgroup, returned to all of them; fixed order, so
// deterministic. red: 4 floats of shared memory owned by this warpgroup.
template <bool kMax>
__device__ __forceinline__ float warpgroup_allreduce(float v, float* red, int wg_tid, int bar_id) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if ((wg_tid & 31) == 0) red[wg_tid >> 5] = v;
  named_bar_sync(bar_id, kWarpgroup);
  const float r = kMax ? fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])) : (red[0] + red[1]) + (red[2] + red[3]);
  named_bar_sync(bar_id, kWarpgroup);  // red may be reused right after
  return r;
}


// Column sums over the 16 rows a warp holds of a [64 x 64] accumulator tile. v[2j + e] is this
// thread's partial for column 8j + 2q + e (its two rows already added). A butterfly reduce-scatter
// over lane bits 4, 3, 2 (14 shuffles): lane L ends with columns 2L and 2L + 1.
__device__ __forceinline__ float2 warp_colsum64(const float (&v)[16], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float u[8], w[4], z[2];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float keep = b4 ? v[k + 8] : v[k];
    const float send = b4 ? v[k] : v[k + 8];
    u[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float keep = b3 ? u[k + 4] : u[k];
    const float send = b3 ? u[k] : u[k + 4];
    w[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float keep = b2 ? w[k + 2] : w[k];
    const float send = b2 ? w[k] : w[k + 2];
    z[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  return make_float2(z[0], z[1]);
}


// __shfl_xor_sync of the four lanes of a float4.
__device__ __forceinline__ float4 shfl_xor_f4(float4 v, int mask) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
                     __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
}

}  // namespace flashdsa::sm90::hw
