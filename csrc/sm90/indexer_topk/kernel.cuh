// Internal: the device building blocks shared by the kernels of the fused Hopper indexer + top-k
// (docs/spec.md §3): the bf16 kernel (kernel_v2.cuh) and the FP8 selection walks (fp8_kernel_v2.cuh
// at D_I = 128, fp8_kernel.cuh at D_I = 64).
// Design: docs/kernels/indexer_topk.md; host side: launch.cuh, indexer_topk.cu, indexer_topk_fp8.cu.
//
// The kernels walk a block of kCols = 256 (query token, head) columns, i.e. kTokens = 256 / H_I query
// rows, over the 64-key tiles of the union of the rows' key ranges, score each tile with wgmma (keys =
// M, columns = N), apply f, the weights and the head sum in registers (partial_head_sums and the quad
// reduce-scatter here), and append the (score, key) pairs above each row's running threshold to a
// per-row candidate list in the workspace. A list that may overflow within two tiles is compacted to
// its exact top K (FP8: top C; radix select, select.cuh), which raises the row's threshold; at the end
// of the walk each row's list is reduced to the top K and written (write_row_top_k).
//
// The constants and Config below are the one-warpgroup geometry of the first FP8 walk (128 threads,
// two CTAs per SM); the two v2 walks (bf16 kernel_v2.cuh, FP8 fp8_kernel_v2.cuh: two warpgroups) have
// their own and share the block shape (kCols, kTileKeys, kHalfCols), the arguments and the list
// helpers, and the ring / append helpers at the end of this file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/common/indexer_score.cuh"
#include "sm90/indexer_topk/sampled_walk.h"
#include "sm90/indexer_topk/select.cuh"

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kThreads = kSelectThreads;  // one warpgroup per CTA (the FP8 kernel)
constexpr int kCtasPerSm = 2;             // the two CTAs of an SM overlap each other's epilogue and MMA
constexpr int kCols = 256;                // wgmma N: (query token, head) columns of a block
constexpr int kTileKeys = 64;             // wgmma M: keys per tile
// A list is compacted at most two tiles (2 x 64 appends) after it crossed cap - 128 (see the kernels' main
// loops), so the candidate capacity must leave that much room above K.
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
};

// The kernel code assumes these (ties to the common building blocks and the wgmma shapes).
static_assert(kThreads == hw::kWarpgroup, "one warpgroup per CTA: the wgmma and the selection use 128 threads");
static_assert(kTileKeys == 64 && kHalfCols == 128, "wgmma m64n128 per column half");
static_assert(kCols == 2 * kHalfCols && kHalfAcc * 2 == kHalfCols, "two m64n128 halves; N / 2 f32 accumulators");
static_assert(kTileKeys * hw::kSw128RowBytes % hw::kSw128AtomBytes == 0, "key tiles are whole swizzle atoms");

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

// The 16-byte chunks of a block's query rows (row = token * H + head, kCols rows of kRowChunks
// chunks), spread over NTH threads: calls copy(row, chunk, t, h, valid) for this thread's chunks, with
// token t = t0 + row / H, head h = row % H and valid = t < a.T (the copy zero-fills invalid rows).
// Shared by the bf16 (load_query_block) and FP8 (load_query_block_fp8) query loads; kUnroll is
// their measured unroll factor. (a.T is read in the loop, as the loads had it: passing T by value
// moved the bf16 kernel's SASS.)
template <int H, int kRowChunks, int NTH, int kUnroll, class Args, class Copy>
__device__ __forceinline__ void for_each_query_chunk(const Args& a, int t0, Copy&& copy) {
  constexpr int kPerThread = kCols * kRowChunks / NTH;
#pragma unroll(kUnroll)
  for (int i = 0; i < kPerThread; ++i) {
    const int c = threadIdx.x + NTH * i;
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const int t = t0 + row / H, h = row % H;
    const bool valid = t < a.T;
    copy(row, chunk, t, h, valid);
  }
}

