// Internal: what the two-warpgroup sparse MLA backward kernels share (v2: main_kernel_v2.cuh, v3:
// main_kernel_v3.cuh; design: docs/kernels/sparse_mla_bwd.md, sections "v2" and "v3"). Both keep Q,
// dO and kv in natural column order (16-byte cp.async gathers), split the work between a front
// warpgroup (S, P, dP, dS, part of dQ) and a back warpgroup (the rest of dQ, the nine dKV chunks with
// two alternating accumulators, all dkv emission), and write dkv in the v2_dkv_pos column order.
// What only differs in the smem plan's barriers takes the plan as a template parameter.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/kernel_common.cuh"
#include "sm90/sparse_mla_bwd/l2_policy.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl::two_wg {

// The kernel_common.cuh / hopper.cuh pieces both kernels call, by their short names (v2 and v3 see
// them through `using namespace two_wg`).
using detail::build_block_list, detail::make_work, detail::Work;               // work item, block list
using detail::copy_row_ldg, detail::kL2Hint, detail::l2_evict_first_policy;  // the L2HINT Q / dO loads
using detail::ds_group, detail::exp_scores, detail::mma_heads_keys;         // S, P, dP, dS
using detail::emit_mass, detail::mass_slot_of, detail::store_dq;            // mass and dQ outputs
using hw::desc_k_major, hw::desc_mn_major;
using detail::BarrierInit, detail::init_barriers;                            // the kernels' prologue

// The buffers of both smem plans, in the same order (SmemPlanV2 / SmemPlanV3 derive from it and add
// their barriers after num_blocks, where the members stood before).
struct SmemTiles {
  __nv_bfloat16 q[kQkBlocks * kHeadsPerCta * kColsPerBlock];    // [64 h][9 blocks] SW128      73728 B
  __nv_bfloat16 dout[kVBlocks * kHeadsPerCta * kColsPerBlock];  // [64 h][8 blocks] SW128      65536 B
  __nv_bfloat16 kv[kQkBlocks * kBlockKeys * kColsPerBlock];     // [64 keys][9 blocks] SW128   73728 B
  __nv_bfloat16 p[kHeadsPerCta * kBlockKeys];                   // [64 h][64 keys] bf16         8192 B
  __nv_bfloat16 ds[kHeadsPerCta * kBlockKeys];                  // [64 h][64 keys] bf16         8192 B
  int32_t idx[2][kBlockKeys];       // kv row of each key of block i (slot i % 2); any value: invalid
  float lse2[kHeadsPerCta];         // lse * log2(e); +inf on padded heads (P = 0 there)
  float delta[kHeadsPerCta];        // rowsum(dout * out); 0 on padded heads
  float mass_part[3][kBlockKeys];   // optional mass output: column sums of P of the front's warps 1..3
  uint8_t block_list[kMaxBlocksPerRow];  // non-empty key blocks of the row, in processing order
  int32_t num_blocks;               // entries of block_list
};

// The 16-byte copies of one thread: tile rows rsub + 16 r (r < 4), chunk `chunk` of every 64-column
// block (8 threads cover one 128-byte row segment). The swizzled chunk depends on rsub % 8 only.
struct Copier {
  int rsub, chunk;
  uint32_t row_off;  // byte offset of (row rsub, chunk) in an SW128 block
  __device__ explicit Copier(int tid) : rsub(tid / 8), chunk(tid % 8) { row_off = hw::sw128_offset(rsub, chunk); }
  // Tile row rsub + 16 r of a [kRows x 64 kBlocks] tile <- src[64 b + 8 chunk .. + 8) for all b.
  template <int kBlocks, int kRows>
  __device__ __forceinline__ void copy_row(uint32_t tile, int r, const __nv_bfloat16* src_row, bool valid) const {
    const uint32_t dst = tile + row_off + r * 16 * 128;
    const __nv_bfloat16* src = src_row + 8 * chunk;
    asm("" : "+l"(src));  // one pointer, immediate offsets per block
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) hw::cp_async_16_u32(dst + b * kRows * 128, src + b * kColsPerBlock, valid);
  }
};

// Writes the keys k of this thread's gather rows cp.rsub + 16 r of block i to idx[i % 2] and issues
// their kv gathers (invalid keys: zero-filled, never read); the caller commits / arrives.
__device__ __forceinline__ void gather_kv(const MainParams& p, SmemTiles& sm, const Copier& cp, uint32_t kv_tile,
                                          int i, const int32_t (&k)[4]) {
  if (cp.chunk == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) sm.idx[i & 1][cp.rsub + 16 * r] = k[r];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const bool valid = detail::key_valid(k[r], p.T_kv);
    cp.copy_row<kQkBlocks, kBlockKeys>(kv_tile, r, p.kv + (valid ? int64_t(k[r]) : 0) * p.kv_stride_t, valid);
  }
}

