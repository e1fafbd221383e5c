// The exact top-k selections of the indexer kernels run on the CPU, their device code unchanged, each thread an OS
// thread (cuda_runtime.h beside this file stands in for CUDA), checked against a sort:
//  - warp_select.cuh (the FP8 band tail, one warp per row): warp_split_top_k (the k best to one list, ranks
//    k + 1 .. k_keep compacted in place over the input's indices, as band_tail calls it), warp_keep_top_k and
//    warp_write_top_k (the bf16 kernel's FLASHDSA_ITK_WARP_FINAL final selection: scores and padding too); every
//    selection twice (the lanes' thread schedules differ), compared bitwise: the result is deterministic;
//  - select.cuh (the bf16 and FP8 kernels' per-row selection, a whole CTA of 128 or 256 threads): keep_top_k, its
//    register-resident path (n <= 4096) and its streamed one, in place or not, with or without scores.
// Lists with ties, signed zeros, negative and huge scores, one repeated value, n around k and k_keep.
// tests/cuda/select_check.cu runs the same routines on the GPU. Exit code 0 when every case passes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sm90/indexer_topk/select.cuh"
#include "sm90/indexer_topk/warp_select.cuh"

namespace {

namespace sel = flashdsa::sm90::indexer_topk_impl;

// Runs body() on the nth threads (nth / 32 warps) of one emulated CTA.
void run_cta(int nth, const std::function<void()>& body) {
  flashdsa_emu::Cta cta(nth);
  std::vector<std::unique_ptr<flashdsa_emu::Warp>> warps;
  for (int w = 0; w < nth / 32; ++w) {
    warps.push_back(std::make_unique<flashdsa_emu::Warp>());
    warps.back()->id = w;
  }
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex error_mutex;
  for (int t = 0; t < nth; ++t) {
    threads.emplace_back([&, t] {
      flashdsa_emu::tl_warp = warps[t / 32].get();
      flashdsa_emu::tl_cta = &cta;
      flashdsa_emu::tl_lane = t % 32;
      try {
        body();
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// Runs body() on the 32 lanes of one emulated warp (a CTA of one warp).
void run_warp(const std::function<void()>& body) { run_cta(32, body); }

struct List {
  std::string kind;
  std::vector<float> scores;  // padded with zeros to a multiple of 4 (the routines read 16-byte vectors)
  std::vector<int> ids;       // distinct entry ids (a permutation of 0 .. n-1, shifted)
  int n = 0;
};

constexpr int kIdBase = 1000;  // ids are kIdBase + position: an id out of range is caught

List make_list(const std::string& kind, int n, std::mt19937& rng) {
  List l;
  l.kind = kind;
  l.n = n;
  const int padded = (n + 3) / 4 * 4 + 4;
  l.scores.assign(padded, 0.f);
  l.ids.assign(padded, 0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> small(0, 6);
  for (int i = 0; i < n; ++i) {
    float s;
    if (kind == "normal") {
      s = normal(rng);
    } else if (kind == "relu") {  // many exact zeros (+0 and -0) below a positive tail
      s = std::max(normal(rng), 0.f);
      if (s == 0.f && (rng() & 1u)) s = -0.f;
    } else if (kind == "few values") {
      s = 0.25f * static_cast<float>(small(rng)) - 0.5f;
    } else if (kind == "one value") {
      s = 1.5f;
    } else if (kind == "huge span") {
      s = std::ldexp(normal(rng), static_cast<int>(rng() % 200) - 100);
    } else {  // "near": neighbouring floats, ties in the low digits
      s = std::nextafter(1.0f, 2.0f) + static_cast<float>(rng() % 64) * 1.1920929e-7f;
    }
    l.scores[i] = s;
    l.ids[i] = kIdBase + i;
  }
  return l;
}

// score_key of every entry, sorted descending.
std::vector<uint32_t> sorted_keys(const List& l) {
  std::vector<uint32_t> keys(l.n);
  for (int i = 0; i < l.n; ++i) keys[i] = sel::score_key(l.scores[i]);
  std::sort(keys.begin(), keys.end(), std::greater<uint32_t>());
  return keys;
}

// The keys of the entries whose ids are out[0, count), sorted descending; false on a bad or repeated id.
bool keys_of(const List& l, const int* out, int count, std::vector<char>& seen, std::vector<uint32_t>& keys) {
  keys.clear();
  for (int j = 0; j < count; ++j) {
    const int pos = out[j] - kIdBase;
    if (pos < 0 || pos >= l.n || seen[pos]) return false;
    seen[pos] = 1;
    keys.push_back(sel::score_key(l.scores[pos]));
  }
  std::sort(keys.begin(), keys.end(), std::greater<uint32_t>());
  return true;
}

struct SplitResult {
  int top = -1, rest = -1;
  std::vector<int> top_idx, rest_idx;
  bool operator==(const SplitResult& o) const {
    return top == o.top && rest == o.rest && top_idx == o.top_idx && rest_idx == o.rest_idx;
  }
};

SplitResult run_split(const List& l, int k, int k_keep) {
  std::vector<float> scores = l.scores;
  std::vector<int> idx = l.ids;  // the rest is compacted over it, in place (as band_tail does)
  std::vector<int> top(std::max(k, 1) + 4, -7);
  std::vector<uint32_t> hist(sel::kWarpHistBins);
  int2 counts{};
  run_warp([&] {
    const int2 c = sel::warp_split_top_k(scores.data(), idx.data(), l.n, k, k_keep, top.data(), idx.data(), hist.data());
    if (flashdsa_emu::lane() == 0) counts = c;
  });
  SplitResult r;
  r.top = counts.x;
  r.rest = counts.y;
  if (r.top >= 0 && r.top <= k) r.top_idx.assign(top.begin(), top.begin() + r.top);
  if (r.rest >= 0 && r.rest <= l.n) r.rest_idx.assign(idx.begin(), idx.begin() + r.rest);
  return r;
}

std::vector<int> run_keep(const List& l, int k, int& count) {
  std::vector<float> scores = l.scores;
  std::vector<int> idx = l.ids;
  std::vector<int> dst(std::max(k, 1) + 4, -7);
  std::vector<uint32_t> hist(sel::kWarpHistBins);
  run_warp([&] {
    const int c = sel::warp_keep_top_k(scores.data(), idx.data(), l.n, k, dst.data(), hist.data());
    if (flashdsa_emu::lane() == 0) count = c;
  });
  dst.resize(std::max(0, std::min(count, k)));
  return dst;
}

int failures = 0;

void fail(const List& l, int k, int k_keep, const char* what) {
  ++failures;
  std::printf("FAIL %-10s n=%d k=%d k_keep=%d: %s\n", l.kind.c_str(), l.n, k, k_keep, what);
}

void check_split(const List& l, int k, int k_keep) {
  const SplitResult a = run_split(l, k, k_keep), b = run_split(l, k, k_keep);
  const int want_top = std::min(l.n, k), want_rest = std::min(l.n, k_keep) - want_top;
  if (a.top != want_top || a.rest != want_rest) return fail(l, k, k_keep, "counts");
  if (!(a == b)) return fail(l, k, k_keep, "two runs differ");
  const std::vector<uint32_t> all = sorted_keys(l);
  std::vector<char> seen(l.n, 0);
  std::vector<uint32_t> got;
  if (!keys_of(l, a.top_idx.data(), a.top, seen, got)) return fail(l, k, k_keep, "top: bad or repeated id");
  if (!std::equal(got.begin(), got.end(), all.begin())) return fail(l, k, k_keep, "top: not the k largest");
  if (!keys_of(l, a.rest_idx.data(), a.rest, seen, got)) return fail(l, k, k_keep, "rest: bad or repeated id");
  if (!std::equal(got.begin(), got.end(), all.begin() + a.top)) return fail(l, k, k_keep, "rest: not ranks k+1..");
}

void check_keep(const List& l, int k) {
  int ca = -1, cb = -1;
  const std::vector<int> a = run_keep(l, k, ca), b = run_keep(l, k, cb);
  if (ca != std::min(l.n, k)) return fail(l, k, 0, "keep: count");
  if (a != b || ca != cb) return fail(l, k, 0, "keep: two runs differ");
  const std::vector<uint32_t> all = sorted_keys(l);
  std::vector<char> seen(l.n, 0);
  std::vector<uint32_t> got;
  if (!keys_of(l, a.data(), ca, seen, got)) return fail(l, k, 0, "keep: bad or repeated id");
  if (!std::equal(got.begin(), got.end(), all.begin())) return fail(l, k, 0, "keep: not the k largest");
}

// warp_write_top_k (the bf16 kernel's final selection with FLASHDSA_ITK_WARP_FINAL): the k largest keys, distinct
// ids, each score that of its id (or no score written), the rest of the k slots -1 / -inf, nothing past k written,
// and the same output from two runs.
void check_write(const List& l, int k, bool with_scores) {
  auto run = [&](std::vector<int>& out_i, std::vector<float>& out_s) {
    std::vector<float> scores = l.scores;
    std::vector<int> idx = l.ids;
    out_i.assign(k + 4, -7);
    out_s.assign(k + 4, -7.f);
    std::vector<uint32_t> hist(sel::kWarpHistBins);
    run_warp([&] {
      sel::warp_write_top_k(scores.data(), idx.data(), l.n, k, out_i.data(), with_scores ? out_s.data() : nullptr,
                            hist.data());
    });
  };
  std::vector<int> ai, bi;
  std::vector<float> as, bs;
  run(ai, as);
  run(bi, bs);
  const char* what = with_scores ? "write +s" : "write";
  if (ai != bi || std::memcmp(as.data(), bs.data(), as.size() * sizeof(float)) != 0)
    return fail(l, k, 0, (std::string(what) + ": two runs differ").c_str());
  const int c = std::min(l.n, k);
  for (int j = c; j < k + 4; ++j) {
    const bool pad = j < k;
    if (ai[j] != (pad ? -1 : -7)) return fail(l, k, 0, (std::string(what) + ": index padding").c_str());
    const float want = pad && with_scores ? -INFINITY : -7.f;
    if (as[j] != want) return fail(l, k, 0, (std::string(what) + ": score padding").c_str());
  }
  const std::vector<uint32_t> all = sorted_keys(l);
  std::vector<char> seen(l.n, 0);
  std::vector<uint32_t> got;
  if (!keys_of(l, ai.data(), c, seen, got)) return fail(l, k, 0, (std::string(what) + ": bad or repeated id").c_str());
  if (!std::equal(got.begin(), got.end(), all.begin()))
    return fail(l, k, 0, (std::string(what) + ": not the k largest").c_str());
  for (int j = 0; j < c; ++j) {
    const float want = with_scores ? l.scores[ai[j] - kIdBase] : -7.f;
    if (std::memcmp(&as[j], &want, sizeof(float)) != 0)
      return fail(l, k, 0, (std::string(what) + ": score of another entry").c_str());
  }
}

// keep_top_k of a CTA of NTH threads: count, the k largest keys, distinct ids, scores that match their ids, every
// kept key >= the returned threshold.
template <int NTH>
void check_cta_keep(const List& l, int k, bool in_place, bool with_scores) {
  std::vector<float> scores = l.scores, out_s(l.scores.size(), -7.f);
  std::vector<int> idx = l.ids, out_i(l.ids.size(), -7);
  float* dst_s = with_scores ? (in_place ? scores.data() : out_s.data()) : nullptr;
  int* dst_i = in_place ? idx.data() : out_i.data();
  auto scratch = std::make_unique<sel::Scratch<NTH>>();
  sel::Kept kept{};
  run_cta(NTH, [&] {
    const sel::Kept r = sel::keep_top_k<NTH>(scores.data(), idx.data(), l.n, k, dst_s, dst_i, *scratch);
    if (threadIdx.x == 0) kept = r;
  });
  const std::string what = "cta " + std::to_string(NTH) + (in_place ? " in place" : "") + (with_scores ? " +s" : "");
  if (kept.count != std::min(l.n, k)) return fail(l, k, 0, (what + ": count").c_str());
  const std::vector<uint32_t> all = sorted_keys(l);
  std::vector<char> seen(l.n, 0);
  std::vector<uint32_t> got;
  if (!keys_of(l, dst_i, kept.count, seen, got)) return fail(l, k, 0, (what + ": bad or repeated id").c_str());
  if (!std::equal(got.begin(), got.end(), all.begin())) return fail(l, k, 0, (what + ": not the k largest").c_str());
  for (int j = 0; j < kept.count; ++j) {
    const int pos = dst_i[j] - kIdBase;
    if (sel::score_key(l.scores[pos]) < kept.thr) return fail(l, k, 0, (what + ": key below the threshold").c_str());
    if (with_scores && sel::score_key(dst_s[j]) != sel::score_key(l.scores[pos]))
      return fail(l, k, 0, (what + ": score of another entry").c_str());
  }
}

}  // namespace

int main() {
  std::mt19937 rng(20261203);
  const char* kinds[] = {"normal", "relu", "few values", "one value", "huge span", "near"};
  // (n, k, k_keep): the band tail's shape (K - b of a list of C .. cap entries), n at and around k and k_keep,
  // lists shorter than one sweep step, and one list longer than the largest list a band kernel holds.
  const int shapes[][3] = {{2900, 1792, 2304}, {2304, 1792, 2304}, {2305, 1792, 2304}, {1793, 1792, 2304},
                           {1792, 1792, 2304}, {600, 100, 130},    {129, 5, 128},      {33, 1, 1},
                           {7, 3, 9},          {5632, 4000, 4608}, {3000, 2999, 3000}};
  int cases = 0;
  for (const char* kind : kinds) {
    for (const auto& s : shapes) {
      const List l = make_list(kind, s[0], rng);
      check_split(l, s[1], s[2]);
      check_keep(l, s[1]);
      check_write(l, s[1], true);
      check_write(l, s[1], false);
      check_write(l, s[0] + 37, true);  // a short list: every entry, then padding
      cases += 5;
    }
  }
  // keep_top_k of a CTA: the resident path (n <= 4096) and the streamed one, both thread counts of the kernels.
  // (256 OS threads per CTA on a CI machine's few cores: a smaller set than the warp's.)
  const int cta_shapes[][2] = {{3000, 2048}, {4096, 2560}, {100, 2048}, {700, 1}, {9000, 2048}};
  for (const char* kind : {"relu", "few values", "huge span"}) {
    for (const auto& s : cta_shapes) {
      const List l = make_list(kind, s[0], rng);
      check_cta_keep<128>(l, s[1], false, true);
      check_cta_keep<256>(l, s[1], true, true);
      check_cta_keep<256>(l, s[1], false, false);
      cases += 3;
    }
  }
  std::printf("selections (emulated warps and CTAs): %d cases, %d failed\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
