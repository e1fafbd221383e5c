// Internal: input checks and tensor -> params helpers shared by the torch op implementations.
// Everything here throws c10 errors (RuntimeError / ValueError / NotImplementedError in Python).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include <cstdint>
#include <initializer_list>

#include "flashdsa/ops.h"

namespace flashdsa::torch_binding {

// Range checks of k_start/k_end on CUDA copy the ranges to the host (a stream sync); callers that
// build the ranges themselves turn them off. Process-wide; default on.
bool range_checks_enabled();
// Sets the flag and returns its previous value.
bool set_range_checks(bool enabled);

// The activation dtype of `t` (bf16, fp32 or fp64), else ValueError naming `name`.
DType activation_dtype(const at::Tensor& t, const char* name);
at::ScalarType scalar_type_of(DType dtype);
// fp64 for fp64 activations, else fp32.
at::ScalarType stat_scalar_type(DType activation);

// Shape/dtype/device checks; `name` is the argument name used in the message.
void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name);
void check_dtype(const at::Tensor& t, at::ScalarType expected, const char* name);
// t.sizes() == sizes; -1 entries match any extent.
void check_shape(const at::Tensor& t, std::initializer_list<int64_t> sizes, const char* name);
// Narrows a tensor extent to the int the params structs use.
int to_int(int64_t v, const char* what);

// A view the kernels can read through its strides: last dimension contiguous, outer strides that
// step over the block inside them and, on CUDA, 16-byte aligned base address and row strides (the
// kernels' 16-byte row copies). Any other tensor (transposed, expanded, ...) is copied to a contiguous one.
at::Tensor strided_rows(const at::Tensor& t);

// Checks an int32 tensor [T] of key-range bounds (k_start or k_end) and returns it contiguous.
at::Tensor key_range(const at::Tensor& t, const at::Tensor& ref, int64_t T, const char* name);
// Checks top-k indices (int32 [T, K]) and returns a strided_rows view.
at::Tensor topk_indices(const at::Tensor& t, const at::Tensor& ref, int64_t T);
// Checks a statistic tensor (stat dtype of `activation`, shape `sizes`) and returns it contiguous.
at::Tensor stat_tensor(const at::Tensor& t, const at::Tensor& ref, DType activation,
                       std::initializer_list<int64_t> sizes, const char* name);
// Checks an activation tensor (dtype `activation`, shape `sizes`) and returns it contiguous.
at::Tensor activation_tensor(const at::Tensor& t, const at::Tensor& ref, DType activation,
                             std::initializer_list<int64_t> sizes, const char* name);

// Device placement of one call: makes `ref`'s device current for the call's lifetime (CUDA) and
// fills the CallContext fields (device, current stream, range-check flag).
class CallScope {
 public:
  explicit CallScope(const at::Tensor& ref);
  void fill(CallContext& ctx) const;
  // A byte buffer on the call's device (kept alive by the returned tensor; stream-ordered on CUDA).
  at::Tensor workspace(size_t bytes) const;

 private:
  at::Tensor ref_;
  c10::OptionalDeviceGuard guard_;
  Device device_;
  void* stream_ = nullptr;
};

// Throws the error matching a non-OK status: kInvalidArgument -> ValueError, kNotSupported ->
// NotImplementedError, anything else -> RuntimeError. Messages start with "flashdsa.<op>: ".
void throw_if_error(const Status& status, const char* op);

// Activation inputs of the main attention: q [T, H, D_qk], kv [T_kv, D_qk], same dtype and device.
struct AttentionInputs {
  at::Tensor q, kv;  // strided_rows views
  DType dtype;
  int64_t T, T_kv;
  int H, D_qk;
};
AttentionInputs attention_inputs(const at::Tensor& q, const at::Tensor& kv);

// Indexer inputs: q_idx [T, H_I, D_I], k_idx [T_kv, D_I] (one activation dtype), weights [T, H_I] stat.
struct IndexerInputs {
  at::Tensor q_idx, k_idx, weights;  // strided_rows views
  DType dtype;
  int64_t T, T_kv;
  int H_I, D_I;
};
IndexerInputs indexer_inputs(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& weights);

// The params parts (include/flashdsa/ops.h) of checked inputs; T and T_kv are the op's own fields.
// The attention part of q/kv with the softmax scale (D_v keeps its default; the sparse MLA ops set it).
AttentionTensors attention_tensors(const AttentionInputs& a, double scale);
// The indexer part of q_idx/k_idx/weights (no dequantization scales).
IndexerTensors indexer_tensors(const IndexerInputs& in, bool relu);
// The top-k part of a topk_indices() view.
TopkIndices topk_part(const at::Tensor& indices);

}  // namespace flashdsa::torch_binding
