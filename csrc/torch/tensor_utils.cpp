// Input checks and tensor -> params helpers for the torch bindings (see tensor_utils.h).
#include "torch/tensor_utils.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <climits>
#include <string>
#include <tuple>

#ifdef FLASHDSA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace flashdsa::torch_binding {
namespace {

std::atomic<bool> g_range_checks{true};

// "torch.int32", as Python users spell the dtype.
std::string dtype_name(at::ScalarType t) { return "torch." + c10::getDtypeNames(t).first; }

// The CUDA kernels load rows with 16-byte cp.async copies: addresses and row strides must be 16-byte aligned.
constexpr int64_t kRowAlignmentBytes = 16;

}  // namespace

bool range_checks_enabled() { return g_range_checks.load(std::memory_order_relaxed); }

bool set_range_checks(bool enabled) { return g_range_checks.exchange(enabled); }

DType activation_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBF16;
    case at::kFloat: return DType::kFP32;
    case at::kDouble: return DType::kFP64;
    default:
      TORCH_CHECK_VALUE(false, name, " must be torch.bfloat16, torch.float32 or torch.float64, got ",
                        dtype_name(t.scalar_type()));
  }
}

at::ScalarType scalar_type_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kFP32: return at::kFloat;
    case DType::kFP64: return at::kDouble;
    case DType::kFP8E4M3: return at::kFloat8_e4m3fn;
  }
  TORCH_CHECK(false, "flashdsa: unknown dtype");
}

at::ScalarType stat_scalar_type(DType activation) { return scalar_type_of(stat_dtype(activation)); }

void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), name, " is on ", t.device(), " but the other inputs are on ",
              ref.device(), "; all tensors of one call must be on the same device");
}

void check_dtype(const at::Tensor& t, at::ScalarType expected, const char* name) {
  TORCH_CHECK_VALUE(t.scalar_type() == expected, name, " must be ", dtype_name(expected), ", got ",
                    dtype_name(t.scalar_type()));
}

void check_shape(const at::Tensor& t, std::initializer_list<int64_t> sizes, const char* name) {
  bool ok = t.dim() == static_cast<int64_t>(sizes.size());
  for (int64_t d = 0; ok && d < t.dim(); ++d) {
    const int64_t want = sizes.begin()[d];
    ok = want < 0 || t.size(d) == want;
  }
  if (ok) return;
  // Readable expected shape, "-1" shown as "*".
  std::string expected = "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    const int64_t want = sizes.begin()[d];
    expected += (d ? ", " : "") + (want < 0 ? std::string("*") : std::to_string(want));
  }
  expected += "]";
  TORCH_CHECK_VALUE(false, name, " must have shape ", expected, ", got ", t.sizes());
}

int to_int(int64_t v, const char* what) {
  TORCH_CHECK_VALUE(v >= 0 && v <= INT_MAX, what, " = ", v, " is out of range");
  return static_cast<int>(v);
}

at::Tensor strided_rows(const at::Tensor& t) {
  const int64_t ndim = t.dim();
  // The params describe a tensor by its outer strides only: the last dimension must be contiguous,
  // and each outer stride must step over the whole block inside it (no overlap, no reordering;
  // the rule the validation applies). An extent-1 dimension is never stepped over.
  bool usable = ndim > 0 && (t.stride(ndim - 1) == 1 || t.size(ndim - 1) <= 1);
  int64_t inner_span = ndim > 0 ? t.size(ndim - 1) : 0;
  for (int64_t d = ndim - 2; usable && d >= 0; --d) {
    if (t.size(d) <= 1) continue;
    usable = t.stride(d) >= inner_span;
    inner_span += (t.size(d) - 1) * t.stride(d);
  }
  if (!t.is_cuda()) return usable ? t : t.contiguous();
  // CUDA kernels load rows with 16-byte cp.async copies: base address and row strides must be aligned.
  const int64_t elem = static_cast<int64_t>(t.element_size());
  usable = usable && reinterpret_cast<uintptr_t>(t.data_ptr()) % kRowAlignmentBytes == 0;
  for (int64_t d = 0; usable && d + 1 < ndim; ++d) {
    usable = t.size(d) == 1 || (t.stride(d) * elem) % kRowAlignmentBytes == 0;
  }
  // clone, not contiguous(): a contiguous view at a misaligned offset must be copied too.
  return usable ? t : t.clone(at::MemoryFormat::Contiguous);
}

