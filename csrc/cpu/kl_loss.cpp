// CPU indexer KL losses, sparse and dense (docs/spec.md §6).
//
// Per row t with support S_t (valid top-k slots, or the visible keys [k_start, k_end)):
//   score_i = sum_h w[t,h] f(q_idx[t,h] . k_idx[key_i]),  p_I = softmax(score) over S_t,
//   target = mass / sum(mass) (sparse) or the head-mean of the main attention softmax (dense),
//   loss_rows[t] = sum_i target_i (log target_i - log p_I_i),  0 log 0 = 0,
//   g_i = G_t (p_I_i - target_i),  G_t = grad_scale * grad_rows[t].
// An empty support gives loss 0 and zero gradients. So does a sparse row whose mass sums to 0
// (no target distribution exists).
//
// The forward also writes the optional row statistics {lse of the scores, sum of the mass}; the
// backward recomputes them and ignores row_stats.
// Backward: dweights and dq_idx row by row; dk_idx key-major (key_partition.h), so it is bitwise
// reproducible for any thread count. The sparse pass keeps g in a [T, K] buffer; the dense pass
// cannot (T x T_kv) and recomputes g for every pair from the saved row statistics.
#include <algorithm>
#include <cmath>

#include "cpu/backend.h"
#include "cpu/key_partition.h"
#include "cpu/op_inputs.h"

namespace flashdsa::cpu {
namespace {

constexpr int kKeyTile = 256;

// Per-worker scratch of one indexer row: q_idx [H_I, D_I], pointers to its head rows, qk
// [H_I, cols], scores / gradients [cols], key-row pointers [cols], dweights [H_I].
template <class Acc>
struct IndexerScratch {
  WorkerScratch<Acc> q, qk, score, g;
  WorkerScratch<const Acc*> rows, q_rows;
  WorkerScratch<double> dw;

  IndexerScratch(int workers, int H_I, int D_I, int cols)
      : q(workers, static_cast<size_t>(H_I) * D_I), qk(workers, static_cast<size_t>(H_I) * cols),
        score(workers, cols), g(workers, cols), rows(workers, cols), q_rows(workers, H_I), dw(workers, H_I) {}
};

// KL(target || p_I) of one row, and optionally g = G (p_I - target), from the scores, the log
// normalizer of the scores and the target probabilities (each [n]).
template <class Acc>
double kl_terms(const Acc* score, double lse_scores, const double* target, int n, double G, Acc* g) {
  double loss = 0;
  for (int i = 0; i < n; ++i) {
    const double log_p = static_cast<double>(score[i]) - lse_scores;
    // 0 log 0 = 0; a NaN target (NaN mass) is not skipped: it makes the loss NaN, like its gradient.
    if (target[i] != 0) loss += target[i] * (std::log(target[i]) - log_p);
    if (g) g[i] = static_cast<Acc>(G * (std::exp(log_p) - target[i]));
  }
  return loss;
}

template <class Act>
Status sparse_kl_impl(const SparseKlParams& p, bool backward) {
  using Acc = AccOf<Act>;
  const IndexerInputs<Act> in(p.indexer, p.T_kv);
  const TopkIndices idx(p.topk, p.T, p.T_kv);
  const int H = p.indexer.H_I, D = p.indexer.D_I, K = p.topk.K;
  const Acc* mass = static_cast<const Acc*>(p.mass);
  const int workers = detail::num_threads();
  IndexerScratch<Acc> scratch(workers, H, D, K);
  WorkerScratch<int32_t> slots_scratch(workers, K);
  WorkerScratch<double> target_scratch(workers, K);
  WorkerScratch<Acc> dq_scratch(workers, static_cast<size_t>(H) * D);
  WorkerScratch<Acc*> dq_rows_scratch(workers, H);
  Buffer<Acc> g_all(backward ? static_cast<size_t>(p.T) * K : 0);  // [T, K] d total / d score per slot

  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* qk = scratch.qk(worker);
    Acc* score = scratch.score(worker);
    Acc* g = scratch.g(worker);
    const Acc** rows = scratch.rows(worker);
    int32_t* slots = slots_scratch(worker);
    double* target = target_scratch(worker);
    double* dw = scratch.dw(worker);
    Acc* dq = dq_scratch(worker);
    Acc** dq_rows = dq_rows_scratch(worker);
    row_pointers(dq, H, D, dq_rows);
    for (int64_t t = begin; t < end; ++t) {
      const int n = idx.valid_slots(t, in.keys.data(), D, slots, rows);
      double mass_sum = 0;
      for (int i = 0; i < n; ++i) mass_sum += mass[t * K + slots[i]];
      double loss = 0;
      double lse = neg_inf<double>();  // of the scores; stays -inf for a row without a target
      std::fill(dw, dw + H, 0.0);
      int n_grad = 0;  // slots that carry a gradient
      if (n > 0 && mass_sum != 0) {
        in.load_q(t, q);
        in.scores(q, in.w(t), rows, n, qk, K, score);
        for (int i = 0; i < n; ++i) target[i] = mass[t * K + slots[i]] / mass_sum;
        const double G = backward ? loss_row_grad<Acc>(p.grad_scale, p.grad_rows, t) : 0;
        lse = logsumexp(score, n);
        loss = kl_terms(score, lse, target, n, G, backward ? g : nullptr);
        if (backward) {
          in.score_grads(in.w(t), g, n, qk, K, dw);
          n_grad = n;
        }
      }
      if (!backward) {
        static_cast<Acc*>(p.loss_rows)[t] = static_cast<Acc>(loss);
        if (p.row_stats) {  // {lse, sum of mass}, {-inf, 0} without a target (ops.h)
          Acc* stats = static_cast<Acc*>(p.row_stats) + 2 * t;
          stats[0] = static_cast<Acc>(lse);
          stats[1] = static_cast<Acc>(lse == neg_inf<double>() ? 0.0 : mass_sum);
        }
        continue;
      }
      Acc* g_t = g_all.data() + t * K;
      std::fill(g_t, g_t + K, Acc(0));
      for (int i = 0; i < n_grad; ++i) g_t[slots[i]] = g[i];
      Acc* dw_out = static_cast<Acc*>(p.dweights) + t * H;
      for (int h = 0; h < H; ++h) dw_out[h] = static_cast<Acc>(dw[h]);
      combine_rows(H, n_grad, D, qk, K, 1, rows, dq_rows, false);
      store_row(dq, static_cast<int64_t>(H) * D, static_cast<Act*>(p.dq_idx) + t * H * D);
    }
  });
  if (!backward) return Status::OK();

