// Internal: CTA-wide exact top-K selection over a candidate list of (score, key index) pairs held
// in global memory, for the fused indexer + top-k kernel (one warpgroup = 128 threads per CTA).
//
// Scores are compared through an order-preserving 32-bit key (score_key). A selection returns a
// KeepRule: keep every element with key > thr, and among the elements with key == thr the first
// `quota` met (ties are broken arbitrarily, as DSA_SPEC §3 allows). The rule is found by an exact
// MSB-first radix select (11 + 11 + 10 bits, each pass one shared-memory histogram over the list),
// and applied by filter_keep, which may compact the list in place.
// The lists are rewritten by the kernel that reads them: their pointers are deliberately not
// __restrict__, so that loads never take the non-coherent read-only path.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kSelectThreads = 128;
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kHistBins = 2048;  // widest radix digit: 11 bits
// Elements per thread per sweep of the list (4 x 16-byte vectors), for memory-level parallelism.
constexpr int kSweepVecs = 4;
constexpr int kSweepElems = kSelectThreads * kSweepVecs * 4;

// Shared-memory scratch of the selection routines.
struct SelectScratch {
  uint32_t hist[kHistBins];
  int warp_sum[kSelectWarps];
  int bin;        // radix pass result: the bin holding the need-th largest key
  int above;      // number of matching keys in bins above `bin`
  int bin_count;  // number of matching keys in `bin`
  int out_count;  // filter_keep: slots handed out so far
  int eq_count;   // filter_keep: tickets handed to keys equal to the threshold
};

