#include "router/placement/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "router/placement/policy_base.h"

namespace tandem::placement {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kBoth:
      return "both";
  }
  return "unknown";
}

absl::string_view PrefillReasonName(PrefillReason reason) {
  switch (reason) {
    case PrefillReason::kRemote:
      return "remote";
    case PrefillReason::kShortUncached:
      return "short_uncached";
    case PrefillReason::kNoPrefillWorker:
      return "no_prefill_worker";
    case PrefillReason::kPredictedLocal:
      return "predicted_local";
  }
  return "unknown";
}

int64_t CachedPrefixBlocks(absl::Span<const BlockHash> hashes,
                           const absl::flat_hash_set<BlockHash>* cached) {
  if (cached == nullptr || cached->empty()) return 0;
  int64_t n = 0;
  for (BlockHash h : hashes) {
    if (!cached->contains(h)) break;
    ++n;
  }
  return n;
}

// ----------------------------------------------------------------------------------------------
// Rng

uint64_t Rng::Next() {
  state_ += 0x9E37'79B9'7F4A'7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBULL;
  return z ^ (z >> 31);
}

uint64_t Rng::Uniform(uint64_t n) {
  CHECK(n >= 1);
  // Reject the lowest 2^64 mod n values so that every residue is equally likely.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = Next();
    if (r >= threshold) return r % n;
  }
}

double Rng::UniformDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

// ----------------------------------------------------------------------------------------------
// Input checks and load numbers

namespace {

bool CanDecode(Role role) { return role == Role::kDecode || role == Role::kBoth; }
bool CanPrefill(Role role) { return role == Role::kPrefill || role == Role::kBoth; }

}  // namespace

absl::Status ValidateCandidate(const WorkerCandidate& w) {
  if (w.id.empty()) return absl::InvalidArgumentError("placement: a worker has an empty id");
  if (w.role != Role::kPrefill && w.role != Role::kDecode && w.role != Role::kBoth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: worker '", w.id, "' has an invalid role ", static_cast<int>(w.role)));
  }
  const std::pair<absl::string_view, int64_t> numbers[] = {
      {"max_running", w.max_running},
      {"running_seqs", w.running_seqs},
      {"waiting_seqs", w.waiting_seqs},
      {"queued_prefill_tokens", w.queued_prefill_tokens},
      {"placed_sequences", w.placed_sequences},
      {"placed_prefill_tokens", w.placed_prefill_tokens},
      {"placed_prompts", w.placed_prompts},
      {"active_decode_tokens", w.slo.active_decode_tokens},
      {"placed_decode_tokens", w.slo.placed_decode_tokens},
      {"max_tokens_per_step", w.slo.max_tokens_per_step},
      {"max_prefill_tokens", w.slo.max_prefill_tokens},
      {"kv_bytes_per_token", w.slo.kv_bytes_per_token},
  };
  for (const auto& [name, value] : numbers) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: worker '", w.id, "' has ", name, " ", value, " < 0"));
    }
  }
  for (const QueuedClass& q : w.slo.queued_by_priority) {
    if (q.tokens < 0 || q.prompts < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: worker '", w.id, "' has ", q.tokens, " tokens in ", q.prompts,
                       " prompts queued at priority ", q.priority, " (< 0)"));
    }
    if (q.placed_tokens < 0 || q.placed_tokens > q.tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement: worker '", w.id, "' has ", q.placed_tokens, " placed of ", q.tokens,
          " tokens queued at priority ", q.priority, " (not within [0, tokens])"));
    }
  }
  for (const auto& [name, value] : {std::pair<absl::string_view, double>{"ttft_correction",
                                                                          w.slo.ttft_correction},
                                    {"tpot_correction", w.slo.tpot_correction}}) {
    if (!std::isfinite(value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("placement: worker '", w.id, "' has ", name,
                                                     " ", value, " (not finite and > 0)"));
    }
  }
  if (!std::isfinite(w.slo.step_elapsed_seconds) || w.slo.step_elapsed_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement: worker '", w.id,
                                                   "' has step_elapsed_seconds ",
                                                   w.slo.step_elapsed_seconds,
                                                   " (not finite and >= 0)"));
  }
  for (const RunningGroup& g : w.slo.running_groups) {
    if (g.tpot_ms < 0 || g.max_tokens < 0 || g.decoded_tokens < -1 ||
        !std::isfinite(g.decode_seconds) || g.decode_seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement: worker '", w.id, "' has a running group with tpot_ms ", g.tpot_ms,
          ", max_tokens ", g.max_tokens, ", decoded_tokens ", g.decoded_tokens,
          " and decode_seconds ", g.decode_seconds,
          " (must be >= 0, >= 0, >= -1 and finite >= 0)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCandidates(absl::Span<const WorkerCandidate> workers) {
  absl::flat_hash_set<absl::string_view> ids;
  ids.reserve(workers.size());
  for (const WorkerCandidate& w : workers) {
    RETURN_IF_ERROR(ValidateCandidate(w));
    if (!ids.insert(w.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: worker id '", w.id, "' appears more than once"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateInput(const Request& request, const ClusterView& cluster) {
  if (request.prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: prompt_tokens ", request.prompt_tokens, " < 1"));
  }
  if (request.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: block_size ", request.block_size, " < 1"));
  }
  const int64_t full_blocks = request.prompt_tokens / request.block_size;
  if (static_cast<int64_t>(request.block_hashes.size()) > full_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: ", request.block_hashes.size(), " block hashes for a prompt of ",
                     request.prompt_tokens, " tokens, which has ", full_blocks, " full blocks of ",
                     request.block_size));
  }
  if (request.slo.ttft_ms < 0 || request.slo.tpot_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement: negative SLO (ttft_ms ",
                                                   request.slo.ttft_ms, ", tpot_ms ",
                                                   request.slo.tpot_ms, ")"));
  }
  if (cluster.candidates_checked) return absl::OkStatus();
  return ValidateCandidates(cluster.workers);
}

absl::Status ValidateOptions(const PolicyOptions& options) {
  if (options.local_prefill_threshold_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement: local_prefill_threshold_tokens ",
                                                   options.local_prefill_threshold_tokens, " < 0"));
  }
  if (!std::isfinite(options.overlap_weight) || options.overlap_weight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: overlap_weight ", options.overlap_weight, " is not finite and >= 0"));
  }
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: temperature ", options.temperature, " is not finite and >= 0"));
  }
  const std::pair<absl::string_view, int64_t> at_least_one[] = {
      {"default_ttft_ms", options.default_ttft_ms},
      {"default_tpot_ms", options.default_tpot_ms},
      {"default_max_tokens_per_step", options.default_max_tokens_per_step},
      {"expected_output_tokens", options.expected_output_tokens},
  };
  for (const auto& [name, value] : at_least_one) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("placement: ", name, " ", value, " < 1"));
    }
  }
  if (options.default_kv_bytes_per_token < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement: default_kv_bytes_per_token ",
                                                   options.default_kv_bytes_per_token, " < 0"));
  }
  if (!std::isfinite(options.default_transfer_seconds_per_byte) ||
      options.default_transfer_seconds_per_byte < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement: default_transfer_seconds_per_byte ",
                                                   options.default_transfer_seconds_per_byte,
                                                   " is not finite and >= 0"));
  }
  if (!(options.remote_prefill_headroom >= 0 && options.remote_prefill_headroom < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("placement: remote_prefill_headroom ",
                                                   options.remote_prefill_headroom,
                                                   " is not in [0, 1)"));
  }
  absl::Status profile = ValidateProfile(options.default_step_profile);
  if (!profile.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: default_step_profile: ", profile.message()));
  }
  return absl::OkStatus();
}

