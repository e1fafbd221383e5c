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

struct alignas(1024) SmemPlanV2 {
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
  uint64_t setup_full;              // front -> back: block list and num_blocks written (once)
  uint64_t pds_full;                // front -> back: P and dS tiles (and idx) of block i written
  uint64_t kv_empty;                // back -> front: back's dQ of block i done, kv tile may be overwritten
  uint64_t tiles_free;              // back -> front: back's last dKV wgmma of block i done (P, dS free)
};
constexpr size_t kSmemBytes = sizeof(SmemPlanV2) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");

namespace detail {

using hw::desc_k_major;
using hw::desc_mn_major;
using sparse_mla_bwd_impl::detail::build_block_list;
using sparse_mla_bwd_impl::detail::copy_row_ldg;
using sparse_mla_bwd_impl::detail::kL2Hint;
using sparse_mla_bwd_impl::detail::l2_evict_first_policy;
using sparse_mla_bwd_impl::detail::l2_evict_last_policy;
using sparse_mla_bwd_impl::detail::ds_group;
using sparse_mla_bwd_impl::detail::emit_dkv_pairs;
using sparse_mla_bwd_impl::detail::emit_mass;
using sparse_mla_bwd_impl::detail::exp_scores;
using sparse_mla_bwd_impl::detail::issue_dkv_chunk;
using sparse_mla_bwd_impl::detail::key_valid;
using sparse_mla_bwd_impl::detail::make_work;
using sparse_mla_bwd_impl::detail::mass_slot_of;
using sparse_mla_bwd_impl::detail::mma_dq_rs;
using sparse_mla_bwd_impl::detail::mma_dq_ss;
using sparse_mla_bwd_impl::detail::mma_heads_keys;
using sparse_mla_bwd_impl::detail::prefetch_rows_l2;
using sparse_mla_bwd_impl::detail::store_dq;
using sparse_mla_bwd_impl::detail::store_tile_group;
using sparse_mla_bwd_impl::detail::Work;

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

// dkv destinations of one thread for the current key block: rows A = 16 warp + lane / 4 + 8 half -
// odd and B = A + 1 (quads 2k and 2k + 1 write together, as in v1's emit_dkv_chunk) of `base`, a
// [rows, 576] fp32 matrix (dkv, or the CTA's deterministic partial rows), plus this lane's column.
struct DkvRowsV2 {
  float* base;
  uint32_t row[2][2];  // [half][A, B]: key (fast) or slot in the row (deterministic)
  bool valid[2][2];
};

template <bool kDeterministic>
__device__ __forceinline__ DkvRowsV2 dkv_rows(const MainParams& p, const int32_t* idx, int blk, int warp, int lane) {
  const int odd = (lane >> 2) & 1;
  const int col = 16 * odd + 4 * (lane & 3);
  const int row0 = 16 * warp + (lane >> 2) - odd;
  DkvRowsV2 r;
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
      r.valid[half][ab] = key_valid(key, p.T_kv);
      r.row[half][ab] = kDeterministic ? 0u : (r.valid[half][ab] ? uint32_t(key) : 0u);
    }
  }
  return r;
}

template <bool kDeterministic>
__device__ __forceinline__ float* dkv_row_ptr(const DkvRowsV2& r, int half, int ab) {
  if constexpr (kDeterministic) return r.base + (8 * half + ab) * kQkCols;
  else return r.base + size_t(r.row[half][ab]) * kQkCols;
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk (column block `chunk`) from a natural-order wgmma
// accumulator: n-groups 2m, 2m + 1 of quad member q (columns 16m + 2q + {0, 1}, 16m + 8 + 2q + {0, 1})
// go as one float4 to stored positions 16m + 4q .. +3 (v2_dkv_pos), in full 128-byte lines
// (emit_dkv_pairs).
template <bool kDeterministic>
__device__ __forceinline__ void emit_dkv_chunk(const float (&acc)[32], int chunk, const DkvRowsV2& rows, int lane) {
#if FLASHDSA_BWD_V2_NO_DKV  // measurement build only (scripts/bwd_v2_gpu.sh NO_REDS=1): no dkv writes, wrong dkv
  return;
#endif
  // FLASHDSA_BWD_L2HINT: the reds carry an L2::evict_last policy (l2_policy.cuh).
  emit_dkv_pairs<kDeterministic, false, kL2Hint>(
      acc, rows.valid, lane,
      [&](int half, int ab) { return dkv_row_ptr<kDeterministic>(rows, half, ab) + chunk * kColsPerBlock; },
      kL2Hint ? l2_evict_last_policy() : 0);
}

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
  if (tid < kHeadsPerCta) {
    const bool real = tid < w.heads;
    const int64_t at = w.token * p.H + h0 + tid;
    sm.lse2[tid] = real ? p.lse[at] * 1.4426950408889634f : __int_as_float(0x7f800000);  // +inf: P = 0
    sm.delta[tid] = real ? p.delta[at] : 0.f;
  }

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
    if (cp.chunk == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) sm.idx[i & 1][cp.rsub + 16 * r] = k[r];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const bool valid = key_valid(k[r], p.T_kv);
      cp.copy_row<kQkBlocks, kBlockKeys>(kv_tile, r, p.kv + (valid ? int64_t(k[r]) : 0) * p.kv_stride_t, valid);
    }
    hw::cp_async_commit();
    if (sweep) {
      if (tid == 0) hw::red_add_u32(p.sweep_counter, 1u);
      // Warp w: keys 16w .. 16w + 15 of the block (lanes < 16).
      const int32_t* row = idx_row + sm.block_list[i] * kBlockKeys + 16 * warp;
      const int32_t mine = lane < 16 ? row[lane] : -1;
      prefetch_rows_l2<kQkCols * 4 / 128>(p.dkv, kQkCols * 4, mine, p.T_kv, lane);
      if (i + 1 < num_blocks) {
        const int32_t* nrow = idx_row + sm.block_list[i + 1] * kBlockKeys + 16 * warp;
        const int32_t next = lane < 16 ? nrow[lane] : -1;
        prefetch_rows_l2<kQkCols * 2 / 128>(p.kv, p.kv_stride_t * 2, next, p.T_kv, lane);
      }
    }
  };

  int32_t keys[4];
  if (num_blocks > 0) {
    load_keys(0, keys);
    gather(0, keys);
    load_keys(1, keys);
  }

  float dq[kFrontDqBlocks * 32];
