// Check program for the sm90 indexer-loss kernels (csrc/sm90/kl_loss): attention mass, sparse KL
// forward / backward, dense KL forward / backward.
//   (a) correctness at small sizes against a double-precision CPU reference written here (packed THD
//       with odd sequence lengths, -1 and out-of-range indices, rows with fewer than K valid slots, an
//       all-empty row, a row with zero attention mass, relu on/off, H in {16, 32, 64, 128},
//       H_I in {32, 64}, D_I in {64, 128}); the sparse forward's row_stats, and the sparse backward both
//       from them (one pass) and without them;
//   (b) unless --no-bench, timings at the issue's shapes (H=64, K=2048, H_I=32, D_I=128).
// Build: the CMake target kl_loss_check (links the library; `cmake --build build --target kl_loss_check`).
// Usage: kl_loss_check [--small] [--no-bench] [--seed N]
//   --small: a few small cases only (for compute-sanitizer memcheck / racecheck), implies --no-bench.
// Exit: 0 all passed, 1 a check failed, 77 no CUDA device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashdsa/ops.h"
#include "sm90/backend.h"
#include "check_common.cuh"

namespace {

using flashdsa::Status;

void status_ok(const Status& s, const char* what) { flashdsa_check::status_or_die(s, what); }

constexpr int kDqk = flashdsa::kDqk;

// ---- host data -------------------------------------------------------------------------------------

// A bf16 tensor on the host: the bits and the exact values they represent.
struct HostBf16 {
  std::vector<__nv_bfloat16> bits;
  std::vector<double> val;
};

HostBf16 random_bf16(size_t n, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<float> dist(0.f, static_cast<float>(stddev));
  HostBf16 t;
  t.bits.resize(n);
  t.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t.bits[i] = __float2bfloat16_rn(dist(rng));
    t.val[i] = static_cast<double>(__bfloat162float(t.bits[i]));
  }
  return t;
}

std::vector<float> random_f32(size_t n, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<float> dist(0.f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { FLASHDSA_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) {
    if (n) FLASHDSA_CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) FLASHDSA_CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // Outputs must be fully written by the op: start them from huge values, never from zeros.
  void fill_garbage() { FLASHDSA_CHECK_CUDA(cudaMemset(p, 0x7f, std::max<size_t>(n, 1) * sizeof(T))); }
};

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }
std::vector<double> to_double(const std::vector<__nv_bfloat16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = __bfloat162float(v[i]);
  return d;
}

// Packed THD causal layout: token t of sequence b sees keys [cu[b], t + 1) (the library's ranges).
using Layout = flashdsa_check::KeyRanges;

Layout thd_causal(const std::vector<int>& seqlens) { return flashdsa_check::thd_causal_ranges(seqlens); }

// Top-k-like indices [T, K]: up to K distinct visible keys per row in random slots, the other slots
// -1 or out of range (both empty); one duplicated key in some rows; row `empty_row` all empty.
std::vector<int32_t> make_indices(const Layout& L, int K, int64_t empty_row, std::mt19937_64& rng) {
  const int64_t T_kv = L.T;
  std::vector<int32_t> idx(static_cast<size_t>(L.T) * K);
  std::uniform_int_distribution<int> coin(0, 7);
  for (int64_t t = 0; t < L.T; ++t) {
    std::vector<int32_t> vis;
    for (int32_t s = L.k_start[t]; s < L.k_end[t]; ++s) vis.push_back(s);
    std::shuffle(vis.begin(), vis.end(), rng);
    std::vector<int32_t> row(K);
    for (int j = 0; j < K; ++j) {
      if (t == empty_row) {
        row[j] = coin(rng) == 0 ? static_cast<int32_t>(T_kv + 3) : -1;
      } else if (j < static_cast<int>(vis.size())) {
        row[j] = vis[j];
      } else {
        const int c = coin(rng);
        row[j] = c == 0 ? static_cast<int32_t>(T_kv + j) : (c == 1 ? -7 : -1);
      }
    }
    if (t != empty_row && static_cast<int>(vis.size()) < K && coin(rng) == 0) row[K - 1] = vis[0];  // duplicate
    std::shuffle(row.begin(), row.end(), rng);
    std::copy(row.begin(), row.end(), idx.begin() + t * K);
  }
  return idx;
}

bool valid_index(int32_t s, int64_t T_kv) { return ref::valid(s, T_kv); }

