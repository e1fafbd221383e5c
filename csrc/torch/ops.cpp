// The torch ops of FlashDSA (torch.ops.flashdsa.*): schemas, and one implementation per op that
// checks the tensors, fills the op's params struct and calls the flashdsa entry point. The same
// function is registered for CPU and CUDA; the backend is picked from the inputs' device.
// Contract: docs/python-api.md. Fake (meta) kernels and autograd live in python/flashdsa/ops.py.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flashdsa/ops.h"
#include "torch/tensor_utils.h"

namespace flashdsa::torch_binding {
namespace {

using at::Tensor;

// D_v: the value is the first columns of the latent key; the last kDqk - kDv columns are the RoPE part.
int value_width(int d_qk) {
  constexpr int kRopeWidth = kDqk - kDv;
  TORCH_CHECK_VALUE(d_qk > kRopeWidth, "D_qk (q.size(2)) must exceed the RoPE width ", kRopeWidth, ", got ", d_qk);
  return d_qk - kRopeWidth;
}

// The common tail of the indexer top-k ops: the key ranges, outputs [T, K], validation (ranges
// checked once), the workspace, the run. `p` holds the indexer part (and the re-score inputs).
std::tuple<Tensor, Tensor> run_topk_op(IndexerTopkParams& p, const IndexerInputs& in, const Tensor& q_idx,
                                       const Tensor& k_start, const Tensor& k_end, int64_t topk,
                                       const char* name) {
  const Tensor starts = key_range(k_start, q_idx, in.T, "k_start");
  const Tensor ends = key_range(k_end, q_idx, in.T, "k_end");
  const int K = to_int(topk, "topk");
  const CallScope scope(q_idx);
  scope.fill(p);
  Tensor indices = at::empty({in.T, K}, q_idx.options().dtype(at::kInt));
  // (the band re-score returns indices only: an empty [T, 0] scores tensor, never written)
  Tensor scores = at::empty({in.T, p.rescore_band > 0 ? 0 : K}, q_idx.options().dtype(stat_scalar_type(in.dtype)));
  p.T = in.T;
  p.T_kv = in.T_kv;
  p.k_start = starts.data_ptr<int32_t>();
  p.k_end = ends.data_ptr<int32_t>();
  p.indices = indices.data_ptr<int32_t>();
  p.scores = p.rescore_band > 0 ? nullptr : scores.data_ptr();
  p.K = K;
  // The workspace size is only defined for valid params. The ranges were just checked: do not copy
  // them to the host (a CUDA sync) a second time in run_indexer_topk.
  throw_if_error(validate(p), name);
  p.check_ranges = false;
  const Tensor workspace = scope.workspace(indexer_topk_workspace_size(p));
  p.workspace = workspace.data_ptr();
  p.workspace_bytes = static_cast<size_t>(workspace.numel());
  throw_if_error(run_indexer_topk(p), name);
  return {indices, scores};
}

std::tuple<Tensor, Tensor> indexer_topk(const Tensor& q_idx, const Tensor& k_idx, const Tensor& weights,
                                        const Tensor& k_start, const Tensor& k_end, int64_t topk, bool relu) {
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  IndexerTopkParams p;
  p.indexer = indexer_tensors(in, relu);
  return run_topk_op(p, in, q_idx, k_start, k_end, topk, "indexer_topk");
}

// FP8 (e4m3) quantization of indexer rows: x [N, D] or [N0, N1, D] -> (e4m3 of x's shape, fp32 scales
// of x's shape without D). docs/spec.md §3 "FP8 selection".
std::tuple<Tensor, Tensor> quantize_fp8(const Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, "x must have 2 or 3 dimensions ([N, D] or [N0, N1, D]), got ",
                    x.dim());
  const DType dtype = activation_dtype(x, "x");
  const Tensor x3 = strided_rows(x.dim() == 2 ? x.unsqueeze(1) : x);
  const CallScope scope(x);
  QuantizeFp8Params p;
  scope.fill(p);
  p.dtype = dtype;
  p.x = x3.data_ptr();
  p.N0 = x3.size(0);
  p.N1 = to_int(x3.size(1), "x.size(1)");
  p.D = to_int(x3.size(2), "D (x.size(-1))");
  p.stride0 = x3.stride(0);
  p.stride1 = x3.stride(1);
  Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  std::vector<int64_t> scale_sizes(x.sizes().begin(), x.sizes().end() - 1);
  Tensor scale = at::empty(scale_sizes, x.options().dtype(at::kFloat));
  p.out = out.data_ptr();
  p.scale = scale.data_ptr<float>();
  throw_if_error(run_quantize_fp8(p), "quantize_fp8");
  return {out, scale};
}

// The FP8 selection pass of indexer_topk (docs/spec.md §3): q8 [T, H_I, D_I] / k8 [T_kv, D_I] e4m3 with
// their scales [T, H_I] / [T_kv] (fp32) select `candidates` keys, re-scored from the unquantized
// q_idx / k_idx / weights (bf16; fp32/fp64 on the CPU). Returns what indexer_topk returns for those.
std::tuple<Tensor, Tensor> indexer_topk_fp8(const Tensor& q8, const Tensor& k8, const Tensor& q_scale,
                                            const Tensor& k_scale, const Tensor& q_idx, const Tensor& k_idx,
                                            const Tensor& weights, const Tensor& k_start, const Tensor& k_end,
                                            int64_t topk, bool relu, int64_t candidates, int64_t band,
                                            bool band_scaled) {
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  check_same_device(q8, q_idx, "q8");
  check_same_device(k8, q_idx, "k8");
  check_dtype(q8, at::kFloat8_e4m3fn, "q8");
  check_dtype(k8, at::kFloat8_e4m3fn, "k8");
  check_shape(q8, {in.T, in.H_I, in.D_I}, "q8 (the shape of q_idx)");
  check_shape(k8, {in.T_kv, in.D_I}, "k8 (the shape of k_idx)");
  const Tensor qs = stat_tensor(q_scale, q_idx, DType::kFP32, {in.T, in.H_I}, "q_scale");
  const Tensor kscale = stat_tensor(k_scale, q_idx, DType::kFP32, {in.T_kv}, "k_scale");
  const Tensor q8_rows = strided_rows(q8);
  const Tensor k8_rows = strided_rows(k8);
  // The selection pass reads fp32 weights (the stat dtype of fp8).
  const Tensor w8 = in.dtype == DType::kFP64 ? in.weights.to(at::kFloat) : in.weights;
  IndexerTopkParams p;
  p.rescore = indexer_tensors(in, relu);
  p.indexer = p.rescore;
  p.indexer.dtype = DType::kFP8E4M3;
  p.indexer.q_idx = q8_rows.data_ptr();
  p.indexer.k_idx = k8_rows.data_ptr();
  p.indexer.q_idx_stride_t = q8_rows.stride(0);
  p.indexer.q_idx_stride_h = q8_rows.stride(1);
  p.indexer.k_idx_stride_t = k8_rows.stride(0);
  p.indexer.weights = w8.data_ptr();
  p.indexer.weights_stride_t = w8.stride(0);
  p.indexer.q_idx_scale = qs.data_ptr<float>();
  p.indexer.k_idx_scale = kscale.data_ptr<float>();
  p.candidates = to_int(candidates, "candidates");
  p.rescore_band = to_int(band, "band");
  p.rescore_band_scaled = band_scaled;
  return run_topk_op(p, in, q_idx, k_start, k_end, topk, "indexer_topk_fp8");
}

std::tuple<Tensor, Tensor> sparse_mla_fwd(const Tensor& q, const Tensor& kv, const Tensor& indices, double scale) {
  const AttentionInputs a = attention_inputs(q, kv);
  const Tensor idx = topk_indices(indices, q, a.T);
  const CallScope scope(q);

  SparseMlaFwdParams p;
  scope.fill(p);
  p.attn = attention_tensors(a, scale);
  p.attn.D_v = value_width(a.D_qk);
  p.topk = topk_part(idx);
  p.T = a.T;
  p.T_kv = a.T_kv;
  Tensor out = at::empty({a.T, a.H, p.attn.D_v}, q.options());
  Tensor lse = at::empty({a.T, a.H}, q.options().dtype(stat_scalar_type(a.dtype)));
  p.out = out.data_ptr();
  p.lse = lse.data_ptr();
  throw_if_error(run_sparse_mla_fwd(p), "sparse_mla_fwd");
  return {out, lse};
}

// dq [T, H, D_qk] (act), dkv [T_kv, D_qk] (stat) and, when with_mass, the attention mass [T, K]
// (stat) that the backward forms anyway (undefined tensor otherwise).
std::tuple<Tensor, Tensor, Tensor> sparse_mla_bwd_impl(const Tensor& q, const Tensor& kv, const Tensor& indices,
                                                       double scale, const Tensor& out, const Tensor& lse,
                                                       const Tensor& dout, bool deterministic, bool with_mass,
                                                       const char* op) {
  const AttentionInputs a = attention_inputs(q, kv);
  const Tensor idx = topk_indices(indices, q, a.T);
  const int D_v = value_width(a.D_qk);
  const Tensor out_c = activation_tensor(out, q, a.dtype, {a.T, a.H, D_v}, "out");
  const Tensor dout_c = activation_tensor(dout, q, a.dtype, {a.T, a.H, D_v}, "dout");
  const Tensor lse_c = stat_tensor(lse, q, a.dtype, {a.T, a.H}, "lse");
  const CallScope scope(q);

  SparseMlaBwdParams p;
  scope.fill(p);
  p.attn = attention_tensors(a, scale);
  p.attn.D_v = D_v;
  p.topk = topk_part(idx);
  p.T = a.T;
  p.T_kv = a.T_kv;
  p.out = out_c.data_ptr();
  p.lse = lse_c.data_ptr();
  p.dout = dout_c.data_ptr();
  p.deterministic = deterministic;
  Tensor dq = at::empty({a.T, a.H, a.D_qk}, q.options());
  Tensor dkv = at::empty({a.T_kv, a.D_qk}, q.options().dtype(stat_scalar_type(a.dtype)));
  p.dq = dq.data_ptr();
  p.dkv = dkv.data_ptr();
  Tensor mass;
  if (with_mass) {
    mass = at::empty({a.T, p.topk.K}, q.options().dtype(stat_scalar_type(a.dtype)));  // contiguous, allocator-aligned
    p.mass = mass.data_ptr();
  }
  // The workspace size is only defined for valid params.
  throw_if_error(validate(p), op);
  const Tensor workspace = scope.workspace(sparse_mla_bwd_workspace_size(p));
  p.workspace = workspace.data_ptr();
  p.workspace_bytes = static_cast<size_t>(workspace.numel());
  throw_if_error(run_sparse_mla_bwd(p), op);
  return {dq, dkv, mass};
}

std::tuple<Tensor, Tensor> sparse_mla_bwd(const Tensor& q, const Tensor& kv, const Tensor& indices, double scale,
                                          const Tensor& out, const Tensor& lse, const Tensor& dout,
                                          bool deterministic) {
  auto [dq, dkv, mass] =
      sparse_mla_bwd_impl(q, kv, indices, scale, out, lse, dout, deterministic, false, "sparse_mla_bwd");
  return {dq, dkv};
}

// sparse_mla_bwd that also returns the attention mass of every slot (what attention_mass computes).
std::tuple<Tensor, Tensor, Tensor> sparse_mla_bwd_mass(const Tensor& q, const Tensor& kv, const Tensor& indices,
                                                       double scale, const Tensor& out, const Tensor& lse,
                                                       const Tensor& dout, bool deterministic) {
  return sparse_mla_bwd_impl(q, kv, indices, scale, out, lse, dout, deterministic, true, "sparse_mla_bwd_mass");
}

Tensor attention_mass(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& lse, double scale) {
  const AttentionInputs a = attention_inputs(q, kv);
  const Tensor idx = topk_indices(indices, q, a.T);
  const Tensor lse_c = stat_tensor(lse, q, a.dtype, {a.T, a.H}, "lse");
  const CallScope scope(q);

  AttnMassParams p;
  scope.fill(p);
  p.attn = attention_tensors(a, scale);
  p.topk = topk_part(idx);
  p.T = a.T;
  p.T_kv = a.T_kv;
  p.lse = lse_c.data_ptr();
  Tensor mass = at::empty({a.T, p.topk.K}, q.options().dtype(stat_scalar_type(a.dtype)));
  p.mass = mass.data_ptr();
  throw_if_error(run_attention_mass(p), "attention_mass");
  return mass;
}

// Sparse KL params shared by forward and backward (the tensors must outlive the call).
SparseKlParams sparse_kl_params(const IndexerInputs& in, const Tensor& idx, const Tensor& mass_c, bool relu) {
  SparseKlParams p;
  p.indexer = indexer_tensors(in, relu);
  p.topk = topk_part(idx);
  p.T = in.T;
  p.T_kv = in.T_kv;
  p.mass = mass_c.data_ptr();
  return p;
}

// Returns loss_rows [T] and the row statistics [T, 2] that let sparse_kl_bwd skip recomputing them.
std::tuple<Tensor, Tensor> sparse_kl_fwd(const Tensor& q_idx, const Tensor& k_idx, const Tensor& weights,
                                         const Tensor& indices, const Tensor& mass, bool relu) {
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  const Tensor idx = topk_indices(indices, q_idx, in.T);
  const Tensor mass_c = stat_tensor(mass, q_idx, in.dtype, {in.T, idx.size(1)}, "mass ([T, K] of indices)");
  const CallScope scope(q_idx);

  SparseKlParams p = sparse_kl_params(in, idx, mass_c, relu);
  scope.fill(p);
  Tensor loss_rows = at::empty({in.T}, q_idx.options().dtype(stat_scalar_type(in.dtype)));
  Tensor row_stats = at::empty({in.T, 2}, q_idx.options().dtype(stat_scalar_type(in.dtype)));
  p.loss_rows = loss_rows.data_ptr();
  p.row_stats = row_stats.data_ptr();
  throw_if_error(run_sparse_kl_fwd(p), "sparse_kl_fwd");
  return {loss_rows, row_stats};
}

// Indexer gradients [dq_idx (act), dk_idx (stat), dweights (stat)], allocated and wired into `p`.
template <class Params>
std::tuple<Tensor, Tensor, Tensor> indexer_grads(Params& p, const IndexerInputs& in, const Tensor& ref) {
  Tensor dq_idx = at::empty({in.T, in.H_I, in.D_I}, ref.options());
  Tensor dk_idx = at::empty({in.T_kv, in.D_I}, ref.options().dtype(stat_scalar_type(in.dtype)));
  Tensor dweights = at::empty({in.T, in.H_I}, ref.options().dtype(stat_scalar_type(in.dtype)));
  p.dq_idx = dq_idx.data_ptr();
  p.dk_idx = dk_idx.data_ptr();
  p.dweights = dweights.data_ptr();
  return {dq_idx, dk_idx, dweights};
}

std::tuple<Tensor, Tensor, Tensor> sparse_kl_bwd(const Tensor& q_idx, const Tensor& k_idx, const Tensor& weights,
                                                 const Tensor& indices, const Tensor& mass, bool relu,
                                                 const Tensor& grad_rows, const std::optional<Tensor>& row_stats) {
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  const Tensor idx = topk_indices(indices, q_idx, in.T);
  const Tensor mass_c = stat_tensor(mass, q_idx, in.dtype, {in.T, idx.size(1)}, "mass ([T, K] of indices)");
  const Tensor grad_c = stat_tensor(grad_rows, q_idx, in.dtype, {in.T}, "grad_rows");
  const Tensor stats_c =
      row_stats ? stat_tensor(*row_stats, q_idx, in.dtype, {in.T, 2}, "row_stats ([T, 2] of sparse_kl_fwd)") : Tensor();
  const CallScope scope(q_idx);

  SparseKlParams p = sparse_kl_params(in, idx, mass_c, relu);
  scope.fill(p);
  p.grad_rows = grad_c.data_ptr();
  if (stats_c.defined()) p.row_stats = stats_c.data_ptr();
  auto grads = indexer_grads(p, in, q_idx);
  throw_if_error(run_sparse_kl_bwd(p), "sparse_kl_bwd");
  return grads;
}

// Dense KL params shared by forward and backward; the range tensors must outlive the call.
DenseKlParams dense_kl_params(const AttentionInputs& a, double scale, const IndexerInputs& in,
                              const Tensor& starts, const Tensor& ends, bool relu) {
  check_same_device(in.q_idx, a.q, "q_idx");
  check_dtype(in.q_idx, scalar_type_of(a.dtype), "q_idx (the dtype of q)");
  TORCH_CHECK_VALUE(in.T == a.T, "q_idx has T = ", in.T, " rows but q has ", a.T);
  TORCH_CHECK_VALUE(in.T_kv == a.T_kv, "k_idx has T_kv = ", in.T_kv, " rows but kv has ", a.T_kv);
  DenseKlParams p;
  p.attn = attention_tensors(a, scale);
  p.indexer = indexer_tensors(in, relu);
  p.T = a.T;
  p.T_kv = a.T_kv;
  p.k_start = starts.data_ptr<int32_t>();
  p.k_end = ends.data_ptr<int32_t>();
  return p;
}

Tensor dense_kl_fwd(const Tensor& q, const Tensor& kv, double scale, const Tensor& q_idx, const Tensor& k_idx,
                    const Tensor& weights, const Tensor& k_start, const Tensor& k_end, bool relu) {
  const AttentionInputs a = attention_inputs(q, kv);
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  const Tensor starts = key_range(k_start, q, a.T, "k_start");
  const Tensor ends = key_range(k_end, q, a.T, "k_end");
  const CallScope scope(q);

  DenseKlParams p = dense_kl_params(a, scale, in, starts, ends, relu);
  scope.fill(p);
  Tensor loss_rows = at::empty({a.T}, q.options().dtype(stat_scalar_type(a.dtype)));
  p.loss_rows = loss_rows.data_ptr();
  throw_if_error(run_dense_kl_fwd(p), "dense_kl_fwd");
  return loss_rows;
}

std::tuple<Tensor, Tensor, Tensor> dense_kl_bwd(const Tensor& q, const Tensor& kv, double scale, const Tensor& q_idx,
                                                const Tensor& k_idx, const Tensor& weights, const Tensor& k_start,
                                                const Tensor& k_end, bool relu, const Tensor& grad_rows) {
  const AttentionInputs a = attention_inputs(q, kv);
  const IndexerInputs in = indexer_inputs(q_idx, k_idx, weights);
  const Tensor starts = key_range(k_start, q, a.T, "k_start");
  const Tensor ends = key_range(k_end, q, a.T, "k_end");
  const Tensor grad_c = stat_tensor(grad_rows, q, a.dtype, {a.T}, "grad_rows");
  const CallScope scope(q);

  DenseKlParams p = dense_kl_params(a, scale, in, starts, ends, relu);
  scope.fill(p);
  p.grad_rows = grad_c.data_ptr();
  auto grads = indexer_grads(p, in, q_idx);
  throw_if_error(run_dense_kl_bwd(p), "dense_kl_bwd");
  return grads;
}

bool built_with_cuda_op() { return built_with_cuda(); }

bool set_range_checks_op(bool enabled) { return set_range_checks(enabled); }

// The same kernels serve every device: the backend is chosen from the inputs' device.
void register_kernels(torch::Library& m) {
  m.impl("indexer_topk", TORCH_FN(indexer_topk));
  m.impl("indexer_topk_fp8", TORCH_FN(indexer_topk_fp8));
  m.impl("quantize_fp8", TORCH_FN(quantize_fp8));
  m.impl("sparse_mla_fwd", TORCH_FN(sparse_mla_fwd));
  m.impl("sparse_mla_bwd", TORCH_FN(sparse_mla_bwd));
  m.impl("sparse_mla_bwd_mass", TORCH_FN(sparse_mla_bwd_mass));
  m.impl("attention_mass", TORCH_FN(attention_mass));
  m.impl("sparse_kl_fwd", TORCH_FN(sparse_kl_fwd));
  m.impl("sparse_kl_bwd", TORCH_FN(sparse_kl_bwd));
  m.impl("dense_kl_fwd", TORCH_FN(dense_kl_fwd));
  m.impl("dense_kl_bwd", TORCH_FN(dense_kl_bwd));
}

}  // namespace
}  // namespace flashdsa::torch_binding

