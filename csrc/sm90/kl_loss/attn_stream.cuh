// Internal: the main-attention part shared by the attention-mass and dense-KL kernels: one query token's
// S = Q K^T over D_qk = 576 for blocks of 64 key rows, with the key rows streamed through a ring of
// 8 KB chunk slots by a producer warpgroup (cp.async, completion on mbarriers) and consumed by wgmma.
//
// Q of the token: NHG head groups of 64 heads (rows >= H zero-filled), each [64 x 576] SW128 (9 blocks
// of 64 columns, 8 KB each). One key block = 9 chunks: chunk c holds columns [64c, 64c + 64) of the 64
// key rows as one [64 x 64] SW128 tile. Chunk number `seq` (over the whole kernel) lives in slot
// seq % RING; full[slot] completes when its copies landed (128 producer arrivals), empty[slot] when
// the consuming warpgroup's wgmmas that read it finished (128 arrivals).
#pragma once

#include "sm90/kl_loss/kl_common.cuh"

namespace flashdsa::sm90::kl_loss_impl {

constexpr int kDqkCols = 576;
constexpr int kChunksPerBlock = kDqkCols / 64;                         // 9
constexpr int kChunkBytes = kBlockKeys * 128;                          // 8192
constexpr int kQGroupBytes = kChunksPerBlock * kChunkBytes;            // 73728: 64 heads x 576
constexpr int kRowsPerProducerThread = kBlockKeys * 8 / kWarpgroup;    // 4 rows x 1 piece per chunk

template <int RING>
struct KvRing {
  uint8_t* slots;   // [RING][8192]
  uint64_t* full;   // [RING]
  uint64_t* empty;  // [RING]

  // Producer side (128 threads): copies the 9 chunks of one key block whose rows (this thread's rows
  // wtid/8 + 16i, i < 4) start at row_ptr[i] (nullptr: zero-filled, never read). seq0 = 9 * block number.
  __device__ void produce_block(int seq0, const __nv_bfloat16* const (&row_ptr)[kRowsPerProducerThread],
                                const __nv_bfloat16* any_valid, int wtid) const {
    const int row = wtid >> 3, piece = wtid & 7;
#pragma unroll 1
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int seq = seq0 + c;
      const int s = seq % RING;
      if (seq >= RING) hw::mbar_wait(&empty[s], ((seq / RING) - 1) & 1);
      uint8_t* dst = slots + s * kChunkBytes;
#pragma unroll
      for (int i = 0; i < kRowsPerProducerThread; ++i) {
        const __nv_bfloat16* src = row_ptr[i];
        hw::cp_async_16(dst + hw::sw128_offset(row + 16 * i, piece), src ? src + 64 * c + 8 * piece : any_valid,
                        src != nullptr);
      }
      hw::cp_async_arrive(&full[s]);
    }
  }

  // Consumer side (one warpgroup): acc[g] = Q_g . K^T for the block of chunks seq0 .. seq0 + 8, one
  // [64 heads x 64 keys] accumulator per head group. Releases each chunk as soon as its wgmmas finished.
  template <int NHG>
  __device__ void consume_block(float (&acc)[NHG][32], const uint8_t* q_smem, int seq0) const {
    int prev = 0;
#pragma unroll 1
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int seq = seq0 + c;
      const int s = seq % RING;
      hw::mbar_wait(&full[s], (seq / RING) & 1);
      hw::fence_proxy_async();  // cp.async writes (generic proxy) -> wgmma reads (async proxy)
      hw::wgmma_fence();
      const uint8_t* kc = slots + s * kChunkBytes;
#pragma unroll
      for (int g = 0; g < NHG; ++g) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_ss<64, 0, 0>(acc[g], hw::desc_k_major(q_smem + g * kQGroupBytes, 64, 4 * c + kk),
                             hw::desc_k_major(kc, 64, kk), c > 0 || kk > 0);
      }
      hw::wgmma_commit();
      if (c > 0) {
        hw::wgmma_wait<1>();
        hw::mbar_arrive(&empty[prev]);
      }
      prev = s;
    }
    hw::wgmma_wait<0>();
