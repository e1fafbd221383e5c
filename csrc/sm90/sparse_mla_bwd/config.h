// Internal: tile sizes, work split and shared-memory plan of the sparse MLA backward main kernel
// (design: docs/kernels/sparse_mla_bwd.md).
//
// One CTA per (query token, group of 64 heads), no cluster. Two consumer warpgroups share every key
// block: WG0 computes S = Q.KV^T and P, WG1 computes dP = dO.V^T and dS; P and dS meet in two bf16
// tiles; dQ's nine 64-column blocks and dKV's nine column chunks are split between the two.
//
// Column permutation: Q, dO and kv are stored in shared memory with the columns of every 16-column
// group permuted (hw::permuted_col, csrc/sm90/common/hopper.cuh), identically for all three, so S
// and dP (contractions over the columns) are unchanged while the accumulators of dQ and dKV come out with every thread owning runs
// of 4 consecutive columns: dkv rows leave as 16-byte vectors that two quads of lanes merge into full
// 128-byte lines (see emit_dkv_chunk()).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "flashdsa/ops.h"
#include "sm90/common/constants.h"

namespace flashdsa::sm90::sparse_mla_bwd_impl {

constexpr int kBlockKeys = 64;     // keys per block: wgmma N of S/dP, M of dKV, K of dQ
constexpr int kHeadsPerCta = 64;   // heads per CTA: wgmma M of S/dP/dQ, K of dKV (padded)
constexpr int kColsPerBlock = 64;  // columns of one SW128 tile block
constexpr int kQkCols = 576;
constexpr int kVCols = 512;
constexpr int kQkBlocks = kQkCols / kColsPerBlock;  // 9: Q and kv tiles
constexpr int kVBlocks = kVCols / kColsPerBlock;    // 8: dO tile; block 8 of Q/kv is the rope part
constexpr int kThreads = 384;      // WG0: S, P; WG1: dP, dS; WG2: producer
constexpr int kTileBlockBytes = kBlockKeys * 128;  // one [64 rows x 64 cols] bf16 SW128 block
constexpr int kMaxBlocksPerRow = kMaxTopK / kBlockKeys;

// Work split. dQ: WG0 owns kv blocks [0, 5) (SS wgmma, A = dS tile), WG1 blocks [5, 9) (RS wgmma, A
// straight from its dS accumulator). dKV: WG0 computes value chunks [5, 8) and the rope chunk 8
// (A = dS^T / P^T read transposed from the tiles by wgmma), WG1 value chunks [0, 5) (A fragments
// loaded once per block with ldmatrix.trans). wgmma k16 steps of width 64 per key block:
// WG0 36 (S) + 20 (dQ) + 28 (dKV) = 84, WG1 32 (dP) + 16 (dQ) + 40 (dKV) = 88.
constexpr int kWg0DqBlocks = 5;
constexpr int kWg1DqBlocks = kQkBlocks - kWg0DqBlocks;
constexpr int kWg1DkvChunks = 5;  // value chunks [0, 5) on WG1, the rest on WG0

// Register budgets after setmaxnreg (kernel compiled at 168 = 65536 / 384, rounded down to 8).
// Named barriers (0 is __syncthreads), 128 threads each.
constexpr int kBarProducer = 1;  // the producer warpgroup's own steps
constexpr int kBarWg1Tiles = 2;  // WG1: its dS tile stores are complete before it reads dS^T
constexpr int kBarWg0Mass = 3;   // WG0: warps 1..3 stored their attention-mass column sums

constexpr int kConsumerRegs = 232;
constexpr int kProducerRegs = 40;
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "register file");

// Shared memory of one CTA. Tiles are SW128 (csrc/sm90/common/hopper.cuh), 1024-byte aligned.
struct alignas(1024) SmemPlan {
  __nv_bfloat16 q[kQkBlocks * kHeadsPerCta * kColsPerBlock];    // [64 h][9 blocks], permuted   73728 B
  __nv_bfloat16 dout[kVBlocks * kHeadsPerCta * kColsPerBlock];  // [64 h][8 blocks], permuted   65536 B
  __nv_bfloat16 kv[kQkBlocks * kBlockKeys * kColsPerBlock];     // [64 keys][9 blocks], permuted 73728 B
  __nv_bfloat16 p[kHeadsPerCta * kBlockKeys];                   // [64 h][64 keys] bf16          8192 B
  __nv_bfloat16 ds[kHeadsPerCta * kBlockKeys];                  // [64 h][64 keys] bf16          8192 B
  int32_t idx[2][kBlockKeys];       // kv row of each key of blocks i (slot i % 2); any value: invalid
  float lse2[kHeadsPerCta];         // lse * log2(e); +inf on padded heads (so P = 0 there)
  float delta[kHeadsPerCta];        // rowsum(dout * out); 0 on padded heads
  float mass_part[3][kBlockKeys];   // optional mass output: column sums of P of WG0's warps 1..3
  uint8_t block_list[kMaxBlocksPerRow];  // non-empty key blocks of the row, in processing order
  int32_t num_blocks;               // entries of block_list
  uint64_t qdo_full;                // producer -> consumers: Q, dO, lse, Delta, block list in smem
  uint64_t kv_full;                 // producer -> consumers: kv tile + idx of the block
  uint64_t kv_empty;                // consumers -> producer: kv tile no longer read (dQ done)
  uint64_t p_full;                  // WG0 -> WG1: P tile written
  uint64_t ds_full;                 // WG1 -> WG0: dS tile written
  uint64_t tiles_free;              // WG1 -> WG0: WG1 has read the P tile (P may be overwritten)
};
constexpr size_t kSmemBytes = sizeof(SmemPlan) + 1024;  // + slack to align the dynamic smem base: 227 KB
static_assert(kSmemBytes <= hw::kSmemLimit, "shared memory budget");

// The kernel code assumes these (ties to the public limits and to the common building blocks).
static_assert(kQkCols == kDqk && kVCols == kDv, "the kernel is written for the production MLA widths");
static_assert(kBlockKeys == hw::kBlockKeys, "key blocks are the common 64-slot blocks of a top-k row");
static_assert(kThreads == 3 * hw::kWarpgroup, "two consumer warpgroups and one producer");
static_assert(kHeadsPerCta == 64 && kBlockKeys == 64, "wgmma shapes (m64, n64 tiles) and the 64-thread index loads");
static_assert(kQkCols % kColsPerBlock == 0 && kVCols % kColsPerBlock == 0, "whole SW128 blocks");
static_assert(kTileBlockBytes == kBlockKeys * hw::kSw128RowBytes, "one SW128 block of 64 rows");
static_assert(kWg0DqBlocks > 0 && kWg1DqBlocks > 0 && kWg1DkvChunks > 0 && kWg1DkvChunks < kVBlocks, "work split");

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
