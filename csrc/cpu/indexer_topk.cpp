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

  const int workers = detail::num_threads();
  WorkerScratch<Acc> q_scratch(workers, H * D);                 // [H_I, D_I]
  WorkerScratch<Acc> qk_scratch(workers, H * kKeyTile);         // [H_I, tile]
  WorkerScratch<const Acc*> rows_scratch(workers, kKeyTile);    // key rows of a tile
  WorkerScratch<Acc> score_scratch(workers, p.T_kv);            // [visible keys]
  WorkerScratch<Candidate<Acc>> cand_scratch(workers, p.T_kv);  // [visible keys]

  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    Acc* q = q_scratch(worker);
    Acc* qk = qk_scratch(worker);
    const Acc** rows = rows_scratch(worker);
    Acc* score = score_scratch(worker);
    Candidate<Acc>* cand = cand_scratch(worker);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = p.k_start[t];
      const int n = static_cast<int>(p.k_end[t] - ks);
      in.load_q(t, q);
      for (int i0 = 0; i0 < n; i0 += kKeyTile) {
        const int c = std::min(kKeyTile, n - i0);
        for (int i = 0; i < c; ++i) rows[i] = in.key_row(ks + i0 + i);
        in.scores(q, in.w(t), rows, c, qk, kKeyTile, score + i0);
      }

      for (int i = 0; i < n; ++i) cand[i] = {score[i], static_cast<int32_t>(ks + i)};
      write_row_top_k(cand, n, K, p.indices + t * K, scores_out ? scores_out + t * K : nullptr);
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