// Key of lane `lane` (< 16; -1 on the others) among warp `warp`'s keys 16 warp .. + 15 of list entry i.
__device__ __forceinline__ int32_t warp_key(const SmemTiles& sm, const int32_t* idx_row, int i, int warp, int lane) {
  const int32_t* row = idx_row + sm.block_list[i] * kBlockKeys + 16 * warp;
  return lane < 16 ? row[lane] : -1;
}

// L2 prefetch of the dkv row (fp32) of `key`, which the block's atomics will update.
__device__ __forceinline__ void prefetch_dkv_row(const MainParams& p, int32_t key, int lane) {
  detail::prefetch_rows_l2<kQkCols * 4 / 128>(p.dkv, kQkCols * 4, key, p.T_kv, lane);
}

// L2 prefetch of the kv row (bf16) of `key`, which a later gather reads.
__device__ __forceinline__ void prefetch_kv_row(const MainParams& p, int32_t key, int lane) {
  detail::prefetch_rows_l2<kQkCols * 2 / 128>(p.kv, p.kv_stride_t * 2, key, p.T_kv, lane);
}

// The front's constants: lse * log2(e) and Delta of its accumulator rows (heads) r0 and r0 + 8, and
// the P and dS tiles as bytes.
struct FrontConsts {
  float lse2_lo, lse2_hi, delta_lo, delta_hi;
  char* p_tile;
  char* ds_tile;
};
__device__ __forceinline__ FrontConsts front_consts(SmemTiles& sm, int r0) {
  return FrontConsts{sm.lse2[r0], sm.lse2[r0 + 8], sm.delta[r0], sm.delta[r0 + 8], reinterpret_cast<char*>(sm.p),
                     reinterpret_cast<char*>(sm.ds)};
}

// Head t < 64 of the CTA's group (dO / lse row row0 + t; real: not a padded head): lse2[t] =
// lse * log2(e) (+inf on padded heads: P = 0 there), delta[t] = Delta (0 on padded heads). Scalars
// in, not the plan and the work item: a spelling with references to them moved v2's SASS.
__device__ __forceinline__ void store_lse_delta(const MainParams& p, float* lse2, float* delta, int64_t row0,
                                                bool real, int t) {
  const int64_t at = row0 + t;
  lse2[t] = real ? p.lse[at] * 1.4426950408889634f : __int_as_float(0x7f800000);  // +inf: P = 0
  delta[t] = real ? p.delta[at] : 0.f;
}

// The CTA's smem plan at the start of the dynamic shared memory (every kernel's extern __shared__
// array starts there).
template <class Plan>
__device__ __forceinline__ Plan& dynamic_smem_plan() {
  extern __shared__ uint8_t dynamic_smem[];
  return detail::smem_plan<Plan>(dynamic_smem);
}

// Waits until at most kPending wgmma groups are in flight (S = Q . KV^T landed), then
// P = exp(scale S - lse) in place on valid keys, 0 elsewhere (exp_scores).
template <int kPending>
__device__ __forceinline__ void scores_to_p(float (&s)[32], const int32_t* idx, const MainParams& p,
                                            const FrontConsts& fc, int q4) {
  hw::wgmma_wait<kPending>();
  hw::fence_regs(s);
  detail::exp_scores(s, idx, p, fc.lse2_lo, fc.lse2_hi, q4);
}

// Zeroes an accumulator.
template <int kN>
__device__ __forceinline__ void zero_acc(float (&acc)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = 0.f;
}

// Stores kBlocks 64-column blocks of a dQ accumulator (first column block `first`) of the CTA's
// heads (warpgroup thread with warp `warp`, lane `lane`).
template <int kBlocks>
__device__ __forceinline__ void store_dq_blocks(const MainParams& p, const float (&acc)[kBlocks * 32], int first,
                                                int warp, int lane) {
  const Work w = make_work(p);
  const int r0 = 16 * warp + lane / 4, q4 = lane % 4;
  __nv_bfloat16* const dq_head0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<kBlocks, false>(acc, dq_head0, w.heads, first, r0, q4);
}

// dkv destinations of one thread for the current key block: rows A = 16 warp + lane / 4 + 8 half -
// odd and B = A + 1 (quads 2k and 2k + 1 write together, as in v1's emit_dkv_chunk) of `base`, a
// [rows, 576] fp32 matrix (dkv, or the CTA's deterministic partial rows), plus this lane's column.
struct DkvRows {
  float* base;
  uint32_t row[2][2];  // [half][A, B]: key (fast) or slot in the row (deterministic)
  bool valid[2][2];
};

