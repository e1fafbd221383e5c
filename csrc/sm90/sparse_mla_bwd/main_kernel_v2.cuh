// Internal: v2 of the sparse MLA backward main kernel (picked per call by tuning::bwd_use_v2, heuristics.h;
// design: docs/kernels/sparse_mla_bwd.md, section "v2"). Same work unit and outputs as v1
// (main_kernel.cuh): one CTA per (query token, group of 64 heads), 64-key blocks.
//
// Differences to v1:
//   - natural column order in shared memory: Q, dO and kv rows arrive with 16-byte cp.async
//     (8 threads per 128-byte row segment) instead of v1's permuted 4-byte copies;
//   - 256 threads, no producer warpgroup, both warpgroups at the full 255-register budget:
//       front (WG0): Q/dO/lse/Delta/block list, the kv gathers (and sweep counter, L2 prefetches),
//                    S and dP back to back, P (and the mass output), dS from the fp32 P, P and dS
//                    to their bf16 tiles, dQ columns [0, 256) with RS wgmma (A = dS registers);
//       back (WG1):  the nine dKV chunks (SS wgmma, A = P^T / dS^T read transposed from the tiles)
//                    with two alternating accumulators, so that chunk c's emission overlaps chunk
//                    c+1's wgmma; dQ columns [256, 576) (SS, A = dS tile) issued after chunk 0;
//                    all dkv emission (atomics or deterministic partial stores);
//   - dkv (and the deterministic partials) are written in an interleaved column order inside each
//     16-column group (v2_dkv_col()), which lets the natural-order accumulator leave as the same
//     full-line 16-byte vectors as v1; v2_unpermute_kernel restores the natural order once at the
//     end of the call (sparse_mla_bwd_v2.cuh).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/kernel_common.cuh"
#include "sm90/sparse_mla_bwd/two_wg_common.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl {
namespace v2 {

constexpr int kThreads = 256;   // WG0 front, WG1 back
constexpr int kFrontDqBlocks = 4;                      // dQ columns [0, 256): RS m64n256
constexpr int kBackDqBlocks = kQkBlocks - kFrontDqBlocks;  // [256, 576): SS m64n256 + m64n64
// Named barriers (0 is __syncthreads), 128 threads of the front warpgroup each.
constexpr int kBarFront = 1;  // front: kv (and, once, Q/dO/lse/Delta/block list) landed in smem
constexpr int kBarMass = 2;   // front: warps 1..3 stored their attention-mass column sums

// Position inside its 16-column group at which dkv column 16m + 8h + 2q + e (h, e < 2, q < 4) is
// stored during the call: 16m + 4q + 2h + e. A natural-order wgmma accumulator gives lane-quad member
// q the columns 8n + 2q + {0, 1}; n-groups 2m and 2m + 1 together are then the four consecutive
// stored positions 16m + 4q .. +3, i.e. one 16-byte vector.
__host__ __device__ constexpr int v2_dkv_pos(int col) {
  return (col & ~15) | ((col & 6) << 1) | ((col & 8) >> 2) | (col & 1);
}

// The emission contract: quad member q's accumulator pairs of n-groups 2m and 2m + 1 land on the four
// consecutive positions 16m + 4q .. +3, and the map is a permutation inside each 16-column group.
constexpr bool v2_dkv_pos_ok() {
  bool seen[16] = {};
  for (int c = 0; c < 16; ++c) {
    const int pos = v2_dkv_pos(c);
    if (pos < 0 || pos >= 16 || seen[pos]) return false;
    seen[pos] = true;
  }
  for (int m = 0; m < kQkCols / 16; ++m)
    for (int q = 0; q < 4; ++q)
      for (int e = 0; e < 2; ++e)
        if (v2_dkv_pos(16 * m + 2 * q + e) != 16 * m + 4 * q + e ||
            v2_dkv_pos(16 * m + 8 + 2 * q + e) != 16 * m + 4 * q + 2 + e)
          return false;
  return true;
}
static_assert(v2_dkv_pos_ok(), "v2 dkv column order");

struct alignas(1024) SmemPlanV2 : two_wg::SmemTiles {  // the buffers, then the barriers
  uint64_t setup_full;              // front -> back: block list and num_blocks written (once)
  uint64_t pds_full;                // front -> back: P and dS tiles (and idx) of block i written
  uint64_t kv_empty;                // back -> front: back's dQ of block i done, kv tile may be overwritten
  uint64_t tiles_free;              // back -> front: back's last dKV wgmma of block i done (P, dS free)
};
constexpr size_t kSmemBytes = sizeof(SmemPlanV2) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");

namespace detail {

using namespace two_wg;  // the pieces v2 and v3 share, and their short names (two_wg_common.cuh)
using sparse_mla_bwd_impl::detail::issue_dkv_chunk;
using sparse_mla_bwd_impl::detail::mma_dq_rs;
using sparse_mla_bwd_impl::detail::mma_dq_ss;
using sparse_mla_bwd_impl::detail::store_tile_group;

// ---- front warpgroup ------------------------------------------------------------------------------
template <bool kDeterministic>
__device__ void front(const MainParams& p, SmemPlanV2& sm, int tid) {
  const Work w = make_work(p);
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;  // accumulator rows (heads) r0, r0 + 8
  const Copier cp(tid);                 // this thread's 16-byte pieces of every tile row it gathers
  const int h0 = w.head_group * kHeadsPerCta;
  const int32_t* idx_row = p.indices + w.local_token * p.indices_stride_t;
  const int num_row_blocks = p.K / kBlockKeys;
  const uint32_t q_tile = hw::smem_u32(sm.q), do_tile = hw::smem_u32(sm.dout), kv_tile = hw::smem_u32(sm.kv);

  // Q and dO (padded heads zero-filled, never read).
#pragma unroll 1
  for (int r = 0; r < 4; ++r) {
    const int h = cp.rsub + 16 * r;
    const bool real = h < w.heads;
    const int hh = real ? h0 + h : 0;
    if constexpr (kL2Hint) {  // read once: L2::evict_first, plain loads (no hinted cp.async, l2_policy.cuh)
      const uint32_t off = cp.row_off + r * 16 * 128;
      copy_row_ldg<kQkBlocks>(q_tile + off, kHeadsPerCta * 128,
                              p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h + 8 * cp.chunk, real,
                              l2_evict_first_policy());
      copy_row_ldg<kVBlocks>(do_tile + off, kHeadsPerCta * 128,
                             p.dout + (w.token * p.H + hh) * int64_t(kVCols) + 8 * cp.chunk, real,
                             l2_evict_first_policy());
    } else {
      cp.copy_row<kQkBlocks, kHeadsPerCta>(q_tile, r, p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h, real);
      cp.copy_row<kVBlocks, kHeadsPerCta>(do_tile, r, p.dout + (w.token * p.H + hh) * int64_t(kVCols), real);
    }
  }
  if constexpr (kL2Hint) hw::fence_proxy_async();  // writer side of the st.shared Q / dO pieces (wgmma operands)
  hw::cp_async_commit();
  if (tid < kHeadsPerCta) store_lse_delta(p, sm.lse2, sm.delta, w.token * p.H + h0, tid < w.heads, tid);

  // Non-empty key blocks, rotated by the sweep phase.
  build_block_list<kBarFront>(p, sm, idx_row, num_row_blocks, warp, lane);
  hw::mbar_arrive(&sm.setup_full);
  const int num_blocks = sm.num_blocks;
  const bool sweep = p.sweep_counter != nullptr;

  // Keys of this thread's gather rows rsub + 16 r of list entry i (-1 past the end).
  auto load_keys = [&](int i, int32_t (&k)[4]) {
    const int32_t* src = idx_row + (i < num_blocks ? sm.block_list[i] : 0) * kBlockKeys + cp.rsub;
#pragma unroll
    for (int r = 0; r < 4; ++r) k[r] = i < num_blocks ? src[16 * r] : -1;
  };
  // Writes idx[i % 2], issues the gather of list entry i, then (sweep mode) counts the block and
  // prefetches into L2 the dkv rows it will update and the kv rows of entry i + 1.
  auto gather = [&](int i, const int32_t (&k)[4]) {
    gather_kv(p, sm, cp, kv_tile, i, k);
    hw::cp_async_commit();
    if (sweep) {
      if (tid == 0) hw::red_add_u32(p.sweep_counter, 1u);
      prefetch_dkv_row(p, warp_key(sm, idx_row, i, warp, lane), lane);
      if (i + 1 < num_blocks) prefetch_kv_row(p, warp_key(sm, idx_row, i + 1, warp, lane), lane);
    }
  };

  int32_t keys[4];
  if (num_blocks > 0) {
    load_keys(0, keys);
    gather(0, keys);
    load_keys(1, keys);
  }

  float dq[kFrontDqBlocks * 32];
  zero_acc(dq);
  const FrontConsts fc = front_consts(sm, r0);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    // kv of block i (and, at i = 0, Q / dO) landed: own copies, then those of the other threads.
    hw::cp_async_wait<0>();
    hw::named_bar_sync(kBarFront, 128);
    hw::fence_proxy_async();  // cp.async (generic proxy) data is read by wgmma (async proxy)
    int2 mass_slot = make_int2(0, 0);
    if (p.mass != nullptr && warp == 0) mass_slot = mass_slot_of(p, w, sm.block_list[i], lane);

    float s[32], dp[32];  // S = Q . KV^T, dP = dO . V^T: [64 heads x 64 keys]
    hw::wgmma_fence();
    mma_heads_keys<kQkBlocks>(s, sm.q, sm.kv);
    hw::wgmma_commit();
    mma_heads_keys<kVBlocks>(dp, sm.dout, sm.kv);
    hw::wgmma_commit();
    // S landed (dP may stay in flight): P = exp(scale S - lse) on valid keys, 0 elsewhere (fp32, kept
    // for dS and the mass).
    scores_to_p<1>(s, sm.idx[st], p, fc, q4);
    hw::wgmma_wait<0>();
    hw::fence_regs(dp);
    // dS = scale P (dP - Delta) from the fp32 P.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      ds_group(dp, n, s[4 * n + 0], s[4 * n + 1], s[4 * n + 2], s[4 * n + 3], fc.delta_lo, fc.delta_hi, p.scale);
    }
    if (i > 0) hw::mbar_wait(&sm.tiles_free, (i - 1) & 1);  // back's dKV of block i - 1 read the tiles
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      store_tile_group(fc.p_tile, s, n, r0, q4);
      store_tile_group(fc.ds_tile, dp, n, r0, q4);
    }
    hw::fence_proxy_async();  // the tiles are wgmma operands of the back warpgroup
    hw::mbar_arrive(&sm.pds_full);

