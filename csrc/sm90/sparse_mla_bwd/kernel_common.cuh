// Internal: the building blocks of the sparse MLA backward main kernel (main_kernel.cuh; design:
// docs/kernels/sparse_mla_bwd.md): the launch parameters, the work item, the block list with its
// sweep rotation, the kv gather, P and dS of a [64 heads x 64 keys]
// accumulator, the dQ store, the wgmma sequences of S / dP and dKV, the dKV emission in the dkv_pos
// column order (quad-pair exchange, atomics or deterministic stores) with the back's chunk steps, and
// the attention-mass output.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"
#include "sm90/sparse_mla_bwd/fixed_pair.h"

// The deterministic mode (kDeterministic) has no partial buffers: the main kernel adds each addend of dkv as 32-bit
// fixed-point pairs in 64-bit integer reductions (fixed_pair.h: exact and order-independent), one power-of-two unit
// per key row, the rows sorted and walked without rotation (sweep sizes); per key row an integer sum of the addends'
// largest magnitudes proves the row exact (or the row is re-run with a unit from that sum); a decode pass writes fp32
// dkv in natural order (det_fixed.cuh; docs/kernels/sparse_mla_bwd.md).
// FLASHDSA_BWD_SWEEP_NOROT=1: measurement build, the sorted sweep without its rotation (every CTA walks its sorted row
// from the first block, a run-independent order as a deterministic mode needs; docs/perf-notes.md, twenty-third
// session). dq and dkv stay correct.
#ifndef FLASHDSA_BWD_SWEEP_NOROT
#define FLASHDSA_BWD_SWEEP_NOROT 0
#endif

