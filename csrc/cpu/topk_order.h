// Internal: the selection order shared by the CPU top-k passes (exact bf16 and FP8 selection,
// docs/spec.md §3).
#pragma once

#include <cmath>
#include <cstdint>

namespace flashdsa::cpu {

// Keys per scoring tile of a row (the row-local score buffer is filled tile by tile).
constexpr int kTopkKeyTile = 256;

// One scored key of a row.
template <class Acc>
struct TopkCandidate {
  Acc score;
  int32_t key;
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

}  // namespace flashdsa::cpu
