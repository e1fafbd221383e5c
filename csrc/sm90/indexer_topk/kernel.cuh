// Internal: the device side of the fused Hopper indexer + top-k (docs/spec.md §3): configuration,
// shared-memory plan and the kernel. Host side: indexer_topk.cu. Design: docs/kernels/indexer_topk.md.
//
// One warpgroup per CTA, two CTAs per SM, persistent grid with a dynamic block scheduler. A block is
// kTokens query rows (kTokens * H_I = 256 wgmma columns); the CTA walks the 64-key tiles of the union
// of its rows' key ranges with a cp.async ring, scores each tile with wgmma (keys = M, (token, head)
// = N), applies f, the weights and the head sum in registers, and appends the (score, key) pairs
// above each row's running threshold to a per-row candidate list in the workspace. A list that may
// overflow on the next tile is compacted to its exact top K (radix select, select.cuh), which raises
// the row's threshold. At the end of the walk each row's list is reduced to the top K and written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/common/indexer_score.cuh"
#include "sm90/indexer_topk/select.cuh"

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kThreads = kSelectThreads;  // one warpgroup per CTA
constexpr int kCtasPerSm = 2;             // the two CTAs of an SM overlap each other's epilogue and MMA
constexpr int kCols = 256;                // wgmma N: (query token, head) columns of a block
constexpr int kTileKeys = 64;             // wgmma M: keys per tile
// A list is compacted at most two tiles (2 x 64 appends) after it crossed cap - 128 (see the main
// loop), so the candidate capacity must leave that much room above K.
constexpr int kMinCapacitySlack = 2 * kTileKeys;
constexpr int kHalfCols = kCols / 2;      // columns scored by one wgmma group (m64n128)
constexpr int kHalfAcc = kHalfCols / 2;   // its f32 accumulators per thread

template <int H, int D>
struct Config {
  static_assert(H == 32 || H == 64, "H_I must be 32 or 64");
  static_assert(D == 64 || D == 128, "D_I must be 64 or 128");
  static constexpr int kTokens = kCols / H;           // query rows per block: 8 (H_I 32) or 4 (H_I 64)
  static constexpr int kTokensPerLane = kTokens / 4;  // rows a lane owns after the quad reduce-scatter
  static constexpr int kChunksPerToken = H / 8;       // 8-column accumulator chunks per query row
  static constexpr int kTokensPerHalf = kTokens / 2;  // query rows scored by one half (m64n128)
  static constexpr int kStages = D == 128 ? 2 : 4;    // key-tile ring depth (two CTAs per SM must fit)
};

template <int H, int D>
struct alignas(1024) Smem {
  using Cfg = Config<H, D>;
  __nv_bfloat16 q[kCols * D];                    // SW128 [256, D]: row = token * H + head
  __nv_bfloat16 k[Cfg::kStages][kTileKeys * D];  // SW128 [64, D] key tiles
  float w[kCols];                                // weights of the block's columns (0 past T)
  SelectScratch sel;
  int count[Cfg::kTokens];     // candidates held per row
  uint32_t thr[Cfg::kTokens];  // admission threshold (score key) per row: append iff key > thr
  int k_start[Cfg::kTokens];   // key range per row ([0, 0) for rows past T)
  int k_end[Cfg::kTokens];
  int block;  // block handed out by the scheduler
};

template <int H, int D>
constexpr size_t smem_bytes() {
  return sizeof(Smem<H, D>) + 1024;  // + slack to align the dynamic base to 1024 bytes
}

