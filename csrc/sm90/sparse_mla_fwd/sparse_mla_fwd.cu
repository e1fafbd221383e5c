// Hopper (sm_90a) sparse MLA forward, docs/spec.md §4. Design, smem plan and numbers:
// docs/kernels/sparse_mla_fwd.md. Constants and the shared-memory plan: config.h.
//
// Per CTA (one query token, 64 heads), key blocks are consumed in pairs (2i in KV stage 0, 2i+1 in
// stage 1):
//   WG0: S0 = Q K0^T; m0 = max(m, rowmax S0) -> WG1; P0 = exp2(S0 - m0); O_left += P0 V0_left;
//        m1 <- WG1; P0 *= exp2(m0 - m1) -> smem (stage 0's RoPE tile) -> WG1; O_left *= exp2(m0 - m1);
//        O_left += P1 V1_left (P1 from smem).
//   WG1: S1 = Q K1^T; m1 = max(m0, rowmax S1) -> WG0; O_right *= exp2(m - m1); P1 = exp2(S1 - m1);
//        O_right += P1 V1_right; P1 -> smem -> WG0; O_right += P0 V0_right (P0 from smem).
// Both consumers end every pair relative to the same running max m1, so each scales its half of O
// with the same factors; the row sums of the even / odd blocks are added at the end. "max" is the
// lazy running max (next_max: it only moves by more than 8), so the rescale factors are almost always 1.
//
// "Measured" notes below: H200, 2026-12-02, 11 shapes, geomean speed-up over the kernel before that
// day's instruction-count work. This kernel: 1.135x; without the 72 / 216 register split and the key
// prefetch: 1.100x; "vs X" = that 1.100x kernel with one choice reverted (docs/kernels/sparse_mla_fwd.md,
// "Design choices measured 2026-12-02").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "sm90/common/cuda_check.cuh"
#include "sm90/common/constants.h"
#include "sm90/common/hopper.cuh"
#include "sm90/common/reduce.cuh"
#include "sm90/common/wgmma_dispatch.cuh"
#include "sm90/backend.h"
#include "sm90/sparse_mla_fwd/config.h"

namespace flashdsa::sm90 {
namespace sparse_mla_fwd_impl {
namespace {

struct KernelArgs {
  const __nv_bfloat16* q;   // [T, H, 576]; strides q_stride_t, q_stride_h
  const __nv_bfloat16* kv;  // [T_kv, 576]; stride kv_stride_t
  const int32_t* indices;   // [T, K]; stride indices_stride_t; outside [0, T_kv) = empty slot
  __nv_bfloat16* out;       // [T, H, 512], contiguous
  float* lse;               // [T, H], contiguous, natural log
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;  // elements
  int64_t T_kv;
  int H;
  int num_blocks;    // K / 64
  float scale_log2;  // scale * log2(e): softmax runs in the log2 domain with exp2
  uint64_t kv_stride_bytes;  // kv_stride_t * 2
  uint32_t t_kv_clamped;     // min(T_kv, 2^31): key (int32) valid <=> uint32(key) < t_kv_clamped
};

constexpr float kLn2 = 0.693147180559945309f;
using hw::fence_frags;
using hw::kLog2e;
using hw::quad_max;
using hw::quad_sum;

// ---- small numeric helpers -------------------------------------------------------------------

__device__ __forceinline__ float fast_exp2(float x) { return hw::ex2_approx(x); }

// Exponent offset for a running max: a row that has seen no valid key keeps max = -inf, and its
// logits are all -inf, so offsetting by 0 gives exp2(-inf) = 0 instead of NaN.
__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// A descriptor's start address field is address >> 4 and never overflows inside shared memory, so
// moving a descriptor by a byte offset is an add.
// kLowWord (consumer 0): add to the low 32-bit word only and re-pair it with the unchanged high word
// (no carry is possible: the 14-bit address field stays below 2^14). ptxas (CUDA 13.0) moves consumer
// 0's descriptors with 32-bit halves and a carry (UIADD3 + UIADD3.X + UMOV of the constant high word)
// but consumer 1's with one UIADD3.64 each; the low-word add saves ~90 uniform instructions per pair
// in consumer 0 and would cost ~80 in consumer 1, so consumer 1 keeps the 64-bit add. Measured: 1.100x
// vs 1.100x with the 64-bit add everywhere (no time difference; kept as the shorter code).
template <bool kLowWord = false>
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  if constexpr (kLowWord) {
    return hw::pack_b64(static_cast<uint32_t>(desc) + (bytes >> 4), static_cast<uint32_t>(desc >> 32));
  } else {
    return desc + (bytes >> 4);
  }
}

// Which (query token, first head) this CTA computes. blockIdx is re-read through volatile asm where
// needed, so that the compiler does not keep these values alive across the consumer main loop
// (they would be spilled there: the consumers use every register they have).
struct CtaWork {
  int64_t token;
  int head0;
};

__device__ __forceinline__ CtaWork cta_work(int H) {
  const uint32_t cta = hw::ctaid_x_volatile();
  const int ctas_per_token = H > kHeadsPerCta ? H / kHeadsPerCta : 1;  // 1 or 2
  return {static_cast<int64_t>(cta / ctas_per_token), static_cast<int>(cta % ctas_per_token) * kHeadsPerCta};
}

// ---- accumulator-layout helpers (m64nN f32 fragments, see hopper.cuh) --------------------------
// Element i of an accumulator belongs to row half (i >> 1) & 1 (row0 or row0 + 8) of this thread.

template <int N>
__device__ __forceinline__ void scale_rows(float (&acc)[N], const float (&factor)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] *= factor[(i >> 1) & 1];
}

// Lazy running max. A row's max (log2 domain) only moves when a block's max exceeds it by more than
// kLazyMaxSlack = 8, so P = exp2(s - m) <= 2^8 (exact in fp32, the same relative precision in bf16);
// l and O are kept relative to the same stale m, so out = O / l and lse = (m + log2 l) ln 2 are
// unchanged mathematically. Once a row has seen its first blocks its max practically never moves,
// every rescale factor is exactly 1, and the 128-FMUL O rescales are skipped (rescale_o): consumer 0
// skips 256 and consumer 1 128 FMULs per pair, all on the path from S to the PV issue. The P tiles for
// the other consumer are then stored straight from the packed RS fragments (store_p_frags; always for
// P1, for P0 when the warp's pair max did not move): no FMUL / F2FP. Measured: 1.100x vs 1.080x always
// rescaling and vs 1.061x with an exact max and the same skipping (a 16-row warp rarely keeps all 16
// maxima, so the vote rarely skips, and the skip test costs more than it saves).
constexpr float kLazyMaxSlack = 8.f;

// The running max after seeing a candidate (a block's max, log2 domain; -inf: no valid key).
__device__ __forceinline__ float next_max(float cur, float cand) {
  return cand > cur + kLazyMaxSlack ? cand : cur;  // cur = -inf: any valid candidate is taken
}

// Factor that moves values kept relative to old_max to new_max (exactly 1, not computed, when the
// max did not move).
__device__ __forceinline__ float rescale_factor(float old_max, float new_max) {
  return old_max == new_max ? 1.f : fast_exp2(old_max - finite_or_zero(new_max));
}

// O *= factor per row, skipped when every factor of the warp's 16 rows is exactly 1 (the common case).
__device__ __forceinline__ void rescale_o(float (&o)[128], const float (&factor)[2]) {
  if (!__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) return;
  scale_rows(o, factor);
}

// S tile [64 heads x 64 keys]: invalid keys -> -inf, valid logits -> log2 domain.
// valid_words: bit k of word w = key 32w + k of the block is valid. This thread holds keys 8j + 2q + e.
__device__ __forceinline__ void mask_and_scale(float (&s)[32], const uint32_t* valid_words, float scale_log2,
                                               int quad) {
  const uint32_t words[2] = {hw::ld_shared_u32(valid_words) >> (2 * quad), hw::ld_shared_u32(valid_words + 1) >> (2 * quad)};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int j = i >> 2, e = i & 1;
    const bool valid = (words[j >> 2] >> (8 * (j & 3) + e)) & 1u;
    s[i] = valid ? s[i] * scale_log2 : -INFINITY;
  }
}

