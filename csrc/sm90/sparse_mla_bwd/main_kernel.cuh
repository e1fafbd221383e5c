// Internal: the sparse MLA backward main kernel (docs/spec.md §5; design, barriers and measurements:
// docs/kernels/sparse_mla_bwd.md). Per query token and group of 64 heads it recomputes S = Q.KV^T and
// dP = dO.V^T block by block over the token's top-k keys, forms P and dS, accumulates dQ in registers
// and emits each key block's dKV contribution (key role, 576 columns, and value role, 512 columns)
// already summed over the 64 heads. Shapes, roles and the smem plan: config.h; building blocks:
// kernel_common.cuh.
//
// Three warpgroups (384 threads, setmaxnreg 232 / 232 / 40):
//   front (WG0):    S; P (fp32, rounded to bf16 pairs); the attention mass (optional); dP; dS from the
//                   bf16 P; the P and dS tiles; dQ columns [0, 320) with RS wgmma (A = dS registers);
//   back (WG1):     dQ columns [320, 576) (SS m64n256, A = dS tile) first, then the nine dKV chunks with
//                   two alternating accumulators and all dkv emission;
//   producer (WG2): the block list (sweep rotation), per block the index row, the kv gather (16-byte
//                   cp.async, natural column order) into the single kv stage, the sweep counter (no L2
//                   prefetches: both measured slower, 2026-12-02).
// Q, dO and lse are loaded by the front and the back together (256 threads) in the prologue, which also forms
// Delta = rowsum(dO * O) from O (read into registers once) and its own pieces of the dO tile.
// The dQ split is 5 / 4 blocks: at 232 registers the back holds 4 dQ blocks (128) and two dKV
// accumulators (64); the front holds 5 blocks (160) plus one [64 x 64] accumulator at a time (S, then
// dP: issued one after the other, P kept as 16 packed bf16 pairs).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/kernel_common.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl {
namespace detail {

// ---- prologue: Q, dO, lse, Delta (front + back) --------------------------------------------------

// Thread t (0..255) of the front and back copies tile rows t / 8 + 32 r (r < 2), 16-byte piece t % 8
// of every 64-column block of Q and dO (padded heads zero-filled, never read). Called once, before
// the role split, so that both warpgroups reach the one kBarQdo instruction: `bar.sync` is PTX's
// aligned barrier (every participating thread executes the same instruction), and compute-sanitizer
// synccheck rejects the two roles' separately inlined copies ("Divergent thread(s) in block").
__device__ __forceinline__ void load_q_do(const MainParams& p, SmemPlan& sm, int t) {
  const Work w = make_work(p);
  const int rsub = t / 8, chunk = t % 8;
  const uint32_t row_off = hw::sw128_offset(rsub, chunk);
  const uint32_t q_tile = hw::smem_u32(sm.q), do_tile = hw::smem_u32(sm.dout);
  const int h0 = w.head_group * kHeadsPerCta;
#pragma unroll 1
  for (int r = 0; r < 2; ++r) {
    const int h = rsub + 32 * r;
    const bool real = h < w.heads;
    const int hh = real ? h0 + h : 0;
    const __nv_bfloat16* q_src = p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h + 8 * chunk;
    const __nv_bfloat16* do_src = p.dout + (w.token * p.H + hh) * int64_t(kVCols) + 8 * chunk;
    const uint32_t off = row_off + r * 32 * 128;
    asm("" : "+l"(q_src));  // one pointer each, immediate offsets per block
    asm("" : "+l"(do_src));
#pragma unroll
    for (int b = 0; b < kQkBlocks; ++b)
      hw::cp_async_16_u32(q_tile + off + b * kHeadsPerCta * 128, q_src + b * kColsPerBlock, real);
#pragma unroll
    for (int b = 0; b < kVBlocks; ++b)
      hw::cp_async_16_u32(do_tile + off + b * kHeadsPerCta * 128, do_src + b * kColsPerBlock, real);
  }
  hw::cp_async_commit();
  // Delta = rowsum(dO * O) of this thread's two heads and columns: O straight into registers (streamed, read
  // once) while the copies fly, dO from this thread's own pieces of the tile once they landed; then the sum
  // over the 8 lanes of a head (lanes 8 k .. 8 k + 7 of a warp share rsub).
  uint4 o_piece[2][kVBlocks];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = rsub + 32 * r;
    const bool real = h < w.heads;
    const int64_t o_row = w.token * p.H + (real ? h0 + h : 0);
    const uint4* o_src = reinterpret_cast<const uint4*>(p.out + o_row * int64_t(kVCols) + 8 * chunk);
#pragma unroll
    for (int b = 0; b < kVBlocks; ++b)
      o_piece[r][b] = real ? __ldcs(o_src + b * (kColsPerBlock / 8)) : make_uint4(0, 0, 0, 0);
  }
  if (t < kHeadsPerCta) store_lse2(p, sm.lse2, w.token * p.H + h0, t < w.heads, t);
  hw::cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float d = 0.f;
#pragma unroll
    for (int b = 0; b < kVBlocks; ++b) {
      const uint4 g = *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(sm.dout) + row_off + r * 32 * 128 +
                                                      b * kHeadsPerCta * 128);
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o_piece[r][b]);
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = __bfloat1622float2(o2[e]), y = __bfloat1622float2(g2[e]);
        d = fmaf(x.x, y.x, d);
        d = fmaf(x.y, y.y, d);
      }
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (chunk == 0) sm.delta[rsub + 32 * r] = d;
  }
  hw::fence_proxy_async();  // writer side: this thread's Q / dO pieces are wgmma (async proxy) operands
  hw::named_bar_sync(kBarQdo, 256);
  hw::fence_proxy_async();  // reader side
}

