// Internal: the sparse MLA backward main kernel (docs/spec.md §5): per query token and group of 64
// heads, recomputes S = Q.KV^T and dP = dO.V^T block by block over the token's top-k keys, forms
// P and dS, accumulates dQ in registers and emits each key block's dKV contribution (key role,
// 576 columns, and value role, 512 columns) already summed over the 64 heads.
// Design, smem plan and pipeline: docs/kernels/sparse_mla_bwd.md. Shapes: config.h.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/common/hopper.cuh"
#include "sm90/sparse_mla_bwd/config.h"

namespace flashdsa::sm90::sparse_mla_bwd_impl {

struct MainParams {
  const __nv_bfloat16* q;     // [T, H, 576]; strides q_stride_t, q_stride_h
  const __nv_bfloat16* kv;    // [T_kv, 576]; stride kv_stride_t
  const int32_t* indices;     // [tokens of this launch, K], row 0 = token_begin; stride indices_stride_t
  const float* lse;           // [T, H] natural log
  const float* delta;         // [T, H] rowsum(dout * out)
  const __nv_bfloat16* dout;  // [T, H, 512]
  __nv_bfloat16* dq;          // [T, H, 576]
  float* dkv;                 // [T_kv, 576] fast mode: accumulated with vector atomics
  float* partial;             // [tokens of this launch, G, K, 576] deterministic mode: per-slot dkv
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
};

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

// ---- producer warpgroup -----------------------------------------------------------------------

// Copies of 128-byte row segments (64 bf16 columns of one tile block) into a permuted SW128 tile:
// lane l of a warp moves columns 2l, 2l+1 (one 4-byte word) to their stored position (hw::permuted_col).
struct RowSegmentCopier {
  uint32_t chunk, byte_in_chunk;  // this lane's destination inside a tile row
  int lane;
  __device__ explicit RowSegmentCopier(int lane_) : lane(lane_) {
    const int pos = hw::permuted_col(2 * lane_);
    chunk = pos / 8;
    byte_in_chunk = (pos % 8) * 2;
  }
  // Tile row `row` (shared address `tile`), blocks [0, kBlocks) <- src_row[64 b + 2 lane, +1].
  template <int kBlocks>
  __device__ __forceinline__ void copy_row(uint32_t tile, int row, const __nv_bfloat16* src_row, bool valid) const {
    const uint32_t dst = tile + hw::sw128_offset(row, chunk) + byte_in_chunk;
    const __nv_bfloat16* src = src_row + 2 * lane;
    asm("" : "+l"(src));  // one pointer, immediate offsets per block (else one 64-bit IMAD per copy)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) hw::cp_async_4(dst + b * kTileBlockBytes, src + b * kColsPerBlock, valid);
  }
};

// L2 prefetch of the first kLines 128-byte lines of the rows base + key * pitch_bytes whose keys lanes
// 0..15 of the warp hold (invalid keys skipped): one warp instruction per row, lane l fetching line l.
template <int kLines>
__device__ __forceinline__ void prefetch_rows_l2(const void* base, int64_t pitch_bytes, int32_t key, int64_t t_kv,
                                                 int lane) {
#pragma unroll 1
  for (int j = 0; j < 16; ++j) {
    const int32_t k = __shfl_sync(0xffffffffu, key, j);
    if (key_valid(k, t_kv) && lane < kLines)
      hw::prefetch_l2(static_cast<const char*>(base) + k * pitch_bytes + 128 * lane);
  }
}

// Loads Q, dO, lse, Delta, lists the non-empty key blocks of the row (rotated by the sweep phase),
// then gathers the kv rows of each block. Warp w handles tile rows w, w + 4, ..., w + 60.
__device__ void produce(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const int h0 = w.head_group * kHeadsPerCta;
  const int32_t* idx_row = p.indices + w.local_token * p.indices_stride_t;
  const int num_row_blocks = p.K / kBlockKeys;
  const RowSegmentCopier copier(lane);
  const uint32_t q_tile = hw::smem_u32(sm.q), do_tile = hw::smem_u32(sm.dout), kv_tile = hw::smem_u32(sm.kv);

#pragma unroll 1
  for (int h = warp; h < kHeadsPerCta; h += 4) {
    const bool real = h < w.heads;
    const int hh = real ? h0 + h : 0;  // never read a padded head
    const __nv_bfloat16* q_row = p.q + w.token * p.q_stride_t + int64_t(hh) * p.q_stride_h;
    const __nv_bfloat16* do_row = p.dout + (w.token * p.H + hh) * int64_t(kVCols);
    copier.copy_row<kQkBlocks>(q_tile, h, q_row, real);
    copier.copy_row<kVBlocks>(do_tile, h, do_row, real);
  }
  hw::cp_async_arrive(&sm.qdo_full);
  if (tid < kHeadsPerCta) {
    const bool real = tid < w.heads;
    const int64_t at = w.token * p.H + h0 + tid;
    sm.lse2[tid] = real ? p.lse[at] * hw::kLog2e : __int_as_float(0x7f800000);  // +inf: P = 0
    sm.delta[tid] = real ? p.delta[at] : 0.f;
  }

  // Blocks holding at least one valid index (rows are often -1-padded at the end).
  for (int blk = warp; blk < num_row_blocks; blk += 4) {
    const bool v = key_valid(idx_row[blk * kBlockKeys + lane], p.T_kv) ||
                   key_valid(idx_row[blk * kBlockKeys + 32 + lane], p.T_kv);
    const bool any = __any_sync(0xffffffffu, v);
    if (lane == 0) sm.block_list[blk] = any ? 1 : 0;  // flags first, compacted below
  }
  hw::named_bar_sync(kBarProducer, 128);
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
    // Sweep: all CTAs walk their (key-sorted) rows in step, so the kv and dkv rows being touched at
    // any moment lie in a narrow key window that stays in L2. Every CTA counts the blocks it issues;
    // counter / resident CTAs (mod blocks per row) is the average position of the running CTAs, and
    // a new row starts there (0 without sweep), wrapping around.
    int rot = 0;
    if (p.sweep_counter != nullptr && total > 0) {
      const uint32_t issued = *reinterpret_cast<volatile uint32_t*>(p.sweep_counter);
      const int position = static_cast<int>((issued / static_cast<uint32_t>(p.resident_ctas)) % num_row_blocks);
      rot = position * total / num_row_blocks;
    }
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
  hw::named_bar_sync(kBarProducer, 128);
  hw::mbar_arrive(&sm.qdo_full);

  const int num_blocks = sm.num_blocks;
  const bool sweep = p.sweep_counter != nullptr;
  // Index of tile row warp + 4 lane (lanes < 16) of block i of the list.
  auto block_indices = [&](int i) {
    return lane < 16 && i < num_blocks ? idx_row[sm.block_list[i] * kBlockKeys + warp + 4 * lane] : -1;
  };
  int32_t my_idx = block_indices(0);
#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    // The single kv tile is free once both consumer warpgroups finished dQ of block i - 1; that also
    // ends every read of idx[i % 2] by block i - 2.
    if (i > 0) hw::mbar_wait(&sm.kv_empty, (i - 1) & 1);
    if (lane < 16) sm.idx[i & 1][warp + 4 * lane] = my_idx;
#pragma unroll 1
    for (int j = 0; j < 16; ++j) {
      const int32_t key = __shfl_sync(0xffffffffu, my_idx, j);
      const bool valid = key_valid(key, p.T_kv);
      const __nv_bfloat16* src = p.kv + (valid ? int64_t(key) : 0) * p.kv_stride_t;
      copier.copy_row<kQkBlocks>(kv_tile, warp + 4 * j, src, valid);
    }
    hw::cp_async_arrive(&sm.kv_full);
    hw::mbar_arrive(&sm.kv_full);
    const int32_t next_idx = block_indices(i + 1);
    if (sweep) {
      if (tid == 0) hw::red_add_u32(p.sweep_counter, 1u);
      // kv and dkv no longer fit in L2: fetch the dkv rows this block's atomics will update (about
      // half a block from now) and the kv rows of the next block (gathered about a block from now),
      // so that neither waits for DRAM.
      prefetch_rows_l2<kQkCols * 4 / 128>(p.dkv, kQkCols * 4, my_idx, p.T_kv, lane);
      prefetch_rows_l2<kQkCols * 2 / 128>(p.kv, p.kv_stride_t * 2, next_idx, p.T_kv, lane);
    }
    my_idx = next_idx;
  }
}

