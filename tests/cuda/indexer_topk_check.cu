// Standalone check + benchmark of the Hopper fused lightning indexer + top-k
// (csrc/sm90/indexer_topk, docs/spec.md §3).
//
// Build: the CMake target indexer_topk_check (links the library; `cmake --build build --target indexer_topk_check`).
// Run:
//   /tmp/indexer_topk_check [--small] [--no-bench] [--bench-only] [--bench-T 8192,32768] [--bench-H 32,64] [--seed N]
//                           [--bench-cap N]
//   --small: only a few small cases (for compute-sanitizer memcheck / racecheck), implies --no-bench.
//   --bench-only: skip the correctness cases; --bench-T / --bench-H: the benchmark's sequence lengths / heads.
//   --bench-cap N: also time candidate capacity N (a multiple of 64), alternated with the default.
// Exit code: 0 all cases pass, 1 a case failed, 77 no CUDA device.
//
// Correctness: every case is checked against a double-precision CPU reference. A row passes when
//  - its first min(n, K) slots hold distinct keys of its range [k_start, k_end) and the rest are -1
//    with score -inf (n = number of visible keys),
//  - each returned score equals the reference score of its key within tol,
//  - every selected key's reference score is >= the reference K-th largest score - tol, and every
//    visible key left out scores <= that value + tol (the selection is the exact top K up to ties),
//  - the sorted selected scores equal the sorted reference top K within tol (multiset check).
// tol = 4e-6 * sum_h |w_h| * |q_h|_2 * max_s |k_s|_2 (fp32 accumulation bound), or 0 for the
// integer-valued "ties" case whose scores are exact in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "flashdsa/ops.h"
#include "flashdsa/types.h"
#include "sm90/indexer_topk/indexer_topk.h"
#include "sm90/backend.h"
#include "check_common.cuh"

namespace {

using flashdsa::bf16;
namespace impl = flashdsa::sm90::indexer_topk_impl;

using flashdsa_check::DeviceBuffer;
using flashdsa_check::download;
using flashdsa_check::parallel_for;
using flashdsa_check::upload;

// ---------------------------------------------------------------------------------------------
// Problems: inputs on the host (strided like the kernel sees them) plus the key ranges.
struct Problem {
  std::string name;
  int64_t T = 0, T_kv = 0;
  int H = 32, D = 128, K = 64;
  bool relu = true;
  int64_t q_st = 0, q_sh = 0, k_st = 0, w_st = 0;  // element strides
  std::vector<bf16> q;                              // [T, H, D] at q_st, q_sh
  std::vector<bf16> k;                              // [T_kv, D] at k_st
  std::vector<float> w;                             // [T, H] at w_st
  std::vector<int32_t> k_start, k_end;              // [T]
  bool exact = false;                               // integer-valued data: scores exact in fp32

