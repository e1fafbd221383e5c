// Internal: the exact top-K selection of select.cuh for a CTA of any multiple of 128 threads (the v2
// indexer kernel runs it over its 256 threads, kernel_v2.cuh). Same algorithm and the same results
// as select.cuh (docs/kernels/indexer_topk.md, "Selection"): an order-preserving 32-bit key per score,
// lists of up to kResidentElems entries selected from registers (MSB-first radix select over the
// offsets key - min key in 11-bit digits of the list's own span, then a filter with one slot
// allocation per warp), longer lists streamed (11 + 11 + 10 bit digits, then a chunked filter). With
// NTH threads a resident list takes 4096 / NTH vectors per thread (16 + 16 registers at 256 threads),
// which is what lets the v2 kernel keep its 128-register budget.
// select.cuh itself is left as it is: the v1 kernel's machine code must not move.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "sm90/indexer_topk/select.cuh"  // score_key, score_from_key, KeepRule, Kept, warp_alloc, ...

namespace flashdsa::sm90::indexer_topk_impl::sel2 {

// Shared-memory scratch of the selection routines for NTH threads.
template <int NTH>
struct Scratch {
  static constexpr int kWarps = NTH / 32;
  uint32_t hist[kHistBins];
  int warp_sum[kWarps];
  int bin;        // radix pass result: the bin holding the need-th largest key
  int above;      // number of matching keys in bins above `bin`
  int bin_count;  // number of matching keys in `bin`
  int out_count;  // filter: slots handed out so far
  int eq_count;   // filter: tickets handed to keys equal to the threshold
  uint32_t warp_lo[kWarps];
  uint32_t warp_hi[kWarps];
};

template <int NTH>
struct Shape {
  static_assert(NTH % 128 == 0 && NTH <= 1024, "whole warpgroups");
  static constexpr int kWarps = NTH / 32;
  static constexpr int kSweepElems = NTH * kSweepVecs * 4;  // streamed sweep: 16 entries per thread
  static constexpr int kResidentVecs = kResidentElems / (NTH * 4);
  static constexpr int kResidentSlots = kResidentVecs * 4;
  static_assert(kResidentVecs >= 1 && kResidentSlots <= 32, "resident list: 1..32 slots per thread");
};

__device__ __forceinline__ bool rule_keeps_eq(uint32_t key, KeepRule rule, int* eq_count) {
  return key > rule.thr || (key == rule.thr && atomicAdd(eq_count, 1) < rule.quota);
}

template <int NTH, int kBins>
__device__ __forceinline__ void clear_hist(Scratch<NTH>& sc) {
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += NTH) sc.hist[b] = 0u;
  __syncthreads();
}

// The bin holding the need-th largest key of a filled histogram (as select.cuh pick_bin).
template <int NTH, int kBins>
__device__ __forceinline__ BinPick pick_bin(int need, Scratch<NTH>& sc) {
  constexpr int kBinsPerThread = kBins / NTH;
  static_assert(kBins <= kHistBins && kBinsPerThread >= 1, "digit too wide for the histogram");
  const int tid = threadIdx.x;
  __syncthreads();
  const int hi = kBins - tid * kBinsPerThread;
  int local = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) local += static_cast<int>(sc.hist[hi - 1 - b]);
  const int lane = tid & 31, warp = tid >> 5;
  int incl = local;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) sc.warp_sum[warp] = incl;
  __syncthreads();
  int above = incl - local;
  for (int w = 0; w < warp; ++w) above += sc.warp_sum[w];
  if (above < need && need <= above + local) {
    int cum = above;
#pragma unroll
    for (int b = 0; b < kBinsPerThread; ++b) {
      const int c = static_cast<int>(sc.hist[hi - 1 - b]);
      if (cum + c >= need) {
        sc.bin = hi - 1 - b;
        sc.above = cum;
        sc.bin_count = c;
        break;
      }
      cum += c;
    }
  }
  __syncthreads();
  return BinPick{sc.bin, sc.above, sc.bin_count};
}