// The kernel code assumes these (ties to the common building blocks and the wgmma shapes).
static_assert(kThreads == hw::kWarpgroup, "one warpgroup per CTA: the wgmma and the selection use 128 threads");
static_assert(kTileKeys == 64 && kHalfCols == 128, "wgmma m64n128 per column half");
static_assert(kCols == 2 * kHalfCols && kHalfAcc * 2 == kHalfCols, "two m64n128 halves; N / 2 f32 accumulators");
static_assert(kTileKeys * hw::kSw128RowBytes % hw::kSw128AtomBytes == 0, "key tiles are whole swizzle atoms");
static_assert(kCtasPerSm * smem_bytes<32, 128>() <= 228 * 1024 && kCtasPerSm * smem_bytes<64, 128>() <= 228 * 1024 &&
                  kCtasPerSm * smem_bytes<32, 64>() <= 228 * 1024 && kCtasPerSm * smem_bytes<64, 64>() <= 228 * 1024,
              "kCtasPerSm CTAs must fit the SM's 228 KB of shared memory");
static_assert(smem_bytes<64, 128>() <= hw::kSmemLimit, "per-block shared memory limit");

struct KernelArgs {
  const __nv_bfloat16* q;    // [T, H, D]; strides q_st, q_sh
  const __nv_bfloat16* k;    // [T_kv, D]; stride k_st
  const float* w;            // [T, H]; stride w_st
  const int32_t* k_start;    // [T]
  const int32_t* k_end;      // [T]
  int32_t* out_idx;          // [T, K]
  float* out_scores;         // [T, K], or null
  float* cand_scores;        // [gridDim.x, kTokens, cap]: candidate lists, one per row in flight
  int32_t* cand_idx;         // [gridDim.x, kTokens, cap]
  int* block_counter;        // zero at launch
  int64_t q_st, q_sh, k_st, w_st;
  int T, T_kv, K, cap, num_blocks;
};

// Issues the cp.async copies of key rows [key0, key0 + 64) into a SW128 tile; rows >= T_kv are
// zero-filled without being read.
template <int D>
__device__ __forceinline__ void load_key_tile(__nv_bfloat16* tile, const KernelArgs& a, int key0) {
  constexpr int kRowChunks = D / 8;
  constexpr int kPerThread = kTileKeys * kRowChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = threadIdx.x + kThreads * i;
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const int key = key0 + row;
    const bool valid = key < a.T_kv;
    const __nv_bfloat16* src = a.k + (valid ? static_cast<int64_t>(key) * a.k_st + chunk * 8 : 0);
    hw::cp_async_16(reinterpret_cast<char*>(tile) + hw::sw128_elem_offset(kTileKeys, row, chunk * 8), src, valid);
  }
}

// Issues the cp.async copies of the block's queries [t0, t0 + kTokens) x H heads into the SW128
// tile (row = token * H + head); rows of tokens >= T are zero-filled.
template <int H, int D>
__device__ __forceinline__ void load_query_block(__nv_bfloat16* qs, const KernelArgs& a, int t0) {
  constexpr int kRowChunks = D / 8;
  constexpr int kPerThread = kCols * kRowChunks / kThreads;
#pragma unroll 8
  for (int i = 0; i < kPerThread; ++i) {
    const int c = threadIdx.x + kThreads * i;
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const int t = t0 + row / H, h = row % H;
    const bool valid = t < a.T;
    const __nv_bfloat16* src =
        a.q + (valid ? static_cast<int64_t>(t) * a.q_st + static_cast<int64_t>(h) * a.q_sh + chunk * 8 : 0);
    hw::cp_async_16(reinterpret_cast<char*>(qs) + hw::sw128_elem_offset(kCols, row, chunk * 8), src, valid);
  }
}

