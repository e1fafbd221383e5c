// Dense indexer KL loss (docs/spec.md §6, the warm-up formulation), forward and backward.
// Support of row t = all visible keys [k_start, k_end);
//   target[t,s] = (1/H) sum_h softmax_s(scale q[t,h] . kv[s]),  p_I = softmax_s score(t, s),
// same loss and gradient as the sparse formulation. Nothing T x T is stored.
//
// One block per query token (heaviest rows first), two passes over the visible key blocks, 3 roles:
//   WG2 producer:  Q, Q_I once; per block the 9 kv chunks (ring) and the K_I tile (small ring).
//   WG0 attention: S = Q K^T per block (64 heads per wgmma M). Pass 1: per-head online max / sum ->
//                  lse[h]. Pass 2: target of the block's 64 keys = column sums of exp(S - lse) / H,
//                  handed to WG1 through a 2-slot shared buffer.
//   WG1 indexer:   scores of the block (keys as M). Pass 1: online log-sum-exp of the scores.
//                  Pass 2: loss terms (fwd), or g = gs (p_I - target) and the gradient GEMMs (bwd):
//                  dq_idx and dw in registers, dk_idx by fp32 atomics.
#include <cuda_bf16.h>

#include <algorithm>

#include "common/status_macros.h"
#include "sm90/common/cuda_check.cuh"
#include "sm90/kl_loss/attn_stream.cuh"
#include "sm90/kl_loss/indexer_dispatch.cuh"
#include "sm90/backend.h"

