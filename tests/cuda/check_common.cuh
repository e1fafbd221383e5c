// Shared helpers of the standalone GPU check programs (tests/cuda/*_check.cu): the CUDA / Status
// error checks, the params parts builders, key ranges from the library, event timing, and the one
// C++ double-precision reference (tests/cpp/reference.h, namespace ref).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "../cpp/reference.h"
#include "flashdsa/ops.h"
#include "flashdsa/ranges.h"

// Every CUDA runtime call of the check programs goes through this: on failure the program prints
// the error and the call's text and exits 1.
#define FLASHDSA_CHECK_CUDA(expr) ::flashdsa_check::cuda_or_die((expr), #expr, __FILE__, __LINE__)

namespace flashdsa_check {

// Aborts the check program (exit 1) with the failing call's text when a CUDA call fails.
inline void cuda_or_die(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::printf("CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err), cudaGetErrorString(err), file, line, what);
  std::exit(1);
}

// Key ranges built by the library's own helpers (include/flashdsa/ranges.h), so the check programs
// test the kernels on exactly the ranges the bindings give them.
struct KeyRanges {
  std::vector<int32_t> k_start, k_end;  // [T]
  int64_t T = 0, T_kv = 0;
};

// The exit status of a check program that found no GPU (CTest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

// Whether a CUDA device is present; prints the skip line when not (the caller returns kSkipped).
inline bool have_gpu() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  std::printf("no CUDA device: skipped\n");
  return false;
}

// Aborts the check program (exit 1) with `what` and the message when a library call fails.
inline void status_or_die(const flashdsa::Status& st, const char* what) {
  if (st.ok()) return;
  std::printf("%s failed: %s\n", what, st.to_string().c_str());
  std::exit(1);
}

inline void ranges_or_die(const flashdsa::Status& st) { status_or_die(st, "key ranges"); }

// ---- params parts (include/flashdsa/ops.h), bf16 device tensors ------------------------------------
// Strides in elements; the short forms are for contiguous tensors.
inline flashdsa::AttentionTensors attention_part(const void* q, const void* kv, int H, double scale,
                                                 int64_t q_stride_t, int64_t q_stride_h, int64_t kv_stride_t) {
  flashdsa::AttentionTensors a;
  a.dtype = flashdsa::DType::kBF16;
  a.q = q;
  a.kv = kv;
  a.H = H;
  a.scale = static_cast<float>(scale);
  a.q_stride_t = q_stride_t;
  a.q_stride_h = q_stride_h;
  a.kv_stride_t = kv_stride_t;
  return a;
}
inline flashdsa::AttentionTensors attention_part(const void* q, const void* kv, int H, double scale) {
  return attention_part(q, kv, H, scale, static_cast<int64_t>(H) * flashdsa::kDqk, flashdsa::kDqk, flashdsa::kDqk);
}

inline flashdsa::IndexerTensors indexer_part(const void* q_idx, const void* k_idx, const void* w, int HI, int DI,
                                             bool relu, int64_t q_stride_t, int64_t q_stride_h, int64_t k_stride_t,
                                             int64_t w_stride_t) {
  flashdsa::IndexerTensors in;
  in.dtype = flashdsa::DType::kBF16;
  in.q_idx = q_idx;
  in.k_idx = k_idx;
  in.weights = w;
  in.H_I = HI;
  in.D_I = DI;
  in.relu = relu;
  in.q_idx_stride_t = q_stride_t;
  in.q_idx_stride_h = q_stride_h;
  in.k_idx_stride_t = k_stride_t;
  in.weights_stride_t = w_stride_t;
  return in;
}
inline flashdsa::IndexerTensors indexer_part(const void* q_idx, const void* k_idx, const void* w, int HI, int DI,
                                             bool relu) {
  return indexer_part(q_idx, k_idx, w, HI, DI, relu, static_cast<int64_t>(HI) * DI, DI, DI, HI);
}

inline flashdsa::TopkIndices topk_part(const int32_t* indices, int K, int64_t stride_t) {
  flashdsa::TopkIndices k;
  k.indices = indices;
  k.stride_t = stride_t;
  k.K = K;
  return k;
}
inline flashdsa::TopkIndices topk_part(const int32_t* indices, int K) { return topk_part(indices, K, K); }

inline std::vector<int32_t> cu_seqlens_of(const std::vector<int>& lengths) {
  std::vector<int32_t> cu{0};
  for (int len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

// Packed causal sequences of the given lengths, one rank (keys = queries).
inline KeyRanges thd_causal_ranges(const std::vector<int>& lengths) {
  const std::vector<int32_t> cu = cu_seqlens_of(lengths);
  KeyRanges r;
  r.T = r.T_kv = cu.back();
  r.k_start.resize(r.T);
  r.k_end.resize(r.T);
  ranges_or_die(flashdsa::build_key_ranges(cu.data(), static_cast<int>(lengths.size()), r.k_start.data(),
                                           r.k_end.data()));
  return r;
}

// Rank `rank` of a zigzag context-parallel group of `cp` ranks over sequences of the given lengths
// (multiples of 2 cp): its local rows, with ranges over the whole gathered sequence.
inline KeyRanges cp_zigzag_ranges(const std::vector<int>& lengths, int cp, int rank) {
  const std::vector<int32_t> cu = cu_seqlens_of(lengths);
  const int B = static_cast<int>(lengths.size());
  KeyRanges r;
  r.T_kv = cu.back();
  r.T = flashdsa::cp_local_tokens(cu.data(), B, cp);
  if (r.T < 0) ranges_or_die(flashdsa::Status::InvalidArgument("sequence lengths must be multiples of 2 cp"));
  std::vector<int32_t> rows(r.T);
  ranges_or_die(flashdsa::build_cp_zigzag_rows(cu.data(), B, cp, rank, rows.data()));
  r.k_start.resize(r.T);
  r.k_end.resize(r.T);
  ranges_or_die(flashdsa::build_key_ranges_for_rows(cu.data(), B, rows.data(), r.T, r.k_start.data(),
                                                    r.k_end.data()));
  return r;
}

// ---- device buffers and host threads -----------------------------------------------------------------
// An owning device allocation of `bytes` bytes (none for 0).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n > 0) FLASHDSA_CHECK_CUDA(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// Copies a host vector to the start of a device buffer.
template <typename T>
void upload(DeviceBuffer& dst, const std::vector<T>& src) {
  if (!src.empty()) FLASHDSA_CHECK_CUDA(cudaMemcpy(dst.ptr, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// `count` elements of device memory at `src`, on the host.
template <typename T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> v(count);
  if (count > 0) FLASHDSA_CHECK_CUDA(cudaMemcpy(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Runs fn(i) for i in [0, n) on all host cores (host references of large problems).
inline void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) fn(i);
    });
  for (auto& t : pool) t.join();
}

// ---- benchmark data on the device ---------------------------------------------------------------------
// A 64 -> 32-bit mixing hash (the MurmurHash3 finalizer), for reproducible random data generated
// on the GPU (a host generator would take seconds at T = 128K), and a uniform value in [0, 1) from it.
__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
__device__ __forceinline__ float hash_unit(uint64_t x) { return (hash32(x) >> 8) * (1.f / 16777216.f); }

// Median milliseconds (upper median) of `reps` event-timed runs of `body` after `warmup` untimed ones.
template <class F>
double median_ms(F&& body, int warmup, int reps) {
  cudaEvent_t start, stop;
  FLASHDSA_CHECK_CUDA(cudaEventCreate(&start));
  FLASHDSA_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) body();
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    FLASHDSA_CHECK_CUDA(cudaEventRecord(start));
    body();
    FLASHDSA_CHECK_CUDA(cudaEventRecord(stop));
    FLASHDSA_CHECK_CUDA(cudaEventSynchronize(stop));
    FLASHDSA_CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  FLASHDSA_CHECK_CUDA(cudaEventDestroy(start));
  FLASHDSA_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

}  // namespace flashdsa_check
