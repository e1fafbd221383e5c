// Internal: the wgmma descriptors of the sparse MLA backward main kernel as "one base register + a
// compile-time immediate" (the FLASHDSA_BWD_DESC_IMM=1 variant; docs/kernels/sparse_mla_bwd.md,
// "Descriptor diet"). Plain C++ (no CUDA header), so that tests/cpp/test_bwd_desc_imm.cpp can check
// every descriptor the kernel forms against the descriptor formula of hw::make_desc_sw128 /
// desc_k_major / desc_mn_major (csrc/sm90/common/hopper.cuh) on the host.
//
// Descriptor (64 bits, SW128, base offset 0): low word = (start address >> 4) in bits [0, 14) |
// (leading byte offset >> 4) << 16; high word = (stride byte offset >> 4) | 1 << 30 (128-byte swizzle).
// Every operand of the kernel has stride byte offset 1024 (one swizzle atom), so the high word is one
// constant. The low word of a tile's descriptor at any k-step or column chunk is
//   (plan address >> 4) + [(tile offset in the plan + step offset) >> 4  +  (LBO >> 4) << 16],
// where the bracket is a compile-time constant: every offset is a multiple of 16, so the shift
// distributes over the sum; and every start address is below the 228 KB shared window (< 2^18 bytes),
// so the 14-bit address field never carries into the LBO field (and the 0x3FFFF mask of
// make_desc_sw128 removes nothing).
#pragma once

#include <cstdint>

