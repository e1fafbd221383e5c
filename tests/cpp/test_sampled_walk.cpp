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
  for (int ntiles : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 2048}) {
    const int na = ceil_div(ntiles, kSampleStride);
    std::vector<int> seen(ntiles, 0);
    for (int it = 0; it < ntiles; ++it) {
      const int t = walk_tile(it, na);
      ASSERT_GE(t, 0) << "ntiles " << ntiles << " step " << it;
      ASSERT_LT(t, ntiles) << "ntiles " << ntiles << " step " << it;
      ++seen[t];
      EXPECT_EQ(it < na, t % kSampleStride == 0) << "ntiles " << ntiles << " step " << it;
      if (it > na) EXPECT_GT(t, walk_tile(it - 1, na)) << "phase B ascends";
      EXPECT_EQ(walk_tile(it, 0), it) << "na = 0 is the plain order";
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "ntiles " << ntiles;
  }
}

TEST(SampledWalk, PhaseAKeysMatchADirectCount) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int tile0 = static_cast<int>(rng() % 50);
    const int ks = tile0 * kSampleTileKeys + static_cast<int>(rng() % 2000);
    const int ke = ks + static_cast<int>(rng() % 40000);
    int direct = 0;
    for (int k = ks; k < ke; ++k) direct += (k / kSampleTileKeys - tile0) % kSampleStride == 0;
    ASSERT_EQ(phase_a_keys(ks, ke, tile0), direct) << "tile0 " << tile0 << " [" << ks << ", " << ke << ")";
  }
}

TEST(SampledWalk, CutSizeRules) {
  const int short_row = kSampleMinTiles * kSampleTileKeys / 2 - 1;
  EXPECT_EQ(sample_cut_size(short_row, short_row / kSampleStride, 2048), 0) << "short rows are not cut";
  EXPECT_EQ(sample_cut_size(1 << 20, 0, 2048), 0) << "no sampled keys, no cut";
  for (int keep : {64, 256, 2048, 2560}) {
    for (int n : {8192, 16384, 65536, 131072}) {
      const int na = n / kSampleStride;
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
int rewalks(int n, int keep, int rows, double sigmas, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int ntiles = ceil_div(n, kSampleTileKeys), na = ceil_div(ntiles, kSampleStride);
  const int n_a = phase_a_keys(0, n, 0);
  int failed = 0;
  std::vector<float> scores(n), phase_a;
  for (int row = 0; row < rows; ++row) {
    for (float& s : scores) s = normal(rng);
    phase_a.clear();
    for (int it = 0; it < na; ++it)
      for (int k = walk_tile(it, na) * kSampleTileKeys; k < std::min(n, (walk_tile(it, na) + 1) * kSampleTileKeys); ++k)
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
  EXPECT_EQ(sample_cut_size(65536, phase_a_keys(0, 65536, 0), 2048),
            static_cast<int>(std::ceil(256 + FLASHDSA_INDEXER_SAMPLE_SIGMAS * 16 + 8)));
  EXPECT_LE(rewalks(32768, 2048, 300, 4.0, 11), 1);
  EXPECT_LE(rewalks(65536, 2560, 200, 4.0, 12), 1);
  EXPECT_GE(rewalks(32768, 2048, 100, -4.0, 13), 90) << "a cut 4 sigma too deep must fail for most rows";
}

}  // namespace
