// Internal: the one allocator of the CPU backend. Every buffer whose size depends on the problem
// goes through Buffer<T>, so tests can check the backend's peak memory (e.g. that nothing of size
// T x T_kv or T x H x K is ever allocated).
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

namespace flashdsa::cpu {

// Bytes held by live Buffers now, and the highest value since the last reset_peak_bytes().
size_t current_bytes();
size_t peak_bytes();
// Sets the peak to the current value.
void reset_peak_bytes();

namespace tracking {
void* tracked_alloc(size_t bytes);  // 64-byte aligned; throws std::bad_alloc
void tracked_free(void* ptr, size_t bytes);
}  // namespace tracking

// A fixed-size, 64-byte aligned, tracked array of trivially copyable T. Move-only.
template <class T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>, "Buffer holds plain data");

 public:
  Buffer() = default;
  // Uninitialized storage for n elements.
  explicit Buffer(size_t n) : size_(n) {
    if (n > 0) data_ = static_cast<T*>(tracking::tracked_alloc(n * sizeof(T)));
  }
  // n copies of `value`.
  Buffer(size_t n, T value) : Buffer(n) {
    for (size_t i = 0; i < n; ++i) data_[i] = value;
  }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer(std::move(other)).swap(*this);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_) tracking::tracked_free(data_, size_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void swap(Buffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

  T* data_ = nullptr;
  size_t size_ = 0;
};

// Per-worker scratch: `workers` slices of at least `per_worker` elements each, in one tracked
// allocation. Slices start on distinct cache lines so workers do not share lines.
template <class T>
class WorkerScratch {
  static constexpr size_t kLine = sizeof(T) >= 64 ? 1 : 64 / sizeof(T);

 public:
  WorkerScratch(int workers, size_t per_worker)
      : per_worker_((per_worker + kLine - 1) / kLine * kLine), buffer_(static_cast<size_t>(workers) * per_worker_) {}
  T* operator()(int worker) { return buffer_.data() + worker * per_worker_; }

 private:
  size_t per_worker_;
  Buffer<T> buffer_;
};

}  // namespace flashdsa::cpu
