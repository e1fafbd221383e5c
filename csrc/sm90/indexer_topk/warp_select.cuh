// Internal: exact top-k selection by ONE warp over a candidate list in global memory, for the per-row tail of the
// FP8 selection's band re-score (fp8_kernel_v2.cuh): each warp of a CTA selects its own row, so the rows of a
// block are selected concurrently and without CTA barriers (select.cuh's routines use the whole CTA for one list
// and pay five CTA barriers per radix pass, which made the tail's selections cost more than its re-score).
//
// The list is streamed from memory on every pass (16-byte vectors, kWarpSweepVecs per lane in flight; the filter
// kWarpFilterVecs of scores and of indices), so any length works: no list is held in registers or shared memory. The rule is found by an exact MSB-first radix select over the
// offsets key - lo (lo / hi: the list's smallest / largest key, one pass), in 11-bit digits starting at the top bit
// of hi - lo, on a 2048-bin histogram of the warp's own in shared memory; it is the same KeepRule as select.cuh's
// (keep every key > thr and, of the keys == thr, the first `quota` met). The filter hands out slots and the tickets
// of keys equal to a threshold with ballots in a fixed order (no atomics): the result is deterministic.
// The lists are rewritten by the kernel that reads them: their pointers are not __restrict__.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "sm90/indexer_topk/select.cuh"

