// Internal: the kernels around the main kernel of the deterministic mode (fixed-point pairs; the main kernel's part:
// kernel_common.cuh; design: docs/kernels/sparse_mla_bwd.md, prediction and measurements: docs/perf-notes.md,
// twenty-third to twenty-fifth sessions). Included by sparse_mla_bwd.cu.
//
//   1. Per (token t, head group g) a bound of one addend that needs no P (P <= 1 per head):
//      |addend| <= Σ_h (scale · 2 ‖dO_th‖ · max_j ‖V_j‖ · max|Q_th| + max|dO_th|) =: A_tg (|dP - Δ| <= 2 ‖dO‖ max ‖V‖,
//      since O is a convex mix of V rows), and q_tg = A_tg / K_t with K_t the token's valid keys: the bound at the mean
//      probability 1 / K_t.
//   2. Per key row j (integer atomics and an unsigned max: order-independent): n_j the addends it receives, Σ q and
//      max q over them (per slot, fix_count_kernel; in the sorted pass from the sorted rows through shared-memory
//      histograms, fix_count_sorted_kernel, whose row sort ran in the bound's CTA: fix_bound_sort_kernel). unit_j = the power of two with unit_j · max(Σ q / 2^5, 256 · max q / 2^4) <= 2^30
//      (fixed_pair::first_unit; the margins from a model of the check program's inputs and of causal softmax rows,
//      docs/perf-notes.md, twenty-fourth session). Per row, so one token with large gradients coarsens only the rows
//      it selects.
//   3. Pass 1 of the main kernel: pairs at unit_j (one FFMA per value, exact below 2^22 units), per row
//      L_j = Σ ⌈max |value| · unit_j⌉ (integers; 2^32 for an addend of 2^22 units or more) and the row's largest |value|.
//   4. Check: a row with L_j >= 2^31 may be wrong: it gets a unit from its measured sums (fixed_pair::rerun_unit),
//      marked negative; its words and L_j are zeroed, and the re-run flag is set. Pass 2
//      (always launched; its CTAs exit at once when the flag is clear) visits only the key blocks holding a marked
//      row, sends only those rows and stores no dq (pass 1's is final), so a few peaky keys cost a block or two per
//      token, not a second backward.
//   5. Decode: each row's pair words -> fp32 (exact integers times 1 / unit), natural column order; a row whose L_j
//      is still >= 2^31 (a non-finite addend) becomes NaN: never a silently wrong value. A row whose guess is not
//      finite (a token's bound overflowed or is NaN) is marked failed before pass 1, so it is sent again with a unit
//      from its measured addends: a meaningless guess never decides a unit.
// Every step is integer arithmetic, a fixed-order float computation or an order-independent max, so the output is
// bitwise the same in every run.
// The per-row rules (first unit, check term, re-run unit, decode) are fixed_pair.h's, tested on the CPU with a model of
// this pipeline (tests/cpp/test_fixed_pair.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "sm90/sparse_mla_bwd/fixed_pair.h"
#include "sm90/sparse_mla_bwd/kernel_common.cuh"

namespace flashdsa::sm90::sparse_mla_bwd_impl {

// Device control words of one call (zeroed before it).
struct FixedCtl {
  uint32_t rerun;      // set by fix_check_kernel when a row must be sent again
  uint32_t vmax_bits;  // max_j ‖kv_j[0:512]‖₂ (float bits)
  uint32_t qmax_bits;  // the largest finite q_tg (float bits): the scale of the per-row guess sums
};

// The margins of the first guess (fixed_pair::first_unit): the row's Σ q and max q taken 2^5 and 2^4 below. Check
// builds raise both to force the re-run path.
#ifndef FLASHDSA_BWD_FIXED_SUM_MARGIN_LOG2
#define FLASHDSA_BWD_FIXED_SUM_MARGIN_LOG2 5
#endif
#ifndef FLASHDSA_BWD_FIXED_MAX_MARGIN_LOG2
#define FLASHDSA_BWD_FIXED_MAX_MARGIN_LOG2 4
#endif
constexpr int kFixedSumMarginLog2 = FLASHDSA_BWD_FIXED_SUM_MARGIN_LOG2;
constexpr int kFixedMaxMarginLog2 = FLASHDSA_BWD_FIXED_MAX_MARGIN_LOG2;
constexpr int kFixedMaxHeads = 128;  // the CUDA backend's largest H (backend.cpp: 16, 32, 64, 128)

// The lanes of a warp read a bf16 row of `cols` values with 16-byte loads (rows are 16-byte aligned, as the main
// kernel's cp.async copies require) and hand each pair of values to f(float2), in a fixed order per lane.
template <class F>
__device__ __forceinline__ void for_each_pair_of_row(const __nv_bfloat16* row, int cols, int lane, F f) {
  for (int c = lane; c < cols / 8; c += 32) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + 8 * c);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int e = 0; e < 4; ++e) f(__bfloat1622float2(h[e]));
  }
}

