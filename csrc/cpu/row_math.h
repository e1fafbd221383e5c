// Internal: small per-row formulas shared by the CPU ops (softmax statistics, the indexer's head
// reduction, the upstream gradient of a loss row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/tensor_access.h"

namespace flashdsa::cpu {

// log sum_i exp(x[i]) in double; -inf when n == 0 or every x is -inf; NaN when any x is NaN
// (docs/reliability.md: a NaN score never vanishes from a softmax, even when all scores are NaN).
template <class T>
double logsumexp(const T* x, int64_t n) {
  double m = neg_inf<double>();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    if (std::isnan(v)) nan = true;
    else m = std::max(m, v);
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (m == neg_inf<double>()) return m;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(sum);
}

// Running (max, sum of exp(x - max)) of a stream of values: a logsumexp over several tiles.
// A NaN value makes value() NaN (as logsumexp).
struct OnlineLogSumExp {
  double max = neg_inf<double>();
  double sum = 0;
  bool nan = false;

  template <class T>
  void add(const T* x, int64_t n) {
    double tile_max = neg_inf<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      if (std::isnan(v)) nan = true;
      else tile_max = std::max(tile_max, v);
    }
    if (tile_max == neg_inf<double>()) return;
    if (tile_max > max) {
      sum *= std::exp(max - tile_max);
      max = tile_max;
    }
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  }
  double value() const {
    if (nan) return std::numeric_limits<double>::quiet_NaN();
    return max == neg_inf<double>() ? max : max + std::log(sum);
  }
};

// The indexer's activation f (relu or identity) and its derivative (0 at 0 for relu). ReLU keeps
// a NaN (a NaN score is never turned into a valid-looking 0; docs/reliability.md).
template <class T>
T activation(T x, bool relu) {
  return relu && x <= T(0) ? T(0) : x;
}
template <class T>
T activation_grad(T x, bool relu) {
  return relu && x <= T(0) ? T(0) : T(1);
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