// Issues (does not wait for) acc = K_tile [64, D] x Q_half^T [D, 128] (fp32) for one half of the
// block's 256 (token, head) columns: half h = Q rows [128 h, 128 h + 128), i.e. tokens
// [h kTokens / 2, (h + 1) kTokens / 2). Both operands K-major SW128 tiles in smem; the 128-row
// offset is a whole number of 1024-byte swizzle atoms, so the swizzle phase is unchanged.
template <int D>
__device__ __forceinline__ void issue_score_half(float (&acc)[kHalfAcc], const __nv_bfloat16* ktile,
                                                 const __nv_bfloat16* qs, int half) {
  const char* qhalf = reinterpret_cast<const char*>(qs) + half * kHalfCols * hw::kSw128RowBytes;
  // Descriptors of k-step 0, advanced by compile-time byte offsets (address field = bytes >> 4; the
  // sums stay below the 14-bit field's limit since shared addresses are < 228 KB): two 64-bit adds
  // per wgmma instead of rebuilding both descriptors from the addresses.
  const uint64_t da = hw::desc_k_major(ktile, kTileKeys, 0), db = hw::desc_k_major(qhalf, kCols, 0);
  auto step = [](int rows, int ks) -> uint64_t {
    return static_cast<uint64_t>(((ks >> 2) * rows * hw::kSw128RowBytes + (ks & 3) * 32) >> 4);
  };
  hw::wgmma_fence();
  // The first k-step overwrites acc and declares it output-only, so the compiler keeps no registers
  // for acc's old (consumed) values across the code before the issue.
  hw::wgmma_ss_m64n128k16_overwrite<0, 0>(acc, da, db);
#pragma unroll
  for (int ks = 1; ks < D / 16; ++ks) {
    hw::wgmma_ss_m64n128k16<0, 0>(acc, da + step(kTileKeys, ks), db + step(kCols, ks), true);
  }
  hw::wgmma_commit();
}

// This thread's share of the head sums of the tokens of column half HALF: part[2 * tok + r] = sum
// over its columns of token tok of w * f(acc), for accumulator row r (tile key acc_row + 8 r).
// Accumulator chunk j of the half holds columns 128 HALF + 8 j + 2 (lane % 4) + {0, 1}, i.e. token
// HALF * kTokensPerHalf + j / kChunksPerToken; w_s is indexed by column.
template <int H, int D, bool kRelu, int HALF>
__device__ __forceinline__ void partial_head_sums(const float (&acc)[kHalfAcc], const float* w_s, int quad,
                                                  float (&part)[2 * Config<H, D>::kTokens]) {
  using Cfg = Config<H, D>;
#pragma unroll
  for (int tl = 0; tl < Cfg::kTokensPerHalf; ++tl) {
    float p0 = 0.f, p1 = 0.f;
#pragma unroll
    for (int jj = 0; jj < Cfg::kChunksPerToken; ++jj) {
      const int j = tl * Cfg::kChunksPerToken + jj;
      const float2 w = *reinterpret_cast<const float2*>(w_s + HALF * kHalfCols + 8 * j + 2 * quad);
      p0 = fmaf(w.x, hw::indexer_activation<kRelu>(acc[4 * j + 0]), p0);
      p0 = fmaf(w.y, hw::indexer_activation<kRelu>(acc[4 * j + 1]), p0);
      p1 = fmaf(w.x, hw::indexer_activation<kRelu>(acc[4 * j + 2]), p1);
      p1 = fmaf(w.y, hw::indexer_activation<kRelu>(acc[4 * j + 3]), p1);
    }
    const int tok = HALF * Cfg::kTokensPerHalf + tl;
    part[2 * tok] = p0;
    part[2 * tok + 1] = p1;
  }
}