// ---- consumers: shared pieces -----------------------------------------------------------------

// dkv destinations of one thread for the current key block. Lanes of quads 2k and 2k+1 (lane / 4)
// write together: thread (warp, lane) emits rows A = r0 + 8 half - odd and B = A + 1 for half = 0, 1,
// where r0 = 16 warp + lane / 4 and odd = (lane / 4) % 2.
struct DkvRows {
  float* dst[2][2];    // [half][row A, row B]: start of the dkv (or partial) row + this lane's column
  bool valid[2][2];
};

template <bool kDeterministic>
__device__ __forceinline__ DkvRows dkv_rows(const MainParams& p, const SmemPlan& sm, const Work& w, int stage,
                                            int blk, int warp, int lane) {
  const int odd = (lane >> 2) & 1;
  const int col = 16 * odd + 4 * (lane & 3);
  float* const partial_row0 =
      kDeterministic ? p.partial + (w.local_token * gridDim.y + w.head_group) * p.K * int64_t(kQkCols) : nullptr;
  DkvRows r;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int ab = 0; ab < 2; ++ab) {
      const int row = 16 * warp + (lane >> 2) + 8 * half - odd + ab;
      const int32_t key = sm.idx[stage][row];
      r.valid[half][ab] = key_valid(key, p.T_kv);
      const int64_t at = kDeterministic ? int64_t(blk) * kBlockKeys + row : (r.valid[half][ab] ? key : 0);
      r.dst[half][ab] = (kDeterministic ? partial_row0 : p.dkv) + at * kQkCols + col;
    }
  }
  return r;
}

