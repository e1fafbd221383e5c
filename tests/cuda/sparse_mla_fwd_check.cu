// GPU check + benchmark of the Hopper sparse MLA forward (csrc/sm90/sparse_mla_fwd, docs/spec.md §4).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Icsrc \
//        -o /tmp/sparse_mla_fwd_check tests/cuda/sparse_mla_fwd_check.cu csrc/sm90/sparse_mla_fwd/*.cu
//   (add -DFLASHDSA_CHECK_WITH_CUBLAS -lcublas to also print the cuBLAS bf16 GEMM ceiling)
//
//   /tmp/sparse_mla_fwd_check              correctness cases, then the benchmark tables
//   /tmp/sparse_mla_fwd_check --no-bench   correctness only
//   /tmp/sparse_mla_fwd_check --bench-only the benchmark tables only
//   /tmp/sparse_mla_fwd_check --small      a few tiny cases, no benchmark (for compute-sanitizer)
//
// Correctness: fresh random data against a double-precision CPU reference written here; -1 and
// out-of-range indices, duplicates, an all-empty row, rows whose first block is empty, T not a
// multiple of anything, non-contiguous strides, T_kv >= 16K (beyond what L2 holds at benchmark T).
// Outputs are pre-filled with NaN (everything must be written) and followed by guard words (nothing
// beyond must be written). Each case runs twice: the second output must be bitwise equal to the first
// (the op is deterministic).
// Benchmark: H = 64, K = 2048, T = T_kv in {16K, ..., 128K} (+ H = 16 / 32 / 128 at 32K) with indices
// uniform in [0, T); then "causal" rows (query t draws min(K, t + 1) distinct keys from [0, t]).
// Exit: 0 all pass, 1 a failure, 77 no GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "flashdsa/ops.h"
#include "sm90/backend.h"
#include "check_common.cuh"

#ifdef FLASHDSA_CHECK_WITH_CUBLAS
#include <cublas_v2.h>
#endif

using flashdsa::bf16;
using flashdsa::bf16_to_float;
using flashdsa::float_to_bf16;

