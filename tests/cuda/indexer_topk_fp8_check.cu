// Standalone check + benchmark of the FP8 (e4m3) selection pass of the Hopper indexer + top-k and of
// the e4m3 quantization (csrc/sm90/indexer_topk/fp8_kernel_v2.cuh: the walk at D_I = 128,
// fp8_kernel.cuh: the walk at D_I = 64 and the quantization; docs/spec.md §3 "FP8 selection").
// The companion of indexer_topk_check.cu (bf16), kept in its own program so that the bf16 one is
// untouched.
//
// Build: the CMake target indexer_topk_fp8_check (`cmake --build build --target indexer_topk_fp8_check`).
// Run:
//   indexer_topk_fp8_check [--small] [--no-bench] [--bench-only] [--bench-T 8192,32768,131072]
//                          [--bench-H 32] [--bench-data spread|uniform] [--seed N] [--tol8 R]
//                          [--bench-candidates 2304,2048]   (extra C values: speed and recall on the same inputs)
//                          [--bench-bands 512,256,256/2304,256/2304s]   (rescore_band values, each optionally with
//                                                     its own C and "s" for the band scaled to the rows' keys:
//                                                     speed, recall and a validity check of the indices-only band
//                                                     re-score on the same inputs)
// Exit code: 0 all cases pass, 1 a case failed, 77 no CUDA device.
//
// Every call goes through the public entry points (flashdsa::run_quantize_fp8, run_indexer_topk with
// indexer.dtype = kFP8E4M3 and `rescore` = the bf16 tensors), on the device.
//
// Correctness, per case:
//  - quantization: the device codes and scales equal the host quantizer of include/flashdsa/types.h
//    (float_to_fp8_e4m3 of fp32(x) / (amax / 448)) bit for bit;
//  - per row, against a double CPU reference of the contract: the first min(n, K) slots hold distinct
//    keys of the row's range, the rest -1 / -inf; every returned score is the exact (bf16-input) score
//    of its key within tol; when n <= C (candidates) the selection is the exact top K (within tol);
//    otherwise, with c8 = the C-th largest FP8 score of the row and tol8 its fp32 rounding bound,
//    every returned key has score8 >= c8 - tol8 (it may be a candidate), and every key with score8 >
//    c8 + tol8 (a certain candidate) that was not returned scores exactly <= the smallest returned
//    exact score + tol (the final top K of the candidates is exact).
//  - the recall of the exact top K (double reference) is reported (mean, min row).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check_common.cuh"
#include "flashdsa/ops.h"
#include "flashdsa/types.h"
#include "sm90/indexer_topk/quantize_div.cuh"

