// Test helpers for router/placement (and router/registry tests): hand-built requests, workers and
// caches, and values of calls that must succeed. Header-only; for tests only.
#ifndef TANDEM_ROUTER_PLACEMENT_PLACEMENT_TEST_UTIL_H_
#define TANDEM_ROUTER_PLACEMENT_PLACEMENT_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "router/placement/placement.h"

namespace tandem::placement::testing_util {

inline constexpr int64_t kBlockSize = 16;

// The block hashes of the first `n` blocks of one made-up prompt (placement treats hashes as
// opaque names, so any distinct values do).
inline std::vector<BlockHash> HashesOf(int64_t n) {
  std::vector<BlockHash> hashes;
  for (int64_t i = 0; i < n; ++i) hashes.push_back(0x5EED'0000'0000ULL + 7919ULL * i);
  return hashes;
}

// A prefix cache holding the first `n` blocks of that prompt.
inline absl::flat_hash_set<BlockHash> CachedSet(int64_t n) {
  const std::vector<BlockHash> hashes = HashesOf(n);
  return absl::flat_hash_set<BlockHash>(hashes.begin(), hashes.end());
}

// A request of `tokens` prompt tokens, with the hashes of all its full blocks.
inline Request Prompt(int64_t tokens) {
  return {.prompt_tokens = tokens,
          .block_hashes = HashesOf(tokens > 0 ? tokens / kBlockSize : 0),
          .block_size = kBlockSize};
}

// A healthy, idle worker with max_running 8; the setters chain.
struct Worker : WorkerCandidate {
  Worker(absl::string_view worker_id, Role worker_role) {
    id = std::string(worker_id);
    role = worker_role;
    max_running = 8;
  }
  Worker& Unhealthy() {
    healthy = false;
    return *this;
  }
  Worker& Cached(const absl::flat_hash_set<BlockHash>* hashes) {
    cached_hashes = hashes;
    return *this;
  }
  Worker& Seqs(int64_t running, int64_t waiting = 0) {
    running_seqs = running;
    waiting_seqs = waiting;
    return *this;
  }
  Worker& MaxRunning(int64_t n) {
    max_running = n;
    return *this;
  }
  Worker& Queue(int64_t tokens) {
    queued_prefill_tokens = tokens;
    return *this;
  }
  // `sequences` placed here, each with its prompt to prefill here when prefill_tokens > 0.
  Worker& Placed(int64_t sequences, int64_t prefill_tokens) {
    placed_sequences = sequences;
    placed_prefill_tokens = prefill_tokens;
    placed_prompts = prefill_tokens > 0 ? sequences : 0;
    return *this;
  }
  // The fields the slo policy reads (WorkerCandidate::SloInputs).
  Worker& Model(const StepCostModel* model) {
    slo.cost_model = model;
    return *this;
  }
  Worker& Active(int64_t decode_tokens) {
    slo.active_decode_tokens = decode_tokens;
    return *this;
  }
  Worker& PlacedDecode(int64_t tokens) {
    slo.placed_decode_tokens = tokens;
    return *this;
  }
  // Adds a group of running requests with this TPOT objective and max_tokens.
  Worker& Running(int64_t tpot_ms, int64_t max_tokens) {
    slo.running_groups.push_back({.tpot_ms = tpot_ms, .max_tokens = max_tokens});
    return *this;
  }
  // Prompts queued by class (highest first); queued_prefill_tokens becomes their sum.
  Worker& Classes(std::vector<QueuedClass> classes) {
    slo.queued_by_priority = std::move(classes);
    queued_prefill_tokens = 0;
    for (const QueuedClass& c : slo.queued_by_priority) queued_prefill_tokens += c.tokens;
    return *this;
  }
  Worker& PrefillCap(int64_t tokens) {
    slo.max_prefill_tokens = tokens;
    return *this;
  }
  Worker& Budget(int64_t tokens_per_step) {
    slo.max_tokens_per_step = tokens_per_step;
    return *this;
  }
  Worker& KvBytes(int64_t bytes_per_token) {
    slo.kv_bytes_per_token = bytes_per_token;
    return *this;
  }
};

// The value of `result`, or the test's process fails (a broken precondition of the test itself):
// OrDie(StepCostModel::Create(options)).
template <typename T>
T OrDie(absl::StatusOr<T> result) {
  CHECK_OK(result.status());
  return *std::move(result);
}

inline std::unique_ptr<PlacementPolicy> MakePolicy(absl::string_view name,
                                                   const PolicyOptions& options = {}) {
  return OrDie(CreatePolicy(name, options));
}

// The ranked prefill worker ids of a decision.
inline std::vector<std::string> Ids(const Decision& decision) {
  std::vector<std::string> ids;
  for (const PrefillChoice& p : decision.prefill) ids.push_back(p.worker_id);
  return ids;
}

// Places or fails the test's process (OrDie).
inline Decision PlaceOrDie(PlacementPolicy& policy, const Request& request,
                           const ClusterView& cluster) {
  return OrDie(policy.Place(request, cluster));
}

}  // namespace tandem::placement::testing_util

#endif  // TANDEM_ROUTER_PLACEMENT_PLACEMENT_TEST_UTIL_H_
