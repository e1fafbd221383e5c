// FlashDSA benchmark suite: a minimal PyTorch op around FlashMLA's SM90 sparse prefill forward, so
// that the suite can time FlashMLA without compiling FlashMLA's whole extension (its decode and SM100
// kernels). Built on the GPU machine by bench/peers/build_flashmla.py against a FlashMLA source tree
// that scripts/peers_stage.sh / scripts/peers_gpu.sh bring there; FlashMLA itself is not part of this
// repository. The op mirrors the contract of flash_mla.flash_mla_sparse_fwd:
//
//   flashdsa_peer_flashmla::sparse_prefill_fwd(q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16,
//       indices [s_q, 1, topk] int32 (-1 = empty), sm_scale, d_v = 512,
//       attn_sink [h_q] fp32 = None, topk_length [s_q] int32 = None) -> (out, max_logits, lse)
//
// With topk_length it runs FlashMLA's HAVE_TOPK_LENGTH instantiation (phase1_k576_topklen.cu), which
// build_flashmla.py compiles when the source tree has it (Megatron's cudnn backend passes both
// arguments, through bench/peers/flash_mla_shim).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "params.h"
#include "sm90/prefill/sparse/phase1.h"

namespace {

int to_int(int64_t v, const char* what) {
    TORCH_CHECK(v <= std::numeric_limits<int>::max(), "flashmla peer: ", what, " exceeds int32: ", v);
    return static_cast<int>(v);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_prefill_fwd(const at::Tensor& q, const at::Tensor& kv,
                                                                  const at::Tensor& indices, double sm_scale,
                                                                  int64_t d_v,
                                                                  const c10::optional<at::Tensor>& attn_sink,
                                                                  const c10::optional<at::Tensor>& topk_length) {
    TORCH_CHECK(q.is_cuda() && kv.is_cuda() && indices.is_cuda(), "flashmla peer: CUDA tensors expected");
    TORCH_CHECK(q.dim() == 3 && kv.dim() == 3 && indices.dim() == 3,
                "flashmla peer: q [s_q, h_q, d_qk], kv [s_kv, 1, d_qk], indices [s_q, 1, topk] expected");
    TORCH_CHECK(q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16, "flashmla peer: bf16 q, kv");
    TORCH_CHECK(indices.scalar_type() == at::kInt, "flashmla peer: int32 indices");
    const int s_q = to_int(q.size(0), "s_q"), h_q = to_int(q.size(1), "h_q"), d_qk = to_int(q.size(2), "d_qk");
    const int s_kv = to_int(kv.size(0), "s_kv"), h_kv = to_int(kv.size(1), "h_kv");
    const int topk = to_int(indices.size(2), "topk");
    TORCH_CHECK(d_qk == 576, "flashmla peer: built for d_qk = 576 only, got ", d_qk);
    TORCH_CHECK(d_v == 512, "flashmla peer: d_v must be 512, got ", d_v);
    TORCH_CHECK(h_kv == 1 && kv.size(2) == d_qk, "flashmla peer: kv must be [s_kv, 1, ", d_qk, "]");
    TORCH_CHECK(h_q == 64 || h_q == 128, "flashmla peer: h_q must be 64 or 128, got ", h_q);
    TORCH_CHECK(indices.size(0) == s_q && indices.size(1) == h_kv, "flashmla peer: indices must be [s_q, 1, topk]");
    TORCH_CHECK(q.stride(2) == 1 && kv.stride(2) == 1 && indices.stride(2) == 1,
                "flashmla peer: the last dimension of q, kv and indices must be contiguous");
    const auto props = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(props->major == 9 && props->minor == 0, "flashmla peer: needs an SM90 GPU");

    c10::cuda::CUDAGuard guard(q.device());
    at::Tensor out = at::empty({s_q, h_q, d_v}, q.options());
    at::Tensor lse = at::empty({s_q, h_q}, q.options().dtype(at::kFloat));
    at::Tensor max_logits = at::empty({s_q, h_q}, q.options().dtype(at::kFloat));

    SparseAttnFwdParams params{};
    params.s_q = s_q;
    params.s_kv = s_kv;
    params.h_q = h_q;
    params.h_kv = h_kv;
    params.d_qk = d_qk;
    params.d_v = static_cast<int>(d_v);
    params.topk = topk;
    params.sm_scale = static_cast<float>(sm_scale);
    params.sm_scale_div_log2 = static_cast<float>(sm_scale) * 1.44269504f;  // scale · log2(e)
    params.q = reinterpret_cast<cutlass::bfloat16_t*>(q.data_ptr());
    params.kv = reinterpret_cast<cutlass::bfloat16_t*>(kv.data_ptr());
    params.indices = indices.data_ptr<int>();
    params.attn_sink = nullptr;
    params.topk_length = nullptr;
    if (attn_sink.has_value()) {
        const at::Tensor& sink = *attn_sink;
        TORCH_CHECK(sink.is_cuda() && sink.scalar_type() == at::kFloat && sink.dim() == 1 && sink.size(0) == h_q &&
                        sink.is_contiguous(),
                    "flashmla peer: attn_sink must be a contiguous fp32 CUDA tensor [h_q]");
        params.attn_sink = sink.data_ptr<float>();
    }
    if (topk_length.has_value()) {
        const at::Tensor& len = *topk_length;
        TORCH_CHECK(len.is_cuda() && len.scalar_type() == at::kInt && len.dim() == 1 && len.size(0) == s_q &&
                        len.is_contiguous(),
                    "flashmla peer: topk_length must be a contiguous int32 CUDA tensor [s_q]");
        params.topk_length = len.data_ptr<int>();
    }
    params.stride_q_s_q = to_int(q.stride(0), "q stride");
    params.stride_q_h_q = to_int(q.stride(1), "q stride");
    params.stride_kv_s_kv = to_int(kv.stride(0), "kv stride");
    params.stride_kv_h_kv = to_int(kv.stride(1), "kv stride");
    params.stride_indices_s_q = to_int(indices.stride(0), "indices stride");
    params.stride_indices_h_kv = to_int(indices.stride(1), "indices stride");
    params.out = reinterpret_cast<cutlass::bfloat16_t*>(out.data_ptr());
    params.max_logits = max_logits.data_ptr<float>();
    params.lse = lse.data_ptr<float>();
    params.num_sm = props->multiProcessorCount;
    params.stream = at::cuda::getCurrentCUDAStream().stream();
    if (params.topk_length != nullptr) {
#ifdef FLASHDSA_PEER_FLASHMLA_TOPKLEN
        sm90::fwd::run_fwd_phase1_kernel<576, true>(params);
#else
        TORCH_CHECK(false, "flashmla peer: built without phase1_k576_topklen.cu; topk_length is not supported");
#endif
    } else {
        sm90::fwd::run_fwd_phase1_kernel<576, false>(params);
    }
    return {out, max_logits, lse};
}

}  // namespace

TORCH_LIBRARY(flashdsa_peer_flashmla, m) {
    m.def("sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink=None, "
          "Tensor? topk_length=None) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashdsa_peer_flashmla, CUDA, m) { m.impl("sparse_prefill_fwd", &sparse_prefill_fwd); }