// Fused-scale softmax (kernel instance kFusedScale, chosen on the host for scale > 0): S is only
// masked (FSEL to -inf) and stays unscaled; the row max is taken on raw logits and scaled once per
// row (x -> x * scale is monotonic for scale > 0, so max(s) * scale = max(s * scale) exactly), and the
// exponent is one FFMA, exp2(s * scale - m), instead of an FMUL per logit before the max. Other scales
// (0, negative, NaN) run the instance that scales every logit first (mask_and_scale), then exp2(s - m).
// Measured: 1.100x vs 1.092x with every logit scaled.

// mask_and_scale of the fused-scale path: invalid keys -> -inf, logits unscaled.
__device__ __forceinline__ void mask_only(float (&s)[32], const uint32_t* valid_words, int quad) {
  const uint32_t words[2] = {hw::ld_shared_u32(valid_words) >> (2 * quad), hw::ld_shared_u32(valid_words + 1) >> (2 * quad)};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int j = i >> 2, e = i & 1;
    const bool valid = (words[j >> 2] >> (8 * (j & 3) + e)) & 1u;
    s[i] = valid ? s[i] : -INFINITY;
  }
}

// Masks S; returns the scale that still has to be applied to it (1 when mask_and_scale applied it).
template <bool kFusedScale>
__device__ __forceinline__ float mask_logits(float (&s)[32], const uint32_t* valid_words, float scale_log2, int quad) {
  if constexpr (kFusedScale) {
    mask_only(s, valid_words, quad);
    return scale_log2;
  } else {
    mask_and_scale(s, valid_words, scale_log2, quad);
    return 1.f;
  }
}

__device__ __forceinline__ float row_max(const float (&s)[32], int half) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
  return quad_max(m);
}

// s <- exp2(s * pending_scale - max) per row (pending_scale: see mask_logits; 1 -> exp2(s - max));
// returns this thread's partial row sums (its 16 keys of each row).
template <bool kFusedScale>
__device__ __forceinline__ void exp_rows(float (&s)[32], const float (&max)[2], float pending_scale,
                                         float (&partial_sum)[2]) {
  const float offset[2] = {finite_or_zero(max[0]), finite_or_zero(max[1])};
  partial_sum[0] = partial_sum[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int half = (i >> 1) & 1;
    if constexpr (kFusedScale)
      s[i] = fast_exp2(fmaf(s[i], pending_scale, -offset[half]));
    else
      s[i] = fast_exp2(s[i] - offset[half]);
    partial_sum[half] += s[i];
  }
}