  // dk_idx[s] = sum over (t, j) with indices[t, j] = s and g != 0, in that order.
  Acc* dk = static_cast<Acc*>(p.dk_idx);
  auto has_grad = [&](int64_t t, int j) { return g_all[t * K + j] != 0; };
  for_each_key_range(count_pairs(idx, has_grad), [&](int64_t key_begin, int64_t key_end, int worker) {
    Acc* q = scratch.q(worker);
    Acc* qk = scratch.qk(worker);
    Acc* g = scratch.g(worker);
    const Acc** rows = scratch.rows(worker);
    const Acc** q_rows = scratch.q_rows(worker);
    row_pointers<const Acc>(q, H, D, q_rows);
    auto load = [&](int64_t t) { in.load_q(t, q); };
    scatter_key_batches(idx, key_begin, key_end, has_grad, dk, D, load,
                        [&](int64_t t, const int32_t* slots, int n, Acc* const* dk_rows) {
      for (int i = 0; i < n; ++i) {
        rows[i] = in.key_row(idx.row(t)[slots[i]]);
        g[i] = g_all[t * K + slots[i]];
      }
      dot_rows(q, D, H, rows, n, D, Acc(1), qk, K);
      in.score_grads(in.w(t), g, n, qk, K, nullptr);
      // dk_idx[key_i] += sum_h dqk[h, i] q_idx[h]
      combine_rows(n, H, D, qk, 1, K, q_rows, dk_rows, true);
    });
  });
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Dense formulation.

// Everything one dense row needs, per worker: both query rows, a key tile and the row buffers.
template <class Act>
struct DenseRow {
  using Acc = AccOf<Act>;
  const AttentionInputs<Act>& main;
  const IndexerInputs<Act>& indexer;
  Acc* q;             // [H, D_qk]
  Acc* s;             // [H, tile] main scores
  const Acc** kv_rows;  // [tile]
  double* target;     // [tile]
  const Acc** k_rows;   // [tile]
  Acc* qk;            // [H_I, tile]
  Acc* score;         // [tile]; in pass 1 of a row: [visible keys]
  Acc* g;             // [tile]

