// Thread-count independence (bitwise) of the CPU backward passes, and the backend's peak memory.
#include <gtest/gtest.h>

#include <cstring>

#include "common/parallel.h"
#include "cpu/memory_tracker.h"
#include "problem.h"

namespace fdt {
namespace {

// Restores the pool size when a test ends.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(flashdsa::detail::num_threads()) {}
  ~ThreadCountGuard() { flashdsa::detail::set_num_threads(saved_); }

 private:
  int saved_;
};

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

Shape determinism_shape() {
  Shape s;
  s.lengths = {150, 97, 260};
  s.H = 5;
  s.D_qk = 56;
  s.D_v = 40;
  s.H_I = 3;
  s.D_I = 40;
  s.K = 48;
  s.seed = 9;
  return s;
}

// All backward outputs of one run.
struct BackwardOutputs {
  std::vector<bf16> dq, dq_idx_sparse, dq_idx_dense;
  std::vector<float> dkv, dk_idx_sparse, dk_idx_dense, dw_sparse, dw_dense;
};

BackwardOutputs run_all_backward(const Problem<bf16>& pb) {
  const Shape& s = pb.shape;
  BackwardOutputs o;
  const auto fwd = run_forward(pb);
  o.dq.resize(pb.T * s.H * s.D_qk);
  o.dkv.resize(pb.T_kv * s.D_qk);
  EXPECT_TRUE(flashdsa::run_sparse_mla_bwd(pb.sparse_bwd(fwd.out.data(), fwd.lse.data(), o.dq.data(), o.dkv.data())).ok());

  std::vector<float> mass(pb.T * s.K);
  EXPECT_TRUE(flashdsa::run_attention_mass(pb.attention_mass(fwd.lse.data(), mass.data())).ok());
  auto sparse = pb.sparse_kl(mass.data());
  o.dq_idx_sparse.resize(pb.T * s.H_I * s.D_I);
  o.dk_idx_sparse.resize(pb.T_kv * s.D_I);
  o.dw_sparse.resize(pb.T * s.H_I);
  sparse.dq_idx = o.dq_idx_sparse.data();
  sparse.dk_idx = o.dk_idx_sparse.data();
  sparse.dweights = o.dw_sparse.data();
  EXPECT_TRUE(flashdsa::run_sparse_kl_bwd(sparse).ok());

  auto dense = pb.dense_kl();
  o.dq_idx_dense.resize(pb.T * s.H_I * s.D_I);
  o.dk_idx_dense.resize(pb.T_kv * s.D_I);
  o.dw_dense.resize(pb.T * s.H_I);
  dense.dq_idx = o.dq_idx_dense.data();
  dense.dk_idx = o.dk_idx_dense.data();
  dense.dweights = o.dw_dense.data();
  EXPECT_TRUE(flashdsa::run_dense_kl_bwd(dense).ok());
  return o;
}

TEST(Determinism, BackwardIsBitwiseIdenticalForAnyThreadCount) {
  ThreadCountGuard guard;
  const Problem<bf16> pb(determinism_shape());
  flashdsa::detail::set_num_threads(1);
  const BackwardOutputs one = run_all_backward(pb);
  for (const int threads : {2, 3, 5}) {
    flashdsa::detail::set_num_threads(threads);
    const BackwardOutputs many = run_all_backward(pb);
    EXPECT_TRUE(bitwise_equal(one.dkv, many.dkv)) << threads << " threads: dkv";
    EXPECT_TRUE(bitwise_equal(one.dq, many.dq)) << threads << " threads: dq";
    EXPECT_TRUE(bitwise_equal(one.dk_idx_sparse, many.dk_idx_sparse)) << threads << " threads: sparse dk_idx";
    EXPECT_TRUE(bitwise_equal(one.dq_idx_sparse, many.dq_idx_sparse)) << threads << " threads: sparse dq_idx";
    EXPECT_TRUE(bitwise_equal(one.dw_sparse, many.dw_sparse)) << threads << " threads: sparse dweights";
    EXPECT_TRUE(bitwise_equal(one.dk_idx_dense, many.dk_idx_dense)) << threads << " threads: dense dk_idx";
    EXPECT_TRUE(bitwise_equal(one.dq_idx_dense, many.dq_idx_dense)) << threads << " threads: dense dq_idx";
    EXPECT_TRUE(bitwise_equal(one.dw_dense, many.dw_dense)) << threads << " threads: dense dweights";
  }
}

// Runs op and returns the backend's peak allocation during it, in bytes.
template <class F>
size_t peak_of(F&& op) {
  EXPECT_EQ(flashdsa::cpu::current_bytes(), 0u) << "a previous op leaked tracked memory";
  flashdsa::cpu::reset_peak_bytes();
  const flashdsa::Status st = op();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(flashdsa::cpu::current_bytes(), 0u);
  return flashdsa::cpu::peak_bytes();
}

// Nothing of size T x T_kv or T x H x K: the peak stays within a few bytes per element of the
// O(T K + T H + T_kv D) tensors, and far below one T x T fp32 matrix.
void expect_bounded(size_t peak, int64_t T, int K, int H, int D, const char* op) {
  const double linear = static_cast<double>(T) * K + static_cast<double>(T) * H + static_cast<double>(T) * D;
  const double square = 4.0 * T * T;
  EXPECT_LE(peak, 16 * linear) << op << ": peak " << peak << " bytes";
  EXPECT_LE(peak, square / 10) << op << ": peak " << peak << " bytes";
  EXPECT_GT(peak, 0u) << op;
}

// One sequence of `length` tokens, contiguous tensors, the given widths.
Shape memory_shape(int32_t length, int H, int D_qk, int D_v, int H_I, int D_I) {
  Shape s;
  s.lengths = {length};
  s.H = H;
  s.D_qk = D_qk;
  s.D_v = D_v;
  s.H_I = H_I;
  s.D_I = D_I;
  s.pad = 0;
  return s;
}

TEST(Memory, SparseOpsAndIndexerPeakIsLinear) {
  Shape s = memory_shape(8192, 4, 64, 32, 4, 32);
  s.K = 64;
  const Problem<bf16> pb(s);
  const int64_t T = pb.T;
  const int D = s.D_qk, H = s.H;

  std::vector<int32_t> indices(T * s.K);
  std::vector<float> scores(T * s.K);
  expect_bounded(peak_of([&] { return flashdsa::run_indexer_topk(pb.indexer_topk(indices.data(), scores.data())); }),
                 T, s.K, H, D, "indexer_topk");

  std::vector<bf16> out(T * H * s.D_v), dq(T * H * D);
  std::vector<float> lse(T * H), dkv(T * D), mass(T * s.K);
  expect_bounded(peak_of([&] { return flashdsa::run_sparse_mla_fwd(pb.sparse_fwd(out.data(), lse.data())); }), T,
                 s.K, H, D, "sparse_mla_fwd");
  expect_bounded(peak_of([&] {
                   return flashdsa::run_sparse_mla_bwd(pb.sparse_bwd(out.data(), lse.data(), dq.data(), dkv.data()));
                 }),
                 T, s.K, H, D, "sparse_mla_bwd");
  expect_bounded(peak_of([&] { return flashdsa::run_attention_mass(pb.attention_mass(lse.data(), mass.data())); }), T,
                 s.K, H, D, "attention_mass");

  std::vector<float> loss_rows(T), dk_idx(T * s.D_I), dw(T * s.H_I);
  std::vector<bf16> dq_idx(T * s.H_I * s.D_I);
  auto kl = pb.sparse_kl(mass.data());
  kl.loss_rows = loss_rows.data();
  kl.dq_idx = dq_idx.data();
  kl.dk_idx = dk_idx.data();
  kl.dweights = dw.data();
  expect_bounded(peak_of([&] { return flashdsa::run_sparse_kl_fwd(kl); }), T, s.K, H, D, "sparse_kl_fwd");
  expect_bounded(peak_of([&] { return flashdsa::run_sparse_kl_bwd(kl); }), T, s.K, H, D, "sparse_kl_bwd");
}

TEST(Memory, DenseKlPeakIsLinear) {
  const Shape s = memory_shape(2048, 2, 16, 8, 2, 8);
  const Problem<float> pb(s);
  const int64_t T = pb.T;
  std::vector<float> loss_rows(T), dq_idx(T * s.H_I * s.D_I), dk_idx(T * s.D_I), dw(T * s.H_I);
  auto p = pb.dense_kl();
  p.loss_rows = loss_rows.data();
  p.dq_idx = dq_idx.data();
  p.dk_idx = dk_idx.data();
  p.dweights = dw.data();
  expect_bounded(peak_of([&] { return flashdsa::run_dense_kl_fwd(p); }), T, 0, s.H, s.D_qk, "dense_kl_fwd");
  expect_bounded(peak_of([&] { return flashdsa::run_dense_kl_bwd(p); }), T, 0, s.H, s.D_qk, "dense_kl_bwd");
}

}  // namespace
}  // namespace fdt