namespace flashdsa::sm90 {
namespace kl_loss_impl {
namespace {

constexpr int kDenseThreads = 3 * kWarpgroup;
constexpr int kTgtSlots = 2;
constexpr int kMaxRing = 18;
constexpr int kBarAttn = 1, kBarIndexer = 2;  // named barriers of WG0 / WG1
// Register split (setmaxnreg; launched at 65536 / 384 = 168 per thread): the indexer role holds the
// C and dQ accumulators of the backward, the producer only addresses.
constexpr int kProducerRegs = 96, kIndexerRegs = 240;
static_assert(kProducerRegs + 168 + kIndexerRegs <= 65536 / kWarpgroup, "register split over the file size");

struct DenseKlArgs {
  const __nv_bfloat16* q;      // [T, H, 576]
  const __nv_bfloat16* kv;     // [T_kv, 576]
  const __nv_bfloat16* q_idx;  // [T, H_I, D_I]
  const __nv_bfloat16* k_idx;  // [T_kv, D_I]
  const float* weights;        // [T, H_I]
  const int32_t* k_start;      // [T]
  const int32_t* k_end;        // [T]
  float* loss_rows;            // [T] (fwd)
  IndexerGradArgs grad;        // (bwd)
  float scale;
  int64_t T;
  int H;
  bool relu;
  int64_t q_stride_t, q_stride_h, kv_stride_t, q_idx_stride_t, q_idx_stride_h, k_idx_stride_t, weights_stride_t;
};

// Shared-memory plan (offsets from the 1024-aligned base); the kv ring gets what is left (>= 4 slots).
template <int NHG, int HI, int DI, bool kBwd>
struct DenseKlSmem {
  using IB = IndexerBlock<HI, DI>;
  static constexpr int kKiStages = NHG == 1 ? 2 : 1;
  static constexpr int kQ = 0;                                       // Q: NHG x [64 x 576]
  static constexpr int kQi = kQ + NHG * kQGroupBytes;                // Q_I [HI x DI]
  static constexpr int kKi = kQi + IB::kQTileBytes;                  // K_I tiles [stages][64 x DI]
  static constexpr int kDqk = kKi + kKiStages * IB::kKTileBytes;     // dqk tile (bwd)
  static constexpr int kRingOff = kDqk + (kBwd ? IB::kDqkTileBytes : 0);
  static constexpr int kSmallBytes = kTgtSlots * 64 * 4      // target hand-off [slots][64]
                                     + 2 * 4 * 64 * 4         // WG0 column sums [2][4][64]
                                     + 4 * HI * 4             // WG1 reductions [4][HI]
                                     + HI * 4                 // w [HI]
                                     + (2 * kMaxRing + 2 * kKiStages + 2 * kTgtSlots + 1) * 8;  // mbarriers
  static constexpr int kRing = std::min(kMaxRing, (kSmemLimit - kSmemAlign - kRingOff - kSmallBytes) / kChunkBytes);
  static constexpr int kTgt = kRingOff + kRing * kChunkBytes;
  static constexpr int kRed0 = kTgt + kTgtSlots * 64 * 4;
  static constexpr int kRed1 = kRed0 + 2 * 4 * 64 * 4;
  static constexpr int kW = kRed1 + 4 * HI * 4;
  static constexpr int kBars = kW + HI * 4;
  static constexpr int kDynamicBytes = kRingOff + kRing * kChunkBytes + kSmallBytes + kSmemAlign;
  static_assert(kRing >= 4, "dense KL: kv ring too small");
  static_assert(kDynamicBytes <= kSmemLimit, "dense KL shared memory over budget");
};

template <int NHG, int HI, int DI, bool kBwd>
__global__ void __launch_bounds__(kDenseThreads, 1) dense_kl_kernel(const DenseKlArgs a) {
  using IB = IndexerBlock<HI, DI>;
  using L = DenseKlSmem<NHG, HI, DI, kBwd>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint8_t* q_smem = smem + L::kQ;
  uint8_t* qi_tile = smem + L::kQi;
  uint8_t* dqk_tile = smem + L::kDqk;
  float* tgt = reinterpret_cast<float*>(smem + L::kTgt);
  float* w_s = reinterpret_cast<float*>(smem + L::kW);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  const KvRing<L::kRing> ring{smem + L::kRingOff, bars, bars + L::kRing};
  uint64_t* ki_full = bars + 2 * L::kRing;
  uint64_t* ki_empty = ki_full + L::kKiStages;
  uint64_t* tgt_full = ki_empty + L::kKiStages;
  uint64_t* tgt_empty = tgt_full + kTgtSlots;
  uint64_t* q_bar = tgt_empty + kTgtSlots;
  auto ki_tile = [&](int stage) { return smem + L::kKi + stage * IB::kKTileBytes; };

  const int64_t t = a.T - 1 - blockIdx.x;  // longest rows first
  const int tid = threadIdx.x, wg = tid / kWarpgroup, wtid = tid % kWarpgroup;
  const int ks = a.k_start[t], ke = a.k_end[t];
  const int nb = ke > ks ? (ke - ks + kBlockKeys - 1) / kBlockKeys : 0;

  if (nb == 0) {  // empty support: loss 0, zero gradients
    if (wg != 1) return;
    if constexpr (!kBwd) {
      if (wtid == 0) a.loss_rows[t] = 0.f;
    } else {
      __nv_bfloat16* dq_t = a.grad.dq_idx + t * HI * DI;
      for (int i = wtid; i < HI * DI / 2; i += kWarpgroup)
        reinterpret_cast<__nv_bfloat162*>(dq_t)[i] = __floats2bfloat162_rn(0.f, 0.f);
      if (wtid < HI) a.grad.dweights[t * HI + wtid] = 0.f;
    }
    return;
  }

  if (tid == 0) {
    for (int i = 0; i < L::kRing; ++i) {
      hw::mbar_init(&ring.full[i], kWarpgroup);
      hw::mbar_init(&ring.empty[i], kWarpgroup);
    }
    for (int i = 0; i < L::kKiStages; ++i) {
      hw::mbar_init(&ki_full[i], kWarpgroup);
      hw::mbar_init(&ki_empty[i], kWarpgroup);
    }
    for (int i = 0; i < kTgtSlots; ++i) {
      hw::mbar_init(&tgt_full[i], kBlockKeys);  // the 64 threads that write the slot
      hw::mbar_init(&tgt_empty[i], kWarpgroup);
    }
    hw::mbar_init(q_bar, kWarpgroup);
    hw::mbar_fence_init();
  }
  __syncthreads();

  if (wg == 2) {
    // ---- producer: Q and Q_I, then per block (pass 1 then pass 2) the K_I tile and the kv chunks ----
    hw::reg_dealloc<kProducerRegs>();
    load_q_groups<NHG>(q_smem, a.q + t * a.q_stride_t, a.q_stride_h, a.H, wtid);
    const __nv_bfloat16* qi_t = a.q_idx + t * a.q_idx_stride_t;
    load_tile_sw128<HI, DI, kWarpgroup>(qi_tile, wtid, qi_t, [&](int r) { return qi_t + r * a.q_idx_stride_h; });
    hw::cp_async_arrive(q_bar);
    const int row = wtid >> 3;
#pragma unroll 1
    for (int n = 0; n < 2 * nb; ++n) {
      const int key0 = ks + (n < nb ? n : n - nb) * kBlockKeys;
      const int st = n % L::kKiStages;
      if (n >= L::kKiStages) hw::mbar_wait(&ki_empty[st], ((n / L::kKiStages) - 1) & 1);
      load_tile_sw128<kBlockKeys, DI, kWarpgroup>(ki_tile(st), wtid, a.k_idx, [&](int r) {
        return key0 + r < ke ? a.k_idx + (key0 + r) * a.k_idx_stride_t : static_cast<const __nv_bfloat16*>(nullptr);
      });
      hw::cp_async_arrive(&ki_full[st]);
      const __nv_bfloat16* rows[kRowsPerProducerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerProducerThread; ++i) {
        const int key = key0 + row + 16 * i;
        rows[i] = key < ke ? a.kv + key * a.kv_stride_t : nullptr;
      }
      ring.produce_block(n * kChunksPerBlock, rows, a.kv, wtid);
    }
    hw::cp_async_wait<0>();
    return;
  }

  const AccCoord c(wtid);
  if (wg == 0) {
    // ---- attention role ----
    const float sc = a.scale * kLog2e;
    float* red0 = reinterpret_cast<float*>(smem + L::kRed0);
    int buf = 0;
    hw::mbar_wait(q_bar, 0);
    float m[NHG][2], l[NHG][2];
#pragma unroll
    for (int g = 0; g < NHG; ++g) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        m[g][k] = -INFINITY;
        l[g][k] = 0.f;
      }
    }
    // Pass 1: per-head online softmax statistics in the log2 domain (keys >= k_end masked).
#pragma unroll 1
    for (int n = 0; n < nb; ++n) {
      float acc[NHG][32];
      ring.template consume_block<NHG>(acc, q_smem, n * kChunksPerBlock);
      const int lim = ke - ks - n * kBlockKeys;  // valid columns: col < lim
#pragma unroll
      for (int g = 0; g < NHG; ++g) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float mx = -INFINITY;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (8 * j + 2 * c.q + e < lim) mx = fmaxf(mx, acc[g][4 * j + 2 * k + e] * sc);
          }
          const float mn = fmaxf(m[g][k], quad_max(mx));
          const float mu = mn == -INFINITY ? 0.f : mn;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (8 * j + 2 * c.q + e < lim) sum += exp2f(fmaf(acc[g][4 * j + 2 * k + e], sc, -mu));
          }
          l[g][k] = l[g][k] * exp2f(m[g][k] - mu) + sum;
          m[g][k] = mn;
        }
      }
    }
    float lse2[NHG][2];
