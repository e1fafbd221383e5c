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

// The raw words (FLASHDSA_BWD_DET_RAW_BITS): any number of them, summed in any order, give after unbias exactly the sum
// of the pack(to_fixed) words — on values spread over the whole exact range of to_fixed, including ties and zeros.
TEST(FixedPair, RawWordsUnbiasToThePackedSums) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mag(-1.f, 1.f);
  for (int n : {1, 2, 7, 2048, 20000}) {
    for (float unit : {1.f, 1024.f, 3.0517578125e-05f}) {
      // |x * unit| < 2^22 / n keeps the final sums in range; the scale also tests tiny and large units
      const float lim = 4194303.f / static_cast<float>(n) / unit;
      std::vector<float> x(n), y(n);
      for (int i = 0; i < n; ++i) {
        x[i] = mag(rng) * lim;
        y[i] = (i % 5 == 0) ? 0.f : (i % 7 == 0 ? (0.5f + static_cast<float>(i % 3)) / unit : mag(rng) * lim);
      }
      uint64_t packed = 0;
      for (int i = 0; i < n; ++i) packed += fp::pack(fp::to_fixed(x[i], unit), fp::to_fixed(y[i], unit));
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      for (int rep = 0; rep < 3; ++rep) {
        std::shuffle(order.begin(), order.end(), rng);
        uint64_t raw = 0;
        for (int i : order) raw += fp::pack_raw(x[i], y[i], unit);
        ASSERT_EQ(fp::unbias(raw, n), packed) << "n " << n << " unit " << unit;
      }
    }
  }
  // single words at the edges: the top of to_fixed's exact range (fmaf lands on 2^24 above 4194303.5), -0, denormals,
  // ties, tiny and negative values
  const float edge[] = {4194303.75f, -4194303.75f, 4194303.5f, 4194303.f, -0.f, 0.f, 1e-40f, -1e-40f, 0.5f, -0.5f,
                        1.5f, -2.5f, 3.0e-8f, -123456.7f};
  for (float a : edge)
    for (float b : edge) {
      const uint64_t want = fp::pack(fp::to_fixed(a, 1.f), fp::to_fixed(b, 1.f));
      ASSERT_EQ(fp::unbias(fp::pack_raw(a, b, 1.f), 1), want) << a << " " << b;
      ASSERT_EQ(fp::unbias(fp::pack_raw(a, b, 1.f) + fp::pack_raw(b, a, 1.f), 2),
                want + fp::pack(fp::to_fixed(b, 1.f), fp::to_fixed(a, 1.f)))
          << a << " " << b;
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

// The rules' guarantees: the first unit keeps the guessed sum (Σ q / 2^5) and the floor (256 · max q / 2^4) within 2^30
// (the largest such power of two); a re-run unit keeps the measured largest addend within 2^21 units and the measured
// sum within 2^30; check_term caps what to_fixed cannot convert exactly (2^22 units or more).
TEST(FixedPair, RowRulesKeepTheirRanges) {
  for (double qsum : {0.0, 1e-6, 0.37, 4.0, 3e4, 1e9}) {
    for (float qmax : {0.f, 1e-7f, 0.01f, 4.f, 1e6f}) {
      const float u = fp::first_unit(qsum, qmax, 5, 4);
      const double guess = std::max(qsum / 32.0, 256.0 * qmax / 16.0);
      if (guess == 0.0) {
        EXPECT_EQ(u, std::ldexp(1.f, fp::kUnitMaxLog2));
        continue;
      }
      EXPECT_LE(u * guess, std::ldexp(1.0, 30)) << qsum << " " << qmax;
      EXPECT_GT(2.0 * u * guess, std::ldexp(1.0, 30)) << "the largest such power of two";
      EXPECT_LE(u * (qmax / 16.0), std::ldexp(1.0, 22)) << "an addend of max q / 2^4 converts exactly";
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
  EXPECT_EQ(fp::check_term(bits, 1048576.f), 3145728u);        // 3 · 2^20 units: within 2^22
  EXPECT_EQ(fp::check_term(bits, 2097152.f), fp::kCheckCap);   // 3 · 2^21 units: beyond
  const float just = 4194303.f / 1048576.f, at = 4.f;          // (2^22 - 1) / 2^20 and 2^22 / 2^20
  uint32_t jb = 0, ab = 0;
  std::memcpy(&jb, &just, sizeof jb);
  std::memcpy(&ab, &at, sizeof ab);
  EXPECT_EQ(fp::check_term(jb, 1048576.f), 4194303u);           // the last exact value
  EXPECT_EQ(fp::check_term(ab, 1048576.f), fp::kCheckCap);      // 2^22 itself is beyond to_fixed's range
  EXPECT_EQ(fp::to_fixed(-just, 1048576.f), -4194303);
  EXPECT_EQ(fp::check_term(0x7F800000u, 1.f), fp::kCheckCap);  // inf
  EXPECT_EQ(fp::check_term(0x7FC00000u, 1.f), fp::kCheckCap);  // NaN
  EXPECT_EQ(fp::check_term(0u, 1e30f), 0u);
}

// The per-row guess sums: integer terms that never under-state q / q_max (so Σ q is never under-estimated), any order
// gives the same sum, and what is not a positive finite q adds nothing.
TEST(FixedPair, GuessSumsAreConservativeAndOrderFree) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> lg(-40.0, 0.0);
  const float q_max = 3.75f;
  std::vector<float> q(5000);
  for (float& v : q) v = static_cast<float>(q_max * std::exp2(lg(rng)));
  q[0] = q_max;
  double exact = 0.0;
  uint64_t terms = 0;
  for (float v : q) {
    exact += v;
    const uint64_t t = fp::q_term(v, q_max);
    ASSERT_GE(std::ldexp(static_cast<double>(t), -fp::kQScaleLog2) * q_max, static_cast<double>(v));
    ASSERT_LE(t, uint64_t(1) << fp::kQScaleLog2);
    terms += t;
  }
  std::shuffle(q.begin(), q.end(), rng);
  uint64_t again = 0;
  for (float v : q) again += fp::q_term(v, q_max);
  EXPECT_EQ(again, terms);
  const double got = fp::q_sum(terms, q_max);
  EXPECT_GE(got, exact);
  EXPECT_LE(got, exact + 5000.0 * std::ldexp(double(q_max), -fp::kQScaleLog2));  // at most one quantum per term
  EXPECT_EQ(fp::q_term(0.f, q_max), 0u);
  EXPECT_EQ(fp::q_term(-1.f, q_max), 0u);
  EXPECT_EQ(fp::q_term(INFINITY, q_max), 0u);
  EXPECT_EQ(fp::q_term(NAN, q_max), 0u);
  EXPECT_EQ(fp::q_term(1.f, 0.f), 0u);
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

// q: each addend's guess (the token's A / K_t); q_max: the call's largest q (the scale of the guess sums)
RowResult run_row(const std::vector<std::vector<float>>& addends, const std::vector<float>& q, float q_max,
                  std::mt19937& rng) {
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
  uint64_t qsum = 0;
  float qtop = 0.f;
  for (float v : q) qsum += fp::q_term(v, q_max), qtop = std::max(qtop, v);
  std::vector<uint64_t> words(cols / 2);
  uint64_t check = 0;
  bool capped = false;
  uint32_t amax = 0;
  float unit = fp::first_unit(fp::q_sum(qsum, q_max), qtop, 5, 4);
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
  const float bound = 4.f;  // A: the P-free bound of one addend at P = 1 (every |value| below it)
  struct Kind {
    int n;       // addends of the row
    int kt;      // the tokens' valid keys: q = A / K_t
    float rel;   // typical |value| relative to q
    bool reran;  // expected
  };
  // diffuse rows (values ~ q / 64, as the check program's inputs give at H = 64; q / 40: still no re-run), peaky rows
  // (values ~ q / 8 and q: the first guess is too low — the sum beyond 2^31 or an addend beyond 2^22 units — and the
  // row re-runs from its measured sums), a short row of a token with 3 keys (diffuse, and peaky), a single addend
  const Kind kinds[] = {{2048, 2048, 1.f / 64, false}, {512, 2048, 1.f / 64, false}, {2048, 2048, 1.f / 40, false},
                        {2048, 2048, 1.f / 8, true},   {2048, 2048, 1.f, true},       {3, 3, 1.f / 64, false},
                        {3, 3, 1.f / 2, true},         {1, 1, 1.f / 64, false}};
  for (const Kind& kind : kinds) {
    const float q = bound / kind.kt;
    std::vector<std::vector<float>> add(kind.n, std::vector<float>(cols));
    for (auto& a : add)
      for (float& v : a) v = std::clamp(normal(rng) * kind.rel * q, -bound, bound);
    const std::vector<float> qs(kind.n, q);
    std::mt19937 order_a(1), order_b(2);
    const RowResult ra = run_row(add, qs, bound, order_a), rb = run_row(add, qs, bound, order_b);
    ASSERT_EQ(ra.reran, kind.reran) << "n " << kind.n << " rel " << kind.rel;
    ASSERT_EQ(0, std::memcmp(ra.value.data(), rb.value.data(), cols * sizeof(float))) << "order-dependent bits";
    double err = 0.0, ref = 0.0;
    for (int c = 0; c < cols; ++c) {
      double exact = 0.0;
      for (const auto& a : add) exact += a[c];
      err += (ra.value[c] - exact) * (ra.value[c] - exact);
      ref += exact * exact;
    }
    // fixed-point error ~ sqrt(n / 12) units against a row of magnitude ~ sqrt(n) x typical value: ~1e-6 for the
    // diffuse rows, less for the re-run rows
    EXPECT_LE(std::sqrt(err / std::max(ref, 1e-300)), 2e-5) << "n " << kind.n << " rel " << kind.rel;
  }
  // a non-finite addend: the check fails in both passes and the row is NaN, never a finite wrong value
  std::vector<std::vector<float>> add(64, std::vector<float>(cols, 0.01f));
  add[17][3] = NAN;
  std::mt19937 order(3);
  const RowResult r = run_row(add, std::vector<float>(64, bound / 64), bound, order);
  EXPECT_TRUE(r.reran);
  for (float v : r.value) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