namespace {

using flashdsa::bf16;

using flashdsa_check::DeviceBuffer;
using flashdsa_check::download;
using flashdsa_check::parallel_for;
using flashdsa_check::upload;

void check_status(const flashdsa::Status& st, const char* what) { flashdsa_check::status_or_die(st, what); }

// ---------------------------------------------------------------------------------------------
// Problems (contiguous inputs; `pad` adds unused elements to every row stride)
struct Problem {
  std::string name;
  int64_t T = 0, T_kv = 0;
  int H = 32, D = 128, K = 64, C = 0;  // C: candidates (0 = the default)
  bool relu = true;
  int pad = 0;
  int64_t q_st = 0, q_sh = 0, k_st = 0;
  std::vector<bf16> q, k;
  std::vector<float> w;  // [T, H] contiguous
  std::vector<int32_t> k_start, k_end;
  int nan_q_row = -1, nan_k_row = -1;  // NaN injected into q_idx[row, 0, 0] / k_idx[row, 0]
  int candidates() const { return C ? C : flashdsa::fp8_selection_candidates(K); }
  float q_at(int64_t t, int h, int d) const { return flashdsa::bf16_to_float(q[t * q_st + h * q_sh + d]); }
  float k_at(int64_t s, int d) const { return flashdsa::bf16_to_float(k[s * k_st + d]); }
};

// Values with the spread of trained activations: per-row scale log-uniform in [1/4, 4], three outlier
// channels 8x larger; signed weights, mostly positive.
void fill(Problem& p, std::mt19937_64& rng) {
  p.q_sh = p.D + 16 * (p.pad > 0);
  p.q_st = p.H * p.q_sh + p.pad;
  p.k_st = p.D + p.pad;
  std::uniform_real_distribution<float> uni(-1.f, 1.f), logs(-2.f, 2.f);
  auto value = [&](int d, float row_scale) { return flashdsa::float_to_bf16(uni(rng) * row_scale * (d < 3 ? 8.f : 1.f)); };
  p.q.assign(size_t(std::max<int64_t>(p.T, 1) * p.q_st), flashdsa::float_to_bf16(0.f));
  p.k.assign(size_t(std::max<int64_t>(p.T_kv, 1) * p.k_st), flashdsa::float_to_bf16(0.f));
  p.w.assign(size_t(std::max<int64_t>(p.T, 1) * p.H), 0.f);
  for (int64_t t = 0; t < p.T; ++t)
    for (int h = 0; h < p.H; ++h) {
      const float sc = std::exp2(logs(rng));
      for (int d = 0; d < p.D; ++d) p.q[t * p.q_st + h * p.q_sh + d] = value(d, sc);
      p.w[t * p.H + h] = 0.25f * (uni(rng) + 0.6f);
    }
  for (int64_t s = 0; s < p.T_kv; ++s) {
    const float sc = std::exp2(logs(rng));
    for (int d = 0; d < p.D; ++d) p.k[s * p.k_st + d] = value(d, sc);
  }
  const bf16 nan = flashdsa::float_to_bf16(std::nanf(""));
  if (p.nan_q_row >= 0) p.q[p.nan_q_row * p.q_st] = nan;
  if (p.nan_k_row >= 0) p.k[p.nan_k_row * p.k_st] = nan;
}

// Host quantizer of the contract (the CPU backend's arithmetic).
void quantize_host(const std::vector<float>& x, int D, std::vector<uint8_t>& codes, float& scale) {
  float amax = 0.f;
  bool finite = true;
  for (float v : x) finite = finite && std::isfinite(v), amax = std::max(amax, std::fabs(v));
  scale = finite ? amax / flashdsa::kFp8E4M3Max : std::nanf("");
  if (finite && !(scale > 0.f)) scale = 1.f;
  codes.resize(D);
  for (int i = 0; i < D; ++i) codes[i] = finite ? flashdsa::float_to_fp8_e4m3(x[i] / scale).bits : 0x7f;
}

float e4m3(uint8_t c) { return flashdsa::fp8_e4m3_to_float(flashdsa::fp8_e4m3{c}); }

// ---------------------------------------------------------------------------------------------
// One run: quantize + FP8 selection on the device, outputs on the host.
struct Run {
  std::vector<uint8_t> q8, k8;  // [T * H, D], [T_kv, D]
  std::vector<float> qs, ks;    // [T * H], [T_kv]
  std::vector<int32_t> idx;     // [T, K]
  std::vector<float> scores;    // [T, K]
};

flashdsa::QuantizeFp8Params quantize_params(const void* x, int64_t N0, int N1, int D, int64_t s0, int64_t s1, void* out,
                                            float* scale) {
  flashdsa::QuantizeFp8Params qp;
  qp.device = flashdsa::Device::kCUDA;
  qp.dtype = flashdsa::DType::kBF16;
  qp.x = x;
  qp.N0 = N0, qp.N1 = N1, qp.D = D, qp.stride0 = s0, qp.stride1 = s1;
  qp.out = out;
  qp.scale = scale;
  return qp;
}

// The FP8 indexer_topk params over device buffers (q8/k8 contiguous).
flashdsa::IndexerTopkParams fp8_params(int64_t T, int64_t T_kv, int H, int D, int K, int C, bool relu, const void* q8,
                                       const void* k8, const float* qs, const float* ks, const void* q, int64_t q_st,
                                       int64_t q_sh, const void* k, int64_t k_st, const float* w, const int32_t* kb,
                                       const int32_t* ke, int32_t* idx, float* sc) {
  flashdsa::IndexerTopkParams prm;
  prm.device = flashdsa::Device::kCUDA;
  prm.rescore.dtype = flashdsa::DType::kBF16;
  prm.rescore.q_idx = q;
  prm.rescore.k_idx = k;
  prm.rescore.weights = w;
  prm.rescore.H_I = H, prm.rescore.D_I = D, prm.rescore.relu = relu;
  prm.rescore.q_idx_stride_t = q_st, prm.rescore.q_idx_stride_h = q_sh, prm.rescore.k_idx_stride_t = k_st;
  prm.rescore.weights_stride_t = H;
  prm.indexer = prm.rescore;
  prm.indexer.dtype = flashdsa::DType::kFP8E4M3;
  prm.indexer.q_idx = q8;
  prm.indexer.k_idx = k8;
  prm.indexer.q_idx_scale = qs;
  prm.indexer.k_idx_scale = ks;
  prm.indexer.q_idx_stride_t = int64_t(H) * D, prm.indexer.q_idx_stride_h = D, prm.indexer.k_idx_stride_t = D;
  prm.candidates = C;
  prm.k_start = kb, prm.k_end = ke;
  prm.indices = idx, prm.scores = sc;
  prm.T = T, prm.T_kv = T_kv, prm.K = K;
  return prm;
}

// band > 0: the band re-score (rescore_band, indices only: no scores requested; out.scores stays unset); scaled: the
// band scaled to each row's keys (rescore_band_scaled).
bool run_gpu(const Problem& p, Run& out, int band = 0, bool scaled = false) {
  DeviceBuffer q(p.q.size() * 2), k(p.k.size() * 2), w(p.w.size() * 4);
  DeviceBuffer q8(size_t(p.T) * p.H * p.D + 16), k8(size_t(p.T_kv) * p.D + 16);
  DeviceBuffer qs(size_t(p.T) * p.H * 4 + 16), ks(size_t(p.T_kv) * 4 + 16);
  DeviceBuffer kb(p.T * 4 + 16), ke(p.T * 4 + 16), idx(p.T * p.K * 4 + 16), sc(p.T * p.K * 4 + 16);
  upload(q, p.q), upload(k, p.k), upload(w, p.w), upload(kb, p.k_start), upload(ke, p.k_end);
  FLASHDSA_CHECK_CUDA(cudaMemset(idx.ptr, 0x7b, idx.bytes));
  FLASHDSA_CHECK_CUDA(cudaMemset(sc.ptr, 0x7b, sc.bytes));
  check_status(flashdsa::run_quantize_fp8(quantize_params(q.ptr, p.T, p.H, p.D, p.q_st, p.q_sh, q8.ptr, qs.as<float>())),
               "quantize q");
  check_status(flashdsa::run_quantize_fp8(quantize_params(k.ptr, p.T_kv, 1, p.D, p.k_st, 0, k8.ptr, ks.as<float>())),
               "quantize k");
  flashdsa::IndexerTopkParams prm =
      fp8_params(p.T, p.T_kv, p.H, p.D, p.K, p.C, p.relu, q8.ptr, k8.ptr, qs.as<float>(), ks.as<float>(), q.ptr, p.q_st,
                 p.q_sh, k.ptr, p.k_st, w.as<float>(), kb.as<int32_t>(), ke.as<int32_t>(), idx.as<int32_t>(),
                 sc.as<float>());
  prm.rescore_band = band;
  prm.rescore_band_scaled = scaled;
  if (band > 0) prm.scores = nullptr;
  const size_t ws_bytes = flashdsa::indexer_topk_workspace_size(prm);
  DeviceBuffer ws(ws_bytes);
  prm.workspace = ws.ptr, prm.workspace_bytes = ws.bytes;
  const flashdsa::Status st = flashdsa::run_indexer_topk(prm);
  if (!st.ok()) {
    std::printf("    run_indexer_topk failed: %s\n", st.message().c_str());
    return false;
  }
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  out.q8 = download<uint8_t>(q8.ptr, size_t(p.T) * p.H * p.D);
  out.k8 = download<uint8_t>(k8.ptr, size_t(p.T_kv) * p.D);
  out.qs = download<float>(qs.ptr, size_t(p.T) * p.H);
  out.ks = download<float>(ks.ptr, size_t(p.T_kv));
  out.idx = download<int32_t>(idx.ptr, size_t(p.T) * p.K);
  if (band == 0) out.scores = download<float>(sc.ptr, size_t(p.T) * p.K);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Checks
int64_t quantization_mismatches(const Problem& p, const Run& r) {
  int64_t bad = 0;
  std::vector<float> x(p.D);
  std::vector<uint8_t> codes;
  float scale = 0;
  auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  for (int64_t row = 0; row < p.T * p.H; ++row) {
    const int64_t t = row / p.H;
    const int h = int(row % p.H);
    for (int d = 0; d < p.D; ++d) x[d] = p.q_at(t, h, d);
    quantize_host(x, p.D, codes, scale);
    bad += !same(scale, r.qs[row]) || std::memcmp(codes.data(), &r.q8[row * p.D], p.D) != 0;
  }
  for (int64_t s = 0; s < p.T_kv; ++s) {
    for (int d = 0; d < p.D; ++d) x[d] = p.k_at(s, d);
    quantize_host(x, p.D, codes, scale);
    bad += !same(scale, r.ks[s]) || std::memcmp(codes.data(), &r.k8[s * p.D], p.D) != 0;
  }
  return bad;
}

// The quantizer on rows of every magnitude (D = 128, contiguous [rows / 4, 4, 128] and the same rows with 8 unused
// elements after every 4: both CUDA kernels of D = 128): row i has max |x| = 2^e_i (e from -133 to 127, bf16 subnormals included), with
// signed zeros, elements down to 2^-100 of the maximum, and NaN / Inf rows; codes and scales against the host
// quantizer, bitwise. Then quantize_div against __fdiv_rn on random operands (division_check_kernel).
// SplitMix64's finalizer of i + seed: the check's random bits on the device (division_check_kernel, hash_uniform).
__device__ __forceinline__ uint64_t mix64(uint64_t i, uint64_t seed) {
  uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void division_check_kernel(uint64_t n, uint64_t seed, unsigned long long* bad) {
  using namespace flashdsa::sm90::indexer_topk_impl;
  unsigned long long bits_bad = 0, code_bad = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t z = mix64(i, seed);
    // b: a random 24-bit mantissa, exponent in [-20, 99]; x: a random bf16 mantissa and sign, exponent from b's + 9
    // down to b's - 110 (every 64th x a zero).
    const int eb = static_cast<int>((z >> 8) % 120) - 20;
    const float b = ldexpf(1.f + static_cast<float>(z & 0x7fffffu) * 0x1p-23f, eb);
    const int ex = eb + 9 - static_cast<int>((z >> 16) % 120);
    float x = ldexpf(1.f + static_cast<float>((z >> 24) & 0x7fu) * 0x1p-7f, ex);
    if (((z >> 40) & 63u) == 0u) x = 0.f;
    if ((z >> 63) != 0u) x = -x;
    if (!quantize_scale_in_fast_range(b)) continue;
    const float want = __fdiv_rn(x, b), got = quantize_div(x, b, quantize_recip(b));
    // Bitwise the same for quotients >= 2^-80 in magnitude (and zeros); below that, the same code.
    if (__float_as_uint(want) != __float_as_uint(got) && (fabsf(want) >= 0x1p-80f || x == 0.f)) ++bits_bad;
    const uint16_t cw = __nv_cvt_float2_to_fp8x2(make_float2(want, want), __NV_SATFINITE, __NV_E4M3);
    const uint16_t cg = __nv_cvt_float2_to_fp8x2(make_float2(got, got), __NV_SATFINITE, __NV_E4M3);
    code_bad += cw != cg;
  }
  if (bits_bad) atomicAdd(bad, bits_bad);
  if (code_bad) atomicAdd(bad + 1, code_bad);
}

bool check_quantizer_edges(std::mt19937_64& rng) {
  const int D = 128, N1 = 4;
  std::vector<int> exps;
  for (int e = -133; e <= 127; e += 3) exps.push_back(e);
  for (int e : {-21, -20, -19, -18, 99, 100, 101, 108, 109, 110}) exps.push_back(e);
  const int64_t rows = int64_t((exps.size() + 4 + N1 - 1) / N1) * N1;  // + NaN, Inf, zero, -0 rows
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> x(size_t(rows) * D, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = &x[size_t(r) * D];
    if (r < int64_t(exps.size())) {
      const int e = exps[size_t(r)];
      for (int d = 0; d < D; ++d) {
        float v = std::ldexp(uni(rng), e);
        if (d % 17 == 5) v = std::ldexp(uni(rng), e - 20 - int(d % 81));  // far below the maximum
        if (d % 29 == 3) v = (d % 2) ? -0.f : 0.f;
        row[d] = v;
      }
      row[(r * 7) % D] = std::ldexp(r % 2 ? -1.f : 1.f, e);  // the maximum, exactly 2^e
    } else {
      const int64_t k = r - int64_t(exps.size());
      for (int d = 0; d < D; ++d) row[d] = k == 3 ? -0.f : (k == 2 ? 0.f : uni(rng));
      if (k == 0) row[9] = std::nanf("");
      if (k == 1) row[100] = -INFINITY;
    }
  }
  std::vector<bf16> xb(x.size());
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = flashdsa::float_to_bf16(x[i]), xr[i] = flashdsa::bf16_to_float(xb[i]);
  bool ok = true;
  // pad 0: [rows / 4, 4, 128] contiguous, one uniform row stride: the 8-lanes-per-row kernel; pad 8: 8 unused elements
  // after every 4 rows (outer stride 520, inner 128: no uniform row stride): the 4-elements-per-lane kernel.
  for (int pad : {0, 8}) {
    const int64_t outer = N1 * D + pad;
    std::vector<bf16> xs(size_t(rows / N1) * outer, flashdsa::float_to_bf16(0.f));
    for (int64_t r = 0; r < rows; ++r)
      std::copy(&xb[size_t(r) * D], &xb[size_t(r) * D] + D, &xs[size_t(r / N1) * outer + size_t(r % N1) * D]);
    DeviceBuffer dx(xs.size() * 2), d8(size_t(rows) * D), ds(size_t(rows) * 4);
    upload(dx, xs);
    check_status(flashdsa::run_quantize_fp8(quantize_params(dx.ptr, rows / N1, N1, D, outer, D, d8.ptr, ds.as<float>())),
                 "quantize (edges)");
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    const auto codes = download<uint8_t>(d8.ptr, size_t(rows) * D);
    const auto scales = download<float>(ds.ptr, size_t(rows));
    int64_t bad = 0;
    std::vector<float> row(D);
    std::vector<uint8_t> want;
    float scale = 0;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(&xr[size_t(r) * D], &xr[size_t(r) * D] + D, row.begin());
      quantize_host(row, D, want, scale);
      const bool same_scale = (std::isnan(scale) && std::isnan(scales[size_t(r)])) ||
                              std::memcmp(&scale, &scales[size_t(r)], 4) == 0;
      bad += !same_scale || std::memcmp(want.data(), &codes[size_t(r) * D], D) != 0;
    }
    std::printf("  %-34s %s (%lld of %lld rows differ)\n", pad ? "quantize edges, 4 per lane" : "quantize edges, rows128",
                bad ? "FAIL" : "PASS", (long long)bad, (long long)rows);
    ok = ok && bad == 0;
  }
  DeviceBuffer dbad(16);
  FLASHDSA_CHECK_CUDA(cudaMemset(dbad.ptr, 0, 16));
  const uint64_t n = uint64_t(1) << 30;
  division_check_kernel<<<1056, 256>>>(n, rng(), dbad.as<unsigned long long>());
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  const auto bad = download<unsigned long long>(dbad.ptr, 2);
  std::printf("  %-34s %s (%llu bit / %llu code mismatches of 2^30)\n", "quantize_div vs __fdiv_rn",
              bad[0] || bad[1] ? "FAIL" : "PASS", bad[0], bad[1]);
  return ok && bad[0] == 0 && bad[1] == 0;
}

struct RowResult {
  bool ok = true;
  std::string why;
  double recall = 1.0;  // of the exact top K
  bool counted = false;
};

// The keys as floats, decoded once per problem: kf = bf16 k_idx, k8f = e4m3 codes (unscaled).
struct KeyFloats {
  std::vector<float> kf, k8f;  // [T_kv, D]
};

KeyFloats key_floats(const Problem& p, const Run& r) {
  KeyFloats k;
  k.kf.resize(size_t(p.T_kv) * p.D);
  k.k8f.resize(size_t(p.T_kv) * p.D);
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = e4m3(static_cast<uint8_t>(c));
  for (int64_t s = 0; s < p.T_kv; ++s)
    for (int d = 0; d < p.D; ++d) {
      k.kf[s * p.D + d] = p.k_at(s, d);
      k.k8f[s * p.D + d] = lut[r.k8[s * p.D + d]];
    }
  return k;
}

// The FP8 tolerance relative to the row's bound (--tol8 R for every case). By default it follows the
// walk that runs the case: 0.05 at D_I = 128 (fp8_kernel_v2.cuh: the packed bf16x2 epilogue's error
// bound, docs/kernels/indexer_topk.md "FP8 selection pass"), 2e-4 at D_I = 64 (fp8_kernel.cuh: the f32
// epilogue).
double g_tol8_rel = -1.0;  // < 0: by D_I
double tol8_rel(int D) { return g_tol8_rel >= 0 ? g_tol8_rel : D == 128 ? 0.05 : 2e-4; }

RowResult check_row(const Problem& p, const Run& r, const KeyFloats& keys, int64_t t, double max_k_norm,
                    double max_k8_norm) {
  RowResult res;
  auto fail = [&res](const std::string& why) {
    if (res.ok) res.why = why;
    res.ok = false;
  };
  const int64_t s0 = p.k_start[t], n = p.k_end[t] - s0;
  const int64_t expect = std::min<int64_t>(n, p.K);
  const int C = p.candidates();
  // Exact and FP8 scores of the row (double), with their tolerances.
  std::vector<double> exact(n), fp8(n);
  double bound = 0, bound8 = 0;
  std::vector<double> qf(size_t(p.H) * p.D), q8(size_t(p.H) * p.D), w8(p.H);
  for (int h = 0; h < p.H; ++h) {
    double qn = 0, qn8 = 0;
    w8[h] = double(p.w[t * p.H + h]) * r.qs[t * p.H + h];
    for (int d = 0; d < p.D; ++d) {
      qf[h * p.D + d] = p.q_at(t, h, d);
      q8[h * p.D + d] = e4m3(r.q8[(t * p.H + h) * p.D + d]);
      qn += qf[h * p.D + d] * qf[h * p.D + d];
      qn8 += q8[h * p.D + d] * q8[h * p.D + d];
    }
    bound += std::fabs(p.w[t * p.H + h]) * std::sqrt(qn) * max_k_norm;
    bound8 += std::fabs(w8[h]) * std::sqrt(qn8) * max_k8_norm;
  }
  // The FP8 MMA accumulates with less than fp32 precision (about 2^-14 relative per addition on
  // Hopper), so the FP8 tolerance is looser than the fp32 one of the exact scores.
  const double tol = 4e-6 * bound, tol8 = tol8_rel(p.D) * bound8;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = s0 + i;
    const float* kf = &keys.kf[s * p.D];
    const float* k8f = &keys.k8f[s * p.D];
    double e = 0, e8 = 0;
    for (int h = 0; h < p.H; ++h) {
      double dot = 0, dot8 = 0;
      for (int d = 0; d < p.D; ++d) {
        dot += qf[h * p.D + d] * kf[d];
        dot8 += q8[h * p.D + d] * k8f[d];
      }
      e += double(p.w[t * p.H + h]) * (p.relu ? (dot > 0 || std::isnan(dot) ? dot : 0.0) : dot);
      e8 += w8[h] * (p.relu ? (dot8 > 0 || std::isnan(dot8) ? dot8 : 0.0) : dot8);
    }
    exact[i] = e;
    fp8[i] = e8 * r.ks[s];
  }
  // NaN-aware descending order (NaN first).
  auto desc = [](double a, double b) { return std::isnan(a) ? !std::isnan(b) : (!std::isnan(b) && a > b); };
  const int32_t* idx = &r.idx[t * p.K];
  const float* sc = &r.scores[t * p.K];
  std::vector<char> picked(n, 0);
  double min_ret = INFINITY;
  for (int j = 0; j < p.K; ++j) {
    if (j >= expect) {
      if (idx[j] != -1 || !(std::isinf(sc[j]) && sc[j] < 0)) fail("slot " + std::to_string(j) + " should be empty");
      continue;
    }
    const int64_t s = idx[j];
    if (s < s0 || s >= s0 + n) {
      fail("key " + std::to_string(s) + " outside the range");
      continue;
    }
    if (picked[s - s0]) fail("key " + std::to_string(s) + " selected twice");
    picked[s - s0] = 1;
    const double ex = exact[s - s0];
    if (std::isnan(ex) != std::isnan(sc[j]) || (!std::isnan(ex) && std::fabs(sc[j] - ex) > tol))
      fail("score of key " + std::to_string(s) + ": " + std::to_string(sc[j]) + " vs exact " + std::to_string(ex));
    if (!std::isnan(ex)) min_ret = std::min(min_ret, ex);
  }
  if (!res.ok || n == 0) return res;
  std::vector<double> sorted_exact = exact;
  std::sort(sorted_exact.begin(), sorted_exact.end(), desc);
  const double kth = sorted_exact[expect - 1];
  if (n <= C) {  // every visible key is a candidate: the exact top K
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(exact[i]) || std::isnan(kth)) continue;
      if (picked[i] && exact[i] < kth - tol) fail("selected key below the K-th exact score");
      if (!picked[i] && exact[i] > kth + tol) fail("key above the K-th exact score left out");
    }
  } else {
    std::vector<double> sorted8 = fp8;
    std::sort(sorted8.begin(), sorted8.end(), desc);
    const double c8 = sorted8[C - 1];
    for (int64_t i = 0; i < n && !std::isnan(c8); ++i) {
      if (std::isnan(fp8[i])) continue;
      if (picked[i] && fp8[i] < c8 - tol8) fail("returned key " + std::to_string(s0 + i) + " is not an FP8 candidate");
      if (!picked[i] && fp8[i] > c8 + tol8 && !std::isnan(exact[i]) && exact[i] > min_ret + tol)
        fail("candidate key " + std::to_string(s0 + i) + " beats a returned key but was left out");
    }
  }
  int64_t hit = 0;
  for (int64_t i = 0; i < n; ++i) hit += picked[i] && !std::isnan(kth) && exact[i] >= kth;
  res.recall = std::min(1.0, double(hit) / double(expect));
  res.counted = !std::isnan(kth);  // a NaN row has no top K to recall
  return res;
}

