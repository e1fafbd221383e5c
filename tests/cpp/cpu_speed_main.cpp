// flashdsa_cpu_speed: times every CPU op once at the demo shape (one causal sequence, bf16) and
// prints seconds and GFLOP/s (docs/spec.md §9 counts).
//
// Usage: flashdsa_cpu_speed [--T 4096] [--H 16] [--K 512] [--H_I 32] [--D_I 128] [--threads N] [--dense]
// --dense also times the dense KL loss (O(T^2) work).
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "cpu/memory_tracker.h"
#include "flashdsa/flashdsa.h"

namespace {

using flashdsa::bf16;

struct Options {
  int64_t T = 4096;
  int H = 16, K = 512, H_I = 32, D_I = 128, threads = 0;
  bool dense = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", arg.c_str());
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (arg == "--T") o.T = next();
    else if (arg == "--H") o.H = static_cast<int>(next());
    else if (arg == "--K") o.K = static_cast<int>(next());
    else if (arg == "--H_I") o.H_I = static_cast<int>(next());
    else if (arg == "--D_I") o.D_I = static_cast<int>(next());
    else if (arg == "--threads") o.threads = static_cast<int>(next());
    else if (arg == "--dense") o.dense = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return o;
}

std::vector<bf16> random_bf16(size_t n, float amplitude, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  std::vector<bf16> v(n);
  for (auto& x : v) x = flashdsa::float_to_bf16(dist(rng));
  return v;
}

std::vector<float> random_float(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Runs op once, exits on failure, prints its wall time, the CPU time of all its threads (a better
// measure on a shared machine) and throughput; returns wall seconds.
double timed(const char* name, double gflop, const std::function<flashdsa::Status()>& op) {
  flashdsa::cpu::reset_peak_bytes();
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  const flashdsa::Status st = op();
  const double cpu_sec = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!st.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", name, st.to_string().c_str());
    std::exit(1);
  }
  std::printf("%-16s %8.3f s wall %8.3f s cpu %8.1f GFLOP %7.1f GFLOP/s  peak scratch %7.1f MiB\n", name, sec,
              cpu_sec, gflop, gflop / sec, flashdsa::cpu::peak_bytes() / 1048576.0);
  return sec;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) flashdsa::detail::set_num_threads(o.threads);
  const int64_t T = o.T;
  const int H = o.H, K = o.K, H_I = o.H_I, D_I = o.D_I, D_qk = flashdsa::kDqk, D_v = flashdsa::kDv;
  std::printf("T=%lld H=%d K=%d H_I=%d D_I=%d D_qk=%d D_v=%d threads=%d bf16\n", static_cast<long long>(T), H, K,
              H_I, D_I, D_qk, D_v, flashdsa::detail::num_threads());

  std::mt19937 rng(1234);
  const auto q = random_bf16(T * H * D_qk, 1.0f, rng);
  const auto kv = random_bf16(T * D_qk, 1.0f, rng);
  const auto q_idx = random_bf16(T * H_I * D_I, 1.0f, rng);
  const auto k_idx = random_bf16(T * D_I, 1.0f, rng);
  const auto weights = random_float(T * H_I, -0.05f, 0.1f, rng);
  const auto dout = random_bf16(T * H * D_v, 1.0f, rng);
  const auto grad_rows = random_float(T, 0.5f, 1.0f, rng);
  std::vector<int32_t> k_start(T), k_end(T);
  const int32_t cu_seqlens[2] = {0, static_cast<int32_t>(T)};
  if (!flashdsa::build_key_ranges(cu_seqlens, 1, k_start.data(), k_end.data()).ok()) return 1;

  std::vector<int32_t> indices(T * K);
  std::vector<float> scores(T * K), lse(T * H), mass(T * K), loss_rows(T), dkv(T * D_qk), dk_idx(T * D_I),
      dweights(T * H_I);
  std::vector<bf16> out(T * H * D_v), dq(T * H * D_qk), dq_idx(T * H_I * D_I);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D_qk));

  double visible_pairs = 0;
  for (int64_t t = 0; t < T; ++t) visible_pairs += k_end[t] - k_start[t];
  const double slots = static_cast<double>(T) * K;
  double total = 0;

  flashdsa::IndexerTopkParams ip;
  ip.indexer.q_idx = q_idx.data(); ip.indexer.k_idx = k_idx.data(); ip.indexer.weights = weights.data();
  ip.k_start = k_start.data(); ip.k_end = k_end.data(); ip.indices = indices.data(); ip.scores = scores.data();
  ip.T = T; ip.T_kv = T; ip.indexer.H_I = H_I; ip.indexer.D_I = D_I; ip.K = K;
  ip.indexer.q_idx_stride_t = H_I * D_I; ip.indexer.q_idx_stride_h = D_I; ip.indexer.k_idx_stride_t = D_I; ip.indexer.weights_stride_t = H_I;
  total += timed("indexer_topk", 2e-9 * visible_pairs * H_I * D_I, [&] { return flashdsa::run_indexer_topk(ip); });

  flashdsa::SparseMlaFwdParams fp;
  fp.attn.q = q.data(); fp.attn.kv = kv.data(); fp.topk.indices = indices.data(); fp.attn.scale = scale;
  fp.out = out.data(); fp.lse = lse.data(); fp.T = T; fp.T_kv = T; fp.attn.H = H; fp.topk.K = K;
  fp.attn.q_stride_t = H * D_qk; fp.attn.q_stride_h = D_qk; fp.attn.kv_stride_t = D_qk; fp.topk.stride_t = K;
  total += timed("sparse_mla_fwd", 2e-9 * slots * H * (D_qk + D_v), [&] { return flashdsa::run_sparse_mla_fwd(fp); });

  flashdsa::SparseMlaBwdParams bp;
  bp.attn.q = q.data(); bp.attn.kv = kv.data(); bp.topk.indices = indices.data(); bp.attn.scale = scale;
  bp.out = out.data(); bp.lse = lse.data(); bp.dout = dout.data(); bp.dq = dq.data(); bp.dkv = dkv.data();
  bp.T = T; bp.T_kv = T; bp.attn.H = H; bp.topk.K = K;
  bp.attn.q_stride_t = H * D_qk; bp.attn.q_stride_h = D_qk; bp.attn.kv_stride_t = D_qk; bp.topk.stride_t = K;
  total += timed("sparse_mla_bwd", 2e-9 * slots * H * (3 * D_qk + 2 * D_v),
                 [&] { return flashdsa::run_sparse_mla_bwd(bp); });

  flashdsa::AttnMassParams mp;
  mp.attn.q = q.data(); mp.attn.kv = kv.data(); mp.topk.indices = indices.data(); mp.lse = lse.data(); mp.attn.scale = scale;
  mp.mass = mass.data(); mp.T = T; mp.T_kv = T; mp.attn.H = H; mp.topk.K = K;
  mp.attn.q_stride_t = H * D_qk; mp.attn.q_stride_h = D_qk; mp.attn.kv_stride_t = D_qk; mp.topk.stride_t = K;
  total += timed("attention_mass", 2e-9 * slots * H * D_qk, [&] { return flashdsa::run_attention_mass(mp); });

  flashdsa::SparseKlParams kp;
  kp.indexer.q_idx = q_idx.data(); kp.indexer.k_idx = k_idx.data(); kp.indexer.weights = weights.data(); kp.topk.indices = indices.data();
  kp.mass = mass.data(); kp.T = T; kp.T_kv = T; kp.indexer.H_I = H_I; kp.indexer.D_I = D_I; kp.topk.K = K;
  kp.indexer.q_idx_stride_t = H_I * D_I; kp.indexer.q_idx_stride_h = D_I; kp.indexer.k_idx_stride_t = D_I; kp.indexer.weights_stride_t = H_I;
  kp.topk.stride_t = K; kp.loss_rows = loss_rows.data(); kp.grad_rows = grad_rows.data();
  kp.dq_idx = dq_idx.data(); kp.dk_idx = dk_idx.data(); kp.dweights = dweights.data();
  const double kl_gflop = 2e-9 * slots * H_I * D_I;
  total += timed("sparse_kl_fwd", kl_gflop, [&] { return flashdsa::run_sparse_kl_fwd(kp); });
  total += timed("sparse_kl_bwd", 4 * kl_gflop, [&] { return flashdsa::run_sparse_kl_bwd(kp); });
  std::printf("%-16s %8.3f s\n", "total", total);

  if (o.dense) {
    flashdsa::DenseKlParams dp;
    dp.attn.q = q.data(); dp.attn.kv = kv.data(); dp.attn.scale = scale; dp.attn.H = H;
    dp.indexer.q_idx = q_idx.data(); dp.indexer.k_idx = k_idx.data(); dp.indexer.weights = weights.data();
    dp.k_start = k_start.data(); dp.k_end = k_end.data(); dp.T = T; dp.T_kv = T; dp.indexer.H_I = H_I; dp.indexer.D_I = D_I;
    dp.attn.q_stride_t = H * D_qk; dp.attn.q_stride_h = D_qk; dp.attn.kv_stride_t = D_qk;
    dp.indexer.q_idx_stride_t = H_I * D_I; dp.indexer.q_idx_stride_h = D_I; dp.indexer.k_idx_stride_t = D_I; dp.indexer.weights_stride_t = H_I;
    dp.loss_rows = loss_rows.data(); dp.grad_rows = grad_rows.data();
    dp.dq_idx = dq_idx.data(); dp.dk_idx = dk_idx.data(); dp.dweights = dweights.data();
    const double pass = 2e-9 * visible_pairs * (H * D_qk + H_I * D_I);
    timed("dense_kl_fwd", 2 * pass, [&] { return flashdsa::run_dense_kl_fwd(dp); });
    timed("dense_kl_bwd", 3 * pass + 4e-9 * visible_pairs * H_I * D_I, [&] { return flashdsa::run_dense_kl_bwd(dp); });
  }
  return 0;
}
