// Tests of what every policy shares: input checks, errors, the factory; and conditional
// disaggregation by threshold (every policy but slo). Policy-specific choices are in
// policies_test.cc and slo_policy_test.cc.
#include "router/placement/placement.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement_test_util.h"

namespace tandem::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_util::CachedSet;
using testing_util::HashesOf;
using testing_util::Ids;
using testing_util::MakePolicy;
using testing_util::Prompt;
using testing_util::Worker;

TEST(PlacementNamesTest, RolesAndReasons) {
  EXPECT_EQ(RoleName(Role::kPrefill), "prefill");
  EXPECT_EQ(RoleName(Role::kDecode), "decode");
  EXPECT_EQ(RoleName(Role::kBoth), "both");
  EXPECT_EQ(PrefillReasonName(PrefillReason::kRemote), "remote");
  EXPECT_EQ(PrefillReasonName(PrefillReason::kShortUncached), "short_uncached");
  EXPECT_EQ(PrefillReasonName(PrefillReason::kNoPrefillWorker), "no_prefill_worker");
  EXPECT_EQ(PrefillReasonName(PrefillReason::kPredictedLocal), "predicted_local");
}

TEST(CachedPrefixBlocksTest, CountsLeadingHashesOnly) {
  const std::vector<BlockHash> hashes = HashesOf(5);
  EXPECT_EQ(CachedPrefixBlocks(hashes, nullptr), 0);
  const absl::flat_hash_set<BlockHash> empty;
  EXPECT_EQ(CachedPrefixBlocks(hashes, &empty), 0);
  const absl::flat_hash_set<BlockHash> first3 = CachedSet(3);
  EXPECT_EQ(CachedPrefixBlocks(hashes, &first3), 3);
  // A hole stops the prefix even when later blocks are cached.
  const absl::flat_hash_set<BlockHash> holey = {hashes[0], hashes[1], hashes[3], hashes[4]};
  EXPECT_EQ(CachedPrefixBlocks(hashes, &holey), 2);
  const absl::flat_hash_set<BlockHash> all = CachedSet(10);
  EXPECT_EQ(CachedPrefixBlocks(hashes, &all), 5);
  EXPECT_EQ(CachedPrefixBlocks({}, &all), 0);
}

// ----------------------------------------------------------------------------------------------
// Factory

TEST(CreatePolicyTest, KnowsEveryPolicyByName) {
  EXPECT_THAT(KnownPolicies(), ElementsAre("round_robin", "least_loaded", "kv_aware", "slo"));
  for (const std::string& name : KnownPolicies()) {
    absl::StatusOr<std::unique_ptr<PlacementPolicy>> policy = CreatePolicy(name, {});
    ASSERT_TRUE(policy.ok()) << name << ": " << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
}

TEST(CreatePolicyTest, UnknownNameListsTheKnownOnes) {
  for (const char* name : {"", "random", "KV_AWARE", "SLO"}) {
    absl::StatusOr<std::unique_ptr<PlacementPolicy>> policy = CreatePolicy(name, {});
    ASSERT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(policy.status().message(), HasSubstr("round_robin, least_loaded, kv_aware, slo"));
  }
}

TEST(CreatePolicyTest, RejectsInvalidOptions) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const PolicyOptions bad[] = {
      {.local_prefill_threshold_tokens = -1},
      {.overlap_weight = -0.5},
      {.overlap_weight = nan},
      {.overlap_weight = inf},
      {.temperature = -1.0},
      {.temperature = nan},
      {.temperature = inf},
      {.default_ttft_ms = 0},
      {.default_tpot_ms = -1},
      {.default_step_profile = {.base_seconds = -0.001}},
      {.default_step_profile = {.context_token_seconds = nan}},
      {.default_step_profile = {.prompt_context_token_seconds = -1}},
      {.default_step_profile = {.prefill_token_seconds = inf}},
      {.default_max_tokens_per_step = 0},
      {.default_kv_bytes_per_token = -1},
      {.default_transfer_seconds_per_byte = -1e-9},
      {.default_transfer_seconds_per_byte = inf},
      {.expected_output_tokens = 0},
      {.remote_prefill_headroom = 1.0},
      {.remote_prefill_headroom = -0.1},
      {.remote_prefill_headroom = nan},
  };
  for (const std::string& name : KnownPolicies()) {
    for (const PolicyOptions& options : bad) {
      EXPECT_EQ(CreatePolicy(name, options).status().code(), absl::StatusCode::kInvalidArgument)
          << name << " threshold " << options.local_prefill_threshold_tokens << " weight "
          << options.overlap_weight << " temperature " << options.temperature;
    }
    // Edge values that are valid.
    EXPECT_TRUE(
        CreatePolicy(name,
                     {.local_prefill_threshold_tokens = 0, .overlap_weight = 0, .temperature = 0})
            .ok());
  }
}