// ---- producer warpgroup -------------------------------------------------------------------------

template <bool kDeterministic>
__device__ void produce(const MainParams& p, SmemPlan& sm, int tid) {
  const Work w = make_work(p);
  const int warp = tid / 32, lane = tid % 32;
  const Copier cp(tid);  // rows rsub + 16 r (r < 4), 16-byte piece `chunk` of each 64-column block
  const int32_t* idx_row = p.indices + w.local_token * p.indices_stride_t;
  const int num_row_blocks = p.K / kBlockKeys;
  const uint32_t kv_tile = hw::smem_u32(sm.kv);

  build_block_list<kDeterministic, kBarProducer>(p, sm, idx_row, num_row_blocks, warp, lane);
  hw::mbar_arrive(&sm.setup_full);
  const int num_blocks = sm.num_blocks;
  // Fast mode, sorted rows: sweep_counter counts the issued blocks (the rotation's progress). Deterministic mode, sorted
  // pass 1: it counts the CTAs that issued their last block, and the sorted pass runs in waves (config.h): wave
  // w = cta / R waits for the w R CTAs before it (bounded), then walks its row from block 0 like its wave.
  const bool sweep = !kDeterministic && p.sweep_counter != nullptr;
  if (kDeterministic && p.sweep_counter != nullptr) {
    if (tid == 0) {
      const uint32_t cta = blockIdx.x + blockIdx.y * gridDim.x;
      const uint32_t target = cta / uint32_t(p.resident_ctas) * uint32_t(p.resident_ctas);
      for (int spin = 0; spin < 20000 && *reinterpret_cast<volatile uint32_t*>(p.sweep_counter) < target; ++spin)
        __nanosleep(128);
    }
    hw::named_bar_sync(kBarProducer, 128);
  }

  // Keys of this thread's gather rows rsub + 16 r of list entry i.
  auto load_keys = [&](int i, int32_t (&k)[4]) {
    const int32_t* src = idx_row + sm.block_list[i] * kBlockKeys + cp.rsub;
#pragma unroll
    for (int r = 0; r < 4; ++r) k[r] = src[16 * r];
  };
  int32_t keys[4];
  if (num_blocks > 0) load_keys(0, keys);
#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    // The single kv tile is free once the front's and the back's dQ of block i - 1 completed; that
    // also ends every read of idx[i % 2] (block i - 2).
    if (i > 0) hw::mbar_wait(&sm.kv_empty, (i - 1) & 1);
    gather_kv(p, sm, cp, kv_tile, i, keys);
    hw::cp_async_arrive(&sm.kv_full);  // one arrival when this thread's copies landed
    hw::mbar_arrive(&sm.kv_full);      // and one for its idx stores
    // Sweep mode: count the block. (No L2 prefetches of the dkv rows the block will update nor of the next
    // block's kv rows: both cost 2-5% at 8K-64K, docs/perf-notes.md, eighth session.)
    if (sweep && tid == 0) hw::red_add_u32(p.sweep_counter, 1u);
    if (i + 1 < num_blocks) load_keys(i + 1, keys);
  }
  if (kDeterministic && p.sweep_counter != nullptr && tid == 0) hw::red_add_u32(p.sweep_counter, 1u);  // issued all
}

// ---- front warpgroup ----------------------------------------------------------------------------

// dQ[:, 0:320) += dS . KV, A straight from the dS accumulator (converted before the fence); one commit
// group.
__device__ __forceinline__ void mma_dq_front(float (&dq_a)[4 * 32], float (&dq_b)[32], const float (&ds)[32],
                                             const void* kv_tile) {
  uint32_t a[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) hw::acc_to_a_frag(ds, kk, a[kk]);
  hw::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    hw::wgmma_rs_m64n256k16<1>(dq_a, a[kk], desc_mn_major(kv_tile, kBlockKeys, kk, 0), true);
    hw::wgmma_rs_m64n64k16<1>(dq_b, a[kk], desc_mn_major(kv_tile, kBlockKeys, kk, 4), true);
  }
  hw::wgmma_commit();
}

