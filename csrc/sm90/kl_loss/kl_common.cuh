// Internal: device code shared by the indexer-loss kernels (attention mass, sparse KL, dense KL): the
// softmax-statistic merge and the indexer steps of one 64-key block (scores, then the gradient
// GEMMs). The building blocks they use (wgmma by width, reductions over the accumulator layout, the
// key-block list, tile loads, the indexer score) are in csrc/sm90/common/.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "sm90/common/block_list.cuh"
#include "sm90/common/constants.h"
#include "sm90/common/hopper.cuh"
#include "sm90/common/indexer_score.cuh"
#include "sm90/common/reduce.cuh"
#include "sm90/common/wgmma_dispatch.cuh"

namespace flashdsa::sm90::kl_loss_impl {

namespace hw = ::flashdsa::sm90::hw;

// The common building blocks this op's kernels use unqualified.
using hw::AccCoord;
using hw::align_smem;
using hw::block_nonempty;
using hw::BlockList;
using hw::build_block_list;
using hw::fence_frags;
using hw::kBlockKeys;
using hw::kLog2e;
using hw::kMaxBlocks;
using hw::kSmemAlign;
using hw::kSmemLimit;
using hw::kWarpgroup;
using hw::load_tile_sw128;
using hw::quad_max;
using hw::quad_sum;
using hw::valid_row;
using hw::warp_colsum64;
using hw::warp_max;
using hw::warp_sum;
using hw::warpgroup_allreduce;
using hw::wgmma_rs;
using hw::wgmma_ss;

// Merges the softmax statistic (m, l) = (max, sum exp(x - max)) of another set into (m, l).
// A NaN score (mo or lo NaN) makes l NaN for good (fmaxf drops a NaN from m), so the log-sum-exp
// m + log(l) is NaN, as on the CPU (docs/reliability.md).
__device__ __forceinline__ void merge_softmax_stat(float& m, float& l, float mo, float lo) {
  const float mn = fmaxf(m, mo);
  if (mn == -INFINITY) {  // both sets empty, unless the other one holds NaN
    if (mo != mo || lo != lo) l = __int_as_float(0x7fc00000);
    return;
  }
  l = l * expf(m - mn) + lo * expf(mo - mn);
  m = mn;
}






// ---- indexer steps of one 64-key block ------------------------------------------------------------------
// The indexer GEMMs of a block of 64 keys against one query token, all on one warpgroup:
//   scores: acc [64 keys x HI]  = K_I [64 x DI] . Q_I^T            (SS, both K-major)
//   dk:     C   [64 keys x DI]  = dqk [64 x HI] . Q_I [HI x DI]     (RS: dqk stays in registers)
//   dq:     dQ  [64 x DI]      += dqk^T [HI(pad 64) x 64] . K_I     (SS, dqk through a smem tile)
// q_tile: Q_I [HI x DI] SW128; k_tile: K_I [64 x DI] SW128; dqk_tile: [64 keys x 64 heads] SW128,
// columns >= HI zero (so dQ rows >= HI are zero and ignored).
template <int HI, int DI>
struct IndexerBlock {
  static_assert(HI == 32 || HI == 64, "H_I must be 32 or 64");
  static_assert(DI == 64 || DI == 128, "D_I must be 64 or 128");
  static constexpr int kAcc = HI / 2;   // score accumulator registers
  static constexpr int kCols = HI / 4;  // heads per thread (dw partials)
  static constexpr int kOut = DI / 2;   // C / dQ accumulator registers
  static constexpr int kFrags = HI / 16;
  static constexpr int kQTileBytes = HI * DI * 2;
  static constexpr int kKTileBytes = kBlockKeys * DI * 2;
  static constexpr int kDqkTileBytes = kBlockKeys * 64 * 2;

  __device__ static void issue_scores(float (&acc)[kAcc], const uint8_t* k_tile, const uint8_t* q_tile) {
    hw::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DI / 16; ++ks)
      wgmma_ss<HI, 0, 0>(acc, hw::desc_k_major(k_tile, kBlockKeys, ks), hw::desc_k_major(q_tile, HI, ks), ks > 0);
    hw::wgmma_commit();
  }

