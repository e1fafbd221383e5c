// Internal: deterministic key-major reductions (dkv, dk_idx).
//
// A backward pass that scatters into key rows splits the keys into contiguous ranges, one task per
// range; a task visits the query rows in increasing order and adds their contributions to its own
// keys only. Every key row is then summed in the same order (query row, then slot) whatever the
// number of threads, which makes the result bitwise reproducible without atomics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include "cpu/memory_tracker.h"
#include "cpu/op_inputs.h"

namespace flashdsa::cpu {

// Runs task(key_begin, key_end, worker) over contiguous ranges covering [0, T_kv), in parallel.
// pair_count[s] (size T_kv) is the number of (query, slot) pairs that touch key s: ranges are
// balanced by it so each task gets a similar amount of work.
void for_each_key_range(const Buffer<int64_t>& pair_count,
                        const std::function<void(int64_t key_begin, int64_t key_end, int worker)>& task);

// Number of slots (t, j) with use(t, j) pointing at each key, for the valid slots of idx.
template <class Use>
Buffer<int64_t> count_pairs(const TopkIndices& idx, Use&& use) {
  Buffer<int64_t> count(idx.T_kv, 0);
  for (int64_t t = 0; t < idx.T; ++t) {
    const int32_t* row = idx.row(t);
    for (int j = 0; j < idx.K; ++j) {
      if (idx.valid(row[j]) && use(t, j)) ++count[row[j]];
    }
  }
  return count;
}

// For the task of keys [key_begin, key_end): visits every row t in increasing order and calls
// batch(t, slots, n) with the slots j (increasing) of row t with use(t, j) whose key lies in the
// range. A row is split into several batches where a key repeats, so the keys of one batch are
// distinct (callers accumulate into their rows side by side).
template <class Use, class Batch>
void for_each_key_batch(const TopkIndices& idx, int64_t key_begin, int64_t key_end, Use&& use, Batch&& batch) {
  Buffer<int32_t> slots(idx.K);
  Buffer<int64_t> batch_of_key(key_end - key_begin, -1);  // last batch that holds each key
  int64_t batch_id = 0;
  for (int64_t t = 0; t < idx.T; ++t) {
    const int32_t* row = idx.row(t);
    int n = 0;
    for (int j = 0; j < idx.K; ++j) {
      const int64_t key = row[j];
      if (key < key_begin || key >= key_end || !use(t, j)) continue;
      if (batch_of_key[key - key_begin] == batch_id) {
        batch(t, slots.data(), n);
        n = 0;
        ++batch_id;
      }
      batch_of_key[key - key_begin] = batch_id;
      slots[n++] = j;
    }
    if (n > 0) {
      batch(t, slots.data(), n);
      ++batch_id;
    }
  }
}

// The task of keys [key_begin, key_end) of a key-major scatter into out [T_kv, cols]: zeroes those
// rows of out, then runs for_each_key_batch, calling load(t) once per visited row t (before its
// first batch: the row's query-side data) and batch(t, slots, n, out_rows) with out_rows[i] = the
// out row of the key of slots[i].
template <class Acc, class Use, class Load, class Batch>
void scatter_key_batches(const TopkIndices& idx, int64_t key_begin, int64_t key_end, Use&& use, Acc* out,
                         int64_t cols, Load&& load, Batch&& batch) {
  Buffer<Acc*> out_rows(idx.K);
  std::fill(out + key_begin * cols, out + key_end * cols, Acc(0));
  int64_t loaded_row = -1;
  for_each_key_batch(idx, key_begin, key_end, use, [&](int64_t t, const int32_t* slots, int n) {
    if (loaded_row != t) {
      load(t);
      loaded_row = t;
    }
    for (int i = 0; i < n; ++i) out_rows[i] = out + idx.row(t)[slots[i]] * cols;
    batch(t, slots, n, out_rows.data());
  });
}

}  // namespace flashdsa::cpu