namespace {

constexpr int kDqk = flashdsa::kDqk;
constexpr int kDv = flashdsa::kDv;
constexpr int kGuardWords = 256;          // 32-bit words after each output that must stay untouched
constexpr uint32_t kGuardPattern = 0x5A5A5A5Au;

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) { FLASHDSA_CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// ---- correctness -------------------------------------------------------------------------------

struct Case {
  const char* name;
  int64_t T, T_kv;
  int H, K;
  float scale;
  double invalid_fraction;  // share of slots set to -1 or an out-of-range row
  bool strided;             // padded q / kv / indices rows
};

struct HostInputs {
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;
  std::vector<bf16> q, kv;
  std::vector<int32_t> indices;
};

HostInputs make_inputs(const Case& c, std::mt19937& rng) {
  HostInputs in;
  in.q_stride_h = c.strided ? kDqk + 64 : kDqk;
  in.q_stride_t = c.strided ? c.H * in.q_stride_h + 128 : c.H * in.q_stride_h;
  in.kv_stride_t = c.strided ? kDqk + 24 : kDqk;
  in.indices_stride_t = c.strided ? c.K + 3 : c.K;
  std::normal_distribution<float> normal(0.f, 1.f);
  in.q.resize(std::max<int64_t>(c.T * in.q_stride_t, 1));
  in.kv.resize(std::max<int64_t>(c.T_kv * in.kv_stride_t, 1));
  for (auto& v : in.q) v = float_to_bf16(normal(rng));
  for (auto& v : in.kv) v = float_to_bf16(normal(rng));

  in.indices.assign(std::max<int64_t>(c.T * in.indices_stride_t, 1), -7);  // padding slots: garbage
  std::uniform_int_distribution<int64_t> row(0, c.T_kv - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const int32_t out_of_range[4] = {-1, INT32_MIN, static_cast<int32_t>(c.T_kv), INT32_MAX};
  for (int64_t t = 0; t < c.T; ++t) {
    int32_t* r = in.indices.data() + t * in.indices_stride_t;
    for (int j = 0; j < c.K; ++j)
      r[j] = unit(rng) < c.invalid_fraction ? out_of_range[rng() % 4] : static_cast<int32_t>(row(rng));
    // Edge rows: the last token has no valid key; token 1 (if any) has an empty first block and
    // one valid key in its last block only when K >= 128; otherwise keeps its random content.
    if (t == c.T - 1 && c.T > 1)
      for (int j = 0; j < c.K; ++j) r[j] = out_of_range[j % 4];
    if (t == 1 && c.T > 2) {
      for (int j = 0; j < c.K; ++j) r[j] = -1;
      r[c.K - 1] = static_cast<int32_t>(row(rng));
      if (c.K >= 128) r[c.K / 2] = r[c.K - 1];  // a duplicate in another block
    }
  }
  return in;
}

// Double-precision reference (tests/cpp/reference.h): out [T, H, 512] and lse [T, H] (empty row: 0
// and -inf), the rows split over threads.
void reference(const Case& c, const HostInputs& in, std::vector<double>& out, std::vector<double>& lse) {
  // The reference reads contiguous tensors: q [T, H, 576], kv [T_kv, 576], indices [T, K].
  std::vector<double> q(size_t(c.T) * c.H * kDqk), kv(size_t(c.T_kv) * kDqk);
  std::vector<int32_t> idx(size_t(c.T) * c.K);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int h = 0; h < c.H; ++h)
      for (int d = 0; d < kDqk; ++d)
        q[(size_t(t) * c.H + h) * kDqk + d] = bf16_to_float(in.q[t * in.q_stride_t + h * in.q_stride_h + d]);
    std::copy_n(in.indices.data() + t * in.indices_stride_t, c.K, idx.begin() + t * c.K);
  }
  for (int64_t s = 0; s < c.T_kv; ++s)
    for (int d = 0; d < kDqk; ++d) kv[size_t(s) * kDqk + d] = bf16_to_float(in.kv[s * in.kv_stride_t + d]);
  const ref::Attention attn{q, kv, c.H, kDqk, c.scale};
  out.assign(c.T * c.H * kDv, 0.0);
  lse.assign(c.T * c.H, -INFINITY);
  auto work = [&](int64_t t_begin, int64_t t_end) {
    ref::sparse_mla_fwd_rows(attn, idx, t_begin, t_end, c.T_kv, c.K, kDv, out, lse);
  };
  const int64_t n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const int64_t per = (c.T + n_threads - 1) / n_threads;
  for (int64_t b = 0; b < c.T; b += per) pool.emplace_back(work, b, std::min(c.T, b + per));
  for (auto& th : pool) th.join();
}

flashdsa::SparseMlaFwdParams make_params(const Case& c, const HostInputs& in, const void* q, const void* kv,
                                         const int32_t* indices, void* out, void* lse) {
  flashdsa::SparseMlaFwdParams p;
  p.device = flashdsa::Device::kCUDA;
  p.attn = flashdsa_check::attention_part(q, kv, c.H, c.scale, in.q_stride_t, in.q_stride_h, in.kv_stride_t);
  p.topk = flashdsa_check::topk_part(indices, c.K, in.indices_stride_t);
  p.out = out;
  p.lse = lse;
  p.T = c.T;
  p.T_kv = c.T_kv;
  return p;
}

