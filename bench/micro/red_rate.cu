// Micro-benchmark: the L2 reduction rate of the access patterns a dkv emission can use (sparse MLA
// backward, docs/kernels/sparse_mla_bwd.md "Deterministic mode"). Question it answers: do scalar
// integer reductions (red.global.add.u32 / .u64, which are associative, hence order-independent and
// bitwise reproducible) move dkv values as fast as the fast mode's 16-byte float reductions
// (red.global.add.v4.f32), when every warp instruction covers whole 128-byte lines?
//
//   red_rate [--mib N] [--iters N] [--ctas N] [--threads N]      (one GPU; exit 77 without one)
//
// The last pattern is the bulk (TMA-engine) reduction from shared memory, cp.reduce.async.bulk .add.f32: one
// lane per warp sends the 512-byte chunk (or, last pattern, the aligned 2 KB around it: 4 times the adds per
// step) as one operation from a CTA-wide source of ones (the question:
// does an emission staged in shared memory reach a higher L2 reduction rate than red.v4.f32?). The very last
// pattern is the fast mode's red.v4.f32 with 256 B of L2 reads (cp.async.cg) of another chunk per warp step,
// the backward's ratio of kv gather bytes to dkv reduction bytes (73,728 / 147,456): does the reduction rate
// hold when the L2 also serves reads? The two half-line patterns (2026-12-04, twenty-second session) are the
// emission of a dKV accumulator without the quad-pair exchange: the 4 lanes of each quad send 64 consecutive bytes
// (half a line) of their own row, 8 rows per instruction; "paired" completes the same 8 lines with the next
// instruction (as consecutive n-group pairs of the accumulator would), "unpaired" leaves the other halves to some
// other step of some other warp. Question: does the L2 reduce half-line requests at the full-line rate? The u64
// half-line pattern (twenty-third session) is the same question for 64-bit integer adds: 8 lanes x 8 B per half
// line, 4 lines per instruction, the next instruction completing them (fixed-point pairs, the backward's deterministic mode).
//
// Every pattern adds 1 to each value of a 512-byte chunk (128 four-byte or 64 eight-byte values) per
// warp step, the chunks visited in a fixed scattered order over an L2-resident buffer (default 32 MiB,
// dkv at T_kv = 14.5K); 264 CTAs of 256 threads by default (--ctas 132 --threads 128: one warpgroup per SM
// issues, as the backward's back warpgroup does), the same number of adds whatever the grid. Printed:
// values added per second and the payload rate (bytes of addends per second). After the timed launches
// the buffer's sum is compared with the number of adds issued (exact: integer-valued data), so a
// pattern that lost adds is reported FAIL.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

enum Pattern { kV4F32, kF32Line, kU32Line, kU64Line, kU32V4Layout, kU32Sectors, kAtomU32Line, kBulkF32, kBulkF32x4, kV4F32Reads,
               kV4F32HalfPairs, kV4F32HalfSpread, kU64HalfPairs, kV4F32Gap250, kV4F32Gap500, kV4F32Gap1000, kPatterns };
const char* const kNames[kPatterns] = {
    "red.v4.f32, 4 lines / instr (fast mode)", "red.f32, 1 line / instr", "red.u32, 1 line / instr",
    "red.u64, 2 lines / instr", "red.u32, v4 layout (lane stride 16 B)", "red.u32, 4 full sectors in 4 lines / instr",
    "atom.u32 (value returned), 1 line / instr", "cp.reduce.async.bulk add.f32, 512 B / op",
    "cp.reduce.async.bulk add.f32, 2 KB / op", "red.v4.f32 + 256 B of L2 reads / step",
    "red.v4.f32, 8 half lines / instr, paired", "red.v4.f32, 8 half lines / instr, unpaired",
    "red.u64, 4 half lines / instr, paired", "red.v4.f32, bursts of 72, 250 ns idle",
    "red.v4.f32, bursts of 72, 500 ns idle", "red.v4.f32, bursts of 72, 1000 ns idle"};

