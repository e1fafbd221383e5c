// Hopper sparse MLA backward (docs/spec.md §5): host entry, workspace plan and the small kernels around
// the main kernel (main_kernel.cuh). Design and measurements: docs/kernels/sparse_mla_bwd.md.
//
//   1. dkv = 0; Delta[t, h] = sum_d dout * out (fp32, workspace).
//   2. fast mode: main kernel with vector fp32 atomics into dkv. When kv does not fit in L2
//      (T_kv >= kSweepMinKeys), each row's indices are first sorted (a copy, per chunk of tokens)
//      and the CTAs sweep the key range in step (a shared progress counter), so the atomics and
//      gathers of concurrently running CTAs hit a narrow, L2-resident key window.
//   3. deterministic mode (det_fixed.cuh): dkv as fixed-point pairs in 64-bit integer reductions, one
//      power-of-two unit per key row from a bound computed before the main kernel, a check of each row's
//      sum, a second pass for rows that failed it, and a decode pass to fp32. No float atomics anywhere.
//   4. the fast mode's main kernel writes dkv in the dkv_pos column order (kernel_common.cuh):
//      dkv_unpermute_kernel restores the natural order after the last atomic of the call (the
//      deterministic mode's decode pass does it itself).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cub/cub.cuh>

#include "sm90/common/cuda_check.cuh"
#include "common/status_macros.h"
#include "sm90/backend.h"
#include "sm90/heuristics.h"
#include "sm90/sparse_mla_bwd/det_fixed.cuh"
#include "sm90/sparse_mla_bwd/main_kernel.cuh"

