// Placeholder until the sparse MLA forward kernel lands.
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {
Status sparse_mla_fwd(const SparseMlaFwdParams&) { return Status::NotSupported("sm90 sparse_mla_fwd: kernel not implemented yet"); }
}  // namespace flashdsa::sm90
