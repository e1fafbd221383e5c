// Internal: the bf16 kernel of the fused Hopper indexer + top-k (docs/spec.md §3) and its host launch
// (tensor map, dispatch); called by indexer_topk.cu. Design: docs/kernels/indexer_topk.md, "The bf16
// kernel". The building blocks it shares with the FP8 kernel (block shape, KernelArgs, query load,
// quad reduce-scatter, list compaction and final selection) are in kernel.cuh. The file and namespace
// keep the name v2 they had as the second design (the default since 2026-12-02; the first one is
// gone, docs "History").
//
// Persistent grid with a dynamic block scheduler; a block is kTokens = 256 / H_I query rows
// (kCols = 256 (token, head) columns); the CTA walks the 64-key tiles of the union of its rows' key
// ranges, scores each tile with wgmma (keys = M, columns = N), applies f, the weights and the head
// sum in registers, and appends the (score, key) pairs above each row's running threshold to a
// per-row candidate list in the workspace; a list that may overflow within two tiles is compacted to
// its exact top K (select.cuh), which raises the row's threshold. Specifically:
//   - 256 threads = two consumer warpgroups; warpgroup w owns the block's columns [128 w, 128 w + 128)
//     (tokens [w kTokens / 2, (w + 1) kTokens / 2)) with one m64n128 accumulator (8 wgmma per tile),
//   - __launch_bounds__(256, 2): 128 registers per thread, two CTAs per SM (4 warps per scheduler),
//   - key tiles by TMA (SW128 boxes of 64 keys x 64 columns) into an S-stage ring with one "full"
//     mbarrier per stage (transaction count) and one "done" counter per stage: the last of the 8 warps
//     to finish its MMA on a stage refills it (thread 0 issues the first S tiles of a block),
//   - one CTA barrier per tile, placed right after the MMA issue (it overlaps the MMA): it ORs the
//     "list nearly full" flags, so that compactions are decided uniformly,
//   - compactions over all 256 threads (select.cuh at NTH = 256: 16 + 16 registers per thread for a 4096-entry
//     list); the final selection of a block's rows one warp per row at D_I = 128 (warp_final_selects, the FP8 band
//     tail's routines of warp_select.cuh), row after row over all 256 threads otherwise (write_block_top_k),
//   - D_I = 128 inputs with 64 tiles <= T_kv <= 2^20 tiles run the kSampled instance: blocks of >= 64
//     tiles walk every 16th, 32nd or 64th tile first (the smallest stride whose phase A fits the list), cut
//     their long rows to about their share of the top K, then walk the rest above that threshold
//     (kernel.cuh, "sampled threshold"; a failed cut re-walks the block).
// The scores are bitwise those of the first kernel: the same wgmma instructions on the same
// operands, the same per-lane fmaf chain over a thread's columns (kernel.cuh partial_head_sums) and the
// same quad butterfly ((p0 + p2) + (p1 + p3)).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashdsa/status.h"
#include "sm90/common/cuda_check.cuh"
#include "sm90/common/hopper.cuh"
#include "sm90/common/indexer_score.cuh"
#include "sm90/indexer_topk/kernel.cuh"
#include "sm90/indexer_topk/launch.cuh"
#include "sm90/indexer_topk/select.cuh"
#include "sm90/indexer_topk/warp_select.cuh"

// Switches measured on 2026-12-05 (H100) and removed (docs/perf-notes.md, twenty-eighth session): the warp final
// selection is the D_I = 128 default, the MMA orderings lost; a build that still passes one fails here.
#if defined(FLASHDSA_ITK_WARP_FINAL) || defined(FLASHDSA_ITK_PINGPONG)
#error "FLASHDSA_ITK_WARP_FINAL and FLASHDSA_ITK_PINGPONG were removed on 2026-12-05 (docs/perf-notes.md)"
#endif

// Attribution builds of the check program only (docs/kernels/indexer_topk.md, "Attribution builds"):
// 1 = MMA only (the accumulators are folded into a sink), 2 = head sums and reduce-scatter with the
// pass test, but no appends. Never defined in the library build.
#if defined(FLASHDSA_INDEXER_ABLATE)
#define FLASHDSA_V2_ABLATE FLASHDSA_INDEXER_ABLATE
#else
#define FLASHDSA_V2_ABLATE 0
#endif