#pragma unroll
    for (int g = 0; g < NHG; ++g) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int h = 64 * g + c.r0 + 8 * k;
        lse2[g][k] = h < a.H ? m[g][k] + log2f(quad_sum(l[g][k])) : INFINITY;
      }
    }
    // Pass 2: the target of each block, handed to the indexer role.
    const float inv_h = 1.f / static_cast<float>(a.H);
#pragma unroll 1
    for (int n = nb; n < 2 * nb; ++n) {
      const int b = n - nb;
      float acc[NHG][32];
      ring.template consume_block<NHG>(acc, q_smem, n * kChunksPerBlock);
      float v[16];
      head_sum_partials<NHG>(acc, lse2, sc, v);
      const float colsum = warpgroup_colsum64(v, red0, buf, c, wtid, kBarAttn);
      if (wtid < kBlockKeys) {
        const int slot = b % kTgtSlots;
        if (b >= kTgtSlots) hw::mbar_wait(&tgt_empty[slot], ((b / kTgtSlots) - 1) & 1);
        tgt[slot * kBlockKeys + wtid] = wtid < ke - ks - b * kBlockKeys ? colsum * inv_h : 0.f;
        hw::mbar_arrive(&tgt_full[slot]);
      }
    }
    return;
  }

  // ---- indexer role (WG1) ----
  hw::reg_alloc<kIndexerRegs>();
  float* red1 = reinterpret_cast<float*>(smem + L::kRed1);
  if (wtid < HI) w_s[wtid] = a.weights[t * a.weights_stride_t + wtid];
  hw::named_bar_sync(kBarIndexer, kWarpgroup);
  hw::mbar_wait(q_bar, 0);

  // The indexer scores of block step n (pass 1: n < nb, pass 2: n - nb) into acc, complete; returns the
  // K_I ring stage, to be released by the caller.
  auto score_block = [&](int n, float (&acc)[IB::kAcc]) {
    const int st = n % L::kKiStages;
    hw::mbar_wait(&ki_full[st], (n / L::kKiStages) & 1);
    hw::fence_proxy_async();
    IB::issue_scores(acc, ki_tile(st), qi_tile);
    hw::wgmma_wait<0>();
    hw::fence_regs(acc);
    return st;
  };

  // Pass 1: online log-sum-exp of the scores (one lane per quad holds the quad's two keys).
  float m1 = -INFINITY, l1 = 0.f;