// ---- CPU references (double): tests/cpp/reference.h ------------------------------------------------

// The attention inputs as the reference reads them (contiguous [T, H, 576] and [T_kv, 576]).
ref::Attention attention_view(const HostBf16& q, const HostBf16& kv, int H, double scale) {
  return {q.val, kv.val, H, kDqk, scale};
}

// Indexer inputs shared by the sparse and dense references.
struct IndexerData {
  int HI = 0, DI = 0;
  bool relu = true;
  HostBf16 q_idx, k_idx;        // [T, HI, DI], [T_kv, DI]
  std::vector<float> w;         // [T, HI]
  std::vector<double> w_val;    // the same, as the reference reads it
  ref::Indexer view() const { return {q_idx.val, k_idx.val, w_val, HI, DI, relu}; }
};
using KlResult = ref::KlResult;

// d total / d loss_rows[t] of every row: grad_scale, times grad_rows[t] when given.
std::vector<double> row_grad_scales(double grad_scale, const std::vector<float>& grad_rows, int64_t T) {
  std::vector<double> g(T);
  for (int64_t t = 0; t < T; ++t) g[t] = grad_scale * (grad_rows.empty() ? 1.0 : grad_rows[t]);
  return g;
}

// ---- comparison ----------------------------------------------------------------------------------------

int g_failures = 0;

