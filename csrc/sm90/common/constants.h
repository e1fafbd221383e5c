// Internal: constants of the sm90 backend shared by every kernel and by the host launch code
// (plain C++: no CUDA header needed).
#pragma once

#include "flashdsa/ops.h"

namespace flashdsa::sm90::hw {

constexpr int kWarpSize = 32;
constexpr int kWarpgroup = 128;                // threads of a warpgroup (the unit of a wgmma)
constexpr int kSmemLimit = 227 * 1024;         // opt-in dynamic shared memory per block on sm_90
constexpr int kSmemAlign = 1024;               // SW128 tiles need 1024-byte alignment
constexpr int kSw128RowBytes = 128;           // SW128 tile: one 128-byte row (64 bf16) per row
constexpr int kSw128AtomBytes = 1024;         // 8 rows: the swizzle atom
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * kLog2e)

// Key blocks: the top-k slots [64 b, 64 b + 64) of a row form block b; the kernels skip blocks with
// no valid index. K is a multiple of the block size (the sm90 limit), so a row has K / 64 blocks.
constexpr int kBlockKeys = 64;
constexpr int kMaxBlocks = kMaxTopK / kBlockKeys;  // 128: a block id fits a uint8_t
static_assert(kBlockKeys == kTopKMultiple, "the sm90 K limit (multiple of 64) is the key block size");
static_assert(kMaxBlocks <= 256, "block ids are stored as uint8_t");

}  // namespace flashdsa::sm90::hw
