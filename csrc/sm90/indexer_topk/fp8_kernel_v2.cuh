// Internal: the FP8 (e4m3) selection pass of the fused Hopper indexer + top-k for D_I = 128, the
// walk on the bf16 kernel's v2 structure (the FP8 walk since 2026-12-02; D_I = 64 runs the first FP8
// walk, fp8_kernel.cuh). Host side: indexer_topk_fp8.cu. Contract: docs/spec.md §3 "FP8 selection";
// design and measurements: docs/kernels/indexer_topk.md, "FP8 selection pass".
//
// The selection rules, the candidate lists (C best by the FP8 score), the compaction, the exact bf16
// re-score (fp8_kernel.cuh rescore_row_ring, here with 8 warps) and the final top-K select are those
// of the first FP8 walk; the walk is the bf16 v2 kernel's (kernel_v2.cuh):
//   - 256 threads = two consumer warpgroups; warpgroup w owns the block's (token, head) columns
//     [128 w, 128 w + 128) with one m64n128 f32 accumulator (4 wgmma m64n128k32 e4m3 per 64-key tile);
//   - __launch_bounds__(256, 2): 128 registers per thread, two CTAs per SM;
//   - e4m3 key tiles (64 keys x 128 bytes, 8 KB) by TMA into an 8-stage ring (full mbarrier with a
//     transaction count; the last of the 8 warps done with a stage refills it), one CTA barrier per
//     tile right after the MMA issue (it ORs the "list nearly full" flags);
//   - the query scale folded into the weights (w' = w · a), the key scale applied to the head sums;
//   - H_I = 32: the head sums as a second wgmma (FLASHDSA_FP8V2_MMA_SUMS below): the tile's 64 accumulators, ReLU'd
//     and packed to bf16x2, are the register A operand of 8 m64n8k16 against the block's weights placed
//     block-diagonally in shared memory; f32 sums per (key, token), no reduce-scatter. H_I = 64 keeps:
//   - the epilogue in packed bf16x2 arithmetic: as soon as the tile's MMA is complete, its 64 f32
//     accumulators are converted with the ReLU fused (cvt.rn.relu.bf16x2.f32: 32 instructions) into
//     32 registers, the accumulator is free for the next tile's MMA, and the head sums (fma.rn.bf16x2
//     with bf16x2 weights; H_I = 64: per head pair, the two halves then added in f32; H_I = 32: packed by key,
//     the quad reduce-scatter in bf16x2 too), the quad reduce-scatter and the appends of tile it-1 run while
//     the MMA of tile it is in flight. The error bound vs the C - K slack is
//     argued in the design section (the f32 epilogue, A/B-tested on the H200, was slower: removed);
//   - rows of a never-compacted list (threshold 0) store key k at slot k - k_start without atomics
//     (dense appends); the other rows append by ballot + one shared atomic per (row, warp, key) — at H_I = 32
//     one per (row, warp) for both of a lane's keys;
//   - the band re-score (args.band > 0, indices only; kernel instances of its own): its per-row tail (band_tail,
//     not inlined) selects with one warp per row (warp_select.cuh), all rows of the block at once, and at H_I = 32
//     re-scores the block's rows through one gather ring per warp (rescore_rows_ring);
//   - inputs with T_kv >= kSampleMinTiles (64) tiles run the kSampled instance: blocks of >= 64 tiles walk
//     every 16th, 32nd or 64th tile first, cut their long rows to about their share of the C best, then walk
//     the rest above that threshold (kernel.cuh, "sampled threshold"; a failed cut re-walks the block).
// Supported: H_I 32 / 64, D_I = 128 (one 128-byte SW128 row per key: the TMA box), T_kv >= 0.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "flashdsa/ops.h"
#include "flashdsa/status.h"
#include "sm90/common/cuda_check.cuh"
#include "sm90/common/hopper.cuh"
#include "sm90/common/indexer_score.cuh"
#include "sm90/indexer_topk/fp8_kernel.cuh"
#include "sm90/indexer_topk/kernel.cuh"
#include "sm90/indexer_topk/launch.cuh"
#include "sm90/indexer_topk/select.cuh"
#include "sm90/indexer_topk/warp_select.cuh"

// Attribution builds of the FP8 check program only (docs/kernels/indexer_topk.md, "FP8 selection
// pass"; never defined in the library build; their outputs are wrong by design): 1 = no exact re-score
// (the C cut and the final select run on the FP8 scores), 2 = no per-row tail at all (no C cut, no
// re-score, no final select: the outputs are left unwritten), 3 = as 2 and no appends (the pass test is
// computed into a sink; no list fills, so no compaction).
// FLASHDSA_FP8_BAND_ABLATE=1 (attribution builds only, wrong results): the band instances skip the exact re-score.
#if defined(FLASHDSA_FP8_BAND_ABLATE)
#define FLASHDSA_FP8V2_BAND_ABLATE FLASHDSA_FP8_BAND_ABLATE
#else
#define FLASHDSA_FP8V2_BAND_ABLATE 0
#endif
#if defined(FLASHDSA_FP8_ABLATE)
#define FLASHDSA_FP8V2_ABLATE FLASHDSA_FP8_ABLATE
#else
#define FLASHDSA_FP8V2_ABLATE 0
#endif

// H_I = 32: the weighted head sums as a second, small MMA (FLASHDSA_FP8V2_MMA_SUMS, default 1): the tile's ReLU'd
// scores, packed to bf16 as they are, are the register A operand of 8 wgmma m64n8k16 (bf16, f32 accumulation) whose
// B holds the block's weights w' block-diagonally (B[(t, h), n] = w'[t, h] for n / 2 = t): the head sums come out per
// (key, token), no bf16 FMA chains and no quad reduce-scatter. 0: the packed bf16x2 epilogue (KP below).
// FLASHDSA_FP8V2_PINGPONG (the MMA ordering) was removed on 2026-12-05 with the bf16 walk's (docs/perf-notes.md,
// twenty-eighth session).
#if defined(FLASHDSA_FP8V2_PINGPONG)
#error "FLASHDSA_FP8V2_PINGPONG was removed on 2026-12-05"
#endif
#ifndef FLASHDSA_FP8V2_MMA_SUMS
#define FLASHDSA_FP8V2_MMA_SUMS 1
#endif