#pragma unroll 1
  for (int n = 0; n < nb; ++n) {
    float acc[IB::kAcc];
    const int st = score_block(n, acc);
    hw::mbar_arrive(&ki_empty[st]);
    float s[2];
    IB::reduce_scores(acc, w_s, a.relu, c.q, s[0], s[1]);
    const int lim = ke - ks - n * kBlockKeys;
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (c.q == 0 && c.r0 + 8 * k < lim) merge_softmax_stat(m1, l1, s[k], 1.f);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m1, o), lo = __shfl_xor_sync(0xffffffffu, l1, o);
    merge_softmax_stat(m1, l1, mo, lo);
  }
  if (c.lane == 0) {
    red1[2 * c.warp] = m1;
    red1[2 * c.warp + 1] = l1;
  }
  hw::named_bar_sync(kBarIndexer, kWarpgroup);
  m1 = red1[0];
  l1 = red1[1];
#pragma unroll
  for (int w = 1; w < 4; ++w) merge_softmax_stat(m1, l1, red1[2 * w], red1[2 * w + 1]);
  const float lse_i = m1 + logf(l1);
  hw::named_bar_sync(kBarIndexer, kWarpgroup);  // red1 is reused below

  // Pass 2.
  [[maybe_unused]] float loss_part = 0.f;
  [[maybe_unused]] float gs = 0.f;
  float dq_acc[kBwd ? IB::kOut : 1];
  float dw[kBwd ? IB::kCols : 1];
  if constexpr (kBwd) {
    gs = a.grad.grad_scale * (a.grad.grad_rows ? a.grad.grad_rows[t] : 1.f);
#pragma unroll
    for (int i = 0; i < IB::kOut; ++i) dq_acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < IB::kCols; ++i) dw[i] = 0.f;
  }
