// Placeholder until the indexer-loss kernels (attention mass, sparse and dense KL) land.
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {
Status attention_mass(const AttnMassParams&) { return Status::NotSupported("sm90 attention_mass: kernel not implemented yet"); }
Status sparse_kl_fwd(const SparseKlParams&) { return Status::NotSupported("sm90 sparse_kl_fwd: kernel not implemented yet"); }
Status sparse_kl_bwd(const SparseKlParams&) { return Status::NotSupported("sm90 sparse_kl_bwd: kernel not implemented yet"); }
Status dense_kl_fwd(const DenseKlParams&) { return Status::NotSupported("sm90 dense_kl_fwd: kernel not implemented yet"); }
Status dense_kl_bwd(const DenseKlParams&) { return Status::NotSupported("sm90 dense_kl_bwd: kernel not implemented yet"); }
}  // namespace flashdsa::sm90
