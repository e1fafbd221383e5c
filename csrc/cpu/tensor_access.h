// Internal: element types, conversions and row access shared by the CPU ops.
//
// Each op is a template on the activation type Act (bf16, float or double). Dot products and
// weighted sums run in Acc (float for bf16 / fp32 activations, double for fp64); statistic tensors
// (lse, weights, scores, mass, losses, dkv, dk_idx, dweights) have type Stat = Acc, matching
// stat_dtype() of ops.h. Row-level reductions of softmax statistics and losses use double.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/parallel.h"
#include "cpu/memory_tracker.h"
#include "flashdsa/status.h"
#include "flashdsa/types.h"

namespace flashdsa::cpu {

template <class Act>
struct ActTraits {
  using Acc = Act;  // float or double
};
template <>
struct ActTraits<bf16> {
  using Acc = float;
};

template <class Act>
using AccOf = typename ActTraits<Act>::Acc;

// Converts an activation to its accumulator type (exact).
inline float to_acc(bf16 v) { return bf16_to_float(v); }
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }

// Converts an accumulator value to the activation type (round to nearest even for bf16).
template <class Act, class Acc>
Act from_acc(Acc v) {
  if constexpr (std::is_same_v<Act, bf16>) {
    return float_to_bf16(static_cast<float>(v));
  } else {
    return static_cast<Act>(v);
  }
}

template <class T>
constexpr T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// Calls f(Act{}) with Act the C++ type of `dtype` and returns its Status.
template <class F>
Status dispatch_act(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBF16: return f(bf16{});
    case DType::kFP32: return f(float{});
    case DType::kFP64: return f(double{});
    case DType::kFP8E4M3: break;  // not an activation type (the fp8 indexer has its own code path)
  }
  return Status::Internal("unknown dtype");
}

// Copies `rows` rows of `cols` elements (row stride `stride`) into contiguous Acc storage.
template <class Act, class Acc>
void load_rows(const Act* src, int64_t stride, int rows, int cols, Acc* dst) {
  for (int r = 0; r < rows; ++r) {
    const Act* s = src + r * stride;
    Acc* d = dst + static_cast<int64_t>(r) * cols;
    for (int c = 0; c < cols; ++c) d[c] = to_acc(s[c]);
  }
}

// Writes n accumulator values as activations.
template <class Act, class Acc>
void store_row(const Acc* src, int64_t n, Act* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_acc<Act>(src[i]);
}

// Converts a [rows, cols] activation matrix (row stride `stride`) to a contiguous Acc buffer,
// in parallel over rows.
template <class Act, class Acc = AccOf<Act>>
Buffer<Acc> load_matrix(const void* src, int64_t rows, int cols, int64_t stride) {
  Buffer<Acc> out(static_cast<size_t>(rows) * cols);
  const Act* s = static_cast<const Act*>(src);
  Acc* d = out.data();
  detail::parallel_for(rows, 256, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) load_rows(s + r * stride, stride, 1, cols, d + r * cols);
  });
  return out;
}

// Pointers to the n rows of a contiguous [n, len] matrix.
template <class T>
void row_pointers(T* base, int n, int64_t len, T** rows) {
  for (int i = 0; i < n; ++i) rows[i] = base + i * len;
}

}  // namespace flashdsa::cpu
