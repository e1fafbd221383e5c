// FlashDSA: basic types shared by the public API (no framework, no CUDA headers).
#pragma once

#include <cstdint>
#include <cstring>

namespace flashdsa {

// Where the tensors of one call live. Every pointer of a params struct must be on this device
// (host memory for kCPU, device memory of the current CUDA device for kCUDA).
enum class Device : int { kCPU = 0, kCUDA = 1 };

// Element type of the activation tensors of a call (q, kv, out, dout, dq, q_idx, k_idx).
// kBF16 is the production type (both backends). kFP32 / kFP64 are accepted by the CPU backend only,
// for references and fp64 gradcheck.
// "Statistic" tensors (lse, weights, scores, attention mass, losses, dkv, dk_idx, dweights) are
// fp64 when the activation dtype is kFP64, else fp32: see stat_dtype().
enum class DType : int { kBF16 = 0, kFP32 = 1, kFP64 = 2 };

inline DType stat_dtype(DType activation) { return activation == DType::kFP64 ? DType::kFP64 : DType::kFP32; }
inline int dtype_size(DType t) { return t == DType::kBF16 ? 2 : (t == DType::kFP32 ? 4 : 8); }
const char* dtype_name(DType t);
const char* device_name(Device d);

// Bit pattern of a bfloat16 value (layout-compatible with __nv_bfloat16 and at::BFloat16).
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace flashdsa
