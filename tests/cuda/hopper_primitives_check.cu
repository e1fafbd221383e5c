// GPU check of csrc/sm90/common/hopper.cuh: SW128 layouts + wgmma descriptors (K-major, MN-major
// A and B), the RS path (accumulator -> A fragments), and the cp.async gather with zero-fill and
// mbarrier completion. One warpgroup per test; results compared with a double reference on the host.
// Exit: 0 all pass, 1 a failure, 77 no GPU (CTest skip).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/common/hopper.cuh"
#include "check_common.cuh"

using namespace flashdsa::sm90::hw;

// Stores a row-major [rows x cols] global matrix into a SW128 tile (cols multiple of 64).
__device__ void load_sw128(char* tile, const __nv_bfloat16* g, int rows, int cols) {
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    int r = i / cols, c = i % cols;
    *reinterpret_cast<__nv_bfloat16*>(tile + sw128_elem_offset(rows, r, c)) = g[i];
  }
}

// Writes this thread's m64nN accumulators to a row-major [64 x N] global matrix.
template <int NACC>
__device__ void store_acc(const float (&d)[NACC], float* out, int N) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = 0; j < NACC / 4; ++j) {
    int r = 16 * warp + lane / 4, c = 8 * j + 2 * (lane % 4);
    out[r * N + c] = d[4 * j + 0];
    out[r * N + c + 1] = d[4 * j + 1];
    out[(r + 8) * N + c] = d[4 * j + 2];
    out[(r + 8) * N + c + 1] = d[4 * j + 3];
  }
}

