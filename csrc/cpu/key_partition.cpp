// Balanced split of the key rows for the key-major backward passes.
#include "cpu/key_partition.h"

#include <algorithm>

#include "common/parallel.h"

namespace flashdsa::cpu {

void for_each_key_range(const Buffer<int64_t>& pair_count,
                        const std::function<void(int64_t, int64_t, int)>& task) {
  const int64_t T_kv = static_cast<int64_t>(pair_count.size());
  if (T_kv == 0) return;
  // Each key also costs a little on its own (zeroing its output row): weight = pairs + 1.
  int64_t total = T_kv;
  for (int64_t s = 0; s < T_kv; ++s) total += pair_count[s];
  const int64_t parts = std::min<int64_t>(detail::num_threads(), T_kv);
  Buffer<int64_t> bounds(parts + 1);
  bounds[0] = 0;
  int64_t part = 1, acc = 0;
  for (int64_t s = 0; s < T_kv && part < parts; ++s) {
    acc += pair_count[s] + 1;
    if (acc * parts >= total * part) bounds[part++] = s + 1;
  }
  for (; part <= parts; ++part) bounds[part] = T_kv;
  detail::parallel_for(parts, 1, [&](int64_t begin, int64_t end, int worker) {
    for (int64_t i = begin; i < end; ++i) {
      if (bounds[i] < bounds[i + 1]) task(bounds[i], bounds[i + 1], worker);
    }
  });
}

}  // namespace flashdsa::cpu