template <bool kDeterministic>
__device__ void front(const MainParams& p, SmemPlan& sm, int tid) {
  const Work w = make_work(p);
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;  // accumulator rows (heads) r0, r0 + 8
  hw::mbar_wait(&sm.setup_full, 0);
  const int num_blocks = sm.num_blocks;

  float dq_a[4 * 32], dq_b[32];  // dQ columns [0, 256) and [256, 320)
  zero_acc(dq_a);
  zero_acc(dq_b);
  const FrontConsts fc = front_consts(sm, r0);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    hw::mbar_wait(&sm.kv_full, st);
    hw::fence_proxy_async();  // cp.async (generic proxy) data is read by wgmma (async proxy)
    int2 mass_slot = make_int2(0, 0);
    if (p.mass != nullptr && warp == 0) mass_slot = mass_slot_of(p, w, sm.block_list[i], lane);

    // S = Q . KV^T, then P = exp(scale S - lse) on valid keys (0 elsewhere), kept as bf16 pairs.
    uint32_t pk[16];  // pk[2n + half]: P of n-group n, row r0 + 8 half, keys 8n + 2 q4 + {0, 1}
    {
      float s[32];
      hw::wgmma_fence();
      mma_heads_keys<kQkBlocks>(s, sm.q, sm.kv);
      hw::wgmma_commit();
      scores_to_p<0>(s, sm.idx[st], p, fc, q4);
      // The block's attention mass (optional output) from the fp32 P. mass_part is rewritten only
      // after kv_full of block i + 1, which needs warp 0's kv_empty arrival of block i.
      if (p.mass != nullptr) emit_mass<kBarMass>(p, sm, w, s, mass_slot, warp, lane);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        pk[2 * n] = hw::pack_bf16(s[4 * n], s[4 * n + 1]);
        pk[2 * n + 1] = hw::pack_bf16(s[4 * n + 2], s[4 * n + 3]);
      }
    }
    // dP = dO . V^T; dS = scale P (dP - Delta) with the bf16 P.
    // The kv operand address is laundered: else the compiler keeps S's 36 kv descriptors (64-bit
    // each) alive for dP's 32 across exp / pack, and spills them.
    const void* kv_for_dp = sm.kv;
    asm volatile("" : "+l"(kv_for_dp));
    float dp[32];
    hw::wgmma_fence();
    mma_heads_keys<kVBlocks>(dp, sm.dout, kv_for_dp);
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(dp);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pk[2 * n]));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pk[2 * n + 1]));
      ds_group(dp, n, lo.x, lo.y, hi.x, hi.y, fc.delta_lo, fc.delta_hi, p.scale);
    }
    if (i > 0) hw::mbar_wait(&sm.tiles_free, (i - 1) & 1);  // back's dKV of block i - 1 read the tiles
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<uint32_t*>(fc.p_tile + tile_pair_offset(r0, n, q4)) = pk[2 * n];
      *reinterpret_cast<uint32_t*>(fc.p_tile + tile_pair_offset(r0 + 8, n, q4)) = pk[2 * n + 1];
      *reinterpret_cast<uint32_t*>(fc.ds_tile + tile_pair_offset(r0, n, q4)) = hw::pack_bf16(dp[4 * n], dp[4 * n + 1]);
      *reinterpret_cast<uint32_t*>(fc.ds_tile + tile_pair_offset(r0 + 8, n, q4)) =
          hw::pack_bf16(dp[4 * n + 2], dp[4 * n + 3]);
    }
    hw::fence_proxy_async();  // the tiles are wgmma operands of the back warpgroup
    hw::mbar_arrive(&sm.pds_full);

    // dQ[:, 0:320) += dS . KV, A straight from the dS registers.
    mma_dq_front(dq_a, dq_b, dp, sm.kv);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq_a);
    hw::fence_regs(dq_b);
    hw::mbar_arrive(&sm.kv_empty);
  }

  if (kDeterministic && p.fix_pass == 2) return;  // pass 2 visits only the re-run rows' blocks: dq is pass 1's
  __nv_bfloat16* const dqh0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<4>(dq_a, dqh0, w.heads, 0, r0, q4);
  store_dq<1>(dq_b, dqh0, w.heads, 4, r0, q4);
}

// ---- back warpgroup -----------------------------------------------------------------------------

// dQ[:, 320:576) += dS . KV, A = dS tile (K-major), B = kv blocks 5..8 (MN-major); one commit group.
__device__ __forceinline__ void mma_dq_back(float (&dq)[4 * 32], const SmemPlan& sm) {
  hw::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    hw::wgmma_ss_m64n256k16<0, 1>(dq, desc_k_major(sm.ds, kHeadsPerCta, kk),
                                  desc_mn_major(sm.kv, kBlockKeys, kk, kFrontDqBlocks), true);
  hw::wgmma_commit();
}

