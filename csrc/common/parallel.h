// Internal: a small persistent thread pool and parallel_for for the CPU backend.
//
// Results of the CPU backend never depend on how work is split between threads: every chunk of a
// parallel_for writes its own outputs, and reductions across chunks happen in a fixed order.
#pragma once

#include <cstdint>
#include <functional>

namespace flashdsa::detail {

// Number of threads parallel_for uses, counting the calling thread. Defaults to the environment
// variable FLASHDSA_NUM_THREADS when it holds a positive integer, else hardware_concurrency().
int num_threads();

// Resizes the pool to n >= 1 threads (tests and benchmarks use it to compare thread counts).
// Waits for a parallel_for in progress to finish first; must not race with running ops, which size
// their per-worker scratch by num_threads().
void set_num_threads(int n);

// Body of a parallel loop: processes items [begin, end); `worker` in [0, num_threads()) identifies
// the thread running it, so callers can index per-worker scratch with it.
using ParallelBody = std::function<void(int64_t begin, int64_t end, int worker)>;

// Runs body over [0, n) in chunks of at most `grain` items handed out dynamically to the pool's
// threads, and returns when all chunks are done. Rethrows the first exception a chunk threw.
// Called from inside a body (nested), or while another thread's loop is running, it runs serially
// on the calling thread.
void parallel_for(int64_t n, int64_t grain, const ParallelBody& body);

}  // namespace flashdsa::detail