__device__ __forceinline__ float4 shfl_xor4(float4 v, int mask) {
  return make_float4(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask),
                     __shfl_xor_sync(0xffffffffu, v.z, mask), __shfl_xor_sync(0xffffffffu, v.w, mask));
}

// Fast mode: atomic add into dkv; deterministic mode: plain store into the slot's partial row.
template <bool kDeterministic>
__device__ __forceinline__ void put_dkv(float* dst, float4 v) {
  if constexpr (kDeterministic) hw::st_global_v4(dst, v);
  else hw::red_add_v4(dst, v);
}

// Emits one [64 keys x 64 cols] fp32 dKV chunk (global column block `chunk`) held as a wgmma
// accumulator over permuted column positions. Thread (quad member q) holds, for its rows r0 and
// r0 + 8, the columns 16m + 4q .. +3 in n-groups 2m, 2m+1 (hw::permuted_col). The even quad of a quad
// pair keeps m = 0, 2 of its row and receives m = 0, 2 of the odd quad's row; the odd quad keeps
// m = 1, 3 and receives the even quad's m = 1, 3. Then each 16-byte store of the 8 lanes covers one
// full 128-byte line of one row: 4 lines per warp instruction.
template <bool kDeterministic>
__device__ __forceinline__ void emit_dkv_chunk(const float (&acc)[32], int chunk, const DkvRows& rows, int lane) {
  const bool odd = (lane >> 2) & 1;
  const int c0 = chunk * kColsPerBlock;
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
    float* const dst_a = rows.dst[half][0] + c0;
    float* const dst_b = rows.dst[half][1] + c0;
    if (rows.valid[half][0]) {
      put_dkv<kDeterministic>(dst_a, a0);
      put_dkv<kDeterministic>(dst_a + 32, a1);
    }
    if (rows.valid[half][1]) {
      put_dkv<kDeterministic>(dst_b, b0);
      put_dkv<kDeterministic>(dst_b + 32, b1);
    }
  }
}

// Writes a [64 heads x 64 kBlocks] fp32 dQ accumulator (kv blocks first_block..) as bf16: n-groups
// 2m, 2m+1 of each block hold columns 16m + 4q .. +3 (hw::permuted_col), stored as one 8-byte vector.
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
      for (int m = 0; m < 4; ++m) {
        const float* a = acc + 32 * j + 8 * m + 2 * half;
        const uint2 v = make_uint2(hw::pack_bf16(a[0], a[1]), hw::pack_bf16(a[4], a[5]));
        *reinterpret_cast<uint2*>(dq_head0 + int64_t(row) * kQkCols + (first_block + j) * kColsPerBlock + 16 * m +
                                  4 * q4) = v;
      }
    }
  }
}

