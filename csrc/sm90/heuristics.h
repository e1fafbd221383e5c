// Internal: the host-side scheduling heuristics of the sm90 backend in one place: grid sizing,
// workspace chunking and the thresholds that switch a kernel's strategy. The numbers were tuned on
// an H200 (docs/perf-notes.md); a change here changes performance, never results. (Compile-time tile
// shapes, ring depths and register budgets stay with their kernels: each op's config.h / kernel.cuh.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "flashdsa/status.h"
#include "sm90/common/cuda_check.cuh"

namespace flashdsa::sm90::tuning {

// Streaming multiprocessors of the current device (grid sizing: a "wave" of resident CTAs).
inline Status sm_count(int* sms) {
  int device = 0;
  FLASHDSA_CUDA_TRY(cudaGetDevice(&device));
  FLASHDSA_CUDA_TRY(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
  return Status::OK();
}

// ---- indexer top-k (csrc/sm90/indexer_topk) ------------------------------------------------------
// Candidate list capacity per query row: K plus room for one more K (at least 2048) of appends
// between compactions; larger lists compact less often, smaller ones fit the register-resident
// selection (select.cuh kResidentElems = 4096 = 2048 + 2048).
inline int topk_candidate_capacity(int K) { return K + std::max(K, 2048); }
// The persistent grid is min(blocks of query rows, CTAs per SM x SMs): one full wave.

// ---- sparse MLA backward (csrc/sm90/sparse_mla_bwd) ----------------------------------------------
// Fast mode sorts each row's indices and sweeps the key range in step from this many keys on: kv +
// dkv of fewer keys stay in L2 anyway.
constexpr int64_t kBwdSweepMinKeys = 16384;
// Sorted-index chunk of the sweep: tokens per chunk = this / K (64 MiB per copy).
constexpr int64_t kBwdSortChunkEntries = int64_t(1) << 24;
// Deterministic mode: bound of the per-chunk dkv partial buffer (2 GiB); the chunk's token count is
// then rounded down to a multiple of the SM count (whole waves of one CTA per SM).
constexpr int64_t kBwdDetChunkBytes = int64_t(2) << 30;

// Sparse MLA backward main kernel: v2 (main_kernel_v2.cuh, front/back warpgroups, natural column order)
// or v1 (main_kernel.cuh). Measured on the H200 (2026-12-02, H = 64, K = 2048, docs/kernels/sparse_mla_bwd.md):
// v2 is 1.17-1.18x v1 in fast mode without the sorted sweep (T_kv 4K, 8K) and 1.19x in the deterministic
// mode at 32K, but 0.89x (32K) / 0.92x (128K) in fast mode with the sorted sweep. Build with
// -DFLASHDSA_BWD_V2=0 or =1 to force one kernel everywhere (A/B builds); the default picks per call.
inline bool bwd_use_v2(bool deterministic, bool sweep) {
#if defined(FLASHDSA_BWD_V2)
  (void)deterministic;
  (void)sweep;
  return FLASHDSA_BWD_V2 != 0;
#else
  return deterministic || !sweep;
#endif
}

}  // namespace flashdsa::sm90::tuning
