// CPU FP8 (e4m3) indexer: the quantization of indexer rows and the FP8 selection pass of
// indexer_topk with its exact re-score (docs/spec.md §3 "FP8 selection").
//
// Selection pass: the products of two e4m3 values have at most 8 significant bits and lie in
// [2^-18, 448^2], so a dot product of up to 256 of them is exact in double; the head sum and the
// scales are applied in double. Candidates are ranked like the exact selection (NaN first, then
// larger score, then smaller key), re-scored with the same code as the unquantized op (bitwise the
// scores that op computes), and the K best of them are written in increasing key order.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/parallel.h"
#include "cpu/backend.h"
#include "cpu/op_inputs.h"
#include "cpu/topk_order.h"

namespace flashdsa::cpu {
namespace {

constexpr int kKeyTile = kTopkKeyTile;
template <class Acc>
using Candidate = TopkCandidate<Acc>;

float to_float(bf16 v) { return bf16_to_float(v); }
float to_float(float v) { return v; }
float to_float(double v) { return static_cast<float>(v); }

template <class Act>
Status quantize_impl(const QuantizeFp8Params& p) {
  const Act* x = static_cast<const Act*>(p.x);
  fp8_e4m3* out = static_cast<fp8_e4m3*>(p.out);
  const int64_t rows = p.N0 * p.N1;
  const int D = p.D;
  detail::parallel_for(rows, 256, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const Act* src = x + (r / p.N1) * p.stride0 + (r % p.N1) * p.stride1;
      fp8_e4m3* dst = out + r * D;
      float amax = 0.f;
      bool finite = true;
      for (int i = 0; i < D; ++i) {
        const float v = to_float(src[i]);
        finite = finite && std::isfinite(v);
        amax = std::max(amax, std::fabs(v));
      }
      float scale = finite ? amax / kFp8E4M3Max : std::numeric_limits<float>::quiet_NaN();
      if (finite && !(scale > 0.f)) scale = 1.f;  // a zero row (or a scale below the fp32 range)
      p.scale[r] = scale;
      for (int i = 0; i < D; ++i) {
        dst[i] = finite ? float_to_fp8_e4m3(to_float(src[i]) / scale) : fp8_e4m3{0x7f};
      }
    }
  });
  return Status::OK();
}