// P (fp32 accumulator layout) -> bf16 RS A-fragments, as hw::acc_to_a_frag does for each k-step.
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&frag)[4][4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) hw::acc_to_a_frag(s, k, frag[k]);
}

// Stores P * factor[row half] as bf16 into a [64 x 64] SW128 tile (the K-major A operand of the
// peer's SS wgmma), pair by pair to keep register pressure low. Pair p = elements 2p, 2p+1 = row half
// p & 1, 8-column chunk p >> 1. Each store instruction of a warp writes 8 rows x 16 bytes at distinct
// swizzled chunks: conflict-free.
__device__ __forceinline__ void store_p_tile(char* tile, const float (&s)[32], const float (&factor)[2], int row0,
                                             int quad) {
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    const int row = row0 + 8 * (p & 1), chunk = p >> 1;
    hw::st_shared_u32(tile + hw::sw128_offset(row, chunk) + 4 * quad,
                      hw::pack_bf16(s[2 * p] * factor[p & 1], s[2 * p + 1] * factor[p & 1]));
  }
}

// store_p_tile with factor 1 from the already packed RS fragments (pair p = frag[p / 4][p % 4], see
// hw::acc_to_a_frag): no conversions. Reading the fragments while the RS wgmma that uses them is in
// flight is allowed (only writing them is not).
__device__ __forceinline__ void store_p_frags(char* tile, const uint32_t (&frag)[4][4], int row0, int quad) {
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    const int row = row0 + 8 * (p & 1), chunk = p >> 1;
    hw::st_shared_u32(tile + hw::sw128_offset(row, chunk) + 4 * quad, frag[p >> 2][p & 3]);
  }
}

// P0 for consumer 1: rescaled to the pair max, or, when every factor of the warp is 1 (the pair max
// did not move: the common case with the lazy max), the packed fragments as they are.
__device__ __forceinline__ void store_p0(char* tile, const float (&s)[32], const uint32_t (&frag)[4][4],
                                         const float (&factor)[2], int row0, int quad) {
  if (__all_sync(0xffffffffu, factor[0] == 1.f && factor[1] == 1.f)) {
    store_p_frags(tile, frag, row0, quad);
    return;
  }
  store_p_tile(tile, s, factor, row0, quad);
}

__device__ __forceinline__ void publish_rows(float* dst, const float (&v)[2], int row0, int quad) {
  if (quad == 0) {
    hw::st_shared_f32(dst + row0, v[0]);
    hw::st_shared_f32(dst + row0 + 8, v[1]);
  }
}

// ---- wgmma issue ----------------------------------------------------------------------------------

// s (+)= Q[:, tiles] K[:, tiles]^T over 64-column tiles [kBegin, kEnd) (4 k-steps each).
template <int kBegin, int kEnd, bool kLowWord = false>
__device__ __forceinline__ void issue_qk(float (&s)[32], uint64_t q_desc, uint64_t k_desc, bool overwrite) {
#pragma unroll
  for (int t = kBegin; t < kEnd; ++t)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = t * kTileBytes + k * 32;
      hw::wgmma_ss_m64n64k16<0, 0>(s, desc_advance<kLowWord>(q_desc, off), desc_advance<kLowWord>(k_desc, off),
                                   !(overwrite && t == kBegin && k == 0));
    }
}

// o += P V: P [64 x 64 keys] from registers, V = 64 kv rows x 256 columns read MN-major.
template <bool kLowWord = false>
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&p)[4][4], uint64_t v_desc) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
    hw::wgmma_rs_m64n256k16<1>(o, p[k], desc_advance<kLowWord>(v_desc, k * 16 * hw::kSw128RowBytes), true);
}

// o += P V with P read from a SW128 tile (K-major).
template <bool kLowWord = false>
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], uint64_t p_desc, uint64_t v_desc) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
    hw::wgmma_ss_m64n256k16<0, 1>(o, desc_advance<kLowWord>(p_desc, k * 32),
                                  desc_advance<kLowWord>(v_desc, k * 16 * hw::kSw128RowBytes),
                                  true);
}

// After this warp's wgmma_wait: one arrival per warp (the barrier expects kReleaseArrivals).
__device__ __forceinline__ void release(uint64_t* bar) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) hw::mbar_arrive(bar);
}

// ---- consumers ------------------------------------------------------------------------------------

struct ConsumerThread {
  int quad;  // lane % 4: column pair inside each 8-column chunk
  int row0;  // accumulator rows row0 and row0 + 8
};

__device__ __forceinline__ ConsumerThread consumer_thread() {
  const int t = threadIdx.x % kWarpgroupThreads;
  return {t % 4, (t / 32) * 16 + (t % 32) / 4};
}

// The wgmma descriptors of one consumer (stage = its key blocks' kv stage): Q, its own stage's K,
// both stages' V from tile v_tile0 on (its output columns), and the P tile of the other consumer.
struct ConsumerDescs {
  uint64_t q, k, v0, v1, p_other;
};

