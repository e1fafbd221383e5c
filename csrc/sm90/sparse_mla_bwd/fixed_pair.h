// Internal: two signed 32-bit fixed-point values in one 64-bit word, for an order-independent (hence bitwise
// reproducible) dkv reduction with `red.global.add.u64` (docs/perf-notes.md, twenty-third session), and the per-row
// rules of the deterministic mode built on it. Plain arithmetic, compiled for the device by the sparse MLA backward's
// deterministic mode (kernel_common.cuh, det_fixed.cuh) and for the host by tests/cpp/test_fixed_pair.cpp.
//
// Why a pair: the L2 reduces 64-bit integer adds at the same rate in bytes as the fast mode's 16-byte float adds
// (bench/micro/red_rate.cu, 3.86 TB/s for full lines), so one u64 that carries two values moves dkv at the fast
// mode's value rate, where one 64-bit value per column would halve it and 32-bit integer adds need whole lines per
// instruction that the accumulator layout does not give.
//
// How: a pair (a, b) is stored as the 64-bit integer b * 2^32 + a (a sign-extended). Integer addition modulo 2^64 is
// associative and commutative, so the sum of any number of such words, in any order, is B * 2^32 + A mod 2^64 with
// A = sum of the a's and B = sum of the b's; intermediate sums may wrap. If the final A and B lie in
// [-2^31, 2^31), `unpack` returns them exactly: the low 32 bits are A, and subtracting A sign-extended leaves B in
// the high half. Overflow of a final sum is not detectable from the word itself: the rules at the end of this file
// prove it absent per row (Σ ⌈max |x| · unit⌉ < 2^31) or send the row again with a safe unit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLASHDSA_FIXED_HD __host__ __device__ __forceinline__
#else
#define FLASHDSA_FIXED_HD inline
#endif

namespace flashdsa::sm90::sparse_mla_bwd_impl::fixed_pair {

// 1.5 * 2^23: x * unit + kMagic, rounded once to fp32 (a fused multiply-add), has the unit grid (1.0) as its last
// place, so its bits minus kMagic's are x * unit rounded to the nearest integer (ties to even).
constexpr float kMagic = 12582912.0f;
constexpr uint32_t kMagicBits = 0x4B400000u;
// to_fixed is exact (round to nearest) for |x * unit| < 2^22.
constexpr float kMaxScaled = 4194304.0f;

// The bits of a float as an unsigned integer and back (a 4-byte copy: one move on both sides).
template <class To, class From>
FLASHDSA_FIXED_HD To bit_copy(From x) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To y;
  std::memcpy(&y, &x, sizeof y);
  return y;
}
FLASHDSA_FIXED_HD uint32_t float_bits(float f) { return bit_copy<uint32_t>(f); }
FLASHDSA_FIXED_HD float bits_float(uint32_t u) { return bit_copy<float>(u); }

// x * unit + kMagic, rounded once (a fused multiply-add).
FLASHDSA_FIXED_HD float magic_fma(float x, float unit) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, unit, kMagic);
#else
  return std::fmaf(x, unit, kMagic);
#endif
}

// x * unit rounded to the nearest integer (ties to even), for |x * unit| < 2^22: one FFMA and one integer add.
FLASHDSA_FIXED_HD int32_t to_fixed(float x, float unit) {
  return static_cast<int32_t>(float_bits(magic_fma(x, unit)) - kMagicBits);
}

// The word b * 2^32 + a (mod 2^64, a sign-extended).
FLASHDSA_FIXED_HD uint64_t pack(int32_t a, int32_t b) {
  const uint32_t hi = static_cast<uint32_t>(b) + (a < 0 ? 0xFFFFFFFFu : 0u);
  return (static_cast<uint64_t>(hi) << 32) | static_cast<uint32_t>(a);
}

// The pair (A, B) of a sum of packed words, exact when both lie in [-2^31, 2^31).
FLASHDSA_FIXED_HD void unpack(uint64_t sum, int32_t& a, int32_t& b) {
  a = static_cast<int32_t>(static_cast<uint32_t>(sum));
  const uint64_t a_ext = static_cast<uint64_t>(static_cast<int64_t>(a));
  b = static_cast<int32_t>(static_cast<uint32_t>((sum - a_ext) >> 32));
}

// The largest power of two u = 2^e with u · x <= 2^target (e clamped to [min_e, max_e]): the unit of a row whose
// check sum (Σ |addend|) is at most x. x <= 0 gives 2^max_e, x infinite or NaN 2^min_e.
FLASHDSA_FIXED_HD float unit_for(double x, int target, int min_e, int max_e) {
  int e = max_e;
  if (!(x < 1e300)) {
    e = min_e;
  } else if (x > 0.0) {
    int ex = 0;
    const double m = std::frexp(x, &ex);  // x = m · 2^ex, m in [0.5, 1): log2 x in [ex - 1, ex)
    e = target - ex + (m == 0.5 ? 1 : 0);
    e = e < min_e ? min_e : (e > max_e ? max_e : e);
  }
  return std::ldexp(1.f, e);
}

// ---- the per-row rules of the deterministic mode with fixed-point pairs (det_fixed.cuh; CPU-tested) ----------------
//
// Each addend is converted by to_fixed (one FFMA: exact only below 2^22 units), so a row is proven exact when (a) every
// addend is below 2^22 units (checked exactly: max |addend| · unit is exact for a power-of-two unit) and (b) Σ ⌈max
// |addend| · unit⌉ < 2^31 (then every pair sum fits its 32-bit half). The first unit is a guess (below); a row whose
// check fails is sent again with a unit from its measured sums that satisfies (a) with a factor 2 to spare and (b).

