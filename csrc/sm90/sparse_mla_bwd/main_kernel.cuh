// Internal: the sparse MLA backward main kernel (docs/spec.md §5): per query token and group of 64
// heads, recomputes S = Q.KV^T and dP = dO.V^T block by block over the token's top-k keys, forms
// P and dS, accumulates dQ in registers and emits each key block's dKV contribution (key role,
// 576 columns, and value role, 512 columns) already summed over the 64 heads.
// Design, smem plan and pipeline: docs/kernels/sparse_mla_bwd.md. Shapes: config.h.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/kernel_common.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl {

namespace detail {

// ---- producer warpgroup -----------------------------------------------------------------------

// Copies of 128-byte row segments (64 bf16 columns of one tile block) into a permuted SW128 tile:
// lane l of a warp moves columns 2l, 2l+1 (one 4-byte word) to their stored position (hw::permuted_col).
struct RowSegmentCopier {
  uint32_t chunk, byte_in_chunk;  // this lane's destination inside a tile row
  int lane;
  __device__ explicit RowSegmentCopier(int lane_) : lane(lane_) {
    const int pos = hw::permuted_col(2 * lane_);
    chunk = pos / 8;
    byte_in_chunk = (pos % 8) * 2;
  }
  // Tile row `row` (shared address `tile`), blocks [0, kBlocks) <- src_row[64 b + 2 lane, +1].
  template <int kBlocks>
  __device__ __forceinline__ void copy_row(uint32_t tile, int row, const __nv_bfloat16* src_row, bool valid) const {
    const uint32_t dst = tile + hw::sw128_offset(row, chunk) + byte_in_chunk;
    const __nv_bfloat16* src = src_row + 2 * lane;
    asm("" : "+l"(src));  // one pointer, immediate offsets per block (else one 64-bit IMAD per copy)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) hw::cp_async_4(dst + b * kTileBlockBytes, src + b * kColsPerBlock, valid);
  }
};

// Loads Q, dO, lse, Delta, lists the non-empty key blocks of the row (rotated by the sweep phase),
// then gathers the kv rows of each block. Warp w handles tile rows w, w + 4, ..., w + 60.
__device__ void produce(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const int h0 = w.head_group * kHeadsPerCta;
  const int32_t* idx_row = p.indices + w.local_token * p.indices_stride_t;
  const int num_row_blocks = p.K / kBlockKeys;
  const RowSegmentCopier copier(lane);
  const uint32_t q_tile = hw::smem_u32(sm.q), do_tile = hw::smem_u32(sm.dout), kv_tile = hw::smem_u32(sm.kv);

#pragma unroll 1
  for (int h = warp; h < kHeadsPerCta; h += 4) {
    const bool real = h < w.heads;
    const int hh = real ? h0 + h : 0;  // never read a padded head
    const __nv_bfloat16* q_row = p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h;
    const __nv_bfloat16* do_row = p.dout + (w.token * p.H + hh) * int64_t(kVCols);
    copier.copy_row<kQkBlocks>(q_tile, h, q_row, real);
    copier.copy_row<kVBlocks>(do_tile, h, do_row, real);
  }
  hw::cp_async_arrive(&sm.qdo_full);
  if (tid < kHeadsPerCta) {
    const bool real = tid < w.heads;
    const int64_t at = w.token * p.H + h0 + tid;
    sm.lse2[tid] = real ? p.lse[at] * hw::kLog2e : __int_as_float(0x7f800000);  // +inf: P = 0
    sm.delta[tid] = real ? p.delta[at] : 0.f;
  }
  build_block_list<kBarProducer>(p, sm, idx_row, num_row_blocks, warp, lane);
  hw::mbar_arrive(&sm.qdo_full);

  const int num_blocks = sm.num_blocks;
  const bool sweep = p.sweep_counter != nullptr;
  // Index of tile row warp + 4 lane (lanes < 16) of block i of the list.
  auto block_indices = [&](int i) {
    return lane < 16 && i < num_blocks ? idx_row[sm.block_list[i] * kBlockKeys + warp + 4 * lane] : -1;
  };
  int32_t my_idx = block_indices(0);
#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    // The single kv tile is free once both consumer warpgroups finished dQ of block i - 1; that also
    // ends every read of idx[i % 2] by block i - 2.
    if (i > 0) hw::mbar_wait(&sm.kv_empty, (i - 1) & 1);
    if (lane < 16) sm.idx[i & 1][warp + 4 * lane] = my_idx;
#pragma unroll 1
    for (int j = 0; j < 16; ++j) {
      const int32_t key = __shfl_sync(0xffffffffu, my_idx, j);
      const bool valid = key_valid(key, p.T_kv);
      const __nv_bfloat16* src = p.kv + (valid ? int64_t(key) : 0) * p.kv_stride_t;
      copier.copy_row<kQkBlocks>(kv_tile, warp + 4 * j, src, valid);
    }
    hw::cp_async_arrive(&sm.kv_full);
    hw::mbar_arrive(&sm.kv_full);
    const int32_t next_idx = block_indices(i + 1);
    if (sweep) {
      if (tid == 0) hw::red_add_u32(p.sweep_counter, 1u);
      // kv and dkv no longer fit in L2: fetch the dkv rows this block's atomics will update (about
      // half a block from now) and the kv rows of the next block (gathered about a block from now),
      // so that neither waits for DRAM.
      prefetch_rows_l2<kQkCols * 4 / 128>(p.dkv, kQkCols * 4, my_idx, p.T_kv, lane);
      prefetch_rows_l2<kQkCols * 2 / 128>(p.kv, p.kv_stride_t * 2, next_idx, p.T_kv, lane);
    }
    my_idx = next_idx;
  }
}

