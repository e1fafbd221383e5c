// Internal: Hopper (sm_90a) primitives shared by every FlashDSA kernel: shared-memory layouts with
// the 128-byte swizzle, wgmma descriptors and synchronization, mbarriers, cp.async gathers, named
// barriers, register reallocation, 4-byte cp.async, ldmatrix, vector global reductions and stores,
// L2 prefetch, the column permutation of the accumulator-friendly tiles and cp.async tile loads. The
// one home of the PTX wrappers of the sm90 backend. Checked on the GPU by
// tests/cuda/hopper_primitives_check.cu.
//
// Tile layout used throughout ("SW128 tile"): a [rows x 64] bf16 block, one 128-byte row per row,
// rows grouped by 8 into 1024-byte swizzle atoms; inside a row the 16-byte chunk c is stored at
// chunk c ^ (row % 8). A wider matrix [rows x 64*nb] is stored as nb such blocks one after another
// (block b holds columns [64b, 64b+64)). Tiles must be 1024-byte aligned.
//
// wgmma accumulator layout (m64nN, f32): warp w of the warpgroup owns rows 16w..16w+15; for
// n-chunk j in [0, N/8): d[4j+0], d[4j+1] are (row 16w + lane/4,     col 8j + 2(lane%4) + {0,1}),
//                         d[4j+2], d[4j+3] are (row 16w + lane/4 + 8, same cols).
// RS A-fragment (m64k16, bf16 pairs): a[0] = (r, c..c+1), a[1] = (r+8, c..c+1), a[2] = (r, c+8..c+9),
// a[3] = (r+8, c+8..c+9) with r = 16w + lane/4, c = 2(lane%4): so accumulator chunks 2kk and 2kk+1
// of an m64n* result convert directly into the A operand of k-step kk (see acc_to_a_frag).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "sm90/common/constants.h"
#include "sm90/common/wgmma_ops.cuh"

