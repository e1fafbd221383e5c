// The internal thread pool: every item runs exactly once, worker ids are in range, nested loops
// run serially, exceptions reach the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "common/parallel.h"
#include "flashdsa/threads.h"

namespace {

using flashdsa::detail::num_threads;
using flashdsa::detail::parallel_for;
using flashdsa::detail::set_num_threads;

class Parallel : public ::testing::Test {
 protected:
  Parallel() : saved_(num_threads()) {}
  ~Parallel() override { set_num_threads(saved_); }

 private:
  int saved_;
};

TEST_F(Parallel, EveryItemOnceWithValidWorkerIds) {
  for (const int threads : {1, 2, 4}) {
    set_num_threads(threads);
    ASSERT_EQ(num_threads(), threads);
    for (const int64_t grain : {1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(1001);
      std::atomic<bool> bad_worker{false};
      parallel_for(1001, grain, [&](int64_t begin, int64_t end, int worker) {
        if (worker < 0 || worker >= threads || end - begin > grain) bad_worker = true;
        for (int64_t i = begin; i < end; ++i) ++hits[i];
      });
      EXPECT_FALSE(bad_worker) << threads << " threads, grain " << grain;
      for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i;
    }
  }
}

TEST_F(Parallel, NestedLoopsRunOnTheCallingWorker) {
  set_num_threads(3);
  std::atomic<int> total{0}, mismatched{0};
  parallel_for(12, 1, [&](int64_t, int64_t, int outer) {
    parallel_for(5, 1, [&](int64_t begin, int64_t end, int inner) {
      if (inner != outer) ++mismatched;
      total += static_cast<int>(end - begin);
    });
  });
  EXPECT_EQ(total.load(), 60);
  EXPECT_EQ(mismatched.load(), 0);
}

TEST_F(Parallel, ExceptionsReachTheCaller) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1,
                            [](int64_t begin, int64_t, int) {
                              if (begin == 42) throw std::runtime_error("boom");
                            }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int> count{0};
  parallel_for(10, 1, [&](int64_t b, int64_t e, int) { count += static_cast<int>(e - b); });
  EXPECT_EQ(count.load(), 10);
}

// The public thread-count API (include/flashdsa/threads.h) drives the same pool.
TEST_F(Parallel, PublicThreadCount) {
  ASSERT_TRUE(flashdsa::set_cpu_num_threads(3).ok());
  EXPECT_EQ(flashdsa::cpu_num_threads(), 3);
  EXPECT_EQ(flashdsa::detail::num_threads(), 3);
  const flashdsa::Status bad = flashdsa::set_cpu_num_threads(0);
  EXPECT_EQ(bad.code(), flashdsa::StatusCode::kInvalidArgument) << bad.to_string();
  EXPECT_EQ(flashdsa::cpu_num_threads(), 3);
}

}  // namespace
