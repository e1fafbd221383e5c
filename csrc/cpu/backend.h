// Internal: the CPU backend (exact, any size the limits below allow, bf16 / fp32 / fp64). Its
// table is what select_backend() returns for Device::kCPU; the run functions below are its entries.
#pragma once

#include "common/backend.h"
#include "flashdsa/ops.h"

namespace flashdsa::cpu {

// The CPU backend's table (csrc/cpu/backend.cpp).
const detail::Backend& backend();

// Entries: each runs a call that passed validate().
Status indexer_topk(const IndexerTopkParams& p);
Status sparse_mla_fwd(const SparseMlaFwdParams& p);
Status sparse_mla_bwd(const SparseMlaBwdParams& p);
Status attention_mass(const AttnMassParams& p);
Status sparse_kl_fwd(const SparseKlParams& p);
Status sparse_kl_bwd(const SparseKlParams& p);
Status dense_kl_fwd(const DenseKlParams& p);
Status dense_kl_bwd(const DenseKlParams& p);

}  // namespace flashdsa::cpu