#pragma unroll
    for (int g = 0; g < NHG; ++g) hw::fence_regs(acc[g]);
    hw::mbar_arrive(&empty[prev]);
  }
};

// Producer side: cp.async of the token's Q [NHG*64 heads x 576] into NHG SW128 groups; head rows >= H
// are zero-filled. q_t: q + t * q_stride_t. Same thread -> (row, piece) map as the kv chunks.
template <int NHG>
__device__ __forceinline__ void load_q_groups(uint8_t* q_smem, const __nv_bfloat16* q_t, int64_t q_stride_h, int H,
                                              int wtid) {
  const int row = wtid >> 3, piece = wtid & 7;
#pragma unroll 1
  for (int g = 0; g < NHG; ++g) {
    const __nv_bfloat16* src[kRowsPerProducerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerProducerThread; ++i) {
      const int h = 64 * g + row + 16 * i;
      src[i] = h < H ? q_t + h * q_stride_h + 8 * piece : nullptr;
    }
    uint8_t* group = q_smem + g * kQGroupBytes;
#pragma unroll 1
    for (int c = 0; c < kChunksPerBlock; ++c) {
#pragma unroll
      for (int i = 0; i < kRowsPerProducerThread; ++i)
        hw::cp_async_16(group + c * kChunkBytes + hw::sw128_offset(row + 16 * i, piece), src[i] ? src[i] + 64 * c : q_t,
                        src[i] != nullptr);
    }
  }
}

// Scale factor and lse of this thread's head rows in the log2 domain: P = exp2(S * c - lse2).
// Padded heads (h >= H) get lse2 = +inf, hence P = 0.
template <int NHG>
__device__ __forceinline__ void load_lse2(float (&lse2)[NHG][2], const float* lse_t, int H, int r0) {
#pragma unroll
  for (int g = 0; g < NHG; ++g) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int h = 64 * g + r0 + 8 * k;
      lse2[g][k] = h < H ? lse_t[h] * kLog2e : INFINITY;
    }
  }
}

// This thread's head-summed probabilities for its 16 columns: v[2j + e] = sum over its rows of
// exp2(S * c - lse2) at column 8j + 2q + e.
template <int NHG>
__device__ __forceinline__ void head_sum_partials(const float (&acc)[NHG][32], const float (&lse2)[NHG][2], float c,
                                                  float (&v)[16]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float s = 0.f;
#pragma unroll
      for (int g = 0; g < NHG; ++g)
        s += exp2f(fmaf(acc[g][4 * j + e], c, -lse2[g][0])) + exp2f(fmaf(acc[g][4 * j + 2 + e], c, -lse2[g][1]));
      v[2 * j + e] = s;
    }
  }
}

// Column sums of a block over the warpgroup's 64 head rows (fixed order, deterministic). red: this
// warpgroup's [2 buffers][4 warps][64] floats, used alternately (one barrier per block suffices: a
// buffer is rewritten only after every thread has passed the next block's barrier). Returns, for
// wg_tid < 64, the sum for column wg_tid.
__device__ __forceinline__ float warpgroup_colsum64(const float (&v)[16], float* red, int& buf, const AccCoord& c,
                                                    int wg_tid, int bar_id) {
  const float2 part = warp_colsum64(v, c.lane);
  float* rb = red + buf * 4 * 64;
  *reinterpret_cast<float2*>(rb + c.warp * 64 + 2 * c.lane) = part;
  hw::named_bar_sync(bar_id, kWarpgroup);
  float sum = 0.f;
  if (wg_tid < 64) sum = ((rb[wg_tid] + rb[64 + wg_tid]) + rb[128 + wg_tid]) + rb[192 + wg_tid];
  buf ^= 1;
  return sum;
}

}  // namespace flashdsa::sm90::kl_loss_impl
