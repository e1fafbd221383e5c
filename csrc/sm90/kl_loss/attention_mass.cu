// Attention-mass recompute (docs/spec.md §6, sparse KL target):
//   mass[t, j] = sum_h exp(scale * q[t,h] . kv[idx_j] - lse[t,h])     (0 for empty slots)
// One block per query token, 3 warpgroups: WG2 gathers Q and the selected kv rows (cp.async into a
// ring of 8 KB chunk slots); WG0 / WG1 take the token's non-empty 64-key blocks alternately (ping-pong,
// so one's exp / column-sum epilogue overlaps the other's wgmmas) and compute S = Q K^T (64 heads per
// wgmma M, 9 x 4 k-steps), P = exp2(S c - lse2), and the column sums over heads. Nothing of
// [T, H, K] is stored. Design notes: docs/kernels/kl_loss.md.
#include <cuda_bf16.h>

#include "sm90/common/cuda_check.cuh"
#include "sm90/kl_loss/attn_stream.cuh"
#include "sm90/kl_loss/indexer_dispatch.cuh"
#include "sm90/backend.h"

namespace flashdsa::sm90 {
namespace kl_loss_impl {
namespace {

struct MassArgs {
  const __nv_bfloat16* q;   // [T, H, 576]
  const __nv_bfloat16* kv;  // [T_kv, 576]
  const int32_t* indices;   // [T, K]
  const float* lse;         // [T, H]
  float* mass;              // [T, K]
  float scale;
  int64_t T_kv;
  int H, K;
  int64_t q_stride_t, q_stride_h, kv_stride_t, indices_stride_t;
};

// Shared-memory plan (offsets from the 1024-aligned base). NHG = head groups of 64.
template <int NHG>
struct MassSmem {
  static constexpr int kRing = NHG == 1 ? 18 : 9;  // chunk slots: two blocks (NHG 1) or one (NHG 2)
  static constexpr int kQ = 0;
  static constexpr int kRingOff = kQ + NHG * kQGroupBytes;
  static constexpr int kRed = kRingOff + kRing * kChunkBytes;  // float [2 WG][2 buf][4 warps][64]
  static constexpr int kRedBytes = 2 * 2 * 4 * 64 * 4;
  static constexpr int kBars = kRed + kRedBytes;               // uint64 full[kRing], empty[kRing], q
  static constexpr int kList = kBars + (2 * kRing + 1) * 8;    // BlockList
  static constexpr int kBytes = kList + static_cast<int>(sizeof(BlockList));
  static constexpr int kDynamicBytes = kBytes + kSmemAlign;    // slack for aligning the base
  static_assert(kDynamicBytes <= kSmemLimit, "attention-mass shared memory over budget");
};

constexpr int kMassThreads = 3 * kWarpgroup;

template <int NHG>
__global__ void __launch_bounds__(kMassThreads, 1) attention_mass_kernel(const MassArgs a) {
  using L = MassSmem<NHG>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  const KvRing<L::kRing> ring{smem + L::kRingOff, bars, bars + L::kRing};
  uint64_t* q_bar = bars + 2 * L::kRing;
  BlockList& bl = *reinterpret_cast<BlockList*>(smem + L::kList);

  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, wg = tid / kWarpgroup, wtid = tid % kWarpgroup;
  const int32_t* idx_row = a.indices + t * a.indices_stride_t;
  float* mass_row = a.mass + t * a.K;

  if (tid == 0) {
    for (int i = 0; i < L::kRing; ++i) {
      hw::mbar_init(&ring.full[i], kWarpgroup);
      hw::mbar_init(&ring.empty[i], kWarpgroup);
    }
    hw::mbar_init(q_bar, kWarpgroup);
    hw::mbar_fence_init();
  }
  const int nb = build_block_list(idx_row, a.K, a.T_kv, bl, tid, kMassThreads);  // also publishes the inits

  if (wg == 2) {
    // ---- producer: Q once, then the 9 chunks of every non-empty block in order ----
    if (nb == 0) return;
    load_q_groups<NHG>(smem + L::kQ, a.q + t * a.q_stride_t, a.q_stride_h, a.H, wtid);
    hw::cp_async_arrive(q_bar);
    const int row = wtid >> 3;
#pragma unroll 1
    for (int n = 0; n < nb; ++n) {
      const int b = bl.ids[n];
      const __nv_bfloat16* rows[kRowsPerProducerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerProducerThread; ++i) {
        const int32_t r = __ldg(idx_row + b * kBlockKeys + row + 16 * i);
        rows[i] = valid_row(r, a.T_kv) ? a.kv + r * a.kv_stride_t : nullptr;
      }
      ring.produce_block(n * kChunksPerBlock, rows, a.kv, wtid);
    }
    hw::cp_async_wait<0>();
    return;
  }

  // ---- consumers ----
  // Slots of empty blocks are never computed: write their zeros here.
  for (int j = tid; j < a.K; j += 2 * kWarpgroup)
    if (!block_nonempty(bl, j / kBlockKeys)) mass_row[j] = 0.f;
  // Consumers: with NHG = 1 the two warpgroups take alternate key blocks, each with its own half of
  // the 18-slot ring (slots 0-8: even blocks, 9-17: odd ones), so a slot's consecutive phases belong
  // to one warpgroup. With NHG = 2 the ring has one block's 9 slots; two consumers alternating on
  // them would wait on mbarrier parities two phases apart (a parity wait passes at once for the phase
  // before the current one, and a consumer may run a block ahead), so warpgroup 0 consumes every
  // block and warpgroup 1 only zero-fills above.
  constexpr int kConsumers = NHG == 1 ? 2 : 1;
  if (wg >= kConsumers || nb <= wg) return;

  const AccCoord c(wtid);
  float lse2[NHG][2];
  load_lse2<NHG>(lse2, a.lse + t * a.H, a.H, c.r0);
  const float sc = a.scale * kLog2e;
  float* red = reinterpret_cast<float*>(smem + L::kRed) + wg * 2 * 4 * 64;
  int buf = 0;
  hw::mbar_wait(q_bar, 0);

#pragma unroll 1
  for (int n = wg; n < nb; n += kConsumers) {
    float acc[NHG][32];
    ring.template consume_block<NHG>(acc, smem + L::kQ, n * kChunksPerBlock);
    float v[16];
    head_sum_partials<NHG>(acc, lse2, sc, v);
    const float colsum = warpgroup_colsum64(v, red, buf, c, wtid, 1 + wg);
    if (wtid < kBlockKeys) {
      // Empty slots hold zero-filled rows: their sums are meaningless, and masked only here.
      const int j = bl.ids[n] * kBlockKeys + wtid;
      mass_row[j] = valid_row(__ldg(idx_row + j), a.T_kv) ? colsum : 0.f;
    }
  }
}

template <int NHG>
Status launch_attention_mass(const MassArgs& a, int64_t T, cudaStream_t stream) {
  return launch_with_smem(attention_mass_kernel<NHG>, dim3(static_cast<unsigned>(T)), kMassThreads,
                          MassSmem<NHG>::kDynamicBytes, stream, "attention_mass_kernel", a);
}

}  // namespace
}  // namespace kl_loss_impl

Status attention_mass(const AttnMassParams& p) {
  if (p.T == 0) return Status::OK();
  const kl_loss_impl::MassArgs a{static_cast<const __nv_bfloat16*>(p.attn.q),
                                 static_cast<const __nv_bfloat16*>(p.attn.kv),
                                 p.topk.indices,
                                 static_cast<const float*>(p.lse),
                                 static_cast<float*>(p.mass),
                                 p.attn.scale,
                                 p.T_kv,
                                 p.attn.H,
                                 p.topk.K,
                                 p.attn.q_stride_t,
                                 p.attn.q_stride_h,
                                 p.attn.kv_stride_t,
                                 p.topk.stride_t};
  auto stream = static_cast<cudaStream_t>(p.stream);
  return p.attn.H > 64 ? kl_loss_impl::launch_attention_mass<2>(a, p.T, stream)
                       : kl_loss_impl::launch_attention_mass<1>(a, p.T, stream);
}

}  // namespace flashdsa::sm90
