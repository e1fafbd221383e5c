// FlashDSA: the CPU backend's thread count.
#pragma once

#include "flashdsa/status.h"

namespace flashdsa {

// Threads the CPU backend uses for one op, counting the calling thread. Until set_cpu_num_threads()
// is called: the environment variable FLASHDSA_NUM_THREADS when it holds a positive integer, else
// the number of hardware threads. Results never depend on it (docs/architecture.md).
int cpu_num_threads();

// Sets the CPU backend's thread count to n >= 1 (kInvalidArgument otherwise). Waits for an op in
// progress on another thread to finish its parallel loop; call it between ops, not concurrently with them.
Status set_cpu_num_threads(int n);

}  // namespace flashdsa