__device__ __forceinline__ ConsumerDescs consumer_descs(SmemPlan& sm, int stage, int v_tile0, const void* p_other) {
  return {hw::desc_k_major(sm.q, kHeadsPerCta, 0), hw::desc_k_major(sm.kv[stage], kBlockKeys, 0),
          hw::desc_mn_major(sm.kv[0], kBlockKeys, 0, v_tile0), hw::desc_mn_major(sm.kv[1], kBlockKeys, 0, v_tile0),
          hw::desc_k_major(p_other, kHeadsPerCta, 0)};
}

// Adds the peer's row sums, writes out = O / l (bf16) for this consumer's 256 columns and, from
// consumer 0, lse. Rows beyond H (padding of H = 16 / 32) are never written.
// O / l goes through shared memory: stmatrix into the Q region (free: both consumers passed the
// row-sum barrier after their last S), one 64 x 256 bf16 tile per consumer (rows of 512 B, 16-byte
// chunk c of row r stored at chunk c ^ (r % 8): conflict-free stmatrix and reads), then each warp
// stores whole 512-byte row segments with 16-byte st.global, so every L2 sector is written once and
// fully (bf16x2 stores straight from the accumulators wrote each 32-byte sector in two halves).
// Measured: 1.100x vs 1.068x with the bf16x2 stores; .cs (evict-first) stores on top made no
// difference (1.101x).
__device__ __forceinline__ void write_output(const KernelArgs& a, SmemPlan& sm, int consumer, const float (&o)[128],
                                             const float (&partial_sum)[2], const float (&max)[2]) {
  const ConsumerThread ct = consumer_thread();
  const CtaWork work = cta_work(a.H);
  float sum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) sum[h] = quad_sum(partial_sum[h]);
  publish_rows(sm.row_sum[consumer], sum, ct.row0, ct.quad);
  hw::named_bar_sync(kRowSumExchange, kNumConsumers * kWarpgroupThreads);
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = ct.row0 + 8 * h;
    const float total = sum[h] + hw::ld_shared_f32(&sm.row_sum[consumer ^ 1][row]);
    inv[h] = total > 0.f ? 1.f / total : 0.f;  // empty row: O is 0 and stays 0
    // total is 0 only for a row without valid keys (lse -inf). A NaN score makes total NaN (fmaxf drops
    // it from max, exp2 does not): lse is then NaN too, never -inf (docs/reliability.md).
    const int head = work.head0 + row;
    if (consumer == 0 && ct.quad == 0 && head < a.H)
      a.lse[work.token * a.H + head] = total == 0.f ? -INFINITY : (max[h] + log2f(total)) * kLn2;
  }

  // R -> S. stmatrix j covers 8-column chunks j, j + 1 (j even) of the warp's 16 rows: matrix m =
  // rows 8 (m & 1) + 0..7, chunk j + (m >> 1); lane l addresses row l % 8 of matrix l / 8.
  constexpr int kRowBytes = kDv / 2 * 2;  // 512
  const uint32_t tile = hw::smem_u32(sm.q) + consumer * (kHeadsPerCta * kRowBytes);
  const int lane = threadIdx.x % 32;
  const int st_row = (threadIdx.x % kWarpgroupThreads) / 32 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
  const int x = (lane >> 4) ^ (st_row & 7);  // chunk j + (lane >> 4), j even: (j ^ x) inside its group of 8
  uint32_t st_addr[4];
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) st_addr[jj] = tile + st_row * kRowBytes + (((2 * jj) ^ x) << 4);
#pragma unroll
  for (int j = 0; j < 32; j += 2)
    hw::stmatrix_x4(st_addr[(j >> 1) & 3] + (j >> 3) * 128,
                    hw::pack_bf16(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]),
                    hw::pack_bf16(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]),
                    hw::pack_bf16(o[4 * j + 4] * inv[0], o[4 * j + 5] * inv[0]),
                    hw::pack_bf16(o[4 * j + 6] * inv[1], o[4 * j + 7] * inv[1]));
  if (consumer == 0)  // compile-time barrier ids (a computed id makes ptxas reserve all 16)
    hw::named_bar_sync(kOutTileBarrier, kWarpgroupThreads);
  else
    hw::named_bar_sync(kOutTileBarrier + 1, kWarpgroupThreads);

  // S -> G: warp w stores rows w, w + 4, ...; lane c the 16-byte chunk c of the row's 512 bytes.
  const int t = threadIdx.x % kWarpgroupThreads;
  const int c = t % 32, r0 = t / 32;
  char* const dst = reinterpret_cast<char*>(a.out) + ((work.token * a.H + work.head0 + r0) * kDv) * 2 +
                    consumer * kRowBytes + c * 16;
  const int rows = min(kHeadsPerCta, a.H - work.head0);  // 16, 32 or 64
#pragma unroll
  for (int k = 0; k < kHeadsPerCta / 4; ++k) {
    const int row = r0 + 4 * k;
    if (row >= rows) break;
    const uint4 v = hw::ld_shared_v4(tile + row * kRowBytes + ((c ^ (row & 7)) << 4));
    hw::st_global_v4(dst + static_cast<int64_t>(4 * k) * kDv * 2, v);
  }
}