// The 4 lanes of a quad hold partial sums of the same 2 keys x kTokens rows (v[2 tok + r]). Two
// butterfly steps that each keep half of the values leave lane q with the full sums of rows
// [q * kTokensPerLane, (q + 1) * kTokensPerLane): out[2 u + r] = row q * kTokensPerLane + u, key r.
template <int NT>
__device__ __forceinline__ void quad_reduce_scatter(const float (&v)[2 * NT], float (&out)[NT / 2], int quad) {
  float half[NT];
  const bool upper = (quad & 2) != 0;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const float send = upper ? v[i] : v[i + NT];
    const float keep = upper ? v[i + NT] : v[i];
    half[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
  }
  const bool odd = (quad & 1) != 0;
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    const float send = odd ? half[i] : half[i + NT / 2];
    const float keep = odd ? half[i + NT / 2] : half[i];
    out[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
}

// Compacts every candidate list that might overflow during the next tile to its top K, raising the
// row's threshold. All threads, right after a barrier (counts are stable until the next epilogue).
template <int NT>
__device__ __forceinline__ void compact_full_lists(const KernelArgs& a, float* cand_s, int* cand_i, int* count,
                                                   uint32_t* thr, SelectScratch& sc) {
  for (int r = 0; r < NT; ++r) {
    const int n = count[r];
    if (n <= a.cap - kMinCapacitySlack) continue;
    float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
    int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
    const Kept kept = keep_top_k(list_s, list_i, n, a.K, list_s, list_i, sc);  // n > cap - 128 >= K
    if (threadIdx.x == 0) {
      count[r] = kept.count;
      thr[r] = kept.thr;
    }
  }
  __syncthreads();
}

template <int H, int D, bool kRelu>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) indexer_topk_kernel(const __grid_constant__ KernelArgs a) {
  using Cfg = Config<H, D>;
  constexpr int NT = Cfg::kTokens, TPL = Cfg::kTokensPerLane, S = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  // Align by offsetting the shared pointer itself (not via an integer) so that the compiler keeps
  // shared-memory instructions for every access.
  auto& sm = *reinterpret_cast<Smem<H, D>*>(smem_raw + ((1024u - (hw::smem_u32(smem_raw) & 1023u)) & 1023u));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane & 3;
  const int acc_row = 16 * warp + (lane >> 2);  // tile key of accumulators 4j, 4j+1 (4j+2, 4j+3: +8)
  const size_t list_base = static_cast<size_t>(blockIdx.x) * NT * a.cap;
  float* const cand_s = a.cand_scores + list_base;
  int* const cand_i = a.cand_idx + list_base;

  for (;;) {
    __syncthreads();  // the previous block is done with the shared state
    if (tid == 0) sm.block = atomicAdd(a.block_counter, 1);
    __syncthreads();
    const int blk = sm.block;
    if (blk >= a.num_blocks) break;
    const int t0 = (a.num_blocks - 1 - blk) * NT;  // latest rows first: they see the most keys

    if (tid < NT) {
      const int t = t0 + tid;
      const bool valid = t < a.T;
      sm.k_start[tid] = valid ? a.k_start[t] : 0;
      sm.k_end[tid] = valid ? a.k_end[t] : 0;
      sm.count[tid] = 0;
      sm.thr[tid] = 0u;  // every real score's key is > 0
    }
    for (int c = tid; c < kCols; c += kThreads) {
      const int t = t0 + c / H;
      sm.w[c] = t < a.T ? a.w[static_cast<int64_t>(t) * a.w_st + c % H] : 0.f;
    }
    __syncthreads();

    // Key tiles covering the union of the block's ranges; per-row ranges are applied per key below.
    int lo = INT_MAX, hi = 0;
#pragma unroll
    for (int r = 0; r < NT; ++r) {
      if (sm.k_end[r] > sm.k_start[r]) {
        lo = min(lo, sm.k_start[r]);
        hi = max(hi, sm.k_end[r]);
      }
    }
    const int tile0 = hi > 0 ? lo / kTileKeys : 0;
    const int ntiles = hi > 0 ? (hi + kTileKeys - 1) / kTileKeys - tile0 : 0;
    uint32_t my_thr[TPL];

    // Software pipeline over (tile, column half) so that the epilogue of one half runs on the CUDA
    // cores while the tensor cores score the other half (the second CTA of the SM hides the selection).
    // Iteration it (0 .. ntiles; the last one only drains):
    //   barrier (tile it landed; every warp is done with tile it-1's stage; flags OR-ed) |
    //   issue MMA(it, 0) -> acc0 | load tile it-1+S into tile it-1's stage |
    //   head sums of tile it-1's half 1 (acc1, complete), quad reduce-scatter, appends of tile it-1 |
    //   compact the flagged lists | issue MMA(it, 1) -> acc1n | wait MMA(it, 0); head sums of half 0 |
    //   wait MMA(it, 1); acc1 = acc1n.
    // No wgmma is in flight across the loop's back edge (ptxas serializes every wgmma of the kernel
    // otherwise). Ring: tile i lives in stage i % S; the prologue loads tiles 0 .. S-1 (one cp.async
    // group each, Q joins tile 0's) and iteration it >= 1 commits one group (tile it-1+S, maybe
    // empty), so tile it is cp.async group it.
    // Compaction: a row flagged by tile it-2's appends is compacted after tile it-1's appends, so the
    // flag is raised at cap - 2 * 64 (two tiles of at most 64 appends each fit behind it).
    if (ntiles > 0) load_query_block<H, D>(sm.q, a, t0);  // joins the first key tile's group
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (s < ntiles) load_key_tile<D>(sm.k[s], a, (tile0 + s) * kTileKeys);
      hw::cp_async_commit();
    }

    bool list_nearly_full = false;
#if defined(FLASHDSA_INDEXER_ABLATE) && FLASHDSA_INDEXER_ABLATE != 0
    // Attribution builds of the check program (plan step 0): 1 = MMA only, the accumulators folded into
    // a sink; 2 = head sums, reduce-scatter and the pass test, no appends. Never in the library build.
    uint32_t ablate_sink = 0u;
#endif
    float acc1[kHalfAcc];  // tile it-1's half-1 scores, complete at the top of iteration it
    float part[2 * NT];    // tile it-1's partial head sums (half 0 filled in iteration it-1)

    // Barrier at the top of iteration it; returns whether a list was flagged by tile it-2's appends.
    auto tile_barrier = [&]() {
      hw::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
      const bool flagged = __syncthreads_or(list_nearly_full) != 0;
      list_nearly_full = false;
      return flagged;
    };
    // Half 1's head sums, the quad reduce-scatter and the appends of tile `tile` (from acc1, part).
    auto append_tile = [&](int tile) {
#if defined(FLASHDSA_INDEXER_ABLATE) && FLASHDSA_INDEXER_ABLATE == 1
      ablate_sink += __float_as_uint(acc1[0]) ^ __float_as_uint(acc1[kHalfAcc - 1]);
      return;
#endif
      partial_head_sums<H, D, kRelu, 1>(acc1, sm.w, quad, part);
      float sums[NT / 2];
      quad_reduce_scatter<NT>(part, sums, quad);
      // The rows' ranges and thresholds are re-read from shared memory each tile (broadcast loads):
      // keeping the ranges in registers across the walk made ptxas spill at H_I = 64.
      int my_start[TPL], my_end[TPL];
#pragma unroll
      for (int u = 0; u < TPL; ++u) {
        my_thr[u] = sm.thr[quad * TPL + u];
        my_start[u] = sm.k_start[quad * TPL + u];
        my_end[u] = sm.k_end[quad * TPL + u];
      }
      // Append visible keys above the row's threshold. The lanes of one quad position append to
      // the same row: one shared-memory atomic per group of them.
      const int key0 = (tile0 + tile) * kTileKeys + acc_row;
#pragma unroll
      for (int u = 0; u < TPL; ++u) {
        const int row = quad * TPL + u;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = key0 + 8 * r;
          const float s = sums[2 * u + r];
          const bool pass = key >= my_start[u] && key < my_end[u] && score_key(s) > my_thr[u];
#if defined(FLASHDSA_INDEXER_ABLATE) && FLASHDSA_INDEXER_ABLATE == 2
          ablate_sink += pass ? static_cast<uint32_t>(key) : 0u;
          continue;
#endif
          const unsigned ballot = __ballot_sync(0xffffffffu, pass);
          if (ballot == 0u) continue;
          const unsigned group = ballot & (0x11111111u << quad);
          const int leader = group != 0u ? __ffs(group) - 1 : lane;
          int base = 0;
          if (pass && lane == leader) base = atomicAdd(&sm.count[row], __popc(group));
          base = __shfl_sync(0xffffffffu, base, leader);
          if (pass) {
            const int pos = base + __popc(group & ((1u << lane) - 1u));
            const size_t at = static_cast<size_t>(row) * a.cap + pos;
            cand_s[at] = s;
            cand_i[at] = key;
            list_nearly_full |= pos >= a.cap - kMinCapacitySlack;
          }
        }
      }
    };
    // With MMA(it, 0) in flight on acc0: issue MMA(it, 1), half 0's head sums, wait; acc1 = half 1.
    auto finish_tile = [&](float (&acc0)[kHalfAcc], int it) {
      float acc1n[kHalfAcc];
      issue_score_half<D>(acc1n, sm.k[it % S], sm.q, 1);
      hw::wgmma_wait<1>();
      hw::fence_regs(acc0);
#if defined(FLASHDSA_INDEXER_ABLATE) && FLASHDSA_INDEXER_ABLATE == 1
      ablate_sink += __float_as_uint(acc0[0]) ^ __float_as_uint(acc0[kHalfAcc - 1]);
#else
      partial_head_sums<H, D, kRelu, 0>(acc0, sm.w, quad, part);
#endif
      hw::fence_regs(part);  // half 0's sums are done here, while MMA(it, 1) runs
      hw::wgmma_wait<0>();
      hw::fence_regs(acc1n);
#pragma unroll
      for (int i = 0; i < kHalfAcc; ++i) acc1[i] = acc1n[i];
    };

    if (ntiles > 0) {
      hw::cp_async_wait<S - 1>();  // Q and tile 0
      tile_barrier();
      float acc0[kHalfAcc];
      issue_score_half<D>(acc0, sm.k[0], sm.q, 0);
      finish_tile(acc0, 0);
      for (int it = 1; it < ntiles; ++it) {
        hw::cp_async_wait<S - 2>();
        const bool compact = tile_barrier();
        float acc0[kHalfAcc];
        issue_score_half<D>(acc0, sm.k[it % S], sm.q, 0);
        {
          const int next = it - 1 + S;
          if (next < ntiles) load_key_tile<D>(sm.k[next % S], a, (tile0 + next) * kTileKeys);
          hw::cp_async_commit();
        }
        append_tile(it - 1);
        if (compact) {      // uniform over the CTA
          __syncthreads();  // every append of tile it-1 is in the lists and counts
          compact_full_lists<NT>(a, cand_s, cand_i, sm.count, sm.thr, sm.sel);
        }
        finish_tile(acc0, it);
      }
      tile_barrier();  // tile ntiles-1's flags need no compaction: no appends follow before the final select
      append_tile(ntiles - 1);
    }
#if defined(FLASHDSA_INDEXER_ABLATE) && FLASHDSA_INDEXER_ABLATE != 0
    if (ablate_sink == 0x7f800001u) a.out_idx[0] = static_cast<int32_t>(ablate_sink);  // keeps the sink alive
#endif
    hw::cp_async_wait<0>();
    __syncthreads();

    // Final selection: each row's list (at most cap entries) -> its top K, padded with -1 / -inf.
    for (int r = 0; r < NT; ++r) {
      const int t = t0 + r;
      if (t >= a.T) break;
      const int n = sm.count[r];
      const float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
      const int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
      int32_t* out_i = a.out_idx + static_cast<int64_t>(t) * a.K;
      float* out_s = a.out_scores != nullptr ? a.out_scores + static_cast<int64_t>(t) * a.K : nullptr;
      const int kept = keep_top_k(list_s, list_i, n, a.K, out_s, out_i, sm.sel).count;
      for (int j = kept + tid; j < a.K; j += kThreads) {
        out_i[j] = -1;
        if (out_s != nullptr) out_s[j] = -INFINITY;
      }
    }
  }
}

}  // namespace flashdsa::sm90::indexer_topk_impl