// Relative L2 error ||got - ref|| / ||ref|| (absolute when ref is 0) and max |got - ref|.
bool check(const char* what, const std::vector<double>& ref, const std::vector<double>& got, double tol) {
  double num = 0.0, den = 0.0, max_abs = 0.0;
  bool finite = got.size() == ref.size();
  for (size_t i = 0; i < ref.size() && finite; ++i) {
    const double d = got[i] - ref[i];
    finite = std::isfinite(got[i]);
    num += d * d;
    den += ref[i] * ref[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  const double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool pass = finite && rel <= tol;
  std::printf("    %-10s rel_l2 %.3e  max_abs %.3e  (tol %.0e)  %s\n", what, rel, max_abs, tol, pass ? "PASS" : "FAIL");
  if (!pass) ++g_failures;
  return pass;
}

// Rows that must be exactly zero (empty support / zero mass): `width` values per row.
void check_zero_rows(const char* what, const std::vector<double>& got, const std::vector<int64_t>& rows, int width) {
  for (int64_t t : rows) {
    for (int i = 0; i < width; ++i) {
      if (got[t * width + i] != 0.0) {
        std::printf("    %-10s row %lld not zero (%g)  FAIL\n", what, static_cast<long long>(t), got[t * width + i]);
        ++g_failures;
        return;
      }
    }
  }
}

// ---- correctness cases -------------------------------------------------------------------------------

constexpr double kTolMass = 1e-3, kTolLoss = 1e-3, kTolGrad = 1e-2;

using flashdsa_check::attention_part;
using flashdsa_check::indexer_part;
using flashdsa_check::topk_part;

// The attention-mass params of contiguous device tensors.
flashdsa::AttnMassParams mass_params(const void* q, const void* kv, const int32_t* idx, const float* lse, float* mass,
                                     int H, int K, double scale, int64_t T, int64_t T_kv) {
  flashdsa::AttnMassParams p;
  p.device = flashdsa::Device::kCUDA;
  p.attn = attention_part(q, kv, H, scale);
  p.topk = topk_part(idx, K);
  p.lse = lse;
  p.mass = mass;
  p.T = T;
  p.T_kv = T_kv;
  return p;
}

void case_mass(const std::vector<int>& seqlens, int H, int K, std::mt19937_64& rng) {
  const Layout L = thd_causal(seqlens);
  const int64_t T = L.T, T_kv = L.T, empty_row = T / 2;
  std::printf("  attention_mass  T=%lld H=%d K=%d\n", static_cast<long long>(T), H, K);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
  HostBf16 q = random_bf16(static_cast<size_t>(T) * H * kDqk, rng, 1.0);
  HostBf16 kv = random_bf16(static_cast<size_t>(T_kv) * kDqk, rng, 1.0);
  const std::vector<int32_t> idx = make_indices(L, K, empty_row, rng);
  const ref::Attention attn = attention_view(q, kv, H, scale);
  const std::vector<float> lse = to_float(ref::sparse_lse(attn, idx, T, T_kv, K));  // the GPU reads fp32
  const std::vector<double> want = ref::attention_mass(attn, idx, T, T_kv, K, to_double(lse));

  DevBuf<__nv_bfloat16> dq(q.bits), dkv(kv.bits);
  DevBuf<int32_t> didx(idx);
  DevBuf<float> dlse(lse), dmass(static_cast<size_t>(T) * K);
  dmass.fill_garbage();
  status_ok(flashdsa::sm90::attention_mass(mass_params(dq.p, dkv.p, didx.p, dlse.p, dmass.p, H, K, scale, T, T_kv)),
            "attention_mass");
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<double> got = to_double(dmass.download());
  check("mass", want, got, kTolMass);
  check_zero_rows("mass", got, {empty_row}, K);
}

struct KlCase {
  int HI, DI;
  bool relu;
  bool use_grad_rows;
};

IndexerData make_indexer(int64_t T, int64_t T_kv, const KlCase& kc, std::mt19937_64& rng) {
  IndexerData in;
  in.HI = kc.HI;
  in.DI = kc.DI;
  in.relu = kc.relu;
  in.q_idx = random_bf16(static_cast<size_t>(T) * kc.HI * kc.DI, rng, 1.0);
  in.k_idx = random_bf16(static_cast<size_t>(T_kv) * kc.DI, rng, 1.0);
  // Caller-folded scales, as in production: w ~ H_I^-0.5 D_I^-0.5 -> scores of order 1.
  in.w = random_f32(static_cast<size_t>(T) * kc.HI, rng, 2.0 / std::sqrt(static_cast<double>(kc.HI * kc.DI)));
  in.w_val = to_double(in.w);
  return in;
}

// Device copies of the indexer inputs and the KL outputs.
struct KlDevice {
  DevBuf<__nv_bfloat16> q_idx, k_idx, dq;
  DevBuf<float> w, loss, dk, dw, grad_rows;
  KlDevice(const IndexerData& in, int64_t T, int64_t T_kv, const std::vector<float>& grad_rows_h)
      : q_idx(in.q_idx.bits), k_idx(in.k_idx.bits), dq(static_cast<size_t>(T) * in.HI * in.DI), w(in.w), loss(T),
        dk(static_cast<size_t>(T_kv) * in.DI), dw(static_cast<size_t>(T) * in.HI), grad_rows(grad_rows_h) {
    loss.fill_garbage();
    fill_grads_garbage();
  }
  void fill_grads_garbage() {
    dq.fill_garbage();
    dk.fill_garbage();
    dw.fill_garbage();
  }
  template <class P>
  void fill(P& p, const IndexerData& in, int64_t T, int64_t T_kv, double grad_scale, bool use_grad_rows) {
    p.device = flashdsa::Device::kCUDA;
    p.indexer = indexer_part(q_idx.p, k_idx.p, w.p, in.HI, in.DI, in.relu);
    p.T = T;
    p.T_kv = T_kv;
    p.loss_rows = loss.p;
    p.grad_scale = grad_scale;
    p.grad_rows = use_grad_rows ? grad_rows.p : nullptr;
    p.dq_idx = dq.p;
    p.dk_idx = dk.p;
    p.dweights = dw.p;
  }
  void compare(const KlResult& ref, const IndexerData& in, const std::vector<int64_t>& zero_rows, bool bwd) const {
    if (!bwd) {
      const std::vector<double> got = to_double(loss.download());
      check("loss", ref.loss_rows, got, kTolLoss);
      check_zero_rows("loss", got, zero_rows, 1);
      return;
    }
    const std::vector<double> gdq = to_double(dq.download()), gdw = to_double(dw.download());
    check("dq_idx", ref.dq_idx, gdq, kTolGrad);
    check("dk_idx", ref.dk_idx, to_double(dk.download()), kTolGrad);
    check("dweights", ref.dweights, gdw, kTolGrad);
    check_zero_rows("dq_idx", gdq, zero_rows, in.HI * in.DI);
    check_zero_rows("dweights", gdw, zero_rows, in.HI);
  }
};

std::vector<float> make_grad_rows(int64_t T, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  std::vector<float> g(T);
  for (auto& x : g) x = u(rng);
  return g;
}

// row_stats of the forward: {lse, sum of mass} on rows with a target, exactly {-inf, 0} elsewhere.
void check_row_stats(const KlResult& ref, const std::vector<int32_t>& idx, const std::vector<float>& mass, int64_t T,
                     int64_t T_kv, int K, const std::vector<float>& got) {
  std::vector<double> want, have;
  int bad_empty = 0;
  for (int64_t t = 0; t < T; ++t) {
    double msum = 0.0;
    for (int j = 0; j < K; ++j)
      if (valid_index(idx[t * K + j], T_kv)) msum += mass[t * K + j];
    if (ref.lse_rows[t] == -INFINITY) {
      bad_empty += !(got[2 * t] == -INFINITY && got[2 * t + 1] == 0.f);
      continue;
    }
    want.insert(want.end(), {ref.lse_rows[t], msum});
    have.insert(have.end(), {got[2 * t], got[2 * t + 1]});
  }
  check("row_stats", want, have, kTolLoss);
  if (bad_empty) {
    std::printf("    %-10s %d rows without a target not {-inf, 0}  FAIL\n", "row_stats", bad_empty);
    ++g_failures;
  }
}

void case_sparse_kl(const std::vector<int>& seqlens, int K, const KlCase& kc, std::mt19937_64& rng) {
  const Layout L = thd_causal(seqlens);
  const int64_t T = L.T, T_kv = L.T, empty_row = T / 3, zero_mass_row = T - 1;
  std::printf("  sparse_kl  T=%lld K=%d H_I=%d D_I=%d relu=%d grad_rows=%d\n", static_cast<long long>(T), K, kc.HI,
              kc.DI, kc.relu, kc.use_grad_rows);
  const std::vector<int32_t> idx = make_indices(L, K, empty_row, rng);
  // Unnormalized target: positive, spread over two orders of magnitude, some exact zeros, and one
  // row whose support carries no mass at all.
  std::vector<float> mass(static_cast<size_t>(T) * K);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (size_t i = 0; i < mass.size(); ++i) {
    const float x = u(rng);
    mass[i] = x < 0.1f ? 0.f : x * x * x * 4.f;
  }
  for (int j = 0; j < K; ++j) mass[zero_mass_row * K + j] = 0.f;
  const IndexerData in = make_indexer(T, T_kv, kc, rng);
  const std::vector<float> grad_rows = make_grad_rows(T, rng);
  const double grad_scale = 0.75;
  const KlResult want = ref::sparse_kl(in.view(), idx, to_double(mass), T, T_kv, K,
                                      row_grad_scales(grad_scale, kc.use_grad_rows ? grad_rows : std::vector<float>{}, T));

  KlDevice dev(in, T, T_kv, grad_rows);
  DevBuf<int32_t> didx(idx);
  DevBuf<float> dmass(mass), dstats(static_cast<size_t>(T) * 2);
  dstats.fill_garbage();
  flashdsa::SparseKlParams p;
  dev.fill(p, in, T, T_kv, grad_scale, kc.use_grad_rows);
  p.topk = topk_part(didx.p, K);
  p.mass = dmass.p;
  p.row_stats = dstats.p;
  status_ok(flashdsa::sm90::sparse_kl_fwd(p), "sparse_kl_fwd");
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  dev.compare(want, in, {empty_row, zero_mass_row}, false);
  check_row_stats(want, idx, mass, T, T_kv, K, dstats.download());
  // The backward from the saved statistics (one pass), then without them (statistics pass first).
  for (const bool saved : {true, false}) {
    std::printf("   bwd %s\n", saved ? "from saved row_stats" : "without row_stats");
    p.row_stats = saved ? dstats.p : nullptr;
    dev.fill_grads_garbage();
    status_ok(flashdsa::sm90::sparse_kl_bwd(p), "sparse_kl_bwd");
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    dev.compare(want, in, {empty_row, zero_mass_row}, true);
  }
}

void case_dense_kl(const std::vector<int>& seqlens, int H, const KlCase& kc, std::mt19937_64& rng) {
  Layout L = thd_causal(seqlens);
  const int64_t T = L.T, T_kv = L.T, empty_row = T / 2;
  L.k_end[empty_row] = L.k_start[empty_row];  // an empty key range
  std::printf("  dense_kl  T=%lld H=%d H_I=%d D_I=%d relu=%d grad_rows=%d\n", static_cast<long long>(T), H, kc.HI,
              kc.DI, kc.relu, kc.use_grad_rows);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
  HostBf16 q = random_bf16(static_cast<size_t>(T) * H * kDqk, rng, 1.5);
  HostBf16 kv = random_bf16(static_cast<size_t>(T_kv) * kDqk, rng, 1.5);
  const IndexerData in = make_indexer(T, T_kv, kc, rng);
  const std::vector<float> grad_rows = make_grad_rows(T, rng);
  const double grad_scale = 1.25;
  const KlResult want =
      ref::dense_kl(in.view(), attention_view(q, kv, H, scale), L.k_start, L.k_end, T, T_kv,
                    row_grad_scales(grad_scale, kc.use_grad_rows ? grad_rows : std::vector<float>{}, T));

  KlDevice dev(in, T, T_kv, grad_rows);
  DevBuf<__nv_bfloat16> dq_main(q.bits), dkv(kv.bits);
  DevBuf<int32_t> dks(L.k_start), dke(L.k_end);
  flashdsa::DenseKlParams p;
  dev.fill(p, in, T, T_kv, grad_scale, kc.use_grad_rows);
  p.attn = attention_part(dq_main.p, dkv.p, H, scale);
  p.k_start = dks.p;
  p.k_end = dke.p;
  status_ok(flashdsa::sm90::dense_kl_fwd(p), "dense_kl_fwd");
  status_ok(flashdsa::sm90::dense_kl_bwd(p), "dense_kl_bwd");
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  dev.compare(want, in, {empty_row}, false);
  dev.compare(want, in, {empty_row}, true);
}

void run_correctness(bool small, std::mt19937_64& rng) {
  std::printf("correctness (CPU double reference)\n");
  const std::vector<int> odd = {1, 37, 90, 129};  // T = 257
  if (small) {
    const std::vector<int> tiny = {1, 37, 70};
    case_mass(tiny, 64, 64, rng);
    case_sparse_kl(tiny, 64, {32, 128, true, true}, rng);
    case_dense_kl(tiny, 64, {32, 128, true, true}, rng);
    return;
  }
  case_mass(odd, 64, 64, rng);
  case_mass(odd, 16, 128, rng);
  case_mass(odd, 128, 64, rng);
  case_mass({200, 57}, 32, 192, rng);
  case_sparse_kl(odd, 64, {32, 128, true, true}, rng);
  case_sparse_kl(odd, 128, {64, 64, false, false}, rng);
  case_sparse_kl({200, 57}, 192, {32, 64, false, true}, rng);
  case_sparse_kl(odd, 64, {64, 128, true, false}, rng);
  case_dense_kl(odd, 64, {32, 128, true, true}, rng);
  case_dense_kl(odd, 16, {64, 64, false, false}, rng);
  case_dense_kl(odd, 128, {64, 128, true, true}, rng);
  case_dense_kl({200, 57}, 128, {32, 64, false, true}, rng);
}

// ---- benchmark ---------------------------------------------------------------------------------------

using flashdsa_check::hash32;
using flashdsa_check::hash_unit;

__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16_rn(amp * (2.f * hash_unit(seed * 0x9e3779b97f4a7c15ull + i) - 1.f));
}
__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = lo + (hi - lo) * hash_unit(seed * 0x9e3779b97f4a7c15ull + i);
}
// One causal sequence: row t holds K random keys of [0, t] (all of them, then -1, when t < K).
__global__ void fill_causal_indices_kernel(int32_t* idx, int64_t T, int K, uint64_t seed) {
  const size_t n = static_cast<size_t>(T) * K;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const int64_t t = static_cast<int64_t>(i / K);
    const int j = static_cast<int>(i % K);
    idx[i] = t < K ? (j <= t ? j : -1) : static_cast<int32_t>(hash32(seed * 0x9e3779b97f4a7c15ull + i) % (t + 1));
  }
}

