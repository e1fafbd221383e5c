// Naive double-precision references of every op (docs/spec.md §3-§6), written as plainly as possible:
// contiguous logical tensors, materialized intermediates, no tiling. The one C++ reference: the CPU
// tests (tests/cpp) and the GPU check programs (tests/cuda, through check_common.cuh) both use it.
// Small sizes only (the GPU checks use a few hundred tokens).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ref {

using Vec = std::vector<double>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

inline double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline bool valid(int64_t key, int64_t T_kv) { return key >= 0 && key < T_kv; }

// log(sum exp(x)) of a set of values; -inf for an empty set.
inline double log_sum_exp(const std::vector<double>& x) {
  if (x.empty()) return kNegInf;
  const double m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double v : x) sum += std::exp(v - m);
  return m + std::log(sum);
}

// Indexer inputs: q_idx [T, H_I, D_I], k_idx [T_kv, D_I], weights [T, H_I].
struct Indexer {
  const Vec& q_idx;
  const Vec& k_idx;
  const Vec& w;
  int H_I, D_I;
  bool relu;

  double qk(int64_t t, int h, int64_t s) const {
    return dot(&q_idx[(t * H_I + h) * D_I], &k_idx[s * D_I], D_I);
  }
  double f(double x) const { return relu ? std::max(x, 0.0) : x; }
  double f_grad(double x) const { return relu ? (x > 0 ? 1.0 : 0.0) : 1.0; }
  double score(int64_t t, int64_t s) const {
    double sum = 0;
    for (int h = 0; h < H_I; ++h) sum += w[t * H_I + h] * f(qk(t, h, s));
    return sum;
  }
};

// Main attention inputs: q [T, H, D_qk], kv [T_kv, D_qk].
struct Attention {
  const Vec& q;
  const Vec& kv;
  int H, D_qk;
  double scale;

  double logit(int64_t t, int h, int64_t s) const { return scale * dot(&q[(t * H + h) * D_qk], &kv[s * D_qk], D_qk); }
};

// §4 for query rows [t_begin, t_end) into out [T, H, D_v] and lse [T, H], already sized (rows
// without a valid index: out 0, lse -inf). Callers may split the rows over threads.
inline void sparse_mla_fwd_rows(const Attention& a, const std::vector<int32_t>& idx, int64_t t_begin, int64_t t_end,
                                int64_t T_kv, int K, int D_v, Vec& out, Vec& lse) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int h = 0; h < a.H; ++h) {
      std::vector<double> logits;
      std::vector<int64_t> keys;
      for (int j = 0; j < K; ++j) {
        const int64_t s = idx[t * K + j];
        if (!valid(s, T_kv)) continue;
        logits.push_back(a.logit(t, h, s));
        keys.push_back(s);
      }
      if (keys.empty()) continue;
      const double L = log_sum_exp(logits);
      lse[t * a.H + h] = L;
      for (size_t i = 0; i < keys.size(); ++i) {
        const double p = std::exp(logits[i] - L);
        for (int d = 0; d < D_v; ++d) out[(t * a.H + h) * D_v + d] += p * a.kv[keys[i] * a.D_qk + d];
      }
    }
  }
}

// §4: out [T, H, D_v], lse [T, H].
inline void sparse_mla_fwd(const Attention& a, const std::vector<int32_t>& idx, int64_t T, int64_t T_kv, int K,
                           int D_v, Vec& out, Vec& lse) {
  out.assign(T * a.H * D_v, 0.0);
  lse.assign(T * a.H, kNegInf);
  sparse_mla_fwd_rows(a, idx, 0, T, T_kv, K, D_v, out, lse);
}

// §4's lse alone [T, H] (-inf on rows without a valid index): what the attention mass and the sparse
// KL loss read from the forward.
inline Vec sparse_lse(const Attention& a, const std::vector<int32_t>& idx, int64_t T, int64_t T_kv, int K) {
  Vec lse(T * a.H, kNegInf);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < a.H; ++h) {
      std::vector<double> logits;
      for (int j = 0; j < K; ++j) {
        if (valid(idx[t * K + j], T_kv)) logits.push_back(a.logit(t, h, idx[t * K + j]));
      }
      lse[t * a.H + h] = log_sum_exp(logits);
    }
  }
  return lse;
}

// §5, from the forward's stored out and lse: dq [T, H, D_qk], dkv [T_kv, D_qk].
inline void sparse_mla_bwd(const Attention& a, const std::vector<int32_t>& idx, int64_t T, int64_t T_kv, int K,
                           int D_v, const Vec& out, const Vec& lse, const Vec& dout, Vec& dq, Vec& dkv) {
  dq.assign(T * a.H * a.D_qk, 0.0);
  dkv.assign(T_kv * a.D_qk, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < a.H; ++h) {
      const double* dout_th = &dout[(t * a.H + h) * D_v];
      const double delta = dot(dout_th, &out[(t * a.H + h) * D_v], D_v);
      for (int j = 0; j < K; ++j) {
        const int64_t s = idx[t * K + j];
        if (!valid(s, T_kv)) continue;
        const double p = std::exp(a.logit(t, h, s) - lse[t * a.H + h]);
        const double dp = dot(dout_th, &a.kv[s * a.D_qk], D_v);
        const double ds = p * (dp - delta);
        for (int d = 0; d < a.D_qk; ++d) {
          dq[(t * a.H + h) * a.D_qk + d] += a.scale * ds * a.kv[s * a.D_qk + d];
          dkv[s * a.D_qk + d] += a.scale * ds * a.q[(t * a.H + h) * a.D_qk + d];
        }
        for (int d = 0; d < D_v; ++d) dkv[s * a.D_qk + d] += p * dout_th[d];
      }
    }
  }
}