namespace flashdsa::sm90::hw {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of (row, 16-byte chunk) inside one SW128 block of 64 bf16 columns.
__host__ __device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kSw128RowBytes + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of element (row, col) in a SW128 tile of `rows` rows and any number of 64-col blocks.
__host__ __device__ __forceinline__ uint32_t sw128_elem_offset(int rows, int row, int col) {
  return static_cast<uint32_t>((col >> 6) * rows * kSw128RowBytes) + sw128_offset(row, (col & 63) >> 3) +
         static_cast<uint32_t>((col & 7) * 2);
}

// Stored position of column c inside its 64-column block in a "permuted" tile. Within each group of
// 16 columns, column 16m + 4q + 2h + e (q < 4, h, e < 2) is stored at position 16m + 8h + 2q + e. A
// wgmma accumulator gives lane-quad member q the positions 8n + 2q + {0,1}, i.e. the columns
// 16(n/2) + 4q + 2(n%2) + {0,1}: for each m, accumulator n-groups 2m and 2m+1 hold the four
// consecutive columns 16m + 4q .. 16m + 4q + 3, so a GEMM whose B operand is a permuted tile emits
// rows as runs of 4 consecutive columns (16-byte stores / reductions; full 128-byte lines when two
// quads merge). Even columns stay paired, so 4-byte copies can fill such a tile. Used by the KL-loss
// dk GEMM (Q_I). (The sparse MLA backward keeps its tiles in natural order and interleaves the dkv
// columns instead: dkv_pos in csrc/sm90/sparse_mla_bwd/kernel_common.cuh.)
__host__ __device__ constexpr int permuted_col(int col) {
  return (col & ~15) | ((col & 2) << 2) | ((col & 12) >> 1) | (col & 1);
}

// The same map written with a select (column 4q + e of a 16-group goes to 2q + e for e < 2, else to
// 8 + 2q + e - 2). The KL-loss dk kernels use this spelling: ptxas schedules their loads differently
// with the bitwise one (scripts/sass_diff.sh), and their machine code is kept as it was.
__host__ __device__ constexpr int permuted_col_select(int c) {
  return (c & ~15) + ((c & 3) < 2 ? 2 * ((c & 15) >> 2) + (c & 3) : 8 + 2 * ((c & 15) >> 2) + (c & 3) - 2);
}

constexpr bool permuted_col_forms_agree() {
  for (int c = 0; c < 1024; ++c) {
    if (permuted_col(c) != permuted_col_select(c)) return false;
  }
  return true;
}
static_assert(permuted_col_forms_agree(), "the two spellings of the column permutation must agree");

// ---- wgmma descriptors ---------------------------------------------------------------------------
// Layout of the 64-bit descriptor: [0,14) start address >> 4, [16,30) leading byte offset >> 4,
// [32,46) stride byte offset >> 4, [49,52) base offset (0: tiles are 1024-aligned), [62,64) swizzle
// mode (1 = 128B).
__device__ __forceinline__ uint64_t make_desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_u32(smem) & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// K-major operand (rows = M or N, K contiguous), k-step `ks` (16 columns) of a SW128 tile with
// `rows` rows. Columns [16ks, 16ks+16) lie in block ks/4 at byte 32*(ks%4) of each row.
__device__ __forceinline__ uint64_t desc_k_major(const void* tile, int rows, int ks) {
  const char* base = static_cast<const char*>(tile) + (ks >> 2) * rows * kSw128RowBytes + (ks & 3) * 32;
  return make_desc_sw128(base, 16, kSw128AtomBytes);
}

// MN-major operand (rows = K, M/N contiguous): the tile stores K rows of the matrix, each row being
// M/N values split into 64-column blocks (so a [keys x D] tile read as B = V with K = keys, N = D).
// k-step `ks` covers rows [16ks, 16ks+16); `n_block0` selects the first 64-col block of this operand.
// LBO = distance between 64-wide blocks along M/N, SBO = distance between 8-row groups along K.
__device__ __forceinline__ uint64_t desc_mn_major(const void* tile, int rows, int ks, int n_block0) {
  const char* base = static_cast<const char*>(tile) + n_block0 * rows * kSw128RowBytes + ks * 16 * kSw128RowBytes;
  return make_desc_sw128(base, static_cast<uint32_t>(rows * kSw128RowBytes), kSw128AtomBytes);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Accumulator chunks 2kk, 2kk+1 (16 columns) of an m64n* f32 result -> RS A-fragment for k-step kk.
template <int NACC>
__device__ __forceinline__ void acc_to_a_frag(const float (&d)[NACC], int kk, uint32_t (&a)[4]) {
  const int b = 8 * kk;
  a[0] = pack_bf16(d[b + 0], d[b + 1]);
  a[1] = pack_bf16(d[b + 2], d[b + 3]);
  a[2] = pack_bf16(d[b + 4], d[b + 5]);
  a[3] = pack_bf16(d[b + 6], d[b + 7]);
}

// ---- proxies, barriers, registers ----------------------------------------------------------------
// Generic-proxy smem writes (st.shared, stmatrix) that wgmma reads next need this fence.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int R>
__device__ __forceinline__ void reg_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void reg_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }

// ---- mbarrier ------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes mbarrier.init visible to the async proxy (cp.async arrivals).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
// Ends the barrier's life before its shared memory is used for anything else (no arrival may be pending).
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the phase with the given parity (0/1) has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---- cp.async (16-byte gathers) ------------------------------------------------------------------
// Explicit shared-memory loads / stores (LDS / STS) for pointers the compiler cannot prove to be in
// the shared window (e.g. a plan reached through a realigned integer address, which would otherwise
// become generic LD / ST).
__device__ __forceinline__ float ld_shared_f32(const void* p) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_u32(p)) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_u32(p)) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32(void* p, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_u32(p)), "f"(v) : "memory");
}
__device__ __forceinline__ void st_shared_u32(void* p, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_u32(p)), "r"(v) : "memory");
}

// Copies 16 bytes global -> shared; when `valid` is false nothing is read and the destination is
// zero-filled (src-size 0), so out-of-range rows are never touched.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem_dst)), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// Same, with an L2 cache-policy hint (e.g. from make_l2_evict_last()).
__device__ __forceinline__ void cp_async_16_hint(void* smem_dst, const void* gmem_src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_u32(smem_dst)),
               "l"(gmem_src), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
__device__ __forceinline__ uint64_t make_l2_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// The mbarrier receives one arrival when all of this thread's prior cp.async ops have completed
// (the barrier's expected count must include one arrival per calling thread).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// ---- more memory operations ----------------------------------------------------------------------
// Copies 4 bytes global -> shared (through L1); when `valid` is false nothing is read and the
// destination is zero-filled. Completion is tracked like cp_async_16 (cp_async_arrive).
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(valid ? 4 : 0)
               : "memory");
}

// Four 8x8 bf16 matrices: lane L gives the row address of matrix L/8, row L%8 (16-byte aligned);
// register i receives (row lane/4, cols 2(lane%4), 2(lane%4)+1) of matrix i: the mma.sync A / B
// fragment layout of a row-major tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
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

// Two adjacent floats (8-byte aligned), likewise.
__device__ __forceinline__ void red_add_v2(float* gptr, float2 v) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(gptr), "f"(v.x), "f"(v.y) : "memory");
}

// One float, likewise.
__device__ __forceinline__ void red_add(float* gptr, float v) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(gptr), "f"(v) : "memory");
}

