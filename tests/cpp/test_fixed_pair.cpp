// The fixed-point pair word of the sparse MLA backward's order-independent dkv reduction
// (csrc/sm90/sparse_mla_bwd/fixed_pair.h): rounding of to_fixed, exact pack / unpack, sums that do not depend on
// the order of their addends (also when intermediate sums wrap), and the limit of the exact range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "sm90/sparse_mla_bwd/fixed_pair.h"

namespace {

namespace fp = flashdsa::sm90::sparse_mla_bwd_impl::fixed_pair;

TEST(FixedPair, ToFixedRoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  for (float unit : {1.f, 1024.f, 1048576.f, 3.9e6f}) {
    for (int i = 0; i < 20000; ++i) {
      const float x = val(rng);
      const double scaled = static_cast<double>(x) * unit;  // exact in double (24 x 24 bits)
      ASSERT_LT(std::fabs(scaled), fp::kMaxScaled);
      const double want = std::nearbyint(scaled);  // default rounding mode: to nearest, ties to even
      ASSERT_EQ(fp::to_fixed(x, unit), static_cast<int32_t>(want)) << "x " << x << " unit " << unit;
    }
  }
  // ties go to the even integer; the range ends
  EXPECT_EQ(fp::to_fixed(0.5f, 1.f), 0);
  EXPECT_EQ(fp::to_fixed(1.5f, 1.f), 2);
  EXPECT_EQ(fp::to_fixed(-2.5f, 1.f), -2);
  EXPECT_EQ(fp::to_fixed(-0.f, 1.f), 0);
  EXPECT_EQ(fp::to_fixed(4194303.f, 1.f), 4194303);
  EXPECT_EQ(fp::to_fixed(-4194303.f, 1.f), -4194303);
}

TEST(FixedPair, PackUnpackIsExact) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> any(INT32_MIN, INT32_MAX);
  const int32_t edge[] = {0, 1, -1, INT32_MAX, INT32_MIN, INT32_MIN + 1, 123456789, -987654321};
  for (int32_t a : edge) {
    for (int32_t b : edge) {
      int32_t ra = 0, rb = 0;
      fp::unpack(fp::pack(a, b), ra, rb);
      ASSERT_EQ(ra, a);
      ASSERT_EQ(rb, b);
    }
  }
  for (int i = 0; i < 100000; ++i) {
    const int32_t a = any(rng), b = any(rng);
    int32_t ra = 0, rb = 0;
    fp::unpack(fp::pack(a, b), ra, rb);
    ASSERT_EQ(ra, a);
    ASSERT_EQ(rb, b);
  }
}

// Sums of packed words in shuffled orders: the same word every time, and it unpacks to the exact integer sums.
TEST(FixedPair, SumsAreExactAndOrderIndependent) {
  std::mt19937 rng(3);
  for (int n : {1, 2, 3, 64, 1000, 4096}) {
    // addends up to 2^22 in magnitude; the final sums are kept in range by construction (|sum| < n * 2^22 < 2^31
    // for n <= 511; larger n draw smaller addends)
    const int32_t lim = n <= 511 ? (1 << 22) - 1 : static_cast<int32_t>((1LL << 31) / n) - 1;
    std::uniform_int_distribution<int32_t> val(-lim, lim);
    std::vector<int32_t> a(n), b(n);
    for (int i = 0; i < n; ++i) a[i] = val(rng), b[i] = val(rng);
    const int64_t sa = std::accumulate(a.begin(), a.end(), int64_t{0});
    const int64_t sb = std::accumulate(b.begin(), b.end(), int64_t{0});
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    uint64_t first = 0;
    for (int rep = 0; rep < 5; ++rep) {
      std::shuffle(order.begin(), order.end(), rng);
      uint64_t sum = 0;
      for (int i : order) sum += fp::pack(a[i], b[i]);
      if (rep == 0) first = sum;
      ASSERT_EQ(sum, first) << "n " << n;
      int32_t ra = 0, rb = 0;
      fp::unpack(sum, ra, rb);
      ASSERT_EQ(ra, sa) << "n " << n;
      ASSERT_EQ(rb, sb) << "n " << n;
    }
  }
}

