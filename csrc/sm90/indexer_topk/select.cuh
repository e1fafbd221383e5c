// Internal: CTA-wide exact top-K selection over a candidate list of (score, key index) pairs held
// in global memory, for the fused indexer + top-k kernels. Every routine is a template on the CTA's
// thread count NTH (a multiple of 128): the FP8 kernel runs it over one warpgroup
// (kSelectThreads = 128, SelectScratch), the bf16 kernel (kernel_v2.cuh) over its 256 threads.
//
// Scores are compared through an order-preserving 32-bit key (score_key). A selection returns a
// KeepRule: keep every element with key > thr, and among the elements with key == thr the first
// `quota` met (ties are broken arbitrarily, as docs/spec.md §3 allows). keep_top_k finds the rule and
// applies it, possibly in place. Lists of up to kResidentElems entries (every list when K <= 2048)
// are read from memory once and selected from registers: an exact MSB-first radix select over the
// offsets key - min key, in 11-bit digits of the list's own key span, then a filter whose slots are
// allocated once per warp. Longer lists are streamed from memory on every pass: radix select over the
// raw keys (11 + 11 + 10 bits, select_top_k), then filter_keep. With NTH threads a resident list takes
// 4096 / NTH vectors per thread (8 + 8 at 128 threads, 4 + 4 at 256, which is what lets the bf16 kernel
// keep its 128-register budget).
// The lists are rewritten by the kernel that reads them: their pointers are deliberately not
// __restrict__, so that loads never take the non-coherent read-only path.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kSelectThreads = 128;  // the FP8 kernel: one warpgroup
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kHistBins = 2048;  // widest radix digit: 11 bits
// Elements per thread per sweep of the list (4 x 16-byte vectors), for memory-level parallelism.
constexpr int kSweepVecs = 4;
// Register-resident selection: the longest list it takes. 4096 = K + 2048, the default candidate
// capacity for K = 2048.
constexpr int kResidentElems = 4096;

// The per-thread layout of the selection for a CTA of NTH threads.
template <int NTH>
struct Shape {
  static_assert(NTH % 128 == 0 && NTH <= 1024, "whole warpgroups");
  static constexpr int kWarps = NTH / 32;
  static constexpr int kSweepElems = NTH * kSweepVecs * 4;  // streamed sweep: 16 entries per thread
  // Resident list: 16-byte vectors of scores (and of key indices) per thread, 4 slots each.
  static constexpr int kResidentVecs = kResidentElems / (NTH * 4);
  static constexpr int kResidentSlots = kResidentVecs * 4;
  static_assert(kResidentVecs >= 1 && kResidentSlots <= 32, "resident list: 1..32 slots per thread");
};

// Shared-memory scratch of the selection routines for NTH threads.
template <int NTH>
struct Scratch {
  uint32_t hist[kHistBins];
  int warp_sum[Shape<NTH>::kWarps];
  int bin;        // radix pass result: the bin holding the need-th largest key
  int above;      // number of matching keys in bins above `bin`
  int bin_count;  // number of matching keys in `bin`
  int out_count;  // filter: slots handed out so far
  int eq_count;   // filter: tickets handed to keys equal to the threshold
  uint32_t warp_lo[Shape<NTH>::kWarps];  // resident select: per-warp smallest / largest key of the list
  uint32_t warp_hi[Shape<NTH>::kWarps];
};
using SelectScratch = Scratch<kSelectThreads>;