namespace flashdsa::sm90 {
namespace sparse_mla_bwd_impl {
namespace {

// The scheduling thresholds: csrc/sm90/heuristics.h.
#if defined(FLASHDSA_BWD_SWEEP_MIN_KEYS)  // A/B builds only (scripts/bwd_gpu.sh SWEEP_AB=1)
constexpr int64_t kSweepMinKeys = FLASHDSA_BWD_SWEEP_MIN_KEYS;
#else
constexpr int64_t kSweepMinKeys = tuning::kBwdSweepMinKeys;
#endif
constexpr int64_t kSortChunkEntries = tuning::kBwdSortChunkEntries;
// The deterministic sorted pass sorts every row in its bound's CTA and counts the addends from the sorted rows
// (fix_bound_sort_kernel, fix_count_sorted_kernel; thirty-first session, H100: det 32K -2.9%, 128K -1.8%). The A/B
// switches of that measurement are folded in: a build that still passes one fails here.
#if defined(FLASHDSA_BWD_FIX_SORTED_COUNT) || defined(FLASHDSA_BWD_FIX_BOUND_SORT)
#error "FLASHDSA_BWD_FIX_SORTED_COUNT / _FIX_BOUND_SORT are folded into the deterministic sorted pass (perf-notes)"
#endif

// ---- small kernels --------------------------------------------------------------------------

// Sweep mode: one CTA of kSortThreads per index row sorts the row's keys into keys_out[l * K ..) (invalid
// entries -> T_kv, last) and, when pair_ids is not null, writes each sorted entry's chunk pair id
// (l * K + original slot). Rows that are already ascending (the peers' benchmark rows; rows after a
// sort-by-index) are copied without sorting: one CTA-wide vote decides. Otherwise a block radix sort
// over the key_bits(T_kv) low bits (stable, so the result is the same on every run). Entry j of a row
// sits at thread j / kItems, item j % kItems (blocked); positions >= K hold the largest key and sort last.
constexpr int kSortThreads = 256;
// cub's default digit of 4 bits: 5 and 6 bits (FLASHDSA_BWD_SORT_RADIX_BITS, thirty-first session, H100) were no
// faster at 16K (0.178 / 0.200 ms against 0.177) nor in the fast mode at 16K / 32K; removed.
#ifdef FLASHDSA_BWD_SORT_RADIX_BITS
#error "FLASHDSA_BWD_SORT_RADIX_BITS was measured and removed on 2026-12-05 (docs/perf-notes.md)"
#endif
template <int kItems>
using RowSort = cub::BlockRadixSort<uint32_t, kSortThreads, kItems, int32_t>;
template <int kItems>
union SortSmem {
  typename RowSort<kItems>::TempStorage sort;
  uint32_t first[kSortThreads];
};
// Row l of a launch (one CTA of kSortThreads; smem free for reuse after it returns); its pair ids are id_row * K + the
// original slot (id_row: the row within its main launch's chunk, mass_slot_of).
template <int kItems>
__device__ __forceinline__ void sort_row(const int32_t* __restrict__ indices, int64_t stride_t, int K, int64_t t_kv,
                                         int bits, int32_t* __restrict__ keys_out, int32_t* __restrict__ pair_ids,
                                         int64_t l, int64_t id_row, SortSmem<kItems>& smem) {
  using Sort = RowSort<kItems>;
  const int tid = threadIdx.x;
  const int32_t* row = indices + l * stride_t;
  const uint32_t pad = (bits >= 32) ? 0xffffffffu : ((1u << bits) - 1u);
  const int j0 = tid * kItems;
  uint32_t key[kItems];
  int32_t slot[kItems];
  const bool vec = ((reinterpret_cast<uintptr_t>(row) & 15) == 0);
#pragma unroll
  for (int i = 0; i < kItems; i += 4) {
    int4 v = make_int4(-1, -1, -1, -1);
    const bool in = j0 + i < K;  // K % 4 == 0 and j0 % 4 == 0: a group of 4 is all in or all out
    if (in) {
      if (vec) {
        v = *reinterpret_cast<const int4*>(row + j0 + i);
      } else {
        v = make_int4(row[j0 + i], row[j0 + i + 1], row[j0 + i + 2], row[j0 + i + 3]);
      }
    }
    const int32_t e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      key[i + u] = !in ? pad : ((e[u] >= 0 && e[u] < t_kv) ? static_cast<uint32_t>(e[u]) : static_cast<uint32_t>(t_kv));
      slot[i + u] = j0 + i + u;
    }
  }
  smem.first[tid] = key[0];
  __syncthreads();
  bool sorted = tid + 1 == kSortThreads || key[kItems - 1] <= smem.first[tid + 1];
#pragma unroll
  for (int i = 1; i < kItems; ++i) sorted = sorted && key[i - 1] <= key[i];
  sorted = __syncthreads_and(sorted) != 0;  // also the last read of `first` before the sort reuses smem
  if (!sorted) Sort(smem.sort).Sort(key, slot, 0, bits);
  const int64_t out0 = l * int64_t(K), id0 = id_row * int64_t(K);
#pragma unroll
  for (int i = 0; i < kItems; i += 4) {
    if (j0 + i >= K) break;
    *reinterpret_cast<int4*>(keys_out + out0 + j0 + i) =
        make_int4(int(key[i]), int(key[i + 1]), int(key[i + 2]), int(key[i + 3]));
    if (pair_ids != nullptr) {
      *reinterpret_cast<int4*>(pair_ids + out0 + j0 + i) =
          make_int4(int(id0 + slot[i]), int(id0 + slot[i + 1]), int(id0 + slot[i + 2]), int(id0 + slot[i + 3]));
    }
  }
}
template <int kItems>
__global__ void __launch_bounds__(kSortThreads) sort_rows_kernel(const int32_t* __restrict__ indices,
                                                                 int64_t stride_t, int K, int64_t t_kv, int bits,
                                                                 int32_t* __restrict__ keys_out,
                                                                 int32_t* __restrict__ pair_ids) {
  __shared__ SortSmem<kItems> smem;
  sort_row<kItems>(indices, stride_t, K, t_kv, bits, keys_out, pair_ids, blockIdx.x, blockIdx.x, smem);
}

// The deterministic sorted pass: token l's row sorted (sort_rows_kernel) and its bound (fix_bound_kernel) in one CTA,
// so that the sort's arithmetic runs under the bound's DRAM reads of Q and dO (H100, 32K: 1.97 ms against 1.57 + 0.77
// ms for the two kernels; 63 registers for K <= 2048, 4 CTAs an SM).
template <int kItems>
__global__ void __launch_bounds__(kSortThreads, kItems == 8 ? 4 : 1)
    fix_bound_sort_kernel(const BoundParams bp, int bits, int64_t chunk_tokens, int32_t* __restrict__ keys_out,
                          int32_t* __restrict__ pair_ids) {
  static_assert(kSortThreads == kBoundThreads, "one CTA shape for both");
  __shared__ SortSmem<kItems> smem;
  __shared__ float term[kFixedMaxHeads];
  sort_row<kItems>(bp.indices, bp.idx_stride_t, bp.K, bp.t_kv, bits, keys_out, pair_ids, blockIdx.x,
                   blockIdx.x % chunk_tokens, smem);
  bound_of_token(bp, blockIdx.x, term);
}

// dkv [rows, 576] fp32, in place: stored position dkv_pos(c) -> column c (kernel_common.cuh). One
// thread per 16-column group (64 bytes in, 64 bytes out).
__global__ void dkv_unpermute_kernel(float* __restrict__ dkv, int64_t rows) {
  constexpr int kGroups = kQkCols / 16;
  const int64_t n = rows * kGroups;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n; g += int64_t(gridDim.x) * blockDim.x) {
    float4* const at = reinterpret_cast<float4*>(dkv + g * 16);
    float in[16], out[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = at[j];
      in[4 * j] = v.x, in[4 * j + 1] = v.y, in[4 * j + 2] = v.z, in[4 * j + 3] = v.w;
    }
#pragma unroll
    for (int c = 0; c < 16; ++c) out[c] = in[dkv_pos(c)];
#pragma unroll
    for (int j = 0; j < 4; ++j) at[j] = make_float4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
  }
}

// ---- workspace plan -------------------------------------------------------------------------

struct Plan {
  bool sweep = false;          // fast mode with sorted rows
  int num_head_groups = 1;
  int64_t chunk_tokens = 0;    // tokens per main-kernel launch
  // byte offsets into the workspace (only those of the chosen mode are used)
  size_t sweep_counter = 0;
  size_t keys_out = 0, pair_ids_out = 0;
  // deterministic mode (det_fixed.cuh)
  size_t key_count = 0, fix_unit = 0, fix_l1 = 0, fix_capped = 0, fix_amax = 0, fix_ctl = 0;
  size_t fix_q = 0, fix_qsum = 0, fix_qrow = 0;
  bool fix_sorted = false;     // rows sorted (keys_out holds all T rows)
  size_t total = 0;
};

size_t carve(size_t* cursor, size_t bytes) {
  const size_t at = *cursor;
  *cursor += (bytes + 255) & ~size_t(255);
  return at;
}

int key_bits(int64_t t_kv) {  // bits to hold 0..t_kv (t_kv is the "invalid" sentinel)
  int bits = 1;
  while ((int64_t(1) << bits) <= t_kv) ++bits;
  return bits;
}

Status make_plan(const SparseMlaBwdParams& p, Plan* plan) {
  Plan& pl = *plan;
  pl = Plan{};
  pl.num_head_groups = (p.attn.H + kHeadsPerCta - 1) / kHeadsPerCta;
  const int64_t T = std::max<int64_t>(p.T, 1);
  size_t cur = 0;
  pl.sweep_counter = carve(&cur, sizeof(uint32_t));
  if (p.deterministic) {  // fixed-point pairs: no partial buffers; the sorted rows of all T tokens when sweeping
    pl.fix_sorted = p.T_kv >= kSweepMinKeys;
    pl.chunk_tokens = pl.fix_sorted ? std::min<int64_t>(std::max<int64_t>(1, kSortChunkEntries / p.topk.K), T) : T;
    if (pl.fix_sorted) {
      pl.keys_out = carve(&cur, size_t(T) * p.topk.K * 4);
      if (p.mass != nullptr) pl.pair_ids_out = carve(&cur, size_t(T) * p.topk.K * 4);
    }
    pl.key_count = carve(&cur, size_t(p.T_kv + 1) * 4);
    pl.fix_unit = carve(&cur, size_t(p.T_kv + 1) * 4);
    pl.fix_l1 = carve(&cur, size_t(p.T_kv + 1) * 8);
    pl.fix_capped = carve(&cur, size_t(p.T_kv + 1) * 4);
    pl.fix_amax = carve(&cur, size_t(p.T_kv + 1) * 4);
    pl.fix_ctl = carve(&cur, sizeof(FixedCtl));
    pl.fix_q = carve(&cur, size_t(T) * pl.num_head_groups * 4);
    pl.fix_qsum = carve(&cur, size_t(p.T_kv + 1) * 8);
    pl.fix_qrow = carve(&cur, size_t(p.T_kv + 1) * 4);
    pl.total = cur;
    return Status::OK();
  }
  if (p.T_kv >= kSweepMinKeys) {
    pl.sweep = true;
    pl.chunk_tokens = std::min<int64_t>(std::max<int64_t>(1, kSortChunkEntries / p.topk.K), T);
    const int64_t entries = pl.chunk_tokens * p.topk.K;
    pl.keys_out = carve(&cur, size_t(entries) * 4);
    // the mass of a sorted entry goes to its original slot: the sorted entries' pair ids too
    if (p.mass != nullptr) pl.pair_ids_out = carve(&cur, size_t(entries) * 4);
  } else {
    pl.chunk_tokens = T;
  }
  pl.total = cur;
  return Status::OK();
}

// CTAs of a main-kernel launch of `tokens` rows that run at once (one per SM: kSmemBytes): the sweep's rotation and the
// deterministic waves both count progress in these.
int resident_ctas(int64_t tokens, int num_head_groups, int sms) {
  return static_cast<int>(std::min<int64_t>(tokens * num_head_groups, sms));
}

template <bool kDeterministic>
Status launch_main(const MainParams& mp, int64_t tokens, int num_head_groups, cudaStream_t stream) {
  return launch_with_smem(sparse_mla_bwd_main_kernel<kDeterministic>,
                          dim3(static_cast<unsigned>(tokens), num_head_groups), kThreads, int(kSmemBytes), stream,
                          "sparse_mla_bwd_main_kernel", mp);
}

unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, int64_t(1) << 20));
}