// One streamed radix pass (as select.cuh radix_pass).
template <int NTH, int kShift, int kBits>
__device__ __forceinline__ bool radix_pass(const float* scores, int n, uint32_t& prefix, uint32_t& prefix_mask,
                                           int& need, Scratch<NTH>& sc) {
  constexpr int kBins = 1 << kBits;
  const int tid = threadIdx.x;
  clear_hist<NTH, kBins>(sc);
  for (int base = 0; base < n; base += Shape<NTH>::kSweepElems) {
    float4 v[kSweepVecs];
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) v[i] = load_scores4(scores, base + 4 * (tid + NTH * i), n);
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) {
      const int e = base + 4 * (tid + NTH * i);
      const float s[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const uint32_t key = score_key(s[x]);
        if (e + x < n && (key & prefix_mask) == prefix) atomicAdd(&sc.hist[(key >> kShift) & (kBins - 1)], 1u);
      }
    }
  }
  const BinPick pick = pick_bin<NTH, kBins>(need, sc);
  need -= pick.above;
  prefix |= static_cast<uint32_t>(pick.bin) << kShift;
  prefix_mask |= static_cast<uint32_t>(kBins - 1) << kShift;
  return pick.count == need;
}

template <int NTH>
__device__ __forceinline__ KeepRule select_top_k(const float* scores, int n, int k, Scratch<NTH>& sc) {
  uint32_t prefix = 0u, prefix_mask = 0u;
  int need = k;
  if (radix_pass<NTH, 21, 11>(scores, n, prefix, prefix_mask, need, sc)) return keep_from_edge(prefix);
  if (radix_pass<NTH, 10, 11>(scores, n, prefix, prefix_mask, need, sc)) return keep_from_edge(prefix);
  radix_pass<NTH, 0, 10>(scores, n, prefix, prefix_mask, need, sc);
  return KeepRule{prefix, need};
}

// Streamed filter (as select.cuh filter_keep): dst may alias the list.
template <int NTH>
__device__ __forceinline__ int filter_keep(const float* scores, const int* idx, int n, KeepRule rule,
                                           float* dst_scores, int* dst_idx, Scratch<NTH>& sc) {
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid == 0) {
    sc.out_count = 0;
    sc.eq_count = 0;
  }
  __syncthreads();
  for (int base = 0; base < n; base += Shape<NTH>::kSweepElems) {
    float s[kSweepVecs * 4];
    int id[kSweepVecs * 4];
    bool keep[kSweepVecs * 4];
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) {
      const int e = base + 4 * (tid + NTH * i);
      const float4 v = load_scores4(scores, e, n);
      const int4 w = load_index4(idx, e, n);
      s[4 * i + 0] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
      id[4 * i + 0] = w.x, id[4 * i + 1] = w.y, id[4 * i + 2] = w.z, id[4 * i + 3] = w.w;
#pragma unroll
      for (int x = 0; x < 4; ++x) keep[4 * i + x] = e + x < n && rule_keeps_eq(score_key(s[4 * i + x]), rule, &sc.eq_count);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSweepVecs * 4; ++i) {
      const int pos = warp_alloc(keep[i], &sc.out_count);
      if (keep[i]) {
        dst_idx[pos] = id[i];
        if (dst_scores != nullptr) dst_scores[pos] = s[i];
      }
    }
  }
  __syncthreads();
  return sc.out_count;
}

// ---- register-resident path ----------------------------------------------------------------------

template <int NTH>
struct ResidentList {
  uint32_t key[Shape<NTH>::kResidentSlots];
  int idx[Shape<NTH>::kResidentSlots];
};

