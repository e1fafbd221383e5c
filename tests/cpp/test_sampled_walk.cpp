// The indexer walks' sampled threshold (csrc/sm90/indexer_topk/sampled_walk.h; docs/kernels/indexer_topk.md,
// "Sampled threshold"): the walk order visits every tile once, phase A first; the phase-A key count matches
// a direct count; the cut size keeps the chance of a re-walk small on random scores, and a cut that is too
// deep (a negative margin) would be caught by the same test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "sm90/indexer_topk/sampled_walk.h"

namespace {

using namespace flashdsa::sm90::indexer_topk_impl;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

TEST(SampledWalk, OrderIsAPermutationWithPhaseAFirst) {
  for (int lg = kSampleMinLog2; lg <= kSampleMaxLog2; ++lg) {
    const int g = 1 << lg;
    for (int ntiles : {1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1000, 2048, 4097, 70000}) {
      const int walk = sample_walk_code(ntiles, lg);
      const int na = walk_phase_a_tiles(walk);
      ASSERT_EQ(na, ceil_div(ntiles, g));
      std::vector<int> seen(ntiles, 0);
      for (int it = 0; it < ntiles; ++it) {
        const int t = walk_tile(it, walk);
        ASSERT_GE(t, 0) << "ntiles " << ntiles << " G " << g << " step " << it;
        ASSERT_LT(t, ntiles) << "ntiles " << ntiles << " G " << g << " step " << it;
        ++seen[t];
        ASSERT_EQ(it < na, t % g == 0) << "ntiles " << ntiles << " G " << g << " step " << it;
        if (it > na) {
          ASSERT_GT(t, walk_tile(it - 1, walk)) << "phase B ascends";
        }
        ASSERT_EQ(walk_tile(it, 0), it) << "walk 0 is the plain order";
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
          << "ntiles " << ntiles << " G " << g;
    }
  }
}

TEST(SampledWalk, MultiplyHighDivisionIsExact) {
  for (int lg = kSampleMinLog2; lg <= kSampleMaxLog2; ++lg) {
    const unsigned d = (1u << lg) - 1;
    for (unsigned j = 0; j < (1u << 20); ++j) ASSERT_EQ(div_stride_minus_one(j, lg), j / d) << "j " << j << " d " << d;
  }
}

TEST(SampledWalk, StrideFitsPhaseAInTheList) {
  EXPECT_EQ(sample_stride_log2(256, 4096), 4) << "16K keys";
  EXPECT_EQ(sample_stride_log2(1024, 4096), 4) << "64K keys";
  EXPECT_EQ(sample_stride_log2(1025, 4096), 5);
  EXPECT_EQ(sample_stride_log2(2048, 4096), 5) << "128K keys";
  EXPECT_EQ(sample_stride_log2(4096, 4096), 6) << "256K keys";
  EXPECT_EQ(sample_stride_log2(100000, 4096), kSampleMaxLog2) << "beyond: the largest stride";
  for (int cap : {1024, 4096, 8192})
    for (int ntiles = 256; ntiles <= 20000; ntiles += 37) {
      const int lg = sample_stride_log2(ntiles, cap);
      ASSERT_GE(lg, kSampleMinLog2);
      ASSERT_LE(lg, kSampleMaxLog2);
      if (lg < kSampleMaxLog2) {
        ASSERT_LE(ceil_div(ntiles, 1 << lg) * kSampleTileKeys, cap) << "phase A fits";
      }
      if (lg > kSampleMinLog2) {
        ASSERT_GT(ceil_div(ntiles, 1 << (lg - 1)) * kSampleTileKeys, cap) << "the smallest stride that fits";
      }
    }
}

TEST(SampledWalk, InstanceChoiceKeepsTheDivisionExact) {
  EXPECT_FALSE(sampled_walk_allowed(static_cast<long long>(kSampleMinTiles) * kSampleTileKeys - 1)) << "too short";
  EXPECT_TRUE(sampled_walk_allowed(static_cast<long long>(kSampleMinTiles) * kSampleTileKeys));
  EXPECT_TRUE(sampled_walk_allowed(1LL << 26)) << "2^20 tiles: phase-B steps stay below 2^20";
  EXPECT_FALSE(sampled_walk_allowed((1LL << 26) + 1)) << "longer inputs take the plain instance";
}

TEST(SampledWalk, PhaseAKeysMatchADirectCount) {
  std::mt19937 rng(7);
  for (int lg = kSampleMinLog2; lg <= kSampleMaxLog2; ++lg)
    for (int trial = 0; trial < 1000; ++trial) {
      const int tile0 = static_cast<int>(rng() % 50);
      const int ks = tile0 * kSampleTileKeys + static_cast<int>(rng() % 2000);
      const int ke = ks + static_cast<int>(rng() % 40000);
      int direct = 0;
      for (int k = ks; k < ke; ++k) direct += (k / kSampleTileKeys - tile0) % (1 << lg) == 0;
      ASSERT_EQ(phase_a_keys(ks, ke, tile0, lg), direct) << "tile0 " << tile0 << " [" << ks << ", " << ke << ") lg " << lg;
    }
}

TEST(SampledWalk, CutSizeRules) {
  const int short_row = kSampleMinTiles * kSampleTileKeys / 2 - 1;
  EXPECT_EQ(sample_cut_size(short_row, short_row / 16, 2048), 0) << "short rows are not cut";
  EXPECT_EQ(sample_cut_size(1 << 20, 0, 2048), 0) << "no sampled keys, no cut";
  for (int keep : {64, 256, 2048, 2560}) {
    for (int n : {8192, 16384, 65536, 131072}) {
      const int na = n / 16;
      const int r = sample_cut_size(n, na, keep);
      const double mu = double(keep) * na / n;
      if (r == 0) {
        EXPECT_GE(mu + 4 * std::sqrt(mu) + 8, keep) << "a cut is dropped only when it would keep everything";
      } else {
        EXPECT_LT(r, keep);
        EXPECT_GE(r, mu + 4 * std::sqrt(mu)) << "keep " << keep << " n " << n;
      }
    }
  }
}

// Rows of random scores, walked in the sampled order with the kernels' rule: after phase A the row keeps its
// r best phase-A keys (threshold = the r-th), phase B adds every key above it; a row that ends with fewer
// than `keep` keys would be re-walked. With the 4-sigma margin that must (almost) never happen; a cut 4 sigma
// too deep must make it happen for most rows (so this test can fail).
int rewalks(int n, int keep, int rows, double sigmas, unsigned seed, int lg) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int ntiles = ceil_div(n, kSampleTileKeys), walk = sample_walk_code(ntiles, lg);
  const int na = walk_phase_a_tiles(walk), n_a = phase_a_keys(0, n, 0, lg);
  int failed = 0;
  std::vector<float> scores(n), phase_a;
  for (int row = 0; row < rows; ++row) {
    for (float& s : scores) s = normal(rng);
    phase_a.clear();
    for (int it = 0; it < na; ++it)
      for (int k = walk_tile(it, walk) * kSampleTileKeys; k < std::min(n, (walk_tile(it, walk) + 1) * kSampleTileKeys); ++k)
        phase_a.push_back(scores[k]);
    EXPECT_EQ(static_cast<int>(phase_a.size()), n_a);
    const double mu = double(keep) * n_a / n;
    const int r = std::max(1, static_cast<int>(std::ceil(mu + sigmas * std::sqrt(mu) + 8)));
    std::nth_element(phase_a.begin(), phase_a.begin() + (r - 1), phase_a.end(), std::greater<float>());
    const float thr = phase_a[r - 1];
    const int above = static_cast<int>(std::count_if(scores.begin(), scores.end(), [thr](float s) { return s >= thr; }));
    failed += above < keep;
  }
  return failed;
}

TEST(SampledWalk, FourSigmaCutsAlmostNeverReWalk) {
  EXPECT_EQ(sample_cut_size(65536, phase_a_keys(0, 65536, 0, 4), 2048),
            static_cast<int>(std::ceil(128 + FLASHDSA_INDEXER_SAMPLE_SIGMAS * std::sqrt(128.0) + 8)));
  // The strides the kernels take at these lengths (sample_stride_log2 with cap 4096): 16, 16, 32.
  EXPECT_LE(rewalks(32768, 2048, 300, 4.0, 11, sample_stride_log2(512, 4096)), 1);
  EXPECT_LE(rewalks(65536, 2560, 200, 4.0, 12, sample_stride_log2(1024, 4096)), 1);
  EXPECT_LE(rewalks(131072, 2048, 100, 4.0, 14, sample_stride_log2(2048, 4096)), 1);
  EXPECT_GE(rewalks(32768, 2048, 100, -4.0, 13, 4), 90) << "a cut 4 sigma too deep must fail for most rows";
}

}  // namespace
