// Thread pool behind detail::parallel_for: n-1 persistent workers plus the calling thread.
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flashdsa/threads.h"

namespace flashdsa::detail {
namespace {

// Worker id of the current thread while it runs a chunk; -1 outside parallel regions.
thread_local int t_worker = -1;

class ThreadPool {
 public:
  explicit ThreadPool(int size) : size_(size) {
    for (int id = 1; id < size_; ++id) threads_.emplace_back([this, id] { worker_loop(id); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return size_; }

  void run(int64_t n, int64_t grain, const ParallelBody& body) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      body_ = &body;
      n_ = n;
      grain_ = grain;
      num_chunks_ = (n + grain - 1) / grain;
      next_chunk_.store(0);
      error_ = nullptr;
      busy_ = size_ - 1;
      ++generation_;
    }
    wake_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void worker_loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work(id);
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  // Takes chunks until none is left.
  void work(int id) {
    t_worker = id;
    for (int64_t c; (c = next_chunk_.fetch_add(1)) < num_chunks_;) {
      const int64_t begin = c * grain_;
      try {
        (*body_)(begin, std::min(n_, begin + grain_), id);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        next_chunk_.store(num_chunks_);
      }
    }
    t_worker = -1;
  }

  const int size_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int busy_ = 0;
  const ParallelBody* body_ = nullptr;
  int64_t n_ = 0, grain_ = 1, num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::exception_ptr error_;
};

int default_num_threads() {
  if (const char* env = std::getenv("FLASHDSA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// Guards the pool pointer and serializes parallel loops of different caller threads.
std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;
// The pool size, readable without the mutex (bodies may ask for it); 0 until the pool exists.
std::atomic<int> g_pool_size{0};

ThreadPool& pool_locked() {
  if (!g_pool) {
    g_pool = std::make_unique<ThreadPool>(default_num_threads());
    g_pool_size.store(g_pool->size());
  }
  return *g_pool;
}

void run_serially(int64_t n, int64_t grain, int worker, const ParallelBody& body) {
  const int saved = t_worker;
  t_worker = worker;
  for (int64_t begin = 0; begin < n; begin += grain) body(begin, std::min(n, begin + grain), worker);
  t_worker = saved;
}

}  // namespace

int num_threads() {
  if (const int size = g_pool_size.load()) return size;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  return pool_locked().size();
}

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  n = std::max(1, n);
  if (g_pool && g_pool->size() == n) return;
  g_pool.reset();
  g_pool = std::make_unique<ThreadPool>(n);
  g_pool_size.store(n);
}

void parallel_for(int64_t n, int64_t grain, const ParallelBody& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (t_worker >= 0) return run_serially(n, grain, t_worker, body);
  std::unique_lock<std::mutex> lock(g_pool_mutex, std::try_to_lock);
  // Another thread's loop holds the pool: its workers are busy, so run here as worker 0 of a
  // one-thread loop (callers size their scratch by num_threads(), which is at least 1).
  if (!lock.owns_lock()) return run_serially(n, grain, 0, body);
  ThreadPool& pool = pool_locked();
  if (pool.size() == 1 || n <= grain) return run_serially(n, grain, 0, body);
  pool.run(n, grain, body);
}

}  // namespace flashdsa::detail

namespace flashdsa {

int cpu_num_threads() { return detail::num_threads(); }

Status set_cpu_num_threads(int n) {
  if (n < 1) return Status::InvalidArgument("set_cpu_num_threads: n = " + std::to_string(n) + ": must be >= 1");
  detail::set_num_threads(n);
  return Status::OK();
}

}  // namespace flashdsa
