// Sparse indexer KL loss (docs/spec.md §6, the default formulation), forward and backward.
// Support of row t = its valid top-k slots; target = mass / sum(mass); p_I = softmax of the index
// scores score(t, idx_j) = sum_h w[t,h] f(q_idx[t,h] . k_idx[idx_j]), recomputed here.
//
// One block (one warpgroup) per query token. The token's non-empty 64-slot blocks are gathered
// (k_idx rows, cp.async, 3-stage pipeline) and scored with wgmma (keys as M, heads as N).
// Statistics pass (forward; backward without saved statistics): the scores of the row wait in shared
// memory, so the row statistics (log-sum-exp of the scores, sum of the mass) and the loss are exact
// two-pass sums; the forward can save the statistics (row_stats).
// Gradient pass (backward): starting from the statistics, the blocks are gathered once more and, per
// block, g = gs (p_I - target), then
//   d(q.k) = g w f'(q.k)   dw += g f(q.k)   dq_idx += d(q.k)^T k_idx   dk_idx[idx] += d(q.k) q_idx
// with dq_idx and dw accumulated in registers and dk_idx by full-line fp32 atomics
// (red.global.add.v4.f32, see IndexerBlock::scatter_dk_lines). With saved statistics the backward
// reads every key block once.
#include <cuda_bf16.h>

#include "common/status_macros.h"
#include "sm90/common/cuda_check.cuh"
#include "sm90/kl_loss/indexer_dispatch.cuh"
#include "sm90/kl_loss/kl_common.cuh"
#include "sm90/backend.h"

