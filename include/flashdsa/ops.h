// FlashDSA: the DSA operators (see docs/architecture.md and docs/spec.md §3-§6).
//
// Conventions shared by every op:
//  - One params struct per op, composed of the named parts below (AttentionTensors,
//    IndexerTensors, TopkIndices) and the op's own fields. Pointers carry a shape comment; strides are in elements and
//    only the listed ones may differ from the contiguous value (the last dimension is always
//    contiguous). Outputs are contiguous.
//  - "act" = the activation dtype (attn.dtype / indexer.dtype) (bf16 in production; fp32/fp64 on the CPU backend only).
//    "stat" = stat_dtype(act): fp64 when act is fp64, else fp32.
//  - Key ranges: query row t may see key rows s with k_start[t] <= s < k_end[t] (int32 [T]).
//  - Top-k indices: int32 [T, K]; any entry outside [0, T_kv) (e.g. -1) is an empty slot and is
//    never read.
//  - Every entry point validates its params on the host first and returns kInvalidArgument with
//    a message naming the offending field, or kNotSupported when no backend of this build runs on
//    `device` (a build without CUDA, or a GPU that is not compute capability 9.0). Then it runs on
//    `device` (on `stream` for CUDA) and returns; CUDA calls are asynchronous.
//  - Outputs are fully written by the op (no need to zero them first).
//  - A tensor with no elements may be null. Strides: stride_h >= D and stride_t >= (H-1)*stride_h + D
//    (dimensions of size <= 1 are not checked). The CUDA backend also needs 16-byte aligned rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdsa/status.h"
#include "flashdsa/types.h"

