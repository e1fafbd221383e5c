// GPU check of the CTA-wide exact top-k selection of the fused indexer (csrc/sm90/indexer_topk/select.cuh,
// keep_top_k) at both thread counts the kernels use (128: the FP8 walks; 256: the bf16 walk), against a sort
// on the host. One CTA per list; lists of many shapes (normal scores, wide and narrow spans, integer ties,
// all equal, signed zeros, short and streamed lengths), selected in place (as the compactions do) and into a
// separate output (as the final select does), with and without scores. Checked per list: the count kept
// (min(n, k)), that the kept entries are distinct entries of the list (index and score as given), that their
// scores are exactly the k largest as a multiset, and the threshold of the rule (the k-th largest score's
// key when n > k). Also the one-warp selections of the FP8 band re-score (warp_select.cuh; four warps per CTA,
// each on its own list, of any length): warp_split_top_k's three-way split by rank (the k largest to one output,
// the entries ranked k + 1 .. k_keep to the list itself, as the kernel does) and warp_keep_top_k: the counts,
// distinct entries, disjoint sides and exact multisets on every side (ties included).
// Exit: 0 all pass, 1 a failure, 77 no GPU (CTest skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check_common.cuh"
#include "sm90/indexer_topk/select.cuh"
#include "sm90/indexer_topk/warp_select.cuh"