// ---- consumers: shared pieces -----------------------------------------------------------------

// dkv destinations of one thread for the current key block. Lanes of quads 2k and 2k+1 (lane / 4)
// write together: thread (warp, lane) emits rows A = r0 + 8 half - odd and B = A + 1 for half = 0, 1,
// where r0 = 16 warp + lane / 4 and odd = (lane / 4) % 2.
struct DkvRows {
  float* dst[2][2];    // [half][row A, row B]: start of the dkv (or partial) row + this lane's column
  bool valid[2][2];
};

template <bool kDeterministic>
__device__ __forceinline__ DkvRows dkv_rows(const MainParams& p, const SmemPlan& sm, const Work& w, int stage,
                                            int blk, int warp, int lane) {
  const int odd = (lane >> 2) & 1;
  const int col = 16 * odd + 4 * (lane & 3);
  float* const partial_row0 =
      kDeterministic ? p.partial + (w.local_token * gridDim.y + w.head_group) * p.K * int64_t(kQkCols) : nullptr;
  DkvRows r;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      const int row = 16 * warp + (lane >> 2) + 8 * half - odd + ab;
      const int32_t key = sm.idx[stage][row];
      r.valid[half][ab] = key_valid(key, p.T_kv);
      const int64_t at = kDeterministic ? int64_t(blk) * kBlockKeys + row : (r.valid[half][ab] ? key : 0);
      r.dst[half][ab] = (kDeterministic ? partial_row0 : p.dkv) + at * kQkCols + col;
    }
  }
  return r;
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk (global column block `chunk`) held as a wgmma
// accumulator over permuted column positions (hw::permuted_col), as emit_dkv_pairs() describes.
template <bool kDeterministic>
__device__ __forceinline__ void emit_dkv_chunk(const float (&acc)[32], int chunk, const DkvRows& rows, int lane) {
  const int c0 = chunk * kColsPerBlock;
  emit_dkv_pairs<kDeterministic, true>(acc, rows.valid, lane,
                                       [&](int half, int ab) { return rows.dst[half][ab] + c0; });
}

// Consumers: waits for Q, dO, lse, Delta and the block list (cp.async data, generic proxy, is read
// by wgmma, async proxy).
__device__ __forceinline__ void wait_setup(SmemPlan& sm) {
  hw::mbar_wait(&sm.qdo_full, 0);
  hw::fence_proxy_async();
}

// Consumers: waits for the kv tile (and idx) of list block i; returns i % 2, its idx stage and the
// phase of every per-block barrier.
__device__ __forceinline__ int wait_kv(SmemPlan& sm, int i) {
  hw::mbar_wait(&sm.kv_full, i & 1);
  hw::fence_proxy_async();
  return i & 1;
}