void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float amp) {
  fill_bf16_kernel<<<1024, 256>>>(p, n, seed, amp);
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
}
void fill_f32(float* p, size_t n, uint64_t seed, float lo, float hi) {
  fill_f32_kernel<<<1024, 256>>>(p, n, seed, lo, hi);
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
}

// Median milliseconds of `reps` timed runs after `warmup` untimed ones.
double time_ms(const std::function<void()>& fn, int warmup = 2, int reps = 10) {
  return flashdsa_check::median_ms(fn, warmup, reps);
}

void print_row(const char* name, int64_t T, double ms, double flops) {
  std::printf("  %-28s T=%-7lld %10.3f ms  %8.1f TFLOP/s\n", name, static_cast<long long>(T), ms, flops / ms * 1e-9);
}

void bench_copy() {
  const size_t bytes = size_t{1} << 30;
  DevBuf<uint8_t> a(bytes), b(bytes);
  FLASHDSA_CHECK_CUDA(cudaMemset(a.p, 1, bytes));
  const double ms = time_ms([&] { FLASHDSA_CHECK_CUDA(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice)); });
  std::printf("  %-28s %10.3f ms  %8.2f TB/s (read + write)\n", "ceiling: D2D copy 1 GiB", ms, 2.0 * bytes / ms * 1e-9);
}