namespace flashdsa::sm90::indexer_topk_impl::fp8v2 {

constexpr int kNth = 256;            // two consumer warpgroups
constexpr int kNWarps = kNth / 32;   // 8
constexpr int kCtas = 2;             // 2 x 256 threads x 128 registers = the register file
constexpr int kRing = 8;             // key-tile ring depth (8 KB e4m3 tiles)
constexpr uint32_t kTileBytes = kTileKeys * kFp8RowBytes;
constexpr int kWgCols = kHalfCols;   // (token, head) columns per warpgroup
constexpr int kW2Ld = 20;            // packed weights: words per (warpgroup, quad) row (16 + 4: no bank conflict)

// Per-H_I shape of a block and of a warpgroup's share of it.
template <int H>
struct Cfg {
  static_assert(H == 32 || H == 64, "H_I must be 32 or 64");
  static constexpr int kTokens = kCols / H;             // rows per block: 8 or 4
  static constexpr int kTokensPerWg = kTokens / 2;      // 4 or 2
  static constexpr int kChunksPerToken = H / 8;         // 8-column accumulator chunks per row
  static constexpr int kVals = kTokensPerWg / 2;        // scores per lane after the reduce-scatter: 2 or 1
  static constexpr int kWgChunks = kTokensPerWg * kChunksPerToken;  // 16 chunks per warpgroup
  static_assert(kWgChunks == 16, "16 accumulator chunks (of 4 values) per warpgroup");
};

// The re-score's shared memory: 8 warps over the Q block and the kRing key tiles (contiguous, free
// after the walk).
template <int H, int D>
using RescoreSmemV2 = RescoreRingSmem<H, D, kNWarps, kCols * kFp8RowBytes + kRing * kTileKeys * kFp8RowBytes>;

// Shared memory of a CTA (the Q block and the key ring first: the re-score overlays them).
template <int H>
struct alignas(1024) Smem {
  static constexpr int NT = Cfg<H>::kTokens;
  uint8_t q[kCols * kFp8RowBytes];              // SW128 [256, 128 B] e4m3: row = token * H + head
  uint8_t k[kRing][kTileKeys * kFp8RowBytes];   // SW128 [64, 128 B] e4m3 key tiles (TMA)
  // 1 KB no code uses since the f32 epilogue went (it held w' per column): it stays so that the
  // members after it keep the offsets of the measured kernel; freeing it is a separate, measured change.
  float unused_w[kCols];
  uint32_t w2[2][4][kW2Ld];                     // packed epilogue: bf16x2 (w'[c], w'[c + 1]) per (wg, quad, chunk)
  uint64_t full[kRing];                         // stage s holds its tile (TMA transaction count)
  uint32_t done[kRing];                         // warps done reading stage s, over all its uses
  Scratch<kNth> sel;
  int count[NT];
  uint32_t thr[NT];
  int k_start[NT];
  int k_end[NT];
  int block;
  // (after the members of the kernel without the sampled walk, which keep their offsets)
  int cut[NT];  // sampled walk (kernel.cuh): the row's cut size after phase A (0: none)
  int walk;  // the block's walk order (sampled_walk.h walk_tile; 0 = plain): read from here, not kept in a register
  int redo_blk;  // a block to walk again without the sampled threshold (-1: none; thread 0 only)
  int tile_key[2 * kRing];  // sampled instance: first key of the tile at ring position p (kernel_v2.cuh)
  // MMA head sums (H_I = 32): per warpgroup the B operand [8 n, 128 (token, head)] bf16, K-major SW128 (two 64-column
  // blocks of 8 rows): row n holds w' of warpgroup token n / 2 in its 32 columns and 0 elsewhere.
  alignas(1024) uint8_t wmat[2][2 * 8 * hw::kSw128RowBytes];
};

// Dynamic shared memory of a CTA.
template <int H>
constexpr size_t smem_bytes() {
  return sizeof(Smem<H>) + 1024;  // + slack to align the dynamic base
}

static_assert(kCtas * (smem_bytes<32>() + 1024) <= 228 * 1024 && kCtas * (smem_bytes<64>() + 1024) <= 228 * 1024,
              "two CTAs per SM (with the 1 KB each reserves) must fit the SM's 228 KB of shared memory");
static_assert(kCols == kNth, "one weight column per thread when a block starts");

// Kernel arguments: the FP8 pass's (fp8_kernel.cuh) plus the e4m3 key tensor map.
struct Fp8V2Args {
  Fp8KernelArgs base;
  CUtensorMap tmap_k8;  // k8 as [T_kv, 128] uint8, box 64 keys x 128 bytes, 128-byte swizzle
};

// Descriptors (hopper.cuh make_desc_sw128, K-major SW128, LBO 16, SBO 1024) in 32-bit halves: a k-step
// of 32 e4m3 values (32 bytes) adds 2 to the low half.
constexpr uint32_t kDescHi = (static_cast<uint32_t>(hw::kSw128AtomBytes) >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr) { return ((smem_addr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) { return (static_cast<uint64_t>(kDescHi) << 32) | lo; }

// Issues acc = K̂_tile [64, D] x Q̂_wg^T [D, 128] (f32): D / 32 wgmma m64n128k32 e4m3.
template <int D>
__device__ __forceinline__ void issue_wg_mma_fp8(float (&acc)[kHalfAcc], uint32_t ka, uint32_t qb) {
  hw::wgmma_fence();
  hw::wgmma_ss_m64n128k32_e4m3_overwrite(acc, desc_of(ka), desc_of(qb));
#pragma unroll
  for (int ks = 1; ks < D / 32; ++ks)
    hw::wgmma_ss_m64n128k32_e4m3(acc, desc_of(ka + 2u * ks), desc_of(qb + 2u * ks), true);
  hw::wgmma_commit();
}

// bf16x2 of (lo, hi) (lo in the low half), round to nearest; with kRelu negative values become 0 (a
// NaN stays NaN: cvt's .relu keeps NaN as the canonical NaN).
template <bool kRelu>
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t d;
  if constexpr (kRelu) {
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  }
  return d;
}
// a * b + c per bf16 lane (one rounding).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// lo + hi in f32.
__device__ __forceinline__ float sum_bf16x2(uint32_t p) { return bf16_lane(p, 0) + bf16_lane(p, 1); }
// a + b per bf16 lane (one rounding).
__device__ __forceinline__ uint32_t add_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// (lo, lo) and (hi, hi) of a bf16x2: ptxas folds them into the using instruction's operand (.H0_H0 / .H1_H1).
__device__ __forceinline__ uint32_t bf16x2_lo_lo(uint32_t p) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {l, l};\n}\n" : "=r"(d) : "r"(p));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_hi_hi(uint32_t p) {
  uint32_t d;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {h, h};\n}\n" : "=r"(d) : "r"(p));
  return d;
}

