// A random DSA problem (all inputs of all ops) and the params structs that run each op on it.
#pragma once

#include <cmath>
#include <vector>

#include "reference.h"
#include "test_util.h"

namespace fdt {

struct Shape {
  std::vector<int32_t> lengths{7, 1, 13, 45};  // THD packing; T = T_kv = sum; rows past K
  int H = 3, D_qk = 72, D_v = 40;             // odd sizes exercise every tail of the CPU kernels
  int H_I = 5, D_I = 24, K = 24;
  bool relu = true;
  int pad = 3;                                // extra elements per head / row of the strided inputs
  uint64_t seed = 1;
};

template <class Act>
struct Problem {
  using Stat = StatOf<Act>;

  Shape shape;
  Batch batch;
  int64_t T, T_kv;
  int indices_stride_t;
  Input<Act> q, kv, q_idx, k_idx, dout;
  Input<Stat> weights;
  std::vector<int32_t> indices_storage;  // [T, indices_stride_t]
  std::vector<int32_t> indices;          // [T, K] logical
  float scale;

  explicit Problem(const Shape& s) : shape(s), batch(thd_batch(s.lengths)), T(batch.T), T_kv(batch.T) {
    Rng rng(s.seed);
    q = random_input<Act>(T, s.H, s.D_qk, -1, 1, rng, s.pad, s.pad);
    kv = random_input<Act>(T_kv, 1, s.D_qk, -1, 1, rng, 0, s.pad);
    q_idx = random_input<Act>(T, s.H_I, s.D_I, -1, 1, rng, s.pad, s.pad);
    k_idx = random_input<Act>(T_kv, 1, s.D_I, -1, 1, rng, 0, s.pad);
    weights = random_input<Stat>(T, 1, s.H_I, -0.5, 1, rng, 0, s.pad);
    dout = random_input<Act>(T, s.H, s.D_v, -1, 1, rng);
    set_indices(messy_indices(batch, T_kv, s.K, rng));
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D_qk)));
  }

  // Replaces the top-k indices [T, K] (stored with a padded row stride filled with junk).
  void set_indices(const std::vector<int32_t>& idx) {
    indices = idx;
    indices_stride_t = shape.K + 2;
    indices_storage.assign(T * indices_stride_t, 123456);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < shape.K; ++j) indices_storage[t * indices_stride_t + j] = idx[t * shape.K + j];
  }

  ref::Attention ref_attention() const { return {q.value, kv.value, shape.H, shape.D_qk, scale}; }
  ref::Indexer ref_indexer() const { return {q_idx.value, k_idx.value, weights.value, shape.H_I, shape.D_I, shape.relu}; }

  // The params parts of this problem (one builder per part of include/flashdsa/ops.h).
  flashdsa::IndexerTensors indexer_tensors() const {
    flashdsa::IndexerTensors in;
    in.dtype = dtype_of<Act>();
    in.q_idx = q_idx.data();
    in.k_idx = k_idx.data();
    in.weights = weights.data();
    in.H_I = shape.H_I;
    in.D_I = shape.D_I;
    in.relu = shape.relu;
    in.q_idx_stride_t = q_idx.stride_t;
    in.q_idx_stride_h = q_idx.stride_h;
    in.k_idx_stride_t = k_idx.stride_t;
    in.weights_stride_t = weights.stride_t;
    return in;
  }

  flashdsa::AttentionTensors attention_tensors() const {
    flashdsa::AttentionTensors a;
    a.dtype = dtype_of<Act>();
    a.q = q.data();
    a.kv = kv.data();
    a.scale = scale;
    a.H = shape.H;
    a.D_qk = shape.D_qk;
    a.D_v = shape.D_v;
    a.q_stride_t = q.stride_t;
    a.q_stride_h = q.stride_h;
    a.kv_stride_t = kv.stride_t;
    return a;
  }

  flashdsa::TopkIndices topk_indices() const {
    flashdsa::TopkIndices k;
    k.indices = indices_storage.data();
    k.stride_t = indices_stride_t;
    k.K = shape.K;
    return k;
  }

  template <class P>
  void set_sizes(P& p) const {
    p.T = T;
    p.T_kv = T_kv;
  }

  flashdsa::IndexerTopkParams indexer_topk(int32_t* out_indices, Stat* out_scores) const {
    flashdsa::IndexerTopkParams p;
    set_sizes(p);
    p.indexer = indexer_tensors();
    p.k_start = batch.k_start.data();
    p.k_end = batch.k_end.data();
    p.indices = out_indices;
    p.scores = out_scores;
    p.K = shape.K;
    return p;
  }

  flashdsa::SparseMlaFwdParams sparse_fwd(Act* out, Stat* lse) const {
    flashdsa::SparseMlaFwdParams p;
    set_sizes(p);
    p.attn = attention_tensors();
    p.topk = topk_indices();
    p.out = out;
    p.lse = lse;
    return p;
  }

  flashdsa::SparseMlaBwdParams sparse_bwd(const Act* out, const Stat* lse, Act* dq, Stat* dkv) const {
    flashdsa::SparseMlaBwdParams p;
    set_sizes(p);
    p.attn = attention_tensors();
    p.topk = topk_indices();
    p.out = out;
    p.lse = lse;
    p.dout = dout.data();
    p.dq = dq;
    p.dkv = dkv;
    return p;
  }

  flashdsa::AttnMassParams attention_mass(const Stat* lse, Stat* mass) const {
    flashdsa::AttnMassParams p;
    set_sizes(p);
    p.attn = attention_tensors();
    p.topk = topk_indices();
    p.lse = lse;
    p.mass = mass;
    return p;
  }

  flashdsa::SparseKlParams sparse_kl(const Stat* mass) const {
    flashdsa::SparseKlParams p;
    set_sizes(p);
    p.indexer = indexer_tensors();
    p.topk = topk_indices();
    p.mass = mass;
    return p;
  }

  flashdsa::DenseKlParams dense_kl() const {
    flashdsa::DenseKlParams p;
    set_sizes(p);
    p.attn = attention_tensors();
    p.indexer = indexer_tensors();
    p.k_start = batch.k_start.data();
    p.k_end = batch.k_end.data();
    return p;
  }
};

