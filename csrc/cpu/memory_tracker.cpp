// Byte accounting behind Buffer<T>.
#include "cpu/memory_tracker.h"

#include <atomic>
#include <new>

namespace flashdsa::cpu {
namespace {

constexpr std::align_val_t kAlignment{64};
std::atomic<size_t> g_current{0};
std::atomic<size_t> g_peak{0};

}  // namespace

size_t current_bytes() { return g_current.load(); }
size_t peak_bytes() { return g_peak.load(); }
void reset_peak_bytes() { g_peak.store(g_current.load()); }

namespace tracking {

void* tracked_alloc(size_t bytes) {
  void* ptr = ::operator new(bytes, kAlignment);
  const size_t now = g_current.fetch_add(bytes) + bytes;
  size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return ptr;
}

void tracked_free(void* ptr, size_t bytes) {
  ::operator delete(ptr, kAlignment);
  g_current.fetch_sub(bytes);
}

}  // namespace tracking
}  // namespace flashdsa::cpu
