// Internal: device helpers shared by the indexer-loss kernels (attention mass, sparse KL, dense KL):
// wgmma wrappers selected by tile width, reductions over the wgmma accumulator layout, the list of
// non-empty 64-slot blocks of a top-k row, SW128 tile loads by cp.async, and the indexer steps of one
// 64-key block (scores, then the gradient GEMMs). Accumulator layout: see sm90/common/hopper.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/ptx_ops.cuh"  // cp_async_4, red_add_v4 (candidates for common/)

namespace flashdsa::sm90::kl {

namespace hw = ::flashdsa::sm90::hw;

constexpr int kWarpgroup = 128;
constexpr int kBlockKeys = 64;                 // keys per block (wgmma N for attention, M for indexer)
constexpr int kMaxBlocks = 8192 / kBlockKeys;  // kMaxTopK / kBlockKeys: fits a uint8_t block id
constexpr int kMaskWords = kMaxBlocks / 32;
constexpr int kSmemLimit = 227 * 1024;         // opt-in dynamic shared memory per block on sm_90
constexpr int kSmemAlign = 1024;               // SW128 tiles need 1024-byte alignment
constexpr float kLog2e = 1.4426950408889634f;

template <int N>
struct DependentFalse {
  static constexpr bool value = false;
};

// ---- wgmma by width --------------------------------------------------------------------------------
template <int N, int TransA, int TransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate) {
  if constexpr (N == 32) {
    hw::wgmma_ss_m64n32k16<TransA, TransB>(d, da, db, accumulate);
  } else if constexpr (N == 64) {
    hw::wgmma_ss_m64n64k16<TransA, TransB>(d, da, db, accumulate);
  } else if constexpr (N == 128) {
    hw::wgmma_ss_m64n128k16<TransA, TransB>(d, da, db, accumulate);
  } else {
    static_assert(DependentFalse<N>::value, "unsupported wgmma width");
  }
}

template <int N, int TransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, bool accumulate) {
  if constexpr (N == 64) {
    hw::wgmma_rs_m64n64k16<TransB>(d, a, db, accumulate);
  } else if constexpr (N == 128) {
    hw::wgmma_rs_m64n128k16<TransB>(d, a, db, accumulate);
  } else {
    static_assert(DependentFalse<N>::value, "unsupported wgmma width");
  }
}

// Keeps RS A-fragments alive (and in place) until the wgmma reading them has been waited for.
template <int K>
__device__ __forceinline__ void fence_frags(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
  }
}

// ---- small helpers ---------------------------------------------------------------------------------
__device__ __forceinline__ bool valid_row(int64_t i, int64_t n) { return i >= 0 && i < n; }

__device__ __forceinline__ uint8_t* align_smem(uint8_t* p) {
  const uint32_t mis = hw::smem_u32(p) & (kSmemAlign - 1);
  return p + ((kSmemAlign - mis) & (kSmemAlign - 1));
}

// fp32 atomic add of two adjacent floats (8-byte aligned); the result is not returned (red).
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
}

// Where this thread's accumulator elements lie (m64nN layout of hopper.cuh): rows r0 and r0 + 8,
// columns 8j + 2q + {0, 1}.
struct AccCoord {
  int warp, lane, r0, q;
  __device__ __forceinline__ explicit AccCoord(int wg_tid)
      : warp(wg_tid >> 5), lane(wg_tid & 31), r0(16 * (wg_tid >> 5) + ((wg_tid & 31) >> 2)), q(wg_tid & 3) {}
};

// ReLU that keeps a NaN (fmaxf(NaN, 0) would be 0: a NaN score would look valid); one instruction.
__device__ __forceinline__ float relu_keep_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
  return y;
}

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
  hw::named_bar_sync(bar_id, kWarpgroup);
  const float r = kMax ? fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])) : (red[0] + red[1]) + (red[2] + red[3]);
  hw::named_bar_sync(bar_id, kWarpgroup);  // red may be reused right after
  return r;
}

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

// ---- non-empty blocks of a top-k row -----------------------------------------------------------------
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

// ---- tile loads -------------------------------------------------------------------------------------
// cp.async copy of a [ROWS x COLS] bf16 tile into SW128 layout by NTHREADS threads; row r comes from
// src(r) (a row pointer, or nullptr for a zero-filled row that is never read).
template <int ROWS, int COLS, int NTHREADS, class RowSrc>
__device__ __forceinline__ void load_tile_sw128(uint8_t* tile, int tid, const __nv_bfloat16* any_valid, RowSrc src) {
  constexpr int kPieces = COLS / 8;  // 16-byte pieces per row
  static_assert((ROWS * kPieces) % NTHREADS == 0, "tile pieces must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < ROWS * kPieces / NTHREADS; ++i) {
    const int p = tid + i * NTHREADS;
    const int r = p / kPieces, c = p % kPieces;
    const __nv_bfloat16* row = src(r);
    hw::cp_async_16(tile + hw::sw128_elem_offset(ROWS, r, c * 8), row ? row + c * 8 : any_valid, row != nullptr);
  }
}

// Column permutation that makes the dk GEMM's accumulator emit full 128-byte lines (the sparse
// backward's "permuted Q_I" tile): inside each group of 16 columns, original column 4q + e is stored at
// 2q + e (e < 2) or 8 + 2q + (e - 2). Accumulator n-chunks 2m, 2m+1 of quad member q then hold the
// four consecutive original columns 16m + 4q .. +3. Even columns stay paired (4-byte copies suffice).
__host__ __device__ constexpr int permuted_col(int c) {
  return (c & ~15) + ((c & 3) < 2 ? 2 * ((c & 15) >> 2) + (c & 3) : 8 + 2 * ((c & 15) >> 2) + (c & 3) - 2);
}

__device__ __forceinline__ float4 shfl_xor_f4(float4 v, int mask) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
                     __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
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
        a0 = fmaf(w, relu ? relu_keep_nan(x0) : x0, a0);
        a1 = fmaf(w, relu ? relu_keep_nan(x1) : x1, a1);
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
      red_add_f32x2(dk_row + 8 * j + 2 * q, c_acc[4 * j + 2 * half], c_acc[4 * j + 2 * half + 1]);
  }

  // Q_I [HI x DI] (rows q_t + h * stride_h) into a SW128 tile with permuted columns (permuted_col), by
  // 4-byte cp.async of all 128 threads; the B operand of issue_dk for scatter_dk_lines.
  __device__ static void load_q_permuted(uint8_t* tile, int tid, const __nv_bfloat16* q_t, int64_t stride_h) {
    constexpr int kPairs = DI / 2;  // column pairs per row
    static_assert((HI * kPairs) % kWarpgroup == 0, "pairs must split evenly over the warpgroup");
#pragma unroll
    for (int i = 0; i < HI * kPairs / kWarpgroup; ++i) {
      const int p = tid + i * kWarpgroup;
      const int h = p / kPairs, col = 2 * (p % kPairs);
      hw::cp_async_4(hw::smem_u32(tile + hw::sw128_elem_offset(HI, h, permuted_col(col))), q_t + h * stride_h + col,
                     true);
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
        const float4 got0 = shfl_xor_f4(odd ? piece[0] : piece[1], 4);
        const float4 got1 = shfl_xor_f4(odd ? piece[2] : piece[3], 4);
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

}  // namespace flashdsa::sm90::kl
