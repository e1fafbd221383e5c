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
// kFP8E4M3 (OCP e4m3 "fn": no infinities, 0x7f / 0xff = NaN, max 448) is accepted only as the
// IndexerTensors dtype of indexer_topk (the FP8 selection pass, docs/spec.md §3), with the two
// dequantization scales; run_quantize_fp8() produces it.
enum class DType : int { kBF16 = 0, kFP32 = 1, kFP64 = 2, kFP8E4M3 = 3 };

inline DType stat_dtype(DType activation) { return activation == DType::kFP64 ? DType::kFP64 : DType::kFP32; }
inline int dtype_size(DType t) {
  return t == DType::kFP8E4M3 ? 1 : (t == DType::kBF16 ? 2 : (t == DType::kFP32 ? 4 : 8));
}
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

// Bit pattern of an fp8 e4m3 ("fn") value (layout-compatible with __nv_fp8_e4m3 and
// at::Float8_e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 = subnormal
// (m * 2^-9); 0x7f / 0xff = NaN; no infinities; largest finite value 448.
struct fp8_e4m3 {
  uint8_t bits;
};

constexpr float kFp8E4M3Max = 448.f;

// Exact conversion to float (NaN stays NaN).
inline float fp8_e4m3_to_float(fp8_e4m3 v) {
  const int e = (v.bits >> 3) & 15, m = v.bits & 7;
  const bool neg = (v.bits & 0x80) != 0;
  if (e == 15 && m == 7) {
    const uint32_t nan_bits = neg ? 0xffc00000u : 0x7fc00000u;
    float nan;
    std::memcpy(&nan, &nan_bits, sizeof nan);
    return nan;
  }
  // value = (e ? 8 + m : m) * 2^(max(e, 1) - 10); built from exact float operations.
  float mag = static_cast<float>(e ? 8 + m : m);
  int shift = (e ? e : 1) - 10;
  for (; shift > 0; --shift) mag *= 2.f;
  for (; shift < 0; ++shift) mag *= 0.5f;
  return neg ? -mag : mag;
}

// Round to nearest even, saturating: a finite |f| beyond 448 becomes +-448 (the "satfinite" mode of
// the Hopper cvt instruction); NaN and +-Inf become NaN (e4m3 has no infinity).
inline fp8_e4m3 float_to_fp8_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a_bits = u & 0x7fffffffu;
  if (a_bits >= 0x7f800000u) return fp8_e4m3{static_cast<uint8_t>(sign | 0x7f)};  // NaN / Inf
  float a;
  std::memcpy(&a, &a_bits, sizeof a);
  if (a >= kFp8E4M3Max) return fp8_e4m3{static_cast<uint8_t>(sign | 0x7e)};
  // Binade of a: [2^(E-7), 2^(E-6)) holds the values of biased exponent E >= 1; below 2^-6 the
  // step is 2^-9 (subnormals). q = a / step is then in [8, 16) (normal) or [0, 8) (subnormal).
  int E = 1;
  float step = 1.f / 512.f;  // 2^-9: the step of binade E = 1 and of the subnormals
  while (E < 15 && a >= 16.f * step) {
    step *= 2.f;
    ++E;
  }
  const float q = a / step;  // exact (power-of-two scaling)
  float r = static_cast<float>(static_cast<int>(q));
  const float frac = q - r;
  if (frac > 0.5f || (frac == 0.5f && (static_cast<int>(r) & 1))) r += 1.f;
  int n = static_cast<int>(r);  // in [0, 16]
  if (n < 8) return fp8_e4m3{static_cast<uint8_t>(sign | n)};  // subnormal (only when E == 1)
  if (n == 16) {
    n = 8;
    ++E;
  }
  // n >= 8 with E = 1 is the smallest normal binade; E = 15, n = 15 would be NaN (above 448: saturated).
  if (E > 15 || (E == 15 && n == 15)) return fp8_e4m3{static_cast<uint8_t>(sign | 0x7e)};
  return fp8_e4m3{static_cast<uint8_t>(sign | (E << 3) | (n - 8))};
}

}  // namespace flashdsa