// ----------------------------------------------------------------------------------------------
// Errors (every policy)

class EveryPolicyTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<PlacementPolicy> Policy(const PolicyOptions& options = {}) {
    return MakePolicy(GetParam(), options);
  }
};

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicyTest, ::testing::ValuesIn(KnownPolicies()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(EveryPolicyTest, UnavailableWithoutAHealthyDecodeWorker) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const std::vector<ClusterView> clusters = {
      {},
      {.workers = {Worker("p0", Role::kPrefill), Worker("p1", Role::kPrefill)}},
      {.workers = {Worker("d0", Role::kDecode).Unhealthy(), Worker("p0", Role::kPrefill),
                   Worker("b0", Role::kBoth).Unhealthy()}},
  };
  for (const ClusterView& cluster : clusters) {
    absl::StatusOr<Decision> d = policy->Place(Prompt(100), cluster);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable) << cluster.workers.size();
  }
}

TEST_P(EveryPolicyTest, InvalidRequests) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode)}};
  std::vector<Request> bad;
  bad.push_back(Prompt(0));
  bad.push_back(Prompt(-5));
  Request r = Prompt(64);
  r.block_size = 0;
  bad.push_back(r);
  r = Prompt(64);
  r.block_size = -16;
  bad.push_back(r);
  // 63 tokens hold 3 full blocks of 16, not 4.
  r = Prompt(63);
  r.block_hashes = HashesOf(4);
  bad.push_back(r);
  r = Prompt(64);
  r.slo.ttft_ms = -1;
  bad.push_back(r);
  r = Prompt(64);
  r.slo.tpot_ms = -1;
  bad.push_back(r);
  for (size_t k = 0; k < bad.size(); ++k) {
    EXPECT_EQ(policy->Place(bad[k], cluster).status().code(), absl::StatusCode::kInvalidArgument)
        << "request " << k;
  }
  // The boundary: as many hashes as full blocks.
  r = Prompt(64);
  r.block_hashes = HashesOf(4);
  EXPECT_TRUE(policy->Place(r, cluster).ok());
}

TEST_P(EveryPolicyTest, InvalidClusterViews) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  std::vector<ClusterView> bad = {
      {.workers = {Worker("", Role::kDecode)}},
      {.workers = {Worker("d0", Role::kDecode), Worker("d0", Role::kPrefill)}},
      // Even an unhealthy duplicate is a broken view.
      {.workers = {Worker("d0", Role::kDecode), Worker("d0", Role::kDecode).Unhealthy()}},
      {.workers = {Worker("d0", static_cast<Role>(7))}},
  };
  const std::vector<void (*)(WorkerCandidate&)> negatives = {
      [](WorkerCandidate& w) { w.max_running = -1; },
      [](WorkerCandidate& w) { w.running_seqs = -1; },
      [](WorkerCandidate& w) { w.waiting_seqs = -1; },
      [](WorkerCandidate& w) { w.queued_prefill_tokens = -1; },
      [](WorkerCandidate& w) { w.placed_sequences = -1; },
      [](WorkerCandidate& w) { w.placed_prefill_tokens = -1; },
      [](WorkerCandidate& w) { w.slo.active_decode_tokens = -1; },
      [](WorkerCandidate& w) { w.slo.placed_decode_tokens = -1; },
      [](WorkerCandidate& w) { w.slo.running_groups = {{.tpot_ms = -1}}; },
      [](WorkerCandidate& w) { w.slo.running_groups = {{.tpot_ms = 100, .max_tokens = -1}}; },
      [](WorkerCandidate& w) { w.slo.running_groups = {{.decoded_tokens = -2}}; },
      [](WorkerCandidate& w) { w.slo.running_groups = {{.decode_seconds = -1}}; },
      [](WorkerCandidate& w) { w.slo.running_groups = {{.decode_seconds = std::nan("")}}; },
      [](WorkerCandidate& w) { w.slo.ttft_correction = 0; },
      [](WorkerCandidate& w) { w.slo.tpot_correction = -1; },
      [](WorkerCandidate& w) { w.slo.ttft_correction = std::numeric_limits<double>::infinity(); },
      [](WorkerCandidate& w) { w.slo.tpot_correction = std::nan(""); },
      [](WorkerCandidate& w) { w.placed_prompts = -1; },
      [](WorkerCandidate& w) { w.slo.step_elapsed_seconds = -0.5; },
      [](WorkerCandidate& w) { w.slo.step_elapsed_seconds = std::nan(""); },
      [](WorkerCandidate& w) { w.slo.max_tokens_per_step = -1; },
      [](WorkerCandidate& w) { w.slo.kv_bytes_per_token = -1; },
      [](WorkerCandidate& w) { w.slo.queued_by_priority = {{.tokens = 10, .placed_tokens = -1}}; },
      [](WorkerCandidate& w) { w.slo.queued_by_priority = {{.tokens = 10, .placed_tokens = 11}}; },
  };
  for (auto set_negative : negatives) {
    WorkerCandidate w = Worker("d0", Role::kDecode);
    set_negative(w);
    bad.push_back({.workers = {w}});
  }
  for (size_t k = 0; k < bad.size(); ++k) {
    absl::StatusOr<Decision> d = policy->Place(Prompt(100), bad[k]);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << "view " << k;
    // ValidateCandidates is that check, with the same message; a caller that ran it (and says so)
    // still has the request checked.
    const absl::Status direct = ValidateCandidates(bad[k].workers);
    EXPECT_EQ(direct, d.status()) << "view " << k;
    if (bad[k].workers.size() == 1) {
      EXPECT_EQ(ValidateCandidate(bad[k].workers[0]), d.status()) << "view " << k;
    }
  }
  ClusterView checked = {.workers = {Worker("d0", Role::kDecode)}};
  ASSERT_TRUE(ValidateCandidates(checked.workers).ok());
  checked.candidates_checked = true;
  EXPECT_TRUE(policy->Place(Prompt(100), checked).ok());
  EXPECT_EQ(policy->Place(Prompt(0), checked).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(EveryPolicyTest, SameSeedSameChoices) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(20);
  ClusterView cluster;
  for (int i = 0; i < 4; ++i) {
    cluster.workers.push_back(Worker("d" + std::to_string(i), Role::kDecode));
    cluster.workers.push_back(Worker("p" + std::to_string(i), Role::kPrefill).Cached(&cache));
  }
  std::unique_ptr<PlacementPolicy> a = Policy({.temperature = 0.5, .seed = 7});
  std::unique_ptr<PlacementPolicy> b = Policy({.temperature = 0.5, .seed = 7});
  for (int call = 0; call < 50; ++call) {
    const Request r = Prompt(300 + call * 37);
    absl::StatusOr<Decision> da = a->Place(r, cluster);
    absl::StatusOr<Decision> db = b->Place(r, cluster);
    ASSERT_TRUE(da.ok() && db.ok());
    EXPECT_EQ(da->decode_worker, db->decode_worker);
    EXPECT_EQ(Ids(*da), Ids(*db));
  }
}