// §6 attention mass [T, K] from the stored lse.
inline Vec attention_mass(const Attention& a, const std::vector<int32_t>& idx, int64_t T, int64_t T_kv, int K,
                          const Vec& lse) {
  Vec mass(T * K, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) {
      const int64_t s = idx[t * K + j];
      if (!valid(s, T_kv)) continue;
      for (int h = 0; h < a.H; ++h) mass[t * K + j] += std::exp(a.logit(t, h, s) - lse[t * a.H + h]);
    }
  }
  return mass;
}

// KL loss rows and gradients of either formulation; lse_rows: the log-sum-exp of each row's scores
// over its support (-inf on rows without a target), what the sparse forward saves in row_stats.
struct KlResult {
  Vec loss_rows, dq_idx, dk_idx, dweights, lse_rows;
};

// One row of the KL loss over support keys with target probabilities; adds the gradients
// (upstream factor G) into r.
inline double kl_row(const Indexer& ix, int64_t t, const std::vector<int64_t>& keys, const Vec& target, double G,
                     KlResult& r) {
  Vec score(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) score[i] = ix.score(t, keys[i]);
  const double lse = log_sum_exp(score);
  r.lse_rows[t] = lse;
  double loss = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const double log_p = score[i] - lse;
    if (target[i] > 0) loss += target[i] * (std::log(target[i]) - log_p);
    const double g = G * (std::exp(log_p) - target[i]);
    for (int h = 0; h < ix.H_I; ++h) {
      const double x = ix.qk(t, h, keys[i]);
      r.dweights[t * ix.H_I + h] += g * ix.f(x);
      const double dx = g * ix.w[t * ix.H_I + h] * ix.f_grad(x);
      for (int d = 0; d < ix.D_I; ++d) {
        r.dq_idx[(t * ix.H_I + h) * ix.D_I + d] += dx * ix.k_idx[keys[i] * ix.D_I + d];
        r.dk_idx[keys[i] * ix.D_I + d] += dx * ix.q_idx[(t * ix.H_I + h) * ix.D_I + d];
      }
    }
  }
  return loss;
}

inline KlResult empty_result(int64_t T, int64_t T_kv, const Indexer& ix) {
  KlResult r;
  r.loss_rows.assign(T, 0.0);
  r.dq_idx.assign(T * ix.H_I * ix.D_I, 0.0);
  r.dk_idx.assign(T_kv * ix.D_I, 0.0);
  r.dweights.assign(T * ix.H_I, 0.0);
  r.lse_rows.assign(T, kNegInf);
  return r;
}

// Sparse KL: support = valid slots, target = mass / sum(mass) (row skipped when the sum is 0).
// G[t] = d total / d loss_rows[t].
inline KlResult sparse_kl(const Indexer& ix, const std::vector<int32_t>& idx, const Vec& mass, int64_t T,
                          int64_t T_kv, int K, const Vec& G) {
  KlResult r = empty_result(T, T_kv, ix);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> keys;
    Vec target;
    double total = 0;
    for (int j = 0; j < K; ++j) {
      if (!valid(idx[t * K + j], T_kv)) continue;
      keys.push_back(idx[t * K + j]);
      target.push_back(mass[t * K + j]);
      total += mass[t * K + j];
    }
    if (keys.empty() || total == 0) continue;
    for (double& x : target) x /= total;
    r.loss_rows[t] = kl_row(ix, t, keys, target, G[t], r);
  }
  return r;
}

// Dense KL: support = [k_start, k_end), target = head-mean of the dense attention softmax.
inline KlResult dense_kl(const Indexer& ix, const Attention& a, const std::vector<int32_t>& k_start,
                         const std::vector<int32_t>& k_end, int64_t T, int64_t T_kv, const Vec& G) {
  KlResult r = empty_result(T, T_kv, ix);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> keys;
    for (int64_t s = k_start[t]; s < k_end[t]; ++s) keys.push_back(s);
    if (keys.empty()) continue;
    Vec target(keys.size(), 0.0);
    for (int h = 0; h < a.H; ++h) {
      Vec logits(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) logits[i] = a.logit(t, h, keys[i]);
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (double l : logits) sum += std::exp(l - m);
      for (size_t i = 0; i < keys.size(); ++i) target[i] += std::exp(logits[i] - m) / sum / a.H;
    }
    r.loss_rows[t] = kl_row(ix, t, keys, target, G[t], r);
  }
  return r;
}

}  // namespace ref
