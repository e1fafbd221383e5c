// Internal: what the two sparse MLA backward main kernels share (v1: main_kernel.cuh, v2:
// main_kernel_v2.cuh; the library picks one per call, tuning::bwd_use_v2 in heuristics.h): the launch
// parameters, the work item, the block list with its sweep rotation, the L2 prefetches, P and dS of a
// [64 heads x 64 keys] accumulator, the attention-mass output, the wgmma sequences of S / dP, dQ and
// dKV, and the dKV emission (quad-pair exchange, atomics or deterministic stores).
// The smem plans differ (SmemPlan in config.h, v2::SmemPlanV2); the helpers that touch shared
// memory take the plan as a template parameter and only use the members both plans have.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/l2_policy.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl {

struct MainParams {
  const __nv_bfloat16* q;     // [T, H, 576]; strides q_stride_t, q_stride_h
  const __nv_bfloat16* kv;    // [T_kv, 576]; stride kv_stride_t
  const int32_t* indices;     // [tokens of this launch, K], row 0 = token_begin; stride indices_stride_t
  const float* lse;           // [T, H] natural log
  const float* delta;         // [T, H] rowsum(dout * out)
  const __nv_bfloat16* dout;  // [T, H, 512]
  __nv_bfloat16* dq;          // [T, H, 576]
  float* dkv;                 // [T_kv, 576] fast mode: accumulated with vector atomics
  float* partial;             // [tokens of this launch, G, K, 576] deterministic mode: per-slot dkv
  uint32_t* sweep_counter;    // sweep mode (rows sorted): key blocks issued by all CTAs; else null
  float* mass;                // optional [T, K] head-summed attention mass (zeroed before; added to)
  const int32_t* mass_slots;  // sweep mode + mass: [tokens, K] chunk pair id (row * K + original slot)
                              // of each sorted entry; null: entry j of the row is slot j
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;
  int64_t token_begin;        // global token of local token 0 (grid.x = tokens of this launch)
  int64_t T_kv;
  int H, K;
  float scale;                // softmax scale
  float scale_log2;           // scale * log2(e)
  int resident_ctas;          // sweep mode: CTAs of this launch running at once
};