// max_j ‖kv_j[0:512]‖₂: one warp per row, a fixed summation order, an order-independent max of positive floats.
__global__ void fix_vmax_kernel(const __nv_bfloat16* __restrict__ kv, int64_t stride_t, int64_t t_kv,
                                FixedCtl* __restrict__ ctl) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t j = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; j < t_kv; j += warps) {
    const __nv_bfloat16* row = kv + j * stride_t;
    float ss = 0.f;
    for_each_pair_of_row(row, kVCols, lane, [&](float2 f) { ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss)); });
    for (int mask = 16; mask > 0; mask >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, mask);
    if (lane == 0) atomicMax(&ctl->vmax_bits, __float_as_uint(sqrtf(ss)));
  }
}

// q_tg = A_tg / K_t (step 1 above): one CTA per token, a warp per head, the heads of a group summed in order.
constexpr int kBoundThreads = 256;
struct BoundParams {
  const __nv_bfloat16* q;
  int64_t q_stride_t, q_stride_h;
  const __nv_bfloat16* dout;
  int H;
  float scale;
  const int32_t* indices;
  int64_t idx_stride_t;
  int K;
  int64_t t_kv;
  float* qg;
  FixedCtl* ctl;
};
__device__ __forceinline__ void bound_of_token(const BoundParams& p, int64_t t, float* term) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float vmax = __uint_as_float(p.ctl->vmax_bits);
  int valid = 0;  // K_t (the same count in every thread)
  for (int k0 = 0; k0 < p.K; k0 += kBoundThreads) {
    const int k = k0 + threadIdx.x;
    const int32_t idx = k < p.K ? p.indices[t * p.idx_stride_t + k] : -1;
    valid += __syncthreads_count(idx >= 0 && idx < p.t_kv);
  }
  for (int h = warp; h < p.H; h += kBoundThreads / 32) {
    const __nv_bfloat16* qr = p.q + t * p.q_stride_t + h * p.q_stride_h;
    const __nv_bfloat16* dr = p.dout + (t * p.H + h) * int64_t(kVCols);
    float qmax = 0.f, dmax = 0.f, dss = 0.f;
    for_each_pair_of_row(qr, kQkCols, lane, [&](float2 f) { qmax = fmaxf(qmax, fmaxf(fabsf(f.x), fabsf(f.y))); });
    for_each_pair_of_row(dr, kVCols, lane, [&](float2 f) {
      dmax = fmaxf(dmax, fmaxf(fabsf(f.x), fabsf(f.y)));
      dss = fmaf(f.x, f.x, fmaf(f.y, f.y, dss));
    });
    for (int mask = 16; mask > 0; mask >>= 1) {
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, mask));
      dmax = fmaxf(dmax, __shfl_xor_sync(0xffffffffu, dmax, mask));
      dss += __shfl_xor_sync(0xffffffffu, dss, mask);
    }
    if (lane == 0) term[h] = fabsf(p.scale) * 2.f * sqrtf(dss) * vmax * qmax + dmax;
  }
  __syncthreads();
  const int groups = (p.H + kHeadsPerCta - 1) / kHeadsPerCta;
  if (threadIdx.x < groups) {
    float a = 0.f;
    for (int h = threadIdx.x * kHeadsPerCta; h < min(p.H, (threadIdx.x + 1) * kHeadsPerCta); ++h) a += term[h];
    a *= 1.0625f;  // + the bf16 roundings of P, dS, O
    // a NaN or inf q marks its rows (fix_count_kernel's max), not the scale of the sums
    const float qv = valid > 0 ? a / float(valid) : 0.f;
    p.qg[t * groups + threadIdx.x] = qv;
    if (qv > 0.f && qv < INFINITY) atomicMax(&p.ctl->qmax_bits, __float_as_uint(qv));
  }
}
__global__ void __launch_bounds__(kBoundThreads) fix_bound_kernel(const BoundParams p) {
  __shared__ float term[kFixedMaxHeads];
  bound_of_token(p, blockIdx.x, term);
}