// The Q block's 16-byte chunks (D = 128: 8 per row) over the 256 threads: this thread's i-th chunk
// (i < kQChunksPerThread) is chunk .y of row .x. load_query_block_v2 copies them, move_query_nans_to_weights reads
// back the ones the thread copied.
constexpr int kQRowChunks = kFp8RowBytes / 16;
constexpr int kQChunksPerThread = kCols * kQRowChunks / kNth;
__device__ __forceinline__ int2 query_chunk(int i) {
  const int c = static_cast<int>(threadIdx.x) + kNth * i;
  return make_int2(c / kQRowChunks, c % kQRowChunks);
}

// cp.async of the block's e4m3 queries [t0, t0 + NT) x H heads (row = token * H + head, 128 bytes);
// rows of tokens >= T are zero-filled. All 256 threads.
template <int H>
__device__ __forceinline__ void load_query_block_v2(uint8_t* qs, const Fp8KernelArgs& a, int t0) {
#pragma unroll 1  // once per block: unrolled, ptxas hoists 8 row addresses out of the block loop and spills them
  for (int i = 0; i < kQChunksPerThread; ++i) {
    const int row = query_chunk(i).x, chunk = query_chunk(i).y;
    const int t = t0 + row / H, h = row % H;
    const bool valid = t < a.T;
    const uint8_t* src =
        a.q8 + (valid ? static_cast<int64_t>(t) * a.q8_st + static_cast<int64_t>(h) * a.q8_sh + chunk * 16 : 0);
    hw::cp_async_16(qs + hw::sw128_offset(row, chunk), src, valid);
  }
}

// bf16x2 of the folded weights (w'[t, h], w'[t, h + 1]) with w' = w · a (the query scale; fp32 product), 0 past T.
template <int H>
__device__ __forceinline__ uint32_t folded_weight_pair(const Fp8KernelArgs& a, int t, int h) {
  float w0 = 0.f, w1 = 0.f;
  if (t < a.T) {
    const float* wr = a.w8 + static_cast<int64_t>(t) * a.w8_st;
    const float* sr = a.q_scale + static_cast<int64_t>(t) * H;
    w0 = wr[h] * sr[h];
    w1 = wr[h + 1] * sr[h + 1];
  }
  return cvt_bf16x2<false>(w0, w1);
}

// MMA head sums: a NaN e4m3 query code (0x7f / 0xff) would reach every token of its warpgroup through the second
// MMA (0 · NaN in the other tokens' columns). Each thread zeroes such codes in the chunks it copied into the Q block
// (load_query_block_v2's mapping) and writes NaN into that token's weight columns of B instead, so that only the
// token's own scores are NaN, as the contract wants (the quantizer's NaN rows also have NaN scales, which w'
// carries). After the thread's cp.async wait, before its proxy fence and the block's barrier.
template <int H>
__device__ __forceinline__ void move_query_nans_to_weights(uint8_t* qs, uint8_t (*wmat)[2 * 8 * hw::kSw128RowBytes]) {
#pragma unroll 1
  for (int i = 0; i < kQChunksPerThread; ++i) {
    const int row = query_chunk(i).x, chunk = query_chunk(i).y;
    uint4* const p = reinterpret_cast<uint4*>(qs + hw::sw128_offset(row, chunk));
    uint4 v = *p;
    const uint32_t mx = __vcmpeq4(v.x & 0x7f7f7f7fu, 0x7f7f7f7fu), my = __vcmpeq4(v.y & 0x7f7f7f7fu, 0x7f7f7f7fu);
    const uint32_t mz = __vcmpeq4(v.z & 0x7f7f7f7fu, 0x7f7f7f7fu), mw = __vcmpeq4(v.w & 0x7f7f7f7fu, 0x7f7f7f7fu);
    if ((mx | my | mz | mw) != 0u) {
      v.x &= ~mx;
      v.y &= ~my;
      v.z &= ~mz;
      v.w &= ~mw;
      *p = v;
      const int token = row / H, head = row % H, g = token / Cfg<H>::kTokensPerWg, tl = token % Cfg<H>::kTokensPerWg;
      const int col = tl * H + (head & ~1);  // the warpgroup column pair holding the head
#pragma unroll
      for (int e = 0; e < 2; ++e)
        *reinterpret_cast<uint32_t*>(wmat[g] + hw::sw128_elem_offset(8, 2 * tl + e, col)) = 0x7fc07fc0u;  // bf16 NaN x2
    }
  }
}

// The shared memory of rescore_rows_ring: two rows' q and weights (row r in buffer r % 2, each with an mbarrier that
// completes when the row's cp.async copies have landed) and kPipe gather stages per warp, over kArea bytes.
template <int H, int D, int kWarps, int kArea_>
struct RescoreRowsSmem {
  static constexpr int kLd = D + 8;  // bf16 row stride: conflict-free fragment loads
  static constexpr int kArea = kArea_;
  static constexpr int kStageElems = kRescoreKeys * kLd;
  static constexpr int kPipe = rescore_pipe_stages(kArea - 2 * (H * kLd * 2 + H * 4) - 64, kWarps, kStageElems * 2);
  static_assert(kPipe >= 2, "the re-score gather ring needs two stages");
  uint64_t qbar[2];
  uint16_t q[2][H * kLd];
  uint16_t keys[kWarps][kPipe][kStageElems];
  float w[2][H];
};

