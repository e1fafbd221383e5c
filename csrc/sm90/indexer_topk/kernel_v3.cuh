// Internal: a third bf16 walk of the fused Hopper indexer + top-k (docs/spec.md §3), D_I = 128 only:
// the v2 kernel (kernel_v2.cuh) with one CTA per SM, two accumulators per warpgroup and a deep key ring.
// Design: docs/kernels/indexer_topk.md, "v3". Selected at compile time (-DFLASHDSA_INDEXER_V3=1) for the
// A/B against v2; the v2 kernel stays the default until the measurement says otherwise.
//
// What changes against v2 (everything else — block shape, scheduler, the lists, compaction rule, sampled
// walk, final select, the exact fmaf chain and quad butterfly, hence the scores — is v2's):
//   - __launch_bounds__(256, 1): one CTA of two consumer warpgroups per SM, up to 255 registers a thread;
//   - two m64n128 accumulators per warpgroup: the MMA of tile it + 1 is issued before the epilogue of tile
//     it (wgmma.wait_group 1), so each warpgroup's f / weights / head sums / appends run under its own next
//     MMA instead of relying on a second CTA's MMA;
//   - an 8-stage key ring (128 KB): a stage is refilled as soon as its MMA completed, 7 tiles ahead.
#pragma once

#include "sm90/indexer_topk/kernel_v2.cuh"