// ----------------------------------------------------------------------------------------------
// Conditional disaggregation by threshold (every policy but slo, which decides it from
// predictions: slo_policy_test.cc). One decode worker holding `cached_blocks` of the prompt's
// blocks, so every policy must pick it.

class ThresholdPolicyTest : public EveryPolicyTest {};

INSTANTIATE_TEST_SUITE_P(Policies, ThresholdPolicyTest,
                         ::testing::Values("round_robin", "least_loaded", "kv_aware"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(ThresholdPolicyTest, LocalExactlyAtTheThresholdRemoteAboveIt) {
  const absl::flat_hash_set<BlockHash> cached = CachedSet(10);  // 160 tokens
  for (int64_t threshold : {0, 16, 256, 1000}) {
    std::unique_ptr<PlacementPolicy> policy = Policy({.local_prefill_threshold_tokens = threshold});
    const ClusterView cluster = {
        .workers = {Worker("d0", Role::kDecode).Cached(&cached), Worker("p0", Role::kPrefill)}};
    // Uncached part = threshold: local.
    Request at = Prompt(160 + threshold);
    absl::StatusOr<Decision> d = policy->Place(at, cluster);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->decode_worker, "d0");
    EXPECT_EQ(d->decode_cached_tokens, 160);
    EXPECT_EQ(d->uncached_tokens, threshold);
    EXPECT_TRUE(d->local_prefill) << threshold;
    EXPECT_EQ(d->reason, PrefillReason::kShortUncached);
    EXPECT_THAT(d->prefill, IsEmpty());
    // One token more: remote.
    d = policy->Place(Prompt(160 + threshold + 1), cluster);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->decode_worker, "d0");
    EXPECT_EQ(d->uncached_tokens, threshold + 1);
    EXPECT_FALSE(d->local_prefill) << threshold;
    EXPECT_EQ(d->reason, PrefillReason::kRemote);
    EXPECT_THAT(Ids(*d), ElementsAre("p0"));
  }
}

TEST_P(ThresholdPolicyTest, PredictsNothing) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(8, 8)}};
  absl::StatusOr<Decision> d = policy->Place(Prompt(5000), cluster);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->predicted);
  EXPECT_EQ(d->predicted_ttft_seconds, 0);
  EXPECT_EQ(d->predicted_tpot_seconds, 0);
  EXPECT_EQ(d->predicted_wait_seconds, 0);
  EXPECT_EQ(d->headroom, 0);
  EXPECT_TRUE(d->meets_slo);
}

