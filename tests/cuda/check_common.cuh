// Shared helpers of the standalone GPU check programs (tests/cuda/*_check.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

inline void ranges_or_die(const flashdsa::Status& st) {
  if (st.ok()) return;
  std::printf("key ranges: %s\n", st.to_string().c_str());
  std::exit(1);
}

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