namespace flashdsa {

// The production sizes of docs/spec.md §2: the sm90 backend runs exactly these (its limits are in
// csrc/sm90/backend.cpp). The CPU backend accepts these and more, so that tests and references run
// at tiny sizes (csrc/cpu/backend.cpp): H, H_I in [1, 128], D_I a multiple of 8 in [8, 256], D_qk a
// multiple of 8 in [8, 1024], D_v in [1, D_qk], any K in [1, 8192], and fp32/fp64 activations
// besides bf16. Code that must also run on CUDA should stay within the CUDA limits below.
constexpr int kDqk = 576;  // latent key width (512 latent + 64 RoPE); CUDA: exactly this
constexpr int kDv = 512;   // value width = first kDv columns of kv; CUDA: exactly this
constexpr int kMaxTopK = 8192;      // both backends
constexpr int kTopKMultiple = 64;   // CUDA only
bool is_supported_heads(int h);          // H   in {16, 32, 64, 128} (CUDA); the CPU backend takes 1..128
bool is_supported_indexer_heads(int h);  // H_I in {32, 64} (CUDA); the CPU backend takes 1..128
bool is_supported_indexer_dim(int d);    // D_I in {64, 128} (CUDA); the CPU backend: multiples of 8 up to 256

// Fields present in every params struct.
struct CallContext {
  Device device = Device::kCPU;
  void* stream = nullptr;  // cudaStream_t for kCUDA (nullptr = default stream); ignored on CPU
  // For kCUDA: copy k_start/k_end to the host and check them (synchronizes the stream).
  // Callers that built the ranges themselves (the PyTorch layer) may turn this off.
  bool check_ranges = true;
};

// ---------------------------------------------------------------------------------------------
// The parts the params structs are composed of (C++ API 0.2, docs/architecture.md). Each part has
// one generic validator (csrc/common/validate.cpp), one torch filler (csrc/torch/tensor_utils.h),
// one CPU view (csrc/cpu/op_inputs.h) and one test builder (tests/cpp/problem.h).

// Main-attention inputs: q [T, H, D_qk] and kv [T_kv, D_qk] (the value is kv[:, :D_v]), and the
// softmax scale. D_v is read by the sparse MLA forward/backward only.
struct AttentionTensors {
  DType dtype = DType::kBF16;    // of q, kv (and of the op's activation outputs: out, dq)
  const void* q = nullptr;       // [T, H, D_qk] act; strides q_stride_t, q_stride_h
  const void* kv = nullptr;      // [T_kv, D_qk] act; stride kv_stride_t
  int H = 0;
  int D_qk = kDqk, D_v = kDv;
  int64_t q_stride_t = 0, q_stride_h = 0, kv_stride_t = 0;
  float scale = 0.f;
};

// Lightning-indexer inputs: q_idx [T, H_I, D_I], k_idx [T_kv, D_I], weights [T, H_I] (stat dtype
// of `dtype`), and the score activation f (relu or identity).
// The indexer has its own dtype and dequantization scales so that the fp8 selection pass fits this
// struct: with dtype kFP8E4M3 (indexer_topk only), q_idx / k_idx hold e4m3 values (from
// run_quantize_fp8) and q_idx_scale [T, H_I] and k_idx_scale [T_kv] (fp32, contiguous, > 0 or NaN)
// multiply q_idx[t,h] . k_idx[s]; both are required then, and must be null for any other dtype.
struct IndexerTensors {
  DType dtype = DType::kBF16;    // of q_idx, k_idx (and dq_idx)
  const void* q_idx = nullptr;   // [T, H_I, D_I] act; strides q_idx_stride_t, q_idx_stride_h
  const void* k_idx = nullptr;   // [T_kv, D_I] act; stride k_idx_stride_t
  const void* weights = nullptr; // [T, H_I] stat; stride weights_stride_t
  const float* q_idx_scale = nullptr;  // [T, H_I] fp32, contiguous: kFP8E4M3 only (required then)
  const float* k_idx_scale = nullptr;  // [T_kv] fp32, contiguous: kFP8E4M3 only (required then)
  int H_I = 0, D_I = 0;
  bool relu = true;
  int64_t q_idx_stride_t = 0, q_idx_stride_h = 0, k_idx_stride_t = 0, weights_stride_t = 0;
};

// Top-k indices [T, K] read by an op (row stride stride_t); entries outside [0, T_kv) are empty slots.
struct TopkIndices {
  const int32_t* indices = nullptr;  // [T, K]; stride stride_t
  int64_t stride_t = 0;
  int K = 0;
};

// ---------------------------------------------------------------------------------------------
// §3 Lightning indexer + top-k.
//   score(t, s) = sum_h weights[t,h] * f(q_idx[t,h] . k_idx[s]),  f = relu if indexer.relu else identity
// for s in [k_start[t], k_end[t]); keeps the K largest. Order inside a row is unspecified;
// rows with fewer than K visible keys hold all of them followed by -1 (score -inf).
// (The CPU backend writes the selected keys in increasing key order; ties prefer the smaller key.)
//
// FP8 selection (indexer.dtype == kFP8E4M3; docs/spec.md §3 "FP8 selection"): the selection pass
// scores every visible key from the quantized inputs,
//   score8(t, s) = k_idx_scale[s] * sum_h weights[t,h] * q_idx_scale[t,h] * f(q^[t,h] . k^[s]),
// keeps the C = min(candidates, visible) best keys by score8 (NaN first, then larger, then smaller
// key), re-scores those C keys exactly from `rescore` (the unquantized tensors: the §3 score in
// the stat dtype of rescore.dtype) and returns the K best of them, with their exact scores, as the
// op returns them for `rescore` alone. `indices`/`scores` are then those of rescore.dtype.
struct IndexerTopkParams : CallContext {
  IndexerTensors indexer;
  // FP8 selection only (ignored otherwise): the unquantized indexer tensors (bf16; the CPU also
  // takes fp32/fp64) with the same H_I, D_I and relu as `indexer`, and the candidate count
  // (0 = fp8_selection_candidates(K); else in [K, 16384]).
  IndexerTensors rescore;
  int candidates = 0;
  const int32_t* k_start = nullptr;  // [T]
  const int32_t* k_end = nullptr;    // [T]
  int32_t* indices = nullptr;    // [T, K] out, contiguous
  void* scores = nullptr;        // [T, K] stat out, optional (nullptr = not written)
  int64_t T = 0, T_kv = 0;
  int K = 0;
  void* workspace = nullptr;     // CUDA only: indexer_topk_workspace_size() bytes
  size_t workspace_bytes = 0;
  // FP8 selection only: 0 (default) = every candidate re-scored exactly (the returned scores are exact);
  // b in [1, K - 1] = the band re-score (docs/spec.md §3): when a row has more than K candidates, its K - b best
  // by the FP8 score are returned as they are, only the other candidates are re-scored exactly and the b best of
  // them join. Indices only: requires scores == nullptr. (CUDA: D_I = 128.)
  int rescore_band = 0;
  // With rescore_band only: false (default) = every row takes the band b and the slack C - K as given; true = the
  // band scaled to the row's key count (docs/spec.md §3 "Band scaled by the row's keys"): a row with n > K visible
  // keys takes the band fp8_row_band_part(b, n, K) and the candidates fp8_row_candidates(C, n, K), at most b and C.
  bool rescore_band_scaled = false;
};

// The default candidate count of the FP8 selection: K + max(64 * ceil(K / 256), 256), i.e. K plus a
// quarter of K rounded up to a multiple of 64, at least 256 (docs/spec.md §3). A multiple of 64
// whenever K is (the CUDA limit).
constexpr int fp8_selection_candidates(int K) { return K + (64 * ((K + 255) / 256) > 256 ? 64 * ((K + 255) / 256) : 256); }

// The share (in 64ths) of the band and of the slack that a row with n > K visible keys re-scores when the band is
// scaled to its keys (rescore_band_scaled; docs/spec.md §3): the density of n Gaussian scores at the row's K-th best,
// n * phi(Phi^-1(1 - K / n)), relative to that of a row of 32 K keys, taken at the upper end of n's bracket
// (n / K in (1, 2], (2, 3], (3, 4], (4, 6], (6, 8], (8, 12], (12, 16], (16, 24]; beyond 24: the whole band) and
// rounded up to 64ths. The number of keys whose FP8 rank an FP8 score error of a given size can move across the
// cut grows with that density, so a shorter row needs a narrower band for the same recall. Integer brackets: the
// CPU and CUDA backends take the same band for every row.
constexpr int fp8_band_share64(long long n, int K) {
  const long long k = K;
  return n <= 2 * k ? 23 : n <= 3 * k ? 31 : n <= 4 * k ? 37 : n <= 6 * k ? 43 : n <= 8 * k ? 47
       : n <= 12 * k ? 53 : n <= 16 * k ? 56 : n <= 24 * k ? 61 : 64;
}
// ceil(width * share / 64) of fp8_band_share64(n, K): the band (width = b) or the slack (width = C - K) of a row
// with n > K visible keys when the band is scaled to its keys; at least 1 for width >= 1, at most width.
constexpr int fp8_row_band_part(int width, long long n, int K) {
  return static_cast<int>((static_cast<long long>(width) * fp8_band_share64(n, K) + 63) / 64);
}
// The candidate count C_n = K + fp8_row_band_part(C - K, n, K) of a row with n > K visible keys when the band is scaled
// to its keys (the slack scaled as the band).
constexpr int fp8_row_candidates(int C, long long n, int K) { return K + fp8_row_band_part(C - K, n, K); }

// ---------------------------------------------------------------------------------------------
// FP8 (e4m3) quantization of indexer rows (docs/spec.md §3 "FP8 selection"). For every row r of
// D elements of x [N0, N1, D] (strides stride0, stride1; k_idx is [T_kv, 1, D]):
//   amax = max_i |fp32(x[r, i])|;  scale[r] = amax / 448 (fp32), or 1 when amax == 0;
//   out[r, i] = e4m3(fp32(x[r, i]) / scale[r])   (round to nearest even, fp32 division)
// A row with a NaN or +-Inf element (after the conversion to fp32) gets scale NaN and all-NaN
// codes (0x7f), so every score it enters is NaN (docs/reliability.md). A scale that underflows
// fp32 (fp64 inputs only) is treated as a zero row.
struct QuantizeFp8Params : CallContext {
  DType dtype = DType::kBF16;  // of x (bf16 on CUDA; the CPU also takes fp32 / fp64)
  const void* x = nullptr;     // [N0, N1, D]; strides stride0, stride1 (last dimension contiguous)
  int64_t N0 = 0;
  int N1 = 1, D = 0;
  int64_t stride0 = 0, stride1 = 0;
  void* out = nullptr;         // [N0, N1, D] e4m3 out, contiguous
  float* scale = nullptr;      // [N0, N1] fp32 out, contiguous
};

// ---------------------------------------------------------------------------------------------
// §4 Sparse MLA forward.
//   s_j = scale * q[t,h] . kv[idx_j];  lse = log sum_j exp(s_j);  out = sum_j exp(s_j - lse) V[idx_j]
// Rows with no valid index: out = 0, lse = -inf.
struct SparseMlaFwdParams : CallContext {
  AttentionTensors attn;
  TopkIndices topk;
  void* out = nullptr;           // [T, H, D_v] act out
  void* lse = nullptr;           // [T, H] stat out (natural log)
  int64_t T = 0, T_kv = 0;
};

// ---------------------------------------------------------------------------------------------
// §5 Sparse MLA backward. With P_j = exp(s_j - lse), Delta = rowsum(dout*out),
// dS_j = P_j (dout . V[idx_j] - Delta):
//   dq[t,h] = scale sum_j dS_j kv[idx_j];  dkv[idx_j] += scale dS_j q[t,h];  dkv[idx_j,:D_v] += P_j dout
struct SparseMlaBwdParams : CallContext {
  AttentionTensors attn;
  TopkIndices topk;
  const void* out = nullptr;     // [T, H, D_v] act, contiguous (the forward's output)
  const void* lse = nullptr;     // [T, H] stat, contiguous (the forward's lse)
  const void* dout = nullptr;    // [T, H, D_v] act, contiguous
  void* dq = nullptr;            // [T, H, D_qk] act out
  void* dkv = nullptr;           // [T_kv, D_qk] stat out (rows never selected are 0)
  int64_t T = 0, T_kv = 0;
  bool deterministic = false;    // bitwise-reproducible dkv (the CPU backend always is)
  // Optional [T, K] stat out, contiguous (16-byte aligned on CUDA): when non-null, the op also
  // writes the head-summed attention mass of every slot, exactly what run_attention_mass() computes
  // (0 for empty slots), from the P = exp(scale S - lse) it forms anyway. The indexer KL loss can
  // then run after the backward without the mass recompute (python: the layer's training path).
  void* mass = nullptr;
  void* workspace = nullptr;     // CUDA only: sparse_mla_bwd_workspace_size() bytes
  size_t workspace_bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// §6 Attention mass (sparse KL target, unnormalized):
//   mass[t,j] = sum_h exp(scale q[t,h] . kv[idx_j] - lse[t,h]);  0 for empty slots
struct AttnMassParams : CallContext {
  AttentionTensors attn;         // attn.D_v is not read
  TopkIndices topk;
  const void* lse = nullptr;     // [T, H] stat, contiguous
  void* mass = nullptr;          // [T, K] stat out
  int64_t T = 0, T_kv = 0;
};

// ---------------------------------------------------------------------------------------------
// §6 Sparse indexer KL loss. Support of row t = its valid top-k slots.
//   target = mass / sum_j mass;  p_I = softmax_j score(t, idx_j);
//   loss_rows[t] = sum_j target (log target - log p_I)   (0 log 0 = 0; 0 for an empty support)
// Backward: d score(t, idx_j) = grad_rows[t] * (p_I - target), propagated to q_idx, k_idx, weights.
// The caller reduces: loss = coeff * mean over rows with a non-empty support, so it passes
// grad_rows[t] = grad_loss * coeff / N (or a constant via grad_scale, see below).
// A row whose mass sums to exactly 0 gets loss 0 and zero gradients.
// "stat" here is stat_dtype(indexer.dtype).
struct SparseKlParams : CallContext {
  IndexerTensors indexer;
  TopkIndices topk;
  const void* mass = nullptr;    // [T, K] stat, contiguous: unnormalized target (attention mass)
  int64_t T = 0, T_kv = 0;
  // forward output
  void* loss_rows = nullptr;     // [T] stat out (fwd)
  // Optional per-row statistics [T, 2] stat, contiguous: {log-sum-exp over the support of the scores,
  // sum of the mass over the support}; {-inf, 0} for a row without a target (empty support or zero
  // mass). The forward writes it when non-null. The backward, when non-null, takes it as the
  // forward's output for the same inputs and skips recomputing it (CUDA: one pass over the keys
  // instead of two; CPU: ignored).
  void* row_stats = nullptr;
  // backward: per-row upstream gradient, d total / d loss_rows[t] = grad_scale * (grad_rows ? grad_rows[t] : 1)
  double grad_scale = 1.0;
  const void* grad_rows = nullptr;  // [T] stat, optional
  void* dq_idx = nullptr;        // [T, H_I, D_I] act out (bwd)
  void* dk_idx = nullptr;        // [T_kv, D_I] stat out (bwd; CPU: deterministic; CUDA: fp32 atomics)
  void* dweights = nullptr;      // [T, H_I] stat out (bwd)
};

// ---------------------------------------------------------------------------------------------
// §6 Dense indexer KL loss (warm-up stage). Support = all visible keys [k_start, k_end).
//   target[t,s] = (1/H) sum_h softmax_s(scale q[t,h] . kv[s])  (dense main attention, head-mean)
//   p_I[t,s] = softmax_s score(t, s);  loss_rows[t] = sum_s target (log target - log p_I)
// Same backward as the sparse formulation, over the dense support. Nothing T x T is stored.
// attn.dtype and indexer.dtype must be equal ("act"); attn.D_v is not read.
struct DenseKlParams : CallContext {
  AttentionTensors attn;
  IndexerTensors indexer;
  const int32_t* k_start = nullptr;  // [T]
  const int32_t* k_end = nullptr;    // [T]
  int64_t T = 0, T_kv = 0;
  void* loss_rows = nullptr;     // [T] stat out (fwd)
  double grad_scale = 1.0;       // as in SparseKlParams
  const void* grad_rows = nullptr;  // [T] stat, optional
  void* dq_idx = nullptr;        // [T, H_I, D_I] act out (bwd)
  void* dk_idx = nullptr;        // [T_kv, D_I] stat out (bwd)
  void* dweights = nullptr;      // [T, H_I] stat out (bwd)
};

// ---------------------------------------------------------------------------------------------
// Validation (host side; what every entry point runs first). Exposed for tests and bindings.
// validate() finds the backend of p.device (kNotSupported when this build or this CUDA device has
// none), checks the backend's limits (sizes, dtypes, alignment) and the generic conditions (pointers,
// strides, key ranges); it checks everything except the workspace, whose size is only defined for
// valid params: the entry points of the two ops with a workspace also run validate_workspace().
Status validate(const IndexerTopkParams& p);
Status validate(const SparseMlaFwdParams& p);
Status validate(const SparseMlaBwdParams& p);
Status validate(const AttnMassParams& p);
Status validate_fwd(const SparseKlParams& p);
Status validate_bwd(const SparseKlParams& p);
Status validate_fwd(const DenseKlParams& p);
Status validate_bwd(const DenseKlParams& p);
Status validate_workspace(const IndexerTopkParams& p);
Status validate_workspace(const SparseMlaBwdParams& p);
Status validate(const QuantizeFp8Params& p);

// Entry points.
Status run_indexer_topk(const IndexerTopkParams& p);
Status run_sparse_mla_fwd(const SparseMlaFwdParams& p);
Status run_sparse_mla_bwd(const SparseMlaBwdParams& p);
Status run_attention_mass(const AttnMassParams& p);
Status run_sparse_kl_fwd(const SparseKlParams& p);
Status run_sparse_kl_bwd(const SparseKlParams& p);
Status run_dense_kl_fwd(const DenseKlParams& p);
Status run_dense_kl_bwd(const DenseKlParams& p);
Status run_quantize_fp8(const QuantizeFp8Params& p);

// Workspace (bytes) a CUDA call needs; 0 on the CPU.
size_t indexer_topk_workspace_size(const IndexerTopkParams& p);
size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p);

// Whether this build contains CUDA kernels (FLASHDSA_WITH_CUDA). A CUDA call still needs a device
// one of them targets (compute capability 9.0): on any other, every op returns kNotSupported with
// a message naming the device.
bool built_with_cuda();

}  // namespace flashdsa
