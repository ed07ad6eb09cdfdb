// Internal to router/placement: what the policies share. Place() in PolicyBase validates the
// input and hands a PlacementContext to the policy's Decide(). ThresholdPolicy's Decide asks the
// policy for a decode worker, applies conditional disaggregation by threshold and, when the
// prompt goes to a prefill worker, asks the policy to rank them. Include placement.h instead.
#ifndef TANDEM_ROUTER_PLACEMENT_POLICY_BASE_H_
#define TANDEM_ROUTER_PLACEMENT_POLICY_BASE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "router/placement/placement.h"

namespace tandem::placement {

// SplitMix64 (Steele et al.), with uniform draws defined here rather than by the standard
// library's distributions, so that a seed gives the same choices on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n), unbiased. REQUIRES: n >= 1.
  uint64_t Uniform(uint64_t n);
  // Uniform in [0, 1), 53 random bits.
  double UniformDouble();

 private:
  uint64_t state_;
};

// One Place call's input, with what several steps need computed once.
class PlacementContext {
 public:
  // REQUIRES: request and cluster passed ValidateInput; both outlive the context.
  PlacementContext(const Request& request, const ClusterView& cluster,
                   const PolicyOptions& options);

  const Request& request() const { return request_; }
  const WorkerCandidate& worker(int index) const { return cluster_.workers[index]; }
  // Indices (into cluster.workers) of the healthy workers that can decode / prefill, in the
  // view's order.
  const std::vector<int>& decode_workers() const { return decode_; }
  const std::vector<int>& prefill_workers() const { return prefill_; }

  // Leading prompt tokens cached on worker `index` (whole blocks). Memoized.
  int64_t CachedTokens(int index);
  // The healthy prefill-capable workers other than `decode_index`, in the view's order.
  std::vector<int> PrefillPoolFor(int decode_index) const;
  // Whether a request decoded on worker `decode_index` is prefilled there too, by
  // local_prefill_threshold_tokens (ThresholdPolicy).
  PrefillReason ReasonFor(int decode_index);
  const ClusterView& cluster() const { return cluster_; }

 private:
  const Request& request_;
  const ClusterView& cluster_;
  const PolicyOptions& options_;
  std::vector<int> decode_;
  std::vector<int> prefill_;
  std::vector<int64_t> cached_tokens_;  // -1: not computed yet
};

// INVALID_ARGUMENT when `request` or `cluster` make no sense (see PlacementPolicy::Place).
absl::Status ValidateInput(const Request& request, const ClusterView& cluster);
// INVALID_ARGUMENT for options out of range.
absl::Status ValidateOptions(const PolicyOptions& options);

// Decode load of a worker: sequences (running + waiting + placed) per batch slot.
double DecodeLoad(const WorkerCandidate& worker);
// Prompt tokens queued on a worker (reported + placed).
int64_t PrefillQueue(const WorkerCandidate& worker);

class PolicyBase : public PlacementPolicy {
 public:
  explicit PolicyBase(const PolicyOptions& options) : options_(options), rng_(options.seed) {}

  absl::StatusOr<Decision> Place(const Request& request, const ClusterView& cluster) final;

 protected:
  // The decision for a validated input with at least one healthy decode worker
  // (ctx.decode_workers() not empty). Must not fail.
  virtual Decision Decide(PlacementContext& ctx) = 0;

  // The entry of `ids` with the highest score; equal best scores are broken uniformly at random.
  // scores[k] belongs to ids[k]. REQUIRES: ids not empty, same sizes.
  int ArgMaxRandomTie(absl::Span<const int> ids, absl::Span<const double> scores);
  // `ids` ordered by score, highest first; equal scores in uniformly random order.
  std::vector<int> RankDescending(absl::Span<const int> ids, absl::Span<const double> scores);
  // An entry of `ids` drawn with probability proportional to exp(z / temperature), z the score
  // scaled to [0, 1] over `scores` (uniform when all scores are equal). REQUIRES: temperature > 0.
  int SampleSoftmax(absl::Span<const int> ids, absl::Span<const double> scores, double temperature);

  const PolicyOptions& options() const { return options_; }

 private:
  PolicyOptions options_;
  Rng rng_;
};

// A policy that chooses the decode worker, then prefills locally by local_prefill_threshold_tokens
// (PlacementContext::ReasonFor), else on the prefill workers it ranks.
class ThresholdPolicy : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;

 protected:
  Decision Decide(PlacementContext& ctx) final;
  // The decode worker (an index from ctx.decode_workers(), which is never empty).
  virtual int ChooseDecode(PlacementContext& ctx) = 0;
  // `pool` (not empty) ordered best first.
  virtual std::vector<int> RankPrefill(PlacementContext& ctx, std::vector<int> pool) = 0;
};

std::unique_ptr<PlacementPolicy> NewRoundRobinPolicy(const PolicyOptions& options);
std::unique_ptr<PlacementPolicy> NewLeastLoadedPolicy(const PolicyOptions& options);
std::unique_ptr<PlacementPolicy> NewKvAwarePolicy(const PolicyOptions& options);
std::unique_ptr<PlacementPolicy> NewSloPolicy(const PolicyOptions& options);

}  // namespace tandem::placement

#endif  // TANDEM_ROUTER_PLACEMENT_POLICY_BASE_H_