constexpr int kChunkBytes = 512;
constexpr int kBulkMaxBytes = 2048;
constexpr int kReadBytes = 256, kRingSlots = 4, kReadRingBytes = 32 * kRingSlots * kReadBytes;  // 32 warps max

// Bytes added per warp step: one chunk, except the 2 KB bulk pattern.
__host__ __device__ constexpr int step_bytes(int p) { return p == kBulkF32x4 ? kBulkMaxBytes : kChunkBytes; }

// Chunk of warp-step s of global warp w: a fixed scattered walk (an odd multiplier mod a power of two).
__device__ __forceinline__ uint32_t chunk_of(uint32_t w, uint32_t s, uint32_t mask) {
  return (w * 2654435761u + s * 40503u) & mask;
}

// The gap patterns (twenty-seventh session): the fast mode's red.v4.f32 in bursts of one block's emission per warp
// (9 chunks x 8 instructions) with an idle gap after each burst, as the back warpgroup's head (its dQ and first chunk)
// leaves one. Question: with one warpgroup per SM (--ctas 132 --threads 128), does the payload rate fall with the gap
// (each SM's own reduction stream is the limit: a shorter head gains) or stay (the L2's rate is the limit and other
// SMs fill one SM's gaps: reordering inside a block cannot gain)?
constexpr int kGapBurst = 72;
__host__ __device__ constexpr int gap_ns(int p) {
  return p == kV4F32Gap250 ? 250 : p == kV4F32Gap500 ? 500 : p == kV4F32Gap1000 ? 1000 : 0;
}

__device__ __forceinline__ void red_f32(uint8_t* a) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(a), "f"(1.f) : "memory");
}
__device__ __forceinline__ void red_u32(uint8_t* a) {
  asm volatile("red.global.add.u32 [%0], %1;\n" ::"l"(a), "r"(1u) : "memory");
}