    // dQ[:, 0:256) += dS . KV, A straight from the dS registers.
    mma_dq_rs(dq, dp, sm.kv, 0);
    // While the dQ wgmma runs: the block's attention mass (optional output). mass_part is rewritten
    // only after the kBarFront barrier of block i + 1, which warp 0 reaches after reading it.
    if (p.mass != nullptr) emit_mass<kBarMass>(p, sm, w, s, mass_slot, warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq);

    if (i + 1 < num_blocks) {
      // The kv tile is free once the back's dQ of block i completed too; idx[(i + 1) % 2] was last
      // read by the back for block i - 1, which it finished before arriving here.
      hw::mbar_wait(&sm.kv_empty, i & 1);
      gather(i + 1, keys);
      load_keys(i + 2, keys);
    }
  }

  hw::cp_async_wait<0>();  // an empty row never waited for its Q / dO copies: none may outlive the CTA
  store_dq<kFrontDqBlocks, false>(dq, p.dq + (w.token * p.H + h0) * int64_t(kQkCols), w.heads, 0, r0, q4);
}

// ---- back warpgroup -------------------------------------------------------------------------------

template <bool kDeterministic>
__device__ void back(const MainParams& p, SmemPlanV2& sm, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  float dq_a[4 * 32], dq_b[32];  // dQ columns [256, 512) and [512, 576)
  zero_acc(dq_a);
  zero_acc(dq_b);

  hw::mbar_wait(&sm.setup_full, 0);
  const int num_blocks = sm.num_blocks;

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const uint32_t ph = i & 1;
    hw::mbar_wait(&sm.pds_full, ph);
    hw::fence_proxy_async();
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm.idx[i & 1], sm.block_list[i], warp, lane);
    // Up to chunk 2 spelled out here (v3's back spells the same steps, with its dQ-first order as an
    // option): a shared function taking the dQ accumulators by reference moved v2's SASS.
    float acc0[32], acc1[32];
    issue_dkv_chunk(sm, acc0, 0);
    // dQ[:, 256:576) += dS . KV (A = dS tile, K-major; B = kv, MN-major).
    mma_dq_ss(dq_a, dq_b, sm, kFrontDqBlocks);
    issue_dkv_chunk(sm, acc1, 1);
    hw::wgmma_wait<2>();  // chunk 0
    hw::fence_regs(acc0);
    emit_dkv_chunk<kDeterministic>(acc0, 0, rows, lane);
    issue_dkv_chunk(sm, acc0, 2);
    hw::wgmma_wait<2>();  // dQ: the kv tile is no longer read by this warpgroup
    hw::fence_regs(dq_a);
    hw::fence_regs(dq_b);
    hw::mbar_arrive(&sm.kv_empty);
    back_tail<kDeterministic>(sm, acc0, acc1, rows, lane);
  }

  const Work w = make_work(p);
  const int r0 = 16 * warp + lane / 4, q4 = lane % 4;
  __nv_bfloat16* const dq_head0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<4, false>(dq_a, dq_head0, w.heads, kFrontDqBlocks, r0, q4);
  store_dq<1, false>(dq_b, dq_head0, w.heads, kFrontDqBlocks + 4, r0, q4);
}

}  // namespace detail