// As select.cuh load_resident: every load issued before the barrier.
template <int NTH>
__device__ __forceinline__ void load_resident(const float* scores, const int* idx, int n, ResidentList<NTH>& list) {
  constexpr int kVecs = Shape<NTH>::kResidentVecs;
  const int tid = threadIdx.x;
  float4 v[kVecs];
  int4 w[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int e = 4 * (tid + NTH * i);
    const int src = e < n ? e : 0;
    v[i] = *reinterpret_cast<const float4*>(scores + src);
    w[i] = *reinterpret_cast<const int4*>(idx + src);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int e = 4 * (tid + NTH * i);
    const float s[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    const int id[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      list.key[4 * i + x] = e + x < n ? score_key(s[x]) : 0u;
      list.idx[4 * i + x] = id[x];
    }
  }
}

template <int NTH>
__device__ __forceinline__ void resident_range(const ResidentList<NTH>& list, uint32_t& lo, uint32_t& hi,
                                               Scratch<NTH>& sc) {
  uint32_t l = UINT_MAX, h = 0u;
#pragma unroll
  for (int s = 0; s < Shape<NTH>::kResidentSlots; ++s) {
    l = min(l, list.key[s] != 0u ? list.key[s] : UINT_MAX);
    h = max(h, list.key[s]);
  }
  l = __reduce_min_sync(0xffffffffu, l);
  h = __reduce_max_sync(0xffffffffu, h);
  const int tid = threadIdx.x;
  if ((tid & 31) == 0) {
    sc.warp_lo[tid >> 5] = l;
    sc.warp_hi[tid >> 5] = h;
  }
  if (tid == 0) {
    sc.out_count = 0;
    sc.eq_count = 0;
  }
  __syncthreads();
  lo = sc.warp_lo[0];
  hi = sc.warp_hi[0];
#pragma unroll
  for (int w = 1; w < Shape<NTH>::kWarps; ++w) {
    lo = min(lo, sc.warp_lo[w]);
    hi = max(hi, sc.warp_hi[w]);
  }
}

template <int NTH>
__device__ __forceinline__ KeepRule resident_select(const ResidentList<NTH>& list, uint32_t lo, uint32_t hi, int k,
                                                    Scratch<NTH>& sc) {
  const uint32_t span = hi - lo;
  int shift = span == 0u ? 0 : 32 - __clz(static_cast<int>(span));
  uint32_t prefix = 0u, mask = 0u;
  int need = k;
  while (shift > 0) {
    const int bits = min(shift, 11);
    shift -= bits;
    const uint32_t digit_mask = (1u << bits) - 1u;
    clear_hist<NTH, kHistBins>(sc);
#pragma unroll
    for (int s = 0; s < Shape<NTH>::kResidentSlots; ++s) {
      const uint32_t off = list.key[s] - lo;
      if (list.key[s] != 0u && (off & mask) == prefix) atomicAdd(&sc.hist[(off >> shift) & digit_mask], 1u);
    }
    const BinPick pick = pick_bin<NTH, kHistBins>(need, sc);
    need -= pick.above;
    prefix |= static_cast<uint32_t>(pick.bin) << shift;
    mask |= digit_mask << shift;
    if (pick.count == need) return keep_from_edge(lo + prefix);
  }
  return KeepRule{lo + prefix, need};
}

template <int NTH>
__device__ __forceinline__ int resident_filter(const ResidentList<NTH>& list, KeepRule rule, float* dst_scores,
                                               int* dst_idx, Scratch<NTH>& sc) {
  constexpr int kSlots = Shape<NTH>::kResidentSlots;
  uint32_t keep = 0u;
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (list.key[s] != 0u && rule_keeps_eq(list.key[s], rule, &sc.eq_count)) keep |= 1u << s;
  const int lane = threadIdx.x & 31;
  const int warp_total = __reduce_add_sync(0xffffffffu, __popc(keep));
  int pos = 0;
  if (lane == 0) pos = atomicAdd(&sc.out_count, warp_total);
  pos = __shfl_sync(0xffffffffu, pos, 0);
  const unsigned lanes_below = (1u << lane) - 1u;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool kept = ((keep >> s) & 1u) != 0u;
    const unsigned ballot = __ballot_sync(0xffffffffu, kept);
    if (kept) {
      const int at = pos + __popc(ballot & lanes_below);
      dst_idx[at] = list.idx[s];
      if (dst_scores != nullptr) dst_scores[at] = score_from_key(list.key[s]);
    }
    pos += __popc(ballot);
  }
  __syncthreads();
  return sc.out_count;
}

// Writes the k largest entries of (scores, idx)[0, n) (all of them when n <= k) to
// (dst_scores, dst_idx)[0, count) in arbitrary order; returns count and the rule's threshold. dst may
// alias the list; dst_scores may be null. All NTH threads of the CTA; every thread gets the result.
template <int NTH>
__device__ __forceinline__ Kept keep_top_k(const float* scores, const int* idx, int n, int k, float* dst_scores,
                                           int* dst_idx, Scratch<NTH>& sc) {
  if (n <= kResidentElems) {
    ResidentList<NTH> list;
    load_resident<NTH>(scores, idx, n, list);
    uint32_t lo, hi;
    resident_range<NTH>(list, lo, hi, sc);
    const KeepRule rule = n > k ? resident_select<NTH>(list, lo, hi, k, sc) : keep_all();
    return Kept{resident_filter<NTH>(list, rule, dst_scores, dst_idx, sc), rule.thr};
  }
  const KeepRule rule = n > k ? select_top_k<NTH>(scores, n, k, sc) : keep_all();
  return Kept{filter_keep<NTH>(scores, idx, n, rule, dst_scores, dst_idx, sc), rule.thr};
}

}  // namespace flashdsa::sm90::indexer_topk_impl::sel2
