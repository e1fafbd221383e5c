// Internal: the walk order and the cut size of the indexer walks' sampled threshold (kernel.cuh,
// "sampled threshold"; docs/kernels/indexer_topk.md). Plain arithmetic, compiled for the device by the
// kernels and for the host by tests/cpp/test_sampled_walk.cpp.
#pragma once

#include <algorithm>
#include <cmath>

#if defined(__CUDACC__)
#define FLASHDSA_SAMPLED_HD __host__ __device__ __forceinline__
#else
#define FLASHDSA_SAMPLED_HD inline
#endif

#ifndef FLASHDSA_INDEXER_SAMPLE_MIN_TILES
#define FLASHDSA_INDEXER_SAMPLE_MIN_TILES 64  // 4K keys (256 = 16K until the tenth session; check builds lower it further)
#endif
#ifndef FLASHDSA_INDEXER_SAMPLE_SIGMAS
#define FLASHDSA_INDEXER_SAMPLE_SIGMAS 4.0f  // check builds set it negative to force the re-walk
#endif

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kSampleTileKeys = 64;  // keys per tile (kernel.cuh kTileKeys; phase_a_keys shifts by its log2, 6)
constexpr int kSampleMinTiles = FLASHDSA_INDEXER_SAMPLE_MIN_TILES;
// The walk order's multiply-high division is exact for phase-B steps below 2^20: inputs whose key range could
// give a block that many tiles (T_kv > 2^26 keys) run the kernels' instance without the sampled walk.
constexpr long long kSampleMaxKeys = (1LL << 20) * kSampleTileKeys;
FLASHDSA_SAMPLED_HD bool sampled_walk_allowed(long long T_kv) {
  return T_kv >= static_cast<long long>(kSampleMinTiles) * kSampleTileKeys && T_kv <= kSampleMaxKeys;
}
// Phase A walks every G-th tile, G = 2^lg with lg in [kSampleMinLog2, kSampleMaxLog2]: the smallest G whose
// phase A fits a row's candidate list (sample_stride_log2), so that no row compacts before its cut.
constexpr int kSampleMinLog2 = 4;
constexpr int kSampleMaxLog2 = 6;

// log2 of the phase-A stride of a block of `ntiles` key tiles whose rows have lists of `cap` entries:
// the smallest G in [16, 64] with ceil(ntiles / G) tiles of keys <= cap (cap 4096: G = 16 up to 64K keys,
// 32 up to 128K, 64 beyond).
FLASHDSA_SAMPLED_HD int sample_stride_log2(int ntiles, int cap) {
#if defined(FLASHDSA_INDEXER_SAMPLE_FORCE_LOG2)  // A/B builds only: a fixed stride (3 = the former 8)
  (void)ntiles;
  (void)cap;
  return FLASHDSA_INDEXER_SAMPLE_FORCE_LOG2;
#endif
  for (int lg = kSampleMinLog2; lg < kSampleMaxLog2; ++lg)
    if (((ntiles + (1 << lg) - 1) >> lg) * kSampleTileKeys <= cap) return lg;
  return kSampleMaxLog2;
}

// A block's walk order in one int: 0 = plain, else (na << 8) | lg with na = ceil(ntiles / 2^lg) phase-A tiles.
FLASHDSA_SAMPLED_HD int sample_walk_code(int ntiles, int lg) {
  return (((ntiles + (1 << lg) - 1) >> lg) << 8) | lg;
}
FLASHDSA_SAMPLED_HD int walk_phase_a_tiles(int walk) { return walk >> 8; }

// floor(j / (2^lg - 1)) for 0 <= j < 2^20 and lg in [4, 6] (and 3 in FORCE_LOG2 builds), by a multiply-high with ceil(2^32 / d)
// (exact there: j * (m d - 2^32) * d < 2^32; tests/cpp/test_sampled_walk.cpp checks every j).
FLASHDSA_SAMPLED_HD unsigned div_stride_minus_one(unsigned j, int lg) {
  unsigned m = lg == 4 ? 286331154u : lg == 5 ? 138547333u : 68174085u;  // ceil(2^32 / 15, 31, 63)
#if defined(FLASHDSA_INDEXER_SAMPLE_FORCE_LOG2)
  if (lg == 3) m = 613566757u;  // ceil(2^32 / 7)
#endif
#if defined(__CUDA_ARCH__)
  return __umulhi(j, m);
#else
  return static_cast<unsigned>((static_cast<unsigned long long>(j) * m) >> 32);
#endif
}

// Tile (relative to tile0) walked at step `it` of a block with walk code `walk`: plain order when walk == 0,
// else phase A (the multiples of G, na of them) then phase B (the others, ascending).
FLASHDSA_SAMPLED_HD int walk_tile(int it, int walk) {
  if (walk == 0) return it;
  const int na = walk >> 8, lg = walk & 0xff;
  if (it < na) return it << lg;
  const int j = it - na;  // the j-th tile that is not a multiple of G
  return j + static_cast<int>(div_stride_minus_one(static_cast<unsigned>(j), lg)) + 1;
}

// Keys of [ks, ke) in phase-A tiles (tile0 + G j, G = 2^lg); ks >= tile0 * 64.
FLASHDSA_SAMPLED_HD int phase_a_keys(int ks, int ke, int tile0, int lg) {
  auto below = [tile0, lg](int x) {  // phase-A keys in [tile0 * 64, x)
    const int u = x - tile0 * kSampleTileKeys;
    const int period = kSampleTileKeys << lg;  // u >= 0
    return (u >> (lg + 6)) * kSampleTileKeys + std::min(u & (period - 1), static_cast<int>(kSampleTileKeys));
  };
  return below(ke) - below(ks);
}

// Cut size after phase A for a row of n visible keys, na of them in phase A, whose list must end with its
// `keep` best (K; the FP8 pass: C), or 0 (no cut: the row is short or the sample too small to save appends).
FLASHDSA_SAMPLED_HD int sample_cut_size(int n, int na, int keep) {
  if (n < kSampleMinTiles * kSampleTileKeys / 2 || na <= 0) return 0;
  const float mu = static_cast<float>(keep) * static_cast<float>(na) / static_cast<float>(n);
  const int r = static_cast<int>(ceilf(mu + FLASHDSA_INDEXER_SAMPLE_SIGMAS * sqrtf(mu) + 8.f));
  return r < keep ? std::max(r, 1) : 0;
}

}  // namespace flashdsa::sm90::indexer_topk_impl
