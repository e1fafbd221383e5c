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

namespace flashdsa::sm90 {

// Launches kernel<<<grid, threads, smem_bytes, stream>>>(args) after opting it in to smem_bytes of
// dynamic shared memory (above the 48 KB default), and checks the launch. The one launch path of the
// kernels with a large shared-memory plan.
template <class Kernel, class Args>
Status launch_with_smem(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream, const char* name,
                        const Args& args) {
  FLASHDSA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(args);
  FLASHDSA_CHECK_LAUNCH(name);
  return Status::OK();
}

}  // namespace flashdsa::sm90
