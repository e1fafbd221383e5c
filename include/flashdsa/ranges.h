// FlashDSA: host-side helpers that build key ranges (docs/spec.md §2, §7). All arrays are host memory.
#pragma once

#include <cstdint>

#include "flashdsa/status.h"

namespace flashdsa {

// Checks cu_seqlens [B+1]: cu_seqlens[0] == 0, non-decreasing, cu_seqlens[B] == T.
Status check_cu_seqlens(const int32_t* cu_seqlens, int B, int64_t T);

// THD causal ranges, no CP: token t of sequence b sees [cu_seqlens[b], t + 1).
// k_start, k_end: [T] out, T = cu_seqlens[B].
Status build_key_ranges(const int32_t* cu_seqlens, int B, int32_t* k_start, int32_t* k_end);

// Context parallelism, zigzag layout (§7). cu_seqlens_padded [B+1] describes the *global* packed
// batch where every sequence length is a multiple of 2*cp_size. Rank r holds, for each sequence in
// order, chunk r then chunk 2*cp_size-1-r (chunk = len / (2*cp_size) tokens).
// Number of local tokens of one rank: cu_seqlens_padded[B] / cp_size; -1 for invalid input
// (cp_size < 1, null cu_seqlens, or a sequence length that is not a multiple of 2*cp_size).
int64_t cp_local_tokens(const int32_t* cu_seqlens_padded, int B, int cp_size);
// global_rows [T_local] out: the global row of each local token, in local order.
Status build_cp_zigzag_rows(const int32_t* cu_seqlens_padded, int B, int cp_size, int cp_rank,
                            int32_t* global_rows);
// Causal ranges over the global (all-gathered, global-order) keys for the given local rows:
// local token i with global row g in sequence b sees [cu_seqlens_padded[b], g + 1).
Status build_key_ranges_for_rows(const int32_t* cu_seqlens_padded, int B, const int32_t* global_rows,
                                 int64_t T_local, int32_t* k_start, int32_t* k_end);

}  // namespace flashdsa