// a < b  <=>  score_key(a) < score_key(b) for all non-NaN floats (with -0 < +0).
// Every non-NaN score's key is >= 1, so key 0 can mark an empty slot. NaN: the scores are computed
// in the kernel, and GPU arithmetic (FFMA, max.NaN) only produces the canonical NaN 0x7fffffff,
// whose key is 0xffffffff, the largest: a NaN score ranks above +inf, is selected first and is
// reported as NaN (docs/reliability.md). An explicit NaN test here made ptxas spill in the selection.
// (Host too: tests/cuda/select_check.cu compares against it.)
__host__ __device__ __forceinline__ uint32_t score_key(float s) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(s);
#else
  uint32_t u;
  std::memcpy(&u, &s, sizeof(u));
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// Inverse of score_key.
__device__ __forceinline__ float score_from_key(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Keep every element with key > thr; of those with key == thr, keep `quota`.
struct KeepRule {
  uint32_t thr;
  int quota;
};

// Keeps everything (key 0 is below every real score's key).
__device__ __forceinline__ KeepRule keep_all() { return KeepRule{0u, INT_MAX}; }

// Rule "keep every key >= edge" (edge = a bin's lower bound, all of which is taken).
__device__ __forceinline__ KeepRule keep_from_edge(uint32_t edge) {
  // edge == 0 would mean "take everything": it cannot happen when n > k, kept for safety.
  return edge == 0u ? keep_all() : KeepRule{edge - 1u, 0};
}

// Whether `rule` keeps an element with this key (a key equal to the threshold takes a ticket).
template <int NTH>
__device__ __forceinline__ bool rule_keeps(uint32_t key, KeepRule rule, Scratch<NTH>& sc) {
  return key > rule.thr || (key == rule.thr && atomicAdd(&sc.eq_count, 1) < rule.quota);
}

// Result of keep_top_k: entries written, and the threshold of the rule (later candidates must beat it).
struct Kept {
  int count;
  uint32_t thr;
};

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

// Clears the first kBins histogram bins. All threads; the first barrier lets earlier readers of the
// histogram and of the pass results finish.
template <int kBins, int NTH>
__device__ __forceinline__ void clear_hist(Scratch<NTH>& sc) {
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += NTH) sc.hist[b] = 0u;
  __syncthreads();
}

// Where a radix pass goes next: the bin holding the need-th largest counted key, the number of
// counted keys in the bins above it, and the number in it.
struct BinPick {
  int bin;
  int above;
  int count;
};

