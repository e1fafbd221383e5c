// Internal: the CPU backend (exact, any size the limits below allow, bf16 / fp32 / fp64). Its
// table is what select_backend() returns for Device::kCPU; the run functions below are its entries.
#pragma once

#include "common/backend.h"
#include "flashdsa/ops.h"

namespace flashdsa::cpu {

// The CPU backend's table (csrc/cpu/backend.cpp).
const detail::Backend& backend();

// Its run entries: each runs a call that passed validate().
FLASHDSA_DECLARE_BACKEND_OPS();

}  // namespace flashdsa::cpu
