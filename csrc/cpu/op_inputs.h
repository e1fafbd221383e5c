// Internal: the CPU views of the params parts (include/flashdsa/ops.h: AttentionTensors,
// IndexerTensors, TopkIndices), read once per call; T and T_kv come from the op's params.
// Key tensors (kv, k_idx) are converted to contiguous Acc copies (O(T_kv * D)); query rows are
// converted one row at a time into per-worker scratch.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/simd_rows.h"
#include "cpu/row_math.h"
#include "cpu/tensor_access.h"
#include "flashdsa/ops.h"

namespace flashdsa::cpu {

// Queries [T, H, D] (strided; converted one row at a time) and keys [T_kv, D] (a contiguous Acc
// copy): what the main attention (q, kv) and the lightning indexer (q_idx, k_idx) share.
template <class Act>
struct QueryKeyInputs {
  using Acc = AccOf<Act>;

  const Act* q;
  int64_t q_stride_t, q_stride_h;
  Buffer<Acc> keys;  // [T_kv, D] contiguous copy
  int H, D;

  QueryKeyInputs(const void* q_, int64_t q_stride_t_, int64_t q_stride_h_, const void* k, int64_t k_stride_t,
                 int64_t T_kv, int H_, int D_)
      : q(static_cast<const Act*>(q_)),
        q_stride_t(q_stride_t_),
        q_stride_h(q_stride_h_),
        keys(load_matrix<Act>(k, T_kv, D_, k_stride_t)),
        H(H_),
        D(D_) {}

  // The query row t as contiguous [H, D].
  void load_q(int64_t t, Acc* dst) const { load_rows(q + t * q_stride_t, q_stride_h, H, D, dst); }
  const Acc* key_row(int64_t s) const { return keys.data() + s * D; }
};

// Main attention: q [T, H, D_qk] (strided) and kv [T_kv, D_qk] (the keys).
template <class Act>
struct AttentionInputs : QueryKeyInputs<Act> {
  using Acc = AccOf<Act>;
  using QueryKeyInputs<Act>::H;
  using QueryKeyInputs<Act>::D;

  Acc scale;

  AttentionInputs(const AttentionTensors& a, int64_t T_kv)
      : QueryKeyInputs<Act>(a.q, a.q_stride_t, a.q_stride_h, a.kv, a.kv_stride_t, T_kv, a.H, a.D_qk),
        scale(static_cast<Acc>(a.scale)) {}

  // s[h * ld + i] = scale * q_row[h] . rows[i] for i < n (q_row: [H, D_qk]).
  void scores(const Acc* q_row, const Acc* const* rows, int n, Acc* s, int64_t ld) const {
    dot_rows(q_row, D, H, rows, n, D, scale, s, ld);
  }
};

// Lightning indexer: q_idx [T, H_I, D_I] (strided), k_idx [T_kv, D_I] (the keys), weights [T, H_I]
// (stat).
template <class Act>
struct IndexerInputs : QueryKeyInputs<Act> {
  using Acc = AccOf<Act>;
  using QueryKeyInputs<Act>::H;
  using QueryKeyInputs<Act>::D;
  using QueryKeyInputs<Act>::key_row;

  const Acc* weights;
  int64_t weights_stride_t;
  bool relu;

  IndexerInputs(const IndexerTensors& in, int64_t T_kv)
      : QueryKeyInputs<Act>(in.q_idx, in.q_idx_stride_t, in.q_idx_stride_h, in.k_idx, in.k_idx_stride_t, T_kv, in.H_I,
                            in.D_I),
        weights(static_cast<const Acc*>(in.weights)),
        weights_stride_t(in.weights_stride_t),
        relu(in.relu) {}

  const Acc* w(int64_t t) const { return weights + t * weights_stride_t; }
  // qk[h * ld + i] = q[h] . rows[i] and score[i] = sum_h w_t[h] f(qk[h, i]), i < n.
  void scores(const Acc* q, const Acc* w_t, const Acc* const* rows, int n, Acc* qk, int64_t ld, Acc* score) const {
    dot_rows(q, D, H, rows, n, D, Acc(1), qk, ld);
    weighted_head_sum(qk, ld, w_t, H, n, relu, score);
  }
  // score[i] for the keys key(i), i < n, of query row t (q = load_q(t)), kTile keys at a time;
  // scratch: rows [kTile], qk [H, kTile].
  template <int kTile, class KeyOf>
  void score_keys(int64_t t, const Acc* q, int n, KeyOf&& key, const Acc** rows, Acc* qk, Acc* score) const {
    for (int i0 = 0; i0 < n; i0 += kTile) {
      const int c = std::min(kTile, n - i0);
      for (int i = 0; i < c; ++i) rows[i] = key_row(key(i0 + i));
      scores(q, w(t), rows, c, qk, kTile, score + i0);
    }
  }
  // Given d loss / d score g [n], turns qk [H, ld] into d loss / d qk = g w f'(qk) in place and
  // adds sum_i g_i f(qk[h, i]) to dw[h] (dw may be null).
  void score_grads(const Acc* w_t, const Acc* g, int n, Acc* qk, int64_t ld, double* dw) const {
    for (int h = 0; h < H; ++h) {
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

  TopkIndices(const ::flashdsa::TopkIndices& k, int64_t T_, int64_t T_kv_)
      : data(k.indices), stride_t(k.stride_t), T(T_), T_kv(T_kv_), K(k.K) {}

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