// The band tail's exact re-score at H_I = 32 (the same values, MMAs and fmaf order as rescore_row_ring with kPass = H =
// 32, so the same bits) of rows t0 .. t0 + nrows - 1, row r's counts[r] candidates at cand_i + r * cap: warp w's
// batches of 16 candidates (row r: [16 (w + kWarps b), +16)) form one sequence over the rows, so the gather ring runs
// across row boundaries (the next row's first batches and its q are in flight while this row ends). Row r + 1's q and
// weights are copied (cp.async, tracked by the buffer's mbarrier) while row r is scored; one CTA barrier per row frees
// the buffer of row r - 1. All threads; begins after a barrier that freed the area, ends with a barrier.
template <int H, int D, bool kRelu, int kWarps, class RS>
__device__ __forceinline__ void rescore_rows_ring(const Fp8KernelArgs& a, int t0, int nrows, float* cand_s,
                                                  const int* cand_i, const int* counts, RS& rs) {
  static_assert(H == 32, "one head pass of 32");
  constexpr int kLd = RS::kLd, P = RS::kPipe, NTH = 32 * kWarps, KB = kRescoreKeys;
  constexpr int kChunks = D / 8;  // 16-byte chunks of a bf16 row
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int cap = a.cap;
  auto nb_of = [&](int r) {
    const int m = counts[r], first = warp * KB;
    return m > first ? (m - first + kWarps * KB - 1) / (kWarps * KB) : 0;
  };
  auto normalize = [&](int& r, int& b) {
    while (r < nrows && b >= nb_of(r)) {
      ++r;
      b = 0;
    }
  };
  // The key of row `lane` of item (r, b) (lanes < 16), or -1.
  auto item_key = [&](int r, int b) {
    const int i = warp * KB + b * (kWarps * KB) + lane;
    return r < nrows && lane < KB && i < counts[r] ? cand_i[static_cast<size_t>(r) * cap + i] : -1;
  };
  const __nv_bfloat16* const k_rows = a.k;
  const int64_t k_st = a.k_st;
  auto issue = [&](int slot, int my_key) { rescore_gather_batch<D, kLd>(k_rows, k_st, rs.keys[warp][slot], my_key, lane); };
  auto load_row = [&](int r) {  // q and w of row t0 + r into buffer r % 2; its mbarrier gets this thread's arrival
    const int t = t0 + r;
    uint16_t* qb = rs.q[r & 1];
    for (int i = tid; i < H * kChunks; i += NTH) {
      const int h = i / kChunks, chunk = i % kChunks;
      hw::cp_async_16(qb + h * kLd + chunk * 8,
                      a.q + static_cast<int64_t>(t) * a.q_st + static_cast<int64_t>(h) * a.q_sh + chunk * 8, true);
    }
    for (int h = tid; h < H; h += NTH) hw::cp_async_4(hw::smem_u32(rs.w[r & 1] + h), a.w + static_cast<int64_t>(t) * a.w_st + h, true);
    hw::cp_async_arrive(&rs.qbar[r & 1]);
  };
  if (tid == 0) {
    hw::mbar_init(&rs.qbar[0], NTH);
    hw::mbar_init(&rs.qbar[1], NTH);
    hw::mbar_fence_init();
  }
  __syncthreads();
  if (nrows > 0) load_row(0);
  if (nrows > 1) load_row(1);
  int pr = 0, pb = 0;  // the producer's next item
  normalize(pr, pb);
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (pr < nrows) {
      issue(s, item_key(pr, pb));
      ++pb;
      normalize(pr, pb);
    }
    hw::cp_async_commit();
  }
  int next_key = item_key(pr, pb);
  int j = 0;  // items consumed: item j sits in stage j % P
  for (int r = 0; r < nrows; ++r) {
    if (r >= 1) {
      __syncthreads();  // every warp is done with row r - 1: its buffer takes row r + 1
      if (r + 1 < nrows) load_row(r + 1);
    }
    hw::mbar_wait(&rs.qbar[r & 1], static_cast<uint32_t>(r >> 1) & 1u);  // row r's q and w have landed
    const uint16_t* qrow = rs.q[r & 1];
    const float* wrow = rs.w[r & 1];
    const int m = counts[r], nb = nb_of(r);
    float* list_s = cand_s + static_cast<size_t>(r) * cap;
    for (int b = 0; b < nb; ++b, ++j) {
      hw::cp_async_wait<P - 1>();
      __syncwarp();  // every lane's copies of item j have landed
      const uint16_t* kb = rs.keys[warp][j % P];
      float s0 = 0.f, s1 = 0.f;  // keys g, g + 8: this lane's heads
      {
        float acc[H / 8][4];
        rescore_batch_mma<D, H, kLd>(acc, kb, qrow, 0, lane);
        rescore_batch_sums<H, kRelu>(acc, wrow, 0, c, s0, s1);
      }
      __syncwarp();  // every lane has read item j's stage: it takes the producer's next item
      if (pr < nrows) {
        issue(j % P, next_key);
        ++pb;
        normalize(pr, pb);
      }
      hw::cp_async_commit();
      next_key = item_key(pr, pb);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      const int i0 = warp * KB + b * (kWarps * KB);
      if (c == 0 && i0 + g < m) list_s[i0 + g] = s0;
      if (c == 0 && i0 + g + 8 < m) list_s[i0 + g + 8] = s1;
    }
  }
  hw::cp_async_wait<0>();
  __syncthreads();  // the re-scored lists are complete (and rs is free)
  if (tid == 0) {
    hw::mbar_inval(&rs.qbar[0]);
    hw::mbar_inval(&rs.qbar[1]);
  }
}

// Phase 1 of band_tail for one row (one warp): the list's k best to out_i, ranks k + 1 .. k_keep compacted to the
// list's front (every entry to out_i when m <= K). Not inlined: its registers are its own, whatever the tail around
// it keeps live (the walk's state is live across band_tail).
__device__ __noinline__ int2 band_split_row(const float* list_s, int* list_i, int m, int K, int k, int k_keep,
                                            int32_t* out_i, uint32_t* hist) {
  return m > K ? warp_split_top_k(list_s, list_i, m, k, k_keep, out_i, list_i, hist)
               : warp_filter<false>(list_s, list_i, m, keep_all(), keep_all(), out_i, nullptr);
}

