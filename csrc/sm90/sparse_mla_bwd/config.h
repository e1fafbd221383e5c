// Internal: tile sizes, warp roles, register budgets, named barriers and the shared-memory plan of the
// sparse MLA backward main kernel (main_kernel.cuh; design: docs/kernels/sparse_mla_bwd.md).
//
// One CTA per (query token, group of 64 heads), no cluster, 384 threads in three warpgroups:
//   front (WG0):    S, P, the attention mass (optional), dP, dS, the P and dS tiles, dQ columns [0, 320);
//   back (WG1):     dQ columns [320, 576), the nine dKV column chunks, all dkv emission;
//   producer (WG2): the block list, the kv gathers, the sweep counter.
// Q, dO and kv are kept in shared memory in their natural column order (16-byte cp.async copies);
// dkv is written in an interleaved column order inside each 16-column group (dkv_pos(),
// kernel_common.cuh) that an in-place pass restores at the end of the call (sparse_mla_bwd.cu).
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
constexpr int kMaxBlocksPerRow = kMaxTopK / kBlockKeys;

constexpr int kThreads = 384;                              // WG0 front, WG1 back, WG2 producer
constexpr int kFrontDqBlocks = 5;                          // dQ columns [0, 320): RS m64n256 + m64n64
constexpr int kBackDqBlocks = kQkBlocks - kFrontDqBlocks;  // [320, 576): SS m64n256

// Register budgets after setmaxnreg (the kernel is compiled at 168 = 65536 / 384, rounded down to 8).
// The three budgets can be overridden for A/B builds (-DFLASHDSA_BWD_{FRONT,BACK,PRODUCER}_REGS=N). Measured
// 2026-12-02: the front needs 256 (back 224, producer 24) to issue S and dP back to back, and that variant
// was 3-7% slower at 8K-32K (docs/perf-notes.md, sixth session).
#ifndef FLASHDSA_BWD_FRONT_REGS  // A/B builds only
#define FLASHDSA_BWD_FRONT_REGS 232
#endif
constexpr int kFrontRegs = FLASHDSA_BWD_FRONT_REGS;
#ifndef FLASHDSA_BWD_PRODUCER_REGS  // A/B builds only
#define FLASHDSA_BWD_PRODUCER_REGS 40
#endif
constexpr int kProducerRegs = FLASHDSA_BWD_PRODUCER_REGS;
#ifndef FLASHDSA_BWD_BACK_REGS  // A/B builds only
#define FLASHDSA_BWD_BACK_REGS (504 - FLASHDSA_BWD_FRONT_REGS - FLASHDSA_BWD_PRODUCER_REGS)
#endif
constexpr int kBackRegs = FLASHDSA_BWD_BACK_REGS;
static_assert(128 * (kFrontRegs + kBackRegs + kProducerRegs) <= 65536, "register file");
static_assert(kBackDqBlocks == 4, "the back's dQ is one m64n256 accumulator");

// Named barriers (0 is __syncthreads).
constexpr int kBarProducer = 1;  // producer (128): block list flags / compaction
constexpr int kBarQdo = 2;       // front + back (256): Q, dO, lse, Delta landed in smem
constexpr int kBarMass = 3;      // front (128): warps 1..3 stored their attention-mass column sums
constexpr int kBarFrontChunk8 = 4;  // front (128), FLASHDSA_BWD_FRONT_CHUNK8 only: every front warp's chunk 8 read dS

// FLASHDSA_BWD_FRONT_CHUNK8=1 (A/B build, fast mode only; twenty-sixth session, not yet measured): dKV chunk 8
// (dS^T . Q[:, 512:576), 4 k-steps, one ninth of the block's emission) computed and emitted by the front after its dQ
// instead of by the back, which is the critical path since the twenty-second session's reading (the seventh session's
// version of this switch lost 0.2-1% when the front paced the block). Its fast instance runs with front 248 /
// producer 32 / back 224 registers (0 spills; the fast kernel spills with front 232: 80 B, 240: 8 B, the producer with
// 24: 40 B); the deterministic instance keeps the budgets above (with the fixed-point deterministic mode the back
// spills at 224). Not with FLASHDSA_BWD_RS_DKV (the front uses the SS form).
#ifndef FLASHDSA_BWD_FRONT_CHUNK8
#define FLASHDSA_BWD_FRONT_CHUNK8 0
#endif
// Whether the kernel instance of the mode computes chunk 8 in the front (the fast instance of the switch's builds).
template <bool kDeterministic>
constexpr bool front_chunk8() { return FLASHDSA_BWD_FRONT_CHUNK8 && !kDeterministic; }
// The register budgets of the kernel instance for the mode (setmaxnreg after the role split).
template <bool kDeterministic>
constexpr int front_regs() { return front_chunk8<kDeterministic>() ? 248 : kFrontRegs; }
template <bool kDeterministic>
constexpr int producer_regs() { return front_chunk8<kDeterministic>() ? 32 : kProducerRegs; }
template <bool kDeterministic>
constexpr int back_regs() { return front_chunk8<kDeterministic>() ? 224 : kBackRegs; }
static_assert(front_regs<false>() + back_regs<false>() + producer_regs<false>() <= 512, "register file");

