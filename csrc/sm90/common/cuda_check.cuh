// Internal: CUDA error handling for the sm90 backend. Every CUDA runtime call and every launch is
// checked and turned into a flashdsa::Status.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashdsa/status.h"

namespace flashdsa::sm90 {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return Status::CudaError(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace flashdsa::sm90

// Returns a kCudaError Status from the enclosing function when `expr` fails.
#define FLASHDSA_CUDA_TRY(expr)                                                          \
  do {                                                                                   \
    ::flashdsa::Status _fdsa_st = ::flashdsa::sm90::cuda_status((expr), #expr);          \
    if (!_fdsa_st.ok()) return _fdsa_st;                                                 \
  } while (0)

// After a kernel launch: returns a kCudaError Status naming the kernel if the launch failed.
#define FLASHDSA_CHECK_LAUNCH(name) FLASHDSA_CUDA_TRY(cudaGetLastError())