// The per-row tail of the band re-score (indices only, docs/spec.md §3) for the block of rows t0 .. t0 + NT - 1: a row
// with more than K candidates sends its K - band best by the FP8 score straight to the output; only its candidates
// ranked K - band + 1 .. C are re-scored exactly, and their best fill the row. The two selections run one warp per
// row (warp_select.cuh), all rows at once, with a 2048-bin histogram per warp in the Q block + key ring (free after
// the walk; the re-score's ring between them). Not inlined: its registers stay out of the walk's allocation (inlined,
// ptxas spilled inside the tile loop). All threads; the caller's next barrier follows.
template <int H, int D, bool kRelu>
__device__ __noinline__ void band_tail(const Fp8KernelArgs& a, Smem<H>& sm, int t0, float* cand_s, int* cand_i) {
  constexpr int NT = Cfg<H>::kTokens;
  using RS = RescoreSmemV2<H, D>;
  const int warp = warp_in_cta();  // (opaque: nothing of the tail is hoisted into the walk's registers)
  uint32_t* const hist = reinterpret_cast<uint32_t*>(sm.q) + warp * kWarpHistBins;
  static_assert(kNWarps * kWarpHistBins * 4 <= RS::kArea, "the warps' histograms fit the re-score area");
  // 1. Split (warp r: row r): the K - band best to the output, the candidates ranked K - band + 1 .. C
  //    compacted to the list's front; sm.thr[r] = how many went out, sm.count[r] = how many to re-score.
  for (int r = warp; r < NT && t0 + r < a.T; r += kNWarps) {
    const float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
    int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
    int32_t* out_i = a.out_idx + static_cast<int64_t>(t0 + r) * a.K;
    const int m = sm.count[r];
    // The row's band and C: as given, or scaled to its visible keys n (m > K implies n > K).
    const int n = sm.k_end[r] - sm.k_start[r];
    const int band = a.band_scaled ? fp8_row_band_part(a.band, n, a.K) : a.band;
    const int C = a.band_scaled ? fp8_row_candidates(a.C, n, a.K) : a.C;
    const int2 split = band_split_row(list_s, list_i, m, a.K, a.K - band, C, out_i, hist);
    if (warp_lane() == 0) {
      sm.thr[r] = static_cast<uint32_t>(split.x);
      sm.count[r] = split.y;
    }
  }
  __syncthreads();  // the splits are written (rows and counts) and the histograms are free
  // 2. The exact re-score of each row's rest. H_I = 32: every row of the block in one gather ring per warp
  //    (rescore_rows_ring; two rows' q fit the area); H_I = 64: row after row, all warps on a row (each ends with a
  //    barrier).
#if FLASHDSA_FP8V2_BAND_ABLATE != 1
  if constexpr (H == 32) {
    using RR = RescoreRowsSmem<H, D, kNWarps, RS::kArea>;
    static_assert(sizeof(RR) <= RR::kArea, "the rows ring fits the re-score area");
    rescore_rows_ring<H, D, kRelu, kNWarps>(a, t0, min(NT, a.T - t0), cand_s, cand_i, sm.count,
                                            *reinterpret_cast<RR*>(sm.q));
  } else {
    for (int r = 0; r < NT && t0 + r < a.T; ++r) {
      if (sm.count[r] == 0) continue;
      rescore_row_ring<H, D, kRelu, kNWarps, 32, true>(a, t0 + r, cand_s + static_cast<size_t>(r) * a.cap,
                                                       cand_i + static_cast<size_t>(r) * a.cap, sm.count[r],
                                                       *reinterpret_cast<RS*>(sm.q));
    }
  }
#endif
  __syncthreads();  // every re-score is complete (the histograms' area is free again)
  // 3. Warp r: the rest's best by the exact score fill row r after the first sm.thr[r] slots; -1 padding.
  for (int r = warp; r < NT && t0 + r < a.T; r += kNWarps) {
    int32_t* out_i = a.out_idx + static_cast<int64_t>(t0 + r) * a.K;
    const int sure = static_cast<int>(sm.thr[r]);
    const int kept = warp_keep_top_k(cand_s + static_cast<size_t>(r) * a.cap, cand_i + static_cast<size_t>(r) * a.cap,
                                     sm.count[r], a.K - sure, out_i + sure, hist);
    for (int j = sure + kept + warp_lane(); j < a.K; j += 32) out_i[j] = -1;
  }
}

// The FP8 selection pass, v2 walk: a persistent CTA of two consumer warpgroups takes blocks of
// 256 / H query rows from the scheduler, walks their key tiles (TMA ring, e4m3 wgmma, the packed bf16x2
// epilogue, dense / counter appends, compactions to the C best), then per row cuts the list to C,
// re-scores it exactly from bf16 and writes the top K (indices and exact scores, -1 / -inf padding).
// kSampled: the instance for inputs with T_kv >= kSampleMinTiles tiles (the host picks it), whose long blocks
// take the sampled threshold; the other instance has none of its code in the tile loop.
template <int H, int D, bool kRelu, bool kSampled, bool kBand>
__global__ void __launch_bounds__(kNth, kCtas) indexer_topk_fp8_v2_kernel(const __grid_constant__ Fp8V2Args args) {
  static_assert(D == 128, "the v2 FP8 walk takes D_I = 128 (one 128-byte TMA box row per key)");
  using C = Cfg<H>;
  constexpr int NT = C::kTokens, NTW = C::kTokensPerWg, V = C::kVals, CPT = C::kChunksPerToken, S = kRing;
  // H_I = 32: the head sums packed by key (one bf16x2 per token holds keys acc_row and acc_row + 8; the quad
  // reduce-scatter in bf16x2, one unpack at the end) and one shared atomic per quad group for both of a lane's
  // candidates (append_quad_group2). H_I = 64 packs by head pair and appends one candidate per lane.
  constexpr bool KP = H == 32;
  constexpr bool A2 = V == 2;
  constexpr bool MS = KP && FLASHDSA_FP8V2_MMA_SUMS;  // the head sums as the second MMA (H_I = 32)
  // A tile's head sums between its wait and its appends: 2 NTW f32 (token, key) partials, or (KP) one
  // bf16x2 (key acc_row, key acc_row + 8) per token.
  // MS: the second MMA's m64n8 result (4 f32: keys acc_row, acc_row + 8 x tokens 2 quad, 2 quad + 1 of B's columns,
  // i.e. token quad twice).
  using Part = std::conditional_t<MS, float[4], std::conditional_t<KP, uint32_t[NTW], float[2 * NTW]>>;
  const Fp8KernelArgs& a = args.base;
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Smem<H>*>(hw::align_smem(smem_raw));

  const int tid = threadIdx.x, lane = tid & 31, quad = lane & 3;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);      // warp-uniform for the compiler
  const int acc_row = 16 * ((tid >> 5) & 3) + (lane >> 2);  // tile key of accumulators 4j, 4j+1 (+8: 4j+2, 4j+3)
  const size_t list_base = static_cast<size_t>(blockIdx.x) * NT * a.cap;
  float* const cand_s = a.cand_scores + list_base;
  int* const cand_i = a.cand_idx + list_base;
  // After the reduce-scatter: H_I = 32 (V = 2): row wg * 4 + quad, keys acc_row, acc_row + 8;
  // H_I = 64 (V = 1): row wg * 2 + quad / 2, key acc_row + 8 (quad % 2).
  const int my_row = wg * NTW + (V == 2 ? quad : quad >> 1);
  const int my_key_off = V == 2 ? 0 : 8 * (quad & 1);
  float* const my_list_s = cand_s + static_cast<size_t>(my_row) * a.cap;
  int* const my_list_i = cand_i + static_cast<size_t>(my_row) * a.cap;

  if (tid == 0) {
    init_tile_ring<S>(sm.full, sm.done, &args.tmap_k8, a.T_kv);
    if (kSampled) sm.redo_blk = -1;
  }
  const uint32_t k_desc0 = desc_lo(hw::smem_u32(sm.k[0]));
  const uint32_t q_desc = desc_lo(hw::smem_u32(sm.q)) + static_cast<uint32_t>(wg * kWgCols * kFp8RowBytes >> 4);
  uint32_t ring = 0;  // tiles consumed by this CTA: tile `it` of a block sits in stage (ring + it) % S
#if FLASHDSA_FP8V2_ABLATE == 3
  uint32_t ablate_sink = 0u;
