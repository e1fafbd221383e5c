// Internal: the CPU reference backend. Called by csrc/common/api.cpp after validation.
#pragma once

#include "flashdsa/ops.h"

namespace flashdsa::cpu {

Status indexer_topk(const IndexerTopkParams& p);
Status sparse_mla_fwd(const SparseMlaFwdParams& p);
Status sparse_mla_bwd(const SparseMlaBwdParams& p);
Status attention_mass(const AttnMassParams& p);
Status sparse_kl_fwd(const SparseKlParams& p);
Status sparse_kl_bwd(const SparseKlParams& p);
Status dense_kl_fwd(const DenseKlParams& p);
Status dense_kl_bwd(const DenseKlParams& p);

}  // namespace flashdsa::cpu
