// Device-to-host copy used by host validation of CUDA calls.
#include "common/host_copy.h"

#include <string>

#if defined(FLASHDSA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace flashdsa::detail {

#if defined(FLASHDSA_WITH_CUDA)

Status copy_device_to_host(const void* src, size_t bytes, void* dst, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) {
    return Status::CudaError(std::string("copying key ranges to the host for validation: ") +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  return Status::OK();
}

#else

Status copy_device_to_host(const void*, size_t, void*, void*) {
  return Status::NotSupported("cannot read CUDA memory: FlashDSA was built without CUDA");
}

#endif

}  // namespace flashdsa::detail
