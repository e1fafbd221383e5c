// The backends of this build and how a call finds its backend: Device::kCPU -> the CPU backend;
// Device::kCUDA -> the CUDA backend that targets the current device's compute capability.
// Adding a CUDA backend is one line in kCudaBackends (docs/architecture.md, "Adding a backend").
#include <mutex>
#include <optional>
#include <string>

#include "common/backend.h"
#include "cpu/backend.h"

#if defined(FLASHDSA_WITH_CUDA)
#include <cuda_runtime.h>

#include "sm90/backend.h"
#endif

namespace flashdsa {
namespace detail {
namespace {

// One CUDA backend: the compute capability its code runs on (sm_90a code runs on 9.0 only), a
// description for messages, and its table.
struct CudaBackendEntry {
  int major, minor;
  const char* target;
  const Backend& (*table)();
};

#if defined(FLASHDSA_WITH_CUDA)
constexpr CudaBackendEntry kCudaBackends[] = {
    {9, 0, "compute capability 9.0 (sm_90a: H100, H200, H20)", &sm90::backend},
};
constexpr bool kHasCudaBackends = true;
#else
constexpr CudaBackendEntry kCudaBackends[] = {{0, 0, nullptr, nullptr}};  // unused
constexpr bool kHasCudaBackends = false;
#endif

// The current CUDA device as dispatch sees it.
struct CudaDevice {
  int ordinal = 0;
  int major = 0, minor = 0;
  std::string name;  // filled only when a message needs it
};

std::mutex g_override_mutex;
std::optional<CudaDevice> g_override;

// The compute capability of the current device (the override's, if a test set one). `with_name`
// also fills the device name.
Status query_cuda_device(const char* op, bool with_name, CudaDevice* dev) {
  {
    std::lock_guard<std::mutex> lock(g_override_mutex);
    if (g_override) {
      *dev = *g_override;
      return Status::OK();
    }
  }
#if defined(FLASHDSA_WITH_CUDA)
  cudaError_t err = cudaGetDevice(&dev->ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&dev->major, cudaDevAttrComputeCapabilityMajor, dev->ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&dev->minor, cudaDevAttrComputeCapabilityMinor, dev->ordinal);
  if (err != cudaSuccess) {
    return Status::CudaError(std::string(op) + ": querying the current CUDA device: " + cudaGetErrorString(err));
  }
  if (with_name) {
    cudaDeviceProp prop{};
    dev->name = cudaGetDeviceProperties(&prop, dev->ordinal) == cudaSuccess ? prop.name : "unknown";
  }
  return Status::OK();
#else
  (void)op, (void)with_name, (void)dev;
  return Status::Internal(std::string(op) + ": no CUDA in this build");
#endif
}

}  // namespace

Status select_backend(const char* op, const CallContext& ctx, const Backend** backend) {
  if (ctx.device == Device::kCPU) {
    *backend = &cpu::backend();
    return Status::OK();
  }
  if (ctx.device != Device::kCUDA) {
    return Status::InvalidArgument(std::string(op) + ": device = " + std::to_string(static_cast<int>(ctx.device)) +
                                   ": must be kCPU or kCUDA");
  }
  if (!kHasCudaBackends) {
    return Status::NotSupported(std::string(op) + ": device is cuda but FlashDSA was built without CUDA");
  }
  CudaDevice dev;
  Status st = query_cuda_device(op, false, &dev);
  if (!st.ok()) return st;
  for (const CudaBackendEntry& e : kCudaBackends) {
    if (e.table != nullptr && e.major == dev.major && e.minor == dev.minor) {
      *backend = &e.table();
      return Status::OK();
    }
  }
  st = query_cuda_device(op, true, &dev);
  if (!st.ok()) return st;
  std::string needs;
  for (const CudaBackendEntry& e : kCudaBackends) {
    if (e.target != nullptr) needs += std::string(needs.empty() ? "" : " or ") + e.target;
  }
  return Status::NotSupported(std::string(op) + ": CUDA device " + std::to_string(dev.ordinal) + " (" + dev.name +
                              ", compute capability " + std::to_string(dev.major) + "." + std::to_string(dev.minor) +
                              ") is not supported: FlashDSA's CUDA kernels need " + needs +
                              "; use such a GPU or the CPU backend");
}

}  // namespace detail

namespace testing {

void set_cuda_device_override(int major, int minor, const std::string& name) {
  std::lock_guard<std::mutex> lock(detail::g_override_mutex);
  detail::CudaDevice dev;
  dev.major = major;
  dev.minor = minor;
  dev.name = name;
  detail::g_override = dev;
}

void clear_cuda_device_override() {
  std::lock_guard<std::mutex> lock(detail::g_override_mutex);
  detail::g_override.reset();
}

}  // namespace testing
}  // namespace flashdsa
