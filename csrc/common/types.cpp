// Names of the public enums (used in error messages and bindings).
#include "flashdsa/types.h"

namespace flashdsa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP32: return "fp32";
    case DType::kFP64: return "fp64";
    case DType::kFP8E4M3: return "fp8_e4m3";
  }
  return "unknown dtype";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::kCPU: return "cpu";
    case Device::kCUDA: return "cuda";
  }
  return "unknown device";
}

}  // namespace flashdsa