  // score(key) = sum_h w[h] f(acc[key, h]) for this thread's keys r0 (s0) and r0 + 8 (s1); all four
  // lanes of the quad end with the same values.
  __device__ static void reduce_scores(const float (&acc)[kAcc], const float* w_s, bool relu, int q, float& s0,
                                       float& s1) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int j = 0; j < HI / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float w = w_s[8 * j + 2 * q + e];
        const float x0 = acc[4 * j + e], x1 = acc[4 * j + 2 + e];
        a0 = fmaf(w, relu ? hw::relu_keep_nan(x0) : x0, a0);
        a1 = fmaf(w, relu ? hw::relu_keep_nan(x1) : x1, a1);
      }
    }
    s0 = quad_sum(a0);
    s1 = quad_sum(a1);
  }

  // With g0 / g1 = d loss / d score of keys r0 / r0 + 8: adds g f(x) to the dw partials and turns acc
  // into d(q.k) = g w f'(x) in place (f' = [x > 0] for relu; 1 at NaN, as on the CPU, so the NaN
  // reaches dq_idx).
  __device__ static void to_dqk(float (&acc)[kAcc], float g0, float g1, const float* w_s, bool relu, int q,
                                float (&dw)[kCols]) {
#pragma unroll
    for (int j = 0; j < HI / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float w = w_s[8 * j + 2 * q + e];
        float& x0 = acc[4 * j + e];
        float& x1 = acc[4 * j + 2 + e];
        const bool on0 = !relu || !(x0 <= 0.f), on1 = !relu || !(x1 <= 0.f);
        dw[2 * j + e] += (on0 ? g0 * x0 : 0.f) + (on1 ? g1 * x1 : 0.f);
        x0 = on0 ? g0 * w : 0.f;
        x1 = on1 ? g1 * w : 0.f;
      }
    }
  }

  // dqk (bf16) into the [64 keys x 64 heads] SW128 tile (conflict-free: the swizzle spreads the 8 rows).
  __device__ static void store_dqk_tile(const float (&acc)[kAcc], uint8_t* dqk_tile, const AccCoord& c) {
#pragma unroll
    for (int j = 0; j < HI / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dqk_tile + hw::sw128_offset(c.r0, j) + 4 * c.q) =
          hw::pack_bf16(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(dqk_tile + hw::sw128_offset(c.r0 + 8, j) + 4 * c.q) =
          hw::pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }

  // Zeroes the head columns [HI, 64) of the dqk tile (once per kernel; never written afterwards).
  __device__ static void clear_dqk_padding(uint8_t* dqk_tile, int tid, int nthreads) {
    if constexpr (HI < 64) {
      for (int p = tid; p < kBlockKeys * (64 - HI) / 8; p += nthreads) {
        const int r = p / ((64 - HI) / 8), chunk = HI / 8 + p % ((64 - HI) / 8);
        *reinterpret_cast<uint4*>(dqk_tile + hw::sw128_offset(r, chunk)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }

  // C = dqk . Q_I: dqk (acc) becomes the A fragments `af`, which must stay untouched until waited for.
  __device__ static void issue_dk(float (&c_acc)[kOut], uint32_t (&af)[kFrags][4], const float (&acc)[kAcc],
                                  const uint8_t* q_tile) {
#pragma unroll
    for (int kk = 0; kk < kFrags; ++kk) hw::acc_to_a_frag(acc, kk, af[kk]);
    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFrags; ++kk) wgmma_rs<DI, 1>(c_acc, af[kk], hw::desc_mn_major(q_tile, HI, kk, 0), kk > 0);
    hw::wgmma_commit();
  }

  // dQ += dqk^T . K_I (the caller has published the dqk tile: proxy fence + barrier).
  __device__ static void issue_dq(float (&dq_acc)[kOut], const uint8_t* dqk_tile, const uint8_t* k_tile) {
    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockKeys / 16; ++kk)
      wgmma_ss<DI, 1, 1>(dq_acc, hw::desc_mn_major(dqk_tile, kBlockKeys, kk, 0),
                         hw::desc_mn_major(k_tile, kBlockKeys, kk, 0), true);
    hw::wgmma_commit();
  }

  // dk_row[:] += C[row half, :] for key row r0 (half 0) or r0 + 8 (half 1).
  __device__ static void scatter_dk(float* dk_row, const float (&c_acc)[kOut], int half, int q) {
#pragma unroll
    for (int j = 0; j < DI / 8; ++j)
      hw::red_add_v2(dk_row + 8 * j + 2 * q, make_float2(c_acc[4 * j + 2 * half], c_acc[4 * j + 2 * half + 1]));
  }

  // Q_I [HI x DI] (rows q_t + h * stride_h) into a SW128 tile with permuted columns (hw::permuted_col), by
  // 4-byte cp.async of all 128 threads; the B operand of issue_dk for scatter_dk_lines.
  __device__ static void load_q_permuted(uint8_t* tile, int tid, const __nv_bfloat16* q_t, int64_t stride_h) {
    constexpr int kPairs = DI / 2;  // column pairs per row
    static_assert((HI * kPairs) % kWarpgroup == 0, "pairs must split evenly over the warpgroup");
#pragma unroll
    for (int i = 0; i < HI * kPairs / kWarpgroup; ++i) {
      const int p = tid + i * kWarpgroup;
      const int h = p / kPairs, col = 2 * (p % kPairs);
      hw::cp_async_4(hw::smem_u32(tile + hw::sw128_elem_offset(HI, h, hw::permuted_col_select(col))),
                     q_t + h * stride_h + col, true);
    }
  }

  // dk_idx[key(row)] += C[row, :] for the 64 rows of the block, with C = dqk . Q_I computed against the
  // permuted Q_I tile. The lanes of quads 2k, 2k+1 swap halves (shfl.xor 4) so that each 16-byte
  // red.global.add of the 8 lanes covers one full 128-byte line of one row: 4 whole lines per warp
  // instruction (a line-aligned dk_idx). Thread (r0, q) emits rows A = r0 + 8 half - odd and B = A + 1,
  // odd = (lane / 4) % 2. keys: the block's 64 key ids (smem); g0 / g1: d loss / d score of this
  // thread's rows r0 / r0 + 8, exactly 0 for an empty slot (nothing to add; the key is never used).
  __device__ static void scatter_dk_lines(float* dk_idx, const float (&c_acc)[kOut], const int32_t* keys, float g0,
                                          float g1, const AccCoord& c) {
    const bool odd = (c.lane >> 2) & 1;
    const int col = 16 * odd + 4 * c.q;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float g_own = half ? g1 : g0;
      const float g_pair = __shfl_xor_sync(0xffffffffu, g_own, 4);
      const int row_a = c.r0 + 8 * half - odd;
      const bool put_a = (odd ? g_pair : g_own) != 0.f, put_b = (odd ? g_own : g_pair) != 0.f;
      float* const dst_a = dk_idx + int64_t{keys[row_a]} * DI + col;
      float* const dst_b = dk_idx + int64_t{keys[row_a + 1]} * DI + col;
#pragma unroll
      for (int cc = 0; cc < DI / 64; ++cc) {
        float4 piece[4];  // own row, original columns 64cc + 16m + 4q .. +3
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float* a = c_acc + 32 * cc + 8 * m + 2 * half;
          piece[m] = make_float4(a[0], a[1], a[4], a[5]);
        }
        // The even quad keeps m = 0, 2 of its row (A) and receives m = 0, 2 of row B; the odd quad
        // keeps m = 1, 3 of its row (B) and receives m = 1, 3 of row A.
        const float4 got0 = hw::shfl_xor_f4(odd ? piece[0] : piece[1], 4);
        const float4 got1 = hw::shfl_xor_f4(odd ? piece[2] : piece[3], 4);
        if (put_a) {
          hw::red_add_v4(dst_a + 64 * cc, odd ? got0 : piece[0]);
          hw::red_add_v4(dst_a + 64 * cc + 32, odd ? got1 : piece[2]);
        }
        if (put_b) {
          hw::red_add_v4(dst_b + 64 * cc, odd ? piece[1] : got0);
          hw::red_add_v4(dst_b + 64 * cc + 32, odd ? piece[3] : got1);
        }
      }
    }
  }

  // dq_t [HI, DI] (bf16, contiguous) from the dQ accumulator rows < HI.
  __device__ static void store_dq(const float (&dq_acc)[kOut], __nv_bfloat16* dq_t, const AccCoord& c) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = c.r0 + 8 * half;
      if (h >= HI) continue;
