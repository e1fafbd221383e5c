// Internal: the Hopper backend (compute capability 9.0, sm_90a), built when FLASHDSA_WITH_CUDA is
// set. select_backend() returns its table for a CUDA device of compute capability 9.0. Each op lives
// in csrc/sm90/<op>/; its limits (production shapes, bf16, 16-byte aligned rows) are its supports()
// entry in csrc/sm90/backend.cpp, checked once by the entry points before run.
#pragma once

#include <cstddef>

#include "common/backend.h"
#include "flashdsa/ops.h"

namespace flashdsa::sm90 {

// The sm90 backend's table (csrc/sm90/backend.cpp).
const detail::Backend& backend();

// Entries: each runs a call that passed validate() (generic checks and the table's supports()).
Status indexer_topk(const IndexerTopkParams& p);
size_t indexer_topk_workspace_size(const IndexerTopkParams& p);
Status sparse_mla_fwd(const SparseMlaFwdParams& p);
Status sparse_mla_bwd(const SparseMlaBwdParams& p);
size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p);
Status attention_mass(const AttnMassParams& p);
Status sparse_kl_fwd(const SparseKlParams& p);
Status sparse_kl_bwd(const SparseKlParams& p);
Status dense_kl_fwd(const DenseKlParams& p);
Status dense_kl_bwd(const DenseKlParams& p);

}  // namespace flashdsa::sm90