  // Main scores and index scores of keys [s0, s0 + c).
  void tile_scores(int64_t s0, int c, int64_t t, const Acc* q_idx) {
    for (int i = 0; i < c; ++i) {
      kv_rows[i] = main.key_row(s0 + i);
      k_rows[i] = indexer.key_row(s0 + i);
    }
    main.scores(q, kv_rows, c, s, kKeyTile);
    indexer.scores(q_idx, indexer.w(t), k_rows, c, qk, kKeyTile, score);
  }
  // target_i = (1/H) sum_h exp(s[h, i] - lse_main[h]) for the current tile.
  void tile_target(int c, const double* lse_main) {
    std::fill(target, target + c, 0.0);
    for (int h = 0; h < main.H; ++h) {
      for (int i = 0; i < c; ++i) target[i] += std::exp(static_cast<double>(s[h * kKeyTile + i]) - lse_main[h]);
    }
    for (int i = 0; i < c; ++i) target[i] /= main.H;
  }
};

template <class Act>
Status dense_kl_impl(const DenseKlParams& p, bool backward) {
  using Acc = AccOf<Act>;
  const AttentionInputs<Act> main(p.attn, p.T_kv);
  const IndexerInputs<Act> in(p.indexer, p.T_kv);
  const int H = p.attn.H, H_I = p.indexer.H_I, D = p.indexer.D_I;
  const int workers = detail::num_threads();
  IndexerScratch<Acc> scratch(workers, H_I, D, kKeyTile);
  WorkerScratch<Acc> q_scratch(workers, static_cast<size_t>(H) * p.attn.D_qk);
  WorkerScratch<Acc> s_scratch(workers, static_cast<size_t>(H) * kKeyTile);
  WorkerScratch<const Acc*> kv_rows_scratch(workers, kKeyTile);
  WorkerScratch<double> target_scratch(workers, kKeyTile);
  WorkerScratch<Acc> row_scores_scratch(workers, p.T_kv);  // [visible keys] index scores of a row
  WorkerScratch<Acc> dq_scratch(workers, static_cast<size_t>(H_I) * D);
  WorkerScratch<Acc*> dq_rows_scratch(workers, H_I);
  Buffer<double> lse_main(static_cast<size_t>(p.T) * H);  // [T, H] of the main attention
  Buffer<double> lse_index(p.T);                          // [T] of the index scores

  auto make_row = [&](int worker) {
    return DenseRow<Act>{main,
                         in,
                         q_scratch(worker),
                         s_scratch(worker),
                         kv_rows_scratch(worker),
                         target_scratch(worker),
                         scratch.rows(worker),
                         scratch.qk(worker),
                         scratch.score(worker),
                         scratch.g(worker)};
  };

  // Row pass: statistics (pass 1 over the keys), then loss, dweights and dq_idx (pass 2).
  detail::parallel_for(p.T, row_grain(p.T), [&](int64_t begin, int64_t end, int worker) {
    DenseRow<Act> row = make_row(worker);
    Acc* q_idx = scratch.q(worker);
    Acc* row_scores = row_scores_scratch(worker);
    double* dw = scratch.dw(worker);
    Acc* dq = dq_scratch(worker);
    Acc** dq_rows = dq_rows_scratch(worker);
    row_pointers(dq, H_I, D, dq_rows);
    Buffer<OnlineLogSumExp> head_lse(H);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = p.k_start[t];
      const int n = static_cast<int>(p.k_end[t] - ks);
      const double G = backward ? loss_row_grad<Acc>(p.grad_scale, p.grad_rows, t) : 0;
      std::fill(dw, dw + H_I, 0.0);
      std::fill(dq, dq + H_I * D, Acc(0));
      double loss = 0;
      if (n > 0) {
        main.load_q(t, row.q);
        in.load_q(t, q_idx);
        std::fill(head_lse.data(), head_lse.data() + H, OnlineLogSumExp{});
        for (int i0 = 0; i0 < n; i0 += kKeyTile) {
          const int c = std::min(kKeyTile, n - i0);
          row.tile_scores(ks + i0, c, t, q_idx);
          for (int h = 0; h < H; ++h) head_lse[h].add(row.s + h * kKeyTile, c);
          std::copy(row.score, row.score + c, row_scores + i0);
        }
        double* lse_t = lse_main.data() + t * H;
        for (int h = 0; h < H; ++h) lse_t[h] = head_lse[h].value();
        lse_index[t] = logsumexp(row_scores, n);

        for (int i0 = 0; i0 < n; i0 += kKeyTile) {
          const int c = std::min(kKeyTile, n - i0);
          row.tile_scores(ks + i0, c, t, q_idx);
          row.tile_target(c, lse_t);
          loss += kl_terms(row.score, lse_index[t], row.target, c, G, backward ? row.g : nullptr);
          if (backward) {
            in.score_grads(in.w(t), row.g, c, row.qk, kKeyTile, dw);
            combine_rows(H_I, c, D, row.qk, kKeyTile, 1, row.k_rows, dq_rows, true);
          }
        }
      }
      if (!backward) {
        static_cast<Acc*>(p.loss_rows)[t] = static_cast<Acc>(loss);
        continue;
      }
      Acc* dw_out = static_cast<Acc*>(p.dweights) + t * H_I;
      for (int h = 0; h < H_I; ++h) dw_out[h] = static_cast<Acc>(dw[h]);
      store_row(dq, static_cast<int64_t>(H_I) * D, static_cast<Act*>(p.dq_idx) + t * H_I * D);
    }
  });
  if (!backward) return Status::OK();