#pragma unroll
      for (int j = 0; j < DI / 8; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(dq_t + h * DI + 8 * j + 2 * c.q) =
            __floats2bfloat162_rn(dq_acc[4 * j + 2 * half], dq_acc[4 * j + 2 * half + 1]);
      }
    }
  }

  // dw_t[h] = sum over the warpgroup of the dw partials (fixed order). red: [4 warps][HI] floats.
  __device__ static void reduce_store_dw(float (&dw)[kCols], float* red, float* dw_t, const AccCoord& c, int wg_tid,
                                         int bar_id) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      dw[i] += __shfl_xor_sync(0xffffffffu, dw[i], 4);
      dw[i] += __shfl_xor_sync(0xffffffffu, dw[i], 8);
      dw[i] += __shfl_xor_sync(0xffffffffu, dw[i], 16);
    }
    if (c.lane < 4) {
#pragma unroll
      for (int j = 0; j < HI / 8; ++j) {
        red[c.warp * HI + 8 * j + 2 * c.q] = dw[2 * j];
        red[c.warp * HI + 8 * j + 2 * c.q + 1] = dw[2 * j + 1];
      }
    }
    hw::named_bar_sync(bar_id, kWarpgroup);
    if (wg_tid < HI) dw_t[wg_tid] = ((red[wg_tid] + red[HI + wg_tid]) + red[2 * HI + wg_tid]) + red[3 * HI + wg_tid];
  }
};

}  // namespace flashdsa::sm90::kl_loss_impl
