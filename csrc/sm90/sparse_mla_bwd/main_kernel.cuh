// Internal: the sparse MLA backward main kernel (DSA_SPEC §5): per query token and group of 64
// heads, recomputes S = Q.KV^T and dP = dO.V^T block by block over the token's top-k keys, forms
// P and dS, accumulates dQ in registers and emits each key block's dKV contribution (key role,
// 576 columns, and value role, 512 columns) already summed over the 64 heads.
// Design, smem plan and pipeline: docs/kernels/sparse_mla_bwd.md. Shapes: config.h.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/cluster_ops.cuh"
#include "sm90/sparse_mla_bwd/config.h"

namespace flashdsa::sm90::mla_bwd {

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
  uint64_t* sweep_period_ns;  // fast mode: measured duration of one token, shared by all clusters
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;
  int64_t token_begin;        // global token of local token 0 (grid.x = 2 * tokens of this launch)
  int64_t T_kv;
  int H, K;
  float scale;                // softmax scale
  float scale_log2;           // scale * log2(e)
  uint64_t sweep_guess_ns;    // 0: process key blocks in row order; else rotate (see produce())
};

namespace detail {

using hw::desc_k_major;
using hw::desc_mn_major;

__device__ __forceinline__ bool key_valid(int32_t idx, int64_t t_kv) { return idx >= 0 && idx < t_kv; }

// Address of 16-byte chunk `ch` of row `row` in block `b` of a 64-row SW128 tile.
__device__ __forceinline__ void* tile_chunk(void* tile, int b, int row, int ch) {
  return static_cast<char*>(tile) + b * kTileBlockBytes + hw::sw128_offset(row, ch);
}

// dQ[:, n] += A . KV[:, n] for n = kBlocks consecutive 64-column blocks (A: RS fragment).
template <int kBlocks>
__device__ __forceinline__ void dq_rs(float (&d)[kBlocks * 32], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(kBlocks == 2 || kBlocks == 3, "dQ split");
  if constexpr (kBlocks == 2) hw::wgmma_rs_m64n128k16<1>(d, a, desc_b, true);
  else hw::wgmma_rs_m64n192k16<1>(d, a, desc_b, true);
}
template <int kBlocks>
__device__ __forceinline__ void dq_ss(float (&d)[kBlocks * 32], uint64_t desc_a, uint64_t desc_b) {
  static_assert(kBlocks == 2 || kBlocks == 3, "dQ split");
  if constexpr (kBlocks == 2) hw::wgmma_ss_m64n128k16<0, 1>(d, desc_a, desc_b, true);
  else hw::wgmma_ss_m64n192k16<0, 1>(d, desc_a, desc_b, true);
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

// Emits one [64 keys x 64 cols] fp32 dKV chunk held as a wgmma accumulator. Lanes 2i and 2i+1 swap
// halves so that each thread owns 4 consecutive columns of one key row: the even lane row r0, the
// odd lane row r0 + 8 (= the `dst` row the caller picked), columns 8n + colbase .. +3.
template <bool kDeterministic>
__device__ __forceinline__ void flush_dkv_chunk(const float (&acc)[32], float* dst, bool valid, int lane) {
  const bool odd = lane & 1;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float send0 = odd ? acc[4 * n + 0] : acc[4 * n + 2];
    const float send1 = odd ? acc[4 * n + 1] : acc[4 * n + 3];
    const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
    const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
    const float4 v = odd ? make_float4(got0, got1, acc[4 * n + 2], acc[4 * n + 3])
                         : make_float4(acc[4 * n + 0], acc[4 * n + 1], got0, got1);
    if (valid) {
      if constexpr (kDeterministic) hw::st_global_v4(dst + 8 * n, v);
      else hw::red_add_v4(dst + 8 * n, v);
    }
  }
}

// Writes a [64 heads x 64*kBlocks] fp32 accumulator (local kv blocks first_block..) as bf16 dq.
template <class Cfg, int kBlocks>
__device__ __forceinline__ void store_dq(const float (&acc)[kBlocks * 32], __nv_bfloat16* dq_head0, int heads,
                                         int first_block, int r0, int q4) {
#pragma unroll
  for (int g = 0; g < kBlocks * 8; ++g) {
    const int col = 8 * g + 2 * q4;
    const int gcol = Cfg::global_block(first_block + col / kColsPerBlock) * kColsPerBlock + col % kColsPerBlock;
    if (r0 < heads)
      *reinterpret_cast<uint32_t*>(dq_head0 + int64_t(r0) * kQkCols + gcol) = hw::pack_bf16(acc[4 * g], acc[4 * g + 1]);
    if (r0 + 8 < heads)
      *reinterpret_cast<uint32_t*>(dq_head0 + int64_t(r0 + 8) * kQkCols + gcol) =
          hw::pack_bf16(acc[4 * g + 2], acc[4 * g + 3]);
  }
}

// Coordinates of this cluster's work item.
struct Work {
  int64_t local_token;  // row of this launch
  int64_t token;        // global query token
  int head_group;       // heads [64 g, 64 g + 64)
  int heads;            // real heads of the group (< 64 for H = 16, 32: the rest is zero padding)
};

// ---- producer warpgroup -----------------------------------------------------------------------
// Loads Q, dO, lse, Delta, lists the non-empty key blocks of the row (rotated by the sweep phase),
// then gathers the kv rows of each block (own columns only) into the two-stage ring.
template <class Cfg>
__device__ void produce(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int ch = tid % 8;   // 16-byte chunk of a 128-byte tile row
  const int rg = tid / 8;   // rows rg, rg + 16, rg + 32, rg + 48
  const int warp = tid / 32, lane = tid % 32;
  const int h0 = w.head_group * kHeadsPerCta;
  const int32_t* idx_row = p.indices + w.local_token * p.indices_stride_t;
  const int num_row_blocks = p.K / kBlockKeys;

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = rg + 16 * i;
    const bool real = h < w.heads;
    const int hh = real ? h0 + h : 0;  // never read a padded head
    const __nv_bfloat16* q_row = p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h + ch * 8;
    const __nv_bfloat16* do_row = p.dout + (w.token * p.H + hh) * int64_t(kVCols) + ch * 8;
#pragma unroll
    for (int b = 0; b < kQBlocks; ++b)
      hw::cp_async_16(tile_chunk(sm.q, b, h, ch), q_row + Cfg::global_block(b) * kColsPerBlock, real);
#pragma unroll
    for (int b = 0; b < kVBlocksPerCta; ++b)
      hw::cp_async_16(tile_chunk(sm.dout, b, h, ch), do_row + Cfg::global_block(b) * kColsPerBlock, real);
  }
  hw::cp_async_arrive(&sm.qdo_full);
  if (tid < kHeadsPerCta) {
    const bool real = tid < w.heads;
    const int64_t at = w.token * p.H + h0 + tid;
    sm.lse2[tid] = real ? p.lse[at] * 1.4426950408889634f : __int_as_float(0x7f800000);  // +inf: P = 0
    sm.delta[tid] = real ? p.delta[at] : 0.f;
  }

