// Internal: sm_90 primitives the sparse MLA backward needs beyond csrc/sm90/common/hopper.cuh:
// 4-byte cp.async with zero fill, a transposing ldmatrix, 16-byte global reductions / stores, an
// integer reduction and an L2 prefetch. Candidates for common/.
#pragma once

#include <cstdint>

#include "sm90/common/hopper.cuh"

namespace flashdsa::sm90::hw {

// Copies 4 bytes global -> shared (through L1); when `valid` is false nothing is read and the
// destination is zero-filled. Completion is tracked like cp_async_16 (cp_async_arrive).
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(valid ? 4 : 0)
               : "memory");
}

// Four 8x8 bf16 matrices, transposed on load: lane L gives the row address of matrix L/8, row L%8;
// register i receives (row 2(lane%4), col lane/4) and (row 2(lane%4)+1, col lane/4) of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}

// Vector fp32 reduction into global memory (sm_90): one 16-byte atomic add, no return value.
__device__ __forceinline__ void red_add_v4(float* gptr, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gptr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

__device__ __forceinline__ void red_add_v2(float* gptr, float2 v) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(gptr), "f"(v.x), "f"(v.y) : "memory");
}

__device__ __forceinline__ void red_add(float* gptr, float v) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(gptr), "f"(v) : "memory");
}

__device__ __forceinline__ void st_global_v4(float* gptr, float4 v) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gptr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// Integer atomic add without return (relaxed, GPU scope).
__device__ __forceinline__ void red_add_u32(uint32_t* gptr, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(gptr), "r"(v) : "memory");
}

// Hint: bring the line holding `gptr` into L2.
__device__ __forceinline__ void prefetch_l2(const void* gptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gptr));
}

}  // namespace flashdsa::sm90::hw