// a < b  <=>  score_key(a) < score_key(b) for all non-NaN floats (with -0 < +0).
__device__ __forceinline__ uint32_t score_key(float s) {
  const uint32_t u = __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Keep every element with key > thr; of those with key == thr, keep `quota`.
struct KeepRule {
  uint32_t thr;
  int quota;
};

// Keeps everything (key 0 is below every real score's key).
__device__ __forceinline__ KeepRule keep_all() { return KeepRule{0u, INT_MAX}; }

// Slot allocation for a warp: lanes with `pred` get consecutive positions from *counter.
// Must be called by all 32 lanes. Returns the lane's position (meaningless when !pred).
__device__ __forceinline__ int warp_alloc(bool pred, int* counter) {
  const unsigned mask = __ballot_sync(0xffffffffu, pred);
  if (mask == 0) return 0;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(mask) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(0xffffffffu, base, leader);
  return base + __popc(mask & ((1u << lane) - 1u));
}

// Loads the 16-byte vector at element e of a [cap] list, or zeros when e >= n (e is a multiple of 4
// and the list's capacity a multiple of 4, so a vector starting below n stays inside the list).
__device__ __forceinline__ float4 load_scores4(const float* list, int e, int n) {
  return e < n ? *reinterpret_cast<const float4*>(list + e) : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ int4 load_index4(const int* list, int e, int n) {
  return e < n ? *reinterpret_cast<const int4*>(list + e) : make_int4(0, 0, 0, 0);
}

// One radix pass: histogram of digit [kShift, kShift + kBits) over the keys whose higher bits equal
// `prefix` (under `prefix_mask`), then the bin holding the need-th largest of them. Updates
// prefix / prefix_mask / need (need becomes the number still to take inside the chosen bin).
// Returns true when the chosen bin is taken whole (the selection is complete).
template <int kShift, int kBits>
__device__ __forceinline__ bool radix_pass(const float* scores, int n, uint32_t& prefix,
                                           uint32_t& prefix_mask, int& need, SelectScratch& sc) {
  constexpr int kBins = 1 << kBits;
  constexpr int kBinsPerThread = kBins / kSelectThreads;
  static_assert(kBins <= kHistBins && kBinsPerThread >= 1, "digit too wide for the histogram");
  const int tid = threadIdx.x;

  __syncthreads();  // earlier readers of hist / the pass results are done
  for (int b = tid; b < kBins; b += kSelectThreads) sc.hist[b] = 0u;
  __syncthreads();

  for (int base = 0; base < n; base += kSweepElems) {
    float4 v[kSweepVecs];
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) v[i] = load_scores4(scores, base + 4 * (tid + kSelectThreads * i), n);
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) {
      const int e = base + 4 * (tid + kSelectThreads * i);
      const float s[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const uint32_t key = score_key(s[x]);
        if (e + x < n && (key & prefix_mask) == prefix) atomicAdd(&sc.hist[(key >> kShift) & (kBins - 1)], 1u);
      }
    }
  }
  __syncthreads();

  // Thread t owns bins [hi - kBinsPerThread, hi), hi = kBins - t * kBinsPerThread: thread 0 holds the
  // largest keys, so an exclusive prefix sum over threads counts the keys above each thread's bins.
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
  if (above < need && need <= above + local) {  // exactly one thread: the keys matched total >= need
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
  need -= sc.above;
  prefix |= static_cast<uint32_t>(sc.bin) << kShift;
  prefix_mask |= static_cast<uint32_t>(kBins - 1) << kShift;
  return sc.bin_count == need;
}

// Rule "keep every key >= edge" (edge = a bin's lower bound, all of which is taken).
__device__ __forceinline__ KeepRule keep_from_edge(uint32_t edge) {
  // edge == 0 would mean "take everything": it cannot happen when n > k, kept for safety.
  return edge == 0u ? keep_all() : KeepRule{edge - 1u, 0};
}

// The rule that keeps exactly the k largest of scores[0, n). Requires n > k >= 1. All 128 threads.
__device__ __forceinline__ KeepRule select_top_k(const float* scores, int n, int k, SelectScratch& sc) {
  uint32_t prefix = 0u, prefix_mask = 0u;
  int need = k;
  if (radix_pass<21, 11>(scores, n, prefix, prefix_mask, need, sc)) return keep_from_edge(prefix);
  if (radix_pass<10, 11>(scores, n, prefix, prefix_mask, need, sc)) return keep_from_edge(prefix);
  radix_pass<0, 10>(scores, n, prefix, prefix_mask, need, sc);
  return KeepRule{prefix, need};  // prefix is now one exact key: all above it, `need` equal to it
}

// Writes the elements of (scores, idx)[0, n) that `rule` keeps to (dst_scores, dst_idx)[0, kept), in
// arbitrary order, and returns kept (same value in every thread). dst may alias the source list
// (in-place compaction): each chunk is fully read before any of it is written, and writes never pass
// the end of the chunk being processed. dst_scores may be null (scores not wanted). All 128 threads.
__device__ __forceinline__ int filter_keep(const float* scores, const int* idx, int n, KeepRule rule,
                                           float* dst_scores, int* dst_idx, SelectScratch& sc) {
  const int tid = threadIdx.x;
  __syncthreads();  // earlier readers of the counters are done
  if (tid == 0) {
    sc.out_count = 0;
    sc.eq_count = 0;
  }
  __syncthreads();
  for (int base = 0; base < n; base += kSweepElems) {
    float s[kSweepVecs * 4];
    int id[kSweepVecs * 4];
    bool keep[kSweepVecs * 4];
#pragma unroll
    for (int i = 0; i < kSweepVecs; ++i) {
      const int e = base + 4 * (tid + kSelectThreads * i);
      const float4 v = load_scores4(scores, e, n);
      const int4 w = load_index4(idx, e, n);
      s[4 * i + 0] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
      id[4 * i + 0] = w.x, id[4 * i + 1] = w.y, id[4 * i + 2] = w.z, id[4 * i + 3] = w.w;
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const uint32_t key = score_key(s[4 * i + x]);
        keep[4 * i + x] = e + x < n && (key > rule.thr || (key == rule.thr && atomicAdd(&sc.eq_count, 1) < rule.quota));
      }
    }
    __syncthreads();  // the whole chunk is read before any write (dst may alias the source)
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

}  // namespace flashdsa::sm90::indexer_topk_impl
