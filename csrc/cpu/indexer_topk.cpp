// CPU lightning indexer + top-k (docs/spec.md §3).
//
// Rows run in parallel. Each row scores its visible keys tile by tile into a row-local buffer
// (O(T_kv) per worker, never T x T_kv), then selects the K best with nth_element. Selection order:
// NaN first, then larger score, then smaller key index, so the selected set is unique.
// Selected keys are written in increasing key order.
#include <algorithm>
#include <cmath>

#include "cpu/backend.h"
#include "cpu/op_inputs.h"
#include "cpu/topk_order.h"

namespace flashdsa::cpu {
namespace {

constexpr int kKeyTile = kTopkKeyTile;
template <class Acc>
using Candidate = TopkCandidate<Acc>;

template <class Act>
Status indexer_topk_impl(const IndexerTopkParams& p) {
  using Acc = AccOf<Act>;
  const IndexerInputs<Act> in(p.indexer, p.T_kv);
  const int H = p.indexer.H_I, D = p.indexer.D_I, K = p.K;
  Acc* scores_out = static_cast<Acc*>(p.scores);

  TopkRowScratch<Acc> scratch(detail::num_threads(), H, D, p.T_kv);  // scores of every visible key

  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    const typename TopkRowScratch<Acc>::Row r = scratch(worker);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = p.k_start[t];
      const int n = static_cast<int>(p.k_end[t] - ks);
      in.load_q(t, r.q);
      in.template score_keys<kKeyTile>(t, r.q, n, [&](int i) { return ks + i; }, r.rows, r.qk, r.score);
      for (int i = 0; i < n; ++i) r.cand[i] = {r.score[i], static_cast<int32_t>(ks + i)};
      write_row_top_k(r.cand, n, K, p.indices + t * K, scores_out ? scores_out + t * K : nullptr);
    }
  });
  return Status::OK();
}

}  // namespace

Status indexer_topk(const IndexerTopkParams& p) {
  if (p.indexer.dtype == DType::kFP8E4M3) return indexer_topk_fp8(p);  // indexer_fp8.cpp
  return dispatch_act(p.indexer.dtype, [&](auto tag) { return indexer_topk_impl<decltype(tag)>(p); });
}

}  // namespace flashdsa::cpu