template <bool kDeterministic>
__device__ __forceinline__ DkvRows dkv_rows(const MainParams& p, const int32_t* idx, int blk, int warp, int lane) {
  const int odd = (lane >> 2) & 1;
  const int col = 16 * odd + 4 * (lane & 3);
  const int row0 = 16 * warp + (lane >> 2) - odd;
  DkvRows r;
  if constexpr (kDeterministic) {  // slot rows row0 + 8 half + ab: immediate offsets from one pointer
    r.base = p.partial +
             ((int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * p.K + blk * kBlockKeys + row0) * int64_t(kQkCols) + col;
  } else {
    r.base = p.dkv + col;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      const int32_t key = idx[row0 + 8 * half + ab];
      r.valid[half][ab] = detail::key_valid(key, p.T_kv);
      r.row[half][ab] = kDeterministic ? 0u : (r.valid[half][ab] ? uint32_t(key) : 0u);
    }
  }
  return r;
}

template <bool kDeterministic>
__device__ __forceinline__ float* dkv_row_ptr(const DkvRows& r, int half, int ab) {
  if constexpr (kDeterministic) return r.base + (8 * half + ab) * kQkCols;
  else return r.base + size_t(r.row[half][ab]) * kQkCols;
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk (column block `chunk`) from a natural-order wgmma
// accumulator: n-groups 2m, 2m + 1 of quad member q (columns 16m + 2q + {0, 1}, 16m + 8 + 2q + {0, 1})
// go as one float4 to stored positions 16m + 4q .. +3 (v2_dkv_pos), in full 128-byte lines
// (emit_dkv_pairs).
template <bool kDeterministic>
__device__ __forceinline__ void emit_dkv_chunk(const float (&acc)[32], int chunk, const DkvRows& rows, int lane) {
// FLASHDSA_BWD_V2_NO_DKV: measurement build only (scripts/bwd_v2_gpu.sh NO_REDS=1): no dkv writes,
// wrong dkv; since the move here it also applies to v3 builds (none uses it).
#if FLASHDSA_BWD_V2_NO_DKV
  return;
#endif
  // FLASHDSA_BWD_L2HINT: the reds carry an L2::evict_last policy (l2_policy.cuh).
  detail::emit_dkv_pairs<kDeterministic, false, detail::kL2Hint>(
      acc, rows.valid, lane,
      [&](int half, int ab) { return dkv_row_ptr<kDeterministic>(rows, half, ab) + chunk * kColsPerBlock; },
      detail::kL2Hint ? detail::l2_evict_last_policy() : 0);
}

// Chunk c >= 2: issue chunk c into acc[c % 2], wait for chunk c - 1 (one group may stay in flight),
// emit it.
template <bool kDeterministic, int kChunk, class Smem>
__device__ __forceinline__ void dkv_step(Smem& sm, float (&acc0)[32], float (&acc1)[32], const DkvRows& rows,
                                         int lane) {
  float(&cur)[32] = (kChunk % 2 == 0) ? acc0 : acc1;
  float(&prev)[32] = (kChunk % 2 == 0) ? acc1 : acc0;
  detail::issue_dkv_chunk(sm, cur, kChunk);
  hw::wgmma_wait<1>();
  hw::fence_regs(prev);
  emit_dkv_chunk<kDeterministic>(prev, kChunk - 1, rows, lane);
}

// The back's dKV chunks of a block from the wait for chunk 1 on (chunks 1 and 2 issued into acc1,
// acc0, chunk 0 emitted, the dQ group done): chunks 1 .. 8 emitted, chunks 3 .. 8 issued one ahead;
// arrives on sm.tiles_free once chunk 8 read the P and dS tiles.
template <bool kDeterministic, class Smem>
__device__ __forceinline__ void back_tail(Smem& sm, float (&acc0)[32], float (&acc1)[32], const DkvRows& rows,
                                          int lane) {
  hw::wgmma_wait<1>();  // chunk 1
  hw::fence_regs(acc1);
  emit_dkv_chunk<kDeterministic>(acc1, 1, rows, lane);
  dkv_step<kDeterministic, 3>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 4>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 5>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 6>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 7>(sm, acc0, acc1, rows, lane);
  dkv_step<kDeterministic, 8>(sm, acc0, acc1, rows, lane);
  hw::wgmma_wait<0>();  // chunk 8: the last read of the P and dS tiles
  hw::fence_regs(acc0);
  hw::mbar_arrive(&sm.tiles_free);
  emit_dkv_chunk<kDeterministic>(acc0, 8, rows, lane);
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl::two_wg