void bench_sparse(int64_t T) {
  constexpr int H = 64, K = 2048, HI = 32, DI = 128;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
  DevBuf<__nv_bfloat16> q(static_cast<size_t>(T) * H * kDqk), kv(static_cast<size_t>(T) * kDqk);
  DevBuf<__nv_bfloat16> q_idx(static_cast<size_t>(T) * HI * DI), k_idx(static_cast<size_t>(T) * DI);
  DevBuf<__nv_bfloat16> dq_idx(static_cast<size_t>(T) * HI * DI);
  DevBuf<int32_t> idx(static_cast<size_t>(T) * K);
  DevBuf<float> lse(static_cast<size_t>(T) * H), mass(static_cast<size_t>(T) * K), w(static_cast<size_t>(T) * HI);
  DevBuf<float> loss(T), dk(static_cast<size_t>(T) * DI), dw(static_cast<size_t>(T) * HI), stats(2 * T);
  fill_bf16(q.p, q.n, 1, 1.f);
  fill_bf16(kv.p, kv.n, 2, 1.f);
  fill_bf16(q_idx.p, q_idx.n, 3, 1.f);
  fill_bf16(k_idx.p, k_idx.n, 4, 1.f);
  fill_f32(lse.p, lse.n, 5, 7.f, 9.f);
  fill_f32(w.p, w.n, 6, -0.02f, 0.02f);
  fill_causal_indices_kernel<<<4096, 256>>>(idx.p, T, K, 7);
  FLASHDSA_CHECK_CUDA(cudaGetLastError());

  const flashdsa::AttnMassParams mp = mass_params(q.p, kv.p, idx.p, lse.p, mass.p, H, K, scale, T, T);

  flashdsa::SparseKlParams kp;
  kp.device = flashdsa::Device::kCUDA;
  kp.indexer = indexer_part(q_idx.p, k_idx.p, w.p, HI, DI, /*relu=*/true);
  kp.topk = topk_part(idx.p, K);
  kp.mass = mass.p;
  kp.T = T;
  kp.T_kv = T;
  kp.loss_rows = loss.p;
  kp.row_stats = stats.p;
  kp.grad_scale = 1e-3 / static_cast<double>(T);
  kp.dq_idx = dq_idx.p;
  kp.dk_idx = dk.p;
  kp.dweights = dw.p;

  const double mass_ms = time_ms([&] { status_ok(flashdsa::sm90::attention_mass(mp), "attention_mass"); });
  const double fwd_ms = time_ms([&] { status_ok(flashdsa::sm90::sparse_kl_fwd(kp), "sparse_kl_fwd"); });
  const double bwd_ms = time_ms([&] { status_ok(flashdsa::sm90::sparse_kl_bwd(kp), "sparse_kl_bwd"); });
  flashdsa::SparseKlParams kp_no_stats = kp;
  kp_no_stats.row_stats = nullptr;
  const double bwd2_ms = time_ms([&] { status_ok(flashdsa::sm90::sparse_kl_bwd(kp_no_stats), "sparse_kl_bwd"); });
  const double kl_pass = 2.0 * T * K * HI * DI;
  print_row("attention mass (H=64)", T, mass_ms, 2.0 * T * H * K * kDqk);
  print_row("sparse KL fwd", T, fwd_ms, kl_pass);
  print_row("sparse KL bwd (row_stats)", T, bwd_ms, 3.0 * kl_pass);
  print_row("sparse KL bwd (no row_stats)", T, bwd2_ms, 3.0 * kl_pass);
  std::printf("  %-28s T=%-7lld %10.3f ms\n", "sparse loss path (sum)", static_cast<long long>(T),
              mass_ms + fwd_ms + bwd_ms);
}

