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
#define FLASHDSA_INDEXER_SAMPLE_MIN_TILES 256  // 16K keys (check builds lower it to exercise the path)
#endif
#ifndef FLASHDSA_INDEXER_SAMPLE_SIGMAS
#define FLASHDSA_INDEXER_SAMPLE_SIGMAS 4.0f  // check builds set it negative to force the re-walk
#endif

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kSampleTileKeys = 64;  // keys per tile (kernel.cuh kTileKeys)
constexpr int kSampleStride = 8;     // phase A walks every kSampleStride-th tile
constexpr int kSampleMinTiles = FLASHDSA_INDEXER_SAMPLE_MIN_TILES;

// Tile (relative to tile0) walked at step `it` of a block: plain order when na == 0, else phase A (the
// multiples of G, na = ceil(ntiles / G) of them) then phase B (the others, ascending).
FLASHDSA_SAMPLED_HD int walk_tile(int it, int na) {
  if (na == 0) return it;
  if (it < na) return kSampleStride * it;
  const int j = it - na;  // the j-th tile that is not a multiple of G
  return j + j / (kSampleStride - 1) + 1;
}

// Keys of [ks, ke) in phase-A tiles (tile0 + G j); ks >= tile0 * 64.
FLASHDSA_SAMPLED_HD int phase_a_keys(int ks, int ke, int tile0) {
  auto below = [tile0](int x) {  // phase-A keys in [tile0 * 64, x)
    const int u = x - tile0 * kSampleTileKeys;
    const int rem = u % (kSampleStride * kSampleTileKeys);
    return (u / (kSampleStride * kSampleTileKeys)) * kSampleTileKeys + std::min(rem, static_cast<int>(kSampleTileKeys));
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
