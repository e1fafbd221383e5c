// Sparse and dense indexer KL losses on the CPU backend vs the double reference (docs/spec.md §6),
// plus finite-difference checks of their backward in fp64.
#include <gtest/gtest.h>

#include "problem.h"

namespace fdt {
namespace {

// Backward outputs of a KL call.
template <class Act>
struct KlGrads {
  std::vector<Act> dq_idx;
  std::vector<StatOf<Act>> dk_idx, dweights;

  KlGrads(int64_t T, int64_t T_kv, const Shape& s)
      : dq_idx(T * s.H_I * s.D_I), dk_idx(T_kv * s.D_I), dweights(T * s.H_I) {}

  template <class P>
  void attach(P& p) {
    p.dq_idx = dq_idx.data();
    p.dk_idx = dk_idx.data();
    p.dweights = dweights.data();
  }
};

// Upstream gradient of the loss rows: grad_rows (optional) and grad_scale.
template <class Stat>
struct Upstream {
  std::vector<Stat> grad_rows;
  double grad_scale;

  std::vector<double> per_row(int64_t T) const {
    return grad_rows.empty() ? std::vector<double>(T, grad_scale) : row_grads(to_doubles(grad_rows), grad_scale);
  }
  template <class P>
  void attach(P& p) const {
    p.grad_rows = grad_rows.empty() ? nullptr : grad_rows.data();
    p.grad_scale = grad_scale;
  }
};

template <class Stat>
Upstream<Stat> random_upstream(int64_t T, bool with_rows, Rng& rng) {
  Upstream<Stat> up{{}, 0.37};
  if (with_rows) {
    std::uniform_real_distribution<double> u(-1, 2);
    for (int64_t t = 0; t < T; ++t) up.grad_rows.push_back(static_cast<Stat>(u(rng)));
  }
  return up;
}

// Runs forward and backward of one formulation (Params from make_params) and compares with ref.
template <class Act, class Params, class RunFwd, class RunBwd>
void compare_kl(const Problem<Act>& pb, Params p, RunFwd run_fwd, RunBwd run_bwd, const ref::KlResult& r,
                const Upstream<StatOf<Act>>& up) {
  using Stat = StatOf<Act>;
  std::vector<Stat> loss_rows(pb.T, Stat(-7));
  p.loss_rows = loss_rows.data();
  FDT_ASSERT_OK(run_fwd(p));
  // Loss terms partly cancel: compare against the loss scale of the whole batch.
  expect_close(to_doubles(loss_rows), r.loss_rows, stat_rtol<Act>(), stat_rtol<Act>(), "loss_rows");

  KlGrads<Act> g(pb.T, pb.T_kv, pb.shape);
  g.attach(p);
  up.attach(p);
  p.loss_rows = nullptr;
  FDT_ASSERT_OK(run_bwd(p));
  expect_act_close(g.dq_idx, r.dq_idx, "dq_idx");
  expect_stat_close(g.dk_idx, r.dk_idx, stat_rtol<Act>(), "dk_idx");
  expect_stat_close(g.dweights, r.dweights, stat_rtol<Act>(), "dweights");
}

template <class Act>
void check_sparse(const Shape& shape, bool with_grad_rows) {
  using Stat = StatOf<Act>;
  const Problem<Act> pb(shape);
  Rng rng(shape.seed + 100);
  const auto mass = random_mass<Stat>(pb.T, shape.K, rng);
  const auto up = random_upstream<Stat>(pb.T, with_grad_rows, rng);
  const auto r = ref::sparse_kl(pb.ref_indexer(), pb.indices, to_doubles(mass), pb.T, pb.T_kv, shape.K, up.per_row(pb.T));
  compare_kl(pb, pb.sparse_kl(mass.data()), [](const auto& p) { return flashdsa::run_sparse_kl_fwd(p); },
             [](const auto& p) { return flashdsa::run_sparse_kl_bwd(p); }, r, up);
  // Row 5 has zero mass and row 3 no valid slot: loss 0 and no gradient.
  for (const int64_t t : {3, 5}) {
    EXPECT_EQ(r.loss_rows[t], 0.0);
    for (int h = 0; h < shape.H_I; ++h) EXPECT_EQ(r.dweights[t * shape.H_I + h], 0.0);
  }
}

// The forward's optional row statistics: {lse of the scores, sum of the mass} on rows with a target,
// exactly {-inf, 0} on the others (row 3: no valid slot, row 5: zero mass).
template <class Act>
void check_sparse_row_stats(const Shape& shape) {
  using Stat = StatOf<Act>;
  const Problem<Act> pb(shape);
  Rng rng(shape.seed + 300);
  const auto mass = random_mass<Stat>(pb.T, shape.K, rng);
  std::vector<Stat> loss_rows(pb.T), stats(2 * pb.T, Stat(-7));
  auto p = pb.sparse_kl(mass.data());
  p.loss_rows = loss_rows.data();
  p.row_stats = stats.data();
  FDT_ASSERT_OK(flashdsa::run_sparse_kl_fwd(p));

  const ref::Indexer ix = pb.ref_indexer();
  std::vector<double> want, got;
  for (int64_t t = 0; t < pb.T; ++t) {
    std::vector<double> scores;
    double mass_sum = 0;
    for (int j = 0; j < shape.K; ++j) {
      const int32_t key = pb.indices[t * shape.K + j];
      if (!ref::valid(key, pb.T_kv)) continue;
      scores.push_back(ix.score(t, key));
      mass_sum += mass[t * shape.K + j];
    }
    if (scores.empty() || mass_sum == 0) {
      EXPECT_EQ(stats[2 * t], -std::numeric_limits<Stat>::infinity()) << "row " << t;
      EXPECT_EQ(stats[2 * t + 1], Stat(0)) << "row " << t;
      continue;
    }
    const double m = *std::max_element(scores.begin(), scores.end());
    double sum = 0;
    for (double x : scores) sum += std::exp(x - m);
    want.insert(want.end(), {m + std::log(sum), mass_sum});
    got.insert(got.end(), {static_cast<double>(stats[2 * t]), static_cast<double>(stats[2 * t + 1])});
  }
  expect_close(got, want, stat_rtol<Act>(), stat_rtol<Act>(), "row_stats");
}

template <class Act>
void check_dense(const Problem<Act>& pb, bool with_grad_rows) {
  using Stat = StatOf<Act>;
  Rng rng(pb.shape.seed + 200);
  const auto up = random_upstream<Stat>(pb.T, with_grad_rows, rng);
  const auto r = ref::dense_kl(pb.ref_indexer(), pb.ref_attention(), pb.batch.k_start, pb.batch.k_end, pb.T,
                               pb.T_kv, up.per_row(pb.T));
  compare_kl(pb, pb.dense_kl(), [](const auto& p) { return flashdsa::run_dense_kl_fwd(p); },
             [](const auto& p) { return flashdsa::run_dense_kl_bwd(p); }, r, up);
}

template <class Act>
class KlLoss : public ::testing::Test {};
using ActTypes = ::testing::Types<bf16, float, double>;
TYPED_TEST_SUITE(KlLoss, ActTypes);

TYPED_TEST(KlLoss, SparseMatchesReference) { check_sparse<TypeParam>(Shape{}, true); }

TYPED_TEST(KlLoss, SparseIdentityNoGradRowsMatchesReference) {
  Shape s;
  s.relu = false;
  s.seed = 5;
  check_sparse<TypeParam>(s, false);
}

TYPED_TEST(KlLoss, SparseForwardWritesRowStats) { check_sparse_row_stats<TypeParam>(Shape{}); }

TYPED_TEST(KlLoss, DenseMatchesReference) { check_dense(Problem<TypeParam>(Shape{}), true); }

TYPED_TEST(KlLoss, DenseIdentityNoGradRowsMatchesReference) {
  Shape s;
  s.relu = false;
  s.seed = 6;
  check_dense(Problem<TypeParam>(s), false);
}

// Rows longer than the CPU key tile (256) and an empty key range.
TEST(KlLoss, DenseLongRowsAndEmptyRange) {
  Shape s;
  s.lengths = {300, 5};
  s.H = 2;
  s.D_qk = 16;
  s.D_v = 8;
  s.H_I = 2;
  s.D_I = 8;
  Problem<float> pb(s);
  pb.batch.k_end[4] = pb.batch.k_start[4];  // row 4 sees nothing
  check_dense(pb, true);
}

// Central differences of total = sum_t G_t loss_rows[t] against the backward, for one formulation.
template <class Params, class RunFwd, class RunBwd>
void check_gradient(Problem<double>& pb, Params p, RunFwd run_fwd, RunBwd run_bwd) {
  const Shape& s = pb.shape;
  Rng rng(17);
  const auto up = random_upstream<double>(pb.T, true, rng);
  KlGrads<double> g(pb.T, pb.T_kv, s);
  g.attach(p);
  up.attach(p);
  FDT_ASSERT_OK(run_bwd(p));

  std::vector<double> loss_rows(pb.T);
  p.loss_rows = loss_rows.data();
  const std::vector<double> G = up.per_row(pb.T);
  auto total = [&] {
    EXPECT_TRUE(run_fwd(p).ok());
    double sum = 0;
    for (int64_t t = 0; t < pb.T; ++t) sum += G[t] * loss_rows[t];
    return sum;
  };
  auto numeric = [&](auto& x, int64_t t, int h, int d) {
    const double eps = 1e-6, x0 = x.value[(t * x.heads + h) * x.dim + d];
    x.set(t, h, d, x0 + eps);
    const double plus = total();
    x.set(t, h, d, x0 - eps);
    const double minus = total();
    x.set(t, h, d, x0);
    return (plus - minus) / (2 * eps);
  };
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t t = rng() % pb.T, key = rng() % pb.T_kv;
    const int h = static_cast<int>(rng() % s.H_I), d = static_cast<int>(rng() % s.D_I);
    EXPECT_NEAR(g.dq_idx[(t * s.H_I + h) * s.D_I + d], numeric(pb.q_idx, t, h, d), 1e-7) << "dq_idx";
    EXPECT_NEAR(g.dk_idx[key * s.D_I + d], numeric(pb.k_idx, key, 0, d), 1e-7) << "dk_idx";
    EXPECT_NEAR(g.dweights[t * s.H_I + h], numeric(pb.weights, t, 0, h), 1e-7) << "dweights";
  }
}

TEST(KlLoss, SparseBackwardIsTheGradientOfTheForward) {
  Shape s;
  s.lengths = {9, 14};
  s.K = 10;
  Problem<double> pb(s);
  Rng rng(4);
  const auto mass = random_mass<double>(pb.T, s.K, rng);
  check_gradient(pb, pb.sparse_kl(mass.data()), [](const auto& p) { return flashdsa::run_sparse_kl_fwd(p); },
                 [](const auto& p) { return flashdsa::run_sparse_kl_bwd(p); });
}

TEST(KlLoss, DenseBackwardIsTheGradientOfTheForward) {
  Shape s;
  s.lengths = {9, 14};
  Problem<double> pb(s);
  check_gradient(pb, pb.dense_kl(), [](const auto& p) { return flashdsa::run_dense_kl_fwd(p); },
                 [](const auto& p) { return flashdsa::run_dense_kl_bwd(p); });
}

}  // namespace
}  // namespace fdt
