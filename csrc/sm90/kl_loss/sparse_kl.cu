// Sparse indexer KL loss (DSA_SPEC §6, the default formulation), forward and backward.
// Support of row t = its valid top-k slots; target = mass / sum(mass); p_I = softmax of the index
// scores score(t, idx_j) = sum_h w[t,h] f(q_idx[t,h] . k_idx[idx_j]), recomputed here.
//
// One block (one warpgroup) per query token. The token's non-empty 64-slot blocks are gathered
// (k_idx rows, cp.async, 3-stage pipeline) and scored with wgmma (keys as M, heads as N); the scores
// of the row wait in shared memory, so the row statistics and the loss are exact two-pass sums.
// The backward gathers the blocks a second time and, per block, forms g = gs (p_I - target), then
//   d(q.k) = g w f'(q.k)   dw += g f(q.k)   dq_idx += d(q.k)^T k_idx   dk_idx[idx] += d(q.k) q_idx
// with dq_idx and dw accumulated in registers and dk_idx by fp32 atomics (red.global.add.v2.f32).
#include <cuda_bf16.h>

#include "sm90/common/cuda_check.cuh"
#include "sm90/kl_loss/indexer_dispatch.cuh"
#include "sm90/kl_loss/kl_common.cuh"
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {
namespace kl {
namespace {

struct SparseKlArgs {
  const __nv_bfloat16* q_idx;  // [T, H_I, D_I]
  const __nv_bfloat16* k_idx;  // [T_kv, D_I]
  const float* weights;        // [T, H_I]
  const int32_t* indices;      // [T, K]
  const float* mass;           // [T, K]
  float* loss_rows;            // [T] (fwd)
  const float* grad_rows;      // [T] or nullptr (bwd)
  float grad_scale;            // (bwd)
  __nv_bfloat16* dq_idx;       // [T, H_I, D_I] (bwd)
  float* dk_idx;               // [T_kv, D_I], zeroed before the launch (bwd)
  float* dweights;             // [T, H_I] (bwd)
  int64_t T_kv;
  int K;
  bool relu;
  int64_t q_idx_stride_t, q_idx_stride_h, k_idx_stride_t, weights_stride_t, indices_stride_t;
};

constexpr int kSparseStages = 3;

// Shared-memory plan (offsets from the 1024-aligned base); the score row [K] floats comes last.
template <int HI, int DI, bool kBwd>
struct SparseKlSmem {
  using IB = IndexerBlock<HI, DI>;
  static constexpr int kQ = 0;                                           // Q_I tile [HI x DI]
  static constexpr int kK = kQ + IB::kQTileBytes;                        // K_I tiles [stages][64 x DI]
  static constexpr int kDqk = kK + kSparseStages * IB::kKTileBytes;      // dqk tile [64 x 64] (bwd)
  static constexpr int kW = kDqk + (kBwd ? IB::kDqkTileBytes : 0);       // float w[HI]
  static constexpr int kRed = kW + HI * 4;                               // float [4][HI] reductions
  static constexpr int kList = kRed + 4 * HI * 4;                        // BlockList
  static constexpr int kRow = kList + ((static_cast<int>(sizeof(BlockList)) + 15) / 16) * 16;  // float [K]
  static_assert(IB::kQTileBytes % kSmemAlign == 0 && IB::kKTileBytes % kSmemAlign == 0, "tiles stay aligned");
  static int dynamic_bytes(int K) { return kRow + K * 4 + kSmemAlign; }
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
  float* row = reinterpret_cast<float*>(smem + L::kRow);  // scores, then g (bwd); -inf / 0 at empty slots
  auto k_tile = [&](int stage) { return smem + L::kK + stage * IB::kKTileBytes; };

  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  const AccCoord c(tid);
  const int32_t* idx_row = a.indices + t * a.indices_stride_t;
  const float* mass_row = a.mass + t * a.K;
  const __nv_bfloat16* q_t = a.q_idx + t * a.q_idx_stride_t;

  // Q_I joins the first cp.async group of the score pass.
  load_tile_sw128<HI, DI, kWarpgroup>(q_tile, tid, q_t, [&](int r) { return q_t + r * a.q_idx_stride_h; });
  if (tid < HI) w_s[tid] = a.weights[t * a.weights_stride_t + tid];
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

  // ---- pass 1: scores of every valid slot into row[] ----
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

  // ---- row statistics: max, log-sum-exp of the scores, sum of the mass over the support ----
  float mx = -INFINITY;
  for (int j = tid; j < a.K; j += kWarpgroup) mx = fmaxf(mx, row[j]);
  mx = warpgroup_allreduce<true>(mx, red, tid, 1);
  float se = 0.f, ms = 0.f;
  if (mx != -INFINITY) {
    for (int j = tid; j < a.K; j += kWarpgroup) {
      if (row[j] != -INFINITY) {
        se += expf(row[j] - mx);
        ms += mass_row[j];
      }
    }
  }
  se = warpgroup_allreduce<false>(se, red, tid, 1);
  ms = warpgroup_allreduce<false>(ms, red, tid, 1);
  // Empty support, or no attention mass on it: loss 0 and zero gradients.
  const bool live = mx != -INFINITY && ms > 0.f;
  const float lse = mx + logf(se);
  const float inv_ms = 1.f / ms;

  if constexpr (!kBwd) {
    float term = 0.f;
    if (live) {
      for (int j = tid; j < a.K; j += kWarpgroup) {
        const float m = row[j] != -INFINITY ? mass_row[j] : 0.f;
        if (m > 0.f) {
          const float tg = m * inv_ms;
          term += tg * (logf(tg) - (row[j] - lse));  // target (log target - log p_I); 0 log 0 = 0
        }
      }
    }
    term = warpgroup_allreduce<false>(term, red, tid, 1);
    if (tid == 0) a.loss_rows[t] = live ? term : 0.f;
  } else {
    __nv_bfloat16* dq_t = a.dq_idx + t * HI * DI;
    float* dw_t = a.dweights + t * HI;
    if (!live) {
      for (int i = tid; i < HI * DI / 2; i += kWarpgroup)
        reinterpret_cast<__nv_bfloat162*>(dq_t)[i] = __floats2bfloat162_rn(0.f, 0.f);
      if (tid < HI) dw_t[tid] = 0.f;
      return;
    }
    const float gs = a.grad_scale * (a.grad_rows ? a.grad_rows[t] : 1.f);
    for (int j = tid; j < a.K; j += kWarpgroup)
      row[j] = row[j] != -INFINITY ? gs * (expf(row[j] - lse) - mass_row[j] * inv_ms) : 0.f;
    // (the pipeline's first barrier publishes g)

    // ---- pass 2: recompute the block's scores, then the gradient GEMMs ----
    float dq_acc[IB::kOut];
    float dw[IB::kCols];
#pragma unroll
    for (int i = 0; i < IB::kOut; ++i) dq_acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < IB::kCols; ++i) dw[i] = 0.f;
    run_pipeline(nb, load_block, [&](int n, int stage) {
      const uint8_t* kt = k_tile(stage);
      const int j0 = bl.ids[n] * kBlockKeys + c.r0;
      float acc[IB::kAcc];
      IB::issue_scores(acc, kt, q_tile);
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      const float g0 = row[j0], g1 = row[j0 + 8];
      IB::to_dqk(acc, g0, g1, w_s, a.relu, c.q, dw);
      IB::store_dqk_tile(acc, dqk_tile, c);
      float c_acc[IB::kOut];
      uint32_t af[IB::kFrags][4];
      IB::issue_dk(c_acc, af, acc, q_tile);
      hw::fence_proxy_async();
      __syncthreads();  // dqk tile complete
      IB::issue_dq(dq_acc, dqk_tile, kt);
      hw::wgmma_wait<1>();
      hw::fence_regs(c_acc);
      fence_frags(af);
      // g == 0 exactly at empty slots (never written) and where there is nothing to add.
      if (g0 != 0.f) IB::scatter_dk(a.dk_idx + __ldg(idx_row + j0) * int64_t{DI}, c_acc, 0, c.q);
      if (g1 != 0.f) IB::scatter_dk(a.dk_idx + __ldg(idx_row + j0 + 8) * int64_t{DI}, c_acc, 1, c.q);
      hw::wgmma_wait<0>();
      hw::fence_regs(dq_acc);
    });
    IB::store_dq(dq_acc, dq_t, c);
    IB::reduce_store_dw(dw, red, dw_t, c, tid, 1);
  }
}

template <bool kBwd>
Status launch_sparse_kl(const SparseKlParams& p) {
  const char* op = kBwd ? "sparse_kl_bwd" : "sparse_kl_fwd";
  if (p.T == 0) return Status::OK();
  if (p.dtype != DType::kBF16) return Status::NotSupported(std::string("sm90 ") + op + ": needs bf16 q_idx/k_idx");
  if (!rows_16b_aligned(p.q_idx, {p.q_idx_stride_t, p.q_idx_stride_h}) ||
      !rows_16b_aligned(p.k_idx, {p.k_idx_stride_t}))
    return Status::NotSupported(std::string("sm90 ") + op + ": q_idx/k_idx rows must be 16-byte aligned");
  auto stream = static_cast<cudaStream_t>(p.stream);
  if (kBwd && p.T_kv > 0)
    FLASHDSA_CUDA_TRY(cudaMemsetAsync(p.dk_idx, 0, static_cast<size_t>(p.T_kv) * p.D_I * sizeof(float), stream));
  const SparseKlArgs a{static_cast<const __nv_bfloat16*>(p.q_idx),
                       static_cast<const __nv_bfloat16*>(p.k_idx),
                       static_cast<const float*>(p.weights),
                       p.indices,
                       static_cast<const float*>(p.mass),
                       static_cast<float*>(p.loss_rows),
                       static_cast<const float*>(p.grad_rows),
                       static_cast<float>(p.grad_scale),
                       static_cast<__nv_bfloat16*>(p.dq_idx),
                       static_cast<float*>(p.dk_idx),
                       static_cast<float*>(p.dweights),
                       p.T_kv,
                       p.K,
                       p.relu,
                       p.q_idx_stride_t,
                       p.q_idx_stride_h,
                       p.k_idx_stride_t,
                       p.weights_stride_t,
                       p.indices_stride_t};
  return dispatch_indexer_shape(p.H_I, p.D_I, op, [&](auto hi, auto di) -> Status {
    constexpr int HI = decltype(hi)::value, DI = decltype(di)::value;
    auto kernel = sparse_kl_kernel<HI, DI, kBwd>;
    const int smem = SparseKlSmem<HI, DI, kBwd>::dynamic_bytes(p.K);
    FLASHDSA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<static_cast<unsigned>(p.T), kWarpgroup, smem, stream>>>(a);
    FLASHDSA_CHECK_LAUNCH(op);
    return Status::OK();
  });
}

}  // namespace
}  // namespace kl

Status sparse_kl_fwd(const SparseKlParams& p) { return kl::launch_sparse_kl<false>(p); }
Status sparse_kl_bwd(const SparseKlParams& p) { return kl::launch_sparse_kl<true>(p); }

}  // namespace flashdsa::sm90