// What one slot of token t adds to its key row's guesses (step 2 above): the Σ q terms and the largest |q| bits over the
// token's head groups.
__device__ __forceinline__ void token_guess(const float* __restrict__ qg, int64_t t, int groups, float q_max,
                                            unsigned long long* terms, uint32_t* top) {
  *terms = 0ull;
  *top = 0u;
  for (int g = 0; g < groups; ++g) {
    const float qv = qg[t * groups + g];
    *terms += fixed_pair::q_term(qv, q_max);
    *top = max(*top, __float_as_uint(qv) & 0x7FFFFFFFu);
  }
}

// Per valid slot (step 2 above): n_j += G, Σ q (fixed-point terms, integer atomics) and max q (unsigned max of the
// float bits: NaN and inf above every finite value) of the token's head groups.
__global__ void fix_count_kernel(const int32_t* __restrict__ indices, int64_t stride_t, int64_t tokens, int K,
                                 int64_t t_kv, int groups, const float* __restrict__ qg,
                                 const FixedCtl* __restrict__ ctl, int32_t* __restrict__ count,
                                 unsigned long long* __restrict__ qsum, uint32_t* __restrict__ qrow) {
  const float q_max = __uint_as_float(ctl->qmax_bits);
  const int64_t n = tokens * K;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / K;
    const int32_t idx = indices[l * stride_t + (i - l * K)];
    if (idx < 0 || idx >= t_kv) continue;
    unsigned long long terms;
    uint32_t top;
    token_guess(qg, l, groups, q_max, &terms, &top);
    atomicAdd(&count[idx], groups);
    if (terms != 0ull) atomicAdd(&qsum[idx], terms);
    atomicMax(&qrow[idx], top);
  }
}

// Step 2 from the sorted rows (the sorted pass, T_kv >= kSweepMinKeys: each row's keys ascending, invalid slots =
// t_kv and pads above it, sort_rows_kernel): the same words as fix_count_kernel with shared-memory totals in place of
// one global atomic per slot and word (at 32K that kernel's 200 M L2 atomics cost 2.7 ms on an H100, 3.5% of the
// deterministic backward; docs/perf-notes.md, thirty-first session). A CTA owns a run of tokens and a group of
// consecutive key ranges of kCountRangeKeys rows; it walks its ranges in ascending order, each warp one token at a time
// from that token's cursor (its first key of the range: one warp-wide search per token and CTA, then the cursor only
// moves forward), and adds the range's totals to the global words before the next range. Integer sums and unsigned
// maxima: the words are bitwise those of fix_count_kernel in every run.
constexpr int kCountRangeKeys = 4096;  // key rows of one shared-memory histogram (16 bytes each)
constexpr int kCountThreads = 512;
constexpr int kCountUnroll = 4;        // 128 keys of a row per warp step
constexpr int kCountMaxTokens = 2048;  // tokens of one CTA (the cursors)
constexpr int kCountSmemBytes = kCountRangeKeys * (8 + 4 + 4) + kCountMaxTokens * 4;
struct CountSortedParams {
  const int32_t* keys;  // [tokens, K] sorted rows
  int K;
  int64_t tokens, tokens_per_cta, t_kv;
  int ranges_per_cta, groups;
  const float* qg;
  const FixedCtl* ctl;
  int32_t* count;
  unsigned long long* qsum;
  uint32_t* qrow;
};

// The first position of a sorted row of n keys whose key is >= lo (n if none): a warp-wide search, 32 probes a round.
__device__ __forceinline__ int warp_lower_bound(const int32_t* row, int n, int64_t lo_key, int lane) {
  int lo = 0, hi = n;
  while (hi - lo > 32) {
    const int step = (hi - lo + 31) / 32;
    const int pos = lo + lane * step;
    const bool probe = pos < hi;
    const int less = __popc(__ballot_sync(0xffffffffu, probe && row[pos] < lo_key));
    const int probes = __popc(__ballot_sync(0xffffffffu, probe));
    const int new_lo = less == 0 ? lo : lo + (less - 1) * step + 1;
    hi = less == probes ? hi : lo + less * step;
    lo = new_lo;
  }
  const int pos = lo + lane;
  return lo + __popc(__ballot_sync(0xffffffffu, pos < hi && row[pos] < lo_key));
}

