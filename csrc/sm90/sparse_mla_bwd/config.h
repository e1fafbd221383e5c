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

// The deterministic emission's switches FLASHDSA_BWD_DET_RAW_BITS, FLASHDSA_BWD_DET_ADDR and FLASHDSA_BWD_DET_AMAX2
// (twenty-ninth session, H100: 3.5% / 3.8% faster at 8K / 32K, equal at 128K) are folded in: the emission is their form
// now, and a build that still passes one fails below.
#if defined(FLASHDSA_BWD_DET_RAW_BITS) || defined(FLASHDSA_BWD_DET_ADDR) || defined(FLASHDSA_BWD_DET_AMAX2)
#error "FLASHDSA_BWD_DET_RAW_BITS / _ADDR / _AMAX2 are folded into the deterministic emission (docs/perf-notes.md)"
#endif
// The deterministic mode's sorted pass 1 runs in waves of the resident CTAs (twenty-ninth session; H200: det 0.765× ->
// 0.795× the fast mode at 32K, 0.729× -> 0.939× at 128K): a CTA's producer starts gathering once every CTA of the
// earlier waves issued its last block (MainParams::sweep_counter counts them), so that the CTAs in flight walk their
// sorted rows in step from the first block. The fast mode's rotation by a live progress counter would do that too, but
// it makes the order of a row's blocks, and so dq's rounding, depend on timing; a fixed start keeps dq bitwise
// repeatable. (Measured as the A/B switch FLASHDSA_BWD_DET_WAVES=1, folded in: a build that still passes it fails.)
#ifdef FLASHDSA_BWD_DET_WAVES
#error "FLASHDSA_BWD_DET_WAVES is folded in: the deterministic sorted pass always runs in waves (docs/perf-notes.md)"
#endif
// Switches measured on 2026-12-05 (H200, thirtieth session), slower, and removed with their code (docs/perf-notes.md;
// the code is in git history before commit e095343): FLASHDSA_BWD_DET_WAVE_LEAD=4 (the wave signal 4
// blocks before a CTA's last one: det +1.5% at 32K, +1.8% at 128K) and FLASHDSA_BWD_REVERSE_TOKENS=1 (a launch's rows
// in reverse order: fast +0.2 to +0.9% at 16K on causal rows). A build that still passes one fails here.
#if defined(FLASHDSA_BWD_DET_WAVE_LEAD) || defined(FLASHDSA_BWD_REVERSE_TOKENS)
#error "FLASHDSA_BWD_DET_WAVE_LEAD and FLASHDSA_BWD_REVERSE_TOKENS were removed on 2026-12-05 (docs/perf-notes.md)"
#endif
// Switches measured on 2026-12-05 (H100), neutral or slower, and removed with their code (docs/perf-notes.md,
// twenty-eighth session; the code is in git history before commit 9db2d3f): a build that still passes one fails here.
#if defined(FLASHDSA_BWD_RS_DKV) || defined(FLASHDSA_BWD_EMIT_HALF) || defined(FLASHDSA_BWD_KV_SPLIT) || \
    defined(FLASHDSA_BWD_FRONT_CHUNK8) || defined(FLASHDSA_BWD_EARLY_DQ) || defined(FLASHDSA_BWD_DET_FULL_LINES)
#error "FLASHDSA_BWD_{RS_DKV,EMIT_HALF,KV_SPLIT,FRONT_CHUNK8,EARLY_DQ,DET_FULL_LINES} were removed on 2026-12-05 (docs/perf-notes.md)"
#endif

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