double DecodeLoad(const WorkerCandidate& worker) {
  const int64_t sequences = worker.running_seqs + worker.waiting_seqs + worker.placed_sequences;
  return static_cast<double>(sequences) /
         static_cast<double>(std::max<int64_t>(worker.max_running, 1));
}

int64_t PrefillQueue(const WorkerCandidate& worker) {
  return worker.queued_prefill_tokens + worker.placed_prefill_tokens;
}

// ----------------------------------------------------------------------------------------------
// PlacementContext

PlacementContext::PlacementContext(const Request& request, const ClusterView& cluster,
                                   const PolicyOptions& options)
    : request_(request),
      cluster_(cluster),
      options_(options),
      cached_tokens_(cluster.workers.size(), -1) {
  for (size_t i = 0; i < cluster.workers.size(); ++i) {
    const WorkerCandidate& w = cluster.workers[i];
    if (!w.healthy) continue;
    if (CanDecode(w.role)) decode_.push_back(static_cast<int>(i));
    if (CanPrefill(w.role)) prefill_.push_back(static_cast<int>(i));
  }
}

int64_t PlacementContext::CachedTokens(int index) {
  int64_t& cached = cached_tokens_[index];
  if (cached < 0) {
    cached = CachedPrefixBlocks(request_.block_hashes, worker(index).cached_hashes) *
             request_.block_size;
  }
  return cached;
}

std::vector<int> PlacementContext::PrefillPoolFor(int decode_index) const {
  std::vector<int> pool;
  pool.reserve(prefill_.size());
  for (int p : prefill_) {
    if (p != decode_index) pool.push_back(p);
  }
  return pool;
}

PrefillReason PlacementContext::ReasonFor(int decode_index) {
  // A short uncached part is local whatever the prefill pool; kNoPrefillWorker means that a
  // prefill worker would have been asked if there were one.
  const int64_t uncached = request_.prompt_tokens - CachedTokens(decode_index);
  if (uncached <= options_.local_prefill_threshold_tokens) return PrefillReason::kShortUncached;
  const bool other_prefill_worker =
      prefill_.size() > 1 || (prefill_.size() == 1 && prefill_[0] != decode_index);
  if (!other_prefill_worker) return PrefillReason::kNoPrefillWorker;
  return PrefillReason::kRemote;
}