#pragma unroll
  for (int i = 0; i < kFrontDqBlocks * 32; ++i) dq[i] = 0.f;
  const float lse2_lo = sm.lse2[r0], lse2_hi = sm.lse2[r0 + 8];
  const float delta_lo = sm.delta[r0], delta_hi = sm.delta[r0 + 8];
  char* const p_tile = reinterpret_cast<char*>(sm.p);
  char* const ds_tile = reinterpret_cast<char*>(sm.ds);

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
    hw::wgmma_wait<1>();
    hw::fence_regs(s);

    // P = exp(scale S - lse) on valid keys, 0 elsewhere (fp32, kept for dS and the mass).
    exp_scores(s, sm.idx[st], p, lse2_lo, lse2_hi, q4);
    hw::wgmma_wait<0>();
    hw::fence_regs(dp);
    // dS = scale P (dP - Delta) from the fp32 P.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      ds_group(dp, n, s[4 * n + 0], s[4 * n + 1], s[4 * n + 2], s[4 * n + 3], delta_lo, delta_hi, p.scale);
    }
    if (i > 0) hw::mbar_wait(&sm.tiles_free, (i - 1) & 1);  // back's dKV of block i - 1 read the tiles
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      store_tile_group(p_tile, s, n, r0, q4);
      store_tile_group(ds_tile, dp, n, r0, q4);
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

// Steady state for chunk c >= 2: issue chunk c into acc[c % 2], wait for chunk c - 1 (one group may
// stay in flight), emit it.
template <bool kDeterministic, int kChunk>
__device__ __forceinline__ void dkv_step(SmemPlanV2& sm, float (&acc0)[32], float (&acc1)[32], const DkvRowsV2& rows,
                                         int lane) {
  float(&cur)[32] = (kChunk % 2 == 0) ? acc0 : acc1;
  float(&prev)[32] = (kChunk % 2 == 0) ? acc1 : acc0;
  issue_dkv_chunk(sm, cur, kChunk);
  hw::wgmma_wait<1>();
  hw::fence_regs(prev);
  emit_dkv_chunk<kDeterministic>(prev, kChunk - 1, rows, lane);
}

template <bool kDeterministic>
__device__ void back(const MainParams& p, SmemPlanV2& sm, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  float dq_a[4 * 32], dq_b[32];  // dQ columns [256, 512) and [512, 576)
#pragma unroll
  for (int i = 0; i < 4 * 32; ++i) dq_a[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) dq_b[i] = 0.f;

  hw::mbar_wait(&sm.setup_full, 0);
  const int num_blocks = sm.num_blocks;

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const uint32_t ph = i & 1;
    hw::mbar_wait(&sm.pds_full, ph);
    hw::fence_proxy_async();
    const DkvRowsV2 rows = dkv_rows<kDeterministic>(p, sm.idx[i & 1], sm.block_list[i], warp, lane);

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
  extern __shared__ uint8_t smem_raw[];
  SmemPlanV2& sm = sparse_mla_bwd_impl::detail::smem_plan<SmemPlanV2>(smem_raw);
  using sparse_mla_bwd_impl::detail::BarrierInit;
  sparse_mla_bwd_impl::detail::init_barriers(BarrierInit{&sm.setup_full, 128}, BarrierInit{&sm.pds_full, 128},
                                             BarrierInit{&sm.kv_empty, 128}, BarrierInit{&sm.tiles_free, 128});

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
