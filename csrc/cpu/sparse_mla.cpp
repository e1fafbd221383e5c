// CPU sparse MLA forward / backward and attention mass (docs/spec.md §4, §5, §6).
//
// Every op walks the query rows in parallel; a row keeps its scores in a [H, K] scratch (per
// worker, never T x H x K). The backward computes dq (and, when asked, the attention mass from
// the same probabilities) row by row, then dkv key-major (see key_partition.h): each key-range
// task recomputes the probabilities of the slots that point into its range, so dkv is bitwise
// reproducible for any thread count.
#include <algorithm>
#include <cmath>

#include "cpu/backend.h"
#include "cpu/key_partition.h"
#include "cpu/op_inputs.h"

namespace flashdsa::cpu {
namespace {

// Per-worker scratch of a row: q [H, D_qk], scores [H, K], slot ids and key-row pointers [K].
template <class Acc>
struct RowScratch {
  WorkerScratch<Acc> q, s;
  WorkerScratch<int32_t> slots;
  WorkerScratch<const Acc*> rows;

  RowScratch(int workers, int H, int K, int D_qk)
      : q(workers, static_cast<size_t>(H) * D_qk), s(workers, static_cast<size_t>(H) * K), slots(workers, K),
        rows(workers, K) {}
};

template <class Act>
Status sparse_mla_fwd_impl(const SparseMlaFwdParams& p) {
  using Acc = AccOf<Act>;
  const AttentionInputs<Act> in(p.attn, p.T_kv);
  const TopkIndices idx(p.topk, p.T, p.T_kv);
  const int H = p.attn.H, K = p.topk.K, D_v = p.attn.D_v;
  Act* out = static_cast<Act*>(p.out);
  Acc* lse_out = static_cast<Acc*>(p.lse);

  const int workers = detail::num_threads();
  RowScratch<Acc> scratch(workers, H, K, p.attn.D_qk);
  WorkerScratch<Acc> o_scratch(workers, static_cast<size_t>(H) * D_v);  // [H, D_v]
  WorkerScratch<Acc*> o_rows_scratch(workers, H);

  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* s = scratch.s(worker);
    const Acc** rows = scratch.rows(worker);
    Acc* o = o_scratch(worker);
    Acc** o_rows = o_rows_scratch(worker);
    row_pointers(o, H, D_v, o_rows);
    for (int64_t t = begin; t < end; ++t) {
      Act* out_t = out + t * H * D_v;
      Acc* lse_t = lse_out + t * H;
      const int n = idx.valid_slots(t, in.keys.data(), p.attn.D_qk, scratch.slots(worker), rows);
      if (n == 0) {
        std::fill(out_t, out_t + H * D_v, from_acc<Act>(Acc(0)));
        std::fill(lse_t, lse_t + H, neg_inf<Acc>());
        continue;
      }
      in.load_q(t, q);
      in.scores(q, rows, n, s, K);
      // s becomes P = exp(s - lse) in place.
      for (int h = 0; h < H; ++h) {
        Acc* sh = s + h * K;
        const Acc lse = static_cast<Acc>(logsumexp(sh, n));
        lse_t[h] = lse;
        for (int i = 0; i < n; ++i) sh[i] = std::exp(sh[i] - lse);
      }
      combine_rows(H, n, D_v, s, K, 1, rows, o_rows, false);
      store_row(o, static_cast<int64_t>(H) * D_v, out_t);
    }
  });
  return Status::OK();
}

// Turns scores s [H, ld] of n slots into scale * dS in place, and dp [H, ld] (dout . V) into P:
//   P = exp(s - lse),  dS = P (dP - Delta).
// Shared by the dq and dkv passes so both see the same values.
template <class Acc>
void probabilities_and_score_grads(int H, int64_t ld, int n, Acc scale, const Acc* lse, const Acc* delta, Acc* s,
                                   Acc* dp) {
  for (int h = 0; h < H; ++h) {
    Acc* sh = s + h * ld;
    Acc* dph = dp + h * ld;
    for (int i = 0; i < n; ++i) {
      const Acc prob = std::exp(sh[i] - lse[h]);
      sh[i] = scale * prob * (dph[i] - delta[h]);
      dph[i] = prob;
    }
  }
}