constexpr uint64_t kCheckCap = uint64_t(1) << 32;    // an addend beyond (a), or not finite: fails the row by itself
constexpr uint64_t kCheckExact = uint64_t(1) << 31;  // a check sum below this proves the row's pair sums exact
constexpr float kMaxAddendUnits = 2097152.0f;        // 2^21: what a re-run unit guarantees for the largest addend
constexpr int kUnitTargetLog2 = 30;                  // unit · S <= 2^30
constexpr double kAddendShare = 512.0;               // 2^30 / 2^21: a re-run's S >= 512 · max |addend|
constexpr double kFirstShare = 256.0;                // 2^30 / 2^22: the first guess's floor (a) (no factor spare)
constexpr int kUnitMinLog2 = -126, kUnitMaxLog2 = 126;  // 1 / unit stays a normal float: the decode is exact
constexpr int kQScaleLog2 = 32;                      // the per-row guess sums: q / q_max in units of 2^-32

// An addend's share of its row's check sum: ⌈max |value| · unit⌉ from the bits of max |value| (as the kernel keeps
// it: an unsigned max of |x| bits, so NaN / inf order above every finite value); kCheckCap when that is 2^22 or more
// (to_fixed was not exact) or not finite. unit is a power of two, so the product is exact.
FLASHDSA_FIXED_HD uint64_t check_term(uint32_t amax_bits, float unit) {
  if (amax_bits >= 0x7F800000u) return kCheckCap;
  const float y = bits_float(amax_bits) * unit;
  if (!(y < kMaxScaled)) return kCheckCap;
  return static_cast<uint64_t>(std::ceil(y));
}

// The first unit's inputs are per-occurrence guesses q = A / K_t of one addend's size (A: the P-free bound of the
// token's head group, K_t: the token's valid keys, so q is the bound at the mean probability 1 / K_t); a row gets
// their sum and their largest value. The sum is kept exactly in integers (order-independent) as ⌈q / q_max · 2^32⌉
// terms, q_max the call's largest finite q: a term never under-states its q.
FLASHDSA_FIXED_HD uint64_t q_term(float q, float q_max) {
  if (!(q > 0.f) || !(q <= q_max)) return 0;  // zero, or not finite (the row's largest q marks those rows)
  return static_cast<uint64_t>(std::ceil(std::ldexp(static_cast<double>(q) / static_cast<double>(q_max), kQScaleLog2)));
}
FLASHDSA_FIXED_HD double q_sum(uint64_t terms, float q_max) {
  return std::ldexp(static_cast<double>(terms), -kQScaleLog2) * static_cast<double>(q_max);
}

// The first unit of a row from its guesses: Σ q (the row's check sum at the mean probabilities) and max q (its
// largest addend), each taken 2^margin below (the bound ignores the signs that cancel in the head sums: on the check
// program's inputs max |addend| ≈ 2^-6 q at H = 64, 2^-5 at H = 16; docs/perf-notes.md, twenty-fourth session), with
// the floor (a) on the largest addend.
FLASHDSA_FIXED_HD float first_unit(double q_sum_value, float q_max_row, int sum_margin_log2, int max_margin_log2) {
  const double s = std::ldexp(q_sum_value, -sum_margin_log2);
  const double m = kFirstShare * std::ldexp(static_cast<double>(q_max_row), -max_margin_log2);
  return unit_for(s > m ? s : m, kUnitTargetLog2, kUnitMinLog2, kUnitMaxLog2);
}

// The unit of a row whose check failed at `unit`: from its measured largest addend `amax` (a non-finite one gives the
// smallest unit: the row fails again and is decoded as NaN) and Σ |addend| <= check / unit, or n · amax when an addend
// was capped (its share of `check` is then not a measure).
FLASHDSA_FIXED_HD float rerun_unit(uint64_t check, bool capped, float unit, int n, uint32_t amax_bits) {
  if (amax_bits >= 0x7F800000u) return unit_for(INFINITY, kUnitTargetLog2, kUnitMinLog2, kUnitMaxLog2);
  const float amax = bits_float(amax_bits);
  const double sum = capped ? double(n) * amax : double(check) / double(unit);
  const double share = kAddendShare * amax;
  return unit_for(sum > share ? sum : share, kUnitTargetLog2, kUnitMinLog2, kUnitMaxLog2);
}

// The raw form of a pair (the deterministic emission's words since the twenty-ninth session, docs/perf-notes.md): the
// bits of fmaf(y, unit, kMagic) and fmaf(x, unit, kMagic) as they are, t_y * 2^32 + t_x — two FFMA, no integer work. For
// |x * unit|, |y * unit| < 2^22 each half is kMagicBits + to_fixed(.), so a sum of n raw words minus
// n * kMagicBits * (2^32 + 1) (unbias, mod 2^64) is the sum of the n words pack(to_fixed(x), to_fixed(y)), bit for bit.
FLASHDSA_FIXED_HD uint64_t pack_raw(float x, float y, float unit) {
  const float tx = magic_fma(x, unit), ty = magic_fma(y, unit);
  return (static_cast<uint64_t>(float_bits(ty)) << 32) | float_bits(tx);
}
// The sum of n raw words -> the sum of their pack(to_fixed) words (n: the row's addend count, fix_count_kernel).
FLASHDSA_FIXED_HD uint64_t unbias(uint64_t raw_sum, int64_t n) {
  return raw_sum - static_cast<uint64_t>(n) * (static_cast<uint64_t>(kMagicBits) * 0x100000001ull);
}

// The two values of a row's pair word, times 1 / unit (exact: a power of two).
FLASHDSA_FIXED_HD void decode(uint64_t word, float inv_unit, float& x, float& y) {
  int32_t a = 0, b = 0;
  unpack(word, a, b);
  x = static_cast<float>(a) * inv_unit;
  y = static_cast<float>(b) * inv_unit;
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl::fixed_pair