#pragma unroll 1
  for (int n = nb; n < 2 * nb; ++n) {
    const int b = n - nb;
    float acc[IB::kAcc];
    const int st = score_block(n, acc);
    float s[2], tg[2];
    IB::reduce_scores(acc, w_s, a.relu, c.q, s[0], s[1]);
    const int slot = b % kTgtSlots;
    hw::mbar_wait(&tgt_full[slot], (b / kTgtSlots) & 1);
    tg[0] = tgt[slot * kBlockKeys + c.r0];
    tg[1] = tgt[slot * kBlockKeys + c.r0 + 8];
    hw::mbar_arrive(&tgt_empty[slot]);
    const int lim = ke - ks - b * kBlockKeys;
    if constexpr (!kBwd) {
      hw::mbar_arrive(&ki_empty[st]);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (c.q == 0 && c.r0 + 8 * k < lim && tg[k] != 0.f)  // 0 log 0 = 0; a NaN target is kept
          loss_part += tg[k] * (logf(tg[k]) - (s[k] - lse_i));  // target (log target - log p_I)
      }
    } else {
      float g[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) g[k] = c.r0 + 8 * k < lim ? gs * (expf(s[k] - lse_i) - tg[k]) : 0.f;
      IB::to_dqk(acc, g[0], g[1], w_s, a.relu, c.q, dw);
      hw::named_bar_sync(kBarIndexer, kWarpgroup);  // every warp finished the previous block's dq GEMM
      IB::store_dqk_tile(acc, dqk_tile, c);
      float c_acc[IB::kOut];
      uint32_t af[IB::kFrags][4];
      IB::issue_dk(c_acc, af, acc, qi_tile);
      hw::fence_proxy_async();
      hw::named_bar_sync(kBarIndexer, kWarpgroup);  // dqk tile complete
      IB::issue_dq(dq_acc, dqk_tile, ki_tile(st));
      hw::wgmma_wait<1>();
      hw::fence_regs(c_acc);
      fence_frags(af);
      const int64_t key0 = ks + b * kBlockKeys + c.r0;
      if (g[0] != 0.f) IB::scatter_dk(a.grad.dk_idx + key0 * DI, c_acc, 0, c.q);
      if (g[1] != 0.f) IB::scatter_dk(a.grad.dk_idx + (key0 + 8) * DI, c_acc, 1, c.q);
      hw::wgmma_wait<0>();
      hw::fence_regs(dq_acc);
      hw::mbar_arrive(&ki_empty[st]);
    }
  }
  if constexpr (!kBwd) {
    loss_part = warpgroup_allreduce<false>(loss_part, red1, wtid, kBarIndexer);
    if (wtid == 0) a.loss_rows[t] = loss_part;
  } else {
    IB::store_dq(dq_acc, a.grad.dq_idx + t * HI * DI, c);
    IB::reduce_store_dw(dw, red1, a.grad.dweights + t * HI, c, wtid, kBarIndexer);
  }
}

template <bool kBwd>
Status launch_dense_kl(const DenseKlParams& p) {
  DenseKlArgs a{};
  a.q = static_cast<const __nv_bfloat16*>(p.attn.q);
  a.q_stride_t = p.attn.q_stride_t;
  a.q_stride_h = p.attn.q_stride_h;
  a.kv = static_cast<const __nv_bfloat16*>(p.attn.kv);
  a.kv_stride_t = p.attn.kv_stride_t;
  a.scale = p.attn.scale;
  a.H = p.attn.H;
  a.T = p.T;
  a.k_start = p.k_start;
  a.k_end = p.k_end;
  set_indexer_args(a, p);
  const char* op = kBwd ? "dense_kl_bwd" : "dense_kl_fwd";
  return run_kl_launch<kBwd>(p, op, [&](auto hi, auto di, cudaStream_t stream) -> Status {
    constexpr int HI = decltype(hi)::value, DI = decltype(di)::value;
    auto launch = [&](auto kernel, int smem) {
      return launch_with_smem(kernel, dim3(static_cast<unsigned>(p.T)), kDenseThreads, smem, stream, op, a);
    };
    if (p.attn.H > 64) return launch(dense_kl_kernel<2, HI, DI, kBwd>, DenseKlSmem<2, HI, DI, kBwd>::kDynamicBytes);
    return launch(dense_kl_kernel<1, HI, DI, kBwd>, DenseKlSmem<1, HI, DI, kBwd>::kDynamicBytes);
  });
}

}  // namespace
}  // namespace kl_loss_impl

Status dense_kl_fwd(const DenseKlParams& p) { return kl_loss_impl::launch_dense_kl<false>(p); }
Status dense_kl_bwd(const DenseKlParams& p) { return kl_loss_impl::launch_dense_kl<true>(p); }

}  // namespace flashdsa::sm90