// Consumer 0: even key blocks (stage 0) and output columns [0, 256).
template <bool kFusedScale>
__device__ __forceinline__ void consumer_even(const KernelArgs& a, SmemPlan& sm, float (&o)[128], float (&run_max)[2],
                                              float (&partial_sum)[2]) {
  const ConsumerThread ct = consumer_thread();
  const ConsumerDescs d = consumer_descs(sm, 0, 0, sm.p_wg1);
  char* const p0_tile = reinterpret_cast<char*>(sm.kv[0]) + kRopeTile * kTileBytes;  // free once S0 is done
  const int num_pairs = (a.num_blocks + 1) / 2;

  float s[32];

  // P1 V1_left of pair i-1 is issued at the top of pair i, next to S0, so that no wgmma is in flight
  // across the loop's back edge. The first pair is peeled (kPrevOdd = false) because ptxas
  // serializes every wgmma of the kernel when a wgmma on `o` is issued under a runtime condition here.
  const auto issue_odd_pv = [&](int odd_pair) {  // the odd block of pair `odd_pair`
    hw::mbar_wait(&sm.exchange[kPFromWg1], (odd_pair & 1));
    hw::wgmma_fence();
    issue_pv_ss<true>(o, d.p_other, d.v1);
    hw::wgmma_commit();
  };
  const auto run_pair = [&](auto prev_odd, int i) {
    constexpr bool kPrevOdd = decltype(prev_odd)::value;
    const uint32_t parity = i & 1;
    if constexpr (kPrevOdd) issue_odd_pv(i - 1);
    hw::mbar_wait(&sm.kv_ready[0][kLeft], parity);
    hw::wgmma_fence();
    issue_qk<0, kVTilesPerConsumer, true>(s, d.q, d.k, true);
    hw::wgmma_commit();
    if constexpr (kPrevOdd) {
      hw::wgmma_wait<1>();
      release(&sm.kv_free[1][kLeft]);
    }
    hw::mbar_wait(&sm.kv_ready[0][kRight], parity);
    hw::wgmma_fence();  // explicit: otherwise ptxas injects one after the wait loop and serializes wgmma
    issue_qk<kVTilesPerConsumer, kQkTiles, true>(s, d.q, d.k, false);
    hw::wgmma_commit();
    hw::wgmma_wait<0>();
    hw::fence_regs(s);
    hw::fence_regs(o);

    // Softmax of block 2i against the running max; publish its max for WG1.
    const float pending_scale = mask_logits<kFusedScale>(s, sm.valid_mask[0], a.scale_log2, ct.quad);
    float blk_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) blk_max[h] = next_max(run_max[h], row_max(s, h) * pending_scale);
    publish_rows(sm.max_wg0, blk_max, ct.row0, ct.quad);
    hw::mbar_arrive(&sm.exchange[kMaxFromWg0]);
    float rescale[2], blk_sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rescale[h] = rescale_factor(run_max[h], blk_max[h]);
    exp_rows<kFusedScale>(s, blk_max, pending_scale, blk_sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) partial_sum[h] = partial_sum[h] * rescale[h] + blk_sum[h];
    rescale_o(o, rescale);
    uint32_t p_frag[4][4];
    pack_p(s, p_frag);
    hw::wgmma_fence();
    issue_pv_rs<true>(o, p_frag, d.v0);
    hw::wgmma_commit();

    // Pair max from WG1: hand P0, rescaled to it, to WG1.
    hw::mbar_wait(&sm.exchange[kMaxFromWg1], parity);
    const float pair_max[2] = {hw::ld_shared_f32(&sm.max_wg1[ct.row0]), hw::ld_shared_f32(&sm.max_wg1[ct.row0 + 8])};
#pragma unroll
    for (int h = 0; h < 2; ++h) rescale[h] = rescale_factor(blk_max[h], pair_max[h]);
    store_p0(p0_tile, s, p_frag, rescale, ct.row0, ct.quad);
    hw::fence_proxy_async();
    hw::mbar_arrive(&sm.exchange[kPFromWg0]);

    hw::wgmma_wait<0>();
    hw::fence_regs(o);
    fence_frags(p_frag);
    release(&sm.kv_free[0][kLeft]);
    rescale_o(o, rescale);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      partial_sum[h] *= rescale[h];
      run_max[h] = pair_max[h];
    }
  };

  hw::mbar_wait(&sm.q_ready, 0);
  if (num_pairs > 0) run_pair(std::false_type{}, 0);
  for (int i = 1; i < num_pairs; ++i) run_pair(std::true_type{}, i);  // every pair but the last has an odd block
  if (a.num_blocks % 2 == 0 && a.num_blocks > 0) {  // the last pair's odd block
    issue_odd_pv(num_pairs - 1);
    hw::wgmma_wait<0>();
    hw::fence_regs(o);
  }
}