  // Blocks holding at least one valid index (rows are often -1-padded at the end).
  for (int blk = warp; blk < num_row_blocks; blk += 4) {
    const bool v = key_valid(idx_row[blk * kBlockKeys + lane], p.T_kv) ||
                   key_valid(idx_row[blk * kBlockKeys + 32 + lane], p.T_kv);
    const bool any = __any_sync(0xffffffffu, v);
    if (lane == 0) sm.block_list[blk] = any ? 1 : 0;  // flags first, compacted below
  }
  hw::named_bar_sync(1, 128);
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
    // Start at the block the sweep phase points to (0 without sweep), wrap around.
    const int rot = total > 0 ? min(static_cast<int>(sm.phase * total), total - 1) : 0;
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
  hw::named_bar_sync(1, 128);
  hw::mbar_arrive(&sm.qdo_full);

  const int num_blocks = sm.num_blocks;
  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    const int blk = sm.block_list[i];
    int32_t idx[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) idx[r] = idx_row[blk * kBlockKeys + rg + 16 * r];
    if (i >= 2) hw::mbar_wait(&sm.kv_empty[st], ((i >> 1) + 1) & 1);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = rg + 16 * r;
      const bool valid = key_valid(idx[r], p.T_kv);
      const __nv_bfloat16* src = p.kv + (valid ? int64_t(idx[r]) : 0) * p.kv_stride_t + ch * 8;
#pragma unroll
      for (int b = 0; b < Cfg::kKvBlocks; ++b)
        hw::cp_async_16(tile_chunk(sm.kv[st], b, row, ch), src + Cfg::global_block(b) * kColsPerBlock, valid);
      if (ch == 0) sm.idx[st][row] = idx[r];
    }
    hw::cp_async_arrive(&sm.kv_full[st]);
    hw::mbar_arrive(&sm.kv_full[st]);
  }
}