// Calls launch(std::integral_constant<int, kItems>{}) with the per-thread item count of a kSortThreads-wide row sort
// that holds K (K <= 8192): sort_rows_kernel's and fix_bound_sort_kernel's instances.
template <class Launch>
Status with_sort_items(int K, Launch launch) {
  if (K <= 8 * kSortThreads) {
    launch(std::integral_constant<int, 8>{});
  } else if (K <= 16 * kSortThreads) {
    launch(std::integral_constant<int, 16>{});
  } else if (K <= 32 * kSortThreads) {
    launch(std::integral_constant<int, 32>{});
  } else {
    return Status::InvalidArgument("sm90 sparse_mla_bwd: sorted sweep supports K <= 8192, got " + std::to_string(K));
  }
  return Status::OK();
}

// sort_rows_kernel over `tokens` rows (one CTA each).
Status launch_sort_rows(const int32_t* indices, int64_t stride_t, int64_t tokens, int K, int64_t t_kv,
                        int32_t* keys_out, int32_t* pair_ids, cudaStream_t stream) {
  const int bits = key_bits(t_kv);
  const dim3 grid(static_cast<unsigned>(tokens));
  FLASHDSA_RETURN_IF_ERROR(with_sort_items(K, [&](auto items) {
    sort_rows_kernel<decltype(items)::value>
        <<<grid, kSortThreads, 0, stream>>>(indices, stride_t, K, t_kv, bits, keys_out, pair_ids);
  }));
  FLASHDSA_CHECK_LAUNCH("sort_rows_kernel");
  return Status::OK();
}