template <int P>
__global__ void __launch_bounds__(1024) red_kernel(uint8_t* buf, uint32_t mask, int steps) {
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  __shared__ alignas(128) float ones[kBulkMaxBytes / 4];  // the bulk patterns' source
  __shared__ alignas(128) uint8_t ring[kReadRingBytes];  // kV4F32Reads: the copies' destination
  if constexpr (P == kBulkF32 || P == kBulkF32x4) {
    for (int i = threadIdx.x; i < kBulkMaxBytes / 4; i += blockDim.x) ones[i] = 1.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> async-proxy reads
    __syncthreads();
  }
  for (int s = 0; s < steps; ++s) {
    uint8_t* c = buf + static_cast<size_t>(chunk_of(w, static_cast<uint32_t>(s), mask)) * kChunkBytes;
    if constexpr (gap_ns(P) > 0) {
      asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};\n" ::"l"(c + 16 * lane), "f"(1.f) : "memory");
      if (s % kGapBurst == kGapBurst - 1) __nanosleep(gap_ns(P));
    } else if constexpr (P == kV4F32 || P == kV4F32Reads) {
      asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};\n" ::"l"(c + 16 * lane), "f"(1.f) : "memory");
      if constexpr (P == kV4F32Reads) {
        // 16 lanes copy 16 B each into the warp's 4-slot ring (as the backward's cp.async gathers; the data
        // are never read), at most 4 steps' copies in flight per thread
        const uint8_t* r = buf + static_cast<size_t>(chunk_of(w + 7u, static_cast<uint32_t>(s), mask)) * kChunkBytes;
        if (lane < 16) {
          const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(
              ring + (((threadIdx.x >> 5) * kRingSlots + (s % kRingSlots)) * kReadBytes) + 16 * lane));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(r + 16 * lane) : "memory");
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 3;\n" ::: "memory");
      }
    } else if constexpr (P == kV4F32HalfPairs || P == kV4F32HalfSpread) {
      // 1 KB regions (8 lines); lanes 4g .. 4g + 3 add 16 B each to half (s & 1) of line g of the region of
      // step s / 2 (paired: the next step completes the same lines) or of step s (unpaired)
      const uint32_t r = chunk_of(w, static_cast<uint32_t>(P == kV4F32HalfPairs ? s / 2 : s), mask >> 1);
      uint8_t* const a = buf + static_cast<size_t>(r) * 2 * kChunkBytes + 128 * (lane >> 2) + 64 * (s & 1) + 16 * (lane & 3);
      asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};\n" ::"l"(a), "f"(1.f) : "memory");
    } else if constexpr (P == kF32Line || P == kU32Line) {
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        if constexpr (P == kF32Line) red_f32(c + 128 * l + 4 * lane);
        else red_u32(c + 128 * l + 4 * lane);
      }
    } else if constexpr (P == kU64HalfPairs) {
      // lanes 8g .. 8g + 7 add 8 B each to half h of line g: 4 half lines per instruction, the second instruction
      // the other halves of the same 4 lines (the fixed-point pair emission of the backward's deterministic mode)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"(c + 128 * (lane >> 3) + 64 * h + 8 * (lane & 7)), "l"(1ull)
                     : "memory");
    } else if constexpr (P == kU64Line) {
#pragma unroll
      for (int l = 0; l < 2; ++l)
        asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"(c + 256 * l + 8 * lane), "l"(1ull) : "memory");
    } else if constexpr (P == kU32V4Layout) {
#pragma unroll
      for (int e = 0; e < 4; ++e) red_u32(c + 16 * lane + 4 * e);
    } else if constexpr (P == kU32Sectors) {
      // lanes 8g .. 8g + 7 fill sector j of line g: each instruction 4 full 32-byte sectors in 4 lines
#pragma unroll
      for (int j = 0; j < 4; ++j) red_u32(c + 128 * (lane >> 3) + 32 * j + 4 * (lane & 7));
    } else if constexpr (P == kBulkF32 || P == kBulkF32x4) {
      if (lane == 0) {
        const uint32_t src = static_cast<uint32_t>(__cvta_generic_to_shared(ones));
        uint8_t* const dst = P == kBulkF32 ? c : buf + ((c - buf) & ~static_cast<size_t>(kBulkMaxBytes - 1));
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
            "cp.async.bulk.commit_group;\n"
            "cp.async.bulk.wait_group.read 16;\n" ::"l"(dst), "r"(src), "r"(step_bytes(P))
            : "memory");
      }
    } else {
      // the returned old values are folded into a sum that is never true, so the loads stay live
      uint32_t acc = 0u;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        uint32_t old;
        asm volatile("atom.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(c + 128 * l + 4 * lane), "r"(1u) : "memory");
        acc ^= old;
      }
      if (acc == ~mask) *reinterpret_cast<uint32_t*>(c) = acc;  // (never: the counts stay far below ~mask)
    }
  }
  if constexpr (P == kBulkF32 || P == kBulkF32x4) {
    if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // all reductions performed
  }
  if constexpr (P == kV4F32Reads) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

template <int P>
void launch(uint8_t* buf, uint32_t mask, int steps, int grid, int threads) {
  red_kernel<P><<<grid, threads>>>(buf, mask, steps);
}

void run_pattern(int p, uint8_t* buf, uint32_t mask, int steps, int grid, int threads) {
  switch (p) {
    case kV4F32: launch<kV4F32>(buf, mask, steps, grid, threads); break;
    case kF32Line: launch<kF32Line>(buf, mask, steps, grid, threads); break;
    case kU32Line: launch<kU32Line>(buf, mask, steps, grid, threads); break;
    case kU64Line: launch<kU64Line>(buf, mask, steps, grid, threads); break;
    case kU32V4Layout: launch<kU32V4Layout>(buf, mask, steps, grid, threads); break;
    case kU32Sectors: launch<kU32Sectors>(buf, mask, steps, grid, threads); break;
    case kBulkF32: launch<kBulkF32>(buf, mask, steps, grid, threads); break;
    case kBulkF32x4: launch<kBulkF32x4>(buf, mask, steps, grid, threads); break;
    case kV4F32Reads: launch<kV4F32Reads>(buf, mask, steps, grid, threads); break;
    case kV4F32HalfPairs: launch<kV4F32HalfPairs>(buf, mask, steps, grid, threads); break;
    case kV4F32HalfSpread: launch<kV4F32HalfSpread>(buf, mask, steps, grid, threads); break;
    case kU64HalfPairs: launch<kU64HalfPairs>(buf, mask, steps, grid, threads); break;
    case kV4F32Gap250: launch<kV4F32Gap250>(buf, mask, steps, grid, threads); break;
    case kV4F32Gap500: launch<kV4F32Gap500>(buf, mask, steps, grid, threads); break;
    case kV4F32Gap1000: launch<kV4F32Gap1000>(buf, mask, steps, grid, threads); break;
    default: launch<kAtomU32Line>(buf, mask, steps, grid, threads); break;
  }
  CHECK_CUDA(cudaGetLastError());
}