__global__ void __launch_bounds__(kCountThreads, 2) fix_count_sorted_kernel(const CountSortedParams p) {
  extern __shared__ __align__(16) unsigned char count_smem[];
  auto* const s_sum = reinterpret_cast<unsigned long long*>(count_smem);
  uint32_t* const s_cnt = reinterpret_cast<uint32_t*>(s_sum + kCountRangeKeys);
  uint32_t* const s_max = s_cnt + kCountRangeKeys;
  int32_t* const s_cur = reinterpret_cast<int32_t*>(s_max + kCountRangeKeys);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  constexpr int kWarps = kCountThreads / 32;
  const int64_t t_begin = int64_t(blockIdx.y) * p.tokens_per_cta;
  const int n_tok = static_cast<int>(min(p.tokens_per_cta, p.tokens - t_begin));
  const int64_t range0 = int64_t(blockIdx.x) * p.ranges_per_cta;
  const int64_t ranges = (p.t_kv + kCountRangeKeys - 1) / kCountRangeKeys;
  const int64_t range_end = min(range0 + p.ranges_per_cta, ranges);
  const float q_max = __uint_as_float(p.ctl->qmax_bits);
  if (n_tok <= 0 || range0 >= range_end) return;  // uniform per CTA
  for (int i = warp; i < n_tok; i += kWarps) {
    const int c = warp_lower_bound(p.keys + (t_begin + i) * p.K, p.K, range0 * kCountRangeKeys, lane);
    if (lane == 0) s_cur[i] = c;
  }
  for (int64_t r = range0; r < range_end; ++r) {
    const int64_t r_lo = r * kCountRangeKeys;
    const int64_t r_hi = min(r_lo + kCountRangeKeys, p.t_kv);
    for (int i = threadIdx.x; i < kCountRangeKeys; i += kCountThreads) {
      s_sum[i] = 0ull;
      s_cnt[i] = 0u;
      s_max[i] = 0u;
    }
    __syncthreads();  // also orders the first range's cursors before their reads
    for (int i = warp; i < n_tok; i += kWarps) {
      const int64_t t = t_begin + i;
      unsigned long long terms;
      uint32_t top;
      token_guess(p.qg, t, p.groups, q_max, &terms, &top);
      const int32_t* const row = p.keys + t * p.K;
      int c = __shfl_sync(0xffffffffu, lane == 0 ? s_cur[i] : 0, 0);  // lane 0 owns the token's cursor
      for (;;) {  // the row's keys in [r_lo, r_hi) are the ones from the cursor on below r_hi
        int32_t key[kCountUnroll];  // kCountUnroll independent loads in flight per lane
#pragma unroll
        for (int u = 0; u < kCountUnroll; ++u) {
          const int pos = c + 32 * u + lane;
          key[u] = pos < p.K ? row[pos] : INT32_MAX;
        }
        int n_in = 0;
#pragma unroll
        for (int u = 0; u < kCountUnroll; ++u) {
          const bool in = key[u] < r_hi;
          if (in) {
            const int k = static_cast<int>(key[u] - r_lo);
            atomicAdd(&s_cnt[k], static_cast<uint32_t>(p.groups));
            if (terms != 0ull) atomicAdd(&s_sum[k], terms);
            atomicMax(&s_max[k], top);
          }
          n_in += __popc(__ballot_sync(0xffffffffu, in));
        }
        c += n_in;
        if (n_in < 32 * kCountUnroll) break;
      }
      if (lane == 0) s_cur[i] = c;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < r_hi - r_lo; i += kCountThreads) {
      if (s_cnt[i] == 0u) continue;
      atomicAdd(&p.count[r_lo + i], static_cast<int32_t>(s_cnt[i]));
      if (s_sum[i] != 0ull) atomicAdd(&p.qsum[r_lo + i], s_sum[i]);
      atomicMax(&p.qrow[r_lo + i], s_max[i]);
    }
    __syncthreads();  // the flush reads before the next range's zeroing
  }
}