// fix_bound_sort_kernel over all `tokens` rows (keys_out and pair_ids hold them all; pair ids relative to each main
// launch's chunk of chunk_tokens rows).
Status launch_bound_sort(const BoundParams& bp, int64_t tokens, int64_t chunk_tokens, int32_t* keys_out,
                         int32_t* pair_ids, cudaStream_t stream) {
  const int bits = key_bits(bp.t_kv);
  const dim3 grid(static_cast<unsigned>(tokens));
  FLASHDSA_RETURN_IF_ERROR(with_sort_items(bp.K, [&](auto items) {
    fix_bound_sort_kernel<decltype(items)::value>
        <<<grid, kSortThreads, 0, stream>>>(bp, bits, chunk_tokens, keys_out, pair_ids);
  }));
  FLASHDSA_CHECK_LAUNCH("fix_bound_sort_kernel");
  return Status::OK();
}

// fix_count_sorted_kernel's grid: groups of at most 8 key ranges (a search per token and group, a cursor within it),
// and enough token runs for about 4 CTAs per SM; each run's CTA adds one histogram per range to the global words, so
// fewer runs mean fewer global atomics (T_kv per run and word).
Status launch_count_sorted(const int32_t* keys, int K, int64_t tokens, int64_t t_kv, int groups, const float* qg,
                           const FixedCtl* ctl, int32_t* count, unsigned long long* qsum, uint32_t* qrow, int sms,
                           cudaStream_t stream) {
  const int64_t ranges = (t_kv + kCountRangeKeys - 1) / kCountRangeKeys;
  const int64_t per_cta = (ranges + 7) / 8;
  const int64_t range_groups = (ranges + per_cta - 1) / per_cta;
  const int64_t target = 4 * int64_t(std::max(sms, 1));
  int64_t runs = std::max((tokens + kCountMaxTokens - 1) / kCountMaxTokens, (target + range_groups - 1) / range_groups);
  runs = std::min(runs, tokens);
  const int64_t tokens_per_cta = (tokens + runs - 1) / runs;
  runs = (tokens + tokens_per_cta - 1) / tokens_per_cta;
  if (runs > 65535 || range_groups > (int64_t(1) << 30))
    return Status::InvalidArgument("sm90 sparse_mla_bwd (deterministic mode): " + std::to_string(tokens) +
                                   " tokens exceed the sorted count's grid");
  CountSortedParams cp{keys, K, tokens, tokens_per_cta, t_kv, static_cast<int>(per_cta), groups,
                       qg, ctl, count, qsum, qrow};
  const dim3 grid(static_cast<unsigned>(range_groups), static_cast<unsigned>(runs));
  return launch_with_smem(fix_count_sorted_kernel, grid, kCountThreads, kCountSmemBytes, stream,
                          "fix_count_sorted_kernel", cp);
}

}  // namespace
}  // namespace sparse_mla_bwd_impl