double max_norm(int64_t rows, int D, const std::function<double(int64_t, int)>& at) {
  double m = 0;
  for (int64_t s = 0; s < rows; ++s) {
    double n = 0;
    for (int d = 0; d < D; ++d) n += at(s, d) * at(s, d);
    if (std::isfinite(n)) m = std::max(m, std::sqrt(n));
  }
  return m;
}

// Whether an output row of K slots holds n distinct keys in [lo, hi), then -1 (the band re-score's rows).
bool valid_index_row(const int32_t* row, int64_t n, int K, int64_t lo, int64_t hi) {
  std::vector<int32_t> v(row, row + n);
  std::sort(v.begin(), v.end());
  bool ok = std::adjacent_find(v.begin(), v.end()) == v.end() && (n == 0 || (v.front() >= lo && v.back() < hi));
  for (int64_t j = n; j < K; ++j) ok = ok && row[j] == -1;
  return ok;
}

// The band re-score (D_I = 128, b = K / 4; scaled: the band scaled to each row's keys) on the same problem: every row
// holds min(K, visible) distinct visible keys, then -1; its overlap with the full re-score's row (which the band rule
// may differ from only near the K-th score) is reported, and a row sharing less than half of it fails.
bool check_band(const Problem& p, const Run& full, bool scaled) {
  if (p.D != 128) return true;
  Run rb;
  const std::string name = p.name + (scaled ? " band scaled" : " band");
  if (!run_gpu(p, rb, p.K / 4, scaled)) {
    std::printf("  %-34s FAIL (band launch)\n", name.c_str());
    return false;
  }
  int64_t bad = 0, first = -1, counted = 0;
  double overlap_sum = 0, overlap_min = 1;
  for (int64_t t = 0; t < p.T; ++t) {
    const int64_t n = std::min<int64_t>(p.K, p.k_end[t] - p.k_start[t]);
    bool ok = valid_index_row(&rb.idx[t * p.K], n, p.K, p.k_start[t], p.k_end[t]);
    std::vector<int32_t> a(rb.idx.begin() + t * p.K, rb.idx.begin() + t * p.K + n);
    std::vector<int32_t> b(full.idx.begin() + t * p.K, full.idx.begin() + t * p.K + n);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    // A NaN key is a sure candidate of every row that sees it (NaN first in the FP8 order).
    if (p.nan_k_row >= p.k_start[t] && p.nan_k_row < p.k_end[t] && t != p.nan_q_row)
      ok = ok && std::binary_search(a.begin(), a.end(), p.nan_k_row);
    // The NaN query row: every FP8 and exact score is NaN, which keys it keeps is unspecified (valid and distinct
    // is all the contract asks); no overlap to measure.
    if (n > 0 && t != p.nan_q_row) {
      std::vector<int32_t> common;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
      const double ov = double(common.size()) / double(n);
      ok = ok && ov >= 0.5;
      ++counted, overlap_sum += ov, overlap_min = std::min(overlap_min, ov);
    }
    if (!ok && bad++ == 0) first = t;
  }
  std::printf("  %-34s T %5lld b %5d  overlap with the full re-score mean %.5f min %.4f  %s\n",
              name.c_str(), (long long)p.T, p.K / 4, counted ? overlap_sum / counted : 1.0, overlap_min,
              bad == 0 ? "PASS" : "FAIL");
  if (first >= 0) std::printf("    %lld bad rows; first: row %lld\n", (long long)bad, (long long)first);
  return bad == 0;
}