// ---- WG0: scores, P, dS, and dQ for kv blocks 0..1 ----------------------------------------------
template <class Cfg>
__device__ void scores_and_dq(const MainParams& p, SmemPlan& sm, const Work& w, int tid, uint32_t peer) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;  // accumulator rows (heads) r0 and r0 + 8
  constexpr int kDq = Cfg::kWg0DqBlocks;
  float dq[kDq * 32];
#pragma unroll
  for (int i = 0; i < kDq * 32; ++i) dq[i] = 0.f;

  hw::mbar_wait(&sm.qdo_full, 0);
  hw::fence_proxy_async();  // cp.async (generic proxy) data is read by wgmma (async proxy)
  const float lse2_lo = sm.lse2[r0], lse2_hi = sm.lse2[r0 + 8];
  const float delta_lo = sm.delta[r0], delta_hi = sm.delta[r0 + 8];
  const uint32_t peer_xchg = hw::map_to_cta(&sm.xchg[0][tid], peer);
  const uint32_t peer_xchg_full = hw::map_to_cta(&sm.xchg_full, peer);
  const uint32_t peer_xchg_free = hw::map_to_cta(&sm.xchg_free, peer);
  const int num_blocks = sm.num_blocks;

  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    const uint32_t ph = (i >> 1) & 1;
    hw::mbar_wait(&sm.kv_full[st], ph);
    hw::fence_proxy_async();

    // Partial S (own Q / kv columns) and dP (own value columns): [64 heads x 64 keys] each.
    float s[32], dp[32];
    hw::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * Cfg::kKvBlocks; ++ks)
      hw::wgmma_ss_m64n64k16<0, 0>(s, desc_k_major(sm.q, kHeadsPerCta, ks), desc_k_major(sm.kv[st], kBlockKeys, ks),
                                   ks > 0);
#pragma unroll
    for (int ks = 0; ks < 4 * kVBlocksPerCta; ++ks)
      hw::wgmma_ss_m64n64k16<0, 0>(dp, desc_k_major(sm.dout, kHeadsPerCta, ks),
                                   desc_k_major(sm.kv[st], kBlockKeys, ks), ks > 0);
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(s);
    hw::fence_regs(dp);

    // Exchange partials with the peer CTA: write ours into its xchg, read its from ours. Both CTAs
    // then add own + peer: fp32 addition commutes, so both get bitwise the same S and dP.
    if (i > 0) hw::mbar_wait_cluster(&sm.xchg_free, (i - 1) & 1);
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      hw::st_cluster_v4(peer_xchg + v * 128 * 16, make_float4(s[4 * v], s[4 * v + 1], s[4 * v + 2], s[4 * v + 3]));
      hw::st_cluster_v4(peer_xchg + (8 + v) * 128 * 16,
                        make_float4(dp[4 * v], dp[4 * v + 1], dp[4 * v + 2], dp[4 * v + 3]));
    }
    hw::mbar_arrive_cluster(peer_xchg_full);
    hw::mbar_wait_cluster(&sm.xchg_full, i & 1);
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      const float4 ps = sm.xchg[v][tid], pd = sm.xchg[8 + v][tid];
      s[4 * v] += ps.x, s[4 * v + 1] += ps.y, s[4 * v + 2] += ps.z, s[4 * v + 3] += ps.w;
      dp[4 * v] += pd.x, dp[4 * v + 1] += pd.y, dp[4 * v + 2] += pd.z, dp[4 * v + 3] += pd.w;
    }
    hw::mbar_arrive_cluster(peer_xchg_free);

    // P = exp(scale S - lse) on valid keys, dS = scale P (dP - Delta), in place (s -> P, dp -> dS).
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int2 keys = *reinterpret_cast<const int2*>(&sm.idx[st][8 * n + 2 * q4]);
      const bool valid[2] = {key_valid(keys.x, p.T_kv), key_valid(keys.y, p.T_kv)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse2 = e < 2 ? lse2_lo : lse2_hi;
        const float delta = e < 2 ? delta_lo : delta_hi;
        const float pv = valid[e & 1] ? exp2f(fmaf(s[4 * n + e], p.scale_log2, -lse2)) : 0.f;
        s[4 * n + e] = pv;
        dp[4 * n + e] = pv * (dp[4 * n + e] - delta) * p.scale;
      }
    }

    // P and dS as bf16 [64 h][64 keys] tiles for WG1 (dQ of its blocks, dKV).
    const int b = st;
    if (i >= 2) hw::mbar_wait(&sm.tiles_free[b], ph ^ 1);
    char* p_tile = reinterpret_cast<char*>(sm.p[b]);
    char* ds_tile = reinterpret_cast<char*>(sm.ds[b]);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const uint32_t lo = hw::sw128_offset(r0, n) + 4 * q4, hi = hw::sw128_offset(r0 + 8, n) + 4 * q4;
      *reinterpret_cast<uint32_t*>(p_tile + lo) = hw::pack_bf16(s[4 * n], s[4 * n + 1]);
      *reinterpret_cast<uint32_t*>(p_tile + hi) = hw::pack_bf16(s[4 * n + 2], s[4 * n + 3]);
      *reinterpret_cast<uint32_t*>(ds_tile + lo) = hw::pack_bf16(dp[4 * n], dp[4 * n + 1]);
      *reinterpret_cast<uint32_t*>(ds_tile + hi) = hw::pack_bf16(dp[4 * n + 2], dp[4 * n + 3]);
    }
    hw::fence_proxy_async();  // ds tile is a wgmma operand of WG1
    hw::mbar_arrive(&sm.tiles_full[b]);

    // dQ[:, kv blocks 0..kDq) += dS . KV: A straight from the dS accumulator (converted before the
    // fence: wgmma.fence must separate register writes from the wgmma reading them).
    uint32_t a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) hw::acc_to_a_frag(dp, kk, a[kk]);
    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) dq_rs<kDq>(dq, a[kk], desc_mn_major(sm.kv[st], kBlockKeys, kk, 0));
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(dq);
    hw::mbar_arrive(&sm.kv_empty[st]);
  }

  store_dq<Cfg, kDq>(dq, p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols), w.heads, 0, r0, q4);
}