void bench_dense(int64_t T) {
  constexpr int H = 64, HI = 32, DI = 128;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
  DevBuf<__nv_bfloat16> q(static_cast<size_t>(T) * H * kDqk), kv(static_cast<size_t>(T) * kDqk);
  DevBuf<__nv_bfloat16> q_idx(static_cast<size_t>(T) * HI * DI), k_idx(static_cast<size_t>(T) * DI);
  DevBuf<__nv_bfloat16> dq_idx(static_cast<size_t>(T) * HI * DI);
  DevBuf<float> w(static_cast<size_t>(T) * HI), loss(T), dk(static_cast<size_t>(T) * DI);
  DevBuf<float> dw(static_cast<size_t>(T) * HI);
  std::vector<int32_t> ks(T, 0), ke(T);
  for (int64_t t = 0; t < T; ++t) ke[t] = static_cast<int32_t>(t + 1);
  DevBuf<int32_t> dks(ks), dke(ke);
  fill_bf16(q.p, q.n, 11, 1.f);
  fill_bf16(kv.p, kv.n, 12, 1.f);
  fill_bf16(q_idx.p, q_idx.n, 13, 1.f);
  fill_bf16(k_idx.p, k_idx.n, 14, 1.f);
  fill_f32(w.p, w.n, 15, -0.02f, 0.02f);

  flashdsa::DenseKlParams p;
  p.device = flashdsa::Device::kCUDA;
  p.attn = attention_part(q.p, kv.p, H, scale);
  p.indexer = indexer_part(q_idx.p, k_idx.p, w.p, HI, DI, /*relu=*/true);
  p.k_start = dks.p;
  p.k_end = dke.p;
  p.T = T;
  p.T_kv = T;
  p.loss_rows = loss.p;
  p.grad_scale = 1.0 / static_cast<double>(T);
  p.dq_idx = dq_idx.p;
  p.dk_idx = dk.p;
  p.dweights = dw.p;

  const double fwd_ms = time_ms([&] { status_ok(flashdsa::sm90::dense_kl_fwd(p), "dense_kl_fwd"); });
  const double bwd_ms = time_ms([&] { status_ok(flashdsa::sm90::dense_kl_bwd(p), "dense_kl_bwd"); });
  const double pairs = 0.5 * static_cast<double>(T) * (T + 1);
  const double attn_pass = 2.0 * pairs * H * kDqk, idx_pass = 2.0 * pairs * HI * DI;
  print_row("dense KL fwd (2 passes)", T, fwd_ms, 2.0 * attn_pass + 2.0 * idx_pass);
  print_row("dense KL bwd (2 passes)", T, bwd_ms, 2.0 * attn_pass + 4.0 * idx_pass);
  // What dense causal attention of the same shape costs in FLOPs (docs/spec.md §9), for comparison
  // with a measured dense-attention time.
  const double dense_fwd = 2.0 * pairs * H * (kDqk + flashdsa::kDv);
  std::printf("  %-28s T=%-7lld fwd %.2f TFLOP, fwd+bwd %.2f TFLOP; at 500 TFLOP/s: %.3f ms fwd+bwd\n",
              "dense attention (same shape)", static_cast<long long>(T), dense_fwd * 1e-12, 3.5 * dense_fwd * 1e-12,
              3.5 * dense_fwd / 500e12 * 1e3);
}

void run_bench() {
  cudaDeviceProp prop;
  FLASHDSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("benchmark on %s (%d SMs); H=64 K=2048 H_I=32 D_I=128, one causal sequence\n", prop.name,
              prop.multiProcessorCount);
  bench_copy();
  for (int64_t T : {int64_t{32768}, int64_t{131072}}) bench_sparse(T);
  for (int64_t T : {int64_t{4096}, int64_t{8192}}) bench_dense(T);
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false, bench = true;
  uint64_t seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) {
      small = true;
    } else if (!std::strcmp(argv[i], "--no-bench")) {
      bench = false;
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--small] [--no-bench] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  std::printf("kl_loss_check seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  run_correctness(small, rng);
  std::printf("correctness: %s (%d failed checks)\n", g_failures ? "FAIL" : "PASS", g_failures);
  if (bench && !small) run_bench();
  return g_failures ? 1 : 0;
}
