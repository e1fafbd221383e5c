// The FP8 (e4m3) indexer on the CPU backend (docs/spec.md §3 "FP8 selection"): the e4m3 conversions
// of include/flashdsa/types.h, run_quantize_fp8, the validation of a kFP8E4M3 indexer, and the FP8
// selection of indexer_topk (exactly the unquantized result when every visible key is a candidate;
// every returned score an exact score otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "problem.h"

namespace fdt {
namespace {

using flashdsa::fp8_e4m3;

float f8(uint8_t bits) { return flashdsa::fp8_e4m3_to_float(fp8_e4m3{bits}); }
uint8_t to8(float x) { return flashdsa::float_to_fp8_e4m3(x).bits; }

TEST(Fp8E4M3, EveryCodeRoundTripsAndDecodesToItsValue) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(f8(b)));
      continue;
    }
    const double mag = e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp(m / 8.0, -6);
    EXPECT_EQ(f8(b), static_cast<float>((b & 0x80) ? -mag : mag)) << "code " << c;
    EXPECT_EQ(to8(f8(b)), b) << "code " << c;
  }
  EXPECT_EQ(f8(0x7e), 448.f);
  EXPECT_EQ(f8(0x01), std::ldexp(1.f, -9));
}

TEST(Fp8E4M3, RoundsToNearestEvenAndSaturates) {
  // Between 1 (0x38) and 1.125 (0x39): the midpoint goes to the even code, others to the nearest.
  EXPECT_EQ(to8(1.0625f), 0x38);
  EXPECT_EQ(to8(std::nextafter(1.0625f, 2.f)), 0x39);
  EXPECT_EQ(to8(1.1875f), 0x3a);  // midpoint of 1.125 (odd) and 1.25 (even)
  // Subnormals: step 2^-9; half of the smallest goes to 0 (even), a bit more to 1.
  EXPECT_EQ(to8(std::ldexp(1.f, -10)), 0x00);
  EXPECT_EQ(to8(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(to8(std::ldexp(7.5f, -9)), 0x08);  // rounds up into the smallest normal (even)
  EXPECT_EQ(to8(-0.f), 0x80);
  // Saturation of finite values, NaN for NaN and +-Inf.
  EXPECT_EQ(to8(448.f), 0x7e);
  EXPECT_EQ(to8(460.f), 0x7e);
  EXPECT_EQ(to8(1e30f), 0x7e);
  EXPECT_EQ(to8(-1e30f), 0xfe);
  EXPECT_EQ(to8(std::numeric_limits<float>::infinity()), 0x7f);
  EXPECT_EQ(to8(-std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(to8(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  // Against the value ladder: every float rounds to one of its two neighbouring codes, the nearer.
  Rng rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-12, 9);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(u(rng) * std::ldexp(1.0, e(rng)));
    const float r = f8(to8(x));
    for (int c = 0; c < 0x7f; ++c) {  // no positive code is strictly nearer
      ASSERT_LE(std::fabs(std::fabs(x) - std::fabs(r)), std::fabs(std::fabs(x) - f8(static_cast<uint8_t>(c))))
          << x << " -> " << r << " but code " << c << " = " << f8(static_cast<uint8_t>(c));
    }
  }
}

TEST(QuantizeFp8, ScalesCodesZeroAndNonFiniteRows) {
  // x [3, 2, 8] with row stride 20 and head stride 9.
  const int N0 = 3, N1 = 2, D = 8;
  const int64_t s0 = 20, s1 = 9;
  std::vector<float> x(N0 * s0, 1234.f);
  Rng rng(3);
  std::uniform_real_distribution<double> u(-3, 3);
  for (int r = 0; r < N0 * N1; ++r)
    for (int d = 0; d < D; ++d) x[(r / N1) * s0 + (r % N1) * s1 + d] = static_cast<float>(u(rng));
  for (int d = 0; d < D; ++d) x[1 * s0 + 0 * s1 + d] = 0.f;                  // zero row
  x[2 * s0 + 1 * s1 + 5] = std::numeric_limits<float>::quiet_NaN();          // NaN row
  x[0 * s0 + 1 * s1 + 2] = -std::numeric_limits<float>::infinity();          // Inf row
  std::vector<uint8_t> out(N0 * N1 * D, 0x55);
  std::vector<float> scale(N0 * N1, -1.f);
  flashdsa::QuantizeFp8Params p;
  p.dtype = flashdsa::DType::kFP32;
  p.x = x.data();
  p.N0 = N0, p.N1 = N1, p.D = D, p.stride0 = s0, p.stride1 = s1;
  p.out = out.data();
  p.scale = scale.data();
  FDT_ASSERT_OK(flashdsa::run_quantize_fp8(p));
  for (int r = 0; r < N0 * N1; ++r) {
    const float* row = &x[(r / N1) * s0 + (r % N1) * s1];
    if (r == 1 || r == 5) {  // the Inf row and the NaN row
      EXPECT_TRUE(std::isnan(scale[r])) << r;
      for (int d = 0; d < D; ++d) EXPECT_EQ(out[r * D + d], 0x7f);
      continue;
    }
    float amax = 0;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(row[d]));
    EXPECT_EQ(scale[r], amax == 0 ? 1.f : amax / 448.f) << r;
    float back_max = 0;
    for (int d = 0; d < D; ++d) {
      EXPECT_EQ(out[r * D + d], to8(row[d] / scale[r]));
      const double deq = double(f8(out[r * D + d])) * scale[r];
      EXPECT_LE(std::fabs(deq - row[d]), std::max(std::fabs(row[d]) / 16.0, scale[r] / 1024.0) * (1 + 1e-6));
      back_max = std::max(back_max, std::fabs(f8(out[r * D + d])));
    }
    EXPECT_EQ(back_max, amax == 0 ? 0.f : 448.f);
  }
  // Missing output, bad stride.
  p.scale = nullptr;
  EXPECT_EQ(flashdsa::run_quantize_fp8(p).code(), flashdsa::StatusCode::kInvalidArgument);
  p.scale = scale.data();
  p.stride1 = 4;
  EXPECT_EQ(flashdsa::run_quantize_fp8(p).code(), flashdsa::StatusCode::kInvalidArgument);
}

// A problem, its e4m3 copies, and the FP8 params (rescore = the problem's tensors).
template <class Act>
struct Fp8Case {
  Problem<Act> pb;
  std::vector<uint8_t> q8, k8;
  std::vector<float> qs, ks, w8;

  explicit Fp8Case(const Shape& s) : pb(s) {
    const int H = s.H_I, D = s.D_I;
    q8.resize(pb.T * H * D), k8.resize(pb.T_kv * D), qs.resize(pb.T * H), ks.resize(pb.T_kv), w8.resize(pb.T * H);
    flashdsa::QuantizeFp8Params p;
    p.dtype = dtype_of<Act>();
    p.x = pb.q_idx.data(), p.N0 = pb.T, p.N1 = H, p.D = D;
    p.stride0 = pb.q_idx.stride_t, p.stride1 = pb.q_idx.stride_h, p.out = q8.data(), p.scale = qs.data();
    EXPECT_TRUE(flashdsa::run_quantize_fp8(p).ok());
    p.x = pb.k_idx.data(), p.N0 = pb.T_kv, p.N1 = 1;
    p.stride0 = pb.k_idx.stride_t, p.stride1 = D, p.out = k8.data(), p.scale = ks.data();
    EXPECT_TRUE(flashdsa::run_quantize_fp8(p).ok());
    for (int64_t t = 0; t < pb.T; ++t)
      for (int h = 0; h < H; ++h) w8[t * H + h] = static_cast<float>(pb.weights.value[t * H + h]);
  }

  flashdsa::IndexerTopkParams params(int32_t* idx, void* scores, int candidates) const {
    flashdsa::IndexerTopkParams p = pb.indexer_topk(idx, static_cast<StatOf<Act>*>(scores));
    p.rescore = p.indexer;
    p.indexer.dtype = flashdsa::DType::kFP8E4M3;
    p.indexer.q_idx = q8.data();
    p.indexer.k_idx = k8.data();
    p.indexer.q_idx_stride_t = int64_t(pb.shape.H_I) * pb.shape.D_I;
    p.indexer.q_idx_stride_h = pb.shape.D_I;
    p.indexer.k_idx_stride_t = pb.shape.D_I;
    p.indexer.weights = w8.data();
    p.indexer.weights_stride_t = pb.shape.H_I;
    p.indexer.q_idx_scale = qs.data();
    p.indexer.k_idx_scale = ks.data();
    p.candidates = candidates;
    return p;
  }
};

template <class Act>
void check_short_rows_equal_exact() {
  Shape s;
  s.lengths = {40, 3, 90};
  s.K = 16;
  const Fp8Case<Act> c(s);
  using Stat = StatOf<Act>;
  std::vector<int32_t> idx8(c.pb.T * s.K), idx(c.pb.T * s.K);
  std::vector<Stat> sc8(c.pb.T * s.K), sc(c.pb.T * s.K);
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(c.params(idx8.data(), sc8.data(), 96)));  // >= every row's keys
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(c.pb.indexer_topk(idx.data(), sc.data())));
  EXPECT_EQ(idx8, idx);
  EXPECT_EQ(0, std::memcmp(sc8.data(), sc.data(), sc.size() * sizeof(Stat)));
}

TEST(IndexerTopkFp8, RowsWithinTheCandidatesEqualTheExactOp) {
  check_short_rows_equal_exact<bf16>();
  check_short_rows_equal_exact<float>();
  check_short_rows_equal_exact<double>();
}

TEST(IndexerTopkFp8, LongRowsReturnExactScoresOfCandidates) {
  Shape s;
  s.lengths = {300, 7};
  s.K = 8;
  s.H_I = 4, s.D_I = 32;
  const Fp8Case<float> c(s);
  const int C = 24;
  std::vector<int32_t> idx8(c.pb.T * s.K), idx(c.pb.T * s.K);
  std::vector<float> sc8(c.pb.T * s.K), sc(c.pb.T * s.K);
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(c.params(idx8.data(), sc8.data(), C)));
  const ref::Indexer ix = c.pb.ref_indexer();
  int64_t recalled = 0, total = 0;
  FDT_ASSERT_OK(flashdsa::run_indexer_topk(c.pb.indexer_topk(idx.data(), sc.data())));
  for (int64_t t = 0; t < c.pb.T; ++t) {
    const int64_t n = std::min<int64_t>(s.K, c.pb.batch.k_end[t] - c.pb.batch.k_start[t]);
    for (int j = 0; j < s.K; ++j) {
      const int32_t key = idx8[t * s.K + j];
      if (j >= n) {
        EXPECT_EQ(key, -1);
        continue;
      }
      ASSERT_GE(key, c.pb.batch.k_start[t]);
      ASSERT_LT(key, c.pb.batch.k_end[t]);
      EXPECT_NEAR(sc8[t * s.K + j], ix.score(t, key), 1e-4) << "row " << t;
      recalled += std::count(&idx[t * s.K], &idx[t * s.K] + n, key);
      ++total;
    }
  }
  // The quantization misranks few keys: most of the exact top K is recalled.
  EXPECT_GT(double(recalled) / double(total), 0.9);
}