bool check_problem(const Problem& p) {
  Run r;
  if (!run_gpu(p, r)) {
    std::printf("  %-34s FAIL (launch)\n", p.name.c_str());
    return false;
  }
  const int64_t qbad = quantization_mismatches(p, r);
  const double kn = max_norm(p.T_kv, p.D, [&](int64_t s, int d) { return double(p.k_at(s, d)); });
  const double kn8 = max_norm(p.T_kv, p.D, [&](int64_t s, int d) {
    return double(e4m3(r.k8[s * p.D + d])) * (std::isfinite(r.ks[s]) ? r.ks[s] : 0.0);
  });
  // kn8 bounds b[s] |k^_s|: scale the per-row FP8 bound by it (the key scale multiplies after the sum).
  const KeyFloats keys = key_floats(p, r);
  std::vector<RowResult> rows(size_t(p.T));
  parallel_for(p.T, [&](int64_t t) { rows[t] = check_row(p, r, keys, t, kn, kn8); });
  int64_t bad = 0, first = -1, counted = 0;
  double recall_sum = 0, recall_min = 1;
  for (int64_t t = 0; t < p.T; ++t) {
    if (!rows[t].ok && bad++ == 0) first = t;
    if (rows[t].counted) ++counted, recall_sum += rows[t].recall, recall_min = std::min(recall_min, rows[t].recall);
  }
  // NaN rules: a NaN query row reports NaN scores only; a NaN key is selected by every row that sees it.
  std::string nan_note;
  if (p.nan_q_row >= 0 && p.nan_q_row < p.T) {
    const int64_t t = p.nan_q_row;
    const int64_t n = std::min<int64_t>(p.K, p.k_end[t] - p.k_start[t]);
    for (int64_t j = 0; j < n; ++j)
      if (!std::isnan(r.scores[t * p.K + j])) bad++, nan_note = " (NaN query row reports a finite score)";
  }
  if (p.nan_k_row >= 0) {
    for (int64_t t = 0; t < p.T; ++t) {
      if (p.nan_k_row < p.k_start[t] || p.nan_k_row >= p.k_end[t] || t == p.nan_q_row) continue;
      const int32_t* idx = &r.idx[t * p.K];
      if (std::find(idx, idx + p.K, p.nan_k_row) == idx + p.K) bad++, nan_note = " (a NaN key was not selected)";
    }
  }
  const bool pass = bad == 0 && qbad == 0;
  std::printf("  %-34s T %5lld C %5d  quant mismatches %lld  recall mean %.5f min %.4f  %s%s\n", p.name.c_str(),
              (long long)p.T, p.candidates(), (long long)qbad, counted ? recall_sum / counted : 1.0, recall_min,
              pass ? "PASS" : "FAIL", nan_note.c_str());
  if (first >= 0) std::printf("    %lld bad rows; first: row %lld: %s\n", (long long)bad, (long long)first, rows[first].why.c_str());
  const bool band_ok = check_band(p, r, false);
  return check_band(p, r, true) && band_ok && pass;
}