// Issues the cp.async copies of the block's queries [t0, t0 + kTokens) x H heads into the SW128
// tile (row = token * H + head); rows of tokens >= T are zero-filled. All NTH threads (the bf16 kernel: 256).
template <int H, int D, int NTH>
__device__ __forceinline__ void load_query_block(__nv_bfloat16* qs, const KernelArgs& a, int t0) {
  for_each_query_chunk<H, D / 8, NTH, 8>(a, t0, [&](int row, int chunk, int t, int h, bool valid) {
    const __nv_bfloat16* src =
        a.q + (valid ? static_cast<int64_t>(t) * a.q_st + static_cast<int64_t>(h) * a.q_sh + chunk * 8 : 0);
    hw::cp_async_16(reinterpret_cast<char*>(qs) + hw::sw128_elem_offset(kCols, row, chunk * 8), src, valid);
  });
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

// Starts a block of query rows [t0, t0 + NT): each row's key range ([0, 0) past T), an empty list
// and a threshold below every score. The first NT threads; the caller's barrier publishes the values.
// Args: KernelArgs or Fp8KernelArgs (all three walks).
template <int NT, class Args>
__device__ __forceinline__ void init_block_rows(const Args& a, int t0, int* k_start, int* k_end, int* count,
                                                uint32_t* thr) {
  const int tid = threadIdx.x;
  if (tid < NT) {
    const int t = t0 + tid;
    const bool valid = t < a.T;
    k_start[tid] = valid ? a.k_start[t] : 0;
    k_end[tid] = valid ? a.k_end[t] : 0;
    count[tid] = 0;
    thr[tid] = 0u;  // every real score's key is > 0
  }
}

// The scheduler: the next block of the persistent CTA (one atomic on a.block_counter by thread 0,
// published by a barrier). Begins with a barrier (the previous block is done with the shared state).
// All threads; tid = threadIdx.x. Args: KernelArgs or Fp8KernelArgs.
template <class Args>
__device__ __forceinline__ int claim_block(const Args& a, int tid, int* block) {
  __syncthreads();
  if (tid == 0) *block = atomicAdd(a.block_counter, 1);
  __syncthreads();
  return *block;
}

// claim_block for the walks with a sampled threshold: the block in *redo (>= 0: a block whose sampled
// walk failed, walked again by the same CTA; rewalk = true) or else the next one from the scheduler. Thread 0
// alone reads and resets *redo (it sets it, -1 at the start); the barriers publish *block.
template <class Args>
__device__ __forceinline__ int claim_block_or_rewalk(const Args& a, int tid, int* block, int* redo, bool& rewalk) {
  __syncthreads();
  if (tid == 0) {
    const int r = *redo;
    *block = r >= 0 ? -2 - r : atomicAdd(a.block_counter, 1);  // a re-walk is encoded below -1
    *redo = -1;
  }
  __syncthreads();
  const int b = *block;
  rewalk = b < 0;
  return rewalk ? -2 - b : b;
}

// Key tiles [tile0, tile0 + ntiles) of kTileKeys keys covering the union of NT rows' key ranges.
struct TileRange {
  int tile0;
  int ntiles;
};
template <int NT>
__device__ __forceinline__ TileRange block_tile_range(const int* k_start, const int* k_end) {
  int lo = INT_MAX, hi = 0;
#pragma unroll
  for (int r = 0; r < NT; ++r) {
    if (k_end[r] > k_start[r]) {
      lo = min(lo, k_start[r]);
      hi = max(hi, k_end[r]);
    }
  }
  const int tile0 = hi > 0 ? lo / kTileKeys : 0;
  const int ntiles = hi > 0 ? (hi + kTileKeys - 1) / kTileKeys - tile0 : 0;
  return TileRange{tile0, ntiles};
}

// ---- sampled threshold (blocks of long rows; the D_I = 128 walks of kernel_v2.cuh and fp8_kernel_v2.cuh)
// A block of at least kSampleMinTiles key tiles is walked in two phases: phase A = every G-th tile (tiles
// tile0, tile0 + G, ...; G = 16, 32 or 64, the smallest whose phase A fits the list: sample_stride_log2),
// phase B = the others in ascending order. After phase A each long
// row's list is cut to its r best (r = the expected number of the row's top K in phase A, mu = K * nA / n,
// plus FLASHDSA_INDEXER_SAMPLE_SIGMAS * sqrt(mu) + 8), which sets the row's threshold to the r-th best phase-A score:
// about the K-th best score of the whole row, so phase B appends about K + a few sqrt(K G) keys instead of
// K (1 + ln(n / K)), with few or no compactions. Exactness does not depend on the estimate: every key above
// the threshold is still appended, so a row whose list ends with at least K entries (the FP8 pass: C) holds its exact top K (C);
// a row that ends with fewer (its threshold was above its K-th best: probability about 1e-6 per row with
// random scores) makes the CTA walk the block again in plain order without the cut.
// (the constants, the walk order and the cut size, host-testable: sampled_walk.h)
static_assert(kSampleTileKeys == kTileKeys, "sampled_walk.h counts keys in the kernels' tiles");

// Each row's cut size after phase A (0: no cut) for a block whose walk is `sampled` with stride 2^lg
// (keep: K; the FP8 pass: C). The first NT threads; the caller's barrier publishes them.
template <int NT>
__device__ __forceinline__ void set_row_cuts(bool sampled, int tile0, int lg, int keep, const int* k_start,
                                             const int* k_end, int* cut) {
  const int tid = threadIdx.x;
  if (tid < NT) {
    const int n = k_end[tid] - k_start[tid];
    cut[tid] = sampled && n > 0 ? sample_cut_size(n, phase_a_keys(k_start[tid], k_end[tid], tile0, lg), keep) : 0;
  }
}

// How many candidates a compaction keeps: K (the FP8 pass keeps its C, fp8_kernel.cuh).
__device__ __forceinline__ int compaction_keep(const KernelArgs& a) { return a.K; }

// Compacts every candidate list (NT rows of a.cap entries) that might overflow during the next tile
// to its top compaction_keep(a), raising the row's threshold. Shared by the bf16 and FP8 kernels;
// Args: KernelArgs or Fp8KernelArgs, read in place (passing its fields by value moved the FP8 and
// bf16 kernels' SASS). All NTH threads, right after a barrier (counts are stable until the next epilogue).
// With `cut` (the sampled walk's phase A, kernel.cuh "sampled threshold"), a row with cut[r] > 0 keeps its
// cut[r] best instead of compaction_keep(a) (phase A needs no more of it), and with `cut_all` (the end of
// phase A) every such row that holds more than cut[r] entries is cut, full or not. A row with cut[r] > 0
// that holds fewer keeps all, and its threshold: the re-walk test after the walk cannot fail for it, since
// every later key above that threshold is appended.
template <int NT, class Args, int NTH>
__device__ __forceinline__ void compact_full_lists(const Args& a, float* cand_s, int* cand_i, int* count,
                                                   uint32_t* thr, Scratch<NTH>& sc, const int* cut = nullptr,
                                                   bool cut_all = false) {
  for (int r = 0; r < NT; ++r) {
    const int n = count[r];
    const int c = cut != nullptr ? cut[r] : 0;
    if (n <= a.cap - kMinCapacitySlack && !(cut_all && c > 0 && n > c)) continue;
    float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
    int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
    // n > cap - 128 >= the count kept, or n > the cut
    const Kept kept = keep_top_k(list_s, list_i, n, c > 0 ? c : compaction_keep(a), list_s, list_i, sc);
    if (threadIdx.x == 0) {
      count[r] = kept.count;
      thr[r] = kept.thr;
    }
  }
  __syncthreads();
}

// Writes the top a.K of a row's list (scores, idx)[0, n) to out_i[0, K) (and out_s, which may be
// null), padded with -1 / -inf past the entries kept. Shared by the bf16 and FP8 kernels (Args:
// KernelArgs or Fp8KernelArgs). All NTH threads.
template <class Args, int NTH>
__device__ __forceinline__ void write_row_top_k(const Args& a, const float* list_s, const int* list_i, int n,
                                                int32_t* out_i, float* out_s, Scratch<NTH>& sc) {
  const int kept = keep_top_k(list_s, list_i, n, a.K, out_s, out_i, sc).count;
  for (int j = kept + static_cast<int>(threadIdx.x); j < a.K; j += NTH) {
    out_i[j] = -1;
    if (out_s != nullptr) out_s[j] = -INFINITY;
  }
}

// write_row_top_k into query row t's outputs (a.out_idx / a.out_scores, rows of K).
template <class Args, int NTH>
__device__ __forceinline__ void write_token_top_k(const Args& a, int t, const float* list_s, const int* list_i, int n,
                                                  Scratch<NTH>& sc) {
  int32_t* out_i = a.out_idx + static_cast<int64_t>(t) * a.K;
  float* out_s = a.out_scores != nullptr ? a.out_scores + static_cast<int64_t>(t) * a.K : nullptr;
  write_row_top_k(a, list_s, list_i, n, out_i, out_s, sc);
}

// Final selection of a block of the bf16 kernel: each row's list (at most cap entries) ->
// its top K in the outputs. All NTH threads, after a barrier that follows the last appends.
template <int NT, int NTH>
__device__ __forceinline__ void write_block_top_k(const KernelArgs& a, int t0, const float* cand_s, const int* cand_i,
                                                  const int* count, Scratch<NTH>& sc) {
  for (int r = 0; r < NT; ++r) {
    const int t = t0 + r;
    if (t >= a.T) break;
    const int n = count[r];
    const float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
    const int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
    write_token_top_k(a, t, list_s, list_i, n, sc);
  }
}

// ---- pieces of the two v2 walks (kernel_v2.cuh bf16, fp8_kernel_v2.cuh e4m3): two consumer
// warpgroups, one m64n128 accumulator each, a TMA key ring with "full" mbarriers and "done" counters.

// The S stages' full mbarriers (one arrival + the TMA transaction count), their done counters at 0, and
// the key tensor map prefetched (the map is zero when there are no keys). Thread 0; the caller's
// barrier publishes them.
template <int S>
__device__ __forceinline__ void init_tile_ring(uint64_t* full, uint32_t* done, const void* tmap, int T_kv) {
#pragma unroll
  for (int s = 0; s < S; ++s) {
    hw::mbar_init(&full[s], 1);
    done[s] = 0;
  }
  hw::mbar_fence_init();
  if (T_kv > 0) hw::prefetch_tensormap(tmap);
}

// Waits until tile `it` of the block (the ring's tile ring + it overall) is in its stage; returns the
// stage, (ring + it) % S. Every thread.
template <int S>
__device__ __forceinline__ uint32_t wait_tile_stage(uint64_t* full, uint32_t ring, int it) {
  const uint32_t g = ring + static_cast<uint32_t>(it);
  const uint32_t slot = g % S;
  hw::mbar_wait(&full[slot], (g / S) & 1u);
  return slot;
}

// Appends (s, key) of the lanes with `pass` to the row list (list_s, list_i) of capacity cap: the lanes
// of one quad position (the same row) get their slots with one shared atomic on *count (ballot, leader
// atomicAdd, shuffle); nearly_full |= a slot past cap - kMinCapacitySlack. All 32 lanes of the warp.
// (The lane is read here, not passed: as an argument it swapped the leader test's operands in the SASS.)
__device__ __forceinline__ void append_quad_group(bool pass, float s, int key, int quad, int* count,
                                                  float* list_s, int* list_i, int cap, bool& nearly_full) {
  const int lane = threadIdx.x & 31;
  const unsigned ballot = __ballot_sync(0xffffffffu, pass);
  if (ballot == 0u) return;
  const unsigned group = ballot & (0x11111111u << quad);
  const int leader = group != 0u ? __ffs(group) - 1 : lane;
  int base = 0;
  if (pass && lane == leader) base = atomicAdd(count, __popc(group));
  base = __shfl_sync(0xffffffffu, base, leader);
  if (pass) {
    const int pos = base + __popc(group & ((1u << lane) - 1u));
    list_s[pos] = s;
    list_i[pos] = key;
    nearly_full |= pos >= cap - kMinCapacitySlack;
  }
}

// Two candidates per lane for the same row (the bf16 walk at H_I = 32: keys k and k + 8): as append_quad_group,
// with one shared atomic per quad group for both (the first candidates of the group first, then the second).
__device__ __forceinline__ void append_quad_group2(bool pass0, float s0, int key0, bool pass1, float s1, int key1,
                                                   int quad, int* count, float* list_s, int* list_i, int cap,
                                                   bool& nearly_full) {
  const int lane = threadIdx.x & 31;
  const unsigned ballot0 = __ballot_sync(0xffffffffu, pass0), ballot1 = __ballot_sync(0xffffffffu, pass1);
  if ((ballot0 | ballot1) == 0u) return;
  const unsigned mask = 0x11111111u << quad;
  const unsigned group0 = ballot0 & mask, group1 = ballot1 & mask;
  const unsigned group = group0 | group1;
  const int leader = group != 0u ? __ffs(group) - 1 : lane;
  int base = 0;
  if ((pass0 || pass1) && lane == leader) base = atomicAdd(count, __popc(group0) + __popc(group1));
  base = __shfl_sync(0xffffffffu, base, leader);
  const unsigned below = (1u << lane) - 1u;
  if (pass0) {
    const int pos = base + __popc(group0 & below);
    list_s[pos] = s0;
    list_i[pos] = key0;
    nearly_full |= pos >= cap - kMinCapacitySlack;
  }
  if (pass1) {
    const int pos = base + __popc(group0) + __popc(group1 & below);
    list_s[pos] = s1;
    list_i[pos] = key1;
    nearly_full |= pos >= cap - kMinCapacitySlack;
  }
}

}  // namespace flashdsa::sm90::indexer_topk_impl
