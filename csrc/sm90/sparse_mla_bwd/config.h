// Internal: tile sizes, work split and shared-memory plan of the sparse MLA backward main kernel
// (design: docs/kernels/sparse_mla_bwd.md).
//
// One cluster of two CTAs per (query token, group of 64 heads). The 576 columns are split between
// the two CTAs: CTA r owns value column blocks 4r..4r+3 (64 columns each) and the rope block 8 is
// handled by both for Q (see below). Each CTA computes the partial scores S and dP over its own
// columns, the two exchange them through distributed shared memory, and from then on every product
// (dQ, dKV) is column-separable, so each CTA writes disjoint columns of dq and dkv.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace flashdsa::sm90::mla_bwd {

constexpr int kBlockKeys = 64;     // keys per block: wgmma N of S/dP, M of dKV, K of dQ
constexpr int kHeadsPerCta = 64;   // heads per cluster: wgmma M of S/dP/dQ, K of dKV (padded)
constexpr int kColsPerBlock = 64;  // columns of one SW128 tile block
constexpr int kQkCols = 576;
constexpr int kVCols = 512;
constexpr int kVBlocksPerCta = 4;  // value column blocks owned by each CTA (2 x 4 x 64 = 512)
constexpr int kRopeBlock = 8;      // global column block of the 64 rope columns
constexpr int kQBlocks = 5;        // Q tile per CTA: its 4 value blocks + the rope block
constexpr int kThreads = 384;      // WG0: scores + dQ, WG1: dQ + dKV, WG2: producer
constexpr int kTileBlockBytes = kBlockKeys * 128;  // one [64 rows x 64 cols] bf16 SW128 block
constexpr int kMaxBlocksPerRow = 8192 / kBlockKeys;

// Register budgets after setmaxnreg (kernel compiled at 168 = 65536 / 384, rounded down to 8).
constexpr int kConsumerRegs = 232;
constexpr int kProducerRegs = 40;
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "register file");

// Work split of CTA `kRank` of the cluster. Both CTAs hold Q's rope block; CTA 0 gathers the rope
// columns of kv (so its S partial includes the rope product and it computes dQ's rope columns);
// CTA 1 computes the rope columns of dkv (key role only). This balances the two CTAs:
// 88 vs 84 wgmma k16 steps of width 64 per key block.
template <int kRank>
struct RankConfig {
  static constexpr int kKvBlocks = kRank == 0 ? 5 : 4;      // gathered kv column blocks
  static constexpr int kDkvChunks = kRank == 0 ? 4 : 5;     // dkv column blocks computed here
  static constexpr int kWg0DqBlocks = 2;                    // dQ blocks (of the kv tile) held by WG0
  static constexpr int kWg1DqBlocks = kKvBlocks - kWg0DqBlocks;
  // Global column block of local block b (Q tile, kv tile and dO tile share the numbering).
  __host__ __device__ static constexpr int global_block(int b) {
    return b < kVBlocksPerCta ? kVBlocksPerCta * kRank + b : kRopeBlock;
  }
};

// Shared memory of one CTA. Tiles are SW128 (csrc/sm90/common/hopper.cuh), 1024-byte aligned.
struct alignas(1024) SmemPlan {
  __nv_bfloat16 q[kQBlocks * kHeadsPerCta * kColsPerBlock];                   // [64 h][5 blocks]  40960 B
  __nv_bfloat16 dout[kVBlocksPerCta * kHeadsPerCta * kColsPerBlock];          // [64 h][4 blocks]  32768 B
  __nv_bfloat16 kv[2][kQBlocks * kBlockKeys * kColsPerBlock];                 // 2 x [64 keys][<=5] 81920 B
  __nv_bfloat16 p[2][kHeadsPerCta * kBlockKeys];                              // 2 x [64 h][64 keys] bf16
  __nv_bfloat16 ds[2][kHeadsPerCta * kBlockKeys];                             // 2 x [64 h][64 keys] bf16
  float4 xchg[16][128];    // the peer's S (slots 0..7) and dP (8..15) partials, accumulator order
  int32_t idx[2][kBlockKeys];       // kv row of each key of the block in flight (any value: invalid)
  float lse2[kHeadsPerCta];         // lse * log2(e); +inf on padded heads (so P = 0 there)
  float delta[kHeadsPerCta];        // rowsum(dout * out); 0 on padded heads
  uint8_t block_list[kMaxBlocksPerRow];  // non-empty key blocks of the row, in processing order
  int32_t num_blocks;               // entries of block_list
  float phase;                      // sweep phase in [0, 1), written by CTA 0 into both CTAs
  uint64_t qdo_full;                // Q, dO, lse, delta and the block list are in smem
  uint64_t kv_full[2];              // producer -> consumers: kv tile + idx of a stage
  uint64_t kv_empty[2];             // consumers -> producer: stage may be overwritten
  uint64_t tiles_full[2];           // WG0 -> WG1: P and dS tiles written
  uint64_t tiles_free[2];           // WG1 -> WG0: P and dS tiles consumed
  uint64_t xchg_full;               // peer WG0 -> WG0: peer's partials are in xchg
  uint64_t xchg_free;               // peer WG0 -> WG0: peer has read our partials from its xchg
};
constexpr size_t kSmemBytes = sizeof(SmemPlan) + 1024;  // + slack to align the dynamic smem base
static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");

}  // namespace flashdsa::sm90::mla_bwd