TEST(IndexerTopkFp8, Validation) {
  Shape s;
  const Fp8Case<bf16> c(s);
  std::vector<int32_t> idx(c.pb.T * s.K);
  std::vector<float> sc(c.pb.T * s.K);
  const auto invalid = [](const flashdsa::IndexerTopkParams& p) {
    return flashdsa::validate(p).code() == flashdsa::StatusCode::kInvalidArgument;
  };
  flashdsa::IndexerTopkParams p = c.params(idx.data(), sc.data(), 0);
  FDT_ASSERT_OK(flashdsa::validate(p));
  p.indexer.q_idx_scale = nullptr;  // scales are required
  EXPECT_TRUE(invalid(p));
  p = c.params(idx.data(), sc.data(), 0);
  p.rescore.q_idx = nullptr;  // so are the re-score inputs
  EXPECT_TRUE(invalid(p));
  p = c.params(idx.data(), sc.data(), 0);
  p.rescore.D_I = 16;  // of the same shape
  EXPECT_TRUE(invalid(p));
  p = c.params(idx.data(), sc.data(), s.K - 1);  // candidates >= K
  EXPECT_TRUE(invalid(p));
  p = c.params(idx.data(), sc.data(), 0);
  p.rescore.dtype = flashdsa::DType::kFP8E4M3;  // the re-score is unquantized
  EXPECT_TRUE(invalid(p));
  // Scales on a bf16 indexer, and an e4m3 indexer anywhere but indexer_topk.
  flashdsa::IndexerTopkParams b = c.pb.indexer_topk(idx.data(), sc.data());
  b.indexer.k_idx_scale = c.ks.data();
  EXPECT_FALSE(flashdsa::validate(b).ok());
  std::vector<float> loss(c.pb.T), mass(c.pb.T * s.K, 1.f);
  flashdsa::SparseKlParams kl = c.pb.sparse_kl(mass.data());
  kl.loss_rows = loss.data();
  kl.indexer.dtype = flashdsa::DType::kFP8E4M3;
  EXPECT_FALSE(flashdsa::validate_fwd(kl).ok());
}

}  // namespace
}  // namespace fdt