// Consumer 1: odd key blocks (stage 1) and output columns [256, 512).
template <bool kFusedScale>
__device__ __forceinline__ void consumer_odd(const KernelArgs& a, SmemPlan& sm, float (&o)[128], float (&run_max)[2],
                                             float (&partial_sum)[2]) {
  const ConsumerThread ct = consumer_thread();
  const ConsumerDescs d =
      consumer_descs(sm, 1, kVTilesPerConsumer, reinterpret_cast<char*>(sm.kv[0]) + kRopeTile * kTileBytes);
  char* const p1_tile = reinterpret_cast<char*>(sm.p_wg1);
  const int num_pairs = (a.num_blocks + 1) / 2;

  float s[32];

  hw::mbar_wait(&sm.q_ready, 0);
  for (int i = 0; i < num_pairs; ++i) {
    const bool has_odd = 2 * i + 1 < a.num_blocks;
    float blk_max[2] = {-INFINITY, -INFINITY};  // a missing odd block contributes nothing
    if (has_odd) {
      // The producer fills stage 1's right half first.
      const uint32_t parity = i & 1;
      hw::mbar_wait(&sm.kv_ready[1][kRight], parity);
      hw::wgmma_fence();
      issue_qk<kVTilesPerConsumer, kQkTiles>(s, d.q, d.k, true);
      hw::mbar_wait(&sm.kv_ready[1][kLeft], parity);
      hw::wgmma_fence();
      issue_qk<0, kVTilesPerConsumer>(s, d.q, d.k, false);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(s);
      const float pending_scale = mask_logits<kFusedScale>(s, sm.valid_mask[1], a.scale_log2, ct.quad);
#pragma unroll
      for (int h = 0; h < 2; ++h) blk_max[h] = row_max(s, h) * pending_scale;
    }

    // Pair max = max(WG0's running max after block 2i, this block); publish it for WG0.
    hw::mbar_wait(&sm.exchange[kMaxFromWg0], i & 1);
    float pair_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) pair_max[h] = next_max(hw::ld_shared_f32(&sm.max_wg0[ct.row0 + 8 * h]), blk_max[h]);
    publish_rows(sm.max_wg1, pair_max, ct.row0, ct.quad);
    hw::mbar_arrive(&sm.exchange[kMaxFromWg1]);
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rescale[h] = rescale_factor(run_max[h], pair_max[h]);
      partial_sum[h] *= rescale[h];
      run_max[h] = pair_max[h];
    }
    rescale_o(o, rescale);

    uint32_t p_frag[4][4];
    if (has_odd) {
      float blk_sum[2];
      exp_rows<kFusedScale>(s, pair_max, kFusedScale ? a.scale_log2 : 1.f, blk_sum);
#pragma unroll
      for (int h = 0; h < 2; ++h) partial_sum[h] += blk_sum[h];
      pack_p(s, p_frag);
      hw::wgmma_fence();
      issue_pv_rs(o, p_frag, d.v1);
      hw::wgmma_commit();
      store_p_frags(p1_tile, p_frag, ct.row0, ct.quad);  // P1 is relative to the pair max: factor 1
    }

    hw::mbar_wait(&sm.exchange[kPFromWg0], i & 1);
    hw::wgmma_fence();
    issue_pv_ss(o, d.p_other, d.v0);
    hw::wgmma_commit();
    if (has_odd) {
      hw::fence_proxy_async();
      hw::mbar_arrive(&sm.exchange[kPFromWg1]);
      hw::wgmma_wait<1>();
      fence_frags(p_frag);
      release(&sm.kv_free[1][kRight]);
    }
    hw::wgmma_wait<0>();
    hw::fence_regs(o);
    release(&sm.kv_free[0][kRight]);
  }
}

// ---- producer ---------------------------------------------------------------------------------------
//
// Each thread turns each of its 4 key slots of a block into one byte pointer (kv row + its 16-byte
// chunk) once, so every copy of the 9 tiles addresses [pointer + 128 t] -> [smem base + 8192 t +
// 2048 j] with immediate offsets; validity is one unsigned compare (T_kv clamped to 2^31, keys are
// int32). The free-barrier waits of the first pair rely on a fresh mbarrier's "previous phase"
// (parity 1) being complete instead of a branch, and a missing odd block (K/64 odd, last pair) is
// gathered as a block of empty slots (zero-fill, nothing read; nobody waits for it), so the pair
// loop has no data-dependent branch (static loop body: 228 instructions per pair, 72 of them cp.async,
// scripts/fwd_sass_counts.py). Measured: 1.100x vs 1.059x with 64-bit element offsets per copy and
// branches per pair (633 instructions per pair).
// The gathers are plain 16-byte cp.async: the 256-byte L2 prefetch size measured +-1% (2026-12-01),
// and an L2 cache-policy hint faults (see producer()).

// Copies Q rows (row_base + 16 j, j < 4) of all 9 tiles into SW128 tiles; this thread moves 16-byte
// chunk `chunk` of each. Rows whose `valid` is false are zero-filled, unread.
__device__ __forceinline__ void gather_q(char* tiles, const __nv_bfloat16* const (&src)[kRowsPerThread],
                                         const bool (&valid)[kRowsPerThread], int row_base, int chunk) {
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int row = row_base + kRowsPerPass * j;
#pragma unroll
    for (int t = 0; t < kQkTiles; ++t)
      hw::cp_async_16(tiles + t * kTileBytes + hw::sw128_offset(row, chunk), src[j] + t * kTileCols + chunk * 8,
                      valid[j]);
  }
}

// The half of each stage that the producer fills first (the one its consumer's S starts with)
// carries the validity mask.
__host__ __device__ constexpr int mask_half(int stage) { return stage == 0 ? kLeft : kRight; }

// Every producer warp votes on its key slot (no divergent branch around the ballot); lane 0 of warps
// 0 and 1 publishes the 32-key validity word of a block and arrives on the half's barrier.
__device__ __forceinline__ void publish_valid_mask(const KernelArgs& a, SmemPlan& sm, int stage, int32_t key,
                                                   int warp) {
  const uint32_t bits = __ballot_sync(0xffffffffu, static_cast<uint32_t>(key) < a.t_kv_clamped);
  if (warp < kMaskWriters && threadIdx.x % 32 == 0) {
    hw::st_shared_u32(&sm.valid_mask[stage][warp], bits);
    hw::mbar_arrive(&sm.kv_ready[stage][mask_half(stage)]);
  }
}