namespace flashdsa::sm90::sparse_mla_bwd_impl {

struct MainParams {
  const __nv_bfloat16* q;     // [T, H, 576]; strides q_stride_t, q_stride_h
  const __nv_bfloat16* kv;    // [T_kv, 576]; stride kv_stride_t
  const int32_t* indices;     // [tokens of this launch, K], row 0 = token_begin; stride indices_stride_t
  const float* lse;           // [T, H] natural log
  const __nv_bfloat16* out;   // [T, H, 512] the forward's output (Delta = rowsum(dout * out) in the prologue)
  const __nv_bfloat16* dout;  // [T, H, 512]
  __nv_bfloat16* dq;          // [T, H, 576]
  float* dkv;                 // [T_kv, 576] fast mode: accumulated with vector atomics (dkv_pos order)
  uint32_t* sweep_counter;    // sweep mode (rows sorted): key blocks issued by all CTAs; else null
  float* mass;                // optional [T, K] head-summed attention mass (zeroed before; added to)
  const int32_t* mass_slots;  // sweep mode + mass: [tokens, K] chunk pair id (row * K + original slot)
                              // of each sorted entry; null: entry j of the row is slot j
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;
  int64_t token_begin;        // global token of local token 0 (grid.x = tokens of this launch)
  int64_t T_kv;
  int H, K;
  float scale;                // softmax scale
  float scale_log2;           // scale * log2(e)
  int resident_ctas;          // sweep mode: CTAs of this launch running at once
  float* fix_unit;               // [T_kv] deterministic mode: each key row's unit (a power of two); < 0: re-run row
  unsigned long long* fix_l1;    // [T_kv] Σ over the row's addends of ⌈max |value| · unit⌉ (exact below 2^31)
  uint32_t* fix_capped;          // [T_kv] != 0: an addend of the row reached 2^22 units (or was not finite)
  uint32_t* fix_amax;            // [T_kv] the bits of the row's largest |value| (an order-independent max)
  const uint32_t* fix_rerun;     // pass 2 runs only when *fix_rerun != 0 (set by the check pass)
  int fix_pass;                  // 1: every row; 2: only rows with fix_unit < 0, no mass output
};

// Position inside its 16-column group at which dkv column 16m + 8h + 2q + e (h, e < 2, q < 4) is
// stored during the call: 16m + 4q + 2h + e. A natural-order wgmma accumulator gives lane-quad member
// q the columns 8n + 2q + {0, 1}; n-groups 2m and 2m + 1 together are then the four consecutive
// stored positions 16m + 4q .. +3, i.e. one 16-byte vector. dkv_unpermute_kernel (sparse_mla_bwd.cu)
// restores the natural order at the end of the call.
__host__ __device__ constexpr int dkv_pos(int col) {
  return (col & ~15) | ((col & 6) << 1) | ((col & 8) >> 2) | (col & 1);
}

// The emission contract: quad member q's accumulator pairs of n-groups 2m and 2m + 1 land on the four
// consecutive positions 16m + 4q .. +3, and the map is a permutation inside each 16-column group.
constexpr bool dkv_pos_ok() {
  bool seen[16] = {};
  for (int c = 0; c < 16; ++c) {
    const int pos = dkv_pos(c);
    if (pos < 0 || pos >= 16 || seen[pos]) return false;
    seen[pos] = true;
  }
  for (int m = 0; m < kQkCols / 16; ++m)
    for (int q = 0; q < 4; ++q)
      for (int e = 0; e < 2; ++e)
        if (dkv_pos(16 * m + 2 * q + e) != 16 * m + 4 * q + e ||
            dkv_pos(16 * m + 8 + 2 * q + e) != 16 * m + 4 * q + 2 + e)
          return false;
  return true;
}
static_assert(dkv_pos_ok(), "dkv column order");

namespace detail {

using hw::desc_k_major;
using hw::desc_mn_major;

__device__ __forceinline__ bool key_valid(int32_t idx, int64_t t_kv) { return idx >= 0 && idx < t_kv; }

// Coordinates of this CTA's work item.
struct Work {
  int64_t local_token;  // row of this launch
  int64_t token;        // global query token
  int head_group;       // heads [64 g, 64 g + 64)
  int heads;            // real heads of the group (< 64 for H = 16, 32: the rest is zero padding)
};

// The work item of this CTA (grid = (tokens of this launch, head groups)).
__device__ __forceinline__ Work make_work(const MainParams& p) {
  Work w;
  w.local_token = blockIdx.x;
  w.token = p.token_begin + w.local_token;
  w.head_group = blockIdx.y;
  w.heads = min(p.H - w.head_group * kHeadsPerCta, kHeadsPerCta);
  return w;
}

// The CTA's smem plan: the first 1024-byte boundary of the dynamic shared memory (SW128 tiles).
template <class Plan>
__device__ __forceinline__ Plan& smem_plan(uint8_t* raw) {
  return *reinterpret_cast<Plan*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// The CTA's smem plan at the start of the dynamic shared memory (every kernel's extern __shared__
// array starts there).
template <class Plan>
__device__ __forceinline__ Plan& dynamic_smem_plan() {
  extern __shared__ uint8_t dynamic_smem[];
  return smem_plan<Plan>(dynamic_smem);
}

// One mbarrier of the smem plan and its expected arrivals.
struct BarrierInit {
  uint64_t* bar;
  int count;
};

// Thread 0 initialises the CTA's mbarriers (in argument order); then the whole CTA syncs.
template <class... Inits>
__device__ __forceinline__ void init_barriers(Inits... inits) {
  if (threadIdx.x == 0) {
    (hw::mbar_init(inits.bar, inits.count), ...);
    hw::mbar_fence_init();
  }
  __syncthreads();
}

// ---- setup: the block list ----------------------------------------------------------------

// The non-empty key blocks of the row (rows are often -1-padded at the end) into sm.block_list, in
// processing order, and their count into sm.num_blocks; called by the 128 threads of one warpgroup,
// which synchronise on named barrier kBar. Sweep mode: all CTAs walk their (key-sorted) rows in step,
// so that the kv and dkv rows being touched at any moment lie in a narrow key window that stays in
// L2. Every CTA counts the blocks it issues; counter / resident CTAs (mod blocks per row) is the
// average position of the running CTAs, and a new row starts there (0 without sweep), wrapping around.
template <bool kDeterministic, int kBar>
__device__ __forceinline__ void build_block_list(const MainParams& p, SmemPlan& sm, const int32_t* idx_row,
                                                 int num_row_blocks, int warp, int lane) {
  for (int blk = warp; blk < num_row_blocks; blk += 4) {
    // the deterministic mode's pass 2: only blocks with a key row marked for the re-run (negative unit)
    auto wanted = [&](int32_t key) {
      return key_valid(key, p.T_kv) && (!kDeterministic || p.fix_pass != 2 || p.fix_unit[key] < 0.f);
    };
    const bool v = wanted(idx_row[blk * kBlockKeys + lane]) || wanted(idx_row[blk * kBlockKeys + 32 + lane]);
    const bool any = __any_sync(0xffffffffu, v);
    if (lane == 0) sm.block_list[blk] = any ? 1 : 0;  // flags first, compacted below
  }
  hw::named_bar_sync(kBar, 128);
  if (warp == 0) {
    uint32_t ballot[kMaxBlocksPerRow / 32];
    int total = 0;
#pragma unroll
    for (int r = 0; r < kMaxBlocksPerRow / 32; ++r) {
      const int blk = 32 * r + lane;
      ballot[r] = __ballot_sync(0xffffffffu, blk < num_row_blocks && sm.block_list[blk] != 0);
      total += __popc(ballot[r]);
    }
    __syncwarp();
    int rot = 0;
#if !FLASHDSA_BWD_SWEEP_NOROT
    // (the deterministic mode's sweep_counter counts CTAs for its waves: no rotation, every row from block 0)
    if (!kDeterministic && p.sweep_counter != nullptr && total > 0) {
      const uint32_t issued = *reinterpret_cast<volatile uint32_t*>(p.sweep_counter);
      const int position = static_cast<int>((issued / static_cast<uint32_t>(p.resident_ctas)) % num_row_blocks);
      rot = position * total / num_row_blocks;
    }
#endif
    int before = 0;
#pragma unroll
    for (int r = 0; r < kMaxBlocksPerRow / 32; ++r) {
      if (ballot[r] >> lane & 1u) {
        int pos = before + __popc(ballot[r] & ((1u << lane) - 1u)) - rot;
        if (pos < 0) pos += total;
        sm.block_list[pos] = static_cast<uint8_t>(32 * r + lane);
      }
      before += __popc(ballot[r]);
    }
    if (lane == 0) sm.num_blocks = total;
  }
  hw::named_bar_sync(kBar, 128);
}

// ---- the kv gather ------------------------------------------------------------------------------

// The 16-byte copies of one thread: tile rows rsub + 16 r (r < 4), chunk `chunk` of every 64-column
// block (8 threads cover one 128-byte row segment). The swizzled chunk depends on rsub % 8 only.
struct Copier {
  int rsub, chunk;
  uint32_t row_off;  // byte offset of (row rsub, chunk) in an SW128 block
  __device__ explicit Copier(int tid) : rsub(tid / 8), chunk(tid % 8) { row_off = hw::sw128_offset(rsub, chunk); }
  // Tile row rsub + 16 r of a [kRows x 64 kBlocks] tile <- src[64 b + 8 chunk .. + 8) for all b.
  template <int kBlocks, int kRows>
  __device__ __forceinline__ void copy_row(uint32_t tile, int r, const __nv_bfloat16* src_row, bool valid) const {
    const uint32_t dst = tile + row_off + r * 16 * 128;
    const __nv_bfloat16* src = src_row + 8 * chunk;
    asm("" : "+l"(src));  // one pointer, immediate offsets per block
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) hw::cp_async_16_u32(dst + b * kRows * 128, src + b * kColsPerBlock, valid);
  }
};

// Writes the keys k of this thread's gather rows cp.rsub + 16 r of block i to idx[i % 2] and issues
// their kv gathers (invalid keys: zero-filled, never read); the caller commits / arrives.
__device__ __forceinline__ void gather_kv(const MainParams& p, SmemPlan& sm, const Copier& cp, uint32_t kv_tile,
                                          int i, const int32_t (&k)[4]) {
  if (cp.chunk == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) sm.idx[i & 1][cp.rsub + 16 * r] = k[r];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const bool valid = key_valid(k[r], p.T_kv);
    cp.copy_row<kQkBlocks, kBlockKeys>(kv_tile, r, p.kv + (valid ? int64_t(k[r]) : 0) * p.kv_stride_t, valid);
  }
}

// ---- lse, Delta; P, dS and their bf16 tiles ---------------------------------------------------

// Head t < 64 of the CTA's group (lse row row0 + t; real: not a padded head): lse2[t] = lse * log2(e)
// (+inf on padded heads: P = 0 there). Delta is formed by load_q_do (main_kernel.cuh) from O and the dO tile.
__device__ __forceinline__ void store_lse2(const MainParams& p, float* lse2, int64_t row0, bool real, int t) {
  lse2[t] = real ? p.lse[row0 + t] * 1.4426950408889634f : __int_as_float(0x7f800000);  // +inf: P = 0
}

// Offsets of the accumulator element pairs (row r0 / r0 + 8, keys 8n + 2q4, +1) in a [64 h][64 keys]
// bf16 SW128 tile.
__device__ __forceinline__ uint32_t tile_pair_offset(int row, int n, int q4) {
  return hw::sw128_offset(row, n) + 4 * q4;
}

// s <- P = exp(scale S - lse) on valid keys, 0 elsewhere; idx: the keys of the block (smem).
__device__ __forceinline__ void exp_scores(float (&s)[32], const int32_t* idx, const MainParams& p, float lse2_lo,
                                           float lse2_hi, int q4) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int2 keys = *reinterpret_cast<const int2*>(&idx[8 * n + 2 * q4]);
    const bool valid[2] = {key_valid(keys.x, p.T_kv), key_valid(keys.y, p.T_kv)};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[4 * n + e] = valid[e & 1] ? exp2f(fmaf(s[4 * n + e], p.scale_log2, -(e < 2 ? lse2_lo : lse2_hi))) : 0.f;
  }
}