// Timing build of the check program only (-DFLASHDSA_INDEXER_TIMING): thread 0 of every CTA sums clock64()
// cycles of its whole run, of its compactions (from the barrier that starts one to its end: the CTA's stall)
// and of its final selects, and counts compaction events, blocks and re-walks; a one-thread kernel launched
// after it prints the per-CTA means and resets the sums (one line per launch). Never defined in the library
// build.
#if defined(FLASHDSA_INDEXER_TIMING)
namespace flashdsa::sm90::indexer_topk_impl::v2::timing {
enum Slot { kTotal, kCompact, kFinal, kEvents, kBlocks, kRewalks, kDone, kSlots };
static __device__ unsigned long long g_sum[kSlots];
// Thread 0 of each CTA at its exit (atomics only: a printf here, a function call, would serialise the kernel's
// wgmma, ptxas C7510).
__device__ __forceinline__ void report(long long total, long long compact, long long final_sel, unsigned events,
                                       unsigned blocks, unsigned rewalks) {
  atomicAdd(&g_sum[kTotal], static_cast<unsigned long long>(total));
  atomicAdd(&g_sum[kCompact], static_cast<unsigned long long>(compact));
  atomicAdd(&g_sum[kFinal], static_cast<unsigned long long>(final_sel));
  atomicAdd(&g_sum[kEvents], static_cast<unsigned long long>(events));
  atomicAdd(&g_sum[kBlocks], static_cast<unsigned long long>(blocks));
  atomicAdd(&g_sum[kRewalks], static_cast<unsigned long long>(rewalks));
  atomicAdd(&g_sum[kDone], 1ull);
}
// Launched after the kernel on its stream (run() below): prints the per-CTA means and resets the sums.
__global__ void print_and_reset() {
  const double g = static_cast<double>(g_sum[kDone]), tot = static_cast<double>(g_sum[kTotal]);
  const double cmp = static_cast<double>(g_sum[kCompact]), fin = static_cast<double>(g_sum[kFinal]);
  printf("indexer timing: grid %.0f, per CTA: total %.3f Mcycles, compactions %.3f (%.1f%%) in %.1f events, "
         "final selects %.3f (%.1f%%) over %.1f blocks, re-walks %.2f\n",
         g, tot / g * 1e-6, cmp / g * 1e-6, 100.0 * cmp / tot, static_cast<double>(g_sum[kEvents]) / g,
         fin / g * 1e-6, 100.0 * fin / tot, static_cast<double>(g_sum[kBlocks]) / g,
         static_cast<double>(g_sum[kRewalks]) / g);
  for (int i = 0; i < kSlots; ++i) g_sum[i] = 0ull;
}
}  // namespace flashdsa::sm90::indexer_topk_impl::v2::timing
#endif