size_t sparse_mla_bwd_workspace_size(const SparseMlaBwdParams& p) {
  sparse_mla_bwd_impl::Plan plan;
  if (!sparse_mla_bwd_impl::make_plan(p, &plan).ok()) return 0;
  return plan.total;
}

// The deterministic mode with fixed-point pairs (det_fixed.cuh, steps 1-4; the decode is sparse_mla_bwd's last pass).
static Status det_fixed_flow(const SparseMlaBwdParams& p, const sparse_mla_bwd_impl::Plan& pl,
                             sparse_mla_bwd_impl::MainParams mp, cudaStream_t stream) {
  using namespace sparse_mla_bwd_impl;
  if (p.attn.H > kFixedMaxHeads)  // fix_bound_kernel's shared array (the backend allows H <= 128 anyway)
    return Status::InvalidArgument("sm90 sparse_mla_bwd (fixed-point deterministic mode): H must be <= " +
                                   std::to_string(kFixedMaxHeads));
  char* ws = static_cast<char*>(p.workspace);
  int32_t* count = reinterpret_cast<int32_t*>(ws + pl.key_count);
  auto* ctl = reinterpret_cast<FixedCtl*>(ws + pl.fix_ctl);
  mp.fix_unit = reinterpret_cast<float*>(ws + pl.fix_unit);
  mp.fix_l1 = reinterpret_cast<unsigned long long*>(ws + pl.fix_l1);
  mp.fix_capped = reinterpret_cast<uint32_t*>(ws + pl.fix_capped);
  mp.fix_amax = reinterpret_cast<uint32_t*>(ws + pl.fix_amax);
  mp.fix_rerun = &ctl->rerun;
  mp.sweep_counter = nullptr;  // set per launch below: the waves' counter (sorted pass 1), else none
  const int threads = 256;
  // grid-stride kernels: at least one CTA (T_kv may be 0)
  auto grid = [&](int64_t n) { return std::max(1u, grid_for(n, threads)); };
  float* const qg = reinterpret_cast<float*>(ws + pl.fix_q);
  auto* const qsum = reinterpret_cast<unsigned long long*>(ws + pl.fix_qsum);
  uint32_t* const qrow = reinterpret_cast<uint32_t*>(ws + pl.fix_qrow);
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(count, 0, size_t(p.T_kv + 1) * 4, stream));
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(qsum, 0, size_t(p.T_kv + 1) * 8, stream));
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(qrow, 0, size_t(p.T_kv + 1) * 4, stream));
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(ctl, 0, sizeof(FixedCtl), stream));
  fix_vmax_kernel<<<grid(p.T_kv * 32), threads, 0, stream>>>(mp.kv, mp.kv_stride_t, p.T_kv, ctl);
  FLASHDSA_CHECK_LAUNCH("fix_vmax_kernel");
  const BoundParams bp{mp.q,          mp.q_stride_t,     mp.q_stride_h, mp.dout, p.attn.H, mp.scale,
                       p.topk.indices, p.topk.stride_t, p.topk.K,      p.T_kv,  qg,       ctl};
  int32_t* const keys = pl.fix_sorted ? reinterpret_cast<int32_t*>(ws + pl.keys_out) : nullptr;
  int32_t* const pairs =
      pl.fix_sorted && p.mass != nullptr ? reinterpret_cast<int32_t*>(ws + pl.pair_ids_out) : nullptr;
  int sms = 0;  // the waves' resident CTAs and the sorted count's grid (sorted pass only)
  if (pl.fix_sorted) {  // every row sorted with its bound (pair ids per main launch's chunk), then counted
    FLASHDSA_RETURN_IF_ERROR(tuning::sm_count(&sms));
    FLASHDSA_RETURN_IF_ERROR(launch_bound_sort(bp, p.T, pl.chunk_tokens, keys, pairs, stream));
    FLASHDSA_RETURN_IF_ERROR(launch_count_sorted(keys, p.topk.K, p.T, p.T_kv, pl.num_head_groups, qg, ctl, count, qsum,
                                                 qrow, sms, stream));
  } else {
    fix_bound_kernel<<<static_cast<unsigned>(p.T), kBoundThreads, 0, stream>>>(bp);
    FLASHDSA_CHECK_LAUNCH("fix_bound_kernel");
    fix_count_kernel<<<grid(p.T * p.topk.K), threads, 0, stream>>>(p.topk.indices, p.topk.stride_t, p.T, p.topk.K,
                                                                   p.T_kv, pl.num_head_groups, qg, ctl, count, qsum,
                                                                   qrow);
    FLASHDSA_CHECK_LAUNCH("fix_count_kernel");
  }
  fix_units_kernel<<<grid(p.T_kv), threads, 0, stream>>>(count, qsum, qrow, ctl, p.T_kv, mp.fix_unit, mp.fix_l1,
                                                          mp.fix_capped, mp.fix_amax);
  FLASHDSA_CHECK_LAUNCH("fix_units_kernel");
  for (int pass = 1; pass <= 2; ++pass) {
    mp.fix_pass = pass;
    for (int64_t t0 = 0; t0 < p.T; t0 += pl.chunk_tokens) {
      const int64_t tokens = std::min(pl.chunk_tokens, p.T - t0);
      mp.token_begin = t0;
      mp.mass = pass == 1 ? static_cast<float*>(p.mass) : nullptr;  // pass 2 would add the mass twice
      if (pl.fix_sorted) {  // rows sorted by fix_bound_sort_kernel
        mp.indices = keys + t0 * p.topk.K;
        mp.indices_stride_t = p.topk.K;
        mp.mass_slots = pairs != nullptr ? pairs + t0 * p.topk.K : nullptr;
      } else {
        mp.indices = p.topk.indices + t0 * p.topk.stride_t;
        mp.indices_stride_t = p.topk.stride_t;
        mp.mass_slots = nullptr;
      }
      if (pl.fix_sorted && pass == 1) {  // pace the sorted pass in waves (config.h)
        mp.sweep_counter = reinterpret_cast<uint32_t*>(ws + pl.sweep_counter);
        FLASHDSA_CUDA_TRY(cudaMemsetAsync(mp.sweep_counter, 0, sizeof(uint32_t), stream));
        mp.resident_ctas = resident_ctas(tokens, pl.num_head_groups, sms);
      } else {
        mp.sweep_counter = nullptr;
      }
      FLASHDSA_RETURN_IF_ERROR(launch_main<true>(mp, tokens, pl.num_head_groups, stream));
    }
    if (pass == 1) {
      fix_check_kernel<<<grid(p.T_kv), threads, 0, stream>>>(mp.dkv, mp.fix_unit, mp.fix_l1, mp.fix_capped,
                                                             mp.fix_amax, count, p.T_kv, ctl);
      FLASHDSA_CHECK_LAUNCH("fix_check_kernel");
    }
  }
  return Status::OK();
}