#endif

  for (;;) {
    hw::fence_proxy_async();  // the previous block's generic writes (re-score) before this block's TMA writes
    // A block whose sampled walk failed (below) is walked again, plainly, by the same CTA.
    bool rewalk = false;
    const int blk = kSampled ? claim_block_or_rewalk(a, tid, &sm.block, &sm.redo_blk, rewalk)
                             : claim_block(a, tid, &sm.block);
    if (blk >= a.num_blocks) break;
    const int t0 = (a.num_blocks - 1 - blk) * NT;  // latest rows first

    init_block_rows<NT>(a, t0, sm.k_start, sm.k_end, sm.count, sm.thr);
    // The query scale folds into the weights: relu(a x) = a relu(x) for a > 0 (a NaN scale makes the
    // row's scores NaN, as the quantization contract wants).
    // MS: the B operand of the head-sum MMA (1024 bf16x2 words, 4 per thread: warpgroup g, row n, columns c, c + 1).
    // Otherwise packed: bf16x2 (w'[c], w'[c + 1]) per (warpgroup, quad, chunk), by the first 128 threads.
    if constexpr (MS) {
#pragma unroll 1
      for (int i = 0; i < 4; ++i) {
        const int word = tid + kNth * i;
        const int g = word >> 9, n = (word >> 6) & 7, c = 2 * (word & 63), tl = c / H;
        const uint32_t v = tl == n / 2 ? folded_weight_pair<H>(a, t0 + g * NTW + tl, c % H) : 0u;
        *reinterpret_cast<uint32_t*>(sm.wmat[g] + hw::sw128_elem_offset(8, n, c)) = v;
      }
    } else if (tid < kCols / 2) {
      const int c = 2 * tid;
      const int within = c & (kWgCols - 1);  // column 8 j + 2 quad of warpgroup c / 128
      sm.w2[c / kWgCols][(within & 7) >> 1][within >> 3] = folded_weight_pair<H>(a, t0 + c / H, c % H);
    }
    __syncthreads();

    const TileRange tiles = block_tile_range<NT>(sm.k_start, sm.k_end);
    const int tile0 = tiles.tile0, ntiles = tiles.ntiles;
    // Pass 0 of a long block walks phase A, cuts the long rows to their r best and walks phase B
    // (kernel.cuh, "sampled threshold"); its rows start at threshold 1 instead of 0 (every real score's
    // key is > 1), so none takes the dense appends, which assume keys in ascending order. A failed cut
    // re-walks the block plainly.
    // (Attribution build 3 appends nothing: a cut would always fail, so it walks plainly.)
    const bool sampled = kSampled && FLASHDSA_FP8V2_ABLATE != 3 && !rewalk && ntiles >= kSampleMinTiles;
    const int lg = sample_stride_log2(ntiles, a.cap);  // phase A: every 2^lg-th tile (sampled_walk.h)
    if (kSampled && tid == 0) sm.walk = sampled ? sample_walk_code(ntiles, lg) : 0;  // published by the barrier after the query load
    if (kSampled && tid < NT) {
      set_row_cuts<NT>(sampled, tile0, lg, a.C, sm.k_start, sm.k_end, sm.cut);
      if (sampled) sm.thr[tid] = 1u;
    }

    auto issue_key_tile = [&](int i) {  // one thread: step i's tile of the block into stage (ring + i) % S
      const uint32_t pos = ring + static_cast<uint32_t>(i), slot = pos % S;
      const int key_base = (tile0 + walk_tile(i, kSampled ? sm.walk : 0)) * kTileKeys;
      if (kSampled) sm.tile_key[pos % (2 * S)] = key_base;  // published by the arrive (release)
      hw::mbar_arrive_expect_tx(&sm.full[slot], kTileBytes);
      hw::tma_load_2d(sm.k[slot], &args.tmap_k8, &sm.full[slot], 0, key_base);
    };
    if (tid == 0) {
      for (int i = 0; i < S && i < ntiles; ++i) issue_key_tile(i);
    }
    if (ntiles > 0) {
      load_query_block_v2<H>(sm.q, a, t0);
      hw::cp_async_commit();
      hw::cp_async_wait<0>();
      if constexpr (MS) move_query_nans_to_weights<H>(sm.q, sm.wmat);
      hw::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    }
    __syncthreads();

    // The tile's MMA is complete in every warp: the last of the 8 warps refills the stage with tile it + S.
    auto release_stage = [&](uint32_t slot, int it) {
      if (lane == 0) {
        if (atomicAdd(&sm.done[slot], 1u) % kNWarps == kNWarps - 1 && it + S < ntiles) issue_key_tile(it + S);
      }
    };
    // First key of the block's tile `tile` (the sampled instance: from the ring table, written at its issue)
    auto tile_key_of = [&](int tile) {
      return kSampled ? sm.tile_key[(ring + static_cast<uint32_t>(tile)) % (2 * S)] : (tile0 + tile) * kTileKeys;
    };
    // The key scales of this lane's V keys of tile `tile` (0 past T_kv: masked by the ranges anyway).
    auto load_kscales = [&](int tile, float (&ksv)[V]) {
      const int key0 = tile_key_of(tile) + acc_row + my_key_off;
#pragma unroll
      for (int v = 0; v < V; ++v) ksv[v] = key0 + 8 * v < a.T_kv ? a.k_scale[key0 + 8 * v] : 0.f;
    };

    bool list_nearly_full = false;
    // From this thread's partial head sums (head_sums below: part[2 tl + r] for warpgroup token tl, key acc_row + 8 r;
    // KP: part[tl] holding both keys): the quad reduce-scatter, the key scale, the pass test and the appends of tile
    // `tile`.
    auto finish_tile = [&](int tile, const Part& part, const float (&ksv)[V]) {
      float sums[V];
      if constexpr (MS) {
        sums[0] = part[0];
        sums[V - 1] = part[2];
      } else if constexpr (KP) {
        // The quad reduce-scatter in bf16x2 (lane quad keeps token quad, both keys), then one unpack.
        const bool upper = (quad & 2) != 0, odd = (quad & 1) != 0;
        uint32_t half[2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          half[i] = add_bf16x2(upper ? part[2 + i] : part[i], __shfl_xor_sync(0xffffffffu, upper ? part[i] : part[2 + i], 2));
        const uint32_t both = add_bf16x2(odd ? half[1] : half[0], __shfl_xor_sync(0xffffffffu, odd ? half[0] : half[1], 1));
        sums[0] = bf16_lane(both, 0);
        sums[V - 1] = bf16_lane(both, 1);
      } else {
        quad_reduce_scatter<NTW>(part, sums, quad);
      }
      // Rows not yet compacted (threshold 0) hold every visible key in order: key k at slot k - k_start.
      if (tid < NT && sm.thr[tid] == 0u) {
        const int e = min((tile0 + tile + 1) * kTileKeys, sm.k_end[tid]);
        if (e > sm.k_start[tid]) sm.count[tid] = e - sm.k_start[tid];
      }
      const uint32_t row_thr = sm.thr[my_row];
      const int row_start = sm.k_start[my_row], row_end = sm.k_end[my_row];
      const int key0 = tile_key_of(tile) + acc_row + my_key_off;
      bool passes[V] = {};
      float scores[V] = {};
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int key = key0 + 8 * v;
        const float s = sums[v] * ksv[v];
        const bool visible = key >= row_start && key < row_end;
#if FLASHDSA_FP8V2_ABLATE == 3
        ablate_sink += visible && score_key(s) > row_thr ? static_cast<uint32_t>(key) : 0u;
        continue;
#endif
        if (row_thr == 0u && visible) {  // dense row: every visible key passes (score_key >= 1)
          const int pos = key - row_start;
          my_list_s[pos] = s;
          my_list_i[pos] = key;
          list_nearly_full |= pos >= a.cap - kMinCapacitySlack;
        }
        const bool pass = row_thr != 0u && visible && score_key(s) > row_thr;
        if constexpr (!A2) append_quad_group(pass, s, key, quad, &sm.count[my_row], my_list_s, my_list_i, a.cap, list_nearly_full);
        passes[v] = pass;
        scores[v] = s;
      }
      if constexpr (A2)
        append_quad_group2(passes[0], scores[0], key0, passes[V - 1], scores[V - 1], key0 + 8, quad, &sm.count[my_row],
                           my_list_s, my_list_i, a.cap, list_nearly_full);
    };

    // The head sums of a complete accumulator in bf16x2. Chunk j's values f(acc[4 j + 2 r]), f(acc[4 j + 2 r + 1])
    // (key acc_row + 8 r, heads 2 quad + {0, 1} of the chunk's 8) are packed with the ReLU fused and multiplied by the
    // bf16x2 weights, per token: KP (H_I = 32) packs by key — (f(acc[4 j]), f(acc[4 j + 2])) is head 2 quad for keys
    // acc_row and acc_row + 8, times that head's weight in both halves (ptxas folds the duplication into the HFMA2
    // operand), likewise head 2 quad + 1: one chain holds both keys, part[tl] = that bf16x2; otherwise by head pair —
    // one chain per key, each summed per lane half, the two halves then added in f32 into part[2 tl + r].
    auto head_sums = [&](const float (&acc)[kHalfAcc], Part& part) {
      const uint4* w2 = reinterpret_cast<const uint4*>(sm.w2[wg][quad]);
#pragma unroll
      for (int tl = 0; tl < NTW; ++tl) {
        uint32_t p0 = 0u, p1 = 0u;
#pragma unroll
        for (int q4 = 0; q4 < CPT / 4; ++q4) {
          const uint4 wv = w2[(tl * CPT) / 4 + q4];
          const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = tl * CPT + 4 * q4 + e;
            if constexpr (KP) {
              p0 = fma_bf16x2(bf16x2_lo_lo(ws[e]), cvt_bf16x2<kRelu>(acc[4 * j], acc[4 * j + 2]), p0);
              p0 = fma_bf16x2(bf16x2_hi_hi(ws[e]), cvt_bf16x2<kRelu>(acc[4 * j + 1], acc[4 * j + 3]), p0);
            } else {
              p0 = fma_bf16x2(ws[e], cvt_bf16x2<kRelu>(acc[4 * j], acc[4 * j + 1]), p0);
              p1 = fma_bf16x2(ws[e], cvt_bf16x2<kRelu>(acc[4 * j + 2], acc[4 * j + 3]), p1);
            }
          }
        }
        if constexpr (KP) {
          part[tl] = p0;
        } else {
          part[2 * tl] = sum_bf16x2(p0);
          part[2 * tl + 1] = sum_bf16x2(p1);
        }
      }
    };
    // MS: the head sums of a complete accumulator as the second MMA — its 64 values, ReLU'd and packed to bf16x2
    // (cvt.rn.relu.bf16x2.f32, the first MMA's accumulator chunks 2 kk, 2 kk + 1 are the A fragment of k-step kk), times
    // the block's B of weights (8 k-steps of 16 (token, head) columns), f32 accumulation; complete on return.
    const uint32_t wdesc = desc_lo(hw::smem_u32(sm.wmat[wg]));
    auto mma_sums = [&](const float (&acc)[kHalfAcc], float (&s)[4]) {
      uint32_t af[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) af[kk][r] = cvt_bf16x2<kRelu>(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
      }
      // ptxas C7518 (every wgmma of the kernel serialized, the first MMA's overlap with finish_tile lost) unless both:
      // s starts at 0 with every k-step accumulating (an overwriting first k-step gave s the registers of af[0]), and
      // the sums leave the wgmma's registers through an add (x + 0 is not folded: -0 + 0 = +0) — read straight from
      // them in finish_tile's branches while the next tile's MMA is in flight, ptxas wanted a wait in a divergent path.
      // (A fast-math build could fold the add away: scripts/fp8_gpu.sh flags any C75xx serialization message.)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = 0.f;
      hw::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        hw::wgmma_rs_m64n8k16<0>(s, af[kk], desc_of(wdesc + 64u * (kk >> 2) + 2u * (kk & 3)), true);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(s);
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = s[i] + 0.0f;
    };
    // Iteration it: issue MMA(it); the barrier (flags of tile it-2's appends); with MMA(it) in flight,
    // the reduce-scatter and the appends of tile it-1 (from part, 8 or 4 f32 per thread); wait MMA(it);
    // its head sums into part; compaction of the flagged lists. No wgmma is in flight across the back edge.
    Part part;
    float ksv[V];
    for (int it = 0; it < ntiles; ++it) {
      const uint32_t slot = wait_tile_stage<S>(sm.full, ring, it);
      float acc[kHalfAcc];
      {
        const uint32_t uslot = __shfl_sync(0xffffffffu, slot, 0);
        const uint32_t uq = __shfl_sync(0xffffffffu, q_desc, 0);  // uniform register (kernel_v2.cuh)
        issue_wg_mma_fp8<D>(acc, k_desc0 + uslot * (kTileBytes >> 4), uq);
      }
      // it == walk_na (> 0): phase A's appends (tiles < walk_na) are in after this iteration's, and the
      // long rows are cut to their r best instead of the usual compaction (kernel.cuh "sampled threshold").
      const bool cut_now = kSampled && it == walk_phase_a_tiles(sm.walk) && it != 0;
      const bool compact = __syncthreads_or(list_nearly_full || cut_now) != 0;
      list_nearly_full = false;
      if (it > 0) finish_tile(it - 1, part, ksv);
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      release_stage(slot, it);
      if constexpr (MS) {
        load_kscales(it, ksv);  // (issued before the MMA: the loads run while it does)
        mma_sums(acc, part);
      } else {
        head_sums(acc, part);
        load_kscales(it, ksv);
      }
      // A row flagged by tile it-2's appends is compacted after tile it-1's (at most 2 x 64 appends
      // past the flag, as in kernel.cuh).
      if (compact) {      // uniform over the CTA
        __syncthreads();  // every append of tile it-1 is in the lists and counts
        compact_full_lists<NT>(a, cand_s, cand_i, sm.count, sm.thr, sm.sel, kSampled && it <= walk_phase_a_tiles(sm.walk) ? sm.cut : nullptr,
                               cut_now);
      }
    }
    if (ntiles > 0) finish_tile(ntiles - 1, part, ksv);  // its flags need no compaction: the final select follows
    ring += static_cast<uint32_t>(ntiles);
    __syncthreads();  // every append is in; no TMA is in flight (every issued tile was waited for)
    if (kSampled && sm.walk != 0) {
      // A cut row that ends with fewer than its keep count (K; the FP8 pass: C) of entries, though it has
      // that many visible keys, had its threshold above its keep-th best score: the block is walked again.
      // (Written out in both walks: as a helper it moved the FP8 walk's register allocation.)
      const bool failed = tid < NT && sm.cut[tid] > 0 && sm.count[tid] < min(a.C, sm.k_end[tid] - sm.k_start[tid]);
      if (__syncthreads_or(failed)) {
        if (tid == 0) sm.redo_blk = blk;
        continue;
      }
    }

    // Per row: its C best candidates by the FP8 score (in place), their exact scores, the top K.
    using RS = RescoreSmemV2<H, D>;
    static_assert(sizeof(RS) <= RS::kArea && offsetof(Smem<H>, k) == sizeof(Smem<H>::q) &&
                      offsetof(Smem<H>, unused_w) >= RS::kArea,
                  "the re-score ring overlays the Q block and the key ring, which are contiguous");
    if constexpr (kBand) {
#if FLASHDSA_FP8V2_ABLATE >= 2
      continue;
#endif
      band_tail<H, D, kRelu>(a, sm, t0, cand_s, cand_i);
      continue;  // (the next block's claim starts with a barrier: the histograms and sm.count / thr are done)
    } else {  // (an else: in the band instances the loop below would be unreachable code, nvcc warning 128)
      for (int r = 0; r < NT; ++r) {
        const int t = t0 + r;
        if (t >= a.T) break;
        float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
        int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
        int m = sm.count[r];
#if FLASHDSA_FP8V2_ABLATE >= 2
        continue;
#endif
        if (m > a.C) m = keep_top_k(list_s, list_i, m, a.C, list_s, list_i, sm.sel).count;
#if FLASHDSA_FP8V2_ABLATE != 1
        // Heads in rolled passes of 32 (H_I = 64: two), which keeps the tail within the 128 registers.
        rescore_row_ring<H, D, kRelu, kNWarps, 32, true>(a, t, list_s, list_i, m, *reinterpret_cast<RS*>(sm.q));
#endif
        int32_t* out_i = a.out_idx + static_cast<int64_t>(t) * a.K;
        float* out_s = a.out_scores != nullptr ? a.out_scores + static_cast<int64_t>(t) * a.K : nullptr;
        write_row_top_k(a, list_s, list_i, m, out_i, out_s, sm.sel);
      }
    }
  }