  // Key pass: dk_idx[s] = sum over rows t that see s, in increasing t, of sum_h dqk[t, h, s] q_idx[t, h].
  Acc* dk = static_cast<Acc*>(p.dk_idx);
  Buffer<int64_t> pair_count(p.T_kv, 0);  // rows that see each key, via a difference array
  {
    Buffer<int64_t> diff(p.T_kv + 1, 0);
    for (int64_t t = 0; t < p.T; ++t) {
      ++diff[p.k_start[t]];
      --diff[p.k_end[t]];
    }
    int64_t running = 0;
    for (int64_t s = 0; s < p.T_kv; ++s) pair_count[s] = running += diff[s];
  }
  for_each_key_range(pair_count, [&](int64_t key_begin, int64_t key_end, int worker) {
    DenseRow<Act> row = make_row(worker);
    Acc* q_idx = scratch.q(worker);
    const Acc** q_rows = scratch.q_rows(worker);
    row_pointers<const Acc>(q_idx, H_I, D, q_rows);
    Buffer<Acc*> dk_rows(kKeyTile);
    std::fill(dk + key_begin * D, dk + key_end * D, Acc(0));
    for (int64_t t = 0; t < p.T; ++t) {
      const int64_t lo = std::max<int64_t>(p.k_start[t], key_begin);
      const int64_t hi = std::min<int64_t>(p.k_end[t], key_end);
      if (lo >= hi) continue;
      main.load_q(t, row.q);
      in.load_q(t, q_idx);
      const double G = loss_row_grad<Acc>(p.grad_scale, p.grad_rows, t);
      for (int64_t s0 = lo; s0 < hi; s0 += kKeyTile) {
        const int c = static_cast<int>(std::min<int64_t>(kKeyTile, hi - s0));
        row.tile_scores(s0, c, t, q_idx);
        row.tile_target(c, lse_main.data() + t * H);
        kl_terms(row.score, lse_index[t], row.target, c, G, row.g);
        in.score_grads(in.w(t), row.g, c, row.qk, kKeyTile, nullptr);
        for (int i = 0; i < c; ++i) dk_rows[i] = dk + (s0 + i) * D;
        combine_rows(c, H_I, D, row.qk, 1, kKeyTile, q_rows, dk_rows.data(), true);
      }
    }
  });
  return Status::OK();
}

}  // namespace

Status sparse_kl_fwd(const SparseKlParams& p) {
  return dispatch_act(p.indexer.dtype, [&](auto tag) { return sparse_kl_impl<decltype(tag)>(p, false); });
}

Status sparse_kl_bwd(const SparseKlParams& p) {
  return dispatch_act(p.indexer.dtype, [&](auto tag) { return sparse_kl_impl<decltype(tag)>(p, true); });
}

Status dense_kl_fwd(const DenseKlParams& p) {
  return dispatch_act(p.attn.dtype, [&](auto tag) { return dense_kl_impl<decltype(tag)>(p, false); });
}

Status dense_kl_bwd(const DenseKlParams& p) {
  return dispatch_act(p.attn.dtype, [&](auto tag) { return dense_kl_impl<decltype(tag)>(p, true); });
}

}  // namespace flashdsa::cpu