// Byte pointers of this thread's chunk of the 4 kv rows of one block (row_base + 16 j) and their
// validity. An empty slot points at kv itself (never read: src-size 0 zero-fills).
struct RowPtrs {
  const char* src[kRowsPerThread];
  bool valid[kRowsPerThread];
};

// base = kv + 16 * chunk (bytes).
__device__ __forceinline__ RowPtrs row_ptrs(const KernelArgs& a, const int32_t (&keys)[kRowsPerThread],
                                            const char* base) {
  RowPtrs r;
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    r.valid[j] = static_cast<uint32_t>(keys[j]) < a.t_kv_clamped;  // negative keys wrap to >= 2^31
    const uint32_t row = r.valid[j] ? static_cast<uint32_t>(keys[j]) : 0u;
    r.src[j] = base + row * a.kv_stride_bytes;  // one wide multiply-add per row
  }
  return r;
}

// Tiles [kBegin, kEnd) of the 4 rows; dst = stage + sw128_offset(row_base, chunk) (rows 16 apart share
// the swizzle phase, so row j is at + 2048 j).
template <int kBegin, int kEnd>
__device__ __forceinline__ void gather_block(uint32_t dst, const RowPtrs& r) {
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j)
#pragma unroll
    for (int t = kBegin; t < kEnd; ++t)
      hw::cp_async_16_u32(dst + t * kTileBytes + j * kRowsPerPass * hw::kSw128RowBytes,
                          r.src[j] + t * kTileCols * 2, r.valid[j]);
}

// A pair's key slots: 4 rows of each block for the gathers, one slot per thread for the mask ballot.
// A missing odd block reads as empty slots (-1).
struct PairKeys {
  int32_t even[kRowsPerThread], odd[kRowsPerThread], mask_even, mask_odd;
};

__device__ __forceinline__ void producer(const KernelArgs& a, SmemPlan& sm) {
  const CtaWork work = cta_work(a.H);
  const int tid = threadIdx.x % kWarpgroupThreads;
  const int warp = tid / 32;
  const int chunk = tid % kChunksPerTileRow;
  const int row_base = tid / kChunksPerTileRow;

  {  // Q: rows beyond H are zero-filled (never read).
    const __nv_bfloat16* src[kRowsPerThread];
    bool valid[kRowsPerThread];
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int head = work.head0 + row_base + kRowsPerPass * j;
      valid[j] = head < a.H;
      src[j] = a.q + (valid[j] ? work.token * a.q_stride_t + head * a.q_stride_h : 0);
    }
    gather_q(reinterpret_cast<char*>(sm.q), src, valid, row_base, chunk);
    hw::cp_async_arrive(&sm.q_ready);
  }

  // No L2 cache-policy hint on these gathers: with the hint (createpolicy + cp.async
  // .L2::cache_hint) this kernel raised cudaErrorIllegalInstruction on the H200 (2026-11-29), although
  // the same instruction passes in tests/cuda/hopper_primitives_check.cu: a ptxas code-generation
  // issue, see docs/kernels/sparse_mla_fwd.md ("No L2 cache-policy hint").
  const int32_t* token_keys = a.indices + work.token * a.indices_stride_t;
  const int num_pairs = (a.num_blocks + 1) / 2;
  const char* const kv_base = reinterpret_cast<const char*>(a.kv) + chunk * 16;
  const uint32_t thread_off = hw::sw128_offset(row_base, chunk);
  const uint32_t stage0 = hw::smem_u32(sm.kv[0]) + thread_off;
  const uint32_t stage1 = hw::smem_u32(sm.kv[1]) + thread_off;
  // The next pair's key slots are loaded right after a pair's last gather, so their latency overlaps
  // the wait for the consumers instead of preceding the next pair's first gather. Their 10 live
  // registers need the 72-register producer (config.h; at 40 registers ptxas spilled 12 bytes).
  // Measured: 1.135x vs 1.094x with the keys loaded at the top of each pair (both with 72 / 216).
  const auto load_keys = [&](int i) {
    PairKeys k;
    const bool has_odd = 2 * i + 1 < a.num_blocks;
    const int32_t* keys_even = token_keys + 2 * i * kBlockKeys;
    const int32_t* keys_odd = keys_even + kBlockKeys;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      k.even[j] = __ldg(keys_even + row_base + kRowsPerPass * j);
      k.odd[j] = has_odd ? __ldg(keys_odd + row_base + kRowsPerPass * j) : -1;
    }
    k.mask_even = __ldg(keys_even + tid % kBlockKeys);
    k.mask_odd = has_odd ? __ldg(keys_odd + tid % kBlockKeys) : -1;
    return k;
  };
  PairKeys next = load_keys(0);
  for (int i = 0; i < num_pairs; ++i) {
    const PairKeys cur = next;

    // Refill order = the order in which the consumers release the halves of the previous pair. For
    // i = 0 the parity is 1: the phase before a fresh mbarrier's first one counts as complete.
    const uint32_t free_parity = (i & 1) ^ 1;
    const RowPtrs re = row_ptrs(a, cur.even, kv_base);
    hw::mbar_wait(&sm.kv_free[0][kLeft], free_parity);
    gather_block<0, kVTilesPerConsumer>(stage0, re);
    hw::cp_async_arrive(&sm.kv_ready[0][kLeft]);
    publish_valid_mask(a, sm, 0, cur.mask_even, warp);

    const RowPtrs ro = row_ptrs(a, cur.odd, kv_base);
    hw::mbar_wait(&sm.kv_free[1][kRight], free_parity);
    gather_block<kVTilesPerConsumer, kQkTiles>(stage1, ro);
    hw::cp_async_arrive(&sm.kv_ready[1][kRight]);
    publish_valid_mask(a, sm, 1, cur.mask_odd, warp);

    hw::mbar_wait(&sm.kv_free[0][kRight], free_parity);
    gather_block<kVTilesPerConsumer, kQkTiles>(stage0, re);
    hw::cp_async_arrive(&sm.kv_ready[0][kRight]);

    hw::mbar_wait(&sm.kv_free[1][kLeft], free_parity);
    gather_block<0, kVTilesPerConsumer>(stage1, ro);
    hw::cp_async_arrive(&sm.kv_ready[1][kLeft]);
    if (i + 1 < num_pairs) next = load_keys(i + 1);
  }
  hw::cp_async_wait<0>();
}

