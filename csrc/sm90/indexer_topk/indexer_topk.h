// Internal: host entry points of the fused Hopper indexer + top-k (docs/spec.md §3), with the candidate
// capacity exposed so tests can force frequent compactions. Design: docs/kernels/indexer_topk.md.
#pragma once

#include <cstddef>

#include "flashdsa/ops.h"

namespace flashdsa::sm90::indexer_topk_impl {

// Candidate list length per query row: the kernel keeps up to this many (score, key) candidates per
// row and compacts the list to the top K whenever fewer than one key tile of room is left.
// Valid capacities are multiples of 64 that are >= K + 64.
int default_candidate_capacity(int K);

// Workspace bytes for `p` with the given candidate capacity: a scheduler counter plus one candidate
// list per query row in flight (a fixed number of CTA slots, not proportional to T). 0 when p.T == 0
// or when the device cannot be queried.
size_t workspace_size(const IndexerTopkParams& p, int candidate_capacity);

// Runs the kernel on p.stream. p must have passed validate(); additionally needs dtype bf16, H_I in
// {32, 64}, D_I in {64, 128}, 16-byte aligned q_idx / k_idx rows (strides multiples of 8 elements)
// and p.workspace of at least workspace_size(p, candidate_capacity) bytes.
Status run(const IndexerTopkParams& p, int candidate_capacity);

}  // namespace flashdsa::sm90::indexer_topk_impl