namespace {

// The checks of an op tensor against the call's reference tensor: its device, dtype and shape.
void check_tensor(const at::Tensor& t, const at::Tensor& ref, at::ScalarType dtype, std::initializer_list<int64_t> sizes,
                  const char* name) {
  check_same_device(t, ref, name);
  check_dtype(t, dtype, name);
  check_shape(t, sizes, name);
}

}  // namespace

at::Tensor key_range(const at::Tensor& t, const at::Tensor& ref, int64_t T, const char* name) {
  check_tensor(t, ref, at::kInt, {T}, name);
  return t.contiguous();
}

at::Tensor topk_indices(const at::Tensor& t, const at::Tensor& ref, int64_t T) {
  check_tensor(t, ref, at::kInt, {T, -1}, "indices");
  return strided_rows(t);
}

at::Tensor stat_tensor(const at::Tensor& t, const at::Tensor& ref, DType activation,
                       std::initializer_list<int64_t> sizes, const char* name) {
  check_tensor(t, ref, stat_scalar_type(activation), sizes, name);
  return t.contiguous();
}

at::Tensor activation_tensor(const at::Tensor& t, const at::Tensor& ref, DType activation,
                             std::initializer_list<int64_t> sizes, const char* name) {
  check_tensor(t, ref, scalar_type_of(activation), sizes, name);
  return t.contiguous();
}

CallScope::CallScope(const at::Tensor& ref) : ref_(ref), device_(Device::kCPU) {
  if (ref.device().is_cpu()) return;
  TORCH_CHECK(ref.is_cuda(), "flashdsa: tensors on ", ref.device(), " are not supported (CPU or CUDA only)");
#ifdef FLASHDSA_WITH_CUDA
  guard_.reset_device(ref.device());
  device_ = Device::kCUDA;
  stream_ = at::cuda::getCurrentCUDAStream(ref.device().index()).stream();
#else
  TORCH_CHECK(false, "flashdsa: this build has no CUDA backend (built with FLASHDSA_WITH_CUDA=0 or without nvcc)");
#endif
}

void CallScope::fill(CallContext& ctx) const {
  ctx.device = device_;
  ctx.stream = stream_;
  ctx.check_ranges = range_checks_enabled();
}

at::Tensor CallScope::workspace(size_t bytes) const {
  return at::empty({static_cast<int64_t>(bytes)}, ref_.options().dtype(at::kByte));
}

void throw_if_error(const Status& status, const char* op) {
  if (status.ok()) return;
  // Entry points already prefix their messages with the op name: keep one prefix.
  std::string message = status.message();
  const std::string own_prefix = std::string(op) + ": ";
  if (message.rfind(own_prefix, 0) == 0) message.erase(0, own_prefix.size());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, "flashdsa.", op, ": ", message);
    case StatusCode::kNotSupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "flashdsa.", op, ": ", message);
    default:
      TORCH_CHECK(false, "flashdsa.", op, ": ", status_code_name(status.code()), ": ", message);
  }
}