// The host flow up to the last atomic / reduction into dkv; sparse_mla_bwd() below adds the column
// un-permutation (fast mode) or the decode (deterministic mode).
static Status sparse_mla_bwd_flow(const SparseMlaBwdParams& p, const sparse_mla_bwd_impl::Plan& pl) {
  using namespace sparse_mla_bwd_impl;
  Status st;
  if (p.workspace == nullptr || p.workspace_bytes < pl.total)
    return Status::InvalidArgument("sm90 sparse_mla_bwd: workspace must hold sparse_mla_bwd_workspace_size() = " +
                                   std::to_string(pl.total) + " bytes");
  auto* stream = static_cast<cudaStream_t>(p.stream);
  char* ws = static_cast<char*>(p.workspace);
  float* dkv = static_cast<float*>(p.dkv);
  FLASHDSA_CUDA_TRY(cudaMemsetAsync(dkv, 0, size_t(p.T_kv) * kQkCols * sizeof(float), stream));
  if (p.mass != nullptr)  // skipped (all-invalid) key blocks are never visited: their mass stays 0
    FLASHDSA_CUDA_TRY(cudaMemsetAsync(p.mass, 0, size_t(p.T) * p.topk.K * sizeof(float), stream));
  if (p.T == 0) return Status::OK();

  MainParams mp{};
  mp.q = static_cast<const __nv_bfloat16*>(p.attn.q);
  mp.kv = static_cast<const __nv_bfloat16*>(p.attn.kv);
  mp.lse = static_cast<const float*>(p.lse);
  mp.out = static_cast<const __nv_bfloat16*>(p.out);
  mp.dout = static_cast<const __nv_bfloat16*>(p.dout);
  mp.dq = static_cast<__nv_bfloat16*>(p.dq);
  mp.dkv = dkv;
  mp.q_stride_t = p.attn.q_stride_t;
  mp.q_stride_h = p.attn.q_stride_h;
  mp.kv_stride_t = p.attn.kv_stride_t;
  mp.T_kv = p.T_kv;
  mp.H = p.attn.H;
  mp.K = p.topk.K;
  mp.scale = p.attn.scale;
  mp.scale_log2 = p.attn.scale * hw::kLog2e;
  mp.mass = static_cast<float*>(p.mass);

  if (!p.deterministic && !pl.sweep) {
    mp.indices = p.topk.indices;
    mp.indices_stride_t = p.topk.stride_t;
    return launch_main<false>(mp, p.T, pl.num_head_groups, stream);
  }

  if (pl.sweep) {
    int32_t* const keys_out = reinterpret_cast<int32_t*>(ws + pl.keys_out);
    mp.sweep_counter = reinterpret_cast<uint32_t*>(ws + pl.sweep_counter);
    FLASHDSA_CUDA_TRY(cudaMemsetAsync(mp.sweep_counter, 0, sizeof(uint32_t), stream));
    int sms = 0;
    FLASHDSA_RETURN_IF_ERROR(tuning::sm_count(&sms));
    int32_t* const pair_ids_out = p.mass != nullptr ? reinterpret_cast<int32_t*>(ws + pl.pair_ids_out) : nullptr;
    for (int64_t t0 = 0; t0 < p.T; t0 += pl.chunk_tokens) {
      const int64_t tokens = std::min(pl.chunk_tokens, p.T - t0);
      FLASHDSA_RETURN_IF_ERROR(launch_sort_rows(p.topk.indices + t0 * p.topk.stride_t, p.topk.stride_t, tokens,
                                                p.topk.K, p.T_kv, keys_out, pair_ids_out, stream));
      mp.indices = keys_out;
      mp.indices_stride_t = p.topk.K;
      mp.mass_slots = pair_ids_out;
      mp.token_begin = t0;
      mp.resident_ctas = resident_ctas(tokens, pl.num_head_groups, sms);
      st = launch_main<false>(mp, tokens, pl.num_head_groups, stream);
      if (!st.ok()) return st;
    }
    return Status::OK();
  }

  return det_fixed_flow(p, pl, mp, stream);
}