namespace detail {

using hw::desc_k_major;
using hw::desc_mn_major;

__device__ __forceinline__ bool key_valid(int32_t idx, int64_t t_kv) { return idx >= 0 && idx < t_kv; }

// Coordinates of this CTA's work item.
struct Work {
  int64_t local_token;  // row of this launch
  int64_t token;        // global query token
  int head_group;       // heads [64 g, 64 g + 64)
  int heads;            // real heads of the group (< 64 for H = 16, 32: the rest is zero padding)
};

// The work item of this CTA (grid = (tokens of this launch, head groups)).
__device__ __forceinline__ Work make_work(const MainParams& p) {
  Work w;
  w.local_token = blockIdx.x;
  w.token = p.token_begin + w.local_token;
  w.head_group = blockIdx.y;
  w.heads = min(p.H - w.head_group * kHeadsPerCta, kHeadsPerCta);
  return w;
}

// The CTA's smem plan: the first 1024-byte boundary of the dynamic shared memory (SW128 tiles).
template <class Plan>
__device__ __forceinline__ Plan& smem_plan(uint8_t* raw) {
  return *reinterpret_cast<Plan*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// One mbarrier of the smem plan and its expected arrivals.
struct BarrierInit {
  uint64_t* bar;
  int count;
};

// Thread 0 initialises the CTA's mbarriers (in argument order); then the whole CTA syncs.
template <class... Inits>
__device__ __forceinline__ void init_barriers(Inits... inits) {
  if (threadIdx.x == 0) {
    (hw::mbar_init(inits.bar, inits.count), ...);
    hw::mbar_fence_init();
  }
  __syncthreads();
}

// ---- setup: the block list ----------------------------------------------------------------

// The non-empty key blocks of the row (rows are often -1-padded at the end) into sm.block_list, in
// processing order, and their count into sm.num_blocks; called by the 128 threads of one warpgroup,
// which synchronise on named barrier kBar. Sweep mode: all CTAs walk their (key-sorted) rows in step,
// so that the kv and dkv rows being touched at any moment lie in a narrow key window that stays in
// L2. Every CTA counts the blocks it issues; counter / resident CTAs (mod blocks per row) is the
// average position of the running CTAs, and a new row starts there (0 without sweep), wrapping around.
template <int kBar, class Smem>
__device__ __forceinline__ void build_block_list(const MainParams& p, Smem& sm, const int32_t* idx_row,
                                                 int num_row_blocks, int warp, int lane) {
  for (int blk = warp; blk < num_row_blocks; blk += 4) {
    const bool v = key_valid(idx_row[blk * kBlockKeys + lane], p.T_kv) ||
                   key_valid(idx_row[blk * kBlockKeys + 32 + lane], p.T_kv);
    const bool any = __any_sync(0xffffffffu, v);
    if (lane == 0) sm.block_list[blk] = any ? 1 : 0;  // flags first, compacted below
  }
  hw::named_bar_sync(kBar, 128);
  if (warp == 0) {
    uint32_t ballot[kMaxBlocksPerRow / 32];
    int total = 0;
#pragma unroll
    for (int r = 0; r < kMaxBlocksPerRow / 32; ++r) {
      const int blk = 32 * r + lane;
      ballot[r] = __ballot_sync(0xffffffffu, blk < num_row_blocks && sm.block_list[blk] != 0);
      total += __popc(ballot[r]);
    }
    __syncwarp();
    int rot = 0;
    if (p.sweep_counter != nullptr && total > 0) {
      const uint32_t issued = *reinterpret_cast<volatile uint32_t*>(p.sweep_counter);
      const int position = static_cast<int>((issued / static_cast<uint32_t>(p.resident_ctas)) % num_row_blocks);
      rot = position * total / num_row_blocks;
    }
    int before = 0;
#pragma unroll
    for (int r = 0; r < kMaxBlocksPerRow / 32; ++r) {
      if (ballot[r] >> lane & 1u) {
        int pos = before + __popc(ballot[r] & ((1u << lane) - 1u)) - rot;
        if (pos < 0) pos += total;
        sm.block_list[pos] = static_cast<uint8_t>(32 * r + lane);
      }
      before += __popc(ballot[r]);
    }
    if (lane == 0) sm.num_blocks = total;
  }
  hw::named_bar_sync(kBar, 128);
}

// L2 prefetch of the first kLines 128-byte lines of the rows base + key * pitch_bytes whose keys lanes
// 0..15 of the warp hold (invalid keys skipped): one warp instruction per row, lane l fetching line l.
template <int kLines>
__device__ __forceinline__ void prefetch_rows_l2(const void* base, int64_t pitch_bytes, int32_t key, int64_t t_kv,
                                                 int lane) {
#pragma unroll 1
  for (int j = 0; j < 16; ++j) {
    const int32_t k = __shfl_sync(0xffffffffu, key, j);
    if (key_valid(k, t_kv) && lane < kLines)
      hw::prefetch_l2(static_cast<const char*>(base) + k * pitch_bytes + 128 * lane);
  }
}

// ---- P, dS and their bf16 tiles ---------------------------------------------------------------

// Offsets of the accumulator element pairs (row r0 / r0 + 8, keys 8n + 2q4, +1) in a [64 h][64 keys]
// bf16 SW128 tile.
__device__ __forceinline__ uint32_t tile_pair_offset(int row, int n, int q4) {
  return hw::sw128_offset(row, n) + 4 * q4;
}

// s <- P = exp(scale S - lse) on valid keys, 0 elsewhere; idx: the keys of the block (smem).
__device__ __forceinline__ void exp_scores(float (&s)[32], const int32_t* idx, const MainParams& p, float lse2_lo,
                                           float lse2_hi, int q4) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int2 keys = *reinterpret_cast<const int2*>(&idx[8 * n + 2 * q4]);
    const bool valid[2] = {key_valid(keys.x, p.T_kv), key_valid(keys.y, p.T_kv)};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[4 * n + e] = valid[e & 1] ? exp2f(fmaf(s[4 * n + e], p.scale_log2, -(e < 2 ? lse2_lo : lse2_hi))) : 0.f;
  }
}