namespace flashdsa::sm90::indexer_topk_impl::v2 {

constexpr int kThreads = 256;   // two consumer warpgroups
constexpr int kCtasPerSm = 2;   // 2 x 256 threads x 128 registers = the register file
constexpr int kWgCols = kHalfCols;  // (token, head) columns per warpgroup: one m64n128 accumulator

template <int H, int D>
struct Config {
  static_assert(H == 32 || H == 64, "H_I must be 32 or 64");
  static_assert(D == 64 || D == 128, "D_I must be 64 or 128");
  static constexpr int kTokens = kCols / H;           // query rows per block: 8 (H_I 32) or 4 (H_I 64)
  static constexpr int kTokensPerWg = kTokens / 2;    // 4 or 2
  static constexpr int kChunksPerToken = H / 8;       // 8-column accumulator chunks per query row
  static constexpr int kValsPerLane = kTokensPerWg / 2;  // scores a lane owns after the reduce-scatter
  static constexpr int kStages = D == 128 ? 2 : 4;    // key-tile ring depth (two CTAs per SM must fit)
  static constexpr uint32_t kTileBytes = kTileKeys * D * 2;
};

template <int H, int D>
struct alignas(1024) Smem {
  using Cfg = Config<H, D>;
  __nv_bfloat16 q[kCols * D];                    // SW128 [256, D]: row = token * H + head
  __nv_bfloat16 k[Cfg::kStages][kTileKeys * D];  // SW128 [64, D] key tiles (TMA, D / 64 boxes each)
  float w[kCols];                                // weights of the block's columns (0 past T)
  uint64_t full[Cfg::kStages];                   // stage s holds its tile (TMA transaction count)
  uint32_t done[Cfg::kStages];  // warps done reading stage s, over all its uses (8 per use; the 8th refills)
  Scratch<kThreads> sel;
  int count[Cfg::kTokens];     // candidates held per row
  uint32_t thr[Cfg::kTokens];  // admission threshold (score key) per row: append iff key > thr
  int k_start[Cfg::kTokens];   // key range per row ([0, 0) for rows past T)
  int k_end[Cfg::kTokens];
  int block;  // block handed out by the scheduler
  // (after the members of the kernel without the sampled walk, which keep their offsets)
  int cut[Cfg::kTokens];  // sampled walk: the row's cut size after phase A (0: none)
  int redo_blk;  // a block to walk again without the sampled threshold (-1: none; thread 0 only)
  // sampled instance: the first key of the tile at ring position p, at [p % (2 S)], written by the thread that
  // issues its TMA before the arrive (release) and read after the full wait (acquire). Position p is
  // rewritten only for p + 2 S, whose issue needs every warp done with p + S, i.e. past p's epilogue.
  int tile_key[2 * Cfg::kStages];
};

template <int H, int D>
constexpr size_t smem_bytes() {
  return sizeof(Smem<H, D>) + 1024;  // + slack to align the dynamic base to 1024 bytes
}

static_assert(kThreads == 2 * hw::kWarpgroup, "two consumer warpgroups");
static_assert(kCols == kThreads, "one weight per thread when a block starts");
static_assert(kCtasPerSm * (smem_bytes<32, 128>() + 1024) <= 228 * 1024 &&
                  kCtasPerSm * (smem_bytes<64, 128>() + 1024) <= 228 * 1024 &&
                  kCtasPerSm * (smem_bytes<32, 64>() + 1024) <= 228 * 1024 &&
                  kCtasPerSm * (smem_bytes<64, 64>() + 1024) <= 228 * 1024,
              "kCtasPerSm CTAs (with the 1 KB each reserves) must fit the SM's 228 KB of shared memory");

struct KernelArgsV2 {
  KernelArgs base;
  CUtensorMap tmap_k;  // k_idx as [T_kv, D] bf16, box 64 keys x 64 columns, 128-byte swizzle
};

// wgmma descriptors (hopper.cuh make_desc_sw128) split into 32-bit halves: the high half is the same
// for every K-major SW128 operand (stride byte offset 1024, 128-byte swizzle), the low half is the
// start address >> 4 plus the leading byte offset (16 >> 4 = 1 at bit 16). A k-step only moves the
// address field (shared addresses < 228 KB: the 14-bit field never carries), so each wgmma needs one
// 32-bit add per operand; with warp-uniform inputs these stay in uniform registers.
constexpr uint32_t kDescHi = (static_cast<uint32_t>(hw::kSw128AtomBytes) >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr) { return ((smem_addr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) { return (static_cast<uint64_t>(kDescHi) << 32) | lo; }

// Issues (does not wait for) acc = K_tile [64, D] x Q_wg^T [D, 128] (fp32): the warpgroup's 128
// columns. ka / qb: desc_lo of the key tile and of the warpgroup's first Q row (both K-major SW128;
// the Q tile has kCols rows per 64-column block).
template <int D>
__device__ __forceinline__ void issue_wg_mma(float (&acc)[kHalfAcc], uint32_t ka, uint32_t qb) {
  auto step = [](int rows, int ks) -> uint32_t {
    return static_cast<uint32_t>(((ks >> 2) * rows * hw::kSw128RowBytes + (ks & 3) * 32) >> 4);
  };
  hw::wgmma_fence();
  hw::wgmma_ss_m64n128k16_overwrite<0, 0>(acc, desc_of(ka), desc_of(qb));
#pragma unroll
  for (int ks = 1; ks < D / 16; ++ks)
    hw::wgmma_ss_m64n128k16<0, 0>(acc, desc_of(ka + step(kTileKeys, ks)), desc_of(qb + step(kCols, ks)), true);
  hw::wgmma_commit();
}

// Final selection of the block of rows t0 .. t0 + NT - 1 at D_I = 128 (measured 2026-12-05, H100: 7% faster than
// row after row over all 256 threads at 8K, H_I = 32; docs/perf-notes.md, twenty-eighth session): warp r selects row r's list (at
// most cap entries) into the row's outputs (its top K, then -1 / -inf), all rows at once, each warp on a 2048-bin
// histogram of its own in the Q block (8 x 8 KB = the 64 KB Q block at D_I = 128; free after the walk: its last
// wgmma was waited, and the next block's Q load follows claim_block's barrier). Inlined: as a __noinline__ call (the
// FP8 band tail's cure for its spills) the walk lost its uniform-register descriptors (R2UR 21 -> 199 per instance);
// inlined, every instance keeps 0 spills and the walk's tile loop keeps its length (885 instructions, register
// allocation changed). The warp and lane come through volatile asm (warp_select.cuh). All threads; the caller's next
// barrier follows.
template <int NT>
__device__ __forceinline__ void warp_final_selects(const KernelArgs& a, int t0, const float* cand_s, const int* cand_i,
                                                const int* count, uint32_t* q_area) {
  const int warp = warp_in_cta();
  uint32_t* const hist = q_area + warp * kWarpHistBins;
  for (int r = warp; r < NT && t0 + r < a.T; r += kThreads / 32) {
    const float* list_s = cand_s + static_cast<size_t>(r) * a.cap;
    const int* list_i = cand_i + static_cast<size_t>(r) * a.cap;
    const int64_t row = static_cast<int64_t>(t0 + r) * a.K;
    warp_write_top_k(list_s, list_i, count[r], a.K, a.out_idx + row,
                     a.out_scores != nullptr ? a.out_scores + row : nullptr, hist);
  }
}

// kSampled: the instance for inputs with T_kv >= kSampleMinTiles (64) tiles at D_I = 128 (the host picks it),
// whose long blocks take the sampled threshold; the other instance has none of its code in the tile loop.
template <int H, int D, bool kRelu, bool kSampled>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    indexer_topk_v2_kernel(const __grid_constant__ KernelArgsV2 args) {
  using Cfg = Config<H, D>;
  constexpr int NT = Cfg::kTokens, NTW = Cfg::kTokensPerWg, S = Cfg::kStages, V = Cfg::kValsPerLane;
  const KernelArgs& a = args.base;
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Smem<H, D>*>(hw::align_smem(smem_raw));

  const int tid = threadIdx.x, lane = tid & 31, quad = lane & 3;
  // Warpgroup: columns [128 wg, 128 wg + 128). Read through a shuffle so that the compiler knows it is
  // warp-uniform and keeps the wgmma descriptors in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int acc_row = 16 * ((tid >> 5) & 3) + (lane >> 2);  // tile key of accumulators 4j, 4j+1 (+8: 4j+2, 4j+3)
  const size_t list_base = static_cast<size_t>(blockIdx.x) * NT * a.cap;
  float* const cand_s = a.cand_scores + list_base;
  int* const cand_i = a.cand_idx + list_base;
  // After the reduce-scatter lane q holds V scores: H_I = 32 (V = 2): row wg * 4 + q, keys acc_row
  // and acc_row + 8; H_I = 64 (V = 1): row wg * 2 + q / 2, key acc_row + 8 (q % 2).
  const int my_row = wg * NTW + (V == 2 ? quad : quad >> 1);
  const int my_key_off = V == 2 ? 0 : 8 * (quad & 1);
  // This lane's row's candidate list (appends index it directly: no 64-bit row arithmetic per append).
  float* const my_list_s = cand_s + static_cast<size_t>(my_row) * a.cap;
  int* const my_list_i = cand_i + static_cast<size_t>(my_row) * a.cap;

  if (tid == 0) {
    init_tile_ring<S>(sm.full, sm.done, &args.tmap_k, a.T_kv);
    if (kSampled) sm.redo_blk = -1;
  }
  const uint32_t k_desc0 = desc_lo(hw::smem_u32(sm.k[0]));
  const uint32_t q_desc = desc_lo(hw::smem_u32(sm.q)) + static_cast<uint32_t>(wg * kWgCols * hw::kSw128RowBytes >> 4);
  uint32_t ring = 0;  // tiles this CTA has consumed: tile `it` of a block sits in ring slot (ring + it) % S
#if defined(FLASHDSA_INDEXER_TIMING)
  const long long t_kernel = clock64();
  long long c_compact = 0, c_final = 0;
  unsigned n_events = 0, n_blocks = 0, n_rewalks = 0;
#endif

#if FLASHDSA_V2_ABLATE != 0
  uint32_t ablate_sink = 0u;
  (void)my_list_s;
  (void)my_list_i;
#endif

  for (;;) {
    // (its first barrier also publishes the mbarrier init)
    // A block whose sampled walk failed (below) is walked again, plainly, by the same CTA.
    bool rewalk = false;
    const int blk = kSampled ? claim_block_or_rewalk(a, tid, &sm.block, &sm.redo_blk, rewalk)
                             : claim_block(a, tid, &sm.block);
    if (blk >= a.num_blocks) break;
    const int t0 = (a.num_blocks - 1 - blk) * NT;  // latest rows first: they see the most keys

    init_block_rows<NT>(a, t0, sm.k_start, sm.k_end, sm.count, sm.thr);
    {
      const int t = t0 + tid / H;  // one column per thread (kCols == kThreads)
      sm.w[tid] = t < a.T ? a.w[static_cast<int64_t>(t) * a.w_st + tid % H] : 0.f;
    }
    __syncthreads();

    const TileRange tiles = block_tile_range<NT>(sm.k_start, sm.k_end);
    const int tile0 = tiles.tile0, ntiles = tiles.ntiles;
    // The sampled walk of a long block (D_I = 128 only: the first version of it spilled at 64, with its
    // 4-stage ring; the host never picks kSampled there); a failed cut re-walks the block plainly.
    // (The attribution builds append nothing: a cut would always fail, so they walk plainly.)
    const bool sampled = kSampled && FLASHDSA_V2_ABLATE == 0 && D == 128 && !rewalk && ntiles >= kSampleMinTiles;
    const int lg = sample_stride_log2(ntiles, a.cap);  // phase A: every 2^lg-th tile (sampled_walk.h)
    const int walk = sampled ? sample_walk_code(ntiles, lg) : 0;  // walk_tile's order: 0 = plain
    const int walk_na = walk_phase_a_tiles(walk);
    if (kSampled) set_row_cuts<NT>(sampled, tile0, lg, a.K, sm.k_start, sm.k_end, sm.cut);

    // Thread 0 loads step i's tile of the block into ring slot (ring + i) % S.
    auto issue_key_tile = [&](int i) {
      const uint32_t pos = ring + static_cast<uint32_t>(i), slot = pos % S;
      const int key_base = (tile0 + walk_tile(i, walk)) * kTileKeys;
      if (kSampled) sm.tile_key[pos % (2 * S)] = key_base;
      hw::mbar_arrive_expect_tx(&sm.full[slot], Cfg::kTileBytes);
#pragma unroll
      for (int b = 0; b < D / 64; ++b)
        hw::tma_load_2d(&sm.k[slot][b * kTileKeys * 64], &args.tmap_k, &sm.full[slot], 64 * b, key_base);
    };
    if (tid == 0) {
      for (int i = 0; i < S && i < ntiles; ++i) issue_key_tile(i);
    }
    if (ntiles > 0) {
      load_query_block<H, D, kThreads>(sm.q, a, t0);  // kernel.cuh, over all 256 threads
      hw::cp_async_commit();
      hw::cp_async_wait<0>();
      hw::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    }
    __syncthreads();

    bool list_nearly_full = false;
    for (int it = 0; it < ntiles; ++it) {
      const uint32_t slot = wait_tile_stage<S>(sm.full, ring, it);
      float acc[kHalfAcc];
      {
        // Both operands' descriptors through a shuffle per tile: warp-uniform for the compiler, so they
        // stay in uniform registers (the Q descriptor kept in a vector register cost an R2UR and a VIADD
        // per wgmma).
        const uint32_t uslot = __shfl_sync(0xffffffffu, slot, 0);
        const uint32_t uq = __shfl_sync(0xffffffffu, q_desc, 0);
        issue_wg_mma<D>(acc, k_desc0 + uslot * (Cfg::kTileBytes >> 4), uq);
      }
      // While the MMA runs: OR the flags of the previous tile's appends.
      // it == walk_na - 1: the last tile of phase A; after its appends the long rows are cut to their r best
      // instead of the usual compaction (kernel.cuh "sampled threshold").
      const bool cut_now = walk_na != 0 && it == walk_na - 1;
      const bool compact = __syncthreads_or(list_nearly_full || cut_now) != 0;
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      list_nearly_full = false;
      // This warp is done reading the stage. The last of the 8 warps to get here refills it with tile
      // it + S at once (the "empty" side of the ring, without a barrier: it does not wait for the
      // epilogues). The counter only grows (8 per use of the stage), so nothing but atomics touch it.
      if (lane == 0) {
        if (atomicAdd(&sm.done[slot], 1u) % (kThreads / 32) == kThreads / 32 - 1 && it + S < ntiles)
          issue_key_tile(it + S);
      }

#if FLASHDSA_V2_ABLATE == 1
      ablate_sink += __float_as_uint(acc[0]) ^ __float_as_uint(acc[kHalfAcc - 1]);
#else
      // f, the weights and this thread's share of the head sums of the warpgroup's NTW tokens
      // (kernel.cuh partial_head_sums, the same fmaf chain), then the quad reduce-scatter.
      float part[2 * NTW];
      const float* w_s = sm.w + kWgCols * wg;
#pragma unroll
      for (int tl = 0; tl < NTW; ++tl) {
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < Cfg::kChunksPerToken; ++jj) {
          const int j = tl * Cfg::kChunksPerToken + jj;
          const float2 w = *reinterpret_cast<const float2*>(w_s + 8 * j + 2 * quad);
          p0 = fmaf(w.x, hw::indexer_activation<kRelu>(acc[4 * j + 0]), p0);
          p0 = fmaf(w.y, hw::indexer_activation<kRelu>(acc[4 * j + 1]), p0);
          p1 = fmaf(w.x, hw::indexer_activation<kRelu>(acc[4 * j + 2]), p1);
          p1 = fmaf(w.y, hw::indexer_activation<kRelu>(acc[4 * j + 3]), p1);
        }
        part[2 * tl] = p0;
        part[2 * tl + 1] = p1;
      }
      float sums[V];
      quad_reduce_scatter<NTW>(part, sums, quad);

      const uint32_t row_thr = sm.thr[my_row];
      const int row_start = sm.k_start[my_row], row_end = sm.k_end[my_row];
      // (the sampled instance reads the tile's first key from the ring table: no walk arithmetic per tile)
      const int key0 = (kSampled ? sm.tile_key[(ring + static_cast<uint32_t>(it)) % (2 * S)] : (tile0 + it) * kTileKeys) +
                       acc_row + my_key_off;
      bool pass[V];
#pragma unroll
      for (int v = 0; v < V; ++v)
        pass[v] = key0 + 8 * v >= row_start && key0 + 8 * v < row_end && score_key(sums[v]) > row_thr;
#if FLASHDSA_V2_ABLATE == 2
#pragma unroll
      for (int v = 0; v < V; ++v) ablate_sink += pass[v] ? static_cast<uint32_t>(key0 + 8 * v) : 0u;
#else
      // The lanes with the same quad position append to the same row: one shared atomic per group (for both of
      // a lane's keys at H_I = 32).
      if constexpr (V == 2)
        append_quad_group2(pass[0], sums[0], key0, pass[1], sums[V - 1], key0 + 8, quad, &sm.count[my_row], my_list_s,
                           my_list_i, a.cap, list_nearly_full);
      else
        append_quad_group(pass[0], sums[0], key0, quad, &sm.count[my_row], my_list_s, my_list_i, a.cap,
                          list_nearly_full);
#endif
#endif
      // A row flagged by tile it-1's appends is compacted after tile it's (at most 2 x 64 appends
      // past the flag: kMinCapacitySlack).
      if (compact) {      // uniform over the CTA
#if defined(FLASHDSA_INDEXER_TIMING)
        const long long tc = clock64();
#endif
        __syncthreads();  // every append of tile it is in the lists and counts
        compact_full_lists<NT>(a, cand_s, cand_i, sm.count, sm.thr, sm.sel, it < walk_na ? sm.cut : nullptr, cut_now);
#if defined(FLASHDSA_INDEXER_TIMING)
        c_compact += clock64() - tc;
        ++n_events;
#endif
      }
    }
    ring += static_cast<uint32_t>(ntiles);
    __syncthreads();
    if (walk_na != 0) {
      // A cut row that ends with fewer than its keep count (K; the FP8 pass: C) of entries, though it has
      // that many visible keys, had its threshold above its keep-th best score: the block is walked again.
      // (Written out in both walks: as a helper it moved the FP8 walk's register allocation.)
      const bool failed = tid < NT && sm.cut[tid] > 0 && sm.count[tid] < min(a.K, sm.k_end[tid] - sm.k_start[tid]);
      if (__syncthreads_or(failed)) {
        if (tid == 0) sm.redo_blk = blk;
#if defined(FLASHDSA_INDEXER_TIMING)
        ++n_rewalks;
#endif
        continue;
      }
    }

    // Final selection: each row's list (at most cap entries) -> its top K, padded with -1 / -inf.
#if defined(FLASHDSA_INDEXER_TIMING)
    const long long tf = clock64();
#endif
    if constexpr (D == 128) {
      static_assert((kThreads / 32) * kWarpHistBins * 4 <= sizeof(sm.q), "the warps' histograms fit the Q block");
      warp_final_selects<NT>(a, t0, cand_s, cand_i, sm.count, reinterpret_cast<uint32_t*>(sm.q));
    } else {
      write_block_top_k<NT>(a, t0, cand_s, cand_i, sm.count, sm.sel);
    }
#if defined(FLASHDSA_INDEXER_TIMING)
    c_final += clock64() - tf;
    ++n_blocks;
#endif
  }
#if defined(FLASHDSA_INDEXER_TIMING)
  if (tid == 0) timing::report(clock64() - t_kernel, c_compact, c_final, n_events, n_blocks, n_rewalks);
#endif
#if FLASHDSA_V2_ABLATE != 0
  if (ablate_sink == 0x7f800001u) a.out_idx[0] = static_cast<int32_t>(ablate_sink);  // keeps the sink alive
#endif
}

// ---- host side -----------------------------------------------------------------------------------

// The tensor map of k_idx ([T_kv, D] bf16, row stride k_st elements): boxes of 64 keys x 64 columns
// (128 bytes: the 128-byte swizzle's row), zero fill past T_kv. The driver entry point is looked up
// through the runtime, so nothing links libcuda directly.
inline Status make_key_tensor_map(const KernelArgs& a, int D, CUtensorMap* map) {
  return make_key_rows_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.k, static_cast<uint64_t>(D), a.T_kv,
                                  static_cast<uint64_t>(a.k_st) * sizeof(__nv_bfloat16), 64, "sm90 indexer_topk");
}

template <int H, int D, bool kRelu>
Status launch(const KernelArgsV2& args, int grid, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(smem_bytes<H, D>());
  // Only D_I = 128 inputs with enough keys for a long block take the instance with the sampled threshold.
  if constexpr (D == 128) {
    if (sampled_walk_allowed(args.base.T_kv))
      return launch_with_smem(indexer_topk_v2_kernel<H, D, kRelu, true>, dim3(grid), kThreads, kSmem, stream,
                              "indexer_topk_v2_kernel", args);
  }
  return launch_with_smem(indexer_topk_v2_kernel<H, D, kRelu, false>, dim3(grid), kThreads, kSmem, stream,
                          "indexer_topk_v2_kernel", args);
}

// Runs the kernel with the host's KernelArgs (workspace layout and grid: launch.cuh).
inline Status run(const KernelArgs& base, int H, int D, bool relu, int grid, cudaStream_t stream) {
  KernelArgsV2 args{};
  args.base = base;
  const Status st = make_key_tensor_map(base, D, &args.tmap_k);
  if (!st.ok()) return st;
  const Status launched = dispatch_variant(H, D, relu, [&](auto v) {
    using V = decltype(v);
    return launch<V::H, V::D, V::kRelu>(args, grid, stream);
  });
#if defined(FLASHDSA_INDEXER_TIMING)
  if (launched.ok()) timing::print_and_reset<<<1, 1, 0, stream>>>();
#endif
  return launched;
}

}  // namespace flashdsa::sm90::indexer_topk_impl::v2