namespace flashdsa::sm90::indexer_topk_impl::v3 {

using v2::KernelArgsV2;
constexpr int kThreads = 256;  // two consumer warpgroups
constexpr int kStages = 8;     // key-tile ring depth (16 KB a stage at D_I = 128)
constexpr int kD = 128;

template <int H>
struct alignas(1024) Smem {
  using Cfg = v2::Config<H, kD>;
  __nv_bfloat16 q[kCols * kD];            // SW128 [256, D]: row = token * H + head
  __nv_bfloat16 k[kStages][kTileKeys * kD];  // SW128 [64, D] key tiles (TMA, two boxes each)
  float w[kCols];                         // weights of the block's columns (0 past T)
  uint64_t full[kStages];                 // stage s holds its tile (TMA transaction count)
  uint32_t done[kStages];                 // warps done reading stage s, over all its uses (8 per use)
  Scratch<kThreads> sel;
  int count[Cfg::kTokens];
  uint32_t thr[Cfg::kTokens];
  int k_start[Cfg::kTokens];
  int k_end[Cfg::kTokens];
  int block;
  int cut[Cfg::kTokens];
  int redo_blk;
  int tile_key[2 * kStages];  // sampled instance: first key of the tile at ring position p, at [p % (2 S)]
};

template <int H>
constexpr size_t smem_bytes() {
  return sizeof(Smem<H>) + 1024;
}
static_assert(smem_bytes<32>() + 1024 <= 228 * 1024 && smem_bytes<64>() + 1024 <= 228 * 1024,
              "one CTA per SM must fit the SM's 228 KB of shared memory");

template <int H, bool kRelu, bool kSampled>
__global__ void __launch_bounds__(kThreads, 1) indexer_topk_v3_kernel(const __grid_constant__ KernelArgsV2 args) {
  using Cfg = v2::Config<H, kD>;
  constexpr int NT = Cfg::kTokens, NTW = Cfg::kTokensPerWg, S = kStages, V = Cfg::kValsPerLane;
  constexpr uint32_t kTileBytes = Cfg::kTileBytes;
  const KernelArgs& a = args.base;
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Smem<H>*>(hw::align_smem(smem_raw));

  const int tid = threadIdx.x, lane = tid & 31, quad = lane & 3;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int acc_row = 16 * ((tid >> 5) & 3) + (lane >> 2);
  const size_t list_base = static_cast<size_t>(blockIdx.x) * NT * a.cap;
  float* const cand_s = a.cand_scores + list_base;
  int* const cand_i = a.cand_idx + list_base;
  const int my_row = wg * NTW + (V == 2 ? quad : quad >> 1);
  const int my_key_off = V == 2 ? 0 : 8 * (quad & 1);
  float* const my_list_s = cand_s + static_cast<size_t>(my_row) * a.cap;
  int* const my_list_i = cand_i + static_cast<size_t>(my_row) * a.cap;

  if (tid == 0) {
    init_tile_ring<S>(sm.full, sm.done, &args.tmap_k, a.T_kv);
    if (kSampled) sm.redo_blk = -1;
  }
  const uint32_t k_desc0 = v2::desc_lo(hw::smem_u32(sm.k[0]));
  const uint32_t q_desc =
      v2::desc_lo(hw::smem_u32(sm.q)) + static_cast<uint32_t>(wg * v2::kWgCols * hw::kSw128RowBytes >> 4);
  uint32_t ring = 0;

  for (;;) {
    bool rewalk = false;
    const int blk = kSampled ? claim_block_or_rewalk(a, tid, &sm.block, &sm.redo_blk, rewalk)
                             : claim_block(a, tid, &sm.block);
    if (blk >= a.num_blocks) break;
    const int t0 = (a.num_blocks - 1 - blk) * NT;

    init_block_rows<NT>(a, t0, sm.k_start, sm.k_end, sm.count, sm.thr);
    {
      const int t = t0 + tid / H;
      sm.w[tid] = t < a.T ? a.w[static_cast<int64_t>(t) * a.w_st + tid % H] : 0.f;
    }
    __syncthreads();

    const TileRange tiles = block_tile_range<NT>(sm.k_start, sm.k_end);
    const int tile0 = tiles.tile0, ntiles = tiles.ntiles;
    const bool sampled = kSampled && !rewalk && ntiles >= kSampleMinTiles;
    const int lg = sample_stride_log2(ntiles, a.cap);
    const int walk = sampled ? sample_walk_code(ntiles, lg) : 0;
    const int walk_na = walk_phase_a_tiles(walk);
    if (kSampled) set_row_cuts<NT>(sampled, tile0, lg, a.K, sm.k_start, sm.k_end, sm.cut);

    auto issue_key_tile = [&](int i) {
      const uint32_t pos = ring + static_cast<uint32_t>(i), slot = pos % S;
      const int key_base = (tile0 + walk_tile(i, walk)) * kTileKeys;
      if (kSampled) sm.tile_key[pos % (2 * S)] = key_base;
      hw::mbar_arrive_expect_tx(&sm.full[slot], kTileBytes);
#pragma unroll
      for (int b = 0; b < kD / 64; ++b)
        hw::tma_load_2d(&sm.k[slot][b * kTileKeys * 64], &args.tmap_k, &sm.full[slot], 64 * b, key_base);
    };
    if (tid == 0) {
      for (int i = 0; i < S && i < ntiles; ++i) issue_key_tile(i);
    }
    if (ntiles > 0) {
      load_query_block<H, kD, kThreads>(sm.q, a, t0);
      hw::cp_async_commit();
      hw::cp_async_wait<0>();
      hw::fence_proxy_async();
    }
    __syncthreads();

    // Issues tile i's MMA into acc (after waiting for its stage).
    auto issue_tile = [&](float (&acc)[kHalfAcc], int i) {
      const uint32_t slot = wait_tile_stage<S>(sm.full, ring, i);
      const uint32_t uslot = __shfl_sync(0xffffffffu, slot, 0);
      const uint32_t uq = __shfl_sync(0xffffffffu, q_desc, 0);
      v2::issue_wg_mma<kD>(acc, k_desc0 + uslot * (kTileBytes >> 4), uq);
    };
    // This warp is done reading tile i's stage; the last of the 8 warps refills it with tile i + S.
    auto release_tile = [&](int i) {
      if (lane == 0) {
        const uint32_t slot = (ring + static_cast<uint32_t>(i)) % S;
        if (atomicAdd(&sm.done[slot], 1u) % (kThreads / 32) == kThreads / 32 - 1 && i + S < ntiles)
          issue_key_tile(i + S);
      }
    };
    bool list_nearly_full = false;
#if defined(FLASHDSA_INDEXER_V3_WREG)
    // A/B: this thread's 32 weights in registers for the block (no LDS per tile).
    float2 wreg[NTW * Cfg::kChunksPerToken];
#pragma unroll
    for (int j = 0; j < NTW * Cfg::kChunksPerToken; ++j)
      wreg[j] = *reinterpret_cast<const float2*>(sm.w + v2::kWgCols * wg + 8 * j + 2 * quad);
#endif
    // f, weights, head sums, reduce-scatter, pass test and appends of tile it (v2's epilogue, same order).
    auto epilogue = [&](const float (&acc)[kHalfAcc], int it) {
      float part[2 * NTW];
      const float* w_s = sm.w + v2::kWgCols * wg;
#pragma unroll
      for (int tl = 0; tl < NTW; ++tl) {
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < Cfg::kChunksPerToken; ++jj) {
          const int j = tl * Cfg::kChunksPerToken + jj;
#if defined(FLASHDSA_INDEXER_V3_WREG)
          const float2 w = wreg[j];
#else
          const float2 w = *reinterpret_cast<const float2*>(w_s + 8 * j + 2 * quad);
#endif
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
      const int key0 = (kSampled ? sm.tile_key[(ring + static_cast<uint32_t>(it)) % (2 * S)] : (tile0 + it) * kTileKeys) +
                       acc_row + my_key_off;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int key = key0 + 8 * v;
        const float s = sums[v];
        const bool pass = key >= row_start && key < row_end && score_key(s) > row_thr;
        append_quad_group(pass, s, key, quad, &sm.count[my_row], my_list_s, my_list_i, a.cap, list_nearly_full);
      }
    };
    // Tile it, its MMA complete in cur: release its stage, issue tile it + 1's MMA into nxt (if any), run tile
    // it's epilogue under it, wait for it; then the compaction (a row flagged by tile it-1's appends is compacted
    // after tile it's, as v2). No wgmma is in flight across a branch that skips a wait or across the loop's back
    // edge (ptxas serialises every wgmma of the kernel otherwise: C7518).
    auto tile_step = [&](const float (&cur)[kHalfAcc], float (&nxt)[kHalfAcc], int it, bool more) {
      release_tile(it);
      if (more) issue_tile(nxt, it + 1);
      const bool cut_now = walk_na != 0 && it == walk_na - 1;
      const bool compact = __syncthreads_or(list_nearly_full || cut_now) != 0;
      list_nearly_full = false;
      epilogue(cur, it);
      hw::wgmma_wait<0>();
      hw::fence_regs(nxt);
      if (compact) {
        __syncthreads();
        compact_full_lists<NT>(a, cand_s, cand_i, sm.count, sm.thr, sm.sel, it < walk_na ? sm.cut : nullptr, cut_now);
      }
    };

    float acc_a[kHalfAcc], acc_b[kHalfAcc];
    if (ntiles > 0) {
      issue_tile(acc_a, 0);
      hw::wgmma_wait<0>();
      hw::fence_regs(acc_a);
    }
    for (int it = 0; it < ntiles; it += 2) {
      tile_step(acc_a, acc_b, it, it + 1 < ntiles);
      if (it + 1 >= ntiles) break;
      tile_step(acc_b, acc_a, it + 1, it + 2 < ntiles);
    }
    ring += static_cast<uint32_t>(ntiles);
    __syncthreads();
    if (walk_na != 0) {
      const bool failed = tid < NT && sm.cut[tid] > 0 && sm.count[tid] < min(a.K, sm.k_end[tid] - sm.k_start[tid]);
      if (__syncthreads_or(failed)) {
        if (tid == 0) sm.redo_blk = blk;
        continue;
      }
    }
    write_block_top_k<NT>(a, t0, cand_s, cand_i, sm.count, sm.sel);
  }
}

// Launches the D_I = 128 walk (one CTA per SM: grid = min(#blocks, #SMs)).
template <int H, bool kRelu>
Status launch(const KernelArgsV2& args, int grid, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(smem_bytes<H>());
  if (sampled_walk_allowed(args.base.T_kv))
    return launch_with_smem(indexer_topk_v3_kernel<H, kRelu, true>, dim3(grid), kThreads, kSmem, stream,
                            "indexer_topk_v3_kernel", args);
  return launch_with_smem(indexer_topk_v3_kernel<H, kRelu, false>, dim3(grid), kThreads, kSmem, stream,
                          "indexer_topk_v3_kernel", args);
}

// Runs the v3 walk (D_I = 128 only) with the host's KernelArgs; grid: one CTA per SM at most.
inline Status run(const KernelArgs& base, int H, bool relu, int grid, cudaStream_t stream) {
  KernelArgsV2 args{};
  args.base = base;
  const Status st = v2::make_key_tensor_map(base, kD, &args.tmap_k);
  if (!st.ok()) return st;
  if (H == 32) return relu ? launch<32, true>(args, grid, stream) : launch<32, false>(args, grid, stream);
  return relu ? launch<64, true>(args, grid, stream) : launch<64, false>(args, grid, stream);
}

}  // namespace flashdsa::sm90::indexer_topk_impl::v3