// A fragments of the transposed [64 h][64 keys] tile (M = keys, K = heads), 4 k-steps of 16 heads.
__device__ __forceinline__ void load_transposed_frags(const void* tile, uint32_t (&frag)[4][4], int warp, int lane) {
  const int m = lane / 8;  // matrix: heads +8*(m/2), keys +8*(m%2)
  const uint32_t base = hw::smem_u32(tile);
#pragma unroll
  for (int hk = 0; hk < 4; ++hk) {
    const int head = 16 * hk + 8 * (m / 2) + lane % 8;
    hw::ldmatrix_x4_trans(frag[hk], base + hw::sw128_offset(head, 2 * warp + m % 2));
  }
}

// Offsets of the accumulator element pairs (row r0 / r0 + 8, keys 8n + 2q4, +1) in a [64 h][64 keys]
// bf16 SW128 tile.
__device__ __forceinline__ uint32_t tile_pair_offset(int row, int n, int q4) {
  return hw::sw128_offset(row, n) + 4 * q4;
}

// Attention mass of one key block: the column sums of P [64 heads x 64 keys] over the CTA's heads,
// added to mass[token, slot] (zeroed before the launch; two head-group CTAs add at H = 128: the sum
// of two terms onto 0 is order-independent, so the result is still reproducible).
// P is the accumulator s of WG0 (thread: heads r0, r0 + 8; keys 8n + 2 q4 + {0, 1}). In-thread sum
// of the two heads, butterfly reduce-scatter over the 8 lanes of equal q4 (lane L ends with keys 2L,
// 2L + 1), warps 1..3 hand their sums to warp 0 through smem, warp 0 adds them in warp order.
// `slot` = the slots of keys 2L, 2L + 1 (loaded early by the caller).
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
  hw::named_bar_sync(kBarWg0Mass, 128);
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

// ---- WG0: S, P; dQ for kv blocks [0, 5); dKV value chunks [5, 8) and the rope chunk -----------
template <bool kDeterministic>
__device__ void wg0_scores(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;  // accumulator rows (heads) r0 and r0 + 8
  float dq_a[4 * 32], dq_b[32];         // dQ columns of kv blocks 0..3 and 4
#pragma unroll
  for (int i = 0; i < 4 * 32; ++i) dq_a[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) dq_b[i] = 0.f;

  hw::mbar_wait(&sm.qdo_full, 0);
  hw::fence_proxy_async();  // cp.async (generic proxy) data is read by wgmma (async proxy)
  const float lse2_lo = sm.lse2[r0], lse2_hi = sm.lse2[r0 + 8];
  const int num_blocks = sm.num_blocks;
  char* const p_tile = reinterpret_cast<char*>(sm.p);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    const uint32_t ph = i & 1;
    hw::mbar_wait(&sm.kv_full, ph);
    hw::fence_proxy_async();
    // Mass output: slots of keys 2 lane, 2 lane + 1 of this block (warp 0 writes them after S).
    int2 mass_slot = make_int2(0, 0);
    if (p.mass != nullptr && warp == 0) {
      const int pos = sm.block_list[i] * kBlockKeys + 2 * lane;
      if (p.mass_slots == nullptr) {
        mass_slot = make_int2(pos, pos + 1);
      } else {
        const int64_t row0 = w.local_token * int64_t(p.K);
        const int2 pair = *reinterpret_cast<const int2*>(p.mass_slots + row0 + pos);
        mass_slot = make_int2(static_cast<int>(pair.x - row0), static_cast<int>(pair.y - row0));
      }
    }

    float s[32];  // S = Q . KV^T: [64 heads x 64 keys]
    hw::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * kQkBlocks; ++ks)
      hw::wgmma_ss_m64n64k16<0, 0>(s, desc_k_major(sm.q, kHeadsPerCta, ks), desc_k_major(sm.kv, kBlockKeys, ks),
                                   ks > 0);
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(s);

    // P = exp(scale S - lse) on valid keys, 0 elsewhere.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int2 keys = *reinterpret_cast<const int2*>(&sm.idx[st][8 * n + 2 * q4]);
      const bool valid[2] = {key_valid(keys.x, p.T_kv), key_valid(keys.y, p.T_kv)};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[4 * n + e] = valid[e & 1] ? exp2f(fmaf(s[4 * n + e], p.scale_log2, -(e < 2 ? lse2_lo : lse2_hi))) : 0.f;
    }
    if (i > 0) hw::mbar_wait(&sm.tiles_free, (i - 1) & 1);  // WG1 has read P of block i - 1
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<uint32_t*>(p_tile + tile_pair_offset(r0, n, q4)) = hw::pack_bf16(s[4 * n], s[4 * n + 1]);
      *reinterpret_cast<uint32_t*>(p_tile + tile_pair_offset(r0 + 8, n, q4)) =
          hw::pack_bf16(s[4 * n + 2], s[4 * n + 3]);
    }
    hw::fence_proxy_async();  // the P tile is a wgmma operand (dKV below)
    hw::mbar_arrive(&sm.p_full);
    // While WG1 forms dS: the block's attention mass (optional output). mass_part is rewritten by
    // warps 1..3 only after kv_full of block i + 1, i.e. after warp 0's kv_empty arrival below.
    if (p.mass != nullptr) emit_mass(p, sm, w, s, mass_slot, warp, lane);

    // dQ[:, kv blocks 0..4] += dS . KV (A = dS tile, K-major; B = kv, MN-major).
    hw::mbar_wait(&sm.ds_full, ph);
    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t a = desc_k_major(sm.ds, kHeadsPerCta, kk);
      hw::wgmma_ss_m64n256k16<0, 1>(dq_a, a, desc_mn_major(sm.kv, kBlockKeys, kk, 0), true);
      hw::wgmma_ss_m64n64k16<0, 1>(dq_b, a, desc_mn_major(sm.kv, kBlockKeys, kk, 4), true);
    }
    hw::wgmma_commit();
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm, w, st, sm.block_list[i], warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq_a);
    hw::fence_regs(dq_b);
    hw::mbar_arrive(&sm.kv_empty);

    // dKV[:, c] = dS^T . Q[:, c] (+ P^T . dO[:, c] on value chunks); A read transposed from the tiles.
