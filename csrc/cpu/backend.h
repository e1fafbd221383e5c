// Internal: the CPU backend (exact, any size the limits below allow, bf16 / fp32 / fp64). Its
// table is what select_backend() returns for Device::kCPU; the run functions below are its entries.
#pragma once

#include "common/backend.h"
#include "flashdsa/ops.h"

namespace flashdsa::cpu {

// The FP8 indexer (csrc/cpu/indexer_fp8.cpp): quantization, and indexer_topk's FP8 selection pass
// (indexer_topk() runs it for indexer.dtype == kFP8E4M3).
Status quantize_fp8(const QuantizeFp8Params& p);
Status indexer_topk_fp8(const IndexerTopkParams& p);

// The CPU backend's table (csrc/cpu/backend.cpp) and its run entries: each runs a call that passed
// validate().
FLASHDSA_DECLARE_BACKEND_OPS();

}  // namespace flashdsa::cpu