// A fragments of the transposed [64 h][64 keys] tile (M = keys, K = heads), 4 k-steps of 16 heads.
__device__ __forceinline__ void load_transposed_frags(const void* tile, uint32_t (&frag)[4][4], int warp, int lane) {
  const int m = lane / 8;  // matrix: heads +8*(m/2), keys +8*(m%2)
  const uint32_t base = hw::smem_u32(tile);
#pragma unroll
  for (int hk = 0; hk < 4; ++hk) {
    const int head = 16 * hk + 8 * (m / 2) + lane % 8;
    hw::ldmatrix_x4_trans(frag[hk], base + hw::sw128_offset(head, 2 * warp + m % 2));
  }
}

// ---- WG0: S, P; dQ for kv blocks [0, 5); dKV value chunks [5, 8) and the rope chunk -----------
template <bool kDeterministic>
__device__ void wg0_scores(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;  // accumulator rows (heads) r0 and r0 + 8
  float dq_a[4 * 32], dq_b[32];         // dQ columns of kv blocks 0..3 and 4
#pragma unroll
  for (int i = 0; i < 4 * 32; ++i) dq_a[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) dq_b[i] = 0.f;

  wait_setup(sm);
  const float lse2_lo = sm.lse2[r0], lse2_hi = sm.lse2[r0 + 8];
  const int num_blocks = sm.num_blocks;
  char* const p_tile = reinterpret_cast<char*>(sm.p);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = wait_kv(sm, i);
    // Mass output: slots of keys 2 lane, 2 lane + 1 of this block (warp 0 writes them after S).
    int2 mass_slot = make_int2(0, 0);
    if (p.mass != nullptr && warp == 0) mass_slot = mass_slot_of(p, w, sm.block_list[i], lane);

    float s[32];  // S = Q . KV^T: [64 heads x 64 keys]
    hw::wgmma_fence();
    mma_heads_keys<kQkBlocks>(s, sm.q, sm.kv);
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(s);

    exp_scores(s, sm.idx[st], p, lse2_lo, lse2_hi, q4);  // P
    if (i > 0) hw::mbar_wait(&sm.tiles_free, (i - 1) & 1);  // WG1 has read P of block i - 1
#pragma unroll
    for (int n = 0; n < 8; ++n) store_tile_group(p_tile, s, n, r0, q4);
    hw::fence_proxy_async();  // the P tile is a wgmma operand (dKV below)
    hw::mbar_arrive(&sm.p_full);
    // While WG1 forms dS: the block's attention mass (optional output). mass_part is rewritten by
    // warps 1..3 only after kv_full of block i + 1, i.e. after warp 0's kv_empty arrival below.
    if (p.mass != nullptr) emit_mass<kBarWg0Mass>(p, sm, w, s, mass_slot, warp, lane);

    // dQ[:, kv blocks 0..4] += dS . KV (A = dS tile, K-major; B = kv, MN-major).
    hw::mbar_wait(&sm.ds_full, st);
    mma_dq_ss(dq_a, dq_b, sm, 0);
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm, w, st, sm.block_list[i], warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq_a);
    hw::fence_regs(dq_b);
    hw::mbar_arrive(&sm.kv_empty);

    // dKV[:, c] = dS^T . Q[:, c] (+ P^T . dO[:, c] on value chunks); A read transposed from the tiles.
#pragma unroll
    for (int c = kWg1DkvChunks; c < kQkBlocks; ++c) {
      float acc[32];
      issue_dkv_chunk(sm, acc, c);
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      emit_dkv_chunk<kDeterministic>(acc, c, rows, lane);
    }
  }

  __nv_bfloat16* const dq_head0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<4, true>(dq_a, dq_head0, w.heads, 0, r0, q4);
  store_dq<1, true>(dq_b, dq_head0, w.heads, 4, r0, q4);
}

