// Internal: what a backend exports, and how the entry points find the backend of a call.
//
// A backend is one folder, csrc/<backend>/, that exports one Backend table (see
// docs/architecture.md, "Adding a backend"). For every op the table holds
//   supports(p, op)   -> Status: the backend's own limits (sizes, dtypes, alignment); `op` is the
//                        op's name, the prefix of any message;
//   run(p)            -> Status: runs a valid, supported call;
//   workspace_size(p) -> bytes of scratch memory the call needs (nullptr: none).
// select_backend() maps Params::device (and, for CUDA, the compute capability of the current
// device) to a table; csrc/common/backends.cpp lists the tables.
#pragma once

#include <cstddef>
#include <string>

#include "flashdsa/ops.h"

namespace flashdsa::detail {

template <class P>
struct OpEntry {
  Status (*supports)(const P&, const char* op) = nullptr;
  Status (*run)(const P&) = nullptr;
  size_t (*workspace_size)(const P&) = nullptr;
};

struct Backend {
  const char* name;  // "cpu", "sm90"
  OpEntry<IndexerTopkParams> indexer_topk;
  OpEntry<SparseMlaFwdParams> sparse_mla_fwd;
  OpEntry<SparseMlaBwdParams> sparse_mla_bwd;
  OpEntry<AttnMassParams> attention_mass;
  OpEntry<SparseKlParams> sparse_kl_fwd;
  OpEntry<SparseKlParams> sparse_kl_bwd;
  OpEntry<DenseKlParams> dense_kl_fwd;
  OpEntry<DenseKlParams> dense_kl_bwd;
  OpEntry<QuantizeFp8Params> quantize_fp8;  // the FP8 indexer's quantization (nullptr run: not implemented)
};

// The backend that runs calls on ctx.device. kNotSupported (message prefixed by `op`) when this
// build has none for it: a CUDA call in a build without CUDA, or a CUDA device whose compute
// capability no backend of this build targets. kCudaError when the device cannot be queried.
Status select_backend(const char* op, const CallContext& ctx, const Backend** backend);

}  // namespace flashdsa::detail

// Declares, in a backend's namespace, its table (backend(), defined in its backend.cpp) and the run
// function of every op (one per Backend entry), so each backend header lists the same ops with the
// same signatures.
#define FLASHDSA_DECLARE_BACKEND_OPS()                      \
  const ::flashdsa::detail::Backend& backend();            \
  Status indexer_topk(const IndexerTopkParams& p);         \
  Status sparse_mla_fwd(const SparseMlaFwdParams& p);      \
  Status sparse_mla_bwd(const SparseMlaBwdParams& p);      \
  Status attention_mass(const AttnMassParams& p);          \
  Status sparse_kl_fwd(const SparseKlParams& p);           \
  Status sparse_kl_bwd(const SparseKlParams& p);           \
  Status dense_kl_fwd(const DenseKlParams& p);             \
  Status dense_kl_bwd(const DenseKlParams& p)

namespace flashdsa::testing {

// Test only: makes select_backend() see every CUDA device as compute capability major.minor with
// the given name, without any CUDA call (so tests of the capability check run without a GPU).
void set_cuda_device_override(int major, int minor, const std::string& name);
// Back to querying the real device.
void clear_cuda_device_override();

}  // namespace flashdsa::testing