namespace flashdsa::sm90::indexer_topk_impl {

constexpr int kWarpHistBins = 2048;  // 11-bit digits
constexpr int kWarpSweepVecs = 4;                          // 16-byte score vectors per lane per sweep step
constexpr int kWarpSweepElems = 32 * 4 * kWarpSweepVecs;  // 512 entries per step
constexpr int kWarpFilterVecs = 2;                         // the filter's: scores and indices (the kernel's registers)
constexpr int kWarpFilterElems = 32 * 4 * kWarpFilterVecs;

// This thread's lane, read through a volatile asm: nothing derived from it (bin addresses, lane masks) can be
// hoisted out of the calling kernel's loops into registers that the kernel's walk would then carry (that made
// ptxas spill inside the FP8 walk's tile loop).
__device__ __forceinline__ int warp_lane() {
#if defined(FLASHDSA_WARP_EMULATION)  // host emulation of the warp (tests/cpp/warp_emulation/)
  return ::flashdsa_emu::lane();
#else
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#endif
}

// This thread's warp in the CTA (a 1-D block), read the same way.
__device__ __forceinline__ int warp_in_cta() {
#if defined(FLASHDSA_WARP_EMULATION)
  return ::flashdsa_emu::warp();
#else
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid >> 5;
#endif
}

// Calls f(key) for every entry of scores[0, n) (key = score_key of the entry), kWarpSweepVecs vectors per lane
// in flight. All 32 lanes.
template <class F>
__device__ __forceinline__ void warp_for_each_key(const float* scores, int n, F&& f) {
  const int lane = warp_lane();
  for (int base = 0; base < n; base += kWarpSweepElems) {
    float4 v[kWarpSweepVecs];
#pragma unroll
    for (int i = 0; i < kWarpSweepVecs; ++i) v[i] = load_scores4(scores, base + 4 * (lane + 32 * i), n);
#pragma unroll
    for (int i = 0; i < kWarpSweepVecs; ++i) {
      const int e = base + 4 * (lane + 32 * i);
      const float s[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
        if (e + x < n) f(score_key(s[x]));
    }
  }
}

// The smallest and the largest key of scores[0, n) (UINT_MAX and 0 when n == 0), in every lane.
__device__ __forceinline__ void warp_key_range(const float* scores, int n, uint32_t& lo, uint32_t& hi) {
  uint32_t l = UINT_MAX, h = 0u;
  warp_for_each_key(scores, n, [&](uint32_t key) {
    l = min(l, key);
    h = max(h, key);
  });
  lo = __reduce_min_sync(0xffffffffu, l);
  hi = __reduce_max_sync(0xffffffffu, h);
}

// The bin holding the need-th largest key counted in hist[0, kBins) (larger keys in higher bins; the histogram
// counts at least `need` keys), the number of keys in the bins above it and in it; in every lane. Lane l sums the
// bins [kBins - B (l + 1), kBins - B l), B = kBins / 32 (its 16-byte loads rotated by l: no bank conflicts), a
// scan over the lanes counts the keys above each lane's bins, and the one lane whose bins hold the need-th key
// walks them.
template <int kBins = kWarpHistBins>
__device__ __forceinline__ BinPick warp_pick_bin(const uint32_t* hist, int need) {
  constexpr int kPerLane = kBins / 32;
  const int lane = warp_lane();
  const int top = kBins - lane * kPerLane;
  const uint4* mine = reinterpret_cast<const uint4*>(hist + top - kPerLane);
  int local = 0;
#pragma unroll
  for (int i = 0; i < kPerLane / 4; ++i) {
    const uint4 v = mine[(i + lane) % (kPerLane / 4)];
    local += static_cast<int>(v.x + v.y + v.z + v.w);
  }
  int incl = local;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const int above = incl - local;
  const bool holds = above < need && need <= incl;
  int bin = 0, before = above, count = 0;
  if (holds) {
    for (int b = top - 1; b >= top - kPerLane; --b) {
      const int c = static_cast<int>(hist[b]);
      if (before + c >= need) {
        bin = b;
        count = c;
        break;
      }
      before += c;
    }
  }
  const int src = __ffs(__ballot_sync(0xffffffffu, holds)) - 1;
  return BinPick{__shfl_sync(0xffffffffu, bin, src), __shfl_sync(0xffffffffu, before, src),
                 __shfl_sync(0xffffffffu, count, src)};
}

// An MSB-first radix select in progress over the offsets key - lo: it goes on among the offsets o with
// (o & mask) == prefix, for the need-th largest, with `shift` bits still below the digits done.
struct WarpRadix {
  uint32_t lo, prefix, mask;
  int need, shift;
};

// Starts the select of the k-th largest key in [lo, hi]: the first digit starts at the top bit of hi - lo.
__device__ __forceinline__ WarpRadix warp_radix_start(uint32_t lo, uint32_t hi, int k) {
  const uint32_t span = hi - lo;
  return WarpRadix{lo, 0u, 0u, k, span == 0u ? 0 : 32 - __clz(static_cast<int>(span))};  // every offset < 2^shift
}

// The width of the select's next digit (kDigit bits, fewer at the end).
template <int kDigit = 11>
__device__ __forceinline__ int warp_radix_bits(const WarpRadix& st) { return min(st.shift, kDigit); }

// Clears the warp's kWarpHistBins bins once every lane is done reading them (the previous pass). All 32 lanes.
__device__ __forceinline__ void warp_clear_hist(uint32_t* hist) {
  const int lane = warp_lane();
  __syncwarp();
#pragma unroll
  for (int i = lane; i < kWarpHistBins / 4; i += 32) reinterpret_cast<uint4*>(hist)[i] = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();
}

// Counts the next digit (warp_radix_bits(st) bits) of the keys still in the select into hist (cleared first).
__device__ __forceinline__ void warp_radix_count(const float* scores, int n, const WarpRadix& st, uint32_t* hist) {
  const int shift = st.shift - warp_radix_bits(st);
  const uint32_t digit_mask = (1u << warp_radix_bits(st)) - 1u;
  warp_clear_hist(hist);
  warp_for_each_key(scores, n, [&](uint32_t key) {
    const uint32_t off = key - st.lo;
    if ((off & st.mask) == st.prefix) atomicAdd(&hist[(off >> shift) & digit_mask], 1u);
  });
  __syncwarp();
}

// Counts the next 10-bit digit of two selects over the same list in one pass: a's into hist[0, 1024), b's into
// hist[1024, 2048) (a key in both selects is counted in both halves).
__device__ __forceinline__ void warp_radix_count2(const float* scores, int n, const WarpRadix& a, const WarpRadix& b,
                                                  uint32_t* hist) {
  const int shift_a = a.shift - warp_radix_bits<10>(a), shift_b = b.shift - warp_radix_bits<10>(b);
  const uint32_t mask_a = (1u << warp_radix_bits<10>(a)) - 1u, mask_b = (1u << warp_radix_bits<10>(b)) - 1u;
  warp_clear_hist(hist);
  warp_for_each_key(scores, n, [&](uint32_t key) {
    const uint32_t off = key - a.lo;  // (a.lo == b.lo)
    if ((off & a.mask) == a.prefix) atomicAdd(&hist[(off >> shift_a) & mask_a], 1u);
    if ((off & b.mask) == b.prefix) atomicAdd(&hist[kWarpHistBins / 2 + ((off >> shift_b) & mask_b)], 1u);
  });
  __syncwarp();
}

// Takes the counted digit into the select: picks the bin of the need-th largest key. Returns true, with the rule
// in *rule, when the select is complete (the bin is taken whole, or no bits are left).
// kDigit: the digit width of the count (its histogram has 2^kDigit bins).
template <int kDigit = 11>
__device__ __forceinline__ bool warp_radix_step(const uint32_t* hist, WarpRadix& st, KeepRule* rule) {
  const int bits = warp_radix_bits<kDigit>(st);
  st.shift -= bits;
  const BinPick pick = warp_pick_bin<(1 << kDigit)>(hist, st.need);
  st.need -= pick.above;
  st.prefix |= static_cast<uint32_t>(pick.bin) << st.shift;
  st.mask |= ((1u << bits) - 1u) << st.shift;
  if (pick.count == st.need) {
    *rule = keep_from_edge(st.lo + st.prefix);
    return true;
  }
  // Out of bits: lo + prefix is one exact key: all above it, `need` equal to it.
  *rule = KeepRule{st.lo + st.prefix, st.need};
  return st.shift == 0;
}

// The rule that keeps exactly the k largest entries of scores[0, n), n > k >= 1, whose keys lie in [lo, hi].
// hist: this warp's kWarpHistBins words of shared memory. All 32 lanes.
__device__ __forceinline__ KeepRule warp_select(const float* scores, int n, int k, uint32_t lo, uint32_t hi,
                                                uint32_t* hist) {
  WarpRadix st = warp_radix_start(lo, hi, k);
  KeepRule rule{lo, k};  // (span 0: every key equals lo)
  while (st.shift > 0) {
    warp_radix_count(scores, n, st, hist);
    if (warp_radix_step(hist, st, &rule)) break;
  }
  return rule;
}

// The rule that keeps the k largest entries of scores[0, n) (every entry when n <= k). All 32 lanes.
__device__ __forceinline__ KeepRule warp_top_k_rule(const float* scores, int n, int k, uint32_t* hist) {
  if (n <= k) return keep_all();
  uint32_t lo, hi;
  warp_key_range(scores, n, lo, hi);
  return warp_select(scores, n, k, lo, hi, hist);
}

// Whether `rule` takes this lane's entry (valid, key) of a slot the whole warp examines; the tickets of keys equal
// to the rule's threshold go in lane order, `tickets` counting those handed out so far (warp-uniform). All lanes.
__device__ __forceinline__ bool warp_rule_takes(bool valid, uint32_t key, KeepRule rule, unsigned lanes_below,
                                                int& tickets) {
  const unsigned equal = __ballot_sync(0xffffffffu, valid && key == rule.thr);
  const bool takes =
      valid && (key > rule.thr || (key == rule.thr && tickets + __popc(equal & lanes_below) < rule.quota));
  tickets += __popc(equal);
  return takes;
}

// Appends this lane's id to dst[count + ...] when `take` (lanes in order) and advances the warp-uniform count.
__device__ __forceinline__ void warp_append(bool take, int id, int* dst, unsigned lanes_below, int& count) {
  const unsigned taken = __ballot_sync(0xffffffffu, take);
  if (take) dst[count + __popc(taken & lanes_below)] = id;
  count += __popc(taken);
}

// The exclusive prefix over the lanes of a packed pair of counts (low / high 16 bits) and, in `total`, their sum.
__device__ __forceinline__ unsigned warp_exclusive_counts(unsigned packed, unsigned& total) {
  const int lane = warp_lane();
  unsigned incl = packed;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  total = __shfl_sync(0xffffffffu, incl, 31);
  return incl - packed;
}

// Writes the indices of the entries of (scores, idx)[0, n) that `top` keeps to top_idx[0, x) (kTopScores: their
// scores to top_s[0, x) too) and, kRest, those of the other entries that `rest` keeps to rest_idx[0, y); returns
// {x, y} in every lane. Slots and the tickets of
// keys equal to a threshold go in a fixed order (an entry at a threshold the two rules share takes a ticket of `top`
// first, so rest.quota counts only the entries `top` left). rest_idx may alias idx: each sweep step's entries are
// read before any of them is written, and the compacted writes never pass them. All 32 lanes.
// A lane's 4 entries of a vector are contiguous in the list. A vector with no key equal to a threshold (nearly all)
// takes one scan of the lanes' packed counts and writes in list order; one holding such a key goes entry by entry
// with ballots (the tickets in a fixed order: the x-th entries of the lanes in lane order, x = 0 .. 3).
template <bool kRest, bool kTopScores = false>
__device__ __forceinline__ int2 warp_filter(const float* scores, const int* idx, int n, KeepRule top, KeepRule rest,
                                            int* top_idx, int* rest_idx, float* top_s = nullptr) {
  const int lane = warp_lane();
  const unsigned below = (1u << lane) - 1u;
  int n_top = 0, n_rest = 0, eq_top = 0, eq_rest = 0;  // warp-uniform running counts
  for (int base = 0; base < n; base += kWarpFilterElems) {
    float4 v[kWarpFilterVecs];
    int4 w[kWarpFilterVecs];
#pragma unroll
    for (int i = 0; i < kWarpFilterVecs; ++i) {
      v[i] = load_scores4(scores, base + 4 * (lane + 32 * i), n);
      w[i] = load_index4(idx, base + 4 * (lane + 32 * i), n);
    }
    __syncwarp();  // the whole step is read before any of it is written (rest_idx may alias idx)
#pragma unroll
    for (int i = 0; i < kWarpFilterVecs; ++i) {
      const int e = base + 4 * (lane + 32 * i);
      const float s[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      const int id[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
      unsigned top_mask = 0u, rest_mask = 0u;
      bool at_thr = false;
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const bool valid = e + x < n;
        const uint32_t key = score_key(s[x]);
        const bool t = valid && key > top.thr;
        top_mask |= static_cast<unsigned>(t) << x;
        if constexpr (kRest) rest_mask |= static_cast<unsigned>(valid && !t && key > rest.thr) << x;
        at_thr |= valid && (key == top.thr || (kRest && key == rest.thr));
      }
      if (!__any_sync(0xffffffffu, at_thr)) {
        unsigned total;
        const unsigned before = warp_exclusive_counts(__popc(top_mask) | (__popc(rest_mask) << 16), total);
        // This lane's first slot in each list, then each taken entry at its rank among the lane's taken ones.
        int* const top_at = top_idx + (n_top + static_cast<int>(before & 0xffffu));
        float* const top_s_at = kTopScores ? top_s + (n_top + static_cast<int>(before & 0xffffu)) : nullptr;
        int* const rest_at = kRest ? rest_idx + (n_rest + static_cast<int>(before >> 16)) : nullptr;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const unsigned lower = (1u << x) - 1u;
          if (top_mask & (1u << x)) {
            top_at[__popc(top_mask & lower)] = id[x];
            if constexpr (kTopScores) top_s_at[__popc(top_mask & lower)] = s[x];
          }
          if constexpr (kRest)
            if (rest_mask & (1u << x)) rest_at[__popc(rest_mask & lower)] = id[x];
        }
        n_top += static_cast<int>(total & 0xffffu);
        n_rest += static_cast<int>(total >> 16);
        continue;
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const bool valid = e + x < n;
        const uint32_t key = score_key(s[x]);
        const bool is_top = warp_rule_takes(valid, key, top, below, eq_top);
        if constexpr (kTopScores) {
          const unsigned taken = __ballot_sync(0xffffffffu, is_top);
          if (is_top) top_s[n_top + __popc(taken & below)] = s[x];
        }
        warp_append(is_top, id[x], top_idx, below, n_top);
        if constexpr (kRest) {
          const bool is_rest = warp_rule_takes(valid && !is_top, key, rest, below, eq_rest);
          warp_append(is_rest, id[x], rest_idx, below, n_rest);
        }
      }
    }
  }
  return make_int2(n_top, n_rest);
}

// Splits (scores, idx)[0, n) by rank (ties broken in a fixed order): the indices of its k largest entries go to
// top_idx[0, top), those ranked k + 1 .. k_keep to rest_idx[0, rest), the others are dropped; returns
// {top, rest} = {min(n, k), min(n, k_keep) - top}. rest_idx may alias idx. Requires 1 <= k <= k_keep.
// hist: this warp's kWarpHistBins words of shared memory. All 32 lanes.
__device__ __forceinline__ int2 warp_split_top_k(const float* scores, const int* idx, int n, int k, int k_keep,
                                                 int* top_idx, int* rest_idx, uint32_t* hist) {
  KeepRule keep = keep_all(), top = keep_all();
  if (n > k) {
    uint32_t lo, hi;
    warp_key_range(scores, n, lo, hi);
    // The two selects share their first digit's count (one pass over the list instead of two).
    WarpRadix st_top = warp_radix_start(lo, hi, k), st_keep = warp_radix_start(lo, hi, k_keep);
    top = keep = KeepRule{lo, 0};  // (span 0: every key equals lo; quotas below)
    bool top_done = st_top.shift == 0, keep_done = n <= k_keep || st_keep.shift == 0;
    if (top_done) top.quota = k;
    if (n <= k_keep) keep = keep_all();
    else if (keep_done) keep.quota = k_keep;
    if (!top_done) {
      warp_radix_count(scores, n, st_top, hist);
      if (!keep_done) {
        keep_done = warp_radix_step(hist, st_keep, &keep);
        __syncwarp();
      }
      top_done = warp_radix_step(hist, st_top, &top);
    }
    // The later digits of both selects, 10 bits each, counted in one pass into the two halves of the histogram.
    while (!keep_done && !top_done) {
      warp_radix_count2(scores, n, st_keep, st_top, hist);
      keep_done = warp_radix_step<10>(hist, st_keep, &keep);
      top_done = warp_radix_step<10>(hist + kWarpHistBins / 2, st_top, &top);
    }
    while (!keep_done) {
      warp_radix_count(scores, n, st_keep, hist);
      keep_done = warp_radix_step(hist, st_keep, &keep);
    }
    while (!top_done) {
      warp_radix_count(scores, n, st_top, hist);
      top_done = warp_radix_step(hist, st_top, &top);
    }
  }
  // The rest: what `keep` takes and `top` does not (at a shared threshold the top's tickets come first).
  const KeepRule rest{keep.thr, keep.thr == top.thr ? keep.quota - top.quota : keep.quota};
  return warp_filter<true>(scores, idx, n, top, rest, top_idx, rest_idx);
}

// Writes the indices of the k largest entries of (scores, idx)[0, n) (all of them when n <= k; ties broken in a
// fixed order) to dst_idx[0, count) and returns count. All 32 lanes.
__device__ __forceinline__ int warp_keep_top_k(const float* scores, const int* idx, int n, int k, int* dst_idx,
                                               uint32_t* hist) {
  const KeepRule rule = warp_top_k_rule(scores, n, k, hist);
  return warp_filter<false>(scores, idx, n, rule, keep_all(), dst_idx, nullptr).x;
}

// The bf16 kernel's final selection of one row by one warp (D_I = 128, kernel_v2.cuh warp_final_selects): the k largest
// entries of (scores, idx)[0, n) to dst_idx[0, c) and, unless dst_s is null, their scores to dst_s[0, c), c = min(n, k)
// (ties broken in a fixed order), then dst_idx / dst_s[c, k) = -1 / -inf. All 32 lanes.
__device__ __forceinline__ void warp_write_top_k(const float* scores, const int* idx, int n, int k, int32_t* dst_idx,
                                                 float* dst_s, uint32_t* hist) {
  const KeepRule rule = warp_top_k_rule(scores, n, k, hist);
  const int kept = dst_s != nullptr
                       ? warp_filter<false, true>(scores, idx, n, rule, keep_all(), dst_idx, nullptr, dst_s).x
                       : warp_filter<false>(scores, idx, n, rule, keep_all(), dst_idx, nullptr).x;
  for (int j = kept + warp_lane(); j < k; j += 32) {
    dst_idx[j] = -1;
    if (dst_s != nullptr) dst_s[j] = -INFINITY;
  }
}

}  // namespace flashdsa::sm90::indexer_topk_impl
