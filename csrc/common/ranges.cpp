// Key-range builders for packed (THD) batches and zigzag context parallelism (docs/spec.md §2, §7).
#include "flashdsa/ranges.h"

#include <algorithm>
#include <string>

#include "common/status_macros.h"

namespace flashdsa {
namespace {

Status invalid(const char* fn, const std::string& what) { return Status::InvalidArgument(std::string(fn) + ": " + what); }

Status check_cu_seqlens_in(const char* fn, const int32_t* cu_seqlens, int B) {
  if (B < 0) return invalid(fn, "B = " + std::to_string(B) + ": must be >= 0");
  if (cu_seqlens == nullptr) return invalid(fn, "cu_seqlens must not be null");
  if (cu_seqlens[0] != 0) return invalid(fn, "cu_seqlens[0] = " + std::to_string(cu_seqlens[0]) + ": must be 0");
  for (int b = 0; b < B; ++b) {
    if (cu_seqlens[b + 1] < cu_seqlens[b]) {
      return invalid(fn, "cu_seqlens[" + std::to_string(b + 1) + "] = " + std::to_string(cu_seqlens[b + 1]) +
                             " < cu_seqlens[" + std::to_string(b) + "] = " + std::to_string(cu_seqlens[b]) +
                             ": must be non-decreasing");
    }
  }
  return Status::OK();
}

// Zigzag CP: every sequence length must split into 2 * cp_size equal chunks.
Status check_cp_layout(const char* fn, const int32_t* cu_seqlens_padded, int B, int cp_size) {
  if (cp_size < 1) return invalid(fn, "cp_size = " + std::to_string(cp_size) + ": must be >= 1");
  FLASHDSA_RETURN_IF_ERROR(check_cu_seqlens_in(fn, cu_seqlens_padded, B));
  for (int b = 0; b < B; ++b) {
    const int32_t len = cu_seqlens_padded[b + 1] - cu_seqlens_padded[b];
    if (len % (2 * cp_size) != 0) {
      return invalid(fn, "cu_seqlens_padded: sequence " + std::to_string(b) + " has length " + std::to_string(len) +
                             ", not a multiple of 2 * cp_size = " + std::to_string(2 * cp_size));
    }
  }
  return Status::OK();
}

}  // namespace

Status check_cu_seqlens(const int32_t* cu_seqlens, int B, int64_t T) {
  FLASHDSA_RETURN_IF_ERROR(check_cu_seqlens_in("check_cu_seqlens", cu_seqlens, B));
  if (cu_seqlens[B] != T) {
    return invalid("check_cu_seqlens", "cu_seqlens[" + std::to_string(B) + "] = " + std::to_string(cu_seqlens[B]) +
                                           ": must equal T = " + std::to_string(T));
  }
  return Status::OK();
}

Status build_key_ranges(const int32_t* cu_seqlens, int B, int32_t* k_start, int32_t* k_end) {
  const char* fn = "build_key_ranges";
  FLASHDSA_RETURN_IF_ERROR(check_cu_seqlens_in(fn, cu_seqlens, B));
  if (cu_seqlens[B] > 0 && (k_start == nullptr || k_end == nullptr)) {
    return invalid(fn, "k_start and k_end must not be null");
  }
  for (int b = 0; b < B; ++b) {
    for (int32_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) {
      k_start[t] = cu_seqlens[b];
      k_end[t] = t + 1;
    }
  }
  return Status::OK();
}

int64_t cp_local_tokens(const int32_t* cu_seqlens_padded, int B, int cp_size) {
  if (!check_cp_layout("cp_local_tokens", cu_seqlens_padded, B, cp_size).ok()) return -1;
  return cu_seqlens_padded[B] / cp_size;
}

Status build_cp_zigzag_rows(const int32_t* cu_seqlens_padded, int B, int cp_size, int cp_rank,
                            int32_t* global_rows) {
  const char* fn = "build_cp_zigzag_rows";
  FLASHDSA_RETURN_IF_ERROR(check_cp_layout(fn, cu_seqlens_padded, B, cp_size));
  if (cp_rank < 0 || cp_rank >= cp_size) {
    return invalid(fn, "cp_rank = " + std::to_string(cp_rank) + ": must be in [0, cp_size = " +
                           std::to_string(cp_size) + ")");
  }
  if (cu_seqlens_padded[B] > 0 && global_rows == nullptr) return invalid(fn, "global_rows must not be null");
  int64_t out = 0;
  for (int b = 0; b < B; ++b) {
    const int32_t chunk = (cu_seqlens_padded[b + 1] - cu_seqlens_padded[b]) / (2 * cp_size);
    for (const int c : {cp_rank, 2 * cp_size - 1 - cp_rank}) {
      const int32_t first = cu_seqlens_padded[b] + c * chunk;
      for (int32_t i = 0; i < chunk; ++i) global_rows[out++] = first + i;
    }
  }
  return Status::OK();
}

Status build_key_ranges_for_rows(const int32_t* cu_seqlens_padded, int B, const int32_t* global_rows,
                                 int64_t T_local, int32_t* k_start, int32_t* k_end) {
  const char* fn = "build_key_ranges_for_rows";
  FLASHDSA_RETURN_IF_ERROR(check_cu_seqlens_in(fn, cu_seqlens_padded, B));
  if (T_local < 0) return invalid(fn, "T_local = " + std::to_string(T_local) + ": must be >= 0");
  if (T_local > 0 && (global_rows == nullptr || k_start == nullptr || k_end == nullptr)) {
    return invalid(fn, "global_rows, k_start and k_end must not be null");
  }
  const int32_t* seq_begin = cu_seqlens_padded;
  const int32_t* seq_end = cu_seqlens_padded + B + 1;
  for (int64_t i = 0; i < T_local; ++i) {
    const int32_t g = global_rows[i];
    if (g < 0 || g >= cu_seqlens_padded[B]) {
      return invalid(fn, "global_rows[" + std::to_string(i) + "] = " + std::to_string(g) + ": must be in [0, " +
                             std::to_string(cu_seqlens_padded[B]) + ")");
    }
    // The sequence holding g: the last b with cu_seqlens_padded[b] <= g (empty sequences skipped).
    const int32_t* next = std::upper_bound(seq_begin, seq_end, g);
    k_start[i] = *(next - 1);
    k_end[i] = g + 1;
  }
  return Status::OK();
}

}  // namespace flashdsa