// ----------------------------------------------------------------------------------------------
// PolicyBase, ThresholdPolicy

absl::StatusOr<Decision> PolicyBase::Place(const Request& request, const ClusterView& cluster) {
  RETURN_IF_ERROR(ValidateInput(request, cluster));
  PlacementContext ctx(request, cluster, options_);
  if (ctx.decode_workers().empty()) {
    return absl::UnavailableError(absl::StrCat("placement: no healthy decode worker among ",
                                               cluster.workers.size(), " workers"));
  }
  return Decide(ctx);
}

Decision ThresholdPolicy::Decide(PlacementContext& ctx) {
  const Request& request = ctx.request();
  const int d = ChooseDecode(ctx);
  Decision decision;
  decision.decode_worker = ctx.worker(d).id;
  decision.decode_cached_tokens = ctx.CachedTokens(d);
  decision.uncached_tokens = request.prompt_tokens - decision.decode_cached_tokens;
  decision.reason = ctx.ReasonFor(d);
  decision.local_prefill = decision.reason != PrefillReason::kRemote;
  if (!decision.local_prefill) {
    std::vector<int> pool = ctx.PrefillPoolFor(d);
    CHECK(!pool.empty());
    const size_t pool_size = pool.size();
    const std::vector<int> ranked = RankPrefill(ctx, std::move(pool));
    CHECK(ranked.size() == pool_size) << "policy " << name() << " dropped prefill workers";
    decision.prefill.reserve(ranked.size());
    for (int p : ranked) {
      decision.prefill.push_back(
          {.worker_id = ctx.worker(p).id, .cached_tokens = ctx.CachedTokens(p)});
    }
  }
  return decision;
}

int PolicyBase::ArgMaxRandomTie(absl::Span<const int> ids, absl::Span<const double> scores) {
  CHECK(!ids.empty() && ids.size() == scores.size());
  // Reservoir sampling over the best: the k-th entry equal to the best so far replaces the pick
  // with probability 1/k.
  size_t best = 0;
  uint64_t ties = 1;
  for (size_t k = 1; k < ids.size(); ++k) {
    if (scores[k] > scores[best]) {
      best = k;
      ties = 1;
    } else if (scores[k] == scores[best]) {
      ++ties;
      if (rng_.Uniform(ties) == 0) best = k;
    }
  }
  return ids[best];
}

std::vector<int> PolicyBase::RankDescending(absl::Span<const int> ids,
                                            absl::Span<const double> scores) {
  CHECK(ids.size() == scores.size());
  std::vector<size_t> order(ids.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  // Fisher-Yates, then a stable sort: equal scores end up in uniformly random order.
  for (size_t k = order.size(); k > 1; --k) {
    std::swap(order[k - 1], order[rng_.Uniform(k)]);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  std::vector<int> ranked;
  ranked.reserve(order.size());
  for (size_t k : order) ranked.push_back(ids[k]);
  return ranked;
}

int PolicyBase::SampleSoftmax(absl::Span<const int> ids, absl::Span<const double> scores,
                              double temperature) {
  CHECK(!ids.empty() && ids.size() == scores.size() && temperature > 0);
  const auto [lo, hi] = std::minmax_element(scores.begin(), scores.end());
  const double range = *hi - *lo;
  std::vector<double> weights(scores.size(), 1.0);
  if (range > 0 && std::isfinite(range)) {
    for (size_t k = 0; k < scores.size(); ++k) {
      // The best has weight exp(0) = 1, so the sum never underflows to 0.
      weights[k] = std::exp(((scores[k] - *lo) / range - 1.0) / temperature);
    }
  }
  double total = 0;
  for (double w : weights) total += w;
  double x = rng_.UniformDouble() * total;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (x < weights[k]) return ids[k];
    x -= weights[k];
  }
  // Rounding left x at or just above the last weight: take the last entry with a weight.
  for (size_t k = weights.size(); k > 0; --k) {
    if (weights[k - 1] > 0) return ids[k - 1];
  }
  return ids.back();
}

// ----------------------------------------------------------------------------------------------
// Factory

namespace {

struct PolicyFactory {
  absl::string_view name;
  std::unique_ptr<PlacementPolicy> (*make)(const PolicyOptions&);
};

constexpr PolicyFactory kPolicies[] = {
    {"round_robin", &NewRoundRobinPolicy},
    {"least_loaded", &NewLeastLoadedPolicy},
    {"kv_aware", &NewKvAwarePolicy},
    {"slo", &NewSloPolicy},
};

}  // namespace

std::vector<std::string> KnownPolicies() {
  std::vector<std::string> names;
  for (const PolicyFactory& p : kPolicies) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<std::unique_ptr<PlacementPolicy>> CreatePolicy(absl::string_view name,
                                                              const PolicyOptions& options) {
  for (const PolicyFactory& p : kPolicies) {
    if (p.name == name) {
      RETURN_IF_ERROR(ValidateOptions(options));
      return p.make(options);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown placement policy '", name, "'; known: ", absl::StrJoin(KnownPolicies(), ", ")));
}

}  // namespace tandem::placement