// Outputs of the sparse MLA forward of a problem (out as Act, lse as Stat).
template <class Act>
struct ForwardResult {
  std::vector<Act> out;
  std::vector<StatOf<Act>> lse;
};

template <class Act>
ForwardResult<Act> run_forward(const Problem<Act>& pb) {
  ForwardResult<Act> r;
  r.out.resize(pb.T * pb.shape.H * pb.shape.D_v);
  r.lse.resize(pb.T * pb.shape.H);
  const auto st = flashdsa::run_sparse_mla_fwd(pb.sparse_fwd(r.out.data(), r.lse.data()));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

// Random attention mass [T, K] for the sparse KL loss: positive, ~10% exact zeros (0 log 0) and
// row 5 entirely zero (no target: loss 0, zero gradients).
template <class Stat>
std::vector<Stat> random_mass(int64_t T, int K, Rng& rng) {
  std::vector<Stat> mass(T * K);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < T * K; ++i) mass[i] = u(rng) < 0.1 ? Stat(0) : static_cast<Stat>(2 * u(rng));
  if (T > 5) std::fill(mass.begin() + 5 * K, mass.begin() + 6 * K, Stat(0));
  return mass;
}

// d total / d loss_rows[t] = grad_scale * grad_rows[t].
inline std::vector<double> row_grads(const std::vector<double>& grad_rows, double grad_scale) {
  std::vector<double> G(grad_rows.size());
  for (size_t t = 0; t < G.size(); ++t) G[t] = grad_scale * grad_rows[t];
  return G;
}

}  // namespace fdt