template <class Act>
Status sparse_mla_bwd_impl(const SparseMlaBwdParams& p) {
  using Acc = AccOf<Act>;
  const AttentionInputs<Act> in(p.attn, p.T_kv);
  const TopkIndices idx(p.topk, p.T, p.T_kv);
  const int H = p.attn.H, K = p.topk.K, D_qk = p.attn.D_qk, D_v = p.attn.D_v;
  const Act* out = static_cast<const Act*>(p.out);
  const Act* dout_all = static_cast<const Act*>(p.dout);
  const Acc* lse = static_cast<const Acc*>(p.lse);
  Act* dq_out = static_cast<Act*>(p.dq);
  Acc* dkv = static_cast<Acc*>(p.dkv);
  Acc* mass_out = static_cast<Acc*>(p.mass);  // optional [T, K]

  const int workers = detail::num_threads();
  RowScratch<Acc> scratch(workers, H, K, D_qk);
  WorkerScratch<Acc> dp_scratch(workers, static_cast<size_t>(H) * K);      // [H, K]
  WorkerScratch<Acc> dout_scratch(workers, static_cast<size_t>(H) * D_v);  // [H, D_v]
  WorkerScratch<Acc> dq_scratch(workers, static_cast<size_t>(H) * D_qk);   // [H, D_qk]
  WorkerScratch<Acc*> head_rows_scratch(workers, 2 * H);
  Buffer<Acc> delta(static_cast<size_t>(p.T) * H);  // [T, H] rowsum(dout * out)
  auto load_dout = [&](int64_t t, Acc* dst) { load_rows(dout_all + t * H * D_v, D_v, H, D_v, dst); };

  // Pass 1, row-major: Delta, dq and (optionally) the attention mass.
  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* s = scratch.s(worker);
    Acc* dp = dp_scratch(worker);
    Acc* dout = dout_scratch(worker);
    Acc* dq = dq_scratch(worker);
    int32_t* slots = scratch.slots(worker);
    const Acc** rows = scratch.rows(worker);
    Acc** dq_rows = head_rows_scratch(worker);
    row_pointers(dq, H, D_qk, dq_rows);
    for (int64_t t = begin; t < end; ++t) {
      load_dout(t, dout);
      Acc* delta_t = delta.data() + t * H;
      for (int h = 0; h < H; ++h) {
        const Act* out_th = out + (t * H + h) * D_v;
        Acc sum = 0;
        for (int d = 0; d < D_v; ++d) sum += dout[h * D_v + d] * to_acc(out_th[d]);
        delta_t[h] = sum;
      }
      const int n = idx.valid_slots(t, in.keys.data(), D_qk, slots, rows);
      if (n > 0) {
        in.load_q(t, q);
        in.scores(q, rows, n, s, K);
        dot_rows(dout, D_v, H, rows, n, D_v, Acc(1), dp, K);
        probabilities_and_score_grads(H, K, n, in.scale, lse + t * H, delta_t, s, dp);
      }
      if (mass_out != nullptr) {
        // dp now holds P [H, n]: mass[t, slot] = sum_h P, in increasing h as attention_mass_impl
        // sums it (the same values in the same order: bitwise equal to run_attention_mass).
        Acc* mass_t = mass_out + t * K;
        std::fill(mass_t, mass_t + K, Acc(0));
        for (int h = 0; h < H; ++h) {
          for (int i = 0; i < n; ++i) mass_t[slots[i]] += dp[h * K + i];
        }
      }
      combine_rows(H, n, D_qk, s, K, 1, rows, dq_rows, false);
      store_row(dq, static_cast<int64_t>(H) * D_qk, dq_out + t * H * D_qk);
    }
  });

  // Pass 2, key-major: dkv[s] = sum over (t, j) with indices[t, j] = s, in that order.
  auto every_slot = [](int64_t, int) { return true; };
  for_each_key_range(count_pairs(idx, every_slot), [&](int64_t key_begin, int64_t key_end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* s = scratch.s(worker);
    Acc* dp = dp_scratch(worker);
    Acc* dout = dout_scratch(worker);
    const Acc** rows = scratch.rows(worker);
    Acc** q_rows = head_rows_scratch(worker);
    Acc** dout_rows = q_rows + H;
    row_pointers(q, H, D_qk, q_rows);
    row_pointers(dout, H, D_v, dout_rows);
    auto load = [&](int64_t t) {
      in.load_q(t, q);
      load_dout(t, dout);
    };
    scatter_key_batches(idx, key_begin, key_end, every_slot, dkv, D_qk, load,
                        [&](int64_t t, const int32_t* slots, int n, Acc* const* dkv_rows) {
      for (int i = 0; i < n; ++i) rows[i] = in.key_row(idx.row(t)[slots[i]]);
      in.scores(q, rows, n, s, K);
      dot_rows(dout, D_v, H, rows, n, D_v, Acc(1), dp, K);
      probabilities_and_score_grads(H, K, n, in.scale, lse + t * H, delta.data() + t * H, s, dp);
      // dkv[key_i] += sum_h scale dS[h, i] q[h];  dkv[key_i, :D_v] += sum_h P[h, i] dout[h]
      combine_rows(n, H, D_qk, s, 1, K, q_rows, dkv_rows, true);
      combine_rows(n, H, D_v, dp, 1, K, dout_rows, dkv_rows, true);
    });
  });
  return Status::OK();
}

template <class Act>
Status attention_mass_impl(const AttnMassParams& p) {
  using Acc = AccOf<Act>;
  const AttentionInputs<Act> in(p.attn, p.T_kv);
  const TopkIndices idx(p.topk, p.T, p.T_kv);
  const int H = p.attn.H, K = p.topk.K;
  const Acc* lse = static_cast<const Acc*>(p.lse);
  Acc* mass = static_cast<Acc*>(p.mass);

  RowScratch<Acc> scratch(detail::num_threads(), H, K, p.attn.D_qk);
  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* s = scratch.s(worker);
    int32_t* slots = scratch.slots(worker);
    const Acc** rows = scratch.rows(worker);
    for (int64_t t = begin; t < end; ++t) {
      Acc* mass_t = mass + t * K;
      std::fill(mass_t, mass_t + K, Acc(0));
      const int n = idx.valid_slots(t, in.keys.data(), p.attn.D_qk, slots, rows);
      if (n == 0) continue;
      in.load_q(t, q);
      in.scores(q, rows, n, s, K);
      const Acc* lse_t = lse + t * H;
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < n; ++i) mass_t[slots[i]] += std::exp(s[h * K + i] - lse_t[h]);
      }
    }
  });
  return Status::OK();
}

}  // namespace

Status sparse_mla_fwd(const SparseMlaFwdParams& p) {
  return dispatch_act(p.attn.dtype, [&](auto tag) { return sparse_mla_fwd_impl<decltype(tag)>(p); });
}

Status sparse_mla_bwd(const SparseMlaBwdParams& p) {
  return dispatch_act(p.attn.dtype, [&](auto tag) { return sparse_mla_bwd_impl<decltype(tag)>(p); });
}

Status attention_mass(const AttnMassParams& p) {
  return dispatch_act(p.attn.dtype, [&](auto tag) { return attention_mass_impl<decltype(tag)>(p); });
}

}  // namespace flashdsa::cpu