bool run_case(const Case& c, std::mt19937& rng) {
  const HostInputs in = make_inputs(c, rng);
  DeviceBuffer<bf16> d_q(in.q.size()), d_kv(in.kv.size());
  DeviceBuffer<int32_t> d_idx(in.indices.size());
  const size_t out_elems = c.T * c.H * kDv, lse_elems = c.T * c.H;
  DeviceBuffer<uint32_t> d_out(out_elems / 2 + kGuardWords), d_lse(lse_elems + kGuardWords);
  FLASHDSA_CHECK_CUDA(cudaMemcpy(d_q.ptr, in.q.data(), in.q.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  FLASHDSA_CHECK_CUDA(cudaMemcpy(d_kv.ptr, in.kv.data(), in.kv.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  FLASHDSA_CHECK_CUDA(cudaMemcpy(d_idx.ptr, in.indices.data(), in.indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  // NaN everywhere the op must write, the guard pattern after it.
  std::vector<uint32_t> out_init(d_out.count, 0xFFFFFFFFu), lse_init(d_lse.count, 0xFFFFFFFFu);
  std::fill(out_init.begin() + out_elems / 2, out_init.end(), kGuardPattern);
  std::fill(lse_init.begin() + lse_elems, lse_init.end(), kGuardPattern);

  const auto run_op = [&](std::vector<uint32_t>& out_words, std::vector<uint32_t>& lse_words) {
    FLASHDSA_CHECK_CUDA(cudaMemcpy(d_out.ptr, out_init.data(), out_init.size() * 4, cudaMemcpyHostToDevice));
    FLASHDSA_CHECK_CUDA(cudaMemcpy(d_lse.ptr, lse_init.data(), lse_init.size() * 4, cudaMemcpyHostToDevice));
    const flashdsa::Status st =
        flashdsa::sm90::sparse_mla_fwd(make_params(c, in, d_q.ptr, d_kv.ptr, d_idx.ptr, d_out.ptr, d_lse.ptr));
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    if (!st.ok()) {
      std::printf("  %-36s FAIL (status %d: %s)\n", c.name, static_cast<int>(st.code()), st.message().c_str());
      return false;
    }
    out_words.resize(d_out.count);
    lse_words.resize(d_lse.count);
    FLASHDSA_CHECK_CUDA(cudaMemcpy(out_words.data(), d_out.ptr, out_words.size() * 4, cudaMemcpyDeviceToHost));
    FLASHDSA_CHECK_CUDA(cudaMemcpy(lse_words.data(), d_lse.ptr, lse_words.size() * 4, cudaMemcpyDeviceToHost));
    return true;
  };
  std::vector<uint32_t> out_words, lse_words, out_again, lse_again;
  if (!run_op(out_words, lse_words) || !run_op(out_again, lse_again)) return false;
  const bool reproducible = out_words == out_again && lse_words == lse_again;

  std::vector<double> ref_out, ref_lse;
  reference(c, in, ref_out, ref_lse);

  const bf16* out = reinterpret_cast<const bf16*>(out_words.data());
  const float* lse = reinterpret_cast<const float*>(lse_words.data());
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0, lse_err = 0;
  int64_t bad_empty = 0, non_finite = 0, empty_rows = 0;
  for (int64_t r = 0; r < c.T * c.H; ++r) {
    const bool empty = std::isinf(ref_lse[r]);
    empty_rows += empty;
    if (empty) {
      bool ok = std::isinf(lse[r]) && lse[r] < 0;
      for (int d = 0; d < kDv; ++d) ok &= bf16_to_float(out[r * kDv + d]) == 0.f;
      bad_empty += !ok;
      continue;
    }
    if (!std::isfinite(lse[r])) ++non_finite;
    lse_err = std::max(lse_err, std::fabs(lse[r] - ref_lse[r]));
    for (int d = 0; d < kDv; ++d) {
      const double got = bf16_to_float(out[r * kDv + d]), want = ref_out[r * kDv + d];
      if (!std::isfinite(got)) ++non_finite;
      err2 += (got - want) * (got - want);
      ref2 += want * want;
      max_err = std::max(max_err, std::fabs(got - want));
      max_ref = std::max(max_ref, std::fabs(want));
    }
  }
  int64_t guard_hits = 0;
  for (size_t i = out_elems / 2; i < out_words.size(); ++i) guard_hits += out_words[i] != kGuardPattern;
  for (size_t i = lse_elems; i < lse_words.size(); ++i) guard_hits += lse_words[i] != kGuardPattern;

  const double rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  const bool pass = rel_l2 < 1e-2 && max_err <= 3e-2 * std::max(max_ref, 1e-3) && lse_err < 2e-3 && bad_empty == 0 &&
                    non_finite == 0 && guard_hits == 0 && reproducible;
  std::printf("  %-36s %s  rel_l2 %.2e  max_err %.2e (max|ref| %.2e)  lse_err %.2e  empty rows %lld%s%s%s%s\n", c.name,
              pass ? "PASS" : "FAIL", rel_l2, max_err, max_ref, lse_err, static_cast<long long>(empty_rows),
              bad_empty ? "  BAD EMPTY ROWS" : "", non_finite ? "  NON-FINITE" : "",
              guard_hits ? "  GUARD WRITTEN" : "", reproducible ? "" : "  NOT REPRODUCIBLE");
  return pass;
}

// An empty call runs and writes nothing. (The backend's limits, checked before the kernel by the
// entry points, are tested without a GPU: tests/cpp/test_validate.cpp, ValidateCuda.)
bool check_refusals() {
  Case c{"empty", 4, 64, 64, 64, 0.1f, 0.0, false};
  std::mt19937 rng(1);
  HostInputs in = make_inputs(c, rng);
  DeviceBuffer<bf16> dummy(16);
  flashdsa::SparseMlaFwdParams p = make_params(c, in, dummy.ptr, dummy.ptr, nullptr, dummy.ptr, dummy.ptr);
  p.T = 0;
  const bool pass = flashdsa::sm90::sparse_mla_fwd(p).ok();
  std::printf("  %-36s %s  (T = 0 -> OK)\n", "empty call", pass ? "PASS" : "FAIL");
  return pass;
}

// ---- benchmark -------------------------------------------------------------------------------------

using flashdsa_check::hash32;

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(static_cast<float>(hash32(seed * 0x9E3779B97F4A7C15ULL + i)) * (2.f / 4294967296.f) - 1.f);
}

__global__ void fill_indices(int32_t* p, size_t n, int64_t T_kv, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<int32_t>(hash32(seed * 0x9E3779B97F4A7C15ULL + i) % static_cast<uint64_t>(T_kv));
}

// Causal rows: query t sees keys [0, t]. t + 1 <= K: slots [0, t] hold keys 0..t, the rest -1.
// Otherwise K distinct keys, one random key per stratum [floor(s (t+1) / K), floor((s+1) (t+1) / K)),
// slot j holding stratum (1021 j + 7 t) mod K (a permutation for K a power of two: rows unsorted).
__global__ void fill_indices_causal(int32_t* p, int64_t T, int K, uint64_t seed) {
  const size_t n = size_t(T) * K;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(i / K);
    const int64_t j = static_cast<int64_t>(i % K);
    if (t + 1 <= K) {
      p[i] = j <= t ? static_cast<int32_t>(j) : -1;
      continue;
    }
    const int64_t stratum = (1021 * j + 7 * t) % K;
    const int64_t lo = stratum * (t + 1) / K, hi = (stratum + 1) * (t + 1) / K;
    p[i] = static_cast<int32_t>(lo + hash32(seed * 0x9E3779B97F4A7C15ULL + i) % static_cast<uint64_t>(hi - lo));
  }
}

using flashdsa_check::median_ms;

#ifdef FLASHDSA_CHECK_WITH_CUBLAS
void print_gemm_ceiling() {
  const int n = 8192;
  DeviceBuffer<__nv_bfloat16> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  fill_bf16<<<1024, 256>>>(a.ptr, a.count, 11);
  fill_bf16<<<1024, 256>>>(b.ptr, b.count, 12);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return;
  const float alpha = 1.f, beta = 0.f;
  const double ms = median_ms(
      [&] {
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.ptr, CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n,
                     &beta, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      },
      3, 10);
  cublasDestroy(handle);
  std::printf("cuBLAS bf16 GEMM 8192^3: %.3f ms, %.0f TFLOP/s\n", ms, 2.0 * n * n * n / ms / 1e9);
}
#endif

enum class IndexMode { kUniform, kCausal };

bool run_benchmarks() {
  struct Shape {
    int64_t T;
    int H;
    IndexMode mode;
  };
  const Shape shapes[] = {
      {16384, 64, IndexMode::kUniform},  {32768, 64, IndexMode::kUniform},  {65536, 64, IndexMode::kUniform},
      {131072, 64, IndexMode::kUniform}, {32768, 16, IndexMode::kUniform},  {32768, 32, IndexMode::kUniform},
      {32768, 128, IndexMode::kUniform}, {16384, 64, IndexMode::kCausal},   {32768, 64, IndexMode::kCausal},
      {65536, 64, IndexMode::kCausal},   {131072, 64, IndexMode::kCausal},
  };
  const int K = 2048;
  size_t max_q_rows = 0;
  int64_t max_T = 0;
  for (const Shape& s : shapes) {
    max_q_rows = std::max(max_q_rows, size_t(s.T) * s.H);
    max_T = std::max(max_T, s.T);
  }
  DeviceBuffer<__nv_bfloat16> q(max_q_rows * kDqk), kv(size_t(max_T) * kDqk), out(max_q_rows * kDv);
  DeviceBuffer<int32_t> indices(size_t(max_T) * K);
  DeviceBuffer<float> lse(max_q_rows);
  fill_bf16<<<4096, 256>>>(q.ptr, q.count, 1);
  fill_bf16<<<4096, 256>>>(kv.ptr, kv.count, 2);
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());

  std::printf("\nbenchmark: K = %d, T_kv = T, median of 10 (2 warm-up); uniform: indices uniform in [0, T);\n"
              "causal: query t draws min(K, t + 1) distinct keys from [0, t]\n", K);
  std::printf("  %-8s %4s %7s %10s %12s\n", "indices", "H", "T", "ms", "TFLOP/s");
  bool ok = true;
  for (const Shape& s : shapes) {
    if (s.mode == IndexMode::kUniform)
      fill_indices<<<4096, 256>>>(indices.ptr, size_t(s.T) * K, s.T, 3 + s.T);
    else
      fill_indices_causal<<<4096, 256>>>(indices.ptr, s.T, K, 5 + s.T);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    flashdsa::SparseMlaFwdParams p;
    p.device = flashdsa::Device::kCUDA;
    p.attn.q = q.ptr;
    p.attn.kv = kv.ptr;
    p.topk.indices = indices.ptr;
    p.attn.scale = 1.f / std::sqrt(static_cast<float>(kDqk));
    p.out = out.ptr;
    p.lse = lse.ptr;
    p.T = s.T;
    p.T_kv = s.T;
    p.attn.H = s.H;
    p.topk.K = K;
    p.attn.q_stride_h = kDqk;
    p.attn.q_stride_t = int64_t(s.H) * kDqk;
    p.attn.kv_stride_t = kDqk;
    p.topk.stride_t = K;
    flashdsa::Status st;
    const double ms = median_ms([&] { st = flashdsa::sm90::sparse_mla_fwd(p); }, 2, 10);
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    if (!st.ok()) {
      std::printf("  H=%d T=%lld: status %d %s\n", s.H, static_cast<long long>(s.T), static_cast<int>(st.code()),
                  st.message().c_str());
      ok = false;
      continue;
    }
    const double flops = 2.0 * s.T * s.H * K * (kDqk + kDv);
    std::printf("  %-8s %4d %7lld %10.3f %12.1f\n", s.mode == IndexMode::kUniform ? "uniform" : "causal", s.H,
                static_cast<long long>(s.T), ms, flops / ms / 1e9);
  }
#ifdef FLASHDSA_CHECK_WITH_CUBLAS
  print_gemm_ceiling();
#endif
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false, bench = true, check = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) small = true, bench = false;
    if (!std::strcmp(argv[i], "--no-bench")) bench = false;
    if (!std::strcmp(argv[i], "--bench-only")) check = false;
  }
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  cudaDeviceProp prop;
  FLASHDSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);

  //  name                               T     T_kv  H    K     scale  invalid strided
  const Case small_cases[] = {
      {"T=3 H=16 K=64", 3, 50, 16, 64, 0.05f, 0.2, false},
      {"T=2 H=64 K=192 (odd blocks)", 2, 300, 64, 192, 0.05f, 0.2, false},
      {"T=3 H=128 K=128 strided", 3, 90, 128, 128, 0.05f, 0.3, true},
      {"T=4 H=64 K=256 T_kv=17000", 4, 17000, 64, 256, 0.05f, 0.2, false},
  };
  const Case full_cases[] = {
      {"T=1 H=16 K=64", 1, 40, 16, 64, 0.05f, 0.1, false},
      {"T=7 H=32 K=128", 7, 100, 32, 128, 0.05f, 0.2, false},
      {"T=37 H=64 K=2048", 37, 3000, 64, 2048, 1.f / 24.f, 0.15, false},
      {"T=37 H=128 K=128", 37, 500, 128, 128, 0.1f, 0.3, false},
      {"T=7 H=128 K=2048 (dups, T_kv=200)", 7, 200, 128, 2048, 0.05f, 0.1, false},
      {"T=37 H=16 K=2048", 37, 5000, 16, 2048, 0.08f, 0.25, false},
      {"T=37 H=32 K=64", 37, 80, 32, 64, 0.2f, 0.3, false},
      {"T=7 H=64 K=192 (odd blocks)", 7, 400, 64, 192, 0.05f, 0.2, false},
      {"T=37 H=64 K=128 strided", 37, 1000, 64, 128, 0.05f, 0.2, true},
      {"T=7 H=16 K=320 strided", 7, 700, 16, 320, 0.05f, 0.2, true},
      {"T=7 H=128 K=2048 strided", 7, 4000, 128, 2048, 0.05f, 0.2, true},
      {"T=5 H=64 K=8192", 5, 9000, 64, 8192, 0.05f, 0.1, false},
      // T_kv >= 16384: large kv, index values up to 40K.
      {"T=37 H=64 K=2048 T_kv=20000", 37, 20000, 64, 2048, 1.f / 24.f, 0.15, false},
      {"T=300 H=16 K=256 T_kv=40000 strided", 300, 40000, 16, 256, 0.05f, 0.2, true},
      {"T=150 H=128 K=192 T_kv=17000", 150, 17000, 128, 192, 0.05f, 0.3, false},
      {"T=9 H=32 K=4096 T_kv=16384 all valid", 9, 16384, 32, 4096, 0.05f, 0.0, false},
      // scale <= 0 runs the kernel instance without the fused-scale softmax (kFusedScale = false).
      {"T=7 H=64 K=192 scale<0 (odd blocks)", 7, 400, 64, 192, -0.05f, 0.2, false},
      {"T=7 H=32 K=128 scale=0", 7, 100, 32, 128, 0.f, 0.2, false},
  };

  std::mt19937 rng(20261130);
  int passed = 0, failed = 0;
  const auto record = [&](bool ok) { ok ? ++passed : ++failed; };
  if (check) {
    record(check_refusals());
    std::printf("correctness (vs double CPU reference):\n");
    if (small) {
      for (const Case& c : small_cases) record(run_case(c, rng));
    } else {
      for (const Case& c : full_cases) record(run_case(c, rng));
    }
  }
  if (bench) record(run_benchmarks());
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