// dS = scale P (dP - Delta) in place on n-group n of the dP accumulator (P: its four elements).
__device__ __forceinline__ void ds_group(float (&dp)[32], int n, float p0, float p1, float p2, float p3,
                                         float delta_lo, float delta_hi, float scale) {
  dp[4 * n + 0] = p0 * (dp[4 * n + 0] - delta_lo) * scale;
  dp[4 * n + 1] = p1 * (dp[4 * n + 1] - delta_lo) * scale;
  dp[4 * n + 2] = p2 * (dp[4 * n + 2] - delta_hi) * scale;
  dp[4 * n + 3] = p3 * (dp[4 * n + 3] - delta_hi) * scale;
}

// The front's constants: lse * log2(e) and Delta of its accumulator rows (heads) r0 and r0 + 8, and
// the P and dS tiles as bytes.
struct FrontConsts {
  float lse2_lo, lse2_hi, delta_lo, delta_hi;
  char* p_tile;
  char* ds_tile;
};
__device__ __forceinline__ FrontConsts front_consts(SmemPlan& sm, int r0) {
  return FrontConsts{sm.lse2[r0], sm.lse2[r0 + 8], sm.delta[r0], sm.delta[r0 + 8], reinterpret_cast<char*>(sm.p),
                     reinterpret_cast<char*>(sm.ds)};
}