#if FLASHDSA_FP8V2_ABLATE == 3
  if (ablate_sink == 0x7f800001u) a.out_idx[0] = static_cast<int32_t>(ablate_sink);  // keeps the sink alive
#endif
}

// ---- host side -----------------------------------------------------------------------------------

// Whether this walk takes the shape (D_I = 64: the caller runs fp8_kernel.cuh).
inline bool supports_shape(int H, int D) { return (H == 32 || H == 64) && D == 128; }

// The tensor map of k8 ([T_kv, 128] e4m3 as uint8, row stride k8_st bytes): boxes of 64 keys x 128
// bytes (the 128-byte swizzle's row), zero fill past T_kv.
inline Status make_k8_tensor_map(const Fp8KernelArgs& a, CUtensorMap* map) {
  return make_key_rows_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.k8, kFp8RowBytes, a.T_kv,
                                  static_cast<uint64_t>(a.k8_st), kFp8RowBytes, "sm90 indexer_topk fp8 v2");
}

// Launches one instance with its dynamic shared memory.
template <int H, bool kRelu, bool kBand>
Status launch_instance(const Fp8V2Args& args, int grid, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(smem_bytes<H>());
  // Only inputs with enough keys for a long block take the instance with the sampled threshold.
  if (sampled_walk_allowed(args.base.T_kv))
    return launch_with_smem(indexer_topk_fp8_v2_kernel<H, 128, kRelu, true, kBand>, dim3(grid), kNth, kSmem, stream,
                            "indexer_topk_fp8_v2_kernel", args);
  return launch_with_smem(indexer_topk_fp8_v2_kernel<H, 128, kRelu, false, kBand>, dim3(grid), kNth, kSmem, stream,
                          "indexer_topk_fp8_v2_kernel", args);
}
// The band re-score (args.base.band > 0) has instances of its own.
template <int H, bool kRelu>
Status launch(const Fp8V2Args& args, int grid, cudaStream_t stream) {
  return args.base.band > 0 ? launch_instance<H, kRelu, true>(args, grid, stream)
                            : launch_instance<H, kRelu, false>(args, grid, stream);
}

// Runs the v2 FP8 selection pass with the host's Fp8KernelArgs (the same workspace layout, grid and
// capacity as fp8_kernel.cuh). Requires supports_shape(H, D).
inline Status run(const Fp8KernelArgs& base, int H, bool relu, int grid, cudaStream_t stream) {
  Fp8V2Args args{};
  args.base = base;
  const Status st = make_k8_tensor_map(base, &args.tmap_k8);
  if (!st.ok()) return st;
  if (H == 32) return relu ? launch<32, true>(args, grid, stream) : launch<32, false>(args, grid, stream);
  return relu ? launch<64, true>(args, grid, stream) : launch<64, false>(args, grid, stream);
}

}  // namespace flashdsa::sm90::indexer_topk_impl::fp8v2
