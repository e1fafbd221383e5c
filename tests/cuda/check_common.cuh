// Shared helpers of the standalone GPU check programs (tests/cuda/*_check.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashdsa_check {

// Aborts the check program (exit 1) with the failing call's text when a CUDA call fails.
inline void cuda_or_die(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err), file, line, what);
  std::exit(1);
}

// Median milliseconds (upper median) of `reps` event-timed runs of `body` after `warmup` untimed ones.
template <class F>
double median_ms(F&& body, int warmup, int reps) {
  cudaEvent_t start, stop;
  cuda_or_die(cudaEventCreate(&start), "cudaEventCreate", __FILE__, __LINE__);
  cuda_or_die(cudaEventCreate(&stop), "cudaEventCreate", __FILE__, __LINE__);
  for (int i = 0; i < warmup; ++i) body();
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    cuda_or_die(cudaEventRecord(start), "cudaEventRecord", __FILE__, __LINE__);
    body();
    cuda_or_die(cudaEventRecord(stop), "cudaEventRecord", __FILE__, __LINE__);
    cuda_or_die(cudaEventSynchronize(stop), "cudaEventSynchronize", __FILE__, __LINE__);
    cuda_or_die(cudaEventElapsedTime(&ms[i], start, stop), "cudaEventElapsedTime", __FILE__, __LINE__);
  }
  cuda_or_die(cudaEventDestroy(start), "cudaEventDestroy", __FILE__, __LINE__);
  cuda_or_die(cudaEventDestroy(stop), "cudaEventDestroy", __FILE__, __LINE__);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

}  // namespace flashdsa_check