// Waits until at most kPending wgmma groups are in flight (S = Q . KV^T landed), then
// P = exp(scale S - lse) in place on valid keys, 0 elsewhere (exp_scores).
template <int kPending>
__device__ __forceinline__ void scores_to_p(float (&s)[32], const int32_t* idx, const MainParams& p,
                                            const FrontConsts& fc, int q4) {
  hw::wgmma_wait<kPending>();
  hw::fence_regs(s);
  exp_scores(s, idx, p, fc.lse2_lo, fc.lse2_hi, q4);
}

// Zeroes an accumulator.
template <int kN>
__device__ __forceinline__ void zero_acc(float (&acc)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = 0.f;
}

// ---- dQ store ---------------------------------------------------------------------------------

// Writes dQ blocks [first_block, first_block + kBlocks) of a [64 heads x 64 kBlocks] fp32 accumulator
// (rows r0, r0 + 8 of this thread) as bf16: n-group n holds columns 8n + 2q, +1 (natural order), stored
// as one 4-byte pair.
template <int kBlocks>
__device__ __forceinline__ void store_dq(const float (&acc)[kBlocks * 32], __nv_bfloat16* dq_head0, int heads,
                                         int first_block, int r0, int q4) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = r0 + 8 * half;
      if (row >= heads) continue;
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float* a = acc + 32 * j + 4 * v + 2 * half;
        *reinterpret_cast<uint32_t*>(dq_head0 + int64_t(row) * kQkCols + (first_block + j) * kColsPerBlock + 8 * v +
                                     2 * q4) = hw::pack_bf16(a[0], a[1]);
      }
    }
  }
}

// Stores kBlocks 64-column blocks of a dQ accumulator (first column block `first`) of the CTA's
// heads (warpgroup thread with warp `warp`, lane `lane`).
template <int kBlocks>
__device__ __forceinline__ void store_dq_blocks(const MainParams& p, const float (&acc)[kBlocks * 32], int first,
                                                int warp, int lane) {
  const Work w = make_work(p);
  const int r0 = 16 * warp + lane / 4, q4 = lane % 4;
  __nv_bfloat16* const dq_head0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<kBlocks>(acc, dq_head0, w.heads, first, r0, q4);
}

// ---- wgmma sequences --------------------------------------------------------------------------