// C[64 x N] = A[64 x 128] * B[N x 128]^T, both K-major.
template <int N>
__global__ void k_ss_kmajor(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
  extern __shared__ __align__(1024) char smem[];
  char* sA = smem;
  char* sB = smem + 64 * 256;
  load_sw128(sA, A, 64, 128);
  load_sw128(sB, B, N, 128);
  fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    if constexpr (N == 64) wgmma_ss_m64n64k16<0, 0>(d, desc_k_major(sA, 64, ks), desc_k_major(sB, N, ks), ks > 0);
    else wgmma_ss_m64n256k16<0, 0>(d, desc_k_major(sA, 64, ks), desc_k_major(sB, N, ks), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  store_acc(d, C, N);
}

// C[64 x 192] = A[64 x 64] * B[64 x 256][:, 64:256], B MN-major (stored K rows x N).
__global__ void k_ss_mnmajor_b(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
  extern __shared__ __align__(1024) char smem[];
  char* sA = smem;
  char* sB = smem + 64 * 128;
  load_sw128(sA, A, 64, 64);
  load_sw128(sB, B, 64, 256);
  fence_proxy_async();
  __syncthreads();
  float d[96];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_ss_m64n192k16<0, 1>(d, desc_k_major(sA, 64, ks), desc_mn_major(sB, 64, ks, 1), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  store_acc(d, C, 192);
}

// C[64 x 64] = At^T * B^T where At is stored [K=64 rows x M=64] (A MN-major) and B [N=64 x K=64].
__global__ void k_ss_mnmajor_a(const __nv_bfloat16* At, const __nv_bfloat16* B, float* C) {
  extern __shared__ __align__(1024) char smem[];
  char* sA = smem;
  char* sB = smem + 64 * 128;
  load_sw128(sA, At, 64, 64);
  load_sw128(sB, B, 64, 64);
  fence_proxy_async();
  __syncthreads();
  float d[32];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_ss_m64n64k16<1, 0>(d, desc_mn_major(sA, 64, ks, 0), desc_k_major(sB, 64, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  store_acc(d, C, 64);
}

// S = A[64x64] * K[64x64]^T; C[64 x 256] = bf16(S) * V[64 x 256] (RS, V MN-major).
__global__ void k_rs(const __nv_bfloat16* A, const __nv_bfloat16* K, const __nv_bfloat16* V, float* C) {
  extern __shared__ __align__(1024) char smem[];
  char* sA = smem;
  char* sK = smem + 64 * 128;
  char* sV = smem + 2 * 64 * 128;
  load_sw128(sA, A, 64, 64);
  load_sw128(sK, K, 64, 64);
  load_sw128(sV, V, 64, 256);
  fence_proxy_async();
  __syncthreads();
  float s[32];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_ss_m64n64k16<0, 0>(s, desc_k_major(sA, 64, ks), desc_k_major(sK, 64, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  float d[128];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    acc_to_a_frag(s, kk, a);
    wgmma_rs_m64n256k16<1>(d, a, desc_mn_major(sV, 64, kk, 0), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  store_acc(d, C, 256);
}

// Gathers rows idx[r] (r < 64; -1 = zero row) of G [n x 128] into a SW128 tile with cp.async,
// completion through an mbarrier, then writes the tile back linearly to O [64 x 128].
template <int kHint>
__global__ void k_gather(const __nv_bfloat16* G, const int* idx, int n, __nv_bfloat16* O) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, blockDim.x);
    mbar_fence_init();
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
    int r = i / 16, chunk = i % 16;
    int row = idx[r];
    bool valid = row >= 0 && row < n;
    const __nv_bfloat16* src = G + (valid ? static_cast<size_t>(row) * 128 + chunk * 8 : 0);
    char* dst = smem + (chunk / 8) * 64 * 128 + sw128_offset(r, chunk % 8);
    if constexpr (kHint) cp_async_16_hint(dst, src, valid, make_l2_evict_last());
    else cp_async_16(dst, src, valid);
  }
  cp_async_arrive(&bar);
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) {
    int r = i / 128, c = i % 128;
    O[i] = *reinterpret_cast<__nv_bfloat16*>(smem + sw128_elem_offset(64, r, c));
  }
}

static std::mt19937 rng(1234);
static std::vector<__nv_bfloat16> rand_bf16(size_t n) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(dist(rng));
  return v;
}
static float f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
static T* to_dev(const std::vector<T>& h) {
  T* d;
  FLASHDSA_CHECK_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
  FLASHDSA_CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
static std::vector<float> from_dev(const float* d, size_t n) {
  std::vector<float> h(n);
  FLASHDSA_CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

static int failures = 0;
static void report(const char* name, const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  double rel = std::sqrt(num / (den + 1e-30));
  bool ok = rel < 1e-5 && std::isfinite(rel);
  std::printf("%-28s rel_err %.3e  %s\n", name, rel, ok ? "PASS" : "FAIL");
  failures += !ok;
}

int main() {
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  const int smem = 200 * 1024;
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_ss_kmajor<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_ss_kmajor<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_ss_mnmajor_b, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_ss_mnmajor_a, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_rs, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_gather<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHDSA_CHECK_CUDA(cudaFuncSetAttribute(k_gather<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  float* dC;
  FLASHDSA_CHECK_CUDA(cudaMalloc(&dC, 64 * 256 * sizeof(float)));

  for (int N : {64, 256}) {  // SS K-major
    auto A = rand_bf16(64 * 128), B = rand_bf16(static_cast<size_t>(N) * 128);
    auto dA = to_dev(A), dB = to_dev(B);
    if (N == 64) k_ss_kmajor<64><<<1, 128, smem>>>(dA, dB, dC);
    else k_ss_kmajor<256><<<1, 128, smem>>>(dA, dB, dC);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> ref(64 * N);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < N; ++n) {
        double s = 0;
        for (int k = 0; k < 128; ++k) s += static_cast<double>(f(A[m * 128 + k])) * f(B[n * 128 + k]);
        ref[m * N + n] = s;
      }
    report(N == 64 ? "ss k-major n64 k128" : "ss k-major n256 k128", from_dev(dC, 64 * N), ref);
  }
  {  // SS, B MN-major, second..fourth 64-col blocks
    auto A = rand_bf16(64 * 64), B = rand_bf16(64 * 256);
    auto dA = to_dev(A), dB = to_dev(B);
    k_ss_mnmajor_b<<<1, 128, smem>>>(dA, dB, dC);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> ref(64 * 192);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 192; ++n) {
        double s = 0;
        for (int k = 0; k < 64; ++k) s += static_cast<double>(f(A[m * 64 + k])) * f(B[k * 256 + 64 + n]);
        ref[m * 192 + n] = s;
      }
    report("ss mn-major B n192 (blk1)", from_dev(dC, 64 * 192), ref);
  }
  {  // SS, A MN-major
    auto At = rand_bf16(64 * 64), B = rand_bf16(64 * 64);
    auto dA = to_dev(At), dB = to_dev(B);
    k_ss_mnmajor_a<<<1, 128, smem>>>(dA, dB, dC);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> ref(64 * 64);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 64; ++n) {
        double s = 0;
        for (int k = 0; k < 64; ++k) s += static_cast<double>(f(At[k * 64 + m])) * f(B[n * 64 + k]);
        ref[m * 64 + n] = s;
      }
    report("ss mn-major A n64", from_dev(dC, 64 * 64), ref);
  }
  {  // RS: bf16(A K^T) V
    auto A = rand_bf16(64 * 64), K = rand_bf16(64 * 64), V = rand_bf16(64 * 256);
    auto dA = to_dev(A), dK = to_dev(K), dV = to_dev(V);
    k_rs<<<1, 128, smem>>>(dA, dK, dV, dC);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> S(64 * 64);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 64; ++n) {
        double s = 0;
        for (int k = 0; k < 64; ++k) s += static_cast<double>(f(A[m * 64 + k])) * f(K[n * 64 + k]);
        S[m * 64 + n] = f(__float2bfloat16(static_cast<float>(s)));
      }
    std::vector<double> ref(64 * 256);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 256; ++n) {
        double s = 0;
        for (int k = 0; k < 64; ++k) s += static_cast<double>(S[m * 64 + k]) * f(V[k * 256 + n]);
        ref[m * 256 + n] = s;
      }
    // S is rounded to bf16 on both sides; rare rounding-boundary flips allow a slightly looser bound.
    auto got = from_dev(dC, 64 * 256);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    double rel = std::sqrt(num / den);
    bool ok = rel < 5e-3;
    std::printf("%-28s rel_err %.3e  %s\n", "rs acc->A, V mn-major n256", rel, ok ? "PASS" : "FAIL");
    failures += !ok;
  }
  for (int hint = 0; hint < 2; ++hint) {  // cp.async gather with zero fill (without / with an L2 hint)
    const int n = 300;
    auto G = rand_bf16(static_cast<size_t>(n) * 128);
    std::vector<int> idx(64);
    for (int r = 0; r < 64; ++r) idx[r] = (r % 7 == 3) ? -1 : (r % 11 == 5 ? n + 4 : static_cast<int>(rng() % n));
    auto dG = to_dev(G);
    auto dI = to_dev(idx);
    __nv_bfloat16* dO;
    FLASHDSA_CHECK_CUDA(cudaMalloc(&dO, 64 * 128 * sizeof(__nv_bfloat16)));
    if (hint) k_gather<1><<<1, 128, smem>>>(dG, dI, n, dO);
    else k_gather<0><<<1, 128, smem>>>(dG, dI, n, dO);
    FLASHDSA_CHECK_CUDA(cudaGetLastError());
    FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> O(64 * 128);
    FLASHDSA_CHECK_CUDA(cudaMemcpy(O.data(), dO, O.size() * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 128; ++c) {
        float want = (idx[r] >= 0 && idx[r] < n) ? f(G[static_cast<size_t>(idx[r]) * 128 + c]) : 0.f;
        bad += f(O[r * 128 + c]) != want;
      }
    std::printf("%-28s mismatches %d  %s\n", hint ? "cp.async gather+zfill+hint" : "cp.async gather + zfill", bad,
                bad ? "FAIL" : "PASS");
    failures += bad != 0;
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "ALL PASSED", failures);
  return failures ? 1 : 0;
}