// ---- WG1: dP, dS; dQ for kv blocks [5, 9); dKV value chunks [0, 5) ------------------------------
template <bool kDeterministic>
__device__ void wg1_grads(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;
  float dq[kWg1DqBlocks * 32];
#pragma unroll
  for (int i = 0; i < kWg1DqBlocks * 32; ++i) dq[i] = 0.f;

  wait_setup(sm);
  const float delta_lo = sm.delta[r0], delta_hi = sm.delta[r0 + 8];
  const int num_blocks = sm.num_blocks;
  char* const p_tile = reinterpret_cast<char*>(sm.p);
  char* const ds_tile = reinterpret_cast<char*>(sm.ds);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = wait_kv(sm, i);

    float dp[32];  // dP = dO . V^T: [64 heads x 64 keys]
    hw::wgmma_fence();
    mma_heads_keys<kVBlocks>(dp, sm.dout, sm.kv);
    hw::wgmma_commit();
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm, w, st, sm.block_list[i], warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dp);

    // dS = scale P (dP - Delta), in place, with P (bf16) from WG0's tile.
    hw::mbar_wait(&sm.p_full, st);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 p_lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p_tile + tile_pair_offset(r0, n, q4)));
      const float2 p_hi =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p_tile + tile_pair_offset(r0 + 8, n, q4)));
      ds_group(dp, n, p_lo.x, p_lo.y, p_hi.x, p_hi.y, delta_lo, delta_hi, p.scale);
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) store_tile_group(ds_tile, dp, n, r0, q4);
    hw::fence_proxy_async();  // the dS tile is a wgmma operand of WG0
    hw::mbar_arrive(&sm.ds_full);

    // dQ[:, kv blocks 5..8] += dS . KV: A straight from the dS accumulator.
    mma_dq_rs(dq, dp, sm.kv, kWg0DqBlocks);
    uint32_t ds_t[4][4], p_t[4][4];  // dS^T, P^T: M = keys, K = heads
    // Each warp reads dS^T rows (keys 16w..16w+15) of all 64 heads, i.e. values the other three
    // warps of this warpgroup stored above: wait for all of them (P is ordered by p_full).
    hw::named_bar_sync(kBarWg1Tiles, 128);
    load_transposed_frags(sm.ds, ds_t, warp, lane);
    load_transposed_frags(sm.p, p_t, warp, lane);
    hw::mbar_arrive(&sm.tiles_free);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq);
    hw::mbar_arrive(&sm.kv_empty);

    // dKV[:, c] = dS^T . Q[:, c] + P^T . dO[:, c] for value chunks 0..4.
#pragma unroll
    for (int c = 0; c < kWg1DkvChunks; ++c) {
      float acc[32];
      hw::wgmma_fence();
#pragma unroll
      for (int hk = 0; hk < 4; ++hk)
        hw::wgmma_rs_m64n64k16<1>(acc, ds_t[hk], desc_mn_major(sm.q, kHeadsPerCta, hk, c), hk > 0);
#pragma unroll
      for (int hk = 0; hk < 4; ++hk)
        hw::wgmma_rs_m64n64k16<1>(acc, p_t[hk], desc_mn_major(sm.dout, kHeadsPerCta, hk, c), true);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      emit_dkv_chunk<kDeterministic>(acc, c, rows, lane);
    }
  }

  store_dq<kWg1DqBlocks, true>(dq, p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols), w.heads,
                         kWg0DqBlocks, r0, q4);
}

}  // namespace detail

// grid = (tokens of this launch, ceil(H / 64)), kThreads, kSmemBytes dynamic.
template <bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_bwd_main_kernel(const __grid_constant__ MainParams p) {
  extern __shared__ uint8_t smem_raw[];
  SmemPlan& sm = detail::smem_plan<SmemPlan>(smem_raw);
  const detail::Work w = detail::make_work(p);
  // qdo_full, kv_full: 128 cp.async arrivals + 128 producer arrivals; kv_empty: every consumer thread.
  detail::init_barriers(detail::BarrierInit{&sm.qdo_full, 256}, detail::BarrierInit{&sm.kv_full, 256},
                        detail::BarrierInit{&sm.kv_empty, 256}, detail::BarrierInit{&sm.p_full, 128},
                        detail::BarrierInit{&sm.ds_full, 128}, detail::BarrierInit{&sm.tiles_free, 128});

  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 2) {
    hw::reg_dealloc<kProducerRegs>();
    detail::produce(p, sm, w, tid);
  } else {
    hw::reg_alloc<kConsumerRegs>();
    if (wg == 0) detail::wg0_scores<kDeterministic>(p, sm, w, tid);
    else detail::wg1_grads<kDeterministic>(p, sm, w, tid);
  }
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