// acc = A . KV^T over kBlocks column blocks: A = Q (S) or dO (dP), [64 heads x 64 keys] (no fence,
// no commit).
template <int kBlocks>
__device__ __forceinline__ void mma_heads_keys(float (&acc)[32], const void* a_tile, const void* kv_tile) {
#pragma unroll
  for (int ks = 0; ks < 4 * kBlocks; ++ks)
    hw::wgmma_ss_m64n64k16<0, 0>(acc, desc_k_major(a_tile, kHeadsPerCta, ks), desc_k_major(kv_tile, kBlockKeys, ks),
                                 ks > 0);
}

// dKV chunk c = dS^T . Q[:, c] (+ P^T . dO[:, c] for value chunks) into acc, A read transposed from
// the tiles; one commit group.
__device__ __forceinline__ void issue_dkv_chunk(const SmemPlan& sm, float (&acc)[32], int c) {
  hw::wgmma_fence();
#pragma unroll
  for (int hk = 0; hk < 4; ++hk)
    hw::wgmma_ss_m64n64k16<1, 1>(acc, desc_mn_major(sm.ds, kHeadsPerCta, hk, 0),
                                 desc_mn_major(sm.q, kHeadsPerCta, hk, c), hk > 0);
  if (c < kVBlocks) {
#pragma unroll
    for (int hk = 0; hk < 4; ++hk)
      hw::wgmma_ss_m64n64k16<1, 1>(acc, desc_mn_major(sm.p, kHeadsPerCta, hk, 0),
                                   desc_mn_major(sm.dout, kHeadsPerCta, hk, c), true);
  }
  hw::wgmma_commit();
}

// ---- dKV emission -----------------------------------------------------------------------------

__device__ __forceinline__ float4 shfl_xor4(float4 v, int mask) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
                     __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
}


// Emits one [64 keys x 64 cols] fp32 dKV chunk held as a natural-order wgmma accumulator: quad member
// q holds, for its rows r0 and r0 + 8 (r0 = 16 warp + lane / 4), the columns 16m + 2q, +1 and
// 16m + 8 + 2q, +1 in n-groups 2m, 2m + 1, which go as one float4 to the stored positions
// 16m + 4q .. +3 (dkv_pos). The even quad of a quad pair (odd = (lane / 4) % 2 = 0) keeps m = 0, 2 of
// its row and receives m = 0, 2 of the odd quad's row; the odd quad keeps m = 1, 3 and receives the
// even quad's m = 1, 3. Then each 16-byte store of the 8 lanes covers one full 128-byte line of one
// row: 4 lines per warp instruction. Thread (warp, lane) emits rows A = r0 + 8 half - odd and B = A + 1
// where valid[half][A / B], at dst(half, 0 / 1) (the row's chunk start plus this lane's column; the
// address is formed inside the validity test).
template <class Dst>
__device__ __forceinline__ void emit_dkv_pairs(const float (&acc)[32], const bool (&valid)[2][2], int lane, Dst dst) {
  const bool odd = (lane >> 2) & 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float4 piece[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
      piece[m] = make_float4(acc[8 * m + 2 * half], acc[8 * m + 2 * half + 1], acc[8 * m + 4 + 2 * half],
                             acc[8 * m + 5 + 2 * half]);
    const float4 got0 = shfl_xor4(odd ? piece[0] : piece[1], 4);
    const float4 got1 = shfl_xor4(odd ? piece[2] : piece[3], 4);
    const float4 a0 = odd ? got0 : piece[0], a1 = odd ? got1 : piece[2];  // row A, columns +0 / +32
    const float4 b0 = odd ? piece[1] : got0, b1 = odd ? piece[3] : got1;  // row B
    if (valid[half][0]) {
      float* const dst_a = dst(half, 0);
      hw::red_add_v4(dst_a, a0);
      hw::red_add_v4(dst_a + 32, a1);
    }
    if (valid[half][1]) {
      float* const dst_b = dst(half, 1);
      hw::red_add_v4(dst_b, b0);
      hw::red_add_v4(dst_b + 32, b1);
    }
  }
}

