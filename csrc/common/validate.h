// Internal: the generic host checks of csrc/common/validate.cpp (every backend, every device).
// The public validate() of include/flashdsa/ops.h runs these plus the backend's supports().
#pragma once

#include <cstddef>

#include "flashdsa/ops.h"

namespace flashdsa::detail {

Status check_generic(const IndexerTopkParams& p);
Status check_generic(const SparseMlaFwdParams& p);
Status check_generic(const SparseMlaBwdParams& p);
Status check_generic(const AttnMassParams& p);
Status check_generic_fwd(const SparseKlParams& p);
Status check_generic_bwd(const SparseKlParams& p);
Status check_generic_fwd(const DenseKlParams& p);
Status check_generic_bwd(const DenseKlParams& p);
Status check_generic(const QuantizeFp8Params& p);

// kInvalidArgument unless `workspace` is non-null and holds `needed` bytes (nothing needed: OK).
Status check_workspace(const char* op, size_t needed, const void* workspace, size_t bytes);

}  // namespace flashdsa::detail
