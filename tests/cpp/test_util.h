// Test helpers: typed random inputs with their exact double values, strided storage, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "flashdsa/flashdsa.h"

namespace fdt {

using flashdsa::bf16;
using Rng = std::mt19937_64;

inline double to_double(bf16 v) { return flashdsa::bf16_to_float(v); }
inline double to_double(float v) { return v; }
inline double to_double(double v) { return v; }

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return flashdsa::float_to_bf16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
constexpr flashdsa::DType dtype_of() {
  if constexpr (std::is_same_v<T, bf16>) return flashdsa::DType::kBF16;
  if constexpr (std::is_same_v<T, float>) return flashdsa::DType::kFP32;
  return flashdsa::DType::kFP64;
}

// Statistic type of an activation type (ops.h: fp64 for fp64 activations, else fp32).
template <class Act>
using StatOf = std::conditional_t<std::is_same_v<Act, double>, double, float>;

template <class T>
std::vector<double> to_doubles(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_double(v[i]);
  return out;
}

// A [rows, heads, dim] input stored with strides (stride_t, stride_h, 1) in type T, and its logical
// contiguous values in double (exactly the values the op reads). Padding holds NaN, so an op that
// reads outside the logical tensor poisons its results.
template <class T>
struct Input {
  std::vector<T> storage;
  std::vector<double> value;  // [rows, heads, dim]
  int64_t rows = 0, stride_t = 0, stride_h = 0;
  int heads = 0, dim = 0;

  const T* data() const { return storage.data(); }
  T* data() { return storage.data(); }
  int64_t offset(int64_t t, int h, int d) const { return t * stride_t + h * stride_h + d; }
  // Sets one logical element (used by finite-difference checks).
  void set(int64_t t, int h, int d, double x) {
    storage[offset(t, h, d)] = from_double<T>(x);
    value[(t * heads + h) * dim + d] = to_double(storage[offset(t, h, d)]);
  }
};

// Uniform values in [lo, hi) rounded to T. pad_h / pad_t: extra elements after each head / row.
template <class T>
Input<T> random_input(int64_t rows, int heads, int dim, double lo, double hi, Rng& rng, int pad_h = 0, int pad_t = 0) {
  Input<T> in;
  in.rows = rows;
  in.heads = heads;
  in.dim = dim;
  in.stride_h = dim + pad_h;
  in.stride_t = heads * in.stride_h + pad_t;
  in.storage.assign(std::max<int64_t>(rows * in.stride_t, 1), from_double<T>(std::numeric_limits<double>::quiet_NaN()));
  in.value.resize(rows * heads * dim);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t t = 0; t < rows; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < dim; ++d) in.set(t, h, d, dist(rng));
  return in;
}

// A packed THD batch: cu_seqlens and the causal key ranges of build_key_ranges.
struct Batch {
  std::vector<int32_t> cu_seqlens, k_start, k_end;
  int64_t T = 0;
};

inline Batch thd_batch(const std::vector<int32_t>& lengths) {
  Batch b;
  b.cu_seqlens.push_back(0);
  for (int32_t len : lengths) b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
  b.T = b.cu_seqlens.back();
  b.k_start.resize(b.T);
  b.k_end.resize(b.T);
  const auto st = flashdsa::build_key_ranges(b.cu_seqlens.data(), static_cast<int>(lengths.size()),
                                             b.k_start.data(), b.k_end.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return b;
}

// Top-k indices [T, K] exercising every case the sparse ops must handle: valid keys of the row's
// range (with duplicates), -1, entries past either end of [0, T_kv), rows of only empty slots
// (every `empty_row_every`-th row), and valid keys outside the row's causal range.
inline std::vector<int32_t> messy_indices(const Batch& b, int64_t T_kv, int K, Rng& rng, int empty_row_every = 7) {
  std::vector<int32_t> idx(b.T * K);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t t = 0; t < b.T; ++t) {
    const int64_t n = b.k_end[t] - b.k_start[t];
    for (int j = 0; j < K; ++j) {
      const double r = u(rng);
      int32_t v;
      if (t % empty_row_every == 3) v = -1;
      else if (r < 0.65 && n > 0) v = static_cast<int32_t>(b.k_start[t] + static_cast<int64_t>(u(rng) * n));
      else if (r < 0.75) v = -1;
      else if (r < 0.8) v = static_cast<int32_t>(T_kv + static_cast<int64_t>(u(rng) * 5));
      else if (r < 0.85) v = -2 - static_cast<int32_t>(u(rng) * 5);
      else v = static_cast<int32_t>(u(rng) * T_kv);
      idx[t * K + j] = v;
    }
    // A guaranteed duplicate in every non-empty row.
    if (K >= 2 && idx[t * K] >= 0 && idx[t * K] < T_kv) idx[t * K + K - 1] = idx[t * K];
  }
  return idx;
}

// Largest |ref|, at least `floor` (so all-zero references compare with an absolute tolerance).
inline double max_abs(const std::vector<double>& v, double floor = 1e-30) {
  double m = floor;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Every element: |got - ref| <= rtol_elem * |ref| + rtol_max * max|ref|. Infinities must match
// exactly. Reports the worst element.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& ref, double rtol_elem,
                         double rtol_max, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double scale = max_abs(ref, 0.0);
  double worst = 0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      ASSERT_EQ(got[i], ref[i]) << what << "[" << i << "]";
      continue;
    }
    const double err = std::abs(got[i] - ref[i]);
    const double tol = rtol_elem * std::abs(ref[i]) + rtol_max * scale;
    ASSERT_FALSE(std::isnan(got[i])) << what << "[" << i << "] is NaN";
    if (err / tol > worst) {
      worst = err / tol;
      worst_i = static_cast<int64_t>(i);
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst element " << worst_i << " got " << got[worst_i] << " ref "
                        << ref[worst_i] << " (error / tolerance = " << worst << ", max|ref| = " << scale << ")";
}

// Tolerances of the CPU backend against a double reference computed from the same inputs.
// Statistic outputs carry only accumulation error (fp32 for bf16/fp32 inputs, fp64 for fp64).
// Activation outputs of a bf16 call are also rounded to bf16 (relative error up to the unit
// roundoff 2^-8, which the float accumulation error can push slightly over: allow 2^-7).
template <class Act>
constexpr double stat_rtol() {
  return std::is_same_v<Act, double> ? 1e-12 : 2e-5;
}
template <class Act>
constexpr double act_rounding() {
  return std::is_same_v<Act, bf16> ? 1.0 / 128 : 0.0;
}

// Compares an activation output (stored as Act) with its reference.
template <class Act>
void expect_act_close(const std::vector<Act>& got, const std::vector<double>& ref, const std::string& what) {
  expect_close(to_doubles(got), ref, act_rounding<Act>(), stat_rtol<Act>(), what);
}

// Compares a statistic output with its reference.
template <class Stat>
void expect_stat_close(const std::vector<Stat>& got, const std::vector<double>& ref, double rtol,
                       const std::string& what) {
  expect_close(to_doubles(got), ref, 0.0, rtol, what);
}

#define FDT_ASSERT_OK(expr)                          \
  do {                                               \
    const ::flashdsa::Status _st = (expr);           \
    ASSERT_TRUE(_st.ok()) << _st.to_string();        \
  } while (0)

}  // namespace fdt