// emit_dkv_pairs's quad-pair exchange for rows r0 + 8 half, for the deterministic emission: x[0] / x[1] = this lane's 16 bytes
// of row A / B, [0] / [1] = the chunk's first / second 128-byte line. (emit_dkv_pairs keeps its own inline copy: calling
// this helper there changed the default build's instruction schedule.)
__device__ __forceinline__ void quad_pair_exchange(const float (&acc)[32], int half, bool odd, float4 (&x)[2][2]) {
  float4 piece[4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
    piece[m] = make_float4(acc[8 * m + 2 * half], acc[8 * m + 2 * half + 1], acc[8 * m + 4 + 2 * half],
                           acc[8 * m + 5 + 2 * half]);
  const float4 got0 = shfl_xor4(odd ? piece[0] : piece[1], 4);
  const float4 got1 = shfl_xor4(odd ? piece[2] : piece[3], 4);
  x[0][0] = odd ? got0 : piece[0], x[0][1] = odd ? got1 : piece[2];
  x[1][0] = odd ? piece[1] : got0, x[1][1] = odd ? piece[3] : got1;
}

// dkv destinations of one thread for the current key block: rows A = 16 warp + lane / 4 + 8 half -
// odd and B = A + 1 (quads 2k and 2k + 1 write together, emit_dkv_pairs) of `base`, a [rows, 576]
// fp32 matrix (dkv), plus this lane's column. One 64-bit base and four 32-bit rows (four 64-bit pointers spilled).
struct DkvRows {
  float* base;
  uint32_t row[2][2];  // [half][A, B]: key
  bool valid[2][2];
  float unit[2][2];               // deterministic mode: the row's unit
  // deterministic mode: the largest |value| this lane sent to the row in this block, as a signed and an unsigned max
  // of the values' bits (absmax2_bits4; finish_fixed_rows combines them)
  mutable uint32_t amax[2][2], amaxn[2][2];
  uint64_t* wptr[2][2];  // deterministic mode: the lane's first pair word in the row (byte 8k of its chunk-0 line)
};

// Deterministic mode, fixed-point pairs: the fast mode's rows (keys of rows A, B) plus each row's unit; pass 2 sends
// only rows marked for a re-run (negative unit), the others already hold their exact sums.
__device__ __forceinline__ DkvRows dkv_rows_fixed(const MainParams& p, const int32_t* idx, int warp, int lane) {
  const int odd = (lane >> 2) & 1;
  const int row0 = 16 * warp + (lane >> 2) - odd;
  DkvRows r;
  r.base = p.dkv + 16 * odd + 4 * (lane & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      const int32_t key = idx[row0 + 8 * half + ab];
      bool valid = key_valid(key, p.T_kv);
      const float u = valid ? p.fix_unit[key] : 1.f;
      if (p.fix_pass == 2) valid = valid && u < 0.f;
      r.valid[half][ab] = valid;
      r.row[half][ab] = valid ? uint32_t(key) : 0u;
      r.unit[half][ab] = fabsf(u);
      r.amax[half][ab] = 0u;
      r.amaxn[half][ab] = 0u;
      // r.base carries the lane's column 4 (lane % 8) floats; its first pair word sits at byte 8 (lane % 8)
      r.wptr[half][ab] = reinterpret_cast<uint64_t*>(r.base - 2 * (lane & 7) + size_t(r.row[half][ab]) * kQkCols);
    }
  }
  return r;
}

template <bool kDeterministic>
__device__ __forceinline__ DkvRows dkv_rows(const MainParams& p, const int32_t* idx, int warp, int lane) {
  if constexpr (kDeterministic) return dkv_rows_fixed(p, idx, warp, lane);
  const int odd = (lane >> 2) & 1;
  const int col = 16 * odd + 4 * (lane & 3);
  const int row0 = 16 * warp + (lane >> 2) - odd;
  DkvRows r;
  r.base = p.dkv + col;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      const int32_t key = idx[row0 + 8 * half + ab];
      r.valid[half][ab] = key_valid(key, p.T_kv);
      r.row[half][ab] = r.valid[half][ab] ? uint32_t(key) : 0u;
    }
  }
  return r;
}

// The fast mode's destination of row (half, ab).
__device__ __forceinline__ float* dkv_row_ptr(const DkvRows& r, int half, int ab) {
  return r.base + size_t(r.row[half][ab]) * kQkCols;
}

// A row's |max| as two running maxima of its values' bits, with no masking per value: a signed one (pos, from 0: the
// largest non-negative value's bits, +NaN above +inf) and an unsigned one (neg: a negative value's bits exceed every
// non-negative one's and grow with its magnitude, -NaN the largest); the row's |max| bits are max(pos, neg & 0x7FFFFFFF)
// (finish_fixed_rows; as unsigned integers NaN and inf order above every finite value, so a non-finite addend makes the
// row's check fail). Two 3-input integer max instructions per two values.
__device__ __forceinline__ void absmax2_bits4(uint32_t& pos, uint32_t& neg, float4 x) {
  const int32_t a = __float_as_int(x.x), b = __float_as_int(x.y), c = __float_as_int(x.z), d = __float_as_int(x.w);
  pos = uint32_t(max(max(int32_t(pos), a), max(max(b, c), d)));
  neg = max(max(neg, uint32_t(a)), max(max(uint32_t(b), uint32_t(c)), uint32_t(d)));
}