std::vector<Problem> problems(bool small, std::mt19937_64& rng) {
  std::vector<Problem> ps;
  auto add = [&](const std::string& name, int H, int D, int K, bool relu, flashdsa_check::KeyRanges r, int C = 0,
                 int pad = 0, int nan_q = -1, int nan_k = -1) {
    Problem p;
    p.name = name, p.H = H, p.D = D, p.K = K, p.relu = relu, p.C = C, p.pad = pad;
    p.T = r.T, p.T_kv = r.T_kv, p.k_start = std::move(r.k_start), p.k_end = std::move(r.k_end);
    p.nan_q_row = nan_q, p.nan_k_row = nan_k;
    fill(p, rng);
    ps.push_back(std::move(p));
  };
  using flashdsa_check::cp_zigzag_ranges;
  using flashdsa_check::thd_causal_ranges;
  if (small) {
    add("thd H32 D128 K64 relu", 32, 128, 64, true, thd_causal_ranges({37, 700, 129}));
    add("cp2 H64 D64 K64 linear", 64, 64, 64, false, cp_zigzag_ranges({1024, 512}, 2, 1));
    return ps;
  }
  add("thd H32 D128 K64 relu", 32, 128, 64, true, thd_causal_ranges({37, 301, 129, 555, 1000, 3}));
  add("thd H64 D128 K128 linear", 64, 128, 128, false, thd_causal_ranges({1, 1500, 63, 65}));
  add("causal H32 D64 K256 relu", 32, 64, 256, true, thd_causal_ranges({3000}));
  add("causal H64 D64 K64 relu C=K", 64, 64, 64, true, thd_causal_ranges({2000}), 64);
  add("causal H32 D128 K2048 relu", 32, 128, 2048, true, thd_causal_ranges({4500}));
  add("causal H64 D128 K128 relu C=1024", 64, 128, 128, true, thd_causal_ranges({3000}), 1024);
  // lists longer than the register-resident select takes (cap = C + 1024 = 5632): the streamed cuts, and the band's
  // warp selects on lists of more than 4096 entries
  add("causal H32 D128 K1024 relu C=4608", 32, 128, 1024, true, thd_causal_ranges({5200}), 4608);
  add("cp2 H64 D64 K64 linear", 64, 64, 64, false, cp_zigzag_ranges({2048, 512}, 2, 1));
  add("cp4 H32 D128 K128 relu", 32, 128, 128, true, cp_zigzag_ranges({4096}, 4, 2));
  add("strided H32 D128 K64 relu", 32, 128, 64, true, thd_causal_ranges({900, 450}), 0, 16);
  add("nan H32 D64 K64 relu", 32, 64, 64, true, thd_causal_ranges({1200}), 0, 0, 1100, 700);
  // the D_I = 128 walk: the NaN query row shares its warpgroup with three other rows (1100 = 8 * 137 + 4), which must
  // stay exact (its head sums are an MMA over the warpgroup's columns)
  add("nan H32 D128 K64 relu", 32, 128, 64, true, thd_causal_ranges({1200}), 0, 0, 1100, 700);
  add("nan H64 D128 K128 linear", 64, 128, 128, false, thd_causal_ranges({1000}), 0, 0, 901, 300);
  flashdsa_check::KeyRanges none;  // rows but no keys (T_kv = 0): every row is -1 / -inf
  none.T = 40;
  none.k_start.assign(40, 0), none.k_end.assign(40, 0);
  add("no keys H32 D128 K64 relu", 32, 128, 64, true, std::move(none));
  return ps;
}

