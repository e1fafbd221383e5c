// The entry points of include/flashdsa/ops.h: find the call's backend, check the call (the
// backend's supports(), then the generic checks of validate.cpp, then the workspace), run it.
#include <exception>
#include <new>
#include <string>

#include "common/backend.h"
#include "common/status_macros.h"
#include "common/validate.h"
#include "flashdsa/ops.h"

namespace flashdsa {
namespace {

using detail::Backend;
using detail::OpEntry;

// One op as the entry points see it: its name, its entry in a backend table, its generic checks.
template <class P>
struct Op {
  const char* name;
  OpEntry<P> Backend::*entry;
  Status (*generic)(const P&);
};

const Op<IndexerTopkParams> kIndexerTopk{"indexer_topk", &Backend::indexer_topk, &detail::check_generic};
const Op<SparseMlaFwdParams> kSparseMlaFwd{"sparse_mla_fwd", &Backend::sparse_mla_fwd, &detail::check_generic};
const Op<SparseMlaBwdParams> kSparseMlaBwd{"sparse_mla_bwd", &Backend::sparse_mla_bwd, &detail::check_generic};
const Op<AttnMassParams> kAttentionMass{"attention_mass", &Backend::attention_mass, &detail::check_generic};
const Op<SparseKlParams> kSparseKlFwd{"sparse_kl_fwd", &Backend::sparse_kl_fwd, &detail::check_generic_fwd};
const Op<SparseKlParams> kSparseKlBwd{"sparse_kl_bwd", &Backend::sparse_kl_bwd, &detail::check_generic_bwd};
const Op<DenseKlParams> kDenseKlFwd{"dense_kl_fwd", &Backend::dense_kl_fwd, &detail::check_generic_fwd};
const Op<DenseKlParams> kDenseKlBwd{"dense_kl_bwd", &Backend::dense_kl_bwd, &detail::check_generic_bwd};
const Op<QuantizeFp8Params> kQuantizeFp8{"quantize_fp8", &Backend::quantize_fp8, &detail::check_generic};

// The backend entry of a call, or why there is none.
template <class P>
Status find_entry(const Op<P>& op, const P& p, const OpEntry<P>** entry) {
  const Backend* backend = nullptr;
  FLASHDSA_RETURN_IF_ERROR(detail::select_backend(op.name, p, &backend));
  const OpEntry<P>& e = backend->*op.entry;
  if (e.run == nullptr) {
    return Status::NotSupported(std::string(op.name) + ": the " + backend->name + " backend does not implement it");
  }
  *entry = &e;
  return Status::OK();
}

// Everything but the workspace: the backend's limits first (cheap, and they decide which sizes
// the generic checks see), then the generic checks (key ranges last: they may read the device).
template <class P>
Status check_call(const Op<P>& op, const P& p, const OpEntry<P>** entry) {
  FLASHDSA_RETURN_IF_ERROR(find_entry(op, p, entry));
  if ((*entry)->supports != nullptr) FLASHDSA_RETURN_IF_ERROR((*entry)->supports(p, op.name));
  return op.generic(p);
}

template <class P>
Status validate_call(const Op<P>& op, const P& p) {
  const OpEntry<P>* entry = nullptr;
  return check_call(op, p, &entry);
}

template <class P>
size_t workspace_of(const Op<P>& op, const P& p) {
  const OpEntry<P>* entry = nullptr;
  if (!find_entry(op, p, &entry).ok() || entry->workspace_size == nullptr) return 0;
  return entry->workspace_size(p);
}

// The workspace fields exist on the params of the ops that may need one.
template <class P>
Status check_workspace_of(const Op<P>&, const P&, size_t) {
  return Status::OK();
}
Status check_workspace_of(const Op<IndexerTopkParams>& op, const IndexerTopkParams& p, size_t needed) {
  return detail::check_workspace(op.name, needed, p.workspace, p.workspace_bytes);
}
Status check_workspace_of(const Op<SparseMlaBwdParams>& op, const SparseMlaBwdParams& p, size_t needed) {
  return detail::check_workspace(op.name, needed, p.workspace, p.workspace_bytes);
}

// Checks p, then runs it on its backend. Backends report failures such as running out of host
// memory by exceptions, which stop here: the public API never throws.
template <class P>
Status run_op(const Op<P>& op, const P& p) {
  try {
    const OpEntry<P>* entry = nullptr;
    FLASHDSA_RETURN_IF_ERROR(check_call(op, p, &entry));
    if (entry->workspace_size != nullptr) {
      FLASHDSA_RETURN_IF_ERROR(check_workspace_of(op, p, entry->workspace_size(p)));
    }
    return entry->run(p);
  } catch (const std::bad_alloc&) {
    return Status::Internal(std::string(op.name) + ": out of host memory");
  } catch (const std::exception& e) {
    return Status::Internal(std::string(op.name) + ": " + e.what());
  }
}

}  // namespace

Status validate(const IndexerTopkParams& p) { return validate_call(kIndexerTopk, p); }
Status validate(const SparseMlaFwdParams& p) { return validate_call(kSparseMlaFwd, p); }
Status validate(const SparseMlaBwdParams& p) { return validate_call(kSparseMlaBwd, p); }
Status validate(const AttnMassParams& p) { return validate_call(kAttentionMass, p); }
Status validate_fwd(const SparseKlParams& p) { return validate_call(kSparseKlFwd, p); }
Status validate_bwd(const SparseKlParams& p) { return validate_call(kSparseKlBwd, p); }
Status validate_fwd(const DenseKlParams& p) { return validate_call(kDenseKlFwd, p); }
Status validate_bwd(const DenseKlParams& p) { return validate_call(kDenseKlBwd, p); }
Status validate(const QuantizeFp8Params& p) { return validate_call(kQuantizeFp8, p); }

Status validate_workspace(const IndexerTopkParams& p) {
  return check_workspace_of(kIndexerTopk, p, indexer_topk_workspace_size(p));
}
Status validate_workspace(const SparseMlaBwdParams& p) {
  return check_workspace_of(kSparseMlaBwd, p, sparse_mla_bwd_workspace_size(p));
}

Status run_indexer_topk(const IndexerTopkParams& p) { return run_op(kIndexerTopk, p); }
Status run_sparse_mla_fwd(const SparseMlaFwdParams& p) { return run_op(kSparseMlaFwd, p); }
Status run_sparse_mla_bwd(const SparseMlaBwdParams& p) { return run_op(kSparseMlaBwd, p); }
Status run_attention_mass(const AttnMassParams& p) { return run_op(kAttentionMass, p); }
Status run_sparse_kl_fwd(const SparseKlParams& p) { return run_op(kSparseKlFwd, p); }
Status run_sparse_kl_bwd(const SparseKlParams& p) { return run_op(kSparseKlBwd, p); }
Status run_dense_kl_fwd(const DenseKlParams& p) { return run_op(kDenseKlFwd, p); }
Status run_dense_kl_bwd(const DenseKlParams& p) { return run_op(kDenseKlBwd, p); }
Status run_quantize_fp8(const QuantizeFp8Params& p) { return run_op(kQuantizeFp8, p); }

size_t indexer_topk_workspace_size(const IndexerTopkParams& p) { return workspace_of(kIndexerTopk, p); }
size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p) { return workspace_of(kSparseMlaBwd, p); }

bool built_with_cuda() {
#if defined(FLASHDSA_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace flashdsa