// One lane's 16 bytes of a row line (float4 `x`: positions 4k .. 4k + 3 of the line, k = lane % 8) as two pair words in
// their raw form (fixed_pair::pack_raw: two FFMA per pair, no integer work; the decode pass removes the bias from the
// row's addend count): (x, y) at byte 8k (q) and (z, w) at byte 64 + 8k of the same line (the decode pass's layout). A
// value beyond to_fixed's range makes the row fail its check (fixed_pair::check_term) and re-run.
__device__ __forceinline__ void put_fixed_words(uint64_t* q, float4 x, float unit) {
  hw::red_add_u64(q, fixed_pair::pack_raw(x.x, x.y, unit));
  hw::red_add_u64(q + 8, fixed_pair::pack_raw(x.z, x.w, unit));
}

// Deterministic mode, fixed-point pairs: the fast mode's quad-pair exchange, then each valid row's two float4 as four
// pair words (two half lines each, completed by the next instruction), and the running |max| of the row's values.
__device__ __forceinline__ void emit_dkv_pairs_fixed(const float (&acc)[32], const DkvRows& rows, int chunk, int lane) {
  const bool odd = (lane >> 2) & 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float4 x[2][2];
    quad_pair_exchange(acc, half, odd, x);
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      if (!rows.valid[half][ab]) continue;
      // one word pointer per row and block (dkv_rows_fixed); the chunk and the four words are immediate offsets of it (a
      // 64-bit address per word cost ≈ 20 instructions per row and chunk in the back)
      uint64_t* const q = rows.wptr[half][ab] + chunk * (kColsPerBlock / 2);
      put_fixed_words(q, x[ab][0], rows.unit[half][ab]);
      put_fixed_words(q + 16, x[ab][1], rows.unit[half][ab]);
      absmax2_bits4(rows.amax[half][ab], rows.amaxn[half][ab], x[ab][0]);
      absmax2_bits4(rows.amax[half][ab], rows.amaxn[half][ab], x[ab][1]);
    }
  }
}

// After a block's last chunk: each row's largest |value| over the 8 lanes of its quad pair; one lane adds
// fixed_pair::check_term (⌈max · unit⌉, or 2^32 for an addend beyond to_fixed's range or not finite) to the row's
// check sum — below 2^31 the sum of the row's pair values is exact in any order (|Σ x| ≤ Σ |x|); a capped addend
// alone fails the check, and at most 2^31 addends per row keep the sum below 2^63 — and maxes the row's largest
// |value| (for a re-run's unit). All lanes call (shuffles).
__device__ __forceinline__ void finish_fixed_rows(const MainParams& p, const DkvRows& rows, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      uint32_t m = max(rows.amax[half][ab], rows.amaxn[half][ab] & 0x7FFFFFFFu);
#pragma unroll
      for (int mask = 1; mask < 8; mask <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, mask));
      if ((lane & 7) == 0 && rows.valid[half][ab]) {
        const unsigned long long add = fixed_pair::check_term(m, rows.unit[half][ab]);
        atomicAdd(p.fix_l1 + rows.row[half][ab], add);  // integer: order-independent
        atomicMax(p.fix_amax + rows.row[half][ab], m);
        if (add == fixed_pair::kCheckCap) atomicOr(p.fix_capped + rows.row[half][ab], 1u);  // measured sum: too low
      }
    }
  }
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk (column block `chunk`) in full 128-byte lines
// (emit_dkv_pairs).
template <bool kDeterministic>
__device__ __forceinline__ void emit_dkv_chunk(const float (&acc)[32], int chunk, const DkvRows& rows, int lane) {
// FLASHDSA_BWD_NO_DKV: measurement build only (scripts/bwd_gpu.sh NO_REDS=1: the compute-path floor):
// no dkv writes at all, wrong dkv. The chunk's wgmma chain is kept by a store that never happens (ptxas removes wgmma
// whose results nothing reads: the plain early return dropped 59 of the fast kernel's 148 HGMMA, so the builds before
// the twenty-seventh session measured a floor without most of the dKV MMAs).
#if FLASHDSA_BWD_NO_DKV
  if (__float_as_uint(acc[0]) == 0xffc0deadu) *rows.base = acc[1];
  return;
#endif
  if constexpr (kDeterministic) {
    emit_dkv_pairs_fixed(acc, rows, chunk, lane);
  } else {
    const auto dst = [&](int half, int ab) { return dkv_row_ptr(rows, half, ab) + chunk * kColsPerBlock; };
    emit_dkv_pairs(acc, rows.valid, lane, dst);
  }
}