// Intermediate sums beyond the int32 range (in either half) do not matter, only the final ones.
TEST(FixedPair, IntermediateWrapIsHarmless) {
  std::vector<std::pair<int32_t, int32_t>> terms;
  for (int i = 0; i < 600; ++i) terms.push_back({(1 << 22) - 1, -((1 << 22) - 1)});  // +-2.5e9 after 600 terms
  for (int i = 0; i < 600; ++i) terms.push_back({-((1 << 22) - 1), (1 << 22) - 1});
  terms.push_back({-5, 7});
  uint64_t sum = 0;
  for (const auto& t : terms) sum += fp::pack(t.first, t.second);
  int32_t ra = 0, rb = 0;
  fp::unpack(sum, ra, rb);
  EXPECT_EQ(ra, -5);
  EXPECT_EQ(rb, 7);
}

// The limit: a final sum outside [-2^31, 2^31) does not come back (the unit must be chosen against it).
TEST(FixedPair, FinalOverflowIsNotRecovered) {
  uint64_t sum = 0;
  for (int i = 0; i < 600; ++i) sum += fp::pack((1 << 22) - 1, 1);  // A = 2.5e9 > 2^31 - 1
  int32_t ra = 0, rb = 0;
  fp::unpack(sum, ra, rb);
  EXPECT_NE(static_cast<int64_t>(ra), 600LL * ((1 << 22) - 1));
}

// The chain the kernel uses: float addends -> to_fixed -> pack -> any order -> unpack -> / unit equals the exactly
// rounded addends' sum, within n / 2 units of the exact float64 sum.
TEST(FixedPair, FloatRoundTrip) {
  std::mt19937 rng(5);
  std::normal_distribution<float> val(0.f, 1.f);
  const int n = 2048;
  const float unit = 65536.f;  // |x| < 8 for every draw here: |x * unit| < 2^19
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = std::clamp(val(rng), -7.f, 7.f), y[i] = std::clamp(val(rng), -7.f, 7.f);
  double ex = 0.0, ey = 0.0;
  int64_t fx = 0, fy = 0;
  uint64_t sum = 0;
  for (int i = n - 1; i >= 0; --i) {
    ex += x[i], ey += y[i];
    fx += fp::to_fixed(x[i], unit), fy += fp::to_fixed(y[i], unit);
    sum += fp::pack(fp::to_fixed(x[i], unit), fp::to_fixed(y[i], unit));
  }
  int32_t ra = 0, rb = 0;
  fp::unpack(sum, ra, rb);
  EXPECT_EQ(ra, fx);
  EXPECT_EQ(rb, fy);
  EXPECT_LE(std::fabs(ra / static_cast<double>(unit) - ex), 0.5 * n / unit);
  EXPECT_LE(std::fabs(rb / static_cast<double>(unit) - ey), 0.5 * n / unit);
}

// The unit of a row: the largest power of two u with u * x <= 2^30 (so a row of check sum x stays exact), clamped.
TEST(FixedPair, UnitForIsTheLargestSafePowerOfTwo) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> lg(-60.0, 60.0);
  for (int i = 0; i < 20000; ++i) {
    const double x = std::exp2(lg(rng));
    const float u = fp::unit_for(x, 30, -100, 100);
    int e = 0;
    ASSERT_EQ(std::frexp(u, &e), 0.5f) << "a power of two";
    ASSERT_LE(static_cast<double>(u) * x, std::ldexp(1.0, 30)) << x;
    ASSERT_GT(2.0 * u * x, std::ldexp(1.0, 30)) << x;
  }
  EXPECT_EQ(fp::unit_for(std::ldexp(1.0, 10), 30, -100, 100), std::ldexp(1.f, 20));  // exact powers of two
  EXPECT_EQ(fp::unit_for(std::ldexp(1.0, 10) * 1.0001, 30, -100, 100), std::ldexp(1.f, 19));
  EXPECT_EQ(fp::unit_for(0.0, 30, -100, 100), std::ldexp(1.f, 100));
  EXPECT_EQ(fp::unit_for(1e-200, 30, -100, 100), std::ldexp(1.f, 100));  // clamped
  EXPECT_EQ(fp::unit_for(1e200, 30, -100, 100), std::ldexp(1.f, -100));
  EXPECT_EQ(fp::unit_for(INFINITY, 30, -100, 100), std::ldexp(1.f, -100));
  EXPECT_EQ(fp::unit_for(NAN, 30, -100, 100), std::ldexp(1.f, -100));
}

