// Internal: the e4m3 quantizer's division x / scale with one reciprocal per row (fp8_kernel.cuh's
// quantize_fp8_rows128_kernel; the check program tests it against __fdiv_rn). Device code only.
#pragma once

#include <cuda_runtime.h>

namespace flashdsa::sm90::indexer_topk_impl {

// The reciprocal of a scale b in [2^-20, 2^100] as the compiler's __fdiv_rn fast path refines it.
__device__ __forceinline__ float quantize_recip(float b) {
  float y0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(b));
  return __fmaf_rn(y0, __fmaf_rn(-b, y0, 1.f), y0);
}

// x / b rounded to nearest (even) for b in [2^-20, 2^100] and y = quantize_recip(b); a quotient below 2^-80 in
// magnitude may differ from it in the last bits (it is far below e4m3's smallest code either way). The residual is
// formed negated (b q0 - x, exact by the FMA) so that a signed zero keeps its sign: -0 / b = -0 (with x - b q0 the
// sum would be +0).
__device__ __forceinline__ float quantize_div(float x, float b, float y) {
  const float q0 = __fmul_rn(x, y);
  const float nr = __fmaf_rn(b, q0, -x);
  return __fmaf_rn(-y, nr, q0);
}

__device__ __forceinline__ bool quantize_scale_in_fast_range(float b) {
  return b >= 0x1p-20f && b <= 0x1p100f;
}

}  // namespace flashdsa::sm90::indexer_topk_impl
