// Host validation: every kind of bad input is rejected with kInvalidArgument and a message naming
// the field; valid input passes; dispatch reports unsupported backends.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/backend.h"
#include "problem.h"

namespace fdt {
namespace {

using flashdsa::Device;
using flashdsa::DType;
using flashdsa::Status;
using flashdsa::StatusCode;

// Applies `mutate` to a copy of p, validates it, and expects a rejection naming `field`.
template <class P>
void expect_rejected(const P& p, const std::function<Status(const P&)>& validate, const std::string& field,
                     const std::function<void(P&)>& mutate) {
  P bad = p;
  mutate(bad);
  const Status st = validate(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << field << ": " << st.to_string();
  EXPECT_NE(st.message().find(field), std::string::npos) << "message should name " << field << ": " << st.message();
}

class Validate : public ::testing::Test {
 protected:
  Validate() : pb(Shape{}) {}
  Problem<float> pb;
  std::vector<int32_t> indices_out = std::vector<int32_t>(pb.T * pb.shape.K);
  std::vector<float> stat_out = std::vector<float>(pb.T * 64 * 64);
  std::vector<float> act_out = std::vector<float>(pb.T * 64 * 128);

  // The outputs of either KL formulation (SparseKlParams / DenseKlParams), in the fixture's buffers.
  template <class P>
  P with_kl_outputs(P p) {
    p.loss_rows = stat_out.data();
    p.dq_idx = act_out.data();
    p.dk_idx = stat_out.data();
    p.dweights = stat_out.data();
    return p;
  }
};

template <class P>
std::function<Status(const P&)> validator() {
  return [](const P& p) { return flashdsa::validate(p); };
}

// The forward and backward validators of an op with both (the KL losses).
template <class P>
std::function<Status(const P&)> fwd_validator() {
  return [](const P& p) { return flashdsa::validate_fwd(p); };
}
template <class P>
std::function<Status(const P&)> bwd_validator() {
  return [](const P& p) { return flashdsa::validate_bwd(p); };
}

TEST_F(Validate, IndexerTopk) {
  const auto p = pb.indexer_topk(indices_out.data(), stat_out.data());
  const auto v = validator<flashdsa::IndexerTopkParams>();
  using P = flashdsa::IndexerTopkParams;
  ASSERT_TRUE(v(p).ok()) << v(p).to_string();
  expect_rejected<P>(p, v, "q_idx", [](P& x) { x.indexer.q_idx = nullptr; });
  expect_rejected<P>(p, v, "k_idx", [](P& x) { x.indexer.k_idx = nullptr; });
  expect_rejected<P>(p, v, "weights", [](P& x) { x.indexer.weights = nullptr; });
  expect_rejected<P>(p, v, "indices", [](P& x) { x.indices = nullptr; });
  expect_rejected<P>(p, v, "k_start", [](P& x) { x.k_start = nullptr; });
  expect_rejected<P>(p, v, "T", [](P& x) { x.T = -1; });
  expect_rejected<P>(p, v, "T_kv", [](P& x) { x.T_kv = -3; });
  expect_rejected<P>(p, v, "H_I", [](P& x) { x.indexer.H_I = 0; });
  expect_rejected<P>(p, v, "H_I", [](P& x) { x.indexer.H_I = 129; });
  expect_rejected<P>(p, v, "D_I", [](P& x) { x.indexer.D_I = 20; });
  expect_rejected<P>(p, v, "D_I", [](P& x) { x.indexer.D_I = 264; });
  expect_rejected<P>(p, v, "K", [](P& x) { x.K = 0; });
  expect_rejected<P>(p, v, "K", [](P& x) { x.K = 8193; });
  expect_rejected<P>(p, v, "q_idx_stride_h", [](P& x) { x.indexer.q_idx_stride_h = x.indexer.D_I - 1; });
  expect_rejected<P>(p, v, "q_idx_stride_t", [](P& x) { x.indexer.q_idx_stride_t = x.indexer.D_I; });
  expect_rejected<P>(p, v, "k_idx_stride_t", [](P& x) { x.indexer.k_idx_stride_t = -1; });
  expect_rejected<P>(p, v, "weights_stride_t", [](P& x) { x.indexer.weights_stride_t = 2; });
  expect_rejected<P>(p, v, "dtype", [](P& x) { x.indexer.dtype = static_cast<DType>(7); });
  // Dequantization scales (a future fp8 indexer) are not implemented on the CPU: kNotSupported.
  static const float indexer_scale[1] = {1.f};
  P scaled = p;
  scaled.indexer.k_idx_scale = indexer_scale;
  EXPECT_EQ(v(scaled).code(), StatusCode::kNotSupported) << v(scaled).to_string();
  EXPECT_NE(v(scaled).to_string().find("k_idx_scale"), std::string::npos) << v(scaled).to_string();
}

TEST_F(Validate, KeyRanges) {
  auto p = pb.indexer_topk(indices_out.data(), nullptr);
  std::vector<int32_t> ks = pb.batch.k_start, ke = pb.batch.k_end;
  p.k_start = ks.data();
  p.k_end = ke.data();
  const auto v = validator<flashdsa::IndexerTopkParams>();
  ASSERT_TRUE(v(p).ok());
  ks[9] = -1;
  Status st = v(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k_start[9] = -1"), std::string::npos) << st.message();
  ks[9] = pb.batch.k_start[9];
  ks[12] = ke[12] + 1;  // inverted
  st = v(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 12"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("k_end[12]"), std::string::npos) << st.message();
  ks[12] = pb.batch.k_start[12];
  ke[20] = static_cast<int32_t>(pb.T_kv + 1);  // past the keys
  st = v(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k_end[20]"), std::string::npos) << st.message();

  // The dense KL loss checks its ranges the same way.
  auto d = pb.dense_kl();
  std::vector<float> loss(pb.T);
  d.loss_rows = loss.data();
  d.k_start = ks.data();
  d.k_end = ke.data();
  st = flashdsa::validate_fwd(d);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k_end[20]"), std::string::npos) << st.message();
}

TEST_F(Validate, SparseMlaForwardAndBackward) {
  using F = flashdsa::SparseMlaFwdParams;
  using B = flashdsa::SparseMlaBwdParams;
  const auto f = pb.sparse_fwd(act_out.data(), stat_out.data());
  const auto vf = validator<F>();
  ASSERT_TRUE(vf(f).ok()) << vf(f).to_string();
  expect_rejected<F>(f, vf, "q", [](F& x) { x.attn.q = nullptr; });
  expect_rejected<F>(f, vf, "kv", [](F& x) { x.attn.kv = nullptr; });
  expect_rejected<F>(f, vf, "indices", [](F& x) { x.topk.indices = nullptr; });
  expect_rejected<F>(f, vf, "out", [](F& x) { x.out = nullptr; });
  expect_rejected<F>(f, vf, "lse", [](F& x) { x.lse = nullptr; });
  expect_rejected<F>(f, vf, "H", [](F& x) { x.attn.H = 0; });
  expect_rejected<F>(f, vf, "H", [](F& x) { x.attn.H = 200; });
  expect_rejected<F>(f, vf, "D_qk", [](F& x) { x.attn.D_qk = 70; });
  expect_rejected<F>(f, vf, "D_qk", [](F& x) { x.attn.D_qk = 1032; });
  expect_rejected<F>(f, vf, "D_v", [](F& x) { x.attn.D_v = 0; });
  expect_rejected<F>(f, vf, "D_v", [](F& x) { x.attn.D_v = x.attn.D_qk + 1; });
  expect_rejected<F>(f, vf, "K", [](F& x) { x.topk.K = -4; });
  expect_rejected<F>(f, vf, "scale", [](F& x) { x.attn.scale = std::numeric_limits<float>::quiet_NaN(); });
  expect_rejected<F>(f, vf, "q_stride_h", [](F& x) { x.attn.q_stride_h = 8; });
  expect_rejected<F>(f, vf, "q_stride_t", [](F& x) { x.attn.q_stride_t = x.attn.q_stride_h; });
  expect_rejected<F>(f, vf, "kv_stride_t", [](F& x) { x.attn.kv_stride_t = x.attn.D_qk - 8; });
  expect_rejected<F>(f, vf, "indices_stride_t", [](F& x) { x.topk.stride_t = x.topk.K - 1; });

  const auto b = pb.sparse_bwd(act_out.data(), stat_out.data(), act_out.data(), stat_out.data());
  const auto vb = validator<B>();
  ASSERT_TRUE(vb(b).ok()) << vb(b).to_string();
  expect_rejected<B>(b, vb, "out", [](B& x) { x.out = nullptr; });
  expect_rejected<B>(b, vb, "lse", [](B& x) { x.lse = nullptr; });
  expect_rejected<B>(b, vb, "dout", [](B& x) { x.dout = nullptr; });
  expect_rejected<B>(b, vb, "dq", [](B& x) { x.dq = nullptr; });
  expect_rejected<B>(b, vb, "dkv", [](B& x) { x.dkv = nullptr; });
  expect_rejected<B>(b, vb, "kv_stride_t", [](B& x) { x.attn.kv_stride_t = -2; });
  // The optional mass output: null (not requested) or any address on the CPU.
  B with_mass = b;
  with_mass.mass = stat_out.data() + 1;
  EXPECT_TRUE(vb(with_mass).ok()) << vb(with_mass).to_string();
}

// The parts of a valid CUDA call at the production shape (H = 16, K = 64; the validators never read
// the tensors).
flashdsa::AttentionTensors production_attention(const void* q, const void* kv) {
  flashdsa::AttentionTensors a;
  a.dtype = DType::kBF16;
  a.q = q;
  a.kv = kv;
  a.H = 16;
  a.scale = 0.04f;
  a.q_stride_t = 16 * 576;
  a.q_stride_h = 576;
  a.kv_stride_t = 576;
  return a;
}

flashdsa::TopkIndices production_topk(const int32_t* indices) {
  flashdsa::TopkIndices k;
  k.indices = indices;
  k.stride_t = 64;
  k.K = 64;
  return k;
}

// Main-attention params of a valid CUDA call at the production shape (4 tokens): every tensor
// points at `dummy`.
template <class P>
P cuda_attention_params(const void* dummy, const int32_t* indices) {
  P p;
  p.device = Device::kCUDA;
  p.attn = production_attention(dummy, dummy);
  p.topk = production_topk(indices);
  p.T = p.T_kv = 4;
  return p;
}

// Makes dispatch see a compute capability 9.0 GPU (no CUDA call is made), so the sm90 backend's
// limits can be checked without a GPU; skips in builds without CUDA (no sm90 backend).
class ValidateCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!flashdsa::built_with_cuda()) GTEST_SKIP() << "no CUDA backend in this build";
    flashdsa::testing::set_cuda_device_override(9, 0, "test H200");
  }
  void TearDown() override { flashdsa::testing::clear_cuda_device_override(); }
};

// On CUDA the bwd's optional mass output must be 16-byte aligned (the kernel stores 16 bytes).
TEST_F(ValidateCuda, BackwardMassAlignment) {
  using B = flashdsa::SparseMlaBwdParams;
  alignas(16) static uint16_t dummy[16];
  alignas(16) static int32_t dummy_indices[64];
  alignas(16) static float mass[8];
  B p = cuda_attention_params<B>(dummy, dummy_indices);
  p.out = p.dout = dummy;
  p.lse = p.dq = p.dkv = dummy;
  const auto v = validator<B>();
  ASSERT_TRUE(v(p).ok()) << v(p).to_string();
  p.mass = mass;
  EXPECT_TRUE(v(p).ok()) << v(p).to_string();
  expect_rejected<B>(p, v, "mass", [](B& x) { x.mass = mass + 1; });
}

TEST_F(Validate, AttentionMass) {
  using P = flashdsa::AttnMassParams;
  const auto p = pb.attention_mass(stat_out.data(), stat_out.data());
  const auto v = validator<P>();
  ASSERT_TRUE(v(p).ok()) << v(p).to_string();
  expect_rejected<P>(p, v, "lse", [](P& x) { x.lse = nullptr; });
  expect_rejected<P>(p, v, "mass", [](P& x) { x.mass = nullptr; });
  expect_rejected<P>(p, v, "D_qk", [](P& x) { x.attn.D_qk = 0; });
}

TEST_F(Validate, SparseKl) {
  using P = flashdsa::SparseKlParams;
  const P p = with_kl_outputs(pb.sparse_kl(stat_out.data()));
  const auto fwd = fwd_validator<P>(), bwd = bwd_validator<P>();
  ASSERT_TRUE(fwd(p).ok()) << fwd(p).to_string();
  ASSERT_TRUE(bwd(p).ok()) << bwd(p).to_string();
  expect_rejected<P>(p, fwd, "mass", [](P& x) { x.mass = nullptr; });
  expect_rejected<P>(p, fwd, "loss_rows", [](P& x) { x.loss_rows = nullptr; });
  expect_rejected<P>(p, fwd, "indices_stride_t", [](P& x) { x.topk.stride_t = 3; });
  expect_rejected<P>(p, bwd, "dq_idx", [](P& x) { x.dq_idx = nullptr; });
  expect_rejected<P>(p, bwd, "dk_idx", [](P& x) { x.dk_idx = nullptr; });
  expect_rejected<P>(p, bwd, "dweights", [](P& x) { x.dweights = nullptr; });
  expect_rejected<P>(p, bwd, "grad_scale", [](P& x) { x.grad_scale = std::numeric_limits<double>::infinity(); });
  // The backward does not need loss_rows, nor grad_rows (optional).
  P no_loss = p;
  no_loss.loss_rows = nullptr;
  no_loss.grad_rows = nullptr;
  EXPECT_TRUE(bwd(no_loss).ok());
}

TEST_F(Validate, DenseKl) {
  using P = flashdsa::DenseKlParams;
  const P p = with_kl_outputs(pb.dense_kl());
  const auto fwd = fwd_validator<P>(), bwd = bwd_validator<P>();
  ASSERT_TRUE(fwd(p).ok()) << fwd(p).to_string();
  ASSERT_TRUE(bwd(p).ok()) << bwd(p).to_string();
  expect_rejected<P>(p, fwd, "q", [](P& x) { x.attn.q = nullptr; });
  expect_rejected<P>(p, fwd, "k_end", [](P& x) { x.k_end = nullptr; });
  expect_rejected<P>(p, fwd, "loss_rows", [](P& x) { x.loss_rows = nullptr; });
  expect_rejected<P>(p, fwd, "H", [](P& x) { x.attn.H = -1; });
  expect_rejected<P>(p, fwd, "q_idx_stride_h", [](P& x) { x.indexer.q_idx_stride_h = -5; });
  // The two parts share one activation dtype.
  expect_rejected<P>(p, fwd, "indexer.dtype", [](P& x) {
    x.indexer.dtype = x.attn.dtype == DType::kFP64 ? DType::kFP32 : DType::kFP64;
  });
  expect_rejected<P>(p, bwd, "dweights", [](P& x) { x.dweights = nullptr; });
}

// Zero-size tensors may be null; the op then has nothing to do.
TEST_F(Validate, EmptyTensorsMayBeNull) {
  flashdsa::SparseMlaFwdParams p;
  p.attn.dtype = DType::kFP32;
  p.attn.H = 4;
  p.attn.D_qk = 16;
  p.attn.D_v = 8;
  p.topk.K = 4;
  p.attn.scale = 0.5f;
  EXPECT_TRUE(flashdsa::validate(p).ok()) << flashdsa::validate(p).to_string();
  EXPECT_TRUE(flashdsa::run_sparse_mla_fwd(p).ok());
}

// The CUDA backend takes only the production shapes and bf16.
TEST_F(ValidateCuda, ProductionShapesOnly) {
  using P = flashdsa::SparseMlaFwdParams;
  static int32_t dummy_indices[64];
  static uint16_t dummy[16];
  P p = cuda_attention_params<P>(dummy, dummy_indices);
  p.out = p.lse = dummy;
  const auto v = validator<P>();
  ASSERT_TRUE(v(p).ok()) << v(p).to_string();
  expect_rejected<P>(p, v, "dtype", [](P& x) { x.attn.dtype = DType::kFP32; });
  expect_rejected<P>(p, v, "dtype", [](P& x) { x.attn.dtype = DType::kFP64; });
  expect_rejected<P>(p, v, "H", [](P& x) { x.attn.H = 8; });
  expect_rejected<P>(p, v, "D_qk", [](P& x) { x.attn.D_qk = 512; });
  expect_rejected<P>(p, v, "D_v", [](P& x) { x.attn.D_v = 256; });
  expect_rejected<P>(p, v, "K", [](P& x) { x.topk.K = 100; });
  expect_rejected<P>(p, v, "K", [](P& x) { x.topk.K = 8256; });

  using I = flashdsa::IndexerTopkParams;
  I ip;
  ip.device = Device::kCUDA;
  ip.check_ranges = false;
  ip.indexer.q_idx = ip.indexer.k_idx = ip.indexer.weights = dummy;
  ip.k_start = ip.k_end = ip.indices = dummy_indices;
  ip.T = ip.T_kv = 4;
  ip.indexer.H_I = 32;
  ip.indexer.D_I = 128;
  ip.K = 64;
  ip.indexer.q_idx_stride_t = 32 * 128;
  ip.indexer.q_idx_stride_h = 128;
  ip.indexer.k_idx_stride_t = 128;
  ip.indexer.weights_stride_t = 32;
  const auto vi = validator<I>();
  ASSERT_TRUE(vi(ip).ok()) << vi(ip).to_string();
  expect_rejected<I>(ip, vi, "H_I", [](I& x) { x.indexer.H_I = 16; });
  expect_rejected<I>(ip, vi, "D_I", [](I& x) { x.indexer.D_I = 96; });
  expect_rejected<I>(ip, vi, "K", [](I& x) { x.K = 32; });
  expect_rejected<I>(ip, vi, "dtype", [](I& x) { x.indexer.dtype = DType::kFP32; });
  // Dequantization scales (a future fp8 indexer) are refused by the sm90 backend.
  static float indexer_scale[4];
  I scaled = ip;
  scaled.indexer.q_idx_scale = indexer_scale;
  EXPECT_EQ(vi(scaled).code(), StatusCode::kNotSupported) << vi(scaled).to_string();
  EXPECT_NE(vi(scaled).to_string().find("q_idx_scale"), std::string::npos) << vi(scaled).to_string();
  // Misaligned rows are valid input the kernels cannot read.
  P misaligned = p;
  misaligned.attn.q_stride_h = 577;
  misaligned.attn.q_stride_t = 16 * 577;
  EXPECT_EQ(v(misaligned).code(), StatusCode::kNotSupported) << v(misaligned).to_string();
}

// A CUDA device that no backend of this build targets (here reported as compute capability 8.0
// by the test override, before any CUDA call) gets kNotSupported naming the device and what the
// kernels need, from validate(), the entry points and the workspace queries alike.
TEST(Dispatch, CudaDeviceOfAnotherArchitectureIsNotSupported) {
  static int32_t dummy_indices[64];
  static uint16_t dummy[16];
  auto p = cuda_attention_params<flashdsa::SparseMlaFwdParams>(dummy, dummy_indices);
  p.out = p.lse = dummy;
  flashdsa::testing::set_cuda_device_override(8, 0, "NVIDIA A100-SXM4-80GB");
  const Status validated = flashdsa::validate(p);
  const Status ran = flashdsa::run_sparse_mla_fwd(p);
  flashdsa::SparseMlaBwdParams b;
  b.device = Device::kCUDA;
  const size_t workspace = flashdsa::sparse_mla_bwd_workspace_size(b);
  flashdsa::testing::clear_cuda_device_override();

  for (const Status& st : {validated, ran}) {
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.to_string();
    EXPECT_NE(st.message().find("sparse_mla_fwd"), std::string::npos) << st.message();
    if (flashdsa::built_with_cuda()) {
      EXPECT_NE(st.message().find("NVIDIA A100-SXM4-80GB"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("compute capability 8.0"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("compute capability 9.0"), std::string::npos) << st.message();
    } else {
      EXPECT_NE(st.message().find("without CUDA"), std::string::npos) << st.message();
    }
  }
  EXPECT_EQ(workspace, 0u);
}

TEST_F(Validate, EntryPointsValidateAndDispatch) {
  auto p = pb.sparse_fwd(act_out.data(), stat_out.data());
  p.attn.q = nullptr;
  EXPECT_EQ(flashdsa::run_sparse_mla_fwd(p).code(), StatusCode::kInvalidArgument);

  if (!flashdsa::built_with_cuda()) {
    flashdsa::AttnMassParams m = pb.attention_mass(stat_out.data(), stat_out.data());
    m.device = Device::kCUDA;
    m.attn = production_attention(m.attn.q, m.attn.kv);
    m.topk = production_topk(m.topk.indices);
    const Status st = flashdsa::run_attention_mass(m);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.to_string();
    EXPECT_NE(st.message().find("without CUDA"), std::string::npos) << st.message();
  }
  flashdsa::IndexerTopkParams ip = pb.indexer_topk(indices_out.data(), nullptr);
  EXPECT_EQ(flashdsa::indexer_topk_workspace_size(ip), 0u);
}

TEST(StatusAndNames, Formatting) {
  EXPECT_EQ(Status::OK().to_string(), "OK");
  EXPECT_EQ(Status::InvalidArgument("q must not be null").to_string(), "InvalidArgument: q must not be null");
  EXPECT_EQ(Status::CudaError("x").to_string(), "CudaError: x");
  EXPECT_STREQ(flashdsa::status_code_name(StatusCode::kNotSupported), "NotSupported");
  EXPECT_STREQ(flashdsa::status_code_name(StatusCode::kInternal), "Internal");
  EXPECT_STREQ(flashdsa::dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(flashdsa::dtype_name(DType::kFP64), "fp64");
  EXPECT_STREQ(flashdsa::device_name(Device::kCUDA), "cuda");
  EXPECT_TRUE(flashdsa::is_supported_heads(64));
  EXPECT_FALSE(flashdsa::is_supported_heads(48));
  EXPECT_TRUE(flashdsa::is_supported_indexer_heads(32));
  EXPECT_FALSE(flashdsa::is_supported_indexer_heads(16));
  EXPECT_TRUE(flashdsa::is_supported_indexer_dim(64));
  EXPECT_FALSE(flashdsa::is_supported_indexer_dim(32));
}

}  // namespace
}  // namespace fdt
