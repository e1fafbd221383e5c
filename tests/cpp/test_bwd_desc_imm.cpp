// The sparse MLA backward's FLASHDSA_BWD_DESC_IMM=1 variant (csrc/sm90/sparse_mla_bwd/desc_imm.h,
// kernel_common.cuh TileDesc) forms every wgmma descriptor as "plan base + compile-time immediate".
// These tests check, on the host, that each descriptor the kernel forms equals the default kernel's
// (hw::make_desc_sw128 of the address hw::desc_k_major / desc_mn_major compute) bit for bit, for every
// 1024-byte aligned placement of the shared-memory plan in the sm_90 shared window. The reference
// below is written from the PTX ISA's matrix-descriptor layout, independently of desc_imm.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "sm90/sparse_mla_bwd/desc_imm.h"

namespace {

namespace di = flashdsa::sm90::sparse_mla_bwd_impl::desc_imm;

// PTX ISA wgmma matrix descriptor: bits 0-13 start address (addr & 0x3FFFF) >> 4, 16-29 leading byte
// offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset (0), 62-63 swizzle mode (1: 128 B).
uint64_t ref_descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) & 0x3FFFu;
  d |= (static_cast<uint64_t>(lbo >> 4) & 0x3FFFu) << 16;
  d |= (static_cast<uint64_t>(sbo >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// The default kernel's descriptors (hopper.cuh): K-major k-step ks of a [rows x 64 nb] SW128 tile at
// `tile`: tile + (ks / 4) rows 128 + (ks % 4) 32, LBO 16, SBO 1024; MN-major k-step ks from block nb0:
// tile + nb0 rows 128 + ks 16 128, LBO rows 128, SBO 1024.
uint64_t ref_k_major(uint32_t tile, int rows, int ks) {
  return ref_descriptor(tile + (ks >> 2) * rows * 128 + (ks & 3) * 32, 16, 1024);
}
uint64_t ref_mn_major(uint32_t tile, int rows, int ks, int nb0) {
  return ref_descriptor(tile + nb0 * rows * 128 + ks * 16 * 128, rows * 128, 1024);
}
uint64_t ref_of(uint32_t plan, const di::Use& u) {
  return u.mn_major ? ref_mn_major(plan + u.tile_off, 64, u.ks, u.n_block0) : ref_k_major(plan + u.tile_off, 64, u.ks);
}

// The kernel's two spellings (kernel_common.cuh): TileDesc = (kHi << 32 | plan >> 4) + tile offset >> 4,
// then a 64-bit add of the immediate (desc_k_major / desc_mn_major), or a 32-bit add to the low word
// re-paired with kHi (desc_dkv_a).
uint64_t tile_desc(uint32_t plan, uint32_t tile_off) {
  return ((static_cast<uint64_t>(di::kHi) << 32) | (plan >> 4)) + (tile_off >> 4);
}
uint32_t rel_imm(const di::Use& u) {
  return u.mn_major ? di::mn_major_imm(64, u.ks, u.n_block0) : di::k_major_imm(64, u.ks);
}
uint64_t kernel_desc64(uint32_t plan, const di::Use& u) { return tile_desc(plan, u.tile_off) + rel_imm(u); }
uint64_t kernel_desc_lo32(uint32_t plan, const di::Use& u) {
  const uint32_t lo = static_cast<uint32_t>(tile_desc(plan, u.tile_off)) + rel_imm(u);
  return (static_cast<uint64_t>(di::kHi) << 32) | lo;
}

// Every 1024-aligned plan whose operand tiles lie in the window (a superset of the real placements: the
// plan also holds the index, lse and barrier fields behind the tiles).
template <class F>
void for_each_plan(F f) {
  for (uint32_t plan = 0; plan + di::kTilesEnd <= di::kSharedWindowBytes; plan += 1024) f(plan);
}

TEST(BwdDescImm, EveryDescriptorEqualsTheDefaultAtEveryPlacement) {
  int plans = 0;
  long checked = 0;
  for_each_plan([&](uint32_t plan) {
    ++plans;
    di::for_each_use([&](const di::Use& u) {
      const uint64_t want = ref_of(plan, u);
      ASSERT_EQ(di::desc(plan >> 4, di::imm_of(u)), want)
          << "plan " << plan << " tile " << u.tile_off << " mn " << u.mn_major << " ks " << u.ks << " nb " << u.n_block0;
      ASSERT_EQ(kernel_desc64(plan, u), want) << "64-bit form, plan " << plan << " tile " << u.tile_off;
      ASSERT_EQ(kernel_desc_lo32(plan, u), want) << "low-word form, plan " << plan << " tile " << u.tile_off;
      ++checked;
    });
  });
  EXPECT_EQ(plans, 5);  // 228 KB window, 224 KB of tiles: plan at 0, 1, .., 4 KB
  EXPECT_EQ(checked, plans * 196L);
}

TEST(BwdDescImm, TheUseTableCoversTheKernelsGemms) {
  // S 36 k-steps (Q, kv), dP 32 (dO, kv: the same kv descriptors as S's first 32), front dQ 4 x 2 kv
  // (RS), back dQ 4 x (dS, kv), dKV 9 chunks x 4 x (dS, Q) + 8 x 4 x (P, dO).
  int uses = 0;
  std::set<uint32_t> distinct;
  di::for_each_use([&](const di::Use& u) {
    ++uses;
    distinct.insert(di::imm_of(u));
    EXPECT_EQ(di::imm_of(u) >> 16, u.mn_major ? 512u : 1u) << "LBO field: 16 B (K-major) or 8 KB (MN-major)";
    EXPECT_LT(di::start_offset(u), di::kTilesEnd);
    EXPECT_EQ(di::start_offset(u) % 16, 0u);
  });
  EXPECT_EQ(uses, 36 * 2 + 32 + 4 * 6 + 4 * (9 + 8));
  EXPECT_EQ(distinct.size(), static_cast<size_t>(uses));  // every (tile, layout, step, block) once
}

TEST(BwdDescImm, HighWordAndNoCarry) {
  EXPECT_EQ(di::kHi, 0x40000040u);  // SBO 1024 >> 4 = 64, swizzle 128 B (bit 62 of the descriptor)
  EXPECT_EQ(static_cast<uint32_t>(ref_k_major(0, 64, 0) >> 32), di::kHi);
  EXPECT_EQ(static_cast<uint32_t>(ref_mn_major(0, 64, 0, 0) >> 32), di::kHi);
  // The largest address field the kernel can form stays below 2^14 (no carry into the LBO field).
  uint32_t max_field = 0;
  for_each_plan([&](uint32_t plan) {
    di::for_each_use([&](const di::Use& u) {
      const uint32_t field = (plan >> 4) + (di::start_offset(u) >> 4);
      max_field = field > max_field ? field : max_field;
    });
  });
  EXPECT_LT(max_field, 1u << 14);
}

TEST(BwdDescImm, TheCheckBitesOutsideTheWindow) {
  // Negative control: past 2^18 bytes the default masks the address while the variant's sum carries
  // into the LBO field, and the comparison above would catch it.
  const di::Use last{di::kOffDs, true, 3, 0};
  const uint32_t high_plan = (1u << 18) - 1024;
  EXPECT_NE(di::desc(high_plan >> 4, di::imm_of(last)), ref_of(high_plan, last));
  EXPECT_NE(kernel_desc64(high_plan, last), ref_of(high_plan, last));
}

}  // namespace
