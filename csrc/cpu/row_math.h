// Internal: small per-row formulas shared by the CPU ops (softmax statistics, the indexer's head
// reduction, the upstream gradient of a loss row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/tensor_access.h"

namespace flashdsa::cpu {

// log sum_i exp(x[i]) in double; -inf when n == 0 or every x is -inf.
template <class T>
double logsumexp(const T* x, int64_t n) {
  double m = neg_inf<double>();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  if (m == neg_inf<double>()) return m;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(sum);
}

// Running (max, sum of exp(x - max)) of a stream of values: a logsumexp over several tiles.
struct OnlineLogSumExp {
  double max = neg_inf<double>();
  double sum = 0;

  template <class T>
  void add(const T* x, int64_t n) {
    double tile_max = neg_inf<double>();
    for (int64_t i = 0; i < n; ++i) tile_max = std::max(tile_max, static_cast<double>(x[i]));
    if (tile_max == neg_inf<double>()) return;
    if (tile_max > max) {
      sum *= std::exp(max - tile_max);
      max = tile_max;
    }
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  }
  double value() const { return max == neg_inf<double>() ? max : max + std::log(sum); }
};

// The indexer's activation f (relu or identity) and its derivative (0 at 0 for relu).
template <class T>
T activation(T x, bool relu) {
  return relu && !(x > 0) ? T(0) : x;
}
template <class T>
T activation_grad(T x, bool relu) {
  return relu && !(x > 0) ? T(0) : T(1);
}

// Index scores from per-head dot products: score[i] = sum_h w[h] * f(qk[h * ld + i]), i < n,
// summed in increasing h.
template <class Acc>
void weighted_head_sum(const Acc* qk, int64_t ld, const Acc* w, int H, int n, bool relu, Acc* score) {
  std::fill(score, score + n, Acc(0));
  for (int h = 0; h < H; ++h) {
    const Acc* row = qk + h * ld;
    for (int i = 0; i < n; ++i) score[i] += w[h] * activation(row[i], relu);
  }
}

// d total / d loss_rows[t] of a KL backward: grad_scale * (grad_rows ? grad_rows[t] : 1).
template <class Stat>
double loss_row_grad(double grad_scale, const void* grad_rows, int64_t t) {
  return grad_rows ? grad_scale * static_cast<double>(static_cast<const Stat*>(grad_rows)[t]) : grad_scale;
}

// Rows per parallel_for chunk for a loop over T rows of uneven cost: small enough to balance.
inline int64_t row_grain(int64_t T) { return std::max<int64_t>(1, T / (64 * detail::num_threads())); }

}  // namespace flashdsa::cpu
