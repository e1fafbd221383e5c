// Hopper (sm_90a) lightning indexer fused with exact top-k selection (docs/spec.md §3): host side
// (workspace, checks, dispatch). The kernel is in kernel_v2.cuh (its shared pieces in kernel.cuh);
// design in docs/kernels/indexer_topk.md.
#include "sm90/indexer_topk/indexer_topk.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "sm90/common/cuda_check.cuh"
#include "sm90/heuristics.h"
#include "sm90/indexer_topk/kernel.cuh"
#include "sm90/indexer_topk/kernel_v2.cuh"
#include "sm90/indexer_topk/launch.cuh"
#include "sm90/backend.h"

namespace flashdsa::sm90::indexer_topk_impl {
namespace {

bool supported_shape(const IndexerTopkParams& p) {
  return (p.indexer.H_I == 32 || p.indexer.H_I == 64) && (p.indexer.D_I == 64 || p.indexer.D_I == 128);
}

}  // namespace

int default_candidate_capacity(int K) { return tuning::topk_candidate_capacity(K); }

size_t workspace_size(const IndexerTopkParams& p, int candidate_capacity) {
  if (p.T <= 0 || p.T > INT_MAX || !supported_shape(p)) return 0;
  LaunchShape shape{};
  if (!launch_shape(p, &shape).ok()) return 0;
  return workspace_bytes(shape, candidate_capacity);
}

Status run(const IndexerTopkParams& p, int candidate_capacity) {
  if (p.T == 0) return Status::OK();
  if (candidate_capacity % 64 != 0 || candidate_capacity < p.K + kMinCapacitySlack)
    return Status::InvalidArgument("sm90 indexer_topk: candidate capacity must be a multiple of 64 and >= K + " +
                                   std::to_string(kMinCapacitySlack));

  LaunchShape shape{};
  const Status st = launch_shape(p, &shape);
  if (!st.ok()) return st;
  const Status ws_st = check_workspace(p, workspace_bytes(shape, candidate_capacity), "sm90 indexer_topk");
  if (!ws_st.ok()) return ws_st;

  KernelArgs args{};
  fill_shared_args(p, shape, candidate_capacity, &args);
  fill_bf16_inputs(p.indexer, &args);

  const auto stream = static_cast<cudaStream_t>(p.stream);
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(args.block_counter, 0, sizeof(int), stream));
  static_assert(v2::smem_bytes<32, 128>() <= static_cast<size_t>(kSmemPerCtaBudget) &&
                    v2::smem_bytes<64, 128>() <= static_cast<size_t>(kSmemPerCtaBudget),
                "two CTAs per SM must fit");
  return v2::run(args, p.indexer.H_I, p.indexer.D_I, p.indexer.relu, shape.grid, stream);
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