#pragma unroll
    for (int c = kWg1DkvChunks; c < kQkBlocks; ++c) {
      float acc[32];
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
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      emit_dkv_chunk<kDeterministic>(acc, c, rows, lane);
    }
  }

  __nv_bfloat16* const dq_head0 = p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols);
  store_dq<4>(dq_a, dq_head0, w.heads, 0, r0, q4);
  store_dq<1>(dq_b, dq_head0, w.heads, 4, r0, q4);
}

// ---- WG1: dP, dS; dQ for kv blocks [5, 9); dKV value chunks [0, 5) ------------------------------
template <bool kDeterministic>
__device__ void wg1_grads(const MainParams& p, SmemPlan& sm, const Work& w, int tid) {
  const int warp = tid / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = 16 * warp + lane / 4;
  float dq[kWg1DqBlocks * 32];
#pragma unroll
  for (int i = 0; i < kWg1DqBlocks * 32; ++i) dq[i] = 0.f;

  hw::mbar_wait(&sm.qdo_full, 0);
  hw::fence_proxy_async();
  const float delta_lo = sm.delta[r0], delta_hi = sm.delta[r0 + 8];
  const int num_blocks = sm.num_blocks;
  char* const p_tile = reinterpret_cast<char*>(sm.p);
  char* const ds_tile = reinterpret_cast<char*>(sm.ds);

#pragma unroll 1
  for (int i = 0; i < num_blocks; ++i) {
    const int st = i & 1;
    const uint32_t ph = i & 1;
    hw::mbar_wait(&sm.kv_full, ph);
    hw::fence_proxy_async();

    float dp[32];  // dP = dO . V^T: [64 heads x 64 keys]
    hw::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * kVBlocks; ++ks)
      hw::wgmma_ss_m64n64k16<0, 0>(dp, desc_k_major(sm.dout, kHeadsPerCta, ks), desc_k_major(sm.kv, kBlockKeys, ks),
                                   ks > 0);
    hw::wgmma_commit();
    const DkvRows rows = dkv_rows<kDeterministic>(p, sm, w, st, sm.block_list[i], warp, lane);
    hw::wgmma_wait<0>();
    hw::fence_regs(dp);

    // dS = scale P (dP - Delta), in place, with P (bf16) from WG0's tile.
    hw::mbar_wait(&sm.p_full, ph);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 p_lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p_tile + tile_pair_offset(r0, n, q4)));
      const float2 p_hi =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p_tile + tile_pair_offset(r0 + 8, n, q4)));
      dp[4 * n + 0] = p_lo.x * (dp[4 * n + 0] - delta_lo) * p.scale;
      dp[4 * n + 1] = p_lo.y * (dp[4 * n + 1] - delta_lo) * p.scale;
      dp[4 * n + 2] = p_hi.x * (dp[4 * n + 2] - delta_hi) * p.scale;
      dp[4 * n + 3] = p_hi.y * (dp[4 * n + 3] - delta_hi) * p.scale;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<uint32_t*>(ds_tile + tile_pair_offset(r0, n, q4)) = hw::pack_bf16(dp[4 * n], dp[4 * n + 1]);
      *reinterpret_cast<uint32_t*>(ds_tile + tile_pair_offset(r0 + 8, n, q4)) =
          hw::pack_bf16(dp[4 * n + 2], dp[4 * n + 3]);
    }
    hw::fence_proxy_async();  // the dS tile is a wgmma operand of WG0
    hw::mbar_arrive(&sm.ds_full);

    // dQ[:, kv blocks 5..8] += dS . KV: A straight from the dS accumulator (converted before the
    // fence: wgmma.fence must separate register writes from the wgmma reading them).
    uint32_t a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) hw::acc_to_a_frag(dp, kk, a[kk]);
    hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      hw::wgmma_rs_m64n256k16<1>(dq, a[kk], desc_mn_major(sm.kv, kBlockKeys, kk, kWg0DqBlocks), true);
    hw::wgmma_commit();
    uint32_t ds_t[4][4], p_t[4][4];  // dS^T, P^T: M = keys, K = heads
    // Each warp reads dS^T rows (keys 16w..16w+15) of all 64 heads, i.e. values the other three
    // warps of this warpgroup stored above: wait for all of them (P is ordered by p_full).
    hw::named_bar_sync(kBarWg1Tiles, 128);
    load_transposed_frags(sm.ds, ds_t, warp, lane);
    load_transposed_frags(sm.p, p_t, warp, lane);
    hw::mbar_arrive(&sm.tiles_free);
    hw::wgmma_wait<0>();
    hw::fence_regs(dq);
    hw::mbar_arrive(&sm.kv_empty);

    // dKV[:, c] = dS^T . Q[:, c] + P^T . dO[:, c] for value chunks 0..4.