// kFusedScale: scale > 0, softmax with the scale fused into the exponent's FFMA (see mask_only).
template <bool kFusedScale>
__global__ void __launch_bounds__(kNumThreads, 1) sparse_mla_fwd_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uintptr_t base =
      (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlignSlack - 1) & ~uintptr_t(kSmemAlignSlack - 1);
  SmemPlan& sm = *reinterpret_cast<SmemPlan*>(base);

  const int warpgroup = threadIdx.x / kWarpgroupThreads;

  if (threadIdx.x == 0) {
    hw::mbar_init(&sm.q_ready, kCpAsyncArrivals);
#pragma unroll
    for (int s = 0; s < kNumStages; ++s)
#pragma unroll
      for (int h = 0; h < kNumHalves; ++h) {
        hw::mbar_init(&sm.kv_ready[s][h], kCpAsyncArrivals + (h == mask_half(s) ? kMaskWriters : 0));
        hw::mbar_init(&sm.kv_free[s][h], kReleaseArrivals);
      }
#pragma unroll
    for (int e = 0; e < kNumExchanges; ++e) hw::mbar_init(&sm.exchange[e], kExchangeArrivals);
    hw::mbar_fence_init();
  }
  __syncthreads();

  if (warpgroup == kProducerWarpgroup) {
    hw::reg_dealloc<kProducerRegs>();
    producer(a, sm);
  } else {
    hw::reg_alloc<kConsumerRegs>();
    // Output accumulator [64 heads x 256 columns of this consumer], log2-domain running max, partial
    // row sums; one set of registers for both roles so that the two code paths join cleanly.
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float run_max[2] = {-INFINITY, -INFINITY};
    float partial_sum[2] = {0.f, 0.f};
    if (warpgroup == 0)
      consumer_even<kFusedScale>(a, sm, o, run_max, partial_sum);
    else
      consumer_odd<kFusedScale>(a, sm, o, run_max, partial_sum);
    write_output(a, sm, warpgroup, o, partial_sum, run_max);
  }
}

}  // namespace
}  // namespace sparse_mla_fwd_impl

Status sparse_mla_fwd(const SparseMlaFwdParams& p) {
  using namespace sparse_mla_fwd_impl;
  // Limits (bf16, production shapes, aligned rows, grid size): supports_sparse_mla_fwd, backend.cpp.
  if (p.T == 0) return Status::OK();
  const int64_t ctas = p.T * (p.attn.H > kHeadsPerCta ? p.attn.H / kHeadsPerCta : 1);

  KernelArgs args;
  args.q = static_cast<const __nv_bfloat16*>(p.attn.q);
  args.kv = static_cast<const __nv_bfloat16*>(p.attn.kv);
  args.indices = p.topk.indices;
  args.out = static_cast<__nv_bfloat16*>(p.out);
  args.lse = static_cast<float*>(p.lse);
  args.q_stride_t = p.attn.q_stride_t;
  args.q_stride_h = p.attn.q_stride_h;
  args.kv_stride_t = p.attn.kv_stride_t;
  args.indices_stride_t = p.topk.stride_t;
  args.T_kv = p.T_kv;
  args.H = p.attn.H;
  args.num_blocks = p.topk.K / kBlockKeys;
  args.scale_log2 = p.attn.scale * kLog2e;
  args.kv_stride_bytes = static_cast<uint64_t>(p.attn.kv_stride_t) * sizeof(__nv_bfloat16);
  args.t_kv_clamped = static_cast<uint32_t>(std::min<int64_t>(p.T_kv, int64_t(1) << 31));

  // The fused-scale softmax needs scale > 0 (false for 0, negative and NaN scales).
  const auto kernel = args.scale_log2 > 0.f ? sparse_mla_fwd_kernel<true> : sparse_mla_fwd_kernel<false>;
  FLASHDSA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<static_cast<unsigned>(ctas), kNumThreads, kSmemBytes, static_cast<cudaStream_t>(p.stream)>>>(
      args);
  FLASHDSA_CHECK_LAUNCH("sparse_mla_fwd");
  return Status::OK();
}

}  // namespace flashdsa::sm90
