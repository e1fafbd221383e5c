// Internal: host-side helper of the KL kernels: the (H_I, D_I) dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "flashdsa/status.h"

namespace flashdsa::sm90::kl_loss_impl {

// Calls fn(std::integral_constant<int, H_I>, std::integral_constant<int, D_I>) for the supported
// indexer shapes (H_I in {32, 64}, D_I in {64, 128}); other shapes are kNotSupported.
template <class Fn>
Status dispatch_indexer_shape(int H_I, int D_I, const char* op, Fn&& fn) {
  using I32 = std::integral_constant<int, 32>;
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  if (H_I == 32 && D_I == 64) return fn(I32{}, I64{});
  if (H_I == 32 && D_I == 128) return fn(I32{}, I128{});
  if (H_I == 64 && D_I == 64) return fn(I64{}, I64{});
  if (H_I == 64 && D_I == 128) return fn(I64{}, I128{});
  return Status::NotSupported(std::string("sm90 ") + op + ": H_I must be 32 or 64 and D_I 64 or 128");
}

}  // namespace flashdsa::sm90::kl_loss_impl