namespace flashdsa::sm90::sparse_mla_bwd_impl::desc_imm {

// The operand tiles of SmemPlan (config.h, which static_asserts these offsets against offsetof):
// [64 rows x 64 columns] bf16 SW128 blocks of 8 KB, one after another.
constexpr uint32_t kRows = 64;                     // every operand tile has 64 rows (heads or keys)
constexpr uint32_t kRowBytes = 128;                // SW128: one 128-byte row of 64 bf16
constexpr uint32_t kBlockBytes = kRows * kRowBytes;  // one 64-column block of a tile: 8192
constexpr uint32_t kAtomBytes = 1024;              // 8 rows: the stride byte offset of every operand
constexpr uint32_t kOffQ = 0;                      // Q    [64 heads][9 blocks]
constexpr uint32_t kOffDout = kOffQ + 9 * kBlockBytes;    // dO   [64 heads][8 blocks]
constexpr uint32_t kOffKv = kOffDout + 8 * kBlockBytes;   // kv   [64 keys][9 blocks]
constexpr uint32_t kOffP = kOffKv + 9 * kBlockBytes;      // P    [64 heads][64 keys]
constexpr uint32_t kOffDs = kOffP + kBlockBytes;          // dS   [64 heads][64 keys]
constexpr uint32_t kTilesEnd = kOffDs + kBlockBytes;      // first byte after the operand tiles

// The CTA's shared-memory addresses lie in [0, 228 KB) on sm_90 (227 KB usable per block plus the
// 1 KB the system reserves); the descriptor's address field holds address >> 4 in 14 bits.
constexpr uint32_t kSharedWindowBytes = 228 * 1024;
static_assert(kSharedWindowBytes <= (1u << 18), "start address >> 4 must fit the 14-bit field: no carry");
static_assert(kTilesEnd + 1024 <= kSharedWindowBytes, "the tiles (plus the alignment slack) fit the window");

// The high word of every descriptor of the kernel: SBO = 1024 (>> 4 = 64), 128-byte swizzle.
constexpr uint32_t kHi = (kAtomBytes >> 4) | (1u << 30);

// The descriptor's low word without the start address: the LBO field, plus `bytes` >> 4 in the
// address field (bytes: the operand's offset from the plan or the tile, a multiple of 16).
constexpr uint32_t lo_imm(uint32_t bytes, uint32_t lbo_bytes) { return (bytes >> 4) + ((lbo_bytes >> 4) << 16); }

// K-major operand (hw::desc_k_major): k-step ks of a [rows x 64 nb] tile lies in block ks / 4 at byte
// 32 (ks % 4) of each row; LBO 16.
constexpr uint32_t k_major_offset(int rows, int ks) {
  return static_cast<uint32_t>((ks >> 2) * rows * kRowBytes + (ks & 3) * 32);
}
constexpr uint32_t k_major_lbo(int) { return 16; }

// MN-major operand (hw::desc_mn_major): k-step ks covers rows [16 ks, 16 ks + 16) of the 64-column blocks
// from n_block0 on; LBO = the distance between 64-column blocks.
constexpr uint32_t mn_major_offset(int rows, int ks, int n_block0) {
  return static_cast<uint32_t>(n_block0 * rows * kRowBytes + ks * 16 * kRowBytes);
}
constexpr uint32_t mn_major_lbo(int rows) { return static_cast<uint32_t>(rows) * kRowBytes; }

// The immediates of the two layouts, relative to the tile's own base.
constexpr uint32_t k_major_imm(int rows, int ks) { return lo_imm(k_major_offset(rows, ks), k_major_lbo(rows)); }
constexpr uint32_t mn_major_imm(int rows, int ks, int n_block0) {
  return lo_imm(mn_major_offset(rows, ks, n_block0), mn_major_lbo(rows));
}

// The variant's descriptor with address field base + imm (base: plan address >> 4): the value that
// kernel_common.cuh's TileDesc forms with one add per descriptor (64-bit, or 32-bit on the low word).
constexpr uint64_t desc(uint32_t base, uint32_t imm) { return (static_cast<uint64_t>(kHi) << 32) | (base + imm); }

// make_desc_sw128 (hopper.cuh) on an integer shared address: the formula the variant must reproduce.
constexpr uint64_t sw128_desc_bits(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16 |
         static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32 | static_cast<uint64_t>(1) << 62;
}

// ---- the descriptors the kernel forms (main_kernel.cuh / kernel_common.cuh) ----------------------
// Each (operand tile, layout, k-step, column block) the kernel uses, as a flat list so that the
// host test and the static_assert below walk the same table.
struct Use {
  uint32_t tile_off;
  bool mn_major;
  int ks;        // k-step (16 columns of a K-major operand, 16 rows of an MN-major one)
  int n_block0;  // MN-major: first 64-column block
};

// Calls f(Use) for every descriptor of the kernel:
//   S  = Q . KV^T:    Q, kv K-major, ks < 36;        dP = dO . V^T: dO, kv K-major, ks < 32;
//   front dQ (RS):    kv MN-major, ks < 4, blocks 0 and 4;
//   back dQ:          dS K-major, ks < 4; kv MN-major, ks < 4, block 5;
//   dKV chunk c < 9:  dS MN-major, ks < 4, block 0; Q MN-major, ks < 4, block c;
//                     (c < 8) P MN-major, ks < 4, block 0; dO MN-major, ks < 4, block c.
template <class F>
constexpr void for_each_use(F f) {
  for (int ks = 0; ks < 36; ++ks) {
    f(Use{kOffQ, false, ks, 0});
    f(Use{kOffKv, false, ks, 0});
  }
  for (int ks = 0; ks < 32; ++ks) f(Use{kOffDout, false, ks, 0});
  for (int ks = 0; ks < 4; ++ks) {
    f(Use{kOffKv, true, ks, 0});
    f(Use{kOffKv, true, ks, 4});
    f(Use{kOffDs, false, ks, 0});
    f(Use{kOffKv, true, ks, 5});
    f(Use{kOffDs, true, ks, 0});
    f(Use{kOffP, true, ks, 0});
    for (int c = 0; c < 9; ++c) {
      f(Use{kOffQ, true, ks, c});
      if (c < 8) f(Use{kOffDout, true, ks, c});
    }
  }
}

// The byte offset from the plan at which one use's operand starts, its LBO, and the variant's
// immediate relative to the plan base.
constexpr uint32_t start_offset(const Use& u) {
  return u.tile_off + (u.mn_major ? mn_major_offset(kRows, u.ks, u.n_block0) : k_major_offset(kRows, u.ks));
}
constexpr uint32_t lbo_of(const Use& u) { return u.mn_major ? mn_major_lbo(kRows) : k_major_lbo(kRows); }
constexpr uint32_t imm_of(const Use& u) {
  return (u.tile_off >> 4) + (u.mn_major ? mn_major_imm(kRows, u.ks, u.n_block0) : k_major_imm(kRows, u.ks));
}

// The highest byte offset (from the plan) at which any of the kernel's descriptors starts.
constexpr uint32_t max_start_offset() {
  uint32_t m = 0;
  for_each_use([&m](const Use& u) { m = start_offset(u) > m ? start_offset(u) : m; });
  return m;
}
static_assert(max_start_offset() < kTilesEnd, "every descriptor starts inside the operand tiles");

// Every use, at a plan placed at `plan` (1024-aligned, the plan inside the window): the variant's
// descriptor equals the original's bit for bit.
constexpr bool uses_agree_at(uint32_t plan) {
  bool ok = true;
  for_each_use([&](const Use& u) {
    ok = ok && desc(plan >> 4, imm_of(u)) == sw128_desc_bits(plan + start_offset(u), lbo_of(u), kAtomBytes);
  });
  return ok;
}
// The lowest and the highest 1024-aligned plan whose tiles fit the window, and one in between
// (tests/cpp/test_bwd_desc_imm.cpp walks every aligned placement, against its own reference formula).
static_assert(uses_agree_at(0) && uses_agree_at(2048) &&
                  uses_agree_at((kSharedWindowBytes - kTilesEnd) & ~(kAtomBytes - 1)),
              "base + immediate descriptors equal make_desc_sw128's");

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl::desc_imm
