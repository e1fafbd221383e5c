// Internal: the L2 cache-policy step of the sparse MLA backward (compile-time switch
// -DFLASHDSA_BWD_L2HINT=1, used by v2 and v3 only; design: docs/kernels/sparse_mla_bwd.md, "v3").
//
//   - dkv reductions carry an L2::evict_last policy (red.global.add.L2::cache_hint.v4.f32): the dkv
//     rows of the current key window are the lines every resident CTA updates;
//   - Q and dO, read once per CTA, are loaded with an L2::evict_first policy. They come with plain
//     16-byte ld.global (+ st.shared into the swizzled tile) instead of cp.async: a cache-hinted
//     cp.async (LDGSTS) was miscompiled twice (ptxas emitted an uniform register that nothing wrote),
//     so it is not used anywhere.
// The policies are createpolicy.fractional with fraction 1.0; ptxas folds them into the 64-bit memory
// descriptor of the instruction (desc[URx], both halves written by UMOV / ULOP3 / USHF constants).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"

#ifndef FLASHDSA_BWD_L2HINT
#define FLASHDSA_BWD_L2HINT 0
#endif

namespace flashdsa::sm90::sparse_mla_bwd_impl::detail {

// Whether this build uses the L2 cache-policy hints (v2 / v3 only; v1 never does).
constexpr bool kL2Hint = FLASHDSA_BWD_L2HINT != 0;

// L2 policies, fraction 1.0 (non-volatile: ptxas may fold and hoist them).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// 16-byte fp32 vector reduction with an L2 cache policy (sm_90).
__device__ __forceinline__ void red_add_v4_hint(float* gptr, float4 v, uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(gptr), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w), "l"(policy)
               : "memory");
}

// 16-byte read-only global load with an L2 cache policy, not allocated in L1.
__device__ __forceinline__ uint4 ld_global_v4_hint(const void* gptr, uint64_t policy) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(gptr), "l"(policy));
  return r;
}

__device__ __forceinline__ void st_shared_v4(uint32_t smem_addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The L2HINT replacement of a row copy: 16-byte pieces src[64 b .. + 8) (b < kBlocks) of one row,
// loaded evict_first into registers (zeros when !valid: nothing is read) and stored at dst + b * stride
// (shared addresses). All loads of the row are issued before the first store.
template <int kBlocks>
__device__ __forceinline__ void copy_row_ldg(uint32_t dst, uint32_t stride, const __nv_bfloat16* src, bool valid,
                                             uint64_t policy) {
  uint4 v[kBlocks];
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) v[b] = valid ? ld_global_v4_hint(src + 64 * b, policy) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) st_shared_v4(dst + b * stride, v[b]);
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl::detail
