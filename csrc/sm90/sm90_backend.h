// Internal: the Hopper (sm_90a) backend. Called by csrc/common/api.cpp after validation, only in
// builds with FLASHDSA_WITH_CUDA. Each op lives in csrc/sm90/<op>/; an op whose kernel has not
// landed yet returns kNotSupported and reports implements(op) == false.
#pragma once

#include "flashdsa/ops.h"

namespace flashdsa::sm90 {

bool implements(OpKind op);

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