// grid = (tokens of this launch, ceil(H / 64)), v2::kThreads, v2::kSmemBytes dynamic.
template <bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_bwd_main_kernel_v2(const __grid_constant__ MainParams p) {
  SmemPlanV2& sm = detail::dynamic_smem_plan<SmemPlanV2>();
  detail::init_barriers(detail::BarrierInit{&sm.setup_full, 128}, detail::BarrierInit{&sm.pds_full, 128},
                        detail::BarrierInit{&sm.kv_empty, 128}, detail::BarrierInit{&sm.tiles_free, 128});

  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 0) detail::front<kDeterministic>(p, sm, tid);
  else detail::back<kDeterministic>(p, sm, tid);
}

// dkv [rows, 576] fp32, in place: stored position v2_dkv_pos(c) -> column c. One thread per
// 16-column group (64 bytes in, 64 bytes out).
__global__ void v2_unpermute_kernel(float* __restrict__ dkv, int64_t rows) {
  constexpr int kGroups = kQkCols / 16;
  const int64_t n = rows * kGroups;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n; g += int64_t(gridDim.x) * blockDim.x) {
    float4* const at = reinterpret_cast<float4*>(dkv + g * 16);
    float in[16], out[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = at[j];
      in[4 * j] = v.x, in[4 * j + 1] = v.y, in[4 * j + 2] = v.z, in[4 * j + 3] = v.w;
    }
#pragma unroll
    for (int c = 0; c < 16; ++c) out[c] = in[v2_dkv_pos(c)];
#pragma unroll
    for (int j = 0; j < 4; ++j) at[j] = make_float4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
  }
}

}  // namespace v2
}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
