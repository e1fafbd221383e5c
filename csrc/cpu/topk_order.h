// Internal: the selection order shared by the CPU top-k passes (exact bf16 and FP8 selection,
// docs/spec.md §3).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/memory_tracker.h"
#include "cpu/tensor_access.h"

namespace flashdsa::cpu {

// Keys per scoring tile of a row (the row-local score buffer is filled tile by tile).
constexpr int kTopkKeyTile = 256;

// One scored key of a row.
template <class Acc>
struct TopkCandidate {
  Acc score;
  int32_t key;
};

// Per-worker scratch of the exact scoring of a top-k row (IndexerInputs::score_keys): q_idx
// [H_I, D_I], qk [H_I, kTopkKeyTile], key-row pointers [kTopkKeyTile], and the scores and candidates
// of up to `keys` keys.
template <class Acc>
struct TopkRowScratch {
  struct Row {
    Acc* q;
    Acc* qk;
    const Acc** rows;
    Acc* score;
    TopkCandidate<Acc>* cand;
  };

  TopkRowScratch(int workers, int H_I, int D_I, int64_t keys)
      : q_(workers, static_cast<size_t>(H_I) * D_I), qk_(workers, static_cast<size_t>(H_I) * kTopkKeyTile),
        rows_(workers, kTopkKeyTile), score_(workers, keys), cand_(workers, keys) {}
  Row operator()(int worker) { return {q_(worker), qk_(worker), rows_(worker), score_(worker), cand_(worker)}; }

 private:
  WorkerScratch<Acc> q_, qk_;
  WorkerScratch<const Acc*> rows_;
  WorkerScratch<Acc> score_;
  WorkerScratch<TopkCandidate<Acc>> cand_;
};

// Strict total order "a is selected before b". A NaN score ranks above every number (as in
// torch.topk), so a key with a NaN score is selected and reports its NaN score: the NaN reaches
// the loss instead of being dropped (docs/reliability.md). Ties go to the smaller key, so the
// selected set is unique.
template <class Acc>
bool ranks_before(const TopkCandidate<Acc>& a, const TopkCandidate<Acc>& b) {
  const bool a_nan = std::isnan(a.score), b_nan = std::isnan(b.score);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a.score != b.score) return a.score > b.score;
  return a.key < b.key;
}

// Writes a row's result from its n scored candidates: the K best (by ranks_before) in increasing key
// order, then -1 / -inf for the slots beyond n. Reorders `cand`. `scores_out` may be null.
template <class Acc>
void write_row_top_k(TopkCandidate<Acc>* cand, int64_t n, int K, int32_t* indices_out, Acc* scores_out) {
  const int64_t kept = std::min<int64_t>(n, K);
  if (n > K) std::nth_element(cand, cand + K, cand + n, ranks_before<Acc>);
  std::sort(cand, cand + kept, [](const TopkCandidate<Acc>& a, const TopkCandidate<Acc>& b) { return a.key < b.key; });
  for (int j = 0; j < K; ++j) {
    indices_out[j] = j < kept ? cand[j].key : -1;
    if (scores_out) scores_out[j] = j < kept ? cand[j].score : neg_inf<Acc>();
  }
}

}  // namespace flashdsa::cpu
