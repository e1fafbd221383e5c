// SIMD implementation of dot_rows / combine_rows with GCC vector extensions. Every hot function is
// compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and baseline; the loader picks one per CPU.
//
// Bitwise invariance (see simd_rows.h): every output element is computed by the same sequence of
// operations in every code path: one vector accumulator per element over full vectors of d, a fixed
// halving-tree lane reduction (reduce_lanes, or reduce_16 which pairs lanes identically), then the
// scalar tail, in order. Blocking only changes which elements are computed side by side.
#include "cpu/simd_rows.h"

#include <cstring>
#include <type_traits>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FLASHDSA_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASHDSA_MULTIVERSION
#endif
#define FLASHDSA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace flashdsa::cpu {
namespace {

// 64-byte vectors of T (one AVX-512 register; two AVX2 or four SSE registers on older CPUs).
template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(64)));
  static constexpr int kLanes = 16;
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(64)));
  static constexpr int kLanes = 8;
};

template <class T>
using Vec = typename Simd<T>::V;

template <class T>
FLASHDSA_ALWAYS_INLINE Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
FLASHDSA_ALWAYS_INLINE void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

// Sum of the lanes: lane i is added to lane i + half, halving until one lane is left.
FLASHDSA_ALWAYS_INLINE float reduce_lanes(const Vec<float>& v) {
  const auto h8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const auto h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  const auto h2 = __builtin_shufflevector(h4, h4, 0, 1) + __builtin_shufflevector(h4, h4, 2, 3);
  return h2[0] + h2[1];
}

FLASHDSA_ALWAYS_INLINE double reduce_lanes(const Vec<double>& v) {
  const auto h4 = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const auto h2 = __builtin_shufflevector(h4, h4, 0, 1) + __builtin_shufflevector(h4, h4, 2, 3);
  return h2[0] + h2[1];
}