// unit_j from the row's guesses (fixed_pair::first_unit); L_j = 0, no addend capped. A row whose largest q is not
// finite starts failed (L_j = 2^32, capped: fix_check_kernel sizes it from the measured n_j · max |addend|).
__global__ void fix_units_kernel(const int32_t* __restrict__ count, const unsigned long long* __restrict__ qsum,
                                 const uint32_t* __restrict__ qrow, const FixedCtl* __restrict__ ctl, int64_t t_kv,
                                 float* __restrict__ unit, unsigned long long* __restrict__ l1,
                                 uint32_t* __restrict__ capped, uint32_t* __restrict__ amax) {
  const float q_max = __uint_as_float(ctl->qmax_bits);
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < t_kv; j += int64_t(gridDim.x) * blockDim.x) {
    const bool guess_finite = qrow[j] < 0x7F800000u;
    unit[j] = guess_finite ? fixed_pair::first_unit(fixed_pair::q_sum(qsum[j], q_max), __uint_as_float(qrow[j]),
                                                    kFixedSumMarginLog2, kFixedMaxMarginLog2)
                           : 1.f;
    l1[j] = guess_finite || count[j] == 0 ? 0ull : fixed_pair::kCheckCap;
    capped[j] = guess_finite || count[j] == 0 ? 0u : 1u;
    amax[j] = 0u;
  }
}

// Rows whose check sum reached 2^31: a new unit (negative: pass 2 sends the row) from the row's measured largest
// addend and Σ |addend| (fixed_pair::rerun_unit: pass 2 cannot fail for finite addends); the row's words, check sum
// and capped flag zeroed, the re-run flag set.
__global__ void fix_check_kernel(float* __restrict__ dkv, float* __restrict__ unit, unsigned long long* __restrict__ l1,
                                 uint32_t* __restrict__ capped, const uint32_t* __restrict__ amax,
                                 const int32_t* __restrict__ count, int64_t t_kv, FixedCtl* __restrict__ ctl) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < t_kv; j += int64_t(gridDim.x) * blockDim.x) {
    if (l1[j] < fixed_pair::kCheckExact) continue;
    unit[j] = -fixed_pair::rerun_unit(l1[j], capped[j] != 0u, unit[j], count[j], amax[j]);
    l1[j] = 0ull;
    capped[j] = 0u;
    float4* const row = reinterpret_cast<float4*>(dkv + j * kQkCols);
    for (int c = 0; c < kQkCols / 4; ++c) row[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    ctl->rerun = 1u;
  }
}

// One thread per (key row, 128-byte line): the 16 pair words of the line (words k and 8 + k hold stored positions
// 4k, 4k + 1 and 4k + 2, 4k + 3: put_fixed_words) -> 32 fp32 values times 1 / |unit|, in natural column order
// (stored position dkv_pos(c) -> column c), written over the same line. NaN for a row that is not proven exact.
__global__ void fix_decode_kernel(float* __restrict__ dkv, const float* __restrict__ unit,
                                  const unsigned long long* __restrict__ l1, const int32_t* __restrict__ count,
                                  int64_t t_kv) {
  constexpr int kLines = kQkCols / 32;
  const int64_t n = t_kv * kLines;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = g / kLines;
    uint64_t* const words = reinterpret_cast<uint64_t*>(dkv + g * 32);
    float v[32];
    if (l1[j] >= fixed_pair::kCheckExact) {
#pragma unroll
      for (int p = 0; p < 32; ++p) v[p] = __int_as_float(0x7FC00000);
    } else {
      const float inv = 1.f / fabsf(unit[j]);  // a power of two in [2^-126, 2^126]: exact
      // the raw words' sum minus the row's bias (put_fixed_words; n = the row's addend count < 2^32)
      const auto word = [&](int w) { return fixed_pair::unbias(words[w], uint32_t(count[j])); };
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        fixed_pair::decode(word(k), inv, v[4 * k], v[4 * k + 1]);
        fixed_pair::decode(word(8 + k), inv, v[4 * k + 2], v[4 * k + 3]);
      }
    }
    float4* const out = reinterpret_cast<float4*>(words);
#pragma unroll
    for (int c = 0; c < 32; c += 4)
      out[c / 4] = make_float4(v[dkv_pos(c)], v[dkv_pos(c + 1)], v[dkv_pos(c + 2)], v[dkv_pos(c + 3)]);
  }
}

}  // namespace flashdsa::sm90::sparse_mla_bwd_impl
