// Internal: the Hopper backend (compute capability 9.0, sm_90a), built when FLASHDSA_WITH_CUDA is
// set. select_backend() returns its table for a CUDA device of compute capability 9.0. Each op lives
// in csrc/sm90/<op>/; its limits (production shapes, bf16, 16-byte aligned rows) are its supports()
// entry in csrc/sm90/backend.cpp, checked once by the entry points before run.
#pragma once

#include <cstddef>

#include "common/backend.h"
#include "flashdsa/ops.h"

namespace flashdsa::sm90 {

// The sm90 backend's table (csrc/sm90/backend.cpp) and its run entries: each runs a call that passed
// validate() (generic checks and the table's supports()); and the workspace of the two ops that
// need one.
FLASHDSA_DECLARE_BACKEND_OPS();
size_t indexer_topk_workspace_size(const IndexerTopkParams& p);
size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p);

}  // namespace flashdsa::sm90