TORCH_LIBRARY(flashdsa, m) {
  namespace tb = flashdsa::torch_binding;
  // Fake kernels and autograd for these ops are registered by this Python module.
  m.set_python_module("flashdsa.ops");
  // With their fake kernels every op traces under torch.compile (checked by torch.library.opcheck).
  const std::vector<at::Tag> traceable = {at::Tag::pt2_compliant_tag};
  m.def("indexer_topk(Tensor q_idx, Tensor k_idx, Tensor weights, Tensor k_start, Tensor k_end, int topk, "
        "bool relu) -> (Tensor indices, Tensor scores)",
        traceable);
  m.def("indexer_topk_fp8(Tensor q8, Tensor k8, Tensor q_scale, Tensor k_scale, Tensor q_idx, Tensor k_idx, "
        "Tensor weights, Tensor k_start, Tensor k_end, int topk, bool relu, int candidates, int band=0, "
        "bool band_scaled=False) "
        "-> (Tensor indices, Tensor scores)",
        traceable);
  m.def("quantize_fp8(Tensor x) -> (Tensor out, Tensor scale)", traceable);
  m.def("sparse_mla_fwd(Tensor q, Tensor kv, Tensor indices, float scale) -> (Tensor out, Tensor lse)", traceable);
  m.def("sparse_mla_bwd(Tensor q, Tensor kv, Tensor indices, float scale, Tensor out, Tensor lse, Tensor dout, "
        "bool deterministic) -> (Tensor dq, Tensor dkv)",
        traceable);
  m.def("sparse_mla_bwd_mass(Tensor q, Tensor kv, Tensor indices, float scale, Tensor out, Tensor lse, "
        "Tensor dout, bool deterministic) -> (Tensor dq, Tensor dkv, Tensor mass)",
        traceable);
  m.def("attention_mass(Tensor q, Tensor kv, Tensor indices, Tensor lse, float scale) -> Tensor mass", traceable);
  m.def("sparse_kl_fwd(Tensor q_idx, Tensor k_idx, Tensor weights, Tensor indices, Tensor mass, bool relu) "
        "-> (Tensor loss_rows, Tensor row_stats)",
        traceable);
  m.def("sparse_kl_bwd(Tensor q_idx, Tensor k_idx, Tensor weights, Tensor indices, Tensor mass, bool relu, "
        "Tensor grad_rows, Tensor? row_stats=None) -> (Tensor dq_idx, Tensor dk_idx, Tensor dweights)",
        traceable);
  m.def("dense_kl_fwd(Tensor q, Tensor kv, float scale, Tensor q_idx, Tensor k_idx, Tensor weights, "
        "Tensor k_start, Tensor k_end, bool relu) -> Tensor loss_rows",
        traceable);
  m.def("dense_kl_bwd(Tensor q, Tensor kv, float scale, Tensor q_idx, Tensor k_idx, Tensor weights, "
        "Tensor k_start, Tensor k_end, bool relu, Tensor grad_rows) -> (Tensor dq_idx, Tensor dk_idx, "
        "Tensor dweights)",
        traceable);
  // Build and process settings (no tensors; used by python/flashdsa/ops.py at import and by the layer).
  m.def("_built_with_cuda() -> bool", &tb::built_with_cuda_op);
  m.def("_set_range_checks(bool enabled) -> bool", &tb::set_range_checks_op);
}

TORCH_LIBRARY_IMPL(flashdsa, CPU, m) { flashdsa::torch_binding::register_kernels(m); }

#ifdef FLASHDSA_WITH_CUDA
TORCH_LIBRARY_IMPL(flashdsa, CUDA, m) { flashdsa::torch_binding::register_kernels(m); }
#endif
