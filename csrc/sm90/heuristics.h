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
// dkv of fewer keys stay in L2 anyway. Measured on one H200 (fast ms, sweep vs never): 2026-12-02 fifth
// session (with the producer's L2 prefetches, since removed): 16K keys -4% (uniform rows) / -12% (ascending
// causal rows), 24K +21% / -5%, 32K +30% / -3%, hence 20480 then; tenth session (no prefetches, one-kernel row
// sort, Delta in the prologue): at 16K the sweep gains 5.5% on uniform rows and is neutral on ascending ones
// (0.998), so it starts at 16384. (A/B builds override it with -DFLASHDSA_BWD_SWEEP_MIN_KEYS=N,
// sparse_mla_bwd.cu; scripts/bwd_gpu.sh SWEEP_AB=1.)
constexpr int64_t kBwdSweepMinKeys = 16384;
// Sorted-index chunk of the sweep: tokens per chunk = this / K (256 MiB of sorted keys; + 256 MiB of pair
// ids with the mass output). One main-kernel launch per chunk: 2^26 (32K tokens at K = 2048) instead of
// 2^24 measured 0.5-0.8% faster at 24K / 32K on one H200 (2026-12-02, fewer launch tails).
constexpr int64_t kBwdSortChunkEntries = int64_t(1) << 26;
}  // namespace flashdsa::sm90::tuning