// dS = scale P (dP - Delta) in place on n-group n of the dP accumulator (P: its four elements).
__device__ __forceinline__ void ds_group(float (&dp)[32], int n, float p0, float p1, float p2, float p3,
                                         float delta_lo, float delta_hi, float scale) {
  dp[4 * n + 0] = p0 * (dp[4 * n + 0] - delta_lo) * scale;
  dp[4 * n + 1] = p1 * (dp[4 * n + 1] - delta_lo) * scale;
  dp[4 * n + 2] = p2 * (dp[4 * n + 2] - delta_hi) * scale;
  dp[4 * n + 3] = p3 * (dp[4 * n + 3] - delta_hi) * scale;
}

// n-group n of a [64 h x 64 keys] accumulator to its bf16 tile (rows r0, r0 + 8).
__device__ __forceinline__ void store_tile_group(char* tile, const float (&v)[32], int n, int r0, int q4) {
  *reinterpret_cast<uint32_t*>(tile + tile_pair_offset(r0, n, q4)) = hw::pack_bf16(v[4 * n], v[4 * n + 1]);
  *reinterpret_cast<uint32_t*>(tile + tile_pair_offset(r0 + 8, n, q4)) = hw::pack_bf16(v[4 * n + 2], v[4 * n + 3]);
}

// Writes dQ blocks [first_block, first_block + kBlocks) of a [64 heads x 64 kBlocks] fp32 accumulator
// (rows r0, r0 + 8 of this thread) as bf16. kPermuted (v1: permuted smem columns, hw::permuted_col):
// n-groups 2m, 2m + 1 hold columns 16m + 4q .. +3, stored as one 8-byte vector; else (v2: natural
// order) n-group n holds columns 8n + 2q, +1, stored as one 4-byte pair.
template <int kBlocks, bool kPermuted>
__device__ __forceinline__ void store_dq(const float (&acc)[kBlocks * 32], __nv_bfloat16* dq_head0, int heads,
                                         int first_block, int r0, int q4) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = r0 + 8 * half;
      if (row >= heads) continue;
#pragma unroll
      for (int v = 0; v < (kPermuted ? 4 : 8); ++v) {
        if constexpr (kPermuted) {
          const float* a = acc + 32 * j + 8 * v + 2 * half;
          const uint2 pk = make_uint2(hw::pack_bf16(a[0], a[1]), hw::pack_bf16(a[4], a[5]));
          *reinterpret_cast<uint2*>(dq_head0 + int64_t(row) * kQkCols + (first_block + j) * kColsPerBlock + 16 * v +
                                    4 * q4) = pk;
        } else {
          const float* a = acc + 32 * j + 4 * v + 2 * half;
          *reinterpret_cast<uint32_t*>(dq_head0 + int64_t(row) * kQkCols + (first_block + j) * kColsPerBlock + 8 * v +
                                       2 * q4) = hw::pack_bf16(a[0], a[1]);
        }
      }
    }
  }
}

// ---- wgmma sequences --------------------------------------------------------------------------

// acc (+)= A . KV^T over kBlocks column blocks: A = Q (S) or dO (dP), [64 heads x 64 keys] (no fence,
// no commit).
template <int kBlocks>
__device__ __forceinline__ void mma_heads_keys(float (&acc)[32], const void* a_tile, const void* kv_tile) {
#pragma unroll
  for (int ks = 0; ks < 4 * kBlocks; ++ks)
    hw::wgmma_ss_m64n64k16<0, 0>(acc, desc_k_major(a_tile, kHeadsPerCta, ks), desc_k_major(kv_tile, kBlockKeys, ks),
                                 ks > 0);
}

// dQ[:, kv blocks first.. first + 4] += dS . KV, A = dS tile (K-major), B = kv (MN-major); one
// commit group.
template <class Smem>
__device__ __forceinline__ void mma_dq_ss(float (&dq_a)[4 * 32], float (&dq_b)[32], const Smem& sm, int first) {
  hw::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t a = desc_k_major(sm.ds, kHeadsPerCta, kk);
    hw::wgmma_ss_m64n256k16<0, 1>(dq_a, a, desc_mn_major(sm.kv, kBlockKeys, kk, first), true);
    hw::wgmma_ss_m64n64k16<0, 1>(dq_b, a, desc_mn_major(sm.kv, kBlockKeys, kk, first + 4), true);
  }
  hw::wgmma_commit();
}

