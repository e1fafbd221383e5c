// Sparse MLA forward / backward and attention mass on the CPU backend vs the double reference
// (docs/spec.md §4-§6), plus finite-difference checks of the backward in fp64.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "problem.h"

namespace fdt {
namespace {

template <class Act>
class SparseMla : public ::testing::Test {};
using ActTypes = ::testing::Types<bf16, float, double>;
TYPED_TEST_SUITE(SparseMla, ActTypes);

// The production head / latent sizes at a small T.
Shape production_shape() {
  Shape s;
  s.lengths = {30, 17};
  s.H = 16;
  s.D_qk = flashdsa::kDqk;
  s.D_v = flashdsa::kDv;
  s.K = 64;
  s.seed = 7;
  return s;
}

template <class Act>
void check_forward(const Shape& shape) {
  const Problem<Act> pb(shape);
  const auto fwd = run_forward(pb);
  ref::Vec out, lse;
  ref::sparse_mla_fwd(pb.ref_attention(), pb.indices, pb.T, pb.T_kv, shape.K, shape.D_v, out, lse);
  expect_act_close(fwd.out, out, "out");
  expect_stat_close(fwd.lse, lse, stat_rtol<Act>(), "lse");

  // Rows without a valid index: out exactly 0 and lse -inf.
  int empty_rows = 0;
  for (int64_t t = 0; t < pb.T; ++t) {
    bool any_valid = false;
    for (int j = 0; j < shape.K; ++j) any_valid |= ref::valid(pb.indices[t * shape.K + j], pb.T_kv);
    if (any_valid) continue;
    ++empty_rows;
    for (int h = 0; h < shape.H; ++h) {
      EXPECT_EQ(fwd.lse[t * shape.H + h], -std::numeric_limits<StatOf<Act>>::infinity());
      for (int d = 0; d < shape.D_v; ++d) EXPECT_EQ(to_double(fwd.out[(t * shape.H + h) * shape.D_v + d]), 0.0);
    }
  }
  EXPECT_GT(empty_rows, 0) << "the problem should contain empty rows";
}

template <class Act>
void check_backward(const Shape& shape) {
  const Problem<Act> pb(shape);
  const auto fwd = run_forward(pb);
  std::vector<Act> dq(pb.T * shape.H * shape.D_qk);
  std::vector<StatOf<Act>> dkv(pb.T_kv * shape.D_qk);
  FDT_ASSERT_OK(flashdsa::run_sparse_mla_bwd(pb.sparse_bwd(fwd.out.data(), fwd.lse.data(), dq.data(), dkv.data())));
  ref::Vec dq_ref, dkv_ref;
  ref::sparse_mla_bwd(pb.ref_attention(), pb.indices, pb.T, pb.T_kv, shape.K, shape.D_v, to_doubles(fwd.out),
                      to_doubles(fwd.lse), pb.dout.value, dq_ref, dkv_ref);
  expect_act_close(dq, dq_ref, "dq");
  expect_stat_close(dkv, dkv_ref, stat_rtol<Act>(), "dkv");
}

template <class Act>
void check_mass(const Shape& shape) {
  const Problem<Act> pb(shape);
  const auto fwd = run_forward(pb);
  std::vector<StatOf<Act>> mass(pb.T * shape.K, StatOf<Act>(-1));
  FDT_ASSERT_OK(flashdsa::run_attention_mass(pb.attention_mass(fwd.lse.data(), mass.data())));
  const auto mass_ref =
      ref::attention_mass(pb.ref_attention(), pb.indices, pb.T, pb.T_kv, shape.K, to_doubles(fwd.lse));
  expect_stat_close(mass, mass_ref, stat_rtol<Act>(), "mass");
  for (int64_t i = 0; i < pb.T * shape.K; ++i) {
    if (!ref::valid(pb.indices[i], pb.T_kv)) {
      EXPECT_EQ(mass[i], 0) << "empty slot " << i;
    }
  }
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The backward's optional mass output (SparseMlaBwdParams::mass) is bitwise what run_attention_mass
// computes on the same inputs (the same probabilities summed over h in the same order), every slot
// is written (the buffer starts as NaN), and dq / dkv do not change with or without it.
template <class Act>
void check_backward_mass(const Shape& shape) {
  using Stat = StatOf<Act>;
  const Problem<Act> pb(shape);
  const auto fwd = run_forward(pb);
  const int64_t T = pb.T, K = shape.K;
  std::vector<Stat> expected(T * K, Stat(-1));
  FDT_ASSERT_OK(flashdsa::run_attention_mass(pb.attention_mass(fwd.lse.data(), expected.data())));

  std::vector<Act> dq(T * shape.H * shape.D_qk), dq_plain(dq.size());
  std::vector<Stat> dkv(pb.T_kv * shape.D_qk), dkv_plain(dkv.size());
  std::vector<Stat> mass(T * K, std::numeric_limits<Stat>::quiet_NaN());
  auto p = pb.sparse_bwd(fwd.out.data(), fwd.lse.data(), dq.data(), dkv.data());
  p.mass = mass.data();
  FDT_ASSERT_OK(flashdsa::run_sparse_mla_bwd(p));
  // mass == nullptr (the default) still runs, and gives the same gradients.
  FDT_ASSERT_OK(
      flashdsa::run_sparse_mla_bwd(pb.sparse_bwd(fwd.out.data(), fwd.lse.data(), dq_plain.data(), dkv_plain.data())));

  EXPECT_TRUE(bitwise_equal(mass, expected)) << "bwd mass differs from run_attention_mass";
  EXPECT_TRUE(bitwise_equal(dq, dq_plain)) << "dq changed with the mass output";
  EXPECT_TRUE(bitwise_equal(dkv, dkv_plain)) << "dkv changed with the mass output";
  const auto mass_ref = ref::attention_mass(pb.ref_attention(), pb.indices, T, pb.T_kv, shape.K, to_doubles(fwd.lse));
  expect_stat_close(mass, mass_ref, stat_rtol<Act>(), "bwd mass");

  // The problem covers the cases the op must handle: empty slots (-1 and out of range) get 0, rows
  // without a valid slot are all 0, a duplicated key gets its mass in each of its slots.
  int empty_rows = 0, duplicates = 0, out_of_range = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool any_valid = false;
    for (int j = 0; j < K; ++j) {
      const int32_t key = pb.indices[t * K + j];
      if (!ref::valid(key, pb.T_kv)) {
        out_of_range += key != -1;
        EXPECT_EQ(mass[t * K + j], Stat(0)) << "empty slot " << t << "," << j;
        continue;
      }
      any_valid = true;
    }
    empty_rows += !any_valid;
    const int32_t first = pb.indices[t * K];
    if (K >= 2 && ref::valid(first, pb.T_kv) && pb.indices[t * K + K - 1] == first) {
      ++duplicates;
      EXPECT_EQ(mass[t * K], mass[t * K + K - 1]) << "duplicate key of row " << t;
    }
  }
  EXPECT_GT(empty_rows, 0);
  EXPECT_GT(duplicates, 0);
  EXPECT_GT(out_of_range, 0);
}

TYPED_TEST(SparseMla, ForwardMatchesReference) { check_forward<TypeParam>(Shape{}); }
TYPED_TEST(SparseMla, BackwardMatchesReference) { check_backward<TypeParam>(Shape{}); }
TYPED_TEST(SparseMla, AttentionMassMatchesReference) { check_mass<TypeParam>(Shape{}); }
TYPED_TEST(SparseMla, BackwardMassEqualsAttentionMass) { check_backward_mass<TypeParam>(Shape{}); }

TEST(SparseMlaProductionShape, Bf16ForwardBackwardMass) {
  check_forward<bf16>(production_shape());
  check_backward<bf16>(production_shape());
  check_mass<bf16>(production_shape());
  check_backward_mass<bf16>(production_shape());
}

// Many threads' row ranges and K > the SIMD widths: fp64 and fp32 at H = 16, K = 128.
TEST(SparseMla, BackwardMassEqualsAttentionMassWideRows) {
  Shape s;
  s.lengths = {200, 3, 131, 1, 90};
  s.H = 16;
  s.K = 128;
  s.seed = 11;
  check_backward_mass<double>(s);
  check_backward_mass<float>(s);
}

TEST(SparseMla, OneHeadValueEqualsKeyWidth) {
  Shape s;
  s.H = 1;
  s.D_v = s.D_qk;
  s.K = 5;
  check_forward<double>(s);
  check_backward<double>(s);
}

// No query rows: the key gradient is still fully written (zeros), whatever the buffer held.
TEST(SparseMla, NoQueriesGivesZeroDkv) {
  std::vector<float> dkv(5 * 16, std::numeric_limits<float>::quiet_NaN());
  const float kv[5 * 16] = {};
  flashdsa::SparseMlaBwdParams p;
  p.attn.dtype = flashdsa::DType::kFP32;
  p.attn.kv = kv;
  p.dkv = dkv.data();
  p.T = 0;
  p.T_kv = 5;
  p.attn.H = 2;
  p.topk.K = 4;
  p.attn.D_qk = 16;
  p.attn.D_v = 8;
  p.attn.scale = 0.25f;
  p.attn.kv_stride_t = 16;
  FDT_ASSERT_OK(flashdsa::run_sparse_mla_bwd(p));
  for (float x : dkv) EXPECT_EQ(x, 0.0f);
}

// Central differences of L = sum(out * dout) in fp64 against the backward's dq and dkv.
TEST(SparseMla, BackwardIsTheGradientOfTheForward) {
  Shape s;
  s.lengths = {6, 9};
  s.K = 8;
  Problem<double> pb(s);
  const auto fwd = run_forward(pb);
  std::vector<double> dq(pb.T * s.H * s.D_qk), dkv(pb.T_kv * s.D_qk);
  FDT_ASSERT_OK(flashdsa::run_sparse_mla_bwd(pb.sparse_bwd(fwd.out.data(), fwd.lse.data(), dq.data(), dkv.data())));

  auto loss = [&](Problem<double>& p) {
    const auto f = run_forward(p);
    double l = 0;
    for (size_t i = 0; i < f.out.size(); ++i) l += f.out[i] * p.dout.value[i];
    return l;
  };
  auto numeric = [&](Input<double>& x, int64_t t, int h, int d) {
    const double eps = 1e-6, x0 = x.value[(t * x.heads + h) * x.dim + d];
    x.set(t, h, d, x0 + eps);
    const double up = loss(pb);
    x.set(t, h, d, x0 - eps);
    const double down = loss(pb);
    x.set(t, h, d, x0);
    return (up - down) / (2 * eps);
  };
  Rng rng(3);
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t t = rng() % pb.T;
    const int h = static_cast<int>(rng() % s.H);
    const int d = static_cast<int>(rng() % s.D_qk);
    EXPECT_NEAR(dq[(t * s.H + h) * s.D_qk + d], numeric(pb.q, t, h, d), 1e-7) << "dq " << t << "," << h << "," << d;
    const int64_t key = rng() % pb.T_kv;
    EXPECT_NEAR(dkv[key * s.D_qk + d], numeric(pb.kv, key, 0, d), 1e-7) << "dkv " << key << "," << d;
    checked += dkv[key * s.D_qk + d] != 0;
  }
  EXPECT_GT(checked, 10) << "most sampled key rows should be selected somewhere";
}

}  // namespace
}  // namespace fdt
