// Internal: compile-time plan of the Hopper sparse MLA forward kernel (docs/kernels/sparse_mla_fwd.md).
//
// One CTA = one query token x 64 heads (the wgmma M dimension), 384 threads:
//   warpgroup 0, 1: consumers. Consumer c owns output columns [256c, 256c+256) and computes
//                   S = Q K^T for the key blocks of its parity (even blocks: 0, odd blocks: 1).
//   warpgroup 2:    producer. Gathers 64-key blocks of kv rows with 16-byte cp.async.
// Key blocks are processed in pairs: block 2i lives in KV stage 0, block 2i+1 in KV stage 1.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace flashdsa::sm90::sparse_mla_fwd_impl {

constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr int kHeadsPerCta = 64;  // M of every wgmma; H = 16/32 pad it, H = 128 uses two CTAs
constexpr int kBlockKeys = 64;    // keys per KV stage (N of S = Q K^T, K of O += P V)
constexpr int kTileCols = 64;     // bf16 columns of one SW128 tile (128-byte rows)
constexpr int kTileBytes = kHeadsPerCta * kTileCols * 2;  // 8192: a 64 x 64 bf16 SW128 tile
constexpr int kQkTiles = kDqk / kTileCols;                // 9 tiles per Q / KV row block
constexpr int kVTilesPerConsumer = kDv / 2 / kTileCols;   // 4: each consumer's 256 value columns
constexpr int kRopeTile = kQkTiles - 1;                   // tile 8: columns [512, 576), never a value

// KV stages are loaded and released in two column halves so that one half can be refilled while
// the other is still being read: kLeft = tiles [0, 4) (consumer 0's values), kRight = tiles [4, 9)
// (consumer 1's values + the RoPE tile).
enum Half : int { kLeft = 0, kRight = 1, kNumHalves = 2 };
constexpr int kHalfTileBegin[kNumHalves] = {0, kVTilesPerConsumer};
constexpr int kHalfTileEnd[kNumHalves] = {kVTilesPerConsumer, kQkTiles};

constexpr int kNumStages = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kNumConsumers = 2;
constexpr int kNumThreads = (kNumConsumers + 1) * kWarpgroupThreads;  // 384
constexpr int kProducerWarpgroup = kNumConsumers;

// Register split through setmaxnreg. setmaxnreg.inc only draws on the registers that setmaxnreg.dec
// released inside the CTA, so the split must fit the launch allocation: __launch_bounds__(384, 1)
// gives 168 registers per thread (65536 / 384 rounded down to a multiple of 8). A larger split (e.g. a
// 48-register producer with 232-register consumers) makes the consumers' setmaxnreg.inc wait forever.
constexpr int kLaunchRegs = 65536 / kNumThreads / 8 * 8;  // 168
// 72 / 216 (FlashMLA's split; 72 * 128 + 216 * 256 = 64,512 = the whole launch allocation): the
// producer needs the 72 for the prefetched key slots of the next pair (sparse_mla_fwd.cu, producer());
// the consumers use R0-R212 and do not spill. Measured (H200, 2026-12-02, geomean over 11 shapes vs
// the kernel before that day): 1.135x, against 1.100x with 40 / 232 and no prefetch (40 registers are
// too few for it: ptxas spilled 12 bytes) and 1.094x with 72 / 216 but no prefetch (the split alone
// does not help; the prefetch it makes room for does).
constexpr int kProducerRegs = 72;
constexpr int kConsumerRegs = 216;
static_assert(kWarpgroupThreads * (kProducerRegs + kNumConsumers * kConsumerRegs) <= kNumThreads * kLaunchRegs,
              "register split exceeds the launch allocation");

// Producer work split: 8 threads per 128-byte tile row (one 16-byte chunk each), 16 rows at a time.
constexpr int kChunksPerTileRow = 8;
constexpr int kRowsPerPass = kWarpgroupThreads / kChunksPerTileRow;  // 16
constexpr int kRowsPerThread = kBlockKeys / kRowsPerPass;            // 4

// Expected arrivals on the mbarriers.
constexpr int kCpAsyncArrivals = kWarpgroupThreads;  // one cp.async.mbarrier.arrive per producer thread
constexpr int kMaskWriters = kBlockKeys / 32;        // producer warps that publish a 32-key validity word
constexpr int kReleaseArrivals = 4;                  // one per warp of the releasing consumer

constexpr int kExchangeArrivals = kWarpgroupThreads;  // every thread of the publishing consumer

// Consumer <-> consumer hand-offs, one mbarrier each (SmemPlan::exchange), one phase per key-block
// pair: "X from WGc" = warpgroup c publishes X and arrives (all 128 threads), the other one waits.
// (mbarriers rather than bar.arrive / bar.sync pairs: same cost here, and compute-sanitizer's
// racecheck follows mbarrier ordering, so the tool can verify these exchanges.)
enum Exchange : int {
  kMaxFromWg0 = 0,  // running max of block 2i published in SmemPlan::max_wg0
  kMaxFromWg1 = 1,  // running max of the pair published in SmemPlan::max_wg1
  kPFromWg0 = 2,    // P of block 2i (rescaled to the pair max) stored in stage 0's RoPE tile
  kPFromWg1 = 3,    // P of block 2i+1 stored in SmemPlan::p_wg1 (pairs with an odd block only)
  kNumExchanges = 4,
};

// Named barrier (0 is __syncthreads): both consumers, once, for the row-sum exchange.
constexpr int kRowSumExchange = 5;
// Named barriers 6 (consumer 0), 7 (consumer 1): the warpgroup's O tile is in shared memory
// (epilogue, write_output; the tiles reuse the Q region, 2 x 64 x 512 B).
constexpr int kOutTileBarrier = 6;

// Dynamic shared memory (the kernel aligns its base to 1024 bytes; every tile offset below is a
// multiple of 1024, as SW128 atoms require). sizeof + alignment slack = the launch size.
struct SmemPlan {
  __nv_bfloat16 q[kQkTiles * kHeadsPerCta * kTileCols];                // 73,728 B: Q [64 heads x 576]
  __nv_bfloat16 kv[kNumStages][kQkTiles * kBlockKeys * kTileCols];      // 2 x 73,728 B: kv rows [64 x 576]
  __nv_bfloat16 p_wg1[kHeadsPerCta * kBlockKeys];                       // 8,192 B: P of odd blocks
  float max_wg0[kHeadsPerCta];                                          // log2-domain running maxima
  float max_wg1[kHeadsPerCta];
  float row_sum[kNumConsumers][kHeadsPerCta];                           // partial softmax denominators
  uint32_t valid_mask[kNumStages][kBlockKeys / 32];                     // bit k: key k of the stage valid
  uint64_t q_ready;
  uint64_t kv_ready[kNumStages][kNumHalves];
  uint64_t kv_free[kNumStages][kNumHalves];
  uint64_t exchange[kNumExchanges];
};

static_assert(kNumConsumers * kHeadsPerCta * kDv / 2 * 2 <= sizeof(SmemPlan::q), "O tiles must fit the Q region");
static_assert(offsetof(SmemPlan, kv) % 1024 == 0 && offsetof(SmemPlan, p_wg1) % 1024 == 0, "SW128 tiles");

constexpr int kSmemAlignSlack = 1024;  // dynamic smem base is only guaranteed 16-byte aligned
constexpr int kSmemBytes = static_cast<int>(sizeof(SmemPlan)) + kSmemAlignSlack;
static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 per-block limit");

}  // namespace flashdsa::sm90::sparse_mla_fwd_impl
