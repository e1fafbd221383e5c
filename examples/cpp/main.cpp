// A FlashDSA C++ program that uses only the public headers (include/flashdsa/): one packed batch of
// two causal sequences on the CPU backend, in fp32 at small sizes. It builds the key ranges, selects
// the top-k keys with the lightning indexer, runs the sparse MLA forward and backward, and checks
// one output row against a direct computation of docs/spec.md §4. Exit status 0 when it matches.
//
// Built by the project's CMake (target flashdsa_example, run by ctest) or, against an installed
// FlashDSA, by this folder's CMakeLists.txt (find_package(flashdsa)).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "flashdsa/flashdsa.h"

namespace {

bool ok(const flashdsa::Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
  return st.ok();
}

// The main-attention fields the forward and the backward share: contiguous fp32 q [T, H, D_qk],
// kv [T, D_qk] and top-k indices [T, K].
template <class P>
void set_attention(P& p, const float* q, const float* kv, const int32_t* indices, float scale, int64_t T, int H,
                   int K, int D_qk, int D_v) {
  p.attn.dtype = flashdsa::DType::kFP32;
  p.attn.q = q;
  p.attn.kv = kv;
  p.topk.indices = indices;
  p.attn.scale = scale;
  p.T = p.T_kv = T;
  p.attn.H = H;
  p.topk.K = K;
  p.attn.D_qk = D_qk;
  p.attn.D_v = D_v;
  p.attn.q_stride_t = static_cast<int64_t>(H) * D_qk;
  p.attn.q_stride_h = D_qk;
  p.attn.kv_stride_t = D_qk;
  p.topk.stride_t = K;
}

}  // namespace

int main() {
  // Two sequences of 40 and 24 tokens; small sizes (the CPU backend's fp32 path).
  const std::vector<int32_t> cu_seqlens = {0, 40, 64};
  const int64_t T = 64;
  const int H = 4, D_qk = 32, D_v = 16, H_I = 2, D_I = 16, K = 8;

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> q = random(T * H * D_qk), kv = random(T * D_qk);
  const std::vector<float> q_idx = random(T * H_I * D_I), k_idx = random(T * D_I), weights = random(T * H_I);

  if (!ok(flashdsa::set_cpu_num_threads(2), "set_cpu_num_threads")) return 1;

  // Key ranges: token t of sequence b sees [cu_seqlens[b], t + 1).
  std::vector<int32_t> k_start(T), k_end(T);
  if (!ok(flashdsa::build_key_ranges(cu_seqlens.data(), 2, k_start.data(), k_end.data()), "build_key_ranges")) return 1;

  // Lightning indexer + top-k.
  std::vector<int32_t> indices(T * K);
  flashdsa::IndexerTopkParams ip;
  ip.indexer.dtype = flashdsa::DType::kFP32;
  ip.indexer.q_idx = q_idx.data();
  ip.indexer.k_idx = k_idx.data();
  ip.indexer.weights = weights.data();
  ip.k_start = k_start.data();
  ip.k_end = k_end.data();
  ip.indices = indices.data();
  ip.T = ip.T_kv = T;
  ip.indexer.H_I = H_I;
  ip.indexer.D_I = D_I;
  ip.K = K;
  ip.indexer.q_idx_stride_t = H_I * D_I;
  ip.indexer.q_idx_stride_h = D_I;
  ip.indexer.k_idx_stride_t = D_I;
  ip.indexer.weights_stride_t = H_I;
  if (!ok(flashdsa::run_indexer_topk(ip), "run_indexer_topk")) return 1;

  // Sparse MLA forward over the selected keys.
  const float scale = 1.f / std::sqrt(static_cast<float>(D_qk));
  std::vector<float> out(T * H * D_v), lse(T * H);
  flashdsa::SparseMlaFwdParams fp;
  set_attention(fp, q.data(), kv.data(), indices.data(), scale, T, H, K, D_qk, D_v);
  fp.out = out.data();
  fp.lse = lse.data();
  if (!ok(flashdsa::run_sparse_mla_fwd(fp), "run_sparse_mla_fwd")) return 1;

  // Backward with an all-ones upstream gradient.
  const std::vector<float> dout(T * H * D_v, 1.f);
  std::vector<float> dq(T * H * D_qk), dkv(T * D_qk);
  flashdsa::SparseMlaBwdParams bp;
  set_attention(bp, q.data(), kv.data(), indices.data(), scale, T, H, K, D_qk, D_v);
  bp.out = out.data();
  bp.lse = lse.data();
  bp.dout = dout.data();
  bp.dq = dq.data();
  bp.dkv = dkv.data();
  if (!ok(flashdsa::run_sparse_mla_bwd(bp), "run_sparse_mla_bwd")) return 1;

  // Direct computation of one row (token 50, head 3): softmax over its valid slots, then V.
  const int64_t t = 50;
  const int h = 3;
  std::vector<double> logits;
  std::vector<int32_t> keys;
  for (int j = 0; j < K; ++j) {
    const int32_t s = indices[t * K + j];
    if (s < 0 || s >= T) continue;
    if (s < k_start[t] || s >= k_end[t]) {
      std::fprintf(stderr, "row %lld selected key %d outside its range\n", static_cast<long long>(t), s);
      return 1;
    }
    double dot = 0;
    for (int d = 0; d < D_qk; ++d) dot += double(q[(t * H + h) * D_qk + d]) * kv[s * D_qk + d];
    logits.push_back(scale * dot);
    keys.push_back(s);
  }
  double m = -INFINITY, sum = 0;
  for (double l : logits) m = std::max(m, l);
  for (double l : logits) sum += std::exp(l - m);
  double max_err = std::fabs(m + std::log(sum) - lse[t * H + h]);
  for (int d = 0; d < D_v; ++d) {
    double o = 0;
    for (size_t i = 0; i < keys.size(); ++i) o += std::exp(logits[i] - m) / sum * kv[keys[i] * D_qk + d];
    max_err = std::max(max_err, std::fabs(o - out[(t * H + h) * D_v + d]));
  }
  double dq_norm = 0;
  for (float g : dq) dq_norm += double(g) * g;
  std::printf("flashdsa example: T = %lld, K = %d, %zu valid slots in row %lld, max |out - direct| = %.2e, "
              "|dq| = %.3f, CPU threads = %d\n",
              static_cast<long long>(T), K, keys.size(), static_cast<long long>(t), max_err, std::sqrt(dq_norm),
              flashdsa::cpu_num_threads());
  return max_err < 1e-4 && std::isfinite(dq_norm) ? 0 : 1;
}