namespace flashdsa::sm90 {
namespace kl_loss_impl {
namespace {

struct SparseKlArgs {
  const __nv_bfloat16* q_idx;  // [T, H_I, D_I]
  const __nv_bfloat16* k_idx;  // [T_kv, D_I]
  const float* weights;        // [T, H_I]
  const int32_t* indices;      // [T, K]
  const float* mass;           // [T, K]
  float* loss_rows;            // [T] (fwd)
  float* row_stats;            // [T, 2] (lse, sum of mass) or nullptr: written by fwd, read by bwd
  IndexerGradArgs grad;        // (bwd)
  int64_t T_kv;
  int K;
  bool relu;
  int64_t q_idx_stride_t, q_idx_stride_h, k_idx_stride_t, weights_stride_t, indices_stride_t;
};

constexpr int kSparseStages = 3;

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Shared-memory plan (offsets from the 1024-aligned base). The last region holds the score row [K]
// floats of the statistics pass and, in the backward, the permuted Q_I tile of the gradient pass
// (loaded only after the statistics pass is over, so both share the bytes).
template <int HI, int DI, bool kBwd>
struct SparseKlSmem {
  using IB = IndexerBlock<HI, DI>;
  static constexpr int kQ = 0;                                           // Q_I tile [HI x DI]
  static constexpr int kK = kQ + IB::kQTileBytes;                        // K_I tiles [stages][64 x DI]
  static constexpr int kDqk = kK + kSparseStages * IB::kKTileBytes;      // dqk tile [64 x 64] (bwd)
  static constexpr int kSlots = kDqk + (kBwd ? IB::kDqkTileBytes : 0);   // (bwd) [stages] {int32 key[64], float mass[64]}
  static constexpr int kSlotBytes = kBlockKeys * 8;
  static constexpr int kW = kSlots + (kBwd ? kSparseStages * kSlotBytes : 0);  // float w[HI]
  static constexpr int kRed = kW + HI * 4;                               // float [4][HI] reductions
  static constexpr int kList = kRed + 4 * HI * 4;                        // BlockList
  static constexpr int kTail = round_up(kList + static_cast<int>(sizeof(BlockList)), kSmemAlign);  // row | Q_I perm
  static_assert(IB::kQTileBytes % kSmemAlign == 0 && IB::kKTileBytes % kSmemAlign == 0, "tiles stay aligned");
  static int dynamic_bytes(int K, bool stats_pass) {
    const int row = stats_pass ? K * 4 : 0;
    const int q_perm = kBwd ? IB::kQTileBytes : 0;
    return kTail + (row > q_perm ? row : q_perm) + kSmemAlign;
  }
};

// Multistage cp.async pipeline run by all 128 threads over the nb non-empty blocks: load(n, stage)
// issues block n's copies, compute(n, stage) must finish every read of the stage before returning.
template <class Load, class Compute>
__device__ __forceinline__ void run_pipeline(int nb, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < kSparseStages - 1; ++s) {
    if (s < nb) load(s, s);
    hw::cp_async_commit();
  }
#pragma unroll 1
  for (int n = 0; n < nb; ++n) {
    hw::cp_async_wait<kSparseStages - 2>();
    hw::fence_proxy_async();  // cp.async writes (generic proxy) -> wgmma reads (async proxy)
    __syncthreads();          // block n landed for everyone; block n-1's stage is free
    const int next = n + kSparseStages - 1;
    if (next < nb) load(next, next % kSparseStages);
    hw::cp_async_commit();
    compute(n, n % kSparseStages);
  }
  hw::cp_async_wait<0>();
}

// Statistics of a row: log-sum-exp of its scores over the support and the sum of its mass. `live`:
// the row has a target (non-empty support and mass > 0); other rows get loss 0 and zero gradients.
struct RowStats {
  float lse, mass_sum;
  bool live;
};

template <int HI, int DI, bool kBwd>
__global__ void __launch_bounds__(kWarpgroup, kBwd ? 2 : 3) sparse_kl_kernel(const SparseKlArgs a) {
  using IB = IndexerBlock<HI, DI>;
  using L = SparseKlSmem<HI, DI, kBwd>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint8_t* q_tile = smem + L::kQ;
  uint8_t* dqk_tile = smem + L::kDqk;
  float* w_s = reinterpret_cast<float*>(smem + L::kW);
  float* red = reinterpret_cast<float*>(smem + L::kRed);
  BlockList& bl = *reinterpret_cast<BlockList*>(smem + L::kList);
  float* row = reinterpret_cast<float*>(smem + L::kTail);  // statistics pass: scores, -inf at empty slots
  uint8_t* q_perm_tile = smem + L::kTail;                   // gradient pass: Q_I, permuted columns
  auto k_tile = [&](int stage) { return smem + L::kK + stage * IB::kKTileBytes; };
  auto slot_keys = [&](int stage) { return reinterpret_cast<int32_t*>(smem + L::kSlots + stage * L::kSlotBytes); };
  auto slot_mass = [&](int stage) { return reinterpret_cast<float*>(slot_keys(stage) + kBlockKeys); };

  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  const AccCoord c(tid);
  const int32_t* idx_row = a.indices + t * a.indices_stride_t;
  const float* mass_row = a.mass + t * a.K;
  const __nv_bfloat16* q_t = a.q_idx + t * a.q_idx_stride_t;
  auto write_zero_grads = [&] {  // (bwd) a row without a target
    for (int i = tid; i < HI * DI / 2; i += kWarpgroup)
      reinterpret_cast<__nv_bfloat162*>(a.grad.dq_idx + t * HI * DI)[i] = __floats2bfloat162_rn(0.f, 0.f);
    if (tid < HI) a.grad.dweights[t * HI + tid] = 0.f;
  };

  // The backward starting from saved statistics: rows without a target are done before any load.
  const bool stats_pass = !kBwd || a.row_stats == nullptr;
  RowStats st{0.f, 0.f, false};
  if (!stats_pass) {
    st.lse = a.row_stats[2 * t];
    st.mass_sum = a.row_stats[2 * t + 1];
    st.live = st.mass_sum != 0.f;  // the forward saves 0 for a row without a target (NaN counts as live)
    if (!st.live) {
      write_zero_grads();
      return;
    }
  }

  // Q_I joins the first cp.async group of the first pass.
  load_tile_sw128<HI, DI, kWarpgroup>(q_tile, tid, q_t, [&](int r) { return q_t + r * a.q_idx_stride_h; });
  if (tid < HI) w_s[tid] = a.weights[t * a.weights_stride_t + tid];
  if (stats_pass)
    for (int j = tid; j < a.K; j += kWarpgroup) row[j] = -INFINITY;
  if constexpr (kBwd) IB::clear_dqk_padding(dqk_tile, tid, kWarpgroup);
  const int nb = build_block_list(idx_row, a.K, a.T_kv, bl, tid, kWarpgroup);

  auto load_block = [&](int n, int stage) {
    const int j0 = bl.ids[n] * kBlockKeys;
    load_tile_sw128<kBlockKeys, DI, kWarpgroup>(k_tile(stage), tid, a.k_idx, [&](int r) {
      const int32_t s = __ldg(idx_row + j0 + r);
      return valid_row(s, a.T_kv) ? a.k_idx + s * a.k_idx_stride_t : static_cast<const __nv_bfloat16*>(nullptr);
    });
  };

  if (stats_pass) {
    // ---- statistics pass: scores of every valid slot into row[] ----
    run_pipeline(nb, load_block, [&](int n, int stage) {
      float acc[IB::kAcc];
      IB::issue_scores(acc, k_tile(stage), q_tile);
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      float s0, s1;
      IB::reduce_scores(acc, w_s, a.relu, c.q, s0, s1);
      if (c.q == 0) {
        const int j0 = bl.ids[n] * kBlockKeys + c.r0;
        if (valid_row(__ldg(idx_row + j0), a.T_kv)) row[j0] = s0;
        if (valid_row(__ldg(idx_row + j0 + 8), a.T_kv)) row[j0 + 8] = s1;
      }
    });
    __syncthreads();

    // max, log-sum-exp of the scores, sum of the mass over the support
    float mx = -INFINITY;
    for (int j = tid; j < a.K; j += kWarpgroup) mx = fmaxf(mx, row[j]);
    mx = warpgroup_allreduce<true>(mx, red, tid, 1);
    // Valid slots only (row[j] != -inf). With mx = -inf these can only be NaN scores (fmaxf drops
    // NaN): they make se NaN instead of vanishing (docs/reliability.md).
    float se = 0.f, ms = 0.f;
    for (int j = tid; j < a.K; j += kWarpgroup) {
      if (row[j] != -INFINITY) {
        se += expf(row[j] - mx);
        ms += mass_row[j];
      }
    }
    se = warpgroup_allreduce<false>(se, red, tid, 1);
    ms = warpgroup_allreduce<false>(ms, red, tid, 1);
    // Empty support (se = 0), or no attention mass on it (ms = 0): loss 0 and zero gradients. A NaN
    // score or mass keeps the row live, so the NaN reaches the loss and the gradients (as on the CPU).
    st.live = se != 0.f && ms != 0.f;
    st.lse = mx + logf(se);
    st.mass_sum = ms;
  }
  const float inv_ms = 1.f / st.mass_sum;

  if constexpr (!kBwd) {
    float term = 0.f;
    if (st.live) {
      for (int j = tid; j < a.K; j += kWarpgroup) {
        const float m = row[j] != -INFINITY ? mass_row[j] : 0.f;
        // Test the target itself, not the mass: a denormal mass times 1/Σmass can round to 0, and
        // 0 · log 0 would be NaN (0 log 0 = 0).
        const float tg = m * inv_ms;
        if (tg != 0.f) term += tg * (logf(tg) - (row[j] - st.lse));  // target (log target - log p_I); NaN kept
      }
    }
    term = warpgroup_allreduce<false>(term, red, tid, 1);
    if (tid == 0) {
      a.loss_rows[t] = st.live ? term : 0.f;
      if (a.row_stats) {
        a.row_stats[2 * t] = st.live ? st.lse : -INFINITY;
        a.row_stats[2 * t + 1] = st.live ? st.mass_sum : 0.f;
      }
    }
  } else {
    if (!st.live) {
      write_zero_grads();
      return;
    }
    const float gs = a.grad.grad_scale * (a.grad.grad_rows ? a.grad.grad_rows[t] : 1.f);
    // Joins the first cp.async group of the gradient pass (row[] is no longer read: the reductions
    // above end with a barrier).
    IB::load_q_permuted(q_perm_tile, tid, q_t, a.q_idx_stride_h);

    // Block n: the key rows, plus the block's 64 key ids and masses (one 4-byte copy per thread).
    auto load_grad_block = [&](int n, int stage) {
      load_block(n, stage);
      const int j = bl.ids[n] * kBlockKeys + (tid & (kBlockKeys - 1));
      if (tid < kBlockKeys) hw::cp_async_4(hw::smem_u32(slot_keys(stage) + tid), idx_row + j, true);
      else hw::cp_async_4(hw::smem_u32(slot_mass(stage) + tid - kBlockKeys), mass_row + j, true);
    };

    // ---- gradient pass: the block's scores, g, then the gradient GEMMs ----
    float dq_acc[IB::kOut];
    float dw[IB::kCols];
#pragma unroll
    for (int i = 0; i < IB::kOut; ++i) dq_acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < IB::kCols; ++i) dw[i] = 0.f;
    run_pipeline(nb, load_grad_block, [&](int n, int stage) {
      const uint8_t* kt = k_tile(stage);
      const int32_t* keys = slot_keys(stage);
      const float* masses = slot_mass(stage);
      float acc[IB::kAcc];
      IB::issue_scores(acc, kt, q_tile);
      const bool v0 = valid_row(keys[c.r0], a.T_kv), v1 = valid_row(keys[c.r0 + 8], a.T_kv);
      const float m0 = masses[c.r0], m1 = masses[c.r0 + 8];
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      float s0, s1;
      IB::reduce_scores(acc, w_s, a.relu, c.q, s0, s1);
      // g = d loss / d score; exactly 0 at empty slots.
      const float g0 = v0 ? gs * (expf(s0 - st.lse) - m0 * inv_ms) : 0.f;
      const float g1 = v1 ? gs * (expf(s1 - st.lse) - m1 * inv_ms) : 0.f;
      IB::to_dqk(acc, g0, g1, w_s, a.relu, c.q, dw);
      IB::store_dqk_tile(acc, dqk_tile, c);
      float c_acc[IB::kOut];
      uint32_t af[IB::kFrags][4];
      IB::issue_dk(c_acc, af, acc, q_perm_tile);
      hw::fence_proxy_async();
      __syncthreads();  // dqk tile complete
      IB::issue_dq(dq_acc, dqk_tile, kt);
      hw::wgmma_wait<1>();
      hw::fence_regs(c_acc);
      fence_frags(af);
      IB::scatter_dk_lines(a.grad.dk_idx, c_acc, keys, g0, g1, c);
      hw::wgmma_wait<0>();
      hw::fence_regs(dq_acc);
    });
    IB::store_dq(dq_acc, a.grad.dq_idx + t * HI * DI, c);
    IB::reduce_store_dw(dw, red, a.grad.dweights + t * HI, c, tid, 1);
  }
}

template <bool kBwd>
Status launch_sparse_kl(const SparseKlParams& p) {
  SparseKlArgs a{};
  set_indexer_args(a, p);
  a.indices = p.topk.indices;
  a.indices_stride_t = p.topk.stride_t;
  a.K = p.topk.K;
  a.T_kv = p.T_kv;
  a.mass = static_cast<const float*>(p.mass);
  a.row_stats = static_cast<float*>(p.row_stats);
  const char* op = kBwd ? "sparse_kl_bwd" : "sparse_kl_fwd";
  return run_kl_launch<kBwd>(p, op, [&](auto hi, auto di, cudaStream_t stream) -> Status {
    constexpr int HI = decltype(hi)::value, DI = decltype(di)::value;
    // The backward with saved statistics skips the statistics pass and its score row.
    const int smem = SparseKlSmem<HI, DI, kBwd>::dynamic_bytes(p.topk.K, !kBwd || p.row_stats == nullptr);
    return launch_with_smem(sparse_kl_kernel<HI, DI, kBwd>, dim3(static_cast<unsigned>(p.T)), kWarpgroup, smem, stream,
                            op, a);
  });
}

}  // namespace
}  // namespace kl_loss_impl

Status sparse_kl_fwd(const SparseKlParams& p) { return kl_loss_impl::launch_sparse_kl<false>(p); }
Status sparse_kl_bwd(const SparseKlParams& p) { return kl_loss_impl::launch_sparse_kl<true>(p); }

}  // namespace flashdsa::sm90