namespace {

using flashdsa::sm90::indexer_topk_impl::Kept;
using flashdsa::sm90::indexer_topk_impl::keep_top_k;
using flashdsa::sm90::indexer_topk_impl::Scratch;
using flashdsa::sm90::indexer_topk_impl::score_key;
using flashdsa::sm90::indexer_topk_impl::kWarpHistBins;
using flashdsa::sm90::indexer_topk_impl::warp_keep_top_k;
using flashdsa::sm90::indexer_topk_impl::warp_split_top_k;
using flashdsa_check::DeviceBuffer;
using flashdsa_check::download;
using flashdsa_check::upload;

// List b: (scores, idx)[off[b], off[b] + n[b]) with its k; the result goes to (out_s, out_i) at the same
// offset (or in place), count and thr to res[2 b], res[2 b + 1].
template <int NTH>
__global__ void __launch_bounds__(NTH) select_lists(float* scores, int* idx, const int* off, const int* n,
                                                    const int* k, float* out_s, int* out_i, bool in_place,
                                                    bool with_scores, uint32_t* res) {
  __shared__ Scratch<NTH> sc;
  const int b = blockIdx.x;
  float* ls = scores + off[b];
  int* li = idx + off[b];
  float* ds = in_place ? ls : out_s + off[b];
  int* di = in_place ? li : out_i + off[b];
  const Kept kept = keep_top_k(ls, li, n[b], k[b], with_scores ? ds : nullptr, di, sc);
  if (threadIdx.x == 0) {
    res[2 * b] = static_cast<uint32_t>(kept.count);
    res[2 * b + 1] = kept.thr;
  }
}

// The one-warp selections (warp_select.cuh): warp w of CTA c takes list b = 4 c + w: warp_keep_top_k of its k
// largest into keep_i at the list's offset (count to res[3 b + 2]), then warp_split_top_k as split_lists does.
constexpr int kListWarps = 4;
__global__ void __launch_bounds__(32 * kListWarps) warp_split_lists(const float* scores, int* idx, const int* off,
                                                                   const int* n, const int* k, const int* k_keep,
                                                                   int* out_i, int* keep_i, int* res, int L) {
  __shared__ __align__(16) uint32_t hist[kListWarps][kWarpHistBins];
  const int w = threadIdx.x >> 5, b = blockIdx.x * kListWarps + w;
  if (b >= L) return;
  const int kept = warp_keep_top_k(scores + off[b], idx + off[b], n[b], k[b], keep_i + off[b], hist[w]);
  const int2 r = warp_split_top_k(scores + off[b], idx + off[b], n[b], k[b], k_keep[b], out_i + off[b], idx + off[b],
                                  hist[w]);
  if ((threadIdx.x & 31) == 0) {
    res[3 * b] = r.x;
    res[3 * b + 1] = r.y;
    res[3 * b + 2] = kept;
  }
}

struct List {
  std::string kind;
  std::vector<float> s;
  int k;
  int k_keep = 0;  // split_top_k only
};

std::vector<float> make_scores(const std::string& kind, int n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> small_int(-2, 2);
  std::vector<float> s(n);
  for (int i = 0; i < n; ++i) {
    if (kind == "normal") s[i] = normal(rng);
    else if (kind == "positive") s[i] = std::fabs(normal(rng)) * 3.f;  // ReLU-like, one sign
    else if (kind == "narrow") s[i] = 1.f + 1e-6f * normal(rng);      // a few ulps of span
    else if (kind == "ints") s[i] = static_cast<float>(small_int(rng));
    else if (kind == "equal") s[i] = 0.25f;
    else if (kind == "zeros") s[i] = (rng() & 1) ? 0.f : -0.f;
    else if (kind == "wide") s[i] = std::ldexp(normal(rng), static_cast<int>(rng() % 120) - 60);
    else if (kind == "clustered") s[i] = static_cast<float>(rng() % 40) + 1e-3f * normal(rng);  // bins of few keys
    else std::abort();
  }
  return s;
}

// Lays the lists out back to back, 16-byte aligned (as the kernels' lists are); ids are distinct and not
// positions: entry i of list b has id 1000001 + off[b] + i. n, k, k_keep: each list's length and parameters.
void pack_lists(const std::vector<List>& lists, std::vector<int>& off, std::vector<float>& s, std::vector<int>& id,
                std::vector<int>& n, std::vector<int>& k, std::vector<int>& k_keep) {
  for (const List& l : lists) {
    off.push_back(static_cast<int>(s.size()));
    n.push_back(static_cast<int>(l.s.size()));
    k.push_back(l.k);
    k_keep.push_back(l.k_keep);
    for (size_t i = 0; i < l.s.size(); ++i) {
      s.push_back(l.s[i]);
      id.push_back(static_cast<int>(1000000 + s.size()));
    }
    while (s.size() % 4 != 0) {
      s.push_back(NAN);
      id.push_back(-7);
    }
  }
}

template <int NTH>
bool run_case_set(const std::vector<List>& lists, bool in_place, bool with_scores) {
  std::vector<int> off, n, k, unused;
  std::vector<float> s;
  std::vector<int> id;
  pack_lists(lists, off, s, id, n, k, unused);
  const int L = static_cast<int>(lists.size());
  const size_t total = s.size();
  DeviceBuffer d_s(total * 4), d_os(total * 4), d_i(total * 4), d_oi(total * 4), d_off(L * 4), d_n(L * 4), d_k(L * 4),
      d_res(2 * L * 4);
  upload(d_s, s), upload(d_i, id), upload(d_off, off), upload(d_n, n), upload(d_k, k);
  FLASHDSA_CHECK_CUDA(cudaMemset(d_os.ptr, 0xff, total * 4));
  FLASHDSA_CHECK_CUDA(cudaMemset(d_oi.ptr, 0xff, total * 4));
  select_lists<NTH><<<L, NTH>>>(d_s.as<float>(), d_i.as<int>(), d_off.as<int>(), d_n.as<int>(), d_k.as<int>(),
                                d_os.as<float>(), d_oi.as<int>(), in_place, with_scores, d_res.as<uint32_t>());
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> os = download<float>(in_place ? d_s.ptr : d_os.ptr, total);
  const std::vector<int> oi = download<int>(in_place ? d_i.ptr : d_oi.ptr, total);
  const std::vector<uint32_t> res = download<uint32_t>(d_res.ptr, 2 * L);

  int failures = 0;
  for (int b = 0; b < L; ++b) {
    const List& l = lists[b];
    const int nb = n[b], kb = k[b], want = std::min(nb, kb);
    std::vector<uint32_t> keys(nb);
    for (int i = 0; i < nb; ++i) keys[i] = score_key(l.s[i]);
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    std::string why;
    const int count = static_cast<int>(res[2 * b]);
    if (count != want) why = "count " + std::to_string(count) + " != " + std::to_string(want);
    std::vector<uint32_t> got;
    std::vector<char> used(nb, 0);
    for (int j = 0; why.empty() && j < count; ++j) {
      const int pos = oi[off[b] + j] - 1000001 - off[b];  // the entry's position in its list
      if (pos < 0 || pos >= nb || used[pos]) {
        why = "slot " + std::to_string(j) + ": not a distinct entry of the list";
        break;
      }
      used[pos] = 1;
      if (with_scores && score_key(os[off[b] + j]) != keys[pos]) why = "slot " + std::to_string(j) + ": score changed";
      got.push_back(keys[pos]);
    }
    if (why.empty()) {
      std::sort(got.begin(), got.end(), std::greater<uint32_t>());
      if (!std::equal(got.begin(), got.end(), sorted.begin())) why = "not the top-k multiset";
    }
    // The rule's threshold: the k-th largest key, or (a bin taken whole) its bin's lower edge - 1; either
    // way in [the (k+1)-th key, the k-th key], so that later keys above it are exactly those that beat the k-th.
    if (why.empty() && nb > kb && !(res[2 * b + 1] >= sorted[kb] && res[2 * b + 1] <= sorted[kb - 1]))
      why = "threshold outside [(k+1)-th, k-th] key";
    if (!why.empty()) {
      if (++failures <= 10)
        std::printf("  FAIL NTH %d %s n %d k %d %s%s: %s\n", NTH, l.kind.c_str(), nb, kb, in_place ? "in place" : "copy",
                    with_scores ? "" : " (no scores)", why.c_str());
    }
  }
  std::printf("NTH %3d %-8s %-12s %4d lists: %s\n", NTH, in_place ? "in-place" : "copy",
              with_scores ? "scores" : "no-scores", L, failures == 0 ? "PASS" : "FAIL");
  return failures == 0;
}

// The one-warp selections on every list: warp_split_top_k (top to one output, the rest in place) and
// warp_keep_top_k (the top again, to a third output).
bool run_warp_split_set(const std::vector<List>& lists) {
  std::vector<int> off, n, k, kk;
  std::vector<float> s;
  std::vector<int> id;
  pack_lists(lists, off, s, id, n, k, kk);
  const int L = static_cast<int>(lists.size());
  const size_t total = s.size();
  constexpr int R = 3;  // results per list: top count, rest count, warp_keep_top_k's count
  DeviceBuffer d_s(total * 4), d_i(total * 4), d_oi(total * 4), d_ki(total * 4), d_off(L * 4), d_n(L * 4), d_k(L * 4),
      d_kk(L * 4), d_res(R * L * 4);
  upload(d_s, s), upload(d_i, id), upload(d_off, off), upload(d_n, n), upload(d_k, k), upload(d_kk, kk);
  FLASHDSA_CHECK_CUDA(cudaMemset(d_oi.ptr, 0xff, total * 4));
  FLASHDSA_CHECK_CUDA(cudaMemset(d_ki.ptr, 0xff, total * 4));
  warp_split_lists<<<(L + kListWarps - 1) / kListWarps, 32 * kListWarps>>>(
      d_s.as<float>(), d_i.as<int>(), d_off.as<int>(), d_n.as<int>(), d_k.as<int>(), d_kk.as<int>(), d_oi.as<int>(),
      d_ki.as<int>(), d_res.as<int>(), L);
  FLASHDSA_CHECK_CUDA(cudaGetLastError());
  FLASHDSA_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<int> top = download<int>(d_oi.ptr, total), rest = download<int>(d_i.ptr, total),
                         keep = download<int>(d_ki.ptr, total), res = download<int>(d_res.ptr, R * L);
  int failures = 0;
  for (int b = 0; b < L; ++b) {
    const List& l = lists[b];
    const int nb = n[b], want_top = std::min(nb, k[b]), want_rest = std::min(nb, kk[b]) - want_top;
    std::vector<uint32_t> keys(nb);
    for (int i = 0; i < nb; ++i) keys[i] = score_key(l.s[i]);
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    std::string why;
    if (res[R * b] != want_top || res[R * b + 1] != want_rest || res[R * b + 2] != want_top)
      why = "counts " + std::to_string(res[R * b]) + " / " + std::to_string(res[R * b + 1]) + " != " +
            std::to_string(want_top) + " / " + std::to_string(want_rest);
    std::vector<char> used(nb, 0);
    // side 0: the top (out_i), side 1: the rest (the list's own slots), side 2: warp_keep_top_k's output; each must
    // be the exact multiset of its ranks
    for (int side = 0; side < 3 && why.empty(); ++side) {
      const std::vector<int>& got_i = side == 0 ? top : (side == 1 ? rest : keep);
      const int cnt = side == 1 ? want_rest : want_top;
      if (side == 2) std::fill(used.begin(), used.end(), 0);
      std::vector<uint32_t> got;
      for (int j = 0; j < cnt; ++j) {
        const int pos = got_i[off[b] + j] - 1000001 - off[b];
        if (pos < 0 || pos >= nb || used[pos]) {
          why = std::string(side == 0 ? "top" : (side == 1 ? "rest" : "keep")) + " slot " + std::to_string(j) +
                ": not a distinct entry";
          break;
        }
        used[pos] = 1;
        got.push_back(keys[pos]);
      }
      if (!why.empty()) break;
      std::sort(got.begin(), got.end(), std::greater<uint32_t>());
      const auto first = sorted.begin() + (side == 1 ? want_top : 0);
      if (!std::equal(got.begin(), got.end(), first))
        why = side == 1 ? "rest: not ranks k+1..k_keep" : (side == 0 ? "top: not the k largest" : "keep: not the k largest");
    }
    if (!why.empty() && ++failures <= 10)
      std::printf("  FAIL warp split %s n %d k %d k_keep %d: %s\n", l.kind.c_str(), nb, k[b], kk[b], why.c_str());
  }
  std::printf("one warp split + keep %4d lists: %s\n", L, failures == 0 ? "PASS" : "FAIL");
  return failures == 0;
}

}  // namespace

