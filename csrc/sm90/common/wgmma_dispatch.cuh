// Internal: the wgmma wrappers of wgmma_ops.cuh selected by tile width N at compile time (the
// generated wrappers are one function per width), and the register fence of RS A-fragments.
#pragma once

#include <cstdint>

#include "sm90/common/wgmma_ops.cuh"

namespace flashdsa::sm90::hw {

template <int N>
struct DependentFalse {
  static constexpr bool value = false;
};

// SS wgmma m64nNk16 (both operands from shared memory through descriptors), N in {32, 64, 128}.
template <int N, int TransA, int TransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, bool accumulate) {
  if constexpr (N == 32) {
    wgmma_ss_m64n32k16<TransA, TransB>(d, da, db, accumulate);
  } else if constexpr (N == 64) {
    wgmma_ss_m64n64k16<TransA, TransB>(d, da, db, accumulate);
  } else if constexpr (N == 128) {
    wgmma_ss_m64n128k16<TransA, TransB>(d, da, db, accumulate);
  } else {
    static_assert(DependentFalse<N>::value, "unsupported wgmma width");
  }
}

// RS wgmma m64nNk16 (A from registers), N in {64, 128}.
template <int N, int TransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, bool accumulate) {
  if constexpr (N == 64) {
    wgmma_rs_m64n64k16<TransB>(d, a, db, accumulate);
  } else if constexpr (N == 128) {
    wgmma_rs_m64n128k16<TransB>(d, a, db, accumulate);
  } else {
    static_assert(DependentFalse<N>::value, "unsupported wgmma width");
  }
}

// Keeps RS A-fragments alive (and in place) until the wgmma reading them has been waited for.
template <int K>
__device__ __forceinline__ void fence_frags(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
  }
}

}  // namespace flashdsa::sm90::hw