// Sums of 16 float accumulators at once (a transposing reduction network: 15 adds instead of 16
// separate reductions). Every lane is summed with exactly the pairing of reduce_lanes, so results
// are bitwise identical to it. Lane i of the result holds the sum of acc[kReducedAccumulator[i]].
constexpr int kReducedAccumulator[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

FLASHDSA_ALWAYS_INLINE Vec<float> reduce_16(const Vec<float>* acc) {
  Vec<float> b[8], c[4], d[2];
  for (int k = 0; k < 8; ++k) {  // lanes i + 8 onto i
    b[k] = __builtin_shufflevector(acc[2 * k], acc[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(acc[2 * k], acc[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                   30, 31);
  }
  for (int k = 0; k < 4; ++k) {  // i + 4 onto i
    c[k] = __builtin_shufflevector(b[2 * k], b[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * k], b[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
  for (int k = 0; k < 2; ++k) {  // i + 2 onto i
    d[k] = __builtin_shufflevector(c[2 * k], c[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(c[2 * k], c[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  return __builtin_shufflevector(d[0], d[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +  // i + 1
         __builtin_shufflevector(d[0], d[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

// Lane sums of an RB x CB block of accumulators: sums[r * CB + c] = reduce_lanes(acc[r][c]).
template <class T, int RB, int CB>
FLASHDSA_ALWAYS_INLINE void reduce_block(const Vec<T> (&acc)[RB][CB], T* sums) {
  if constexpr (std::is_same_v<T, float> && RB * CB == 16) {
    const Vec<float> reduced = reduce_16(&acc[0][0]);
    for (int lane = 0; lane < 16; ++lane) sums[kReducedAccumulator[lane]] = reduced[lane];
  } else {
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) sums[r * CB + c] = reduce_lanes(acc[r][c]);
  }
}

// RB x CB block of dot_rows: out[r][c] for r < RB, c < CB.
template <class T, int RB, int CB>
FLASHDSA_ALWAYS_INLINE void dot_block(const T* a, int64_t lda, const T* const* b, int D, T alpha, T* out,
                                      int64_t ldo) {
  constexpr int L = Simd<T>::kLanes;
  Vec<T> acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = Vec<T>{};
  int d = 0;
  for (; d + L <= D; d += L) {
    Vec<T> bv[CB];
    for (int c = 0; c < CB; ++c) bv[c] = load(b[c] + d);
    for (int r = 0; r < RB; ++r) {
      const Vec<T> av = load(a + r * lda + d);
      for (int c = 0; c < CB; ++c) acc[r][c] += av * bv[c];
    }
  }
  T sums[RB * CB];
  reduce_block<T, RB, CB>(acc, sums);
  for (int r = 0; r < RB; ++r) {
    for (int c = 0; c < CB; ++c) {
      T sum = sums[r * CB + c];
      for (int e = d; e < D; ++e) sum += a[r * lda + e] * b[c][e];
      out[r * ldo + c] = alpha * sum;
    }
  }
}

// All rows of `a` against CB columns.
template <class T, int CB>
FLASHDSA_ALWAYS_INLINE void dot_column_block(const T* a, int64_t lda, int R, const T* const* b, int D, T alpha,
                                             T* out, int64_t ldo) {
  constexpr int kRowBlock = 4;
  int r = 0;
  for (; r + kRowBlock <= R; r += kRowBlock) dot_block<T, kRowBlock, CB>(a + r * lda, lda, b, D, alpha, out + r * ldo, ldo);
  for (; r < R; ++r) dot_block<T, 1, CB>(a + r * lda, lda, b, D, alpha, out + r * ldo, ldo);
}

template <class T>
FLASHDSA_ALWAYS_INLINE void dot_rows_impl(const T* a, int64_t lda, int R, const T* const* b_rows, int C, int D,
                                          T alpha, T* out, int64_t ldo) {
  constexpr int kColumnBlock = 4;
  int c = 0;
  for (; c + kColumnBlock <= C; c += kColumnBlock) {
    dot_column_block<T, kColumnBlock>(a, lda, R, b_rows + c, D, alpha, out + c, ldo);
  }
  switch (C - c) {
    case 3: dot_column_block<T, 3>(a, lda, R, b_rows + c, D, alpha, out + c, ldo); break;
    case 2: dot_column_block<T, 2>(a, lda, R, b_rows + c, D, alpha, out + c, ldo); break;
    case 1: dot_column_block<T, 1>(a, lda, R, b_rows + c, D, alpha, out + c, ldo); break;
    default: break;
  }
}

// MB rows x NV vectors of combine_rows, columns [n0, n0 + NV * lanes).
template <class T, int MB, int NV>
FLASHDSA_ALWAYS_INLINE void combine_block(int Kc, const T* coef, int64_t sm, int64_t sk, const T* const* in,
                                          T* const* out, int n0, bool accumulate) {
  constexpr int L = Simd<T>::kLanes;
  Vec<T> acc[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = accumulate ? load(out[m] + n0 + v * L) : Vec<T>{};
  for (int k = 0; k < Kc; ++k) {
    Vec<T> x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load(in[k] + n0 + v * L);
    for (int m = 0; m < MB; ++m) {
      const T w = coef[m * sm + k * sk];
      for (int v = 0; v < NV; ++v) acc[m][v] += w * x[v];
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) store(out[m] + n0 + v * L, acc[m][v]);
}

// All columns of MB rows: wide chunks, then single vectors, then scalars.
template <class T, int MB>
FLASHDSA_ALWAYS_INLINE void combine_row_block(int Kc, int N, const T* coef, int64_t sm, int64_t sk,
                                              const T* const* in, T* const* out, bool accumulate) {
  constexpr int L = Simd<T>::kLanes;
  constexpr int kWide = 4;
  int n = 0;
  for (; n + kWide * L <= N; n += kWide * L) combine_block<T, MB, kWide>(Kc, coef, sm, sk, in, out, n, accumulate);
  for (; n + L <= N; n += L) combine_block<T, MB, 1>(Kc, coef, sm, sk, in, out, n, accumulate);
  for (; n < N; ++n) {
    for (int m = 0; m < MB; ++m) {
      T acc = accumulate ? out[m][n] : T(0);
      for (int k = 0; k < Kc; ++k) acc += coef[m * sm + k * sk] * in[k][n];
      out[m][n] = acc;
    }
  }
}

template <class T>
FLASHDSA_ALWAYS_INLINE void combine_rows_impl(int M, int Kc, int N, const T* coef, int64_t sm, int64_t sk,
                                              const T* const* in, T* const* out, bool accumulate) {
  constexpr int kRowBlock = 4;
  int m = 0;
  for (; m + kRowBlock <= M; m += kRowBlock) {
    combine_row_block<T, kRowBlock>(Kc, N, coef + m * sm, sm, sk, in, out + m, accumulate);
  }
  for (; m < M; ++m) combine_row_block<T, 1>(Kc, N, coef + m * sm, sm, sk, in, out + m, accumulate);
}

}  // namespace

FLASHDSA_MULTIVERSION
void dot_rows(const float* a, int64_t lda, int R, const float* const* b_rows, int C, int D, float alpha,
              float* out, int64_t ldo) {
  dot_rows_impl(a, lda, R, b_rows, C, D, alpha, out, ldo);
}

FLASHDSA_MULTIVERSION
void dot_rows(const double* a, int64_t lda, int R, const double* const* b_rows, int C, int D, double alpha,
              double* out, int64_t ldo) {
  dot_rows_impl(a, lda, R, b_rows, C, D, alpha, out, ldo);
}

FLASHDSA_MULTIVERSION
void combine_rows(int M, int Kc, int N, const float* coef, int64_t coef_stride_m, int64_t coef_stride_k,
                  const float* const* in_rows, float* const* out_rows, bool accumulate) {
  combine_rows_impl(M, Kc, N, coef, coef_stride_m, coef_stride_k, in_rows, out_rows, accumulate);
}

FLASHDSA_MULTIVERSION
void combine_rows(int M, int Kc, int N, const double* coef, int64_t coef_stride_m, int64_t coef_stride_k,
                  const double* const* in_rows, double* const* out_rows, bool accumulate) {
  combine_rows_impl(M, Kc, N, coef, coef_stride_m, coef_stride_k, in_rows, out_rows, accumulate);
}

}  // namespace flashdsa::cpu