Status sparse_mla_bwd(const SparseMlaBwdParams& p) {
  // Limits (bf16, production shapes, aligned rows): supports_sparse_mla_bwd in backend.cpp.
  sparse_mla_bwd_impl::Plan pl;
  Status st = sparse_mla_bwd_impl::make_plan(p, &pl);
  if (!st.ok()) return st;
  st = sparse_mla_bwd_flow(p, pl);
  if (!st.ok() || p.T == 0 || p.T_kv == 0) return st;
  // Every atomic / reduction into dkv of this call precedes this launch on the stream.
  if (p.deterministic) {  // the pair words -> fp32, natural order
    auto* ws = static_cast<char*>(p.workspace);
    const int64_t lines = p.T_kv * (sparse_mla_bwd_impl::kQkCols / 32);
    sparse_mla_bwd_impl::fix_decode_kernel<<<sparse_mla_bwd_impl::grid_for(lines, 256), 256, 0,
                                             static_cast<cudaStream_t>(p.stream)>>>(
        static_cast<float*>(p.dkv), reinterpret_cast<const float*>(ws + pl.fix_unit),
        reinterpret_cast<const unsigned long long*>(ws + pl.fix_l1), reinterpret_cast<const int32_t*>(ws + pl.key_count),
        p.T_kv);
    FLASHDSA_CHECK_LAUNCH("fix_decode_kernel");
    return Status::OK();
  }
  const int64_t groups = p.T_kv * (sparse_mla_bwd_impl::kQkCols / 16);
  sparse_mla_bwd_impl::dkv_unpermute_kernel<<<sparse_mla_bwd_impl::grid_for(groups, 256), 256, 0,
                                              static_cast<cudaStream_t>(p.stream)>>>(static_cast<float*>(p.dkv),
                                                                                     p.T_kv);
  FLASHDSA_CHECK_LAUNCH("dkv_unpermute_kernel");
  return Status::OK();
}

}  // namespace flashdsa::sm90
