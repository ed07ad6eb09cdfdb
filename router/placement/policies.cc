// The policies of placement.h: round_robin, least_loaded, kv_aware.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "router/placement/placement.h"
#include "router/placement/policy_base.h"

namespace tandem::placement {
namespace {

// ----------------------------------------------------------------------------------------------
// round_robin: each kind of worker in turn, by id, so that the rotation stays fair when workers
// join, leave or change order in the view.

class RoundRobinPolicy final : public ThresholdPolicy {
 public:
  using ThresholdPolicy::ThresholdPolicy;
  absl::string_view name() const override { return "round_robin"; }

 protected:
  int ChooseDecode(PlacementContext& ctx) override {
    const std::vector<int> order = SortedById(ctx, ctx.decode_workers());
    const int chosen = order[FirstAfter(ctx, order, last_decode_)];
    last_decode_ = ctx.worker(chosen).id;
    return chosen;
  }

  std::vector<int> RankPrefill(PlacementContext& ctx, std::vector<int> pool) override {
    const std::vector<int> order = SortedById(ctx, pool);
    const size_t start = FirstAfter(ctx, order, last_prefill_);
    std::vector<int> ranked;
    ranked.reserve(order.size());
    for (size_t k = 0; k < order.size(); ++k) ranked.push_back(order[(start + k) % order.size()]);
    last_prefill_ = ctx.worker(ranked[0]).id;
    return ranked;
  }

 private:
  static std::vector<int> SortedById(const PlacementContext& ctx, std::vector<int> ids) {
    std::sort(ids.begin(), ids.end(),
              [&](int a, int b) { return ctx.worker(a).id < ctx.worker(b).id; });
    return ids;
  }

  // Position in `order` (sorted by id, not empty) of the first worker whose id comes after
  // `last`, wrapping to 0.
  static size_t FirstAfter(const PlacementContext& ctx, const std::vector<int>& order,
                           const std::string& last) {
    for (size_t k = 0; k < order.size(); ++k) {
      if (ctx.worker(order[k]).id > last) return k;
    }
    return 0;
  }

  // Ids of the last workers chosen; "" before the first choice (every id comes after it).
  std::string last_decode_;
  std::string last_prefill_;
};

// ----------------------------------------------------------------------------------------------
// least_loaded

class LeastLoadedPolicy final : public ThresholdPolicy {
 public:
  using ThresholdPolicy::ThresholdPolicy;
  absl::string_view name() const override { return "least_loaded"; }

 protected:
  int ChooseDecode(PlacementContext& ctx) override {
    const std::vector<int>& ids = ctx.decode_workers();
    std::vector<double> scores;
    scores.reserve(ids.size());
    for (int d : ids) scores.push_back(-DecodeLoad(ctx.worker(d)));
    return ArgMaxRandomTie(ids, scores);
  }

  std::vector<int> RankPrefill(PlacementContext& ctx, std::vector<int> pool) override {
    std::vector<double> scores;
    scores.reserve(pool.size());
    for (int p : pool) scores.push_back(-static_cast<double>(PrefillQueue(ctx.worker(p))));
    return RankDescending(pool, scores);
  }
};

// ----------------------------------------------------------------------------------------------
// kv_aware

class KvAwarePolicy final : public ThresholdPolicy {
 public:
  using ThresholdPolicy::ThresholdPolicy;
  absl::string_view name() const override { return "kv_aware"; }

 protected:
  int ChooseDecode(PlacementContext& ctx) override {
    const std::vector<int>& ids = ctx.decode_workers();
    const double prompt = static_cast<double>(ctx.request().prompt_tokens);
    std::vector<double> scores;
    scores.reserve(ids.size());
    for (int d : ids) {
      double score = -DecodeLoad(ctx.worker(d));
      if (ctx.ReasonFor(d) != PrefillReason::kRemote) {
        // Prefilled here: the worker's own cache saves its own compute.
        score += options().overlap_weight * static_cast<double>(ctx.CachedTokens(d)) / prompt;
      }
      scores.push_back(score);
    }
    return Pick(ids, scores);
  }

  std::vector<int> RankPrefill(PlacementContext& ctx, std::vector<int> pool) override {
    std::vector<double> scores;
    scores.reserve(pool.size());
    for (int p : pool) {
      scores.push_back(options().overlap_weight * static_cast<double>(ctx.CachedTokens(p)) -
                       static_cast<double>(PrefillQueue(ctx.worker(p))));
    }
    if (options().temperature <= 0) return RankDescending(pool, scores);
    // The first choice is sampled; the fallbacks follow by score.
    const int first = SampleSoftmax(pool, scores, options().temperature);
    std::vector<int> rest_ids;
    std::vector<double> rest_scores;
    for (size_t k = 0; k < pool.size(); ++k) {
      if (pool[k] == first) continue;
      rest_ids.push_back(pool[k]);
      rest_scores.push_back(scores[k]);
    }
    std::vector<int> ranked = {first};
    for (int p : RankDescending(rest_ids, rest_scores)) ranked.push_back(p);
    return ranked;
  }

 private:
  int Pick(const std::vector<int>& ids, const std::vector<double>& scores) {
    if (options().temperature <= 0) return ArgMaxRandomTie(ids, scores);
    return SampleSoftmax(ids, scores, options().temperature);
  }
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewRoundRobinPolicy(const PolicyOptions& options) {
  return std::make_unique<RoundRobinPolicy>(options);
}

std::unique_ptr<PlacementPolicy> NewLeastLoadedPolicy(const PolicyOptions& options) {
  return std::make_unique<LeastLoadedPolicy>(options);
}

std::unique_ptr<PlacementPolicy> NewKvAwarePolicy(const PolicyOptions& options) {
  return std::make_unique<KvAwarePolicy>(options);
}

}  // namespace tandem::placement