// ---- WG1: dQ for kv blocks 2.., then dKV chunk by chunk, emitted as atomics or partials ---------
template <class Cfg, bool kDeterministic>
__device__ void dq_and_dkv(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;
  const int my_key_row = r0 + 8 * (lane & 1);  // dkv row this thread emits (see flush_dkv_chunk)
  const int colbase = (lane & 2) * 2;          // first of its 4 columns within each 8-column group
  constexpr int kDq = Cfg::kWg1DqBlocks;
  constexpr int kChunks = Cfg::kDkvChunks;
  // dkv rows go to dkv[key] (fast) or to the partial row of the (token, head group, slot).
  float* const dst_base =
      (kDeterministic ? p.partial + (w.local_token * gridDim.y + w.head_group) * p.K * int64_t(kQkCols) : p.dkv) +
      colbase;
  float dq[kDq * 32];
#pragma unroll
  for (int i = 0; i < kDq * 32; ++i) dq[i] = 0.f;

  hw::mbar_wait(&sm.qdo_full, 0);
  hw::fence_proxy_async();
  const int num_blocks = sm.num_blocks;

  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1, b = i & 1;
    const uint32_t ph = (i >> 1) & 1;
    hw::mbar_wait(&sm.kv_full[st], ph);
    hw::mbar_wait(&sm.tiles_full[b], ph);
    hw::fence_proxy_async();
    const int32_t key = sm.idx[st][my_key_row];
    const int slot = sm.block_list[i] * kBlockKeys + my_key_row;

    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      dq_ss<kDq>(dq, desc_k_major(sm.ds[b], kHeadsPerCta, kk),
                 desc_mn_major(sm.kv[st], kBlockKeys, kk, Cfg::kWg0DqBlocks));
    hw::wgmma_commit();
    uint32_t ds_t[4][4], p_t[4][4];  // dS^T, P^T: M = keys, K = heads
    load_transposed_frags(sm.ds[b], ds_t, warp, lane);
    load_transposed_frags(sm.p[b], p_t, warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq);
    hw::mbar_arrive(&sm.kv_empty[st]);
    hw::mbar_arrive(&sm.tiles_free[b]);

    const bool valid = key_valid(key, p.T_kv);
    float* const dst = dst_base + (kDeterministic ? slot : (valid ? key : 0)) * int64_t(kQkCols);

    // dKV[:, chunk c] = dS^T . Q[:, c] (+ P^T . dO[:, c] on value columns). Two accumulators:
    // chunk c's wgmmas run while chunk c-1 is emitted.
    float acc[2][32];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      hw::wgmma_fence();
#pragma unroll
      for (int hk = 0; hk < 4; ++hk)
        hw::wgmma_rs_m64n64k16<1>(acc[c & 1], ds_t[hk], desc_mn_major(sm.q, kHeadsPerCta, hk, c), hk > 0);
      if (c < kVBlocksPerCta) {
#pragma unroll
        for (int hk = 0; hk < 4; ++hk)
          hw::wgmma_rs_m64n64k16<1>(acc[c & 1], p_t[hk], desc_mn_major(sm.dout, kHeadsPerCta, hk, c), true);
      }
      hw::wgmma_commit();
      if (c > 0) {
        hw::wgmma_wait<1>();
        hw::fence_regs(acc[(c - 1) & 1]);
        flush_dkv_chunk<kDeterministic>(acc[(c - 1) & 1], dst + Cfg::global_block(c - 1) * kColsPerBlock, valid, lane);
      }
    }
    hw::wgmma_wait<0>();
    hw::fence_regs(acc[(kChunks - 1) & 1]);
    flush_dkv_chunk<kDeterministic>(acc[(kChunks - 1) & 1], dst + Cfg::global_block(kChunks - 1) * kColsPerBlock,
                                    valid, lane);
  }

  store_dq<Cfg, kDq>(dq, p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols), w.heads,
                     Cfg::kWg0DqBlocks, r0, q4);
}

