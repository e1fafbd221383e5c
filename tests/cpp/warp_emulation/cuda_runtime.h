// Host emulation of the CUDA constructs that csrc/sm90/indexer_topk/select.cuh and warp_select.cuh use, so that their
// selections run on the CPU in select_emulated_main.cpp (beside it): each thread of a CTA is an OS thread; every warp
// collective (ballot, shuffles, votes, reductions, __syncwarp) meets the warp's 32 lanes at a barrier, __syncthreads
// all threads of the CTA at another; both order memory as the GPU's do for shared memory. Only full-warp masks are
// emulated; "shared memory" is any memory the threads share.
// This header stands in for <cuda_runtime.h> through the test's include path; nothing else includes it.
#pragma once

#include <algorithm>
#include <barrier>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifndef FLASHDSA_WARP_EMULATION
#define FLASHDSA_WARP_EMULATION 1
#endif

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict

struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }

namespace flashdsa_emu {

// One emulated warp: its 32 lanes' barrier and their exchange slots.
struct Warp {
  std::barrier<> bar{32};
  uint64_t slot[32] = {};
  int id = 0;  // the warp's index in its CTA
};

// One emulated CTA (only for code that calls __syncthreads): the barrier of all its threads.
struct Cta {
  explicit Cta(int threads) : bar(threads) {}
  std::barrier<> bar;
};

inline thread_local Warp* tl_warp = nullptr;
inline thread_local Cta* tl_cta = nullptr;
inline thread_local int tl_lane = 0;

inline int lane() { return tl_lane; }
inline int warp() { return tl_warp->id; }

// Every lane's value, after all 32 lanes have offered theirs (two barrier phases: write, then read).
struct Values {
  uint64_t v[32];
};
inline Values exchange(uint64_t mine, unsigned mask) {
  if (mask != 0xffffffffu) throw std::logic_error("warp emulation: only full-warp masks are emulated");
  Warp& w = *tl_warp;
  w.slot[tl_lane] = mine;
  w.bar.arrive_and_wait();
  Values all;
  std::memcpy(all.v, w.slot, sizeof all.v);
  w.bar.arrive_and_wait();
  return all;
}

template <class T>
uint64_t to_bits(T x) {
  static_assert(sizeof(T) <= 8, "32- or 64-bit values");
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T x;
  std::memcpy(&x, &b, sizeof(T));
  return x;
}

struct Dim3 {
  unsigned x, y, z;
};
inline Dim3 thread_idx() { return Dim3{static_cast<unsigned>(tl_warp->id * 32 + tl_lane), 0u, 0u}; }

}  // namespace flashdsa_emu

#define threadIdx (::flashdsa_emu::thread_idx())

inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)::flashdsa_emu::exchange(0, mask); }

inline unsigned __ballot_sync(unsigned mask, bool pred) {
  const auto all = ::flashdsa_emu::exchange(pred ? 1u : 0u, mask);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= static_cast<unsigned>(all.v[l] & 1u) << l;
  return bits;
}
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0u; }
inline bool __all_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }

template <class T>
T __shfl_sync(unsigned mask, T value, int src) {
  const auto all = ::flashdsa_emu::exchange(::flashdsa_emu::to_bits(value), mask);
  return ::flashdsa_emu::from_bits<T>(all.v[src & 31]);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta) {
  const auto all = ::flashdsa_emu::exchange(::flashdsa_emu::to_bits(value), mask);
  const int l = ::flashdsa_emu::tl_lane;
  return l >= static_cast<int>(delta) ? ::flashdsa_emu::from_bits<T>(all.v[l - delta]) : value;
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  const auto all = ::flashdsa_emu::exchange(::flashdsa_emu::to_bits(value), mask);
  const int l = ::flashdsa_emu::tl_lane;
  return l + static_cast<int>(delta) < 32 ? ::flashdsa_emu::from_bits<T>(all.v[l + delta]) : value;
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  const auto all = ::flashdsa_emu::exchange(::flashdsa_emu::to_bits(value), mask);
  return ::flashdsa_emu::from_bits<T>(all.v[(::flashdsa_emu::tl_lane ^ lane_mask) & 31]);
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  const auto all = ::flashdsa_emu::exchange(value, mask);
  unsigned r = UINT_MAX;
  for (int l = 0; l < 32; ++l) r = std::min(r, static_cast<unsigned>(all.v[l]));
  return r;
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  const auto all = ::flashdsa_emu::exchange(value, mask);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r = std::max(r, static_cast<unsigned>(all.v[l]));
  return r;
}
inline int __reduce_add_sync(unsigned mask, int value) {
  const auto all = ::flashdsa_emu::exchange(::flashdsa_emu::to_bits(value), mask);
  int r = 0;
  for (int l = 0; l < 32; ++l) r += ::flashdsa_emu::from_bits<int>(all.v[l]);
  return r;
}

// The CTA barrier (memory ordered by std::barrier, as __syncthreads orders shared memory).
inline void __syncthreads() {
  if (::flashdsa_emu::tl_cta == nullptr) throw std::logic_error("warp emulation: __syncthreads outside an emulated CTA");
  ::flashdsa_emu::tl_cta->bar.arrive_and_wait();
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline unsigned __float_as_uint(float f) { return ::flashdsa_emu::from_bits<unsigned>(::flashdsa_emu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return ::flashdsa_emu::from_bits<float>(::flashdsa_emu::to_bits(u)); }
inline int __float_as_int(float f) { return ::flashdsa_emu::from_bits<int>(::flashdsa_emu::to_bits(f)); }

template <class T>
T atomicAdd(T* address, T value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

using std::max;
using std::min;