// The rules' guarantees: the first unit keeps addends up to bound / 2^margin within 2^21 units and the guessed sum
// within 2^30; a re-run unit keeps the measured largest addend within 2^21 units and the measured sum within 2^30;
// check_term caps what to_fixed cannot convert exactly.
TEST(FixedPair, RowRulesKeepTheirRanges) {
  for (int n : {1, 7, 511, 512, 513, 2048, 1 << 20}) {
    for (double bound : {1e-6, 0.37, 4.0, 1e6}) {
      const float u = fp::first_unit(n, bound, 8);
      EXPECT_LE(u * (bound / 256.0), 2097152.0) << n << " " << bound;
      EXPECT_LE(u * std::max(n, 512) * (bound / 256.0), std::ldexp(1.0, 30)) << n << " " << bound;
      EXPECT_GT(2.0 * u * std::max(n, 512) * (bound / 256.0), std::ldexp(1.0, 30)) << "the largest such power of two";
    }
  }
  const float amax = 3.0f;
  uint32_t bits = 0;
  std::memcpy(&bits, &amax, sizeof bits);
  for (uint64_t check : {uint64_t(1) << 31, uint64_t(1) << 40}) {
    for (bool capped : {false, true}) {
      const float unit = 1024.f;
      const float u = fp::rerun_unit(check, capped, unit, 5000, bits);
      EXPECT_LE(amax * u, fp::kMaxAddendUnits);
      const double sum = capped ? 5000.0 * amax : double(check) / unit;
      EXPECT_LE(u * sum, std::ldexp(1.0, 30));
    }
  }
  EXPECT_EQ(fp::check_term(bits, 1024.f), 3072u);
  EXPECT_EQ(fp::check_term(bits, 1048576.f), fp::kCheckCap);  // 3 · 2^20 units: beyond 2^21
  EXPECT_EQ(fp::check_term(bits, 524288.f), 1572864u);         // 3 · 2^19 units: within
  EXPECT_EQ(fp::check_term(0x7F800000u, 1.f), fp::kCheckCap);  // inf
  EXPECT_EQ(fp::check_term(0x7FC00000u, 1.f), fp::kCheckCap);  // NaN
  EXPECT_EQ(fp::check_term(0u, 1e30f), 0u);
}

// The deterministic mode's per-row pipeline (det_fixed.cuh: first unit, pass 1, check, re-run, decode) run on the
// CPU with the same rules, one row of C columns per key: the decoded sums do not depend on the order of the addends,
// stay within n / 2 units of the exact sums, re-run only the rows the first guess under-estimated, and a row with a
// non-finite addend comes back as NaN.
struct RowResult {
  std::vector<float> value;
  bool reran = false;
};

uint32_t amax_bits(const std::vector<float>& x) {
  uint32_t m = 0;
  for (float v : x) {
    uint32_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    m = std::max(m, b & 0x7FFFFFFFu);
  }
  return m;
}