// ---------------------------------------------------------------------------------------------
// Benchmark: one causal sequence, D = 128, K = 2048: bf16 selection vs FP8 (quantize + select) and
// the FP8 selection alone, recall of the bf16 top K (sampled rows).
__device__ __forceinline__ float hash_uniform(uint64_t i, uint64_t seed) {
  return float(mix64(i, seed) >> 40) * (2.f / 16777216.f) - 1.f;
}
// Rows of D values: uniform in [-1, 1]; with `spread`, times a per-row factor 2^[-2, 2] and 8x on
// three outlier channels.
__global__ void fill_rows(__nv_bfloat16* x, int64_t rows, int D, uint64_t seed, bool spread) {
  const int64_t n = rows * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = hash_uniform(i, seed);
    if (spread) v *= exp2f(2.f * hash_uniform(i / D, seed ^ 0x5bd1e995ull)) * ((i % D) < 3 ? 8.f : 1.f);
    x[i] = __float2bfloat16(v);
  }
}
__global__ void fill_weights(float* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = 0.25f * (hash_uniform(i, seed * 7 + 1) + 0.6f);
}

// One --bench-bands entry: the band b, its C (0: the default) and whether it is scaled to the rows' keys.
struct BandSpec {
  int64_t b, C;
  bool scaled;
};