// The back's nine dKV chunks of a block whose dQ group is in flight, in two alternating accumulators: chunks 0 and 1
// issued, the dQ waited (kv_empty), chunk 0 emitted, then chunks 1 .. 8 emitted with chunks 2 .. 8 issued one ahead
// (dkv_step); arrives on sm.tiles_free once chunk 8 read the P and dS tiles.
template <bool kDeterministic>
__device__ __forceinline__ void back_chunks(SmemPlan& sm, float (&dq)[4 * 32], const DkvRows& rows, int lane) {
  float acc0[32], acc1[32];
  issue_dkv_chunk(sm, acc0, 0);
  issue_dkv_chunk(sm, acc1, 1);
  hw::wgmma_wait<2>();  // dQ
  hw::fence_regs(dq);
  hw::mbar_arrive(&sm.kv_empty);
  hw::wgmma_wait<1>();  // chunk 0
  hw::fence_regs(acc0);
  emit_dkv_chunk<kDeterministic>(acc0, 0, rows, lane);
  issue_dkv_chunk(sm, acc0, 2);
  hw::wgmma_wait<1>();  // chunk 1
  hw::fence_regs(acc1);
  emit_dkv_chunk<kDeterministic>(acc1, 1, rows, lane);
  dkv_step<kDeterministic, 3>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 4>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 5>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 6>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 7>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 8>(sm, acc0, acc1, rows, lane);
  hw::wgmma_wait<0>();  // chunk 8: the back's last read of the P and dS tiles
  hw::fence_regs(acc0);
  hw::mbar_arrive(&sm.tiles_free);
  emit_dkv_chunk<kDeterministic>(acc0, 8, rows, lane);
}

template <bool kDeterministic>
__device__ void back(const MainParams& p, SmemPlan& sm, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  hw::mbar_wait(&sm.setup_full, 0);
  const int num_blocks = sm.num_blocks;
  float dq[4 * 32];  // dQ columns [320, 576)
  zero_acc(dq);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    // kv_full too (already complete by then): the kv tile and idx reach the back through a direct
    // producer -> back release / acquire, not only through the front's pds_full.
    hw::mbar_wait(&sm.kv_full, i & 1);
    hw::mbar_wait(&sm.pds_full, i & 1);
    hw::fence_proxy_async();
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm.idx[i & 1], warp, lane);
    // dQ first, so that the kv tile is released as early as possible (the producer gathers the next
    // block into the single kv stage), then dKV chunks 0 and 1. (Measured 2026-12-02: issuing chunk 0
    // before dQ, so that the block's first reds start earlier, gained nothing.)
    mma_dq_back(dq, sm);
    back_chunks<kDeterministic>(sm, dq, rows, lane);
    if constexpr (kDeterministic) finish_fixed_rows(p, rows, lane);  // the rows' check sums
  }

  if (kDeterministic && p.fix_pass == 2) return;  // (as the front)
  store_dq_blocks<4>(p, dq, kFrontDqBlocks, warp, lane);
}

}  // namespace detail

// grid = (tokens of this launch, ceil(H / 64)), kThreads, kSmemBytes dynamic.
template <bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_bwd_main_kernel(const __grid_constant__ MainParams p) {
  // The deterministic mode's second pass runs only when the check pass marked rows for it (uniform exit, before any
  // barrier).
  if constexpr (kDeterministic) {
    if (p.fix_pass == 2 && *reinterpret_cast<const volatile uint32_t*>(p.fix_rerun) == 0u) return;
  }
  SmemPlan& sm = detail::dynamic_smem_plan<SmemPlan>();
  // kv_full: 128 cp.async arrivals + 128 producer arrivals; kv_empty: front and back threads.
  detail::init_barriers(detail::BarrierInit{&sm.setup_full, 128}, detail::BarrierInit{&sm.kv_full, 256},
                        detail::BarrierInit{&sm.kv_empty, 256}, detail::BarrierInit{&sm.pds_full, 128},
                        detail::BarrierInit{&sm.tiles_free, 128});

  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg < 2) detail::load_q_do(p, sm, threadIdx.x);  // front + back; the producer starts gathering
  if (wg == 2) {
    hw::reg_dealloc<kProducerRegs>();
    detail::produce<kDeterministic>(p, sm, tid);
  } else if (wg == 0) {
    hw::reg_alloc<kFrontRegs>();
    detail::front<kDeterministic>(p, sm, tid);
  } else {
    hw::reg_alloc<kBackRegs>();
    detail::back<kDeterministic>(p, sm, tid);
  }
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