// Sum of the buffer's values (f32, u32 or u64 words) on the host.
double buffer_sum(int p, const std::vector<uint8_t>& h) {
  double s = 0.0;
  if (p == kV4F32 || p == kF32Line || p == kBulkF32 || p == kBulkF32x4 || p == kV4F32Reads || p == kV4F32HalfPairs ||
      p == kV4F32HalfSpread || gap_ns(p) > 0) {
    const float* f = reinterpret_cast<const float*>(h.data());
    for (size_t i = 0; i < h.size() / 4; ++i) s += f[i];
  } else if (p == kU64Line || p == kU64HalfPairs) {
    const uint64_t* u = reinterpret_cast<const uint64_t*>(h.data());
    for (size_t i = 0; i < h.size() / 8; ++i) s += static_cast<double>(u[i]);
  } else {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(h.data());
    for (size_t i = 0; i < h.size() / 4; ++i) s += u[i];
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 32, iters = 20, grid = 264, threads = 256;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ctas") && i + 1 < argc) grid = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: red_rate [--mib N] [--iters N] [--ctas N] [--threads N]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("red_rate: no GPU, skipped\n");
    return 77;
  }
  // The chunk count must be a power of two (the walk's mask): round the size down.
  uint32_t chunks = 1;
  while (static_cast<size_t>(chunks) * 2 * kChunkBytes <= static_cast<size_t>(mib) << 20) chunks *= 2;
  const size_t bytes = static_cast<size_t>(chunks) * kChunkBytes;
  if (mib < 1 || iters < 1 || grid < 1 || threads < 32 || threads > 1024 || threads % 32 != 0) {
    std::fprintf(stderr, "red_rate: need --mib >= 1, --iters >= 1, --ctas >= 1, --threads a multiple of 32 in [32, 1024]\n");
    return 2;
  }
  const int steps = 2048 * 264 * 256 / (grid * threads) > 0 ? 2048 * 264 * 256 / (grid * threads) : 1;  // same adds
  const double warps = grid * threads / 32.0;
  uint8_t* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::printf("buffer %.1f MiB (%u chunks of 512 B), grid %d x %d, %d warp steps per launch, %d launches\n",
              bytes / 1048576.0, chunks, grid, threads, steps, iters);
  std::printf("%-42s %12s %14s %8s\n", "pattern", "Gvalues/s", "payload TB/s", "check");
  bool ok = true;
  std::vector<uint8_t> host(bytes);
  for (int p = 0; p < kPatterns; ++p) {
    CHECK_CUDA(cudaMemset(buf, 0, bytes));
    run_pattern(p, buf, chunks - 1, steps, grid, threads);  // warm-up
    CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) run_pattern(p, buf, chunks - 1, steps, grid, threads);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    const int word = p == kU64Line || p == kU64HalfPairs ? 8 : 4;
    const double values = warps * steps * (step_bytes(p) / word) * iters;
    CHECK_CUDA(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost));
    const double expect = warps * steps * (step_bytes(p) / word) * (iters + 1);
    const bool pass = buffer_sum(p, host) == expect;
    ok = ok && pass;
    std::printf("%-42s %12.1f %14.3f %8s\n", kNames[p], values / (ms * 1e6), values * word / (ms * 1e9),
                pass ? "ok" : "FAIL");
  }
  CHECK_CUDA(cudaFree(buf));
  return ok ? 0 : 1;
}