// Finds the bin holding the need-th largest key of a filled histogram of kBins bins (bins store
// larger keys at higher indices; the histogram counts at least `need` keys). All threads, after the
// histogram is complete (the first barrier).
template <int kBins, int NTH>
__device__ __forceinline__ BinPick pick_bin(int need, Scratch<NTH>& sc) {
  constexpr int kBinsPerThread = kBins / NTH;
  static_assert(kBins <= kHistBins && kBinsPerThread >= 1, "digit too wide for the histogram");
  const int tid = threadIdx.x;
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
  if (above < need && need <= above + local) {  // exactly one thread: the keys counted total >= need
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

// One streamed radix pass: histogram of digit [kShift, kShift + kBits) over the keys whose higher
// bits equal `prefix` (under `prefix_mask`), then the bin holding the need-th largest of them. Updates
// prefix / prefix_mask / need (need becomes the number still to take inside the chosen bin).
// Returns true when the chosen bin is taken whole (the selection is complete).
template <int kShift, int kBits, int NTH>
__device__ __forceinline__ bool radix_pass(const float* scores, int n, uint32_t& prefix,
                                           uint32_t& prefix_mask, int& need, Scratch<NTH>& sc) {
  constexpr int kBins = 1 << kBits;
  const int tid = threadIdx.x;
  clear_hist<kBins>(sc);
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
  const BinPick pick = pick_bin<kBins>(need, sc);
  need -= pick.above;
  prefix |= static_cast<uint32_t>(pick.bin) << kShift;
  prefix_mask |= static_cast<uint32_t>(kBins - 1) << kShift;
  return pick.count == need;
}

// The rule that keeps exactly the k largest of scores[0, n), streaming the list on every pass.
// Requires n > k >= 1. All NTH threads.
template <int NTH>
__device__ __forceinline__ KeepRule select_top_k(const float* scores, int n, int k, Scratch<NTH>& sc) {
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
// the end of the chunk being processed. dst_scores may be null (scores not wanted). All NTH threads.
template <int NTH>
__device__ __forceinline__ int filter_keep(const float* scores, const int* idx, int n, KeepRule rule,
                                           float* dst_scores, int* dst_idx, Scratch<NTH>& sc) {
  const int tid = threadIdx.x;
  __syncthreads();  // earlier readers of the counters are done
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
      for (int x = 0; x < 4; ++x) {
        const uint32_t key = score_key(s[4 * i + x]);
        keep[4 * i + x] = e + x < n && rule_keeps(key, rule, sc);
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

// ---- register-resident path ----------------------------------------------------------------------

// This thread's slots of a list held in registers: slot 4 i + x is element 4 (tid + NTH i) + x, the
// layout of coalesced 16-byte loads. Slots past the end of the list have key 0.
template <int NTH>
struct ResidentList {
  uint32_t key[Shape<NTH>::kResidentSlots];
  int idx[Shape<NTH>::kResidentSlots];
};

// Reads (scores, idx)[0, n), n <= kResidentElems, into registers, aiming for one memory latency:
// every load is issued before the barrier that separates them from their first use (the compiler
// does not move loads across it), and a vector past the end rereads the list's first vector (its slots
// are marked empty) rather than being predicated off into a zero-filled destination, which makes the
// compiler wait for one load before issuing the next into the same registers. The barrier also lets
// earlier readers of the scratch finish. All threads.
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

// The smallest and the largest key of a resident list (UINT_MAX and 0 when it is empty), in every
// thread. Also resets the filter's counters. All threads, right after load_resident.
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

// The rule that keeps exactly the k largest entries of a resident list of n > k >= 1 entries with keys
// in [lo, hi]. Exact MSB-first radix select over the offsets key - lo in 11-bit digits that start at
// the top bit of hi - lo: the first digit spreads the list over the histogram even when every score
// shares its sign, exponent and leading mantissa bits. All threads.
template <int NTH>
__device__ __forceinline__ KeepRule resident_select(const ResidentList<NTH>& list, uint32_t lo, uint32_t hi, int k,
                                                    Scratch<NTH>& sc) {
  const uint32_t span = hi - lo;
  int shift = span == 0u ? 0 : 32 - __clz(static_cast<int>(span));  // every offset is < 2^shift
  uint32_t prefix = 0u, mask = 0u;  // the selection goes on among the offsets o with (o & mask) == prefix
  int need = k;
  while (shift > 0) {
    const int bits = min(shift, 11);
    shift -= bits;
    const uint32_t digit_mask = (1u << bits) - 1u;
    clear_hist<kHistBins>(sc);
#pragma unroll
    for (int s = 0; s < Shape<NTH>::kResidentSlots; ++s) {
      const uint32_t off = list.key[s] - lo;
      if (list.key[s] != 0u && (off & mask) == prefix) atomicAdd(&sc.hist[(off >> shift) & digit_mask], 1u);
    }
    const BinPick pick = pick_bin<kHistBins>(need, sc);
    need -= pick.above;
    prefix |= static_cast<uint32_t>(pick.bin) << shift;
    mask |= digit_mask << shift;
    if (pick.count == need) return keep_from_edge(lo + prefix);
  }
  return KeepRule{lo + prefix, need};  // lo + prefix is now one exact key: all above it, `need` equal to it
}

// Writes the entries of a resident list that `rule` keeps to (dst_scores, dst_idx)[0, kept), in
// arbitrary order, and returns kept (same value in every thread). One shared-memory atomic per warp
// hands out the warp's slots; lanes write consecutive positions per register slot, so the stores
// coalesce. dst may alias the list's memory (every thread read all of it before the barrier in
// load_resident). dst_scores may be null. All threads, after resident_range.
template <int NTH>
__device__ __forceinline__ int resident_filter(const ResidentList<NTH>& list, KeepRule rule, float* dst_scores,
                                               int* dst_idx, Scratch<NTH>& sc) {
  constexpr int kSlots = Shape<NTH>::kResidentSlots;
  uint32_t keep = 0u;  // bit s: slot s is kept
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (list.key[s] != 0u && rule_keeps(list.key[s], rule, sc)) keep |= 1u << s;
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

// ---- entry point ---------------------------------------------------------------------------------

// Writes the k largest entries of (scores, idx)[0, n) (all of them when n <= k) to
// (dst_scores, dst_idx)[0, count), in arbitrary order, and returns count and the threshold of the
// rule applied. dst may alias the list (in-place compaction); dst_scores may be null. All NTH threads
// of the CTA; every thread gets the same result.
template <int NTH>
__device__ __forceinline__ Kept keep_top_k(const float* scores, const int* idx, int n, int k, float* dst_scores,
                                           int* dst_idx, Scratch<NTH>& sc) {
  if (n <= kResidentElems) {
    ResidentList<NTH> list;
    load_resident(scores, idx, n, list);
    uint32_t lo, hi;
    resident_range(list, lo, hi, sc);
    const KeepRule rule = n > k ? resident_select(list, lo, hi, k, sc) : keep_all();
    return Kept{resident_filter(list, rule, dst_scores, dst_idx, sc), rule.thr};
  }
  const KeepRule rule = n > k ? select_top_k(scores, n, k, sc) : keep_all();
  return Kept{filter_keep(scores, idx, n, rule, dst_scores, dst_idx, sc), rule.thr};
}

}  // namespace flashdsa::sm90::indexer_topk_impl