namespace {

// How the checks of a query / key pair name each tensor and size in their messages.
struct QueryKeyNames {
  const char* q;        // "q"
  const char* k;        // "kv"
  const char* k_dtype;  // "kv (the dtype of q)"
  const char* k_shape;  // "kv (D_qk of q)"
  const char* H;        // "H (q.size(1))"
  const char* D;        // "D_qk (q.size(2))"
};

// Checks q [T, H, D] and k [T_kv, D]: one activation dtype, one device. Returns their strided_rows
// views, the dtype, T, T_kv, H and D (in that order; the callers std::tie them to their fields).
std::tuple<at::Tensor, at::Tensor, DType, int64_t, int64_t, int, int> query_key(const at::Tensor& q,
                                                                              const at::Tensor& k,
                                                                              const QueryKeyNames& n) {
  const DType dtype = activation_dtype(q, n.q);
  check_same_device(k, q, n.k);
  check_dtype(k, q.scalar_type(), n.k_dtype);
  check_shape(q, {-1, -1, -1}, n.q);
  check_shape(k, {-1, q.size(2)}, n.k_shape);
  return {strided_rows(q), strided_rows(k), dtype, q.size(0), k.size(0), to_int(q.size(1), n.H),
          to_int(q.size(2), n.D)};
}

// The pointer and stride fields that AttentionTensors and IndexerTensors share (under their names).
void query_key_fields(const at::Tensor& q, const at::Tensor& k, const void*& q_ptr, const void*& k_ptr,
                      int64_t& q_stride_t, int64_t& q_stride_h, int64_t& k_stride_t) {
  q_ptr = q.data_ptr();
  k_ptr = k.data_ptr();
  q_stride_t = q.stride(0);
  q_stride_h = q.stride(1);
  k_stride_t = k.stride(0);
}

}  // namespace

AttentionInputs attention_inputs(const at::Tensor& q, const at::Tensor& kv) {
  AttentionInputs a;
  std::tie(a.q, a.kv, a.dtype, a.T, a.T_kv, a.H, a.D_qk) =
      query_key(q, kv, {"q", "kv", "kv (the dtype of q)", "kv (D_qk of q)", "H (q.size(1))", "D_qk (q.size(2))"});
  return a;
}

IndexerInputs indexer_inputs(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& weights) {
  IndexerInputs in;
  std::tie(in.q_idx, in.k_idx, in.dtype, in.T, in.T_kv, in.H_I, in.D_I) =
      query_key(q_idx, k_idx, {"q_idx", "k_idx", "k_idx (the dtype of q_idx)", "k_idx (D_I of q_idx)",
                               "H_I (q_idx.size(1))", "D_I (q_idx.size(2))"});
  check_same_device(weights, q_idx, "weights");
  check_dtype(weights, stat_scalar_type(in.dtype), "weights (float32 for bf16/fp32 activations, else float64)");
  check_shape(weights, {q_idx.size(0), q_idx.size(1)}, "weights ([T, H_I] of q_idx)");
  in.weights = strided_rows(weights);
  return in;
}

AttentionTensors attention_tensors(const AttentionInputs& a, double scale) {
  AttentionTensors t;
  t.dtype = a.dtype;
  query_key_fields(a.q, a.kv, t.q, t.kv, t.q_stride_t, t.q_stride_h, t.kv_stride_t);
  t.H = a.H;
  t.D_qk = a.D_qk;
  t.scale = static_cast<float>(scale);
  return t;
}

IndexerTensors indexer_tensors(const IndexerInputs& in, bool relu) {
  IndexerTensors t;
  t.dtype = in.dtype;
  query_key_fields(in.q_idx, in.k_idx, t.q_idx, t.k_idx, t.q_idx_stride_t, t.q_idx_stride_h, t.k_idx_stride_t);
  t.weights = in.weights.data_ptr();
  t.weights_stride_t = in.weights.stride(0);
  t.H_I = in.H_I;
  t.D_I = in.D_I;
  t.relu = relu;
  return t;
}

TopkIndices topk_part(const at::Tensor& indices) {
  TopkIndices t;
  t.indices = indices.data_ptr<int32_t>();
  t.stride_t = indices.stride(0);
  t.K = to_int(indices.size(1), "K (indices.size(1))");
  return t;
}

}  // namespace flashdsa::torch_binding
