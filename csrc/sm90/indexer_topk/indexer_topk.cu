// Hopper (sm_90a) lightning indexer fused with exact top-k selection (docs/spec.md §3): host side
// (workspace, checks, dispatch). The kernel is in kernel.cuh; design in docs/kernels/indexer_topk.md.
#include "sm90/indexer_topk/indexer_topk.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "sm90/common/cuda_check.cuh"
#include "sm90/heuristics.h"
#include "sm90/indexer_topk/kernel.cuh"
#if defined(FLASHDSA_INDEXER_V2) && FLASHDSA_INDEXER_V2
#include "sm90/indexer_topk/kernel_v2.cuh"  // compile-time variant: two warpgroups, TMA key ring
#endif
#include "sm90/backend.h"

namespace flashdsa::sm90::indexer_topk_impl {
namespace {

constexpr size_t kCounterBytes = 256;  // workspace header: the block scheduler's counter
constexpr int kSmemPerCtaBudget = 228 * 1024 / kCtasPerSm - 1024;  // per-CTA share minus the reserved 1 KB

template <int H, int D, bool kRelu>
Status launch(const KernelArgs& args, int grid, cudaStream_t stream) {
  static_assert(smem_bytes<H, D>() <= static_cast<size_t>(kSmemPerCtaBudget), "two CTAs per SM must fit");
  constexpr int kSmem = static_cast<int>(smem_bytes<H, D>());
  return launch_with_smem(indexer_topk_kernel<H, D, kRelu>, dim3(grid), kThreads, kSmem, stream, "indexer_topk_kernel",
                          args);
}

template <int H, int D>
Status launch_relu(bool relu, const KernelArgs& args, int grid, cudaStream_t stream) {
  return relu ? launch<H, D, true>(args, grid, stream) : launch<H, D, false>(args, grid, stream);
}

template <int H>
Status launch_dim(int d, bool relu, const KernelArgs& args, int grid, cudaStream_t stream) {
  return d == 64 ? launch_relu<H, 64>(relu, args, grid, stream) : launch_relu<H, 128>(relu, args, grid, stream);
}

bool supported_shape(const IndexerTopkParams& p) {
  return (p.indexer.H_I == 32 || p.indexer.H_I == 64) && (p.indexer.D_I == 64 || p.indexer.D_I == 128);
}

// CTA slots of a full wave on the current device (the grid never exceeds it).
Status wave_slots(int* slots) {
  int sms = 0;
  const Status st = tuning::sm_count(&sms);
  if (!st.ok()) return st;
  *slots = kCtasPerSm * sms;
  return Status::OK();
}

struct LaunchShape {
  int tokens;      // query rows per block
  int num_blocks;  // blocks of query rows
  int grid;        // persistent CTAs
};

Status launch_shape(const IndexerTopkParams& p, LaunchShape* shape) {
  int slots = 0;
  const Status st = wave_slots(&slots);
  if (!st.ok()) return st;
  shape->tokens = kCols / p.indexer.H_I;
  shape->num_blocks = static_cast<int>((p.T + shape->tokens - 1) / shape->tokens);
  shape->grid = std::min(shape->num_blocks, slots);
  return Status::OK();
}

size_t list_bytes(const LaunchShape& s, int cap) {
  return static_cast<size_t>(s.grid) * s.tokens * cap * sizeof(float);
}

}  // namespace

int default_candidate_capacity(int K) { return tuning::topk_candidate_capacity(K); }

size_t workspace_size(const IndexerTopkParams& p, int candidate_capacity) {
  if (p.T <= 0 || p.T > INT_MAX || !supported_shape(p)) return 0;
  LaunchShape shape{};
  if (!launch_shape(p, &shape).ok()) return 0;
  return kCounterBytes + 2 * list_bytes(shape, candidate_capacity);  // scores + key indices
}

Status run(const IndexerTopkParams& p, int candidate_capacity) {
  if (p.T == 0) return Status::OK();
  if (candidate_capacity % 64 != 0 || candidate_capacity < p.K + kMinCapacitySlack)
    return Status::InvalidArgument("sm90 indexer_topk: candidate capacity must be a multiple of 64 and >= K + " +
                                   std::to_string(kMinCapacitySlack));

  LaunchShape shape{};
  const Status st = launch_shape(p, &shape);
  if (!st.ok()) return st;
  const size_t need = kCounterBytes + 2 * list_bytes(shape, candidate_capacity);
  if (p.workspace == nullptr || p.workspace_bytes < need)
    return Status::InvalidArgument("sm90 indexer_topk: workspace needs " + std::to_string(need) + " bytes, got " +
                                   std::to_string(p.workspace_bytes));

  char* ws = static_cast<char*>(p.workspace);
  KernelArgs args{};
  args.q = static_cast<const __nv_bfloat16*>(p.indexer.q_idx);
  args.k = static_cast<const __nv_bfloat16*>(p.indexer.k_idx);
  args.w = static_cast<const float*>(p.indexer.weights);
  args.k_start = p.k_start;
  args.k_end = p.k_end;
  args.out_idx = p.indices;
  args.out_scores = static_cast<float*>(p.scores);
  args.block_counter = reinterpret_cast<int*>(ws);
  args.cand_scores = reinterpret_cast<float*>(ws + kCounterBytes);
  args.cand_idx = reinterpret_cast<int32_t*>(ws + kCounterBytes + list_bytes(shape, candidate_capacity));
  args.q_st = p.indexer.q_idx_stride_t;
  args.q_sh = p.indexer.q_idx_stride_h;
  args.k_st = p.indexer.k_idx_stride_t;
  args.w_st = p.indexer.weights_stride_t;
  args.T = static_cast<int>(p.T);
  args.T_kv = static_cast<int>(p.T_kv);
  args.K = p.K;
  args.cap = candidate_capacity;
  args.num_blocks = shape.num_blocks;

  const auto stream = static_cast<cudaStream_t>(p.stream);
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(args.block_counter, 0, sizeof(int), stream));
#if defined(FLASHDSA_INDEXER_V2) && FLASHDSA_INDEXER_V2
  static_assert(v2::smem_bytes<32, 128>() <= static_cast<size_t>(kSmemPerCtaBudget) &&
                    v2::smem_bytes<64, 128>() <= static_cast<size_t>(kSmemPerCtaBudget),
                "two v2 CTAs per SM must fit");
  return v2::run(args, p.indexer.H_I, p.indexer.D_I, p.indexer.relu, shape.grid, stream);
#else
  return p.indexer.H_I == 32 ? launch_dim<32>(p.indexer.D_I, p.indexer.relu, args, shape.grid, stream)
                     : launch_dim<64>(p.indexer.D_I, p.indexer.relu, args, shape.grid, stream);
#endif
}

}  // namespace flashdsa::sm90::indexer_topk_impl

namespace flashdsa::sm90 {

Status indexer_topk(const IndexerTopkParams& p) {
  return indexer_topk_impl::run(p, indexer_topk_impl::default_candidate_capacity(p.K));
}

size_t indexer_topk_workspace_size(const IndexerTopkParams& p) {
  return indexer_topk_impl::workspace_size(p, indexer_topk_impl::default_candidate_capacity(p.K));
}

}  // namespace flashdsa::sm90
