// Placeholder until the sparse MLA backward kernel lands.
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {
Status sparse_mla_bwd(const SparseMlaBwdParams&) { return Status::NotSupported("sm90 sparse_mla_bwd: kernel not implemented yet"); }
size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams&) { return 0; }
}  // namespace flashdsa::sm90