// A 16-byte fp32 store to global memory.
__device__ __forceinline__ void st_global_v4(float* gptr, float4 v) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gptr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// Integer atomic add without return (relaxed, GPU scope).
__device__ __forceinline__ void red_add_u32(uint32_t* gptr, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(gptr), "r"(v) : "memory");
}

// 64-bit integer reduction (wraps modulo 2^64; order-independent).
__device__ __forceinline__ void red_add_u64(uint64_t* gptr, uint64_t v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;\n" ::"l"(gptr), "l"(v) : "memory");
}

// Hint: bring the line holding `gptr` into L2.
__device__ __forceinline__ void prefetch_l2(const void* gptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gptr));
}

// ---- tiles ---------------------------------------------------------------------------------------
// Rounds a shared-memory pointer up to the next kSmemAlign (1024-byte) boundary, keeping it a
// shared pointer (so the compiler keeps shared-memory instructions for every access through it).
__device__ __forceinline__ uint8_t* align_smem(uint8_t* p) {
  const uint32_t mis = smem_u32(p) & (kSmemAlign - 1);
  return p + ((kSmemAlign - mis) & (kSmemAlign - 1));
}

// cp.async copy of a [ROWS x COLS] bf16 tile into SW128 layout by NTHREADS threads; row r comes from
// src(r) (a row pointer, or nullptr for a zero-filled row that is never read).
template <int ROWS, int COLS, int NTHREADS, class RowSrc>
__device__ __forceinline__ void load_tile_sw128(uint8_t* tile, int tid, const __nv_bfloat16* any_valid, RowSrc src) {
  constexpr int kPieces = COLS / 8;  // 16-byte pieces per row
  static_assert((ROWS * kPieces) % NTHREADS == 0, "tile pieces must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < ROWS * kPieces / NTHREADS; ++i) {
    const int p = tid + i * NTHREADS;
    const int r = p / kPieces, c = p % kPieces;
    const __nv_bfloat16* row = src(r);
    cp_async_16(tile + sw128_elem_offset(ROWS, r, c * 8), row ? row + c * 8 : any_valid, row != nullptr);
  }
}

}  // namespace flashdsa::sm90::hw

// ---- additions for the sparse MLA forward variants (2026-12-02) ------------------------------------
namespace flashdsa::sm90::hw {

// cp_async_16 with the destination given as a shared-window address (smem_u32), so that callers can
// add compile-time offsets to one base register (ptxas folds them into the instruction's immediate).
__device__ __forceinline__ void cp_async_16_u32(uint32_t smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(valid ? 16 : 0)
               : "memory");
}

// stmatrix .x4 (bf16): stores four 8x8 matrices; lane l gives the shared address of row l % 8 of
// matrix l / 8, and r[m] is this lane's fragment of matrix m (row lane / 4, columns 2 (lane % 4) + {0, 1}),
// the same layout as a wgmma accumulator's 8-column chunk converted with pack_bf16.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr)
               : "memory");
  return v;
}

// 16-byte global store.
__device__ __forceinline__ void st_global_v4(void* gmem, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 2^x with the SFU (ex2.approx.ftz: flush-to-zero, ~2 ulp; exp2(-inf) = +0).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// {lo, hi} -> one 64-bit value (mov.b64 of a register pair: no shift / or).
__device__ __forceinline__ uint64_t pack_b64(uint32_t lo, uint32_t hi) {
  uint64_t r;
  asm("mov.b64 %0, {%1, %2};\n" : "=l"(r) : "r"(lo), "r"(hi));
  return r;
}

// blockIdx.x read through volatile asm: the compiler re-reads it where it is used instead of keeping
// values derived from it alive across a long loop (where they would be spilled).
__device__ __forceinline__ uint32_t ctaid_x_volatile() {
  uint32_t cta;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(cta));
  return cta;
}

}  // namespace flashdsa::sm90::hw

// ---- additions for the v2 indexer top-k (2026-12-02): TMA tensor loads ---------------------------
namespace flashdsa::sm90::hw {

// Arrives on the mbarrier and adds `bytes` to the transaction count of its current phase (the phase
// then completes when the arrivals are in and the async copies have delivered that many bytes).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// TMA: copies the 2-D box at coordinates (c0 = innermost, c1) of the tensor map `tmap` (a
// __grid_constant__ kernel parameter or global memory) into shared memory at `smem_dst` (1024-byte
// aligned for the 128-byte swizzle) and signals `bar` with the bytes delivered. Coordinates outside
// the tensor are zero-filled and still counted.
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* tmap, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// Brings a tensor map's descriptor into the cache ahead of its first TMA.
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

}  // namespace flashdsa::sm90::hw
