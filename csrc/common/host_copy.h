// Internal: copies small device arrays (key ranges) to the host for validation.
#pragma once

#include <cstddef>

#include "flashdsa/status.h"

namespace flashdsa::detail {

// Copies `bytes` bytes of CUDA device memory at `src` to host memory `dst`, ordered on `stream`
// (a cudaStream_t, nullptr = default stream), and waits for the copy. Returns kNotSupported in a
// build without CUDA and kCudaError if a CUDA call fails.
Status copy_device_to_host(const void* src, size_t bytes, void* dst, void* stream);

}  // namespace flashdsa::detail
