// Internal: the inputs shared by several CPU ops, read from the params structs once per call.
// Key tensors (kv, k_idx) are converted to contiguous Acc copies (O(T_kv * D)); query rows are
// converted one row at a time into per-worker scratch.
#pragma once

#include <cstdint>

#include "cpu/simd_rows.h"
#include "cpu/row_math.h"
#include "cpu/tensor_access.h"

namespace flashdsa::cpu {

// Main attention: q [T, H, D_qk] (strided) and kv [T_kv, D_qk].
template <class Act>
struct AttentionInputs {
  using Acc = AccOf<Act>;

  const Act* q;
  int64_t q_stride_t, q_stride_h;
  Buffer<Acc> kv;  // [T_kv, D_qk] contiguous copy
  int H, D_qk;
  Acc scale;

  template <class P>
  explicit AttentionInputs(const P& p)
      : q(static_cast<const Act*>(p.q)),
        q_stride_t(p.q_stride_t),
        q_stride_h(p.q_stride_h),
        kv(load_matrix<Act>(p.kv, p.T_kv, p.D_qk, p.kv_stride_t)),
        H(p.H),
        D_qk(p.D_qk),
        scale(static_cast<Acc>(p.scale)) {}

  // q[t] as contiguous [H, D_qk].
  void load_q(int64_t t, Acc* dst) const { load_rows(q + t * q_stride_t, q_stride_h, H, D_qk, dst); }
  const Acc* kv_row(int64_t s) const { return kv.data() + s * D_qk; }
  // s[h * ld + i] = scale * q_row[h] . rows[i] for i < n (q_row: [H, D_qk]).
  void scores(const Acc* q_row, const Acc* const* rows, int n, Acc* s, int64_t ld) const {
    dot_rows(q_row, D_qk, H, rows, n, D_qk, scale, s, ld);
  }
};

// Lightning indexer: q_idx [T, H_I, D_I] (strided), k_idx [T_kv, D_I], weights [T, H_I] (stat).
template <class Act>
struct IndexerInputs {
  using Acc = AccOf<Act>;

  const Act* q_idx;
  int64_t q_idx_stride_t, q_idx_stride_h;
  Buffer<Acc> k_idx;  // [T_kv, D_I] contiguous copy
  const Acc* weights;
  int64_t weights_stride_t;
  int H_I, D_I;
  bool relu;

  template <class P>
  explicit IndexerInputs(const P& p)
      : q_idx(static_cast<const Act*>(p.q_idx)),
        q_idx_stride_t(p.q_idx_stride_t),
        q_idx_stride_h(p.q_idx_stride_h),
        k_idx(load_matrix<Act>(p.k_idx, p.T_kv, p.D_I, p.k_idx_stride_t)),
        weights(static_cast<const Acc*>(p.weights)),
        weights_stride_t(p.weights_stride_t),
        H_I(p.H_I),
        D_I(p.D_I),
        relu(p.relu) {}

  // q_idx[t] as contiguous [H_I, D_I].
  void load_q(int64_t t, Acc* dst) const { load_rows(q_idx + t * q_idx_stride_t, q_idx_stride_h, H_I, D_I, dst); }
  const Acc* w(int64_t t) const { return weights + t * weights_stride_t; }
  const Acc* key_row(int64_t s) const { return k_idx.data() + s * D_I; }
  // qk[h * ld + i] = q[h] . rows[i] and score[i] = sum_h w_t[h] f(qk[h, i]), i < n.
  void scores(const Acc* q, const Acc* w_t, const Acc* const* rows, int n, Acc* qk, int64_t ld, Acc* score) const {
    dot_rows(q, D_I, H_I, rows, n, D_I, Acc(1), qk, ld);
    weighted_head_sum(qk, ld, w_t, H_I, n, relu, score);
  }
  // Given d loss / d score g [n], turns qk [H_I, ld] into d loss / d qk = g w f'(qk) in place and
  // adds sum_i g_i f(qk[h, i]) to dw[h] (dw may be null).
  void score_grads(const Acc* w_t, const Acc* g, int n, Acc* qk, int64_t ld, double* dw) const {
    for (int h = 0; h < H_I; ++h) {
      Acc* row = qk + h * ld;
      double dw_h = 0;
      for (int i = 0; i < n; ++i) {
        dw_h += static_cast<double>(g[i]) * activation(row[i], relu);
        row[i] = g[i] * w_t[h] * activation_grad(row[i], relu);
      }
      if (dw) dw[h] += dw_h;
    }
  }
};

// Top-k indices [T, K] (row stride indices_stride_t) read by an op; entries outside [0, T_kv)
// are empty slots.
struct TopkIndices {
  const int32_t* data;
  int64_t stride_t, T, T_kv;
  int K;

  template <class P>
  explicit TopkIndices(const P& p) : data(p.indices), stride_t(p.indices_stride_t), T(p.T), T_kv(p.T_kv), K(p.K) {}

  const int32_t* row(int64_t t) const { return data + t * stride_t; }
  bool valid(int32_t key) const { return key >= 0 && key < T_kv; }

  // The valid slots of row t in slot order: slots[n] = j and rows[n] = base + key_j * row_len.
  // Returns their count.
  template <class Acc>
  int valid_slots(int64_t t, const Acc* base, int64_t row_len, int32_t* slots, const Acc** rows) const {
    const int32_t* idx = row(t);
    int n = 0;
    for (int j = 0; j < K; ++j) {
      if (!valid(idx[j])) continue;
      slots[n] = j;
      rows[n] = base + static_cast<int64_t>(idx[j]) * row_len;
      ++n;
    }
    return n;
  }
};

}  // namespace flashdsa::cpu