int main() {
  if (!flashdsa_check::have_gpu()) return flashdsa_check::kSkipped;
  std::mt19937 rng(2026);
  std::vector<List> lists;
  const char* kinds[] = {"normal", "positive", "narrow", "ints", "equal", "zeros", "wide", "clustered"};
  const int ns[] = {1, 5, 33, 100, 1000, 2047, 2048, 2049, 2600, 3968, 4096, 4097, 6000, 9000};
  const int ks[] = {1, 7, 64, 2048, 2560};
  for (const char* kind : kinds)
    for (int n : ns)
      for (int k : ks) {
        if (k > n + 64 && n > 100) continue;  // a few n <= k cases per kind are enough
        lists.push_back(List{kind, make_scores(kind, n, rng), k});
      }
  // Many normal lists at the kernels' usual sizes (compactions of 3969..4096 to K, cuts, final selects):
  // the boundary bins of these are where the small-bin resolve of the resident select runs.
  for (int r = 0; r < 300; ++r) {
    const int n = 1500 + static_cast<int>(rng() % 2597);
    const int k = (r % 3 == 0) ? 2048 : (r % 3 == 1 ? 328 : 2560);
    lists.push_back(List{r % 2 ? "normal" : "positive", make_scores(r % 2 ? "normal" : "positive", n, rng), k});
  }
  bool ok = true;
  for (bool in_place : {true, false})
    for (bool with_scores : {true, false}) {
      if (in_place && !with_scores) continue;  // compactions always keep the scores
      ok &= run_case_set<128>(lists, in_place, with_scores);
      ok &= run_case_set<256>(lists, in_place, with_scores);
    }
  // The one-warp split: k_keep >= k; the band re-score's k = K - b, k_keep = C, and the edges (k_keep = k,
  // k_keep >= n, n <= k), lists of every length above.
  std::vector<List> splits;
  for (const List& l : lists) {
    const int n = static_cast<int>(l.s.size());
    for (int extra : {0, 5, 512, 4096}) splits.push_back(List{l.kind, l.s, l.k, l.k + extra});
    if (n > 4) splits.push_back(List{l.kind, l.s, n / 3, n - 1});
  }
  for (int r = 0; r < 200; ++r) {  // the band's shape: C = 2560 of up to 4096 candidates, K - b = 1536 / 1792
    const int n = 2000 + static_cast<int>(rng() % 2097);
    const char* kind = r % 3 == 0 ? "clustered" : (r % 3 == 1 ? "normal" : "positive");
    splits.push_back(List{kind, make_scores(kind, n, rng), r % 2 ? 1536 : 1792, 2560});
  }
  ok &= run_warp_split_set(splits);
  std::printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
  return ok ? 0 : 1;
}