// cands: extra candidate counts C (fp8_candidates) timed on the same inputs after the default, each with
// its recall (the speed / recall trade-off of the C - K slack).
bool benchmark(uint64_t seed, const std::vector<int64_t>& Ts, const std::vector<int>& Hs, bool spread,
               const std::vector<int64_t>& cands, const std::vector<BandSpec>& bands) {
  bool all_band_ok = true;
  const int D = 128, K = 2048;
  std::printf("\nBenchmark: one causal sequence, D_I = %d, K = %d, relu, %s data, median of 10 (CUDA events)\n", D, K,
              spread ? "spread" : "uniform");
  std::printf("  %-3s %7s %10s %12s %12s %9s %9s %12s %12s %10s\n", "H_I", "T", "bf16 ms", "fp8 ms (all)",
              "fp8 sel ms", "quant ms", "speedup", "recall mean", "recall min", "rows");
  for (int H : Hs) {
    for (int64_t T : Ts) {
      DeviceBuffer q(size_t(T) * H * D * 2), k(size_t(T) * D * 2), w(size_t(T) * H * 4);
      DeviceBuffer q8(size_t(T) * H * D), k8(size_t(T) * D), qs(size_t(T) * H * 4), ks(size_t(T) * 4);
      DeviceBuffer kb(size_t(T) * 4), ke(size_t(T) * 4);
      DeviceBuffer idx(size_t(T) * K * 4), sc(size_t(T) * K * 4), idx8(size_t(T) * K * 4), sc8(size_t(T) * K * 4);
      fill_rows<<<1024, 256>>>(q.as<__nv_bfloat16>(), T * H, D, seed + 1, spread);
      fill_rows<<<1024, 256>>>(k.as<__nv_bfloat16>(), T, D, seed + 2, spread);
      fill_weights<<<1024, 256>>>(w.as<float>(), T * H, seed + 3);
      const flashdsa_check::KeyRanges causal = flashdsa_check::thd_causal_ranges({static_cast<int>(T)});  // one sequence
      upload(kb, causal.k_start);
      upload(ke, causal.k_end);
      FLASHDSA_CHECK_CUDA(cudaGetLastError());

      flashdsa::IndexerTopkParams bf = fp8_params(T, T, H, D, K, 0, true, nullptr, nullptr, nullptr, nullptr, q.ptr,
                                                  int64_t(H) * D, D, k.ptr, D, w.as<float>(), kb.as<int32_t>(),
                                                  ke.as<int32_t>(), idx.as<int32_t>(), sc.as<float>());
      bf.indexer = bf.rescore;  // the bf16 selection
      bf.check_ranges = false;
      flashdsa::IndexerTopkParams f8 = fp8_params(T, T, H, D, K, 0, true, q8.ptr, k8.ptr, qs.as<float>(), ks.as<float>(),
                                                  q.ptr, int64_t(H) * D, D, k.ptr, D, w.as<float>(), kb.as<int32_t>(),
                                                  ke.as<int32_t>(), idx8.as<int32_t>(), sc8.as<float>());
      f8.check_ranges = false;
      const auto qq = quantize_params(q.ptr, T, H, D, int64_t(H) * D, D, q8.ptr, qs.as<float>());
      const auto qk = quantize_params(k.ptr, T, 1, D, D, 0, k8.ptr, ks.as<float>());
      DeviceBuffer ws_bf(flashdsa::indexer_topk_workspace_size(bf)), ws_f8(flashdsa::indexer_topk_workspace_size(f8));
      bf.workspace = ws_bf.ptr, bf.workspace_bytes = ws_bf.bytes;
      f8.workspace = ws_f8.ptr, f8.workspace_bytes = ws_f8.bytes;
      check_status(flashdsa::run_indexer_topk(bf), "bf16 indexer_topk");
      check_status(flashdsa::run_quantize_fp8(qq), "quantize q");
      check_status(flashdsa::run_quantize_fp8(qk), "quantize k");
      check_status(flashdsa::run_indexer_topk(f8), "fp8 indexer_topk");
      FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());

      const double ms_bf = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(bf); }, 0, 10);
      const double ms_q = flashdsa_check::median_ms(
          [&] {
            (void)flashdsa::run_quantize_fp8(qq);
            (void)flashdsa::run_quantize_fp8(qk);
          },
          0, 10);
      const double ms_sel = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(f8); }, 0, 10);
      const double ms_all = ms_q + ms_sel;

      // Recall of the bf16 top K over sampled rows (every `step`-th, plus the last): mean and min row.
      const int64_t step = std::max<int64_t>(1, T / 2048);
      std::vector<int64_t> rows;
      for (int64_t t = 0; t < T; t += step) rows.push_back(t);
      rows.push_back(T - 1);
      auto recall = [&](double& mean, double& mn) {
        double sum = 0;
        mn = 1;
        for (int64_t t : rows) {
          auto a = download<int32_t>(idx.as<int32_t>() + t * K, K);
          auto b = download<int32_t>(idx8.as<int32_t>() + t * K, K);
          const int64_t n = std::min<int64_t>(K, t + 1);
          std::sort(a.begin(), a.begin() + n);
          std::sort(b.begin(), b.begin() + n);
          std::vector<int32_t> common;
          std::set_intersection(a.begin(), a.begin() + n, b.begin(), b.begin() + n, std::back_inserter(common));
          const double rc = double(common.size()) / double(n);
          sum += rc, mn = std::min(mn, rc);
        }
        mean = sum / rows.size();
      };
      double rmean = 1, rmin = 1;
      recall(rmean, rmin);
      std::printf("  %-3d %7lld %10.3f %12.3f %12.3f %9.3f %8.2fx %12.5f %12.4f %10zu\n", H, (long long)T, ms_bf, ms_all,
                  ms_sel, ms_q, ms_bf / ms_all, rmean, rmin, rows.size());
      for (int64_t c : cands) {  // same inputs and workspace layout rules; C changes only the cut and re-score
        flashdsa::IndexerTopkParams fc = f8;
        fc.candidates = static_cast<int>(c);
        DeviceBuffer ws_c(flashdsa::indexer_topk_workspace_size(fc));
        fc.workspace = ws_c.ptr, fc.workspace_bytes = ws_c.bytes;
        check_status(flashdsa::run_indexer_topk(fc), "fp8 indexer_topk (candidates)");
        FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
        const double ms_c = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(fc); }, 0, 10);
        const double ms_d = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(f8); }, 0, 10);
        check_status(flashdsa::run_indexer_topk(fc), "fp8 indexer_topk (candidates)");  // idx8 of this C
        FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
        recall(rmean, rmin);
        std::printf("  %-3d %7lld   candidates %5lld: fp8 sel ms %.3f (default again %.3f: %.3fx) "
                    "recall mean %.5f min %.4f\n", H, (long long)T, (long long)c, ms_c, ms_d, ms_d / ms_c, rmean, rmin);
      }
      for (const auto& [b, band_c, scaled] : bands) {  // the band re-score (indices only) on the same inputs
        flashdsa::IndexerTopkParams fb = f8;
        fb.rescore_band = static_cast<int>(b);
        fb.rescore_band_scaled = scaled;
        if (band_c > 0) fb.candidates = static_cast<int>(band_c);
        fb.scores = nullptr;
        DeviceBuffer ws_b(flashdsa::indexer_topk_workspace_size(fb));
        fb.workspace = ws_b.ptr, fb.workspace_bytes = ws_b.bytes;
        check_status(flashdsa::run_indexer_topk(fb), "fp8 indexer_topk (band)");
        FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
        const double ms_b = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(fb); }, 0, 10);
        const double ms_d = flashdsa_check::median_ms([&] { (void)flashdsa::run_indexer_topk(f8); }, 0, 10);
        check_status(flashdsa::run_indexer_topk(fb), "fp8 indexer_topk (band)");  // idx8 of the band run
        FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
        recall(rmean, rmin);
        // Every sampled row: min(K, t + 1) distinct keys in [0, t] (causal rows), then -1.
        int64_t bad_rows = 0;
        for (int64_t t : rows) {
          auto o = download<int32_t>(idx8.as<int32_t>() + t * K, K);
          bad_rows += valid_index_row(o.data(), std::min<int64_t>(K, t + 1), K, 0, t + 1) ? 0 : 1;
        }
        all_band_ok = all_band_ok && bad_rows == 0;
        std::printf("  %-3d %7lld   band %5lld C %5d%s: fp8 sel ms %.3f (default again %.3f: %.3fx) recall mean %.5f "
                    "min %.4f, %s\n", H, (long long)T, (long long)b, fb.candidates > 0 ? fb.candidates : flashdsa::fp8_selection_candidates(K),
                    scaled ? " scaled" : "", ms_b, ms_d,
                    ms_d / ms_b, rmean, rmin,
                    bad_rows == 0 ? "indices valid" : "INVALID ROWS");
      }
    }
  }
  if (!all_band_ok) std::printf("band re-score: INVALID ROWS (see above)\n");
  return all_band_ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  bool small = false, bench = true, bench_only = false, spread = true;
  uint64_t seed = std::random_device{}();
  std::vector<int64_t> bench_T = {8192, 32768, 131072};
  std::vector<int> bench_H = {32};
  std::vector<int64_t> bench_cands;  // --bench-candidates: extra C values (speed / recall trade-off)
  std::vector<BandSpec> bench_bands;  // --bench-bands: rescore_band values [/ C] [s: scaled]
  auto parse_list = [](const char* text) {
    std::vector<int64_t> v;
    for (const char* c = text; *c;) {
      char* end = nullptr;
      v.push_back(std::strtoll(c, &end, 10));
      if (end == c) break;
      c = *end == ',' ? end + 1 : end;
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) small = true, bench = false;
    else if (!std::strcmp(argv[i], "--no-bench")) bench = false;
    else if (!std::strcmp(argv[i], "--bench-only")) bench_only = true;
    else if (!std::strcmp(argv[i], "--tol8") && i + 1 < argc) g_tol8_rel = std::strtod(argv[++i], nullptr);
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--bench-T") && i + 1 < argc) bench_T = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--bench-candidates") && i + 1 < argc) bench_cands = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--bench-bands") && i + 1 < argc) {
      for (const char* c = argv[++i]; *c;) {  // "b" or "b/C", then "s" for the band scaled to the rows' keys; ","
        char* end = nullptr;
        const int64_t b = std::strtoll(c, &end, 10);
        if (end == c) break;
        int64_t cand = 0;  // 0: the default C
        if (*end == '/') cand = std::strtoll(end + 1, &end, 10);
        const bool scaled = *end == 's';
        if (scaled) ++end;
        bench_bands.push_back({b, cand, scaled});
        c = *end == ',' ? end + 1 : end;
      }
    }
    else if (!std::strcmp(argv[i], "--bench-data") && i + 1 < argc) spread = std::strcmp(argv[++i], "uniform") != 0;
    else if (!std::strcmp(argv[i], "--bench-H") && i + 1 < argc) {
      bench_H.clear();
      for (int64_t h : parse_list(argv[++i])) bench_H.push_back(static_cast<int>(h));
    }
  }
  cudaDeviceProp prop{};
  FLASHDSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("indexer_topk_fp8_check: %s, %d SMs, seed %llu\n", prop.name, prop.multiProcessorCount,
              (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  bool ok = true;
  if (!bench_only) {
    std::printf("Correctness of the FP8 selection vs the double CPU reference of the contract:\n");
    for (const Problem& p : problems(small, rng)) ok = check_problem(p) && ok;
    ok = check_quantizer_edges(rng) && ok;
    flashdsa::IndexerTopkParams empty = fp8_params(0, 0, 32, 128, 64, 0, true, nullptr, nullptr, nullptr, nullptr,
                                                   nullptr, 0, 0, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
    const bool pass = flashdsa::run_indexer_topk(empty).ok();
    std::printf("  %-34s %s\n", "T = 0", pass ? "PASS" : "FAIL");
    ok = ok && pass;
  }
  if (bench) ok = benchmark(seed, bench_T, bench_H, spread, bench_cands, bench_bands) && ok;
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
  return ok ? 0 : 1;
}
