// Internal: the two dense building blocks every CPU op is made of, for float and double.
// Both are vectorized (AVX-512 / AVX2 / SSE2 chosen at run time) and the value of every output
// element is a fixed function of its inputs, whatever the block sizes, positions or other elements
// of the call: the deterministic backward passes recompute values in different groupings and rely
// on getting the same bits.
#pragma once

#include <cstdint>

namespace flashdsa::cpu {

// Dot products of R rows of `a` with C gathered rows:
//   out[r * ldo + c] = alpha * sum_d a[r * lda + d] * b_rows[c][d],   d < D.
void dot_rows(const float* a, int64_t lda, int R, const float* const* b_rows, int C, int D, float alpha,
              float* out, int64_t ldo);
void dot_rows(const double* a, int64_t lda, int R, const double* const* b_rows, int C, int D, double alpha,
              double* out, int64_t ldo);

// Weighted sums of gathered rows:
//   out_rows[m][n] = init + sum_k coef[m * coef_stride_m + k * coef_stride_k] * in_rows[k][n],   n < N,
// summed in increasing k, with init = out_rows[m][n] if accumulate else 0. The out rows must be
// pairwise distinct and must not overlap the in rows.
void combine_rows(int M, int Kc, int N, const float* coef, int64_t coef_stride_m, int64_t coef_stride_k,
                  const float* const* in_rows, float* const* out_rows, bool accumulate);
void combine_rows(int M, int Kc, int N, const double* coef, int64_t coef_stride_m, int64_t coef_stride_k,
                  const double* const* in_rows, double* const* out_rows, bool accumulate);

}  // namespace flashdsa::cpu