RowResult run_row(const std::vector<std::vector<float>>& addends, double bound, std::mt19937& rng) {
  const int n = static_cast<int>(addends.size()), cols = static_cast<int>(addends[0].size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto pass = [&](float unit, std::vector<uint64_t>& words, uint64_t& check, bool& capped, uint32_t& amax) {
    std::shuffle(order.begin(), order.end(), rng);
    std::fill(words.begin(), words.end(), 0);
    check = 0;
    capped = false;
    amax = 0;
    for (int i : order) {
      const auto& x = addends[i];
      for (int c = 0; c < cols; c += 2) words[c / 2] += fp::pack(fp::to_fixed(x[c], unit), fp::to_fixed(x[c + 1], unit));
      const uint32_t m = amax_bits(x);
      const uint64_t t = fp::check_term(m, unit);
      check += t;
      capped = capped || t == fp::kCheckCap;
      amax = std::max(amax, m);
    }
  };
  std::vector<uint64_t> words(cols / 2);
  uint64_t check = 0;
  bool capped = false;
  uint32_t amax = 0;
  float unit = fp::first_unit(n, bound, 8);
  pass(unit, words, check, capped, amax);
  RowResult r;
  if (check >= fp::kCheckExact) {
    r.reran = true;
    unit = fp::rerun_unit(check, capped, unit, n, amax);
    pass(unit, words, check, capped, amax);
  }
  r.value.resize(cols);
  for (int c = 0; c < cols; c += 2) {
    if (check >= fp::kCheckExact) {
      r.value[c] = r.value[c + 1] = NAN;
    } else {
      fp::decode(words[c / 2], 1.f / unit, r.value[c], r.value[c + 1]);
    }
  }
  return r;
}

TEST(FixedPair, RowPipelineIsExactOrderFreeAndSafe) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int cols = 16;
  const float bound = 4.f;  // the P-free bound of one addend (every |value| below it)
  struct Kind {
    int n;
    float scale;  // typical |value| relative to the bound
    bool reran;   // expected
  };
  // diffuse rows (values ~ bound / 2^11, the P ~ 1 / K case; 2^10: still no re-run), peaky rows (values above
  // ~ bound / 2^8: the first guess is too low — an addend beyond 2^21 units or the sum beyond 2^31 — and the row
  // re-runs from its measured sums), a short peaky row, a single diffuse addend
  const Kind kinds[] = {{2048, 1.f / 2048, false}, {512, 1.f / 2048, false}, {2048, 1.f / 1024, false},
                        {2048, 1.f / 64, true},    {2048, 1.f / 4, true},    {3, 1.f / 4, true},
                        {1, 1.f / 2048, false}};
  for (const Kind& kind : kinds) {
    std::vector<std::vector<float>> add(kind.n, std::vector<float>(cols));
    for (auto& a : add)
      for (float& v : a) v = std::clamp(normal(rng) * kind.scale * bound, -bound, bound);
    std::mt19937 order_a(1), order_b(2);
    const RowResult ra = run_row(add, bound, order_a), rb = run_row(add, bound, order_b);
    ASSERT_EQ(ra.reran, kind.reran) << "n " << kind.n << " scale " << kind.scale;
    ASSERT_EQ(0, std::memcmp(ra.value.data(), rb.value.data(), cols * sizeof(float))) << "order-dependent bits";
    double err = 0.0, ref = 0.0;
    for (int c = 0; c < cols; ++c) {
      double exact = 0.0;
      for (const auto& a : add) exact += a[c];
      err += (ra.value[c] - exact) * (ra.value[c] - exact);
      ref += exact * exact;
    }
    // fixed-point error ~ sqrt(n / 12) units against a row of magnitude ~ sqrt(n) x typical value: ~4e-6 for the
    // diffuse rows with the first guess 3 bits coarse, ~1e-6 for the re-run rows
    EXPECT_LE(std::sqrt(err / std::max(ref, 1e-300)), 2e-5) << "n " << kind.n << " scale " << kind.scale;
  }
  // a non-finite addend: the check fails in both passes and the row is NaN, never a finite wrong value
  std::vector<std::vector<float>> add(64, std::vector<float>(cols, 0.01f));
  add[17][3] = NAN;
  std::mt19937 order(3);
  const RowResult r = run_row(add, bound, order);
  EXPECT_TRUE(r.reran);
  for (float v : r.value) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