// dQ[:, kv blocks first.. first + 3] += dS . KV, A straight from the dS accumulator (converted before
// the fence: wgmma.fence must separate register writes from the wgmma reading them); one commit group.
__device__ __forceinline__ void mma_dq_rs(float (&dq)[4 * 32], const float (&ds)[32], const void* kv_tile,
                                          int first) {
  uint32_t a[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) hw::acc_to_a_frag(ds, kk, a[kk]);
  hw::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) hw::wgmma_rs_m64n256k16<1>(dq, a[kk], desc_mn_major(kv_tile, kBlockKeys, kk, first), true);
  hw::wgmma_commit();
}

// dKV chunk c = dS^T . Q[:, c] (+ P^T . dO[:, c] for value chunks) into acc, A read transposed from
// the tiles; one commit group.
template <class Smem>
__device__ __forceinline__ void issue_dkv_chunk(const Smem& sm, float (&acc)[32], int c) {
  hw::wgmma_fence();
#pragma unroll
  for (int hk = 0; hk < 4; ++hk)
    hw::wgmma_ss_m64n64k16<1, 1>(acc, desc_mn_major(sm.ds, kHeadsPerCta, hk, 0),
                                 desc_mn_major(sm.q, kHeadsPerCta, hk, c), hk > 0);
  if (c < kVBlocks) {
#pragma unroll
    for (int hk = 0; hk < 4; ++hk)
      hw::wgmma_ss_m64n64k16<1, 1>(acc, desc_mn_major(sm.p, kHeadsPerCta, hk, 0),
                                   desc_mn_major(sm.dout, kHeadsPerCta, hk, c), true);
  }
  hw::wgmma_commit();
}

// ---- dKV emission -----------------------------------------------------------------------------

__device__ __forceinline__ float4 shfl_xor4(float4 v, int mask) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
                     __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
}

// Fast mode: atomic add into dkv (kHint: with the L2 cache policy `policy`, FLASHDSA_BWD_L2HINT
// builds of v2 / v3); deterministic mode: plain store into the slot's partial row.
template <bool kDeterministic, bool kHint = false>
__device__ __forceinline__ void put_dkv(float* dst, float4 v, uint64_t policy = 0) {
  if constexpr (kDeterministic) hw::st_global_v4(dst, v);
  else if constexpr (kHint) red_add_v4_hint(dst, v, policy);
  else hw::red_add_v4(dst, v);
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk held as a wgmma accumulator in which quad member q
// holds, for its rows r0 and r0 + 8 (r0 = 16 warp + lane / 4), four consecutive stored columns
// 16m + 4q .. +3 in n-groups 2m, 2m + 1 (v1: permuted smem columns; v2: natural columns, stored
// interleaved). The even quad of a quad pair (odd = (lane / 4) % 2 = 0) keeps m = 0, 2 of its row and
// receives m = 0, 2 of the odd quad's row; the odd quad keeps m = 1, 3 and receives the even quad's
// m = 1, 3. Then each 16-byte store of the 8 lanes covers one full 128-byte line of one row: 4 lines
// per warp instruction. Thread (warp, lane) emits rows A = r0 + 8 half - odd and B = A + 1 where
// valid[half][A / B], at dst(half, 0 / 1) (the row's chunk start plus this lane's column).
// kAddressesFirst: form both row addresses before the validity tests (v1) or inside them (v2); each
// kernel keeps the order it was measured with (the other one changes its SASS). kHint / policy:
// put_dkv's L2 cache policy (FLASHDSA_BWD_L2HINT builds of v2 / v3).
template <bool kDeterministic, bool kAddressesFirst, bool kHint = false, class Dst>
__device__ __forceinline__ void emit_dkv_pairs(const float (&acc)[32], const bool (&valid)[2][2], int lane, Dst dst,
                                               uint64_t policy = 0) {
  const bool odd = (lane >> 2) & 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float4 piece[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
      piece[m] = make_float4(acc[8 * m + 2 * half], acc[8 * m + 2 * half + 1], acc[8 * m + 4 + 2 * half],
                             acc[8 * m + 5 + 2 * half]);
    const float4 got0 = shfl_xor4(odd ? piece[0] : piece[1], 4);
    const float4 got1 = shfl_xor4(odd ? piece[2] : piece[3], 4);
    const float4 a0 = odd ? got0 : piece[0], a1 = odd ? got1 : piece[2];  // row A, columns +0 / +32
    const float4 b0 = odd ? piece[1] : got0, b1 = odd ? piece[3] : got1;  // row B
    float* dst_a = nullptr;
    float* dst_b = nullptr;
    if constexpr (kAddressesFirst) {
      dst_a = dst(half, 0);
      dst_b = dst(half, 1);
    }
    if (valid[half][0]) {
      if constexpr (!kAddressesFirst) dst_a = dst(half, 0);
      put_dkv<kDeterministic, kHint>(dst_a, a0, policy);
      put_dkv<kDeterministic, kHint>(dst_a + 32, a1, policy);
    }
    if (valid[half][1]) {
      if constexpr (!kAddressesFirst) dst_b = dst(half, 1);
      put_dkv<kDeterministic, kHint>(dst_b, b0, policy);
      put_dkv<kDeterministic, kHint>(dst_b + 32, b1, policy);
    }
  }
}

// ---- attention mass ---------------------------------------------------------------------------

// Slots of keys 2 lane, 2 lane + 1 of list block blk (warp 0 of the scoring warpgroup, mass output
// only: the caller keeps {0, 0} elsewhere; loaded early, written by emit_mass after S).
__device__ __forceinline__ int2 mass_slot_of(const MainParams& p, const Work& w, int blk, int lane) {
  const int pos = blk * kBlockKeys + 2 * lane;
  if (p.mass_slots == nullptr) return make_int2(pos, pos + 1);
  const int64_t row0 = w.local_token * int64_t(p.K);
  const int2 pair = *reinterpret_cast<const int2*>(p.mass_slots + row0 + pos);
  return make_int2(static_cast<int>(pair.x - row0), static_cast<int>(pair.y - row0));
}

template <int kHalf>
__device__ __forceinline__ void mass_halve(float (&v)[16], int lane, int mask) {
  const bool upper = (lane & mask) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float mine = upper ? v[kHalf + j] : v[j];
    const float other = upper ? v[j] : v[kHalf + j];
    v[j] = mine + __shfl_xor_sync(0xffffffffu, other, mask);
  }
}

