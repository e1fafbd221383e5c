// Entry points: validate on the host, then dispatch to the CPU or the sm90 backend.
#include <exception>
#include <new>
#include <string>

#include "common/status_macros.h"
#include "cpu/cpu_backend.h"
#include "flashdsa/ops.h"

#if defined(FLASHDSA_WITH_CUDA)
#include "sm90/sm90_backend.h"
#define FLASHDSA_SM90(fn) (&sm90::fn)
#else
#define FLASHDSA_SM90(fn) nullptr
#endif

namespace flashdsa {
namespace {

template <class P>
using OpFn = Status (*)(const P&);

// Validates p, then runs the backend of p.device. The CPU backend reports failures (out of
// memory) by exceptions, which stop here: the public API never throws.
template <class P>
Status run_op(const char* name, OpKind op, const P& p, OpFn<P> check, OpFn<P> cpu_impl, OpFn<P> cuda_impl) {
  FLASHDSA_RETURN_IF_ERROR(check(p));
  try {
    if (p.device == Device::kCPU) return cpu_impl(p);
    if (!built_with_cuda() || cuda_impl == nullptr) {
      return Status::NotSupported(std::string(name) + ": device is cuda but FlashDSA was built without CUDA");
    }
    if (!backend_implements(Device::kCUDA, op)) {
      return Status::NotSupported(std::string(name) +
                                  ": the CUDA kernel is not implemented in this build (use the CPU backend)");
    }
    return cuda_impl(p);
  } catch (const std::bad_alloc&) {
    return Status::Internal(std::string(name) + ": out of host memory");
  } catch (const std::exception& e) {
    return Status::Internal(std::string(name) + ": " + e.what());
  }
}

// validate() then, on CUDA, the workspace (its size is only defined for valid params).
template <class P>
Status validate_with_workspace(const P& p) {
  FLASHDSA_RETURN_IF_ERROR(validate(p));
  return validate_workspace(p);
}

}  // namespace

Status run_indexer_topk(const IndexerTopkParams& p) {
  return run_op<IndexerTopkParams>("indexer_topk", OpKind::kIndexerTopk, p, validate_with_workspace,
                                   cpu::indexer_topk, FLASHDSA_SM90(indexer_topk));
}

Status run_sparse_mla_fwd(const SparseMlaFwdParams& p) {
  return run_op<SparseMlaFwdParams>("sparse_mla_fwd", OpKind::kSparseMlaFwd, p, validate, cpu::sparse_mla_fwd,
                                    FLASHDSA_SM90(sparse_mla_fwd));
}

Status run_sparse_mla_bwd(const SparseMlaBwdParams& p) {
  return run_op<SparseMlaBwdParams>("sparse_mla_bwd", OpKind::kSparseMlaBwd, p, validate_with_workspace,
                                    cpu::sparse_mla_bwd, FLASHDSA_SM90(sparse_mla_bwd));
}

Status run_attention_mass(const AttnMassParams& p) {
  return run_op<AttnMassParams>("attention_mass", OpKind::kAttentionMass, p, validate, cpu::attention_mass,
                                FLASHDSA_SM90(attention_mass));
}

Status run_sparse_kl_fwd(const SparseKlParams& p) {
  return run_op<SparseKlParams>("sparse_kl_fwd", OpKind::kSparseKlFwd, p, validate_fwd, cpu::sparse_kl_fwd,
                                FLASHDSA_SM90(sparse_kl_fwd));
}

Status run_sparse_kl_bwd(const SparseKlParams& p) {
  return run_op<SparseKlParams>("sparse_kl_bwd", OpKind::kSparseKlBwd, p, validate_bwd, cpu::sparse_kl_bwd,
                                FLASHDSA_SM90(sparse_kl_bwd));
}

Status run_dense_kl_fwd(const DenseKlParams& p) {
  return run_op<DenseKlParams>("dense_kl_fwd", OpKind::kDenseKlFwd, p, validate_fwd, cpu::dense_kl_fwd,
                               FLASHDSA_SM90(dense_kl_fwd));
}

Status run_dense_kl_bwd(const DenseKlParams& p) {
  return run_op<DenseKlParams>("dense_kl_bwd", OpKind::kDenseKlBwd, p, validate_bwd, cpu::dense_kl_bwd,
                               FLASHDSA_SM90(dense_kl_bwd));
}

size_t indexer_topk_workspace_size(const IndexerTopkParams& p) {
#if defined(FLASHDSA_WITH_CUDA)
  if (p.device == Device::kCUDA) return sm90::indexer_topk_workspace_size(p);
#endif
  (void)p;
  return 0;
}

size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p) {
#if defined(FLASHDSA_WITH_CUDA)
  if (p.device == Device::kCUDA) return sm90::sparse_mla_bwd_workspace_size(p);
#endif
  (void)p;
  return 0;
}

bool backend_implements(Device device, OpKind op) {
  switch (device) {
    case Device::kCPU:
      return true;
    case Device::kCUDA:
#if defined(FLASHDSA_WITH_CUDA)
      return sm90::implements(op);
#else
      (void)op;
      return false;
#endif
  }
  return false;
}

bool built_with_cuda() {
#if defined(FLASHDSA_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace flashdsa
