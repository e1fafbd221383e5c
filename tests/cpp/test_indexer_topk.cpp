// Indexer + top-k on the CPU backend vs the double reference (docs/spec.md §3). Selections are compared
// as multisets of reference scores against the K largest visible scores, with a tolerance at the
// threshold, never as exact index lists.
#include <gtest/gtest.h>

#include <set>

#include "problem.h"

namespace fdt {
namespace {

// Inputs of a top-k call and its reference scorer.
struct TopkCase {
  const ref::Indexer& ix;
  const std::vector<int32_t>& k_start;
  const std::vector<int32_t>& k_end;
  int64_t T;
  int K;
};

// Checks indices [T, K] and scores [T, K] (or none) of a top-k call; tol is on score values.
template <class Stat>
void check_topk(const TopkCase& c, const std::vector<int32_t>& indices, const std::vector<Stat>* scores, double tol) {
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t ks = c.k_start[t], n = c.k_end[t] - ks;
    const int64_t kept = std::min<int64_t>(n, c.K);
    std::vector<double> visible(n);
    for (int64_t i = 0; i < n; ++i) visible[i] = c.ix.score(t, ks + i);
    std::sort(visible.begin(), visible.end(), std::greater<double>());

    std::set<int32_t> seen;
    std::vector<double> selected;
    for (int j = 0; j < c.K; ++j) {
      const int32_t key = indices[t * c.K + j];
      if (j >= kept) {
        ASSERT_EQ(key, -1) << "row " << t << " slot " << j << ": empty slots come last and hold -1";
        if (scores) {
          ASSERT_EQ((*scores)[t * c.K + j], -std::numeric_limits<Stat>::infinity());
        }
        continue;
      }
      ASSERT_GE(key, ks) << "row " << t << " slot " << j;
      ASSERT_LT(key, c.k_end[t]) << "row " << t << " slot " << j;
      ASSERT_TRUE(seen.insert(key).second) << "row " << t << ": key " << key << " selected twice";
      const double ref_score = c.ix.score(t, key);
      if (scores) {
        ASSERT_NEAR((*scores)[t * c.K + j], ref_score, tol) << "score of row " << t << " key " << key;
      }
      selected.push_back(ref_score);
    }
    std::sort(selected.begin(), selected.end(), std::greater<double>());
    for (int64_t r = 0; r < kept; ++r) {
      ASSERT_NEAR(selected[r], visible[r], tol) << "row " << t << ": rank " << r << " of the selection";
    }
  }
}

template <class Act>
void check_problem(const Shape& shape, bool with_scores) {
  using Stat = StatOf<Act>;
  const Problem<Act> pb(shape);
  std::vector<int32_t> indices(pb.T * shape.K, 777);
  std::vector<Stat> scores(pb.T * shape.K, Stat(777));
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(pb.indexer_topk(indices.data(), with_scores ? scores.data() : nullptr)));
  const ref::Indexer ix = pb.ref_indexer();
  const double tol = stat_rtol<Act>() * 10;  // scores here are O(1..10)
  check_topk<Stat>({ix, pb.batch.k_start, pb.batch.k_end, pb.T, shape.K}, indices, with_scores ? &scores : nullptr,
                   tol);
  if (!with_scores) {
    EXPECT_EQ(scores[0], Stat(777)) << "scores must not be written when null";
  }
}

template <class Act>
class IndexerTopk : public ::testing::Test {};
using ActTypes = ::testing::Types<bf16, float, double>;
TYPED_TEST_SUITE(IndexerTopk, ActTypes);

TYPED_TEST(IndexerTopk, ReluMatchesReference) { check_problem<TypeParam>(Shape{}, true); }

TYPED_TEST(IndexerTopk, IdentityMatchesReference) {
  Shape s;
  s.relu = false;
  s.seed = 2;
  check_problem<TypeParam>(s, true);
}

TEST(IndexerTopk, ScoresAreOptional) { check_problem<float>(Shape{}, false); }

TEST(IndexerTopk, SmallKAndManyRows) {
  Shape s;
  s.lengths = {3, 64, 129};
  s.K = 5;
  s.H_I = 1;
  s.D_I = 8;
  check_problem<bf16>(s, true);
}

// K up to 4096: a few queries see up to ~5000 keys each (ranges not causal).
TEST(IndexerTopk, LargeK) {
  const int64_t T = 6, T_kv = 5000;
  const int H_I = 4, D_I = 16, K = 4096;
  Rng rng(11);
  const auto q_idx = random_input<bf16>(T, H_I, D_I, -1, 1, rng);
  const auto k_idx = random_input<bf16>(T_kv, 1, D_I, -1, 1, rng);
  const auto weights = random_input<float>(T, 1, H_I, -0.5, 1, rng);
  const std::vector<int32_t> k_start{0, 0, 10, 900, 4000, 5000}, k_end{5000, 4096, 4000, 4990, 5000, 5000};
  std::vector<int32_t> indices(T * K);
  std::vector<float> scores(T * K);
  flashdsa::IndexerTopkParams p;
  p.indexer.q_idx = q_idx.data();
  p.indexer.k_idx = k_idx.data();
  p.indexer.weights = weights.data();
  p.k_start = k_start.data();
  p.k_end = k_end.data();
  p.indices = indices.data();
  p.scores = scores.data();
  p.T = T;
  p.T_kv = T_kv;
  p.indexer.H_I = H_I;
  p.indexer.D_I = D_I;
  p.K = K;
  p.indexer.q_idx_stride_t = q_idx.stride_t;
  p.indexer.q_idx_stride_h = q_idx.stride_h;
  p.indexer.k_idx_stride_t = k_idx.stride_t;
  p.indexer.weights_stride_t = weights.stride_t;
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(p));
  const ref::Indexer ix{q_idx.value, k_idx.value, weights.value, H_I, D_I, true};
  check_topk<float>({ix, k_start, k_end, T, K}, indices, &scores, 1e-4);
}

}  // namespace
}  // namespace fdt