// FLASHDSA_BWD_EARLY_DQ=1 (A/B build, fast mode; twenty-seventh session, not yet measured): the back issues block i + 1's
// dQ wgmma between the two halves of block i's last dKV chunk emission (after waiting kv_full / pds_full of block i + 1,
// normally complete by then: the front writes the tiles right after tiles_free) instead of after that emission, so that
// kv_empty(i + 1) — the start of the producer's next gather, which the front waits for ≈ 21-25% of its time — comes
// ≈ 500 cycles earlier and the back's next head is only chunk 0. Not with FLASHDSA_BWD_RS_DKV.
#ifndef FLASHDSA_BWD_EARLY_DQ
#define FLASHDSA_BWD_EARLY_DQ 0
#endif
template <bool kDeterministic>
constexpr bool early_dq() { return FLASHDSA_BWD_EARLY_DQ && !kDeterministic; }
#if FLASHDSA_BWD_EARLY_DQ && FLASHDSA_BWD_RS_DKV
#error "FLASHDSA_BWD_EARLY_DQ: not with FLASHDSA_BWD_RS_DKV"
#endif

// FLASHDSA_BWD_KV_SPLIT=1 (A/B build, not yet measured): the producer gathers a block's kv tile in three parts of
// three column blocks, each completing its own mbarrier (kv_part[0], kv_part[1], then kv_full), and the front issues
// S's k-steps of a part as soon as it landed, instead of waiting for the whole 72 KB tile (docs/perf-notes.md,
// twenty-second session: the front waits 21% of its time for the gather at 8K).
#ifndef FLASHDSA_BWD_KV_SPLIT
#define FLASHDSA_BWD_KV_SPLIT 0
#endif
constexpr int kKvParts = FLASHDSA_BWD_KV_SPLIT ? 3 : 1;
static_assert(kQkBlocks % kKvParts == 0, "kv parts of whole column blocks");

// Shared memory of one CTA: the buffers, then the mbarriers. Tiles are SW128
// (csrc/sm90/common/hopper.cuh), 1024-byte aligned, natural column order.
struct alignas(1024) SmemPlan {
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
  uint64_t setup_full;              // producer -> front, back: block list and num_blocks written (once)
  uint64_t kv_full;                 // producer -> front, back: kv tile + idx of block i (cp.async + arrive)
  uint64_t kv_empty;                // front, back -> producer: both dQ of block i done, kv may be overwritten
  uint64_t pds_full;                // front -> back: P and dS tiles of block i written
  uint64_t tiles_free;              // back -> front: back's last dKV wgmma of block i done (P, dS free)
#if FLASHDSA_BWD_KV_SPLIT
  uint64_t kv_part[2];              // A/B build: column blocks 0..2 / 3..5 of block i landed (kv_full: 6..8)
#endif
};
constexpr size_t kSmemBytes = sizeof(SmemPlan) + 1024;  // + slack to align the dynamic smem base: 227 KB
static_assert(kSmemBytes <= hw::kSmemLimit, "shared memory budget: one kv stage (a second one needs 72 KB more)");

// The kernel code assumes these (ties to the public limits and to the common building blocks).
static_assert(kQkCols == kDqk && kVCols == kDv, "the kernel is written for the production MLA widths");
static_assert(kBlockKeys == hw::kBlockKeys, "key blocks are the common 64-slot blocks of a top-k row");
static_assert(kThreads == 3 * hw::kWarpgroup, "front, back and producer warpgroups");
static_assert(kHeadsPerCta == 64 && kBlockKeys == 64, "wgmma shapes (m64, n64 tiles) and the 64-thread index loads");
static_assert(kQkCols % kColsPerBlock == 0 && kVCols % kColsPerBlock == 0, "whole SW128 blocks");
static_assert(hw::kSw128RowBytes == 128, "the copies address SW128 rows as 128 bytes (8 pieces of 16)");

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
