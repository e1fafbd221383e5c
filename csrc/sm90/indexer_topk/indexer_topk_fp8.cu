// Hopper (sm_90a) FP8 (e4m3) selection pass of the indexer + top-k, and the e4m3 quantization:
// host side (limits, workspace, dispatch). Device code: fp8_kernel_v2.cuh (the walk for D_I = 128) and
// fp8_kernel.cuh (the first walk, D_I = 64; the quantization). Contract: docs/spec.md §3 "FP8
// selection"; design: docs/kernels/indexer_topk.md.
#include "sm90/indexer_topk/fp8.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/status_macros.h"
#include "sm90/common/cuda_check.cuh"
#include "sm90/indexer_topk/fp8_kernel.cuh"
#include "sm90/indexer_topk/fp8_kernel_v2.cuh"
#include "sm90/indexer_topk/launch.cuh"

namespace flashdsa::sm90::indexer_topk_fp8_impl {
namespace {

using detail::Check;
using indexer_topk_impl::Fp8KernelArgs;
using indexer_topk_impl::kSmemPerCtaBudget;
using indexer_topk_impl::kThreads;
using indexer_topk_impl::LaunchShape;

constexpr int kMaxCandidates = 2 * kMaxTopK;

// The first FP8 walk (fp8_kernel.cuh), instantiated for D_I = 64 only (D_I = 128 runs fp8_kernel_v2.cuh).
template <int H, int D, bool kRelu>
Status launch(const Fp8KernelArgs& args, int grid, cudaStream_t stream) {
  static_assert(indexer_topk_impl::fp8_smem_bytes<H, D>() <= static_cast<size_t>(kSmemPerCtaBudget),
                "two CTAs per SM must fit");
  constexpr int kSmem = static_cast<int>(indexer_topk_impl::fp8_smem_bytes<H, D>());
  return launch_with_smem(indexer_topk_impl::indexer_topk_fp8_kernel<H, D, kRelu>, dim3(grid), kThreads, kSmem, stream,
                          "indexer_topk_fp8_kernel", args);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Fills the e4m3 inputs of the selection pass (the counterpart of launch.cuh fill_bf16_inputs, which
// fills the re-score's bf16 inputs).
void fill_fp8_inputs(const IndexerTensors& in, Fp8KernelArgs* args) {
  args->q8 = static_cast<const uint8_t*>(in.q_idx);
  args->k8 = static_cast<const uint8_t*>(in.k_idx);
  args->q_scale = in.q_idx_scale;
  args->k_scale = in.k_idx_scale;
  args->w8 = static_cast<const float*>(in.weights);
  args->q8_st = in.q_idx_stride_t;
  args->q8_sh = in.q_idx_stride_h;
  args->k8_st = in.k_idx_stride_t;
  args->w8_st = in.weights_stride_t;
}

}  // namespace

int candidates(const IndexerTopkParams& p) { return p.candidates ? p.candidates : fp8_selection_candidates(p.K); }

// The candidate lists' capacity: C plus at least 1024 appends between compactions. (A/B builds set the
// minimum with -DFLASHDSA_FP8_MIN_CAPACITY=N: scripts/fp8_gpu.sh AB_FLAGS.)
#ifndef FLASHDSA_FP8_MIN_CAPACITY
#define FLASHDSA_FP8_MIN_CAPACITY 4096
#endif
int candidate_capacity(int C) { return std::max(FLASHDSA_FP8_MIN_CAPACITY, C + 1024); }

bool fp8v2_supports(int H, int D) { return indexer_topk_impl::fp8v2::supports_shape(H, D); }

Status supports(const IndexerTopkParams& p, const char* op) {
  const Check c{op};
  const IndexerTensors& in = p.indexer;
  if (in.dtype != DType::kFP8E4M3) return c.fail("dtype", dtype_name(in.dtype), "the FP8 selection needs kFP8E4M3");
  if (p.rescore.dtype != DType::kBF16) {
    return c.fail("rescore.dtype", dtype_name(p.rescore.dtype), "the CUDA FP8 selection re-scores from bf16");
  }
  if (p.rescore.q_idx_scale != nullptr || p.rescore.k_idx_scale != nullptr) {
    return c.fail("rescore scales", "non-null", "the re-score inputs are unquantized");
  }
  if (!is_supported_indexer_heads(in.H_I)) return c.fail("H_I", in.H_I, "must be 32 or 64 on CUDA");
  if (!is_supported_indexer_dim(in.D_I)) return c.fail("D_I", in.D_I, "must be 64 or 128 on CUDA");
  if (p.K < kTopKMultiple || p.K > kMaxTopK || p.K % kTopKMultiple != 0) {
    return c.fail("K", p.K, "must be a multiple of 64 in [64, 8192] on CUDA");
  }
  const int C = candidates(p);
  if (C % kTopKMultiple != 0 || C < p.K || C > kMaxCandidates) {
    return c.fail("candidates", C, "must be a multiple of 64 in [K, 16384] on CUDA");
  }
  if (p.rescore_band != 0 && !fp8v2_supports(in.H_I, in.D_I)) {
    return c.unsupported("rescore_band needs D_I = 128 on CUDA (got D_I " + std::to_string(in.D_I) + ")");
  }
  if (p.T == 0) return Status::OK();
  if (!aligned16(in.q_idx) || in.q_idx_stride_t % 16 != 0 || in.q_idx_stride_h % 16 != 0 ||
      (p.T_kv > 0 && (!aligned16(in.k_idx) || in.k_idx_stride_t % 16 != 0))) {
    return c.unsupported("e4m3 q_idx / k_idx rows must be 16-byte aligned (base aligned, strides multiples of 16)");
  }
  const IndexerTensors& r = p.rescore;
  if (!aligned16(r.q_idx) || r.q_idx_stride_t % 8 != 0 || r.q_idx_stride_h % 8 != 0 ||
      (p.T_kv > 0 && (!aligned16(r.k_idx) || r.k_idx_stride_t % 8 != 0))) {
    return c.unsupported("bf16 rescore q_idx / k_idx rows must be 16-byte aligned (strides multiples of 8)");
  }
  if (p.T > INT_MAX || p.T_kv > INT_MAX) return c.unsupported("T and T_kv must fit in int32");
  return Status::OK();
}

size_t workspace_size(const IndexerTopkParams& p) {
  if (p.T <= 0 || p.T > INT_MAX) return 0;
  if (!is_supported_indexer_heads(p.indexer.H_I)) return 0;
  LaunchShape shape{};
  if (!indexer_topk_impl::launch_shape(p, &shape).ok()) return 0;
  return indexer_topk_impl::workspace_bytes(shape, candidate_capacity(candidates(p)));
}

Status run(const IndexerTopkParams& p) {
  if (p.T == 0) return Status::OK();
  LaunchShape shape{};
  FLASHDSA_RETURN_IF_ERROR(indexer_topk_impl::launch_shape(p, &shape));
  const int C = candidates(p), cap = candidate_capacity(C);
  FLASHDSA_RETURN_IF_ERROR(
      indexer_topk_impl::check_workspace(p, indexer_topk_impl::workspace_bytes(shape, cap), "sm90 indexer_topk (fp8)"));
  Fp8KernelArgs args{};
  indexer_topk_impl::fill_shared_args(p, shape, cap, &args);
  fill_fp8_inputs(p.indexer, &args);
  indexer_topk_impl::fill_bf16_inputs(p.rescore, &args);
  args.C = C;
  args.band = p.rescore_band;
  args.band_scaled = p.rescore_band_scaled ? 1 : 0;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(args.block_counter, 0, sizeof(int), stream));
  static_assert(indexer_topk_impl::fp8v2::smem_bytes<32>() <= static_cast<size_t>(kSmemPerCtaBudget) &&
                    indexer_topk_impl::fp8v2::smem_bytes<64>() <= static_cast<size_t>(kSmemPerCtaBudget),
                "two FP8 v2 CTAs per SM must fit");
  const int H = p.indexer.H_I;
  const bool relu = p.indexer.relu;
  // D_I = 128 (T_kv = 0 included: an all-zero tensor map that no tile ever reads, as the bf16 kernel).
  if (indexer_topk_impl::fp8v2::supports_shape(H, p.indexer.D_I))
    return indexer_topk_impl::fp8v2::run(args, H, relu, shape.grid, stream);
  // D_I = 64 (supports() admits 64 and 128 only).
  const int grid = shape.grid;
  if (H == 32) return relu ? launch<32, 64, true>(args, grid, stream) : launch<32, 64, false>(args, grid, stream);
  return relu ? launch<64, 64, true>(args, grid, stream) : launch<64, 64, false>(args, grid, stream);
}

Status supports_quantize(const QuantizeFp8Params& p, const char* op) {
  const Check c{op};
  if (p.dtype != DType::kBF16) return c.fail("dtype", dtype_name(p.dtype), "the CUDA quantization takes bf16");
  return Status::OK();
}

Status run_quantize(const QuantizeFp8Params& p) {
  const int64_t rows = p.N0 * p.N1;
  if (rows == 0) return Status::OK();
  indexer_topk_impl::QuantizeArgs args{};
  args.x = static_cast<const __nv_bfloat16*>(p.x);
  args.out = static_cast<uint8_t*>(p.out);
  args.scale = p.scale;
  args.rows = rows;
  args.s0 = p.stride0;
  args.s1 = p.stride1;
  args.N1 = p.N1;
  args.D = p.D;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  // D_I = 128 rows at one uniform stride (N1 = 1, or N1 contiguous sub-rows per outer row), 16-byte aligned: 8
  // lanes per row (the same codes and scales as the kernels below).
  const int64_t row_stride = p.N1 == 1 ? p.stride0 : (p.N0 == 1 || p.stride0 == p.N1 * p.stride1) ? p.stride1 : -1;
  if (p.D == 128 && row_stride >= 0 && row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(p.out) % 8 == 0) {
    constexpr int kRowsPerBlock =
        indexer_topk_impl::kQuantizeThreads / 32 * 4 * indexer_topk_impl::kQuantize128Groups;
    const int64_t blocks128 = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks128 > INT_MAX) return Status::NotSupported("quantize_fp8: too many rows for one launch");
    args.N1 = 1;
    args.s0 = row_stride;
    args.s1 = 0;
    indexer_topk_impl::quantize_fp8_rows128_kernel<<<static_cast<unsigned>(blocks128),
                                                    indexer_topk_impl::kQuantizeThreads, 0, stream>>>(args);
    FLASHDSA_CHECK_LAUNCH("quantize_fp8_rows128_kernel");
    return Status::OK();
  }
  // Rows of 32 V elements (V = 4 at D_I = 128, 2 at 64) whose lane slices are aligned to one load: the vectorized
  // kernel (the same codes and scales); any other row shape or stride: one element per lane.
  const int V = p.D == 128 ? 4 : p.D == 64 ? 2 : 0;
  const bool aligned = V != 0 && reinterpret_cast<uintptr_t>(p.x) % (2 * V) == 0 && p.stride0 % V == 0 &&
                       (p.N1 == 1 || p.stride1 % V == 0) && reinterpret_cast<uintptr_t>(p.out) % V == 0;
  // Rows per block: one per warp, kQuantizeRowsPerWarp per warp in the vectorized kernel.
  const int rows_per_block =
      indexer_topk_impl::kQuantizeThreads / 32 * (aligned ? indexer_topk_impl::kQuantizeRowsPerWarp : 1);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > INT_MAX) return Status::NotSupported("quantize_fp8: too many rows for one launch");
  const dim3 grid(static_cast<unsigned>(blocks)), block(indexer_topk_impl::kQuantizeThreads);
  if (aligned) {
    if (V == 4)
      indexer_topk_impl::quantize_fp8_vec_kernel<4><<<grid, block, 0, stream>>>(args);
    else
      indexer_topk_impl::quantize_fp8_vec_kernel<2><<<grid, block, 0, stream>>>(args);
    FLASHDSA_CHECK_LAUNCH("quantize_fp8_vec_kernel");
    return Status::OK();
  }
  indexer_topk_impl::quantize_fp8_kernel<<<grid, block, 0, stream>>>(args);
  FLASHDSA_CHECK_LAUNCH("quantize_fp8_kernel");
  return Status::OK();
}

}  // namespace flashdsa::sm90::indexer_topk_fp8_impl