TEST_P(ThresholdPolicyTest, DefaultThresholdIs256) {
  EXPECT_EQ(PolicyOptions{}.local_prefill_threshold_tokens, 256);
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode), Worker("p0", Role::kPrefill)}};
  EXPECT_TRUE(policy->Place(Prompt(256), cluster)->local_prefill);
  EXPECT_FALSE(policy->Place(Prompt(257), cluster)->local_prefill);
}

TEST_P(ThresholdPolicyTest, FullyCachedPromptStaysLocalEvenAtThresholdZero) {
  const absl::flat_hash_set<BlockHash> cached = CachedSet(8);
  std::unique_ptr<PlacementPolicy> policy = Policy({.local_prefill_threshold_tokens = 0});
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Cached(&cached), Worker("p0", Role::kPrefill)}};
  absl::StatusOr<Decision> d = policy->Place(Prompt(128), cluster);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->decode_cached_tokens, 128);
  EXPECT_EQ(d->uncached_tokens, 0);
  EXPECT_TRUE(d->local_prefill);
  // A partial last block is never cached: 129 tokens leave one uncached.
  d = policy->Place(Prompt(129), cluster);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->uncached_tokens, 1);
  EXPECT_FALSE(d->local_prefill);
}

TEST_P(ThresholdPolicyTest, LocalWhenNoHealthyPrefillWorker) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const std::vector<ClusterView> clusters = {
      {.workers = {Worker("d0", Role::kDecode)}},
      {.workers = {Worker("d0", Role::kDecode), Worker("p0", Role::kPrefill).Unhealthy(),
                   Worker("p1", Role::kPrefill).Unhealthy()}},
      // A both-role worker never prefills remotely for itself.
      {.workers = {Worker("b0", Role::kBoth)}},
  };
  for (const ClusterView& cluster : clusters) {
    absl::StatusOr<Decision> d = policy->Place(Prompt(4000), cluster);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->local_prefill);
    EXPECT_EQ(d->reason, PrefillReason::kNoPrefillWorker);
    EXPECT_THAT(d->prefill, IsEmpty());
    EXPECT_EQ(d->uncached_tokens, 4000);
  }
}

TEST_P(ThresholdPolicyTest, RanksEveryHealthyPrefillWorkerAndSkipsUnhealthyOnes) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const ClusterView cluster = {.workers = {
                                   Worker("p0", Role::kPrefill),
                                   Worker("d0", Role::kDecode),
                                   Worker("p1", Role::kPrefill).Unhealthy(),
                                   Worker("p2", Role::kPrefill),
                                   Worker("b0", Role::kBoth).Unhealthy(),
                                   Worker("p3", Role::kPrefill),
                               }};
  for (int call = 0; call < 20; ++call) {
    absl::StatusOr<Decision> d = policy->Place(Prompt(1000), cluster);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->decode_worker, "d0");
    EXPECT_FALSE(d->local_prefill);
    EXPECT_THAT(Ids(*d), UnorderedElementsAre("p0", "p2", "p3"));
  }
}

TEST_P(ThresholdPolicyTest, BothRoleWorkersPrefillForOthersButNotForThemselves) {
  std::unique_ptr<PlacementPolicy> policy = Policy();
  // Only b0 and b1: each is the other's prefill worker.
  const ClusterView cluster = {.workers = {Worker("b0", Role::kBoth), Worker("b1", Role::kBoth)}};
  for (int call = 0; call < 10; ++call) {
    absl::StatusOr<Decision> d = policy->Place(Prompt(1000), cluster);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->prefill.size(), 1u);
    EXPECT_NE(d->prefill[0].worker_id, d->decode_worker);
    EXPECT_THAT(d->decode_worker, ::testing::AnyOf("b0", "b1"));
  }
}

TEST_P(ThresholdPolicyTest, ReportsCachedTokensOfTheChosenWorkers) {
  const absl::flat_hash_set<BlockHash> d_cache = CachedSet(4);
  const absl::flat_hash_set<BlockHash> p_cache = CachedSet(30);
  std::unique_ptr<PlacementPolicy> policy = Policy();
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Cached(&d_cache),
                                           Worker("p0", Role::kPrefill).Cached(&p_cache)}};
  Request r = Prompt(1000);  // 62 full blocks
  absl::StatusOr<Decision> d = policy->Place(r, cluster);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->decode_cached_tokens, 64);
  EXPECT_EQ(d->uncached_tokens, 936);
  ASSERT_EQ(d->prefill.size(), 1u);
  EXPECT_EQ(d->prefill[0].cached_tokens, 480);
  // Without hashes nothing counts as cached.
  r.block_hashes.clear();
  d = policy->Place(r, cluster);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->decode_cached_tokens, 0);
  EXPECT_EQ(d->prefill[0].cached_tokens, 0);
}

}  // namespace
}  // namespace tandem::placement