// Chunk c >= 2: issue chunk c into acc[c % 2], wait for chunk c - 1 (one group may stay in flight),
// emit it.
template <bool kDeterministic, int kChunk>
__device__ __forceinline__ void dkv_step(const SmemPlan& sm, float (&acc0)[32], float (&acc1)[32],
                                         const DkvRows& rows, int lane) {
  float(&cur)[32] = (kChunk % 2 == 0) ? acc0 : acc1;
  float(&prev)[32] = (kChunk % 2 == 0) ? acc1 : acc0;
  issue_dkv_chunk(sm, cur, kChunk);
  hw::wgmma_wait<1>();
  hw::fence_regs(prev);
  emit_dkv_chunk<kDeterministic>(prev, kChunk - 1, rows, lane);
}

// ---- attention mass ---------------------------------------------------------------------------

// Slots of keys 2 lane, 2 lane + 1 of list block blk (warp 0 of the front, mass output only: the
// caller keeps {0, 0} elsewhere; loaded early, written by emit_mass after S).
__device__ __forceinline__ int2 mass_slot_of(const MainParams& p, const Work& w, int blk, int lane) {
  const int pos = blk * kBlockKeys + 2 * lane;
  if (p.mass_slots == nullptr) return make_int2(pos, pos + 1);
  const int64_t row0 = w.local_token * int64_t(p.K);
  const int2 pair = *reinterpret_cast<const int2*>(p.mass_slots + row0 + pos);
  return make_int2(static_cast<int>(pair.x - row0), static_cast<int>(pair.y - row0));
}

template <int kHalf>
__device__ __forceinline__ void mass_halve(float (&v)[16], int lane, int mask) {
  const bool upper = (lane & mask) != 0;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float mine = upper ? v[kHalf + j] : v[j];
    const float other = upper ? v[j] : v[kHalf + j];
    v[j] = mine + __shfl_xor_sync(0xffffffffu, other, mask);
  }
}

// Attention mass of one key block: the column sums of P [64 heads x 64 keys] over the CTA's heads,
// added to mass[token, slot] (zeroed before the launch; two head-group CTAs add at H = 128: the sum
// of two terms onto 0 is order-independent, so the result is still reproducible).
// P is the front's S accumulator after exp (thread: heads r0, r0 + 8; keys 8n + 2 q4 + {0, 1}).
// In-thread sum of the two heads, butterfly reduce-scatter over the 8 lanes of equal q4 (lane L ends
// with keys 2L, 2L + 1), warps 1..3 hand their sums to warp 0 through smem (named barrier kBar), warp
// 0 adds them in warp order. `slot` = the slots of keys 2L, 2L + 1 (mass_slot_of).
template <int kBar>
__device__ __forceinline__ void emit_mass(const MainParams& p, SmemPlan& sm, const Work& w, const float (&s)[32],
                                          int2 slot, int warp, int lane) {
  float v[16];  // v[2n + e]: key 8n + 2 q4 + e, summed over this thread's two heads
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    v[2 * n] = s[4 * n] + s[4 * n + 2];
    v[2 * n + 1] = s[4 * n + 1] + s[4 * n + 3];
  }
  // Three halving steps: lane bit 4 / 3 / 2 selects which half of the remaining keys it keeps.
  mass_halve<8>(v, lane, 16);
  mass_halve<4>(v, lane, 8);
  mass_halve<2>(v, lane, 4);
  if (warp > 0) *reinterpret_cast<float2*>(&sm.mass_part[warp - 1][2 * lane]) = make_float2(v[0], v[1]);
  hw::named_bar_sync(kBar, 128);
  if (warp != 0) return;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const float2 o = *reinterpret_cast<const float2*>(&sm.mass_part[k][2 * lane]);
    v[0] += o.x;
    v[1] += o.y;
  }
  float* const row = p.mass + w.token * int64_t(p.K);
  if (p.mass_slots == nullptr) {
    hw::red_add_v2(row + slot.x, make_float2(v[0], v[1]));  // slot.y = slot.x + 1
  } else {
    hw::red_add(row + slot.x, v[0]);
    hw::red_add(row + slot.y, v[1]);
  }
}

}  // namespace detail
}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