template <class Cfg, bool kDeterministic>
__device__ void run_cta(const MainParams& p, SmemPlan& sm, const Work& w, uint32_t peer) {
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 2) {
    hw::reg_dealloc<kProducerRegs>();
    produce<Cfg>(p, sm, w, tid);
  } else {
    hw::reg_alloc<kConsumerRegs>();
    if (wg == 0) {
      scores_and_dq<Cfg>(p, sm, w, tid, peer);
    } else {
      const uint64_t start = hw::global_timer_ns();
      dq_and_dkv<Cfg, kDeterministic>(p, sm, w, tid);
      // Feed the sweep: one token's duration, measured on full rows by one thread per cluster.
      if (p.sweep_guess_ns != 0 && tid == 0 && peer == 1 && sm.num_blocks == p.K / kBlockKeys)  // CTA 0
        *reinterpret_cast<volatile uint64_t*>(p.sweep_period_ns) = hw::global_timer_ns() - start;
    }
  }
}

}  // namespace detail

// grid = (2 * tokens of this launch, ceil(H / 64)), cluster (2, 1, 1), kThreads, kSmemBytes dynamic.
template <bool kDeterministic>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    sparse_mla_bwd_main_kernel(const __grid_constant__ MainParams p) {
  extern __shared__ uint8_t smem_raw[];
  SmemPlan& sm = *reinterpret_cast<SmemPlan*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t rank = hw::cluster_ctarank();
  const uint32_t peer = rank ^ 1u;
  detail::Work w;
  w.local_token = blockIdx.x >> 1;
  w.token = p.token_begin + w.local_token;
  w.head_group = blockIdx.y;
  w.heads = min(p.H - w.head_group * kHeadsPerCta, kHeadsPerCta);

  if (threadIdx.x == 0) {
    hw::mbar_init(&sm.qdo_full, 256);  // 128 cp.async arrivals + 128 producer arrivals
    for (int s = 0; s < 2; ++s) {
      hw::mbar_init(&sm.kv_full[s], 256);
      hw::mbar_init(&sm.kv_empty[s], 256);  // every consumer thread
      hw::mbar_init(&sm.tiles_full[s], 128);
      hw::mbar_init(&sm.tiles_free[s], 128);
    }
    hw::mbar_init(&sm.xchg_full, 128);  // the peer's WG0 threads
    hw::mbar_init(&sm.xchg_free, 128);
    hw::mbar_fence_init();
    // Sweep: all clusters walk their (key-sorted) rows in step with the global clock, so the kv and
    // dkv rows being touched at any moment lie in a narrow key window that stays in L2. CTA 0
    // decides the phase for both CTAs (they must process the same blocks in the same order).
    if (rank == 0) {
      float phase = 0.f;
      if (p.sweep_guess_ns != 0) {
        uint64_t period = *reinterpret_cast<volatile uint64_t*>(p.sweep_period_ns);
        if (period == 0) period = p.sweep_guess_ns;
        phase = static_cast<float>(hw::global_timer_ns() % period) / static_cast<float>(period);
      }
      sm.phase = phase;
      hw::st_cluster_f32(hw::map_to_cta(&sm.phase, peer), phase);
    }
  }
  hw::cluster_sync();  // barriers of both CTAs initialized, phase visible

  if (rank == 0) detail::run_cta<RankConfig<0>, kDeterministic>(p, sm, w, peer);
  else detail::run_cta<RankConfig<1>, kDeterministic>(p, sm, w, peer);

  hw::cluster_sync();  // the peer may still write into our smem until it gets here
}

}  // namespace flashdsa::sm90::mla_bwd