#pragma unroll
    for (int c = 0; c < kWg1DkvChunks; ++c) {
      float acc[32];
      hw::wgmma_fence();
#pragma unroll
      for (int hk = 0; hk < 4; ++hk)
        hw::wgmma_rs_m64n64k16<1>(acc, ds_t[hk], desc_mn_major(sm.q, kHeadsPerCta, hk, c), hk > 0);
#pragma unroll
      for (int hk = 0; hk < 4; ++hk)
        hw::wgmma_rs_m64n64k16<1>(acc, p_t[hk], desc_mn_major(sm.dout, kHeadsPerCta, hk, c), true);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      emit_dkv_chunk<kDeterministic>(acc, c, rows, lane);
    }
  }

  store_dq<kWg1DqBlocks>(dq, p.dq + (w.token * p.H + w.head_group * kHeadsPerCta) * int64_t(kQkCols), w.heads,
                         kWg0DqBlocks, r0, q4);
}

}  // namespace detail

// grid = (tokens of this launch, ceil(H / 64)), kThreads, kSmemBytes dynamic.
template <bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_bwd_main_kernel(const __grid_constant__ MainParams p) {
  extern __shared__ uint8_t smem_raw[];
  SmemPlan& sm = *reinterpret_cast<SmemPlan*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  detail::Work w;
  w.local_token = blockIdx.x;
  w.token = p.token_begin + w.local_token;
  w.head_group = blockIdx.y;
  w.heads = min(p.H - w.head_group * kHeadsPerCta, kHeadsPerCta);

  if (threadIdx.x == 0) {
    hw::mbar_init(&sm.qdo_full, 256);  // 128 cp.async arrivals + 128 producer arrivals
    hw::mbar_init(&sm.kv_full, 256);
    hw::mbar_init(&sm.kv_empty, 256);  // every consumer thread
    hw::mbar_init(&sm.p_full, 128);
    hw::mbar_init(&sm.ds_full, 128);
    hw::mbar_init(&sm.tiles_free, 128);
    hw::mbar_fence_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 2) {
    hw::reg_dealloc<kProducerRegs>();
    detail::produce(p, sm, w, tid);
  } else {
    hw::reg_alloc<kConsumerRegs>();
    if (wg == 0) detail::wg0_scores<kDeterministic>(p, sm, w, tid);
    else detail::wg1_grads<kDeterministic>(p, sm, w, tid);
  }
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