// Attention mass of one key block: the column sums of P [64 heads x 64 keys] over the CTA's heads,
// added to mass[token, slot] (zeroed before the launch; two head-group CTAs add at H = 128: the sum
// of two terms onto 0 is order-independent, so the result is still reproducible).
// P is the accumulator s of the scoring warpgroup (thread: heads r0, r0 + 8; keys 8n + 2 q4 + {0, 1}).
// In-thread sum of the two heads, butterfly reduce-scatter over the 8 lanes of equal q4 (lane L ends
// with keys 2L, 2L + 1), warps 1..3 hand their sums to warp 0 through smem (named barrier kBar), warp
// 0 adds them in warp order. `slot` = the slots of keys 2L, 2L + 1 (mass_slot_of).
template <int kBar, class Smem>
__device__ __forceinline__ void emit_mass(const MainParams& p, Smem& sm, const Work& w, const float (&s)[32],
                                          int2 slot, int warp, int lane) {
  float v[16];  // v[2n + e]: key 8n + 2 q4 + e, summed over this thread's two heads
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    v[2 * n] = s[4 * n] + s[4 * n + 2];
    v[2 * n + 1] = s[4 * n + 1] + s[4 * n + 3];
  }
  // Three halving steps: lane bit 4 / 3 / 2 selects which half of the remaining keys it keeps.
  mass_halve<8>(v, lane, 16);
  mass_halve<4>(v, lane, 8);
  mass_halve<2>(v, lane, 4);
  if (warp > 0) *reinterpret_cast<float2*>(&sm.mass_part[warp - 1][2 * lane]) = make_float2(v[0], v[1]);
  hw::named_bar_sync(kBar, 128);
  if (warp != 0) return;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const float2 o = *reinterpret_cast<const float2*>(&sm.mass_part[k][2 * lane]);
    v[0] += o.x;
    v[1] += o.y;
  }
  float* const row = p.mass + w.token * int64_t(p.K);
  if (p.mass_slots == nullptr) {
    hw::red_add_v2(row + slot.x, make_float2(v[0], v[1]));  // slot.y = slot.x + 1
  } else {
    hw::red_add(row + slot.x, v[0]);
    hw::red_add(row + slot.y, v[1]);
  }
}

}  // namespace detail
}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
