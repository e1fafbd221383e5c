// Internal: host entry points of the FP8 (e4m3) selection pass of the Hopper indexer + top-k and of
// the e4m3 quantization (docs/spec.md §3 "FP8 selection"; design: docs/kernels/indexer_topk.md).
// The sm90 backend table (csrc/sm90/backend.cpp) sends indexer_topk calls with indexer.dtype ==
// kFP8E4M3 here.
#pragma once

#include <cstddef>

#include "flashdsa/ops.h"

namespace flashdsa::sm90::indexer_topk_fp8_impl {

// The candidate count of a call: p.candidates, or fp8_selection_candidates(p.K).
int candidates(const IndexerTopkParams& p);
// The candidate list length per row in flight for C candidates: max(4096, C + 1024) (a multiple of
// 64, >= C + 128; 4096 keeps the register-resident select for C <= 3072).
int candidate_capacity(int C);

// The sm90 limits of the FP8 selection: indexer kFP8E4M3 with H_I in {32, 64}, D_I in {64, 128},
// e4m3 rows 16-byte aligned (strides multiples of 16), rescore bf16 with 16-byte aligned rows, K and
// the candidate count multiples of 64, candidates <= 16384.
Status supports(const IndexerTopkParams& p, const char* op);
size_t workspace_size(const IndexerTopkParams& p);
// Runs a call that passed validate() on p.stream.
Status run(const IndexerTopkParams& p);

// Quantization on CUDA: bf16 input only.
Status supports_quantize(const QuantizeFp8Params& p, const char* op);
Status run_quantize(const QuantizeFp8Params& p);

}  // namespace flashdsa::sm90::indexer_topk_fp8_impl