  float q_at(int64_t t, int h, int d) const { return flashdsa::bf16_to_float(q[t * q_st + h * q_sh + d]); }
  float k_at(int64_t s, int d) const { return flashdsa::bf16_to_float(k[s * k_st + d]); }
  float w_at(int64_t t, int h) const { return w[t * w_st + h]; }
};

void set_ranges(flashdsa_check::KeyRanges r, Problem& p) {
  p.k_start = std::move(r.k_start);
  p.k_end = std::move(r.k_end);
  p.T = r.T;
  p.T_kv = r.T_kv;
}

// THD causal ranges for packed sequences of the given lengths (keys = queries).
void thd_causal_ranges(const std::vector<int>& lens, Problem& p) { set_ranges(flashdsa_check::thd_causal_ranges(lens), p); }

// Context-parallel zigzag ranges: the global batch has sequences of the given lengths (multiples of
// 2 cp); this rank holds chunks `rank` and 2 cp - 1 - rank of each; keys are the global sequence.
void cp_zigzag_ranges(const std::vector<int>& lens, int cp, int rank, Problem& p) {
  set_ranges(flashdsa_check::cp_zigzag_ranges(lens, cp, rank), p);
}

// Fills q, k, w with fresh random values; pad_* add unused elements to the strides.
void fill_random(Problem& p, std::mt19937_64& rng, int pad_qh = 0, int pad_qt = 0, int pad_k = 0, int pad_w = 0) {
  p.q_sh = p.D + pad_qh;
  p.q_st = p.H * p.q_sh + pad_qt;
  p.k_st = p.D + pad_k;
  p.w_st = p.H + pad_w;
  p.q.assign(static_cast<size_t>(std::max<int64_t>(p.T, 1) * p.q_st), flashdsa::float_to_bf16(0.f));
  p.k.assign(static_cast<size_t>(std::max<int64_t>(p.T_kv, 1) * p.k_st), flashdsa::float_to_bf16(0.f));
  p.w.assign(static_cast<size_t>(std::max<int64_t>(p.T, 1) * p.w_st), 0.f);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::uniform_int_distribution<int> small_int(-1, 1);
  std::uniform_int_distribution<int> pow2(-3, 0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int h = 0; h < p.H; ++h) {
      for (int d = 0; d < p.D; ++d)
        p.q[t * p.q_st + h * p.q_sh + d] = flashdsa::float_to_bf16(p.exact ? float(small_int(rng)) : uni(rng));
      // Mostly positive weights with some negative ones, as a learned weights_proj gives.
      p.w[t * p.w_st + h] = p.exact ? std::ldexp(1.f, pow2(rng)) * float(small_int(rng)) : 0.25f * (uni(rng) + 0.6f);
    }
  for (int64_t s = 0; s < p.T_kv; ++s)
    for (int d = 0; d < p.D; ++d) p.k[s * p.k_st + d] = flashdsa::float_to_bf16(p.exact ? float(small_int(rng)) : uni(rng));
}

// ---------------------------------------------------------------------------------------------
// Reference and row check.
struct RowResult {
  bool ok = true;
  double max_score_err = 0;     // max |gpu score - ref score of the same key| / tol
  double max_multiset_err = 0;  // max |sorted gpu-selected ref - sorted ref top K| / tol
  std::string why;              // first failure
};

// Reference scores of row t over its range (double) and the row's tolerance.
struct RowReference {
  std::vector<double> scores;  // [k_end - k_start]
  double tol = 0;
};

double max_key_norm(const Problem& p) {
  double m = 0;
  for (int64_t s = 0; s < p.T_kv; ++s) {
    double n = 0;
    for (int d = 0; d < p.D; ++d) n += double(p.k_at(s, d)) * p.k_at(s, d);
    m = std::max(m, std::sqrt(n));
  }
  return m;
}

RowReference reference_row(const Problem& p, int64_t t, double max_k_norm) {
  RowReference ref;
  const int64_t s0 = p.k_start[t], s1 = p.k_end[t];
  ref.scores.assign(static_cast<size_t>(s1 - s0), 0.0);
  std::vector<float> qf(static_cast<size_t>(p.H) * p.D), kf(p.D);
  double bound = 0;
  for (int h = 0; h < p.H; ++h) {
    double qn = 0;
    for (int d = 0; d < p.D; ++d) {
      qf[h * p.D + d] = p.q_at(t, h, d);
      qn += double(qf[h * p.D + d]) * qf[h * p.D + d];
    }
    bound += std::fabs(p.w_at(t, h)) * std::sqrt(qn) * max_k_norm;
  }
  ref.tol = p.exact ? 0.0 : 4e-6 * bound;
  for (int64_t s = s0; s < s1; ++s) {
    for (int d = 0; d < p.D; ++d) kf[d] = p.k_at(s, d);
    double total = 0;
    for (int h = 0; h < p.H; ++h) {
      double dot = 0;
      for (int d = 0; d < p.D; ++d) dot += double(qf[h * p.D + d]) * kf[d];  // bf16 x bf16 is exact in fp32
      const double f = p.relu ? std::max(dot, 0.0) : dot;
      total += double(p.w_at(t, h)) * f;
    }
    ref.scores[static_cast<size_t>(s - s0)] = total;
  }
  return ref;
}

RowResult check_row(const Problem& p, int64_t t, const RowReference& rr, const int32_t* idx, const float* sc) {
  RowResult r;
  auto fail = [&r](const std::string& why) {
    if (r.ok) r.why = why;
    r.ok = false;
  };
  const int64_t s0 = p.k_start[t], n = p.k_end[t] - s0;
  const int64_t expect = std::min<int64_t>(n, p.K);
  const std::vector<double>& ref = rr.scores;
  const double tol = rr.tol;
  const double denom = tol > 0 ? tol : 1.0;

  std::vector<char> picked(static_cast<size_t>(n), 0);
  std::vector<double> sel_ref;
  for (int j = 0; j < p.K; ++j) {
    if (j >= expect) {
      if (idx[j] != -1 || !(std::isinf(sc[j]) && sc[j] < 0))
        fail("slot " + std::to_string(j) + " should be empty (-1, -inf), got " + std::to_string(idx[j]));
      continue;
    }
    const int64_t s = idx[j];
    if (s < s0 || s >= s0 + n) {
      fail("slot " + std::to_string(j) + " key " + std::to_string(s) + " outside the range");
      continue;
    }
    if (picked[s - s0]) fail("key " + std::to_string(s) + " selected twice");
    picked[s - s0] = 1;
    const double e = std::fabs(double(sc[j]) - ref[s - s0]);
    r.max_score_err = std::max(r.max_score_err, e / denom);
    if (e > tol) fail("score of key " + std::to_string(s) + " off by " + std::to_string(e));
    sel_ref.push_back(ref[s - s0]);
  }
  if (!r.ok) return r;
  std::vector<double> sorted_ref = ref;
  std::sort(sorted_ref.begin(), sorted_ref.end(), std::greater<double>());
  std::sort(sel_ref.begin(), sel_ref.end(), std::greater<double>());
  const double kth = expect > 0 ? sorted_ref[expect - 1] : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (picked[i] && ref[i] < kth - tol) fail("selected key " + std::to_string(s0 + i) + " is below the K-th score");
    if (!picked[i] && ref[i] > kth + tol) fail("key " + std::to_string(s0 + i) + " above the K-th score was left out");
  }
  for (int64_t i = 0; i < expect; ++i) {
    const double e = std::fabs(sel_ref[i] - sorted_ref[i]);
    r.max_multiset_err = std::max(r.max_multiset_err, e / denom);
    if (e > tol) fail("sorted selection differs from the reference top K at rank " + std::to_string(i));
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// GPU run of one problem. capacity 0 = the public entry point (default candidate capacity).
struct GpuResult {
  std::vector<int32_t> idx;
  std::vector<float> scores;
  size_t workspace_bytes = 0;
};

flashdsa::IndexerTopkParams make_params(const Problem& p, const DeviceBuffer& q, const DeviceBuffer& k,
                                        const DeviceBuffer& w, const DeviceBuffer& ks, const DeviceBuffer& ke,
                                        DeviceBuffer& idx, DeviceBuffer& sc) {
  flashdsa::IndexerTopkParams prm;
  prm.device = flashdsa::Device::kCUDA;
  prm.indexer = flashdsa_check::indexer_part(q.ptr, k.ptr, w.ptr, p.H, p.D, p.relu, p.q_st, p.q_sh, p.k_st, p.w_st);
  prm.k_start = ks.as<int32_t>();
  prm.k_end = ke.as<int32_t>();
  prm.indices = idx.as<int32_t>();
  prm.scores = sc.ptr;
  prm.T = p.T;
  prm.T_kv = p.T_kv;
  prm.K = p.K;
  return prm;
}

size_t workspace_bytes_for(const flashdsa::IndexerTopkParams& prm, int capacity) {
  return capacity == 0 ? flashdsa::sm90::indexer_topk_workspace_size(prm) : impl::workspace_size(prm, capacity);
}

flashdsa::Status launch(const flashdsa::IndexerTopkParams& prm, int capacity) {
  return capacity == 0 ? flashdsa::sm90::indexer_topk(prm) : impl::run(prm, capacity);
}

bool run_gpu(const Problem& p, int capacity, GpuResult& out) {
  DeviceBuffer q(p.q.size() * sizeof(bf16)), k(p.k.size() * sizeof(bf16)), w(p.w.size() * sizeof(float));
  DeviceBuffer ks(p.T * sizeof(int32_t) + 16), ke(p.T * sizeof(int32_t) + 16);
  DeviceBuffer idx(p.T * p.K * sizeof(int32_t) + 16), sc(p.T * p.K * sizeof(float) + 16);
  upload(q, p.q);
  upload(k, p.k);
  upload(w, p.w);
  upload(ks, p.k_start);
  upload(ke, p.k_end);
  // Garbage in the outputs, so that a slot the kernel does not write fails the check.
  FLASHDSA_CHECK_CUDA(cudaMemset(idx.ptr, 0x7b, idx.bytes));
  FLASHDSA_CHECK_CUDA(cudaMemset(sc.ptr, 0x7b, sc.bytes));
  flashdsa::IndexerTopkParams prm = make_params(p, q, k, w, ks, ke, idx, sc);
  out.workspace_bytes = workspace_bytes_for(prm, capacity);
  DeviceBuffer ws(out.workspace_bytes);
  prm.workspace = ws.ptr;
  prm.workspace_bytes = ws.bytes;
  const flashdsa::Status st = launch(prm, capacity);
  if (!st.ok()) {
    std::printf("    launch failed: %s\n", st.message().c_str());
    return false;
  }
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  out.idx.resize(static_cast<size_t>(p.T * p.K));
  out.scores.resize(static_cast<size_t>(p.T * p.K));
  if (p.T > 0) {
    FLASHDSA_CHECK_CUDA(cudaMemcpy(out.idx.data(), idx.ptr, out.idx.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    FLASHDSA_CHECK_CUDA(cudaMemcpy(out.scores.data(), sc.ptr, out.scores.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  return true;
}

// Runs the problem at each candidate capacity (0 = the public entry point's default), checks every
// row against one reference, prints one line per capacity; returns pass.
bool check_problem(const Problem& p, const std::vector<int>& capacities) {
  std::vector<GpuResult> runs(capacities.size());
  std::vector<char> launched(capacities.size());
  for (size_t c = 0; c < capacities.size(); ++c) launched[c] = run_gpu(p, capacities[c], runs[c]);
  const double kn = max_key_norm(p);
  std::vector<std::vector<RowResult>> rows(capacities.size(), std::vector<RowResult>(static_cast<size_t>(p.T)));
  parallel_for(p.T, [&](int64_t t) {
    const RowReference ref = reference_row(p, t, kn);
    for (size_t c = 0; c < capacities.size(); ++c)
      if (launched[c]) rows[c][t] = check_row(p, t, ref, &runs[c].idx[t * p.K], &runs[c].scores[t * p.K]);
  });
  bool all = true;
  for (size_t c = 0; c < capacities.size(); ++c) {
    const std::string cap_name = capacities[c] == 0 ? "default" : std::to_string(capacities[c]);
    if (!launched[c]) {
      std::printf("  %-30s cap %-7s FAIL (launch)\n", p.name.c_str(), cap_name.c_str());
      all = false;
      continue;
    }
    double score_err = 0, multiset_err = 0;
    int64_t bad = 0, first_bad = -1;
    for (int64_t t = 0; t < p.T; ++t) {
      score_err = std::max(score_err, rows[c][t].max_score_err);
      multiset_err = std::max(multiset_err, rows[c][t].max_multiset_err);
      if (!rows[c][t].ok && bad++ == 0) first_bad = t;
    }
    std::printf("  %-30s cap %-7s T %5lld T_kv %5lld  max score err %.3f tol  max multiset err %.3f tol  %s\n",
                p.name.c_str(), cap_name.c_str(), (long long)p.T, (long long)p.T_kv, score_err, multiset_err,
                bad == 0 ? "PASS" : "FAIL");
    if (bad > 0)
      std::printf("    %lld bad rows; first: row %lld: %s\n", (long long)bad, (long long)first_bad,
                  rows[c][first_bad].why.c_str());
    all = all && bad == 0;
  }
  return all;
}

std::vector<Problem> correctness_problems(bool small, std::mt19937_64& rng) {
  std::vector<Problem> ps;
  auto add = [&](const std::string& name, int H, int D, int K, bool relu, const std::function<void(Problem&)>& ranges,
                 bool exact = false, bool padded = false) {
    Problem p;
    p.name = name;
    p.H = H, p.D = D, p.K = K, p.relu = relu, p.exact = exact;
    ranges(p);
    if (padded)
      fill_random(p, rng, 8, 24, 16, 3);
    else
      fill_random(p, rng);
    ps.push_back(std::move(p));
  };
  // Rows whose range is made empty: every 97th.
  auto with_empty_rows = [](Problem& p) {
    for (int64_t t = 0; t < p.T; t += 97) p.k_end[t] = p.k_start[t];
  };
  if (small) {
    add("thd H32 D128 K64 relu", 32, 128, 64, true, [&](Problem& p) {
      thd_causal_ranges({37, 129, 301}, p);
      with_empty_rows(p);
    });
    add("cp2 H64 D64 K128 linear", 64, 64, 128, false, [](Problem& p) { cp_zigzag_ranges({512, 256}, 2, 1, p); });
    add("ties H32 D64 K64 relu", 32, 64, 64, true, [](Problem& p) { thd_causal_ranges({400}, p); }, true);
    return ps;
  }
  add("thd H32 D128 K64 relu", 32, 128, 64, true, [&](Problem& p) {
    thd_causal_ranges({37, 301, 129, 555, 1000, 3}, p);
    with_empty_rows(p);
  });
  add("thd H64 D128 K128 relu", 64, 128, 128, true, [](Problem& p) { thd_causal_ranges({1, 700, 63, 65, 1201}, p); });
  add("causal H32 D64 K2048 relu", 32, 64, 2048, true, [](Problem& p) { thd_causal_ranges({3000}, p); });
  add("causal H64 D128 K2048 linear", 64, 128, 2048, false, [](Problem& p) { thd_causal_ranges({2500}, p); });
  // Lists longer than the register-resident selection takes (4096): the streamed selection path.
  add("causal H32 D64 K4096 relu", 32, 64, 4096, true, [](Problem& p) { thd_causal_ranges({4400}, p); });
  add("cp4 H64 D64 K128 relu", 64, 64, 128, true, [](Problem& p) { cp_zigzag_ranges({1600, 800}, 4, 1, p); });
  add("cp2 H32 D128 K64 linear", 32, 128, 64, false, [](Problem& p) { cp_zigzag_ranges({2048}, 2, 0, p); });
  add("ties H32 D128 K128 relu", 32, 128, 128, true, [](Problem& p) { thd_causal_ranges({1500, 333}, p); }, true);
  add("ties H64 D64 K64 linear", 64, 64, 64, false, [](Problem& p) { thd_causal_ranges({900}, p); }, true);
  add("strided H64 D128 K64 relu", 64, 128, 64, true, [](Problem& p) { thd_causal_ranges({450, 777}, p); }, false,
      true);
  add("no keys H32 D64 K64", 32, 64, 64, true, [](Problem& p) {
    p.T = 7;
    p.T_kv = 0;
    p.k_start.assign(7, 0);
    p.k_end.assign(7, 0);
  });
  return ps;
}

// ---------------------------------------------------------------------------------------------
// Benchmark: one causal sequence, D = 128, K = 2048, random inputs generated on the device.
__global__ void fill_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(float(z >> 40) * (2.f / 16777216.f) - 1.f);
  }
}
__global__ void fill_weights(float* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
    z ^= z >> 29;
    x[i] = 0.25f * (float(z >> 40) * (2.f / 16777216.f) - 0.4f);
  }
}


// bench_cap > 0: each shape is also timed at that candidate capacity, alternated with the default in
// the same process on the same inputs (an A/B of the capacity without a rebuild).
bool benchmark(uint64_t seed, const std::vector<int64_t>& Ts, const std::vector<int>& Hs, int bench_cap) {
  const int D = 128, K = 2048;
  bool ok = true;
  std::printf("\nBenchmark: one causal sequence, D_I = %d, K = %d, relu, median of 10 (CUDA events)\n", D, K);
  std::printf("  %-3s %7s %10s %10s %12s %14s   %s\n", "H_I", "T", "ms", "TFLOP/s", "workspace", "mem delta", "spot check");
  for (int H : Hs) {
    for (int64_t T : Ts) {
      DeviceBuffer q(size_t(T) * H * D * sizeof(bf16)), k(size_t(T) * D * sizeof(bf16)), w(size_t(T) * H * sizeof(float));
      DeviceBuffer ks(size_t(T) * sizeof(int32_t)), ke(size_t(T) * sizeof(int32_t));
      DeviceBuffer idx(size_t(T) * K * sizeof(int32_t)), sc(size_t(T) * K * sizeof(float));
      fill_bf16<<<1024, 256>>>(q.as<__nv_bfloat16>(), T * H * D, seed + 1);
      fill_bf16<<<1024, 256>>>(k.as<__nv_bfloat16>(), T * D, seed + 2);
      fill_weights<<<1024, 256>>>(w.as<float>(), T * H, seed + 3);
      const flashdsa_check::KeyRanges causal = flashdsa_check::thd_causal_ranges({static_cast<int>(T)});  // one sequence
      upload(ks, causal.k_start);
      upload(ke, causal.k_end);
      FLASHDSA_CHECK_CUDA(cudaGetLastError());
      Problem shape;
      shape.T = shape.T_kv = T;
      shape.H = H, shape.D = D, shape.K = K, shape.relu = true;
      shape.q_sh = D, shape.q_st = int64_t(H) * D, shape.k_st = D, shape.w_st = H;
      flashdsa::IndexerTopkParams prm = make_params(shape, q, k, w, ks, ke, idx, sc);
      const size_t ws_bytes = flashdsa::sm90::indexer_topk_workspace_size(prm);
      size_t free_before = 0, free_after = 0, total = 0;
      FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
      FLASHDSA_CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
      const size_t ws_cap = bench_cap > 0 ? impl::workspace_size(prm, bench_cap) : 0;
      DeviceBuffer ws(std::max(ws_bytes, ws_cap));
      prm.workspace = ws.ptr;
      prm.workspace_bytes = ws.bytes;
      const flashdsa::Status st = flashdsa::sm90::indexer_topk(prm);  // warm-up
      if (!st.ok()) {
        std::printf("  launch failed: %s\n", st.message().c_str());
        return false;
      }
      FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
      FLASHDSA_CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
      double med = flashdsa_check::median_ms([&] { (void)flashdsa::sm90::indexer_topk(prm); }, 0, 10);
      double med_cap = 0.0;
      if (bench_cap > 0) {  // default, cap, default, cap: the minimum of each
        const flashdsa::Status cst = impl::run(prm, bench_cap);
        if (!cst.ok()) {
          std::printf("  launch at cap %d failed: %s\n", bench_cap, cst.message().c_str());
          return false;
        }
        med_cap = flashdsa_check::median_ms([&] { (void)impl::run(prm, bench_cap); }, 0, 10);
        med = std::min(med, flashdsa_check::median_ms([&] { (void)flashdsa::sm90::indexer_topk(prm); }, 0, 10));
        med_cap = std::min(med_cap, flashdsa_check::median_ms([&] { (void)impl::run(prm, bench_cap); }, 0, 10));
        FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
      }
      const double pairs = double(T) * double(T + 1) / 2.0;
      const double tflops = 2.0 * pairs * H * D / (med * 1e-3) / 1e12;

      // Spot check of a few rows at full size (the long rows exercise many compactions).
      std::string spot = "skipped";
      if (T == Ts.front()) {
        const std::vector<int64_t> rows = {0, 100, K - 1, K, K + 1, 5000, T / 2, T - 2, T - 1};
        Problem sub = shape;
        sub.k = download<bf16>(k.ptr, size_t(T) * D);
        sub.q.assign(size_t(T) * H * D, flashdsa::float_to_bf16(0.f));
        sub.w.assign(size_t(T) * H, 0.f);
        sub.k_start.assign(size_t(T), 0);
        sub.k_end.resize(size_t(T));
        for (int64_t t = 0; t < T; ++t) sub.k_end[t] = static_cast<int32_t>(t + 1);
        for (int64_t t : rows) {
          const auto qr = download<bf16>(q.as<bf16>() + t * H * D, size_t(H) * D);
          std::copy(qr.begin(), qr.end(), sub.q.begin() + t * H * D);
          const auto wr = download<float>(w.as<float>() + t * H, size_t(H));
          std::copy(wr.begin(), wr.end(), sub.w.begin() + t * H);
        }
        const double kn = max_key_norm(sub);
        std::vector<RowResult> res(rows.size());
        parallel_for(int64_t(rows.size()), [&](int64_t i) {
          const int64_t t = rows[i];
          const auto gi = download<int32_t>(idx.as<int32_t>() + t * K, K);
          const auto gs = download<float>(sc.as<float>() + t * K, K);
          res[i] = check_row(sub, t, reference_row(sub, t, kn), gi.data(), gs.data());
        });
        int bad = 0;
        for (size_t i = 0; i < rows.size(); ++i)
          if (!res[i].ok) {
            if (bad++ == 0) spot = "FAIL row " + std::to_string(rows[i]) + ": " + res[i].why;
          }
        if (bad == 0) spot = "PASS (" + std::to_string(rows.size()) + " rows)";
        ok = ok && bad == 0;
      }
      std::printf("  %-3d %7lld %10.3f %10.1f %9.1f MiB %10.1f MiB   %s\n", H, (long long)T, med, tflops,
                  ws_bytes / 1048576.0, (double(free_before) - double(free_after)) / 1048576.0, spot.c_str());
      if (bench_cap > 0)
        std::printf("  %-3d %7lld %10.3f ms at cap %d (default / cap = %.3f), workspace %.1f MiB\n", H, (long long)T,
                    med_cap, bench_cap, med / med_cap, ws_cap / 1048576.0);
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  bool small = false, bench = true, bench_only = false;
  uint64_t seed = std::random_device{}();
  std::vector<int64_t> bench_T = {32768, 65536, 131072};
  std::vector<int> bench_H = {32, 64};
  int bench_cap = 0;  // > 0: also time this candidate capacity (A/B with the default)
  // Comma-separated integer list, e.g. "8192,32768".
  auto parse_list = [](const char* text) {
    std::vector<int64_t> v;
    for (const char* c = text; *c;) {
      char* end = nullptr;
      v.push_back(std::strtoll(c, &end, 10));
      c = *end == ',' ? end + 1 : end;
      if (end == c && *c) break;
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) small = true, bench = false;
    else if (!std::strcmp(argv[i], "--no-bench")) bench = false;
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--bench-only")) bench_only = true;
    else if (!std::strcmp(argv[i], "--bench-cap") && i + 1 < argc) bench_cap = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--bench-T") && i + 1 < argc) bench_T = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--bench-H") && i + 1 < argc) {
      bench_H.clear();
      for (int64_t h : parse_list(argv[++i])) bench_H.push_back(static_cast<int>(h));
    }
  }
  cudaDeviceProp prop{};
  FLASHDSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  FLASHDSA_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("indexer_topk_check: %s, %d SMs, %.0f MHz, seed %llu\n", prop.name, prop.multiProcessorCount,
              clock_khz / 1000.0, (unsigned long long)seed);

  std::mt19937_64 rng(seed);
  bool ok = true;
  if (!bench_only) std::printf("Correctness vs double CPU reference (cap = candidate capacity; small caps force compactions):\n");
  for (const Problem& p : bench_only ? std::vector<Problem>{} : correctness_problems(small, rng)) {
    // Default capacity; the tightest legal one (a compaction almost every tile); one in between.
    std::vector<int> capacities = {0, p.K + 128};
    if (!small) capacities.push_back(p.K + 512);
    ok = check_problem(p, capacities) && ok;
  }
  {  // T == 0 is a no-op.
    flashdsa::IndexerTopkParams empty;
    empty.device = flashdsa::Device::kCUDA;
    empty.indexer.H_I = 32, empty.indexer.D_I = 128, empty.K = 64;
    const bool pass = flashdsa::sm90::indexer_topk(empty).ok();
    std::printf("  %-34s %s\n", "T = 0", pass ? "PASS" : "FAIL");
    ok = ok && pass;
  }
  if (bench) ok = benchmark(seed, bench_T, bench_H, bench_cap) && ok;
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
  return ok ? 0 : 1;
}