// The FP8 selection pass, re-scored from p.rescore (activation type Act).
template <class Act>
Status indexer_topk_fp8_impl(const IndexerTopkParams& p) {
  using Acc = AccOf<Act>;
  const IndexerInputs<Act> exact(p.rescore, p.T_kv);
  const IndexerTensors& in8 = p.indexer;
  const int H = in8.H_I, D = in8.D_I, K = p.K;
  const int cand_max = p.candidates ? p.candidates : fp8_selection_candidates(K);
  Acc* scores_out = static_cast<Acc*>(p.scores);

  // The quantized keys as doubles (exact), contiguous [T_kv, D].
  Buffer<double> k8(static_cast<size_t>(p.T_kv) * D);
  const fp8_e4m3* k_src = static_cast<const fp8_e4m3*>(in8.k_idx);
  detail::parallel_for(p.T_kv, 256, [&](int64_t begin, int64_t end, int) {
    for (int64_t s = begin; s < end; ++s) {
      for (int i = 0; i < D; ++i) k8[s * D + i] = fp8_e4m3_to_float(k_src[s * in8.k_idx_stride_t + i]);
    }
  });
  const fp8_e4m3* q_src = static_cast<const fp8_e4m3*>(in8.q_idx);
  const float* w8 = static_cast<const float*>(in8.weights);

  const int workers = detail::num_threads();
  WorkerScratch<double> q_scratch(workers, H * D);
  WorkerScratch<double> w_scratch(workers, H);
  WorkerScratch<double> qk8_scratch(workers, H * kKeyTile);
  WorkerScratch<const double*> rows8_scratch(workers, kKeyTile);
  WorkerScratch<double> score8_scratch(workers, p.T_kv);
  WorkerScratch<Candidate<double>> cand8_scratch(workers, p.T_kv);
  TopkRowScratch<Acc> exact_scratch(workers, H, D, std::min<int64_t>(p.T_kv, cand_max));  // the re-score

  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    double* q = q_scratch(worker);
    double* w = w_scratch(worker);
    double* qk8 = qk8_scratch(worker);
    const double** rows8 = rows8_scratch(worker);
    double* score8 = score8_scratch(worker);
    Candidate<double>* cand8 = cand8_scratch(worker);
    const typename TopkRowScratch<Acc>::Row r = exact_scratch(worker);
    Candidate<Acc>* cand = r.cand;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = p.k_start[t];
      const int n = static_cast<int>(p.k_end[t] - ks);
      // The band re-score (p.rescore_band = b > 0, indices only) on a row with more than K visible keys: the
      // K - b best candidates by the FP8 score are kept as they are, the others re-scored, and their b best join.
      // Scaled to the row's keys (rescore_band_scaled): the band b_n and the slack C - K both times the row's share.
      const bool band = p.rescore_band > 0 && n > K;
      const bool scaled = band && p.rescore_band_scaled;
      const int row_band = scaled ? fp8_row_band_part(p.rescore_band, n, K) : p.rescore_band;
      const int C = std::min(n, scaled ? fp8_row_candidates(cand_max, n, K) : cand_max);

      // 1. The candidates: every visible key when n <= C, else the C best by the FP8 score.
      if (n > C || band) {
        for (int h = 0; h < H; ++h) {
          const fp8_e4m3* qh = q_src + t * in8.q_idx_stride_t + h * in8.q_idx_stride_h;
          for (int i = 0; i < D; ++i) q[h * D + i] = fp8_e4m3_to_float(qh[i]);
          w[h] = static_cast<double>(w8[t * in8.weights_stride_t + h]) * static_cast<double>(in8.q_idx_scale[t * H + h]);
        }
        for (int i0 = 0; i0 < n; i0 += kKeyTile) {
          const int c = std::min(kKeyTile, n - i0);
          for (int i = 0; i < c; ++i) rows8[i] = k8.data() + (ks + i0 + i) * D;
          dot_rows(q, D, H, rows8, c, D, 1.0, qk8, kKeyTile);
          weighted_head_sum(qk8, kKeyTile, w, H, c, in8.relu, score8 + i0);
          for (int i = 0; i < c; ++i) score8[i0 + i] *= static_cast<double>(in8.k_idx_scale[ks + i0 + i]);
        }
        for (int i = 0; i < n; ++i) cand8[i] = {score8[i], static_cast<int32_t>(ks + i)};
        if (n > C) std::nth_element(cand8, cand8 + C, cand8 + n, ranks_before<double>);
        for (int i = 0; i < C; ++i) cand[i].key = cand8[i].key;
      } else {
        for (int i = 0; i < C; ++i) cand[i].key = static_cast<int32_t>(ks + i);
      }

      // Band: the K - b best candidates by the FP8 score are kept as they are (`sure`), the others re-scored.
      int sure = 0, m = C;
      if (band) {
        sure = K - row_band;
        std::nth_element(cand8, cand8 + sure, cand8 + C, ranks_before<double>);
        m = C - sure;  // >= the row's band since C >= K
        for (int i = 0; i < m; ++i) cand[i].key = cand8[sure + i].key;
      }
      // 2. The exact re-score of the candidates (the unquantized op's arithmetic).
      exact.load_q(t, r.q);
      exact.template score_keys<kKeyTile>(t, r.q, m, [&](int i) { return cand[i].key; }, r.rows, r.qk, r.score);
      for (int i = 0; i < m; ++i) cand[i].score = r.score[i];

      // 3. The K best of the candidates (band: the b best after the sure ones), in increasing key order.
      int32_t* out = p.indices + t * K;
      write_row_top_k(cand, m, K - sure, out + sure, scores_out ? scores_out + t * K : nullptr);
      if (band) {
        for (int i = 0; i < sure; ++i) out[i] = cand8[i].key;
        std::sort(out, out + K);
      }
    }
  });
  return Status::OK();
}

}  // namespace

Status quantize_fp8(const QuantizeFp8Params& p) {
  return dispatch_act(p.dtype, [&](auto tag) { return quantize_impl<decltype(tag)>(p); });
}

Status indexer_topk_fp8(const IndexerTopkParams& p) {
  return dispatch_act(p.rescore.dtype, [&](auto tag) { return indexer_topk_fp8_impl<decltype(tag)>(p); });
}

}  // namespace flashdsa::cpu
