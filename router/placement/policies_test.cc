// Tests of each policy's choices: round_robin, least_loaded, kv_aware.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement.h"
#include "router/placement/placement_test_util.h"
#include "router/placement/policy_base.h"

namespace tandem::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using testing_util::CachedSet;
using testing_util::Ids;
using testing_util::MakePolicy;
using testing_util::PlaceOrDie;
using testing_util::Prompt;
using testing_util::Worker;

// Counts how often each id comes out of `pick` in `n` calls.
template <typename Pick>
std::map<std::string, int> Histogram(int n, Pick pick) {
  std::map<std::string, int> counts;
  for (int k = 0; k < n; ++k) ++counts[pick()];
  return counts;
}

// ----------------------------------------------------------------------------------------------
// Rng

TEST(RngTest, DeterministicAndUniformOverSmallRanges) {
  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int k = 0; k < 100; ++k) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
  // SplitMix64's first output for seed 0 (a published test vector).
  EXPECT_EQ(Rng(0).Next(), 0xE220A8397B1DCDAFULL);
  std::vector<int> counts(5, 0);
  for (int k = 0; k < 5000; ++k) ++counts[a.Uniform(5)];
  for (int count : counts) EXPECT_NEAR(count, 1000, 150);
  EXPECT_EQ(a.Uniform(1), 0u);
  for (int k = 0; k < 1000; ++k) {
    const double u = a.UniformDouble();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// ----------------------------------------------------------------------------------------------
// round_robin

TEST(RoundRobinTest, DecodeWorkersInTurnByIdSkippingUnhealthyOnes) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("round_robin");
  ClusterView cluster = {.workers = {Worker("d2", Role::kDecode), Worker("d0", Role::kDecode),
                                     Worker("x", Role::kDecode).Unhealthy(),
                                     Worker("d1", Role::kBoth), Worker("p0", Role::kPrefill)}};
  std::vector<std::string> chosen;
  for (int k = 0; k < 7; ++k)
    chosen.push_back(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker);
  EXPECT_THAT(chosen, ElementsAre("d0", "d1", "d2", "d0", "d1", "d2", "d0"));
}

TEST(RoundRobinTest, RotationSurvivesReorderingJoinsAndLeaves) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("round_robin");
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode),
                                     Worker("d2", Role::kDecode)}};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d0");
  std::reverse(cluster.workers.begin(), cluster.workers.end());
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d1");
  // d1 leaves, d15 joins: the next id after d1 is d15.
  cluster.workers = {Worker("d2", Role::kDecode), Worker("d15", Role::kDecode),
                     Worker("d0", Role::kDecode)};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d15");
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d2");
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d0");
}

TEST(RoundRobinTest, PrefillListRotatesOnlyWhenPrefillIsRemote) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("round_robin");
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode), Worker("p1", Role::kPrefill),
                  Worker("p0", Role::kPrefill), Worker("p2", Role::kPrefill)}};
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p0", "p1", "p2"));
  // A local prefill does not move the prefill rotation.
  EXPECT_TRUE(PlaceOrDie(*policy, Prompt(100), cluster).local_prefill);
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p1", "p2", "p0"));
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p2", "p0", "p1"));
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p0", "p1", "p2"));
}

TEST(RoundRobinTest, IgnoresLoadAndCache) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(60);
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("round_robin");
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(8, 100),
                                           Worker("d1", Role::kDecode).Cached(&cache)}};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(1000), cluster).decode_worker, "d0");
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(1000), cluster).decode_worker, "d1");
}

TEST(RoundRobinTest, AFailedCallDoesNotAdvance) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("round_robin");
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode)}};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d0");
  EXPECT_FALSE(policy->Place(Prompt(0), cluster).ok());
  EXPECT_FALSE(policy->Place(Prompt(10), {}).ok());
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d1");
}

// ----------------------------------------------------------------------------------------------
// least_loaded

TEST(LeastLoadedTest, DecodeByLoadRelativeToBatchSize) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("least_loaded");
  // d0: 4 of 8 = 0.5; d1: 3 of 4 = 0.75; d2: 1 running + 2 waiting + 1 placed of 4 = 1.
  const ClusterView cluster = {
      .workers = {
          Worker("d1", Role::kDecode).Seqs(3).MaxRunning(4),
          Worker("d0", Role::kDecode).Seqs(2, 2).MaxRunning(8),
          Worker("d2", Role::kDecode).Seqs(1, 2).Placed(1, 0).MaxRunning(4),
      }};
  for (int k = 0; k < 5; ++k)
    EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d0");
}

TEST(LeastLoadedTest, CountsRouterPlacedLoad) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("least_loaded");
  ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(1), Worker("d1", Role::kDecode).Seqs(2)}};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d0");
  cluster.workers[0].placed_sequences = 2;
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d1");
}

TEST(LeastLoadedTest, UnknownBatchSizeCountsAsOne) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("least_loaded");
  // d0: 2 sequences / 1 = 2; d1: 3 / 2 = 1.5.
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(2).MaxRunning(0),
                                           Worker("d1", Role::kDecode).Seqs(3).MaxRunning(2)}};
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker, "d1");
}

TEST(LeastLoadedTest, PrefillRankedByQueuedTokensReportedAndPlaced) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("least_loaded");
  const ClusterView cluster = {.workers = {
                                   Worker("d0", Role::kDecode),
                                   Worker("p0", Role::kPrefill).Queue(3000),
                                   Worker("p1", Role::kPrefill).Queue(500).Placed(0, 2000),
                                   Worker("p2", Role::kPrefill).Queue(1000),
                                   Worker("p3", Role::kPrefill),
                               }};
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p3", "p2", "p1", "p0"));
}

TEST(LeastLoadedTest, TiesAreBrokenAtRandomOverAllTiedWorkers) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("least_loaded", {.seed = 3});
  const ClusterView cluster = {.workers = {
                                   Worker("d0", Role::kDecode).Seqs(1),
                                   Worker("d1", Role::kDecode).Seqs(1),
                                   Worker("d2", Role::kDecode).Seqs(1),
                                   Worker("d3", Role::kDecode).Seqs(2),
                                   Worker("p0", Role::kPrefill),
                                   Worker("p1", Role::kPrefill),
                                   Worker("p2", Role::kPrefill).Queue(1),
                               }};
  std::map<std::string, int> first_prefill;
  const std::map<std::string, int> decode = Histogram(600, [&] {
    const Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
    ++first_prefill[d.prefill[0].worker_id];
    EXPECT_EQ(d.prefill.back().worker_id, "p2");
    return d.decode_worker;
  });
  EXPECT_EQ(decode.size(), 3u);
  for (const auto& [id, count] : decode) EXPECT_NEAR(count, 200, 60) << id;
  EXPECT_EQ(first_prefill.size(), 2u);
  for (const auto& [id, count] : first_prefill) EXPECT_NEAR(count, 300, 70) << id;
}

// ----------------------------------------------------------------------------------------------
// kv_aware

TEST(KvAwareTest, PrefillPrefersTheLongestCachedPrefix) {
  const absl::flat_hash_set<BlockHash> short_cache = CachedSet(10);
  const absl::flat_hash_set<BlockHash> long_cache = CachedSet(40);
  const absl::flat_hash_set<BlockHash> mid_cache = CachedSet(20);
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  const ClusterView cluster = {.workers = {
                                   Worker("d0", Role::kDecode),
                                   Worker("p0", Role::kPrefill).Cached(&short_cache),
                                   Worker("p1", Role::kPrefill).Cached(&long_cache),
                                   Worker("p2", Role::kPrefill).Cached(&mid_cache),
                                   Worker("p3", Role::kPrefill),
                               }};
  const Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_THAT(Ids(d), ElementsAre("p1", "p2", "p0", "p3"));
  EXPECT_EQ(d.prefill[0].cached_tokens, 640);
  EXPECT_EQ(d.prefill[1].cached_tokens, 320);
  EXPECT_EQ(d.prefill[3].cached_tokens, 0);
}

TEST(KvAwareTest, PrefillQueueCanOutweighTheCachedPrefix) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(32);  // 512 tokens
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  // p0: 512 cached - 400 queued = 112 > p1's 0.
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode),
                                     Worker("p0", Role::kPrefill).Cached(&cache).Queue(400),
                                     Worker("p1", Role::kPrefill)}};
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p0", "p1"));
  // 512 - 1000 < 0: the idle worker wins.
  cluster.workers[1].queued_prefill_tokens = 1000;
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p1", "p0"));
  // Load the router placed itself counts the same: 512 - 300 - 300 < 0.
  cluster.workers[1].queued_prefill_tokens = 300;
  cluster.workers[1].placed_prefill_tokens = 300;
  EXPECT_THAT(Ids(PlaceOrDie(*policy, Prompt(1000), cluster)), ElementsAre("p1", "p0"));
  // A heavier overlap weight makes the cache win again: 2 * 512 - 600 > 0.
  std::unique_ptr<PlacementPolicy> heavy = MakePolicy("kv_aware", {.overlap_weight = 2.0});
  EXPECT_THAT(Ids(PlaceOrDie(*heavy, Prompt(1000), cluster)), ElementsAre("p0", "p1"));
  // Weight 0: load only.
  cluster.workers[1].queued_prefill_tokens = 1;
  cluster.workers[1].placed_prefill_tokens = 0;
  std::unique_ptr<PlacementPolicy> blind = MakePolicy("kv_aware", {.overlap_weight = 0.0});
  EXPECT_THAT(Ids(PlaceOrDie(*blind, Prompt(1000), cluster)), ElementsAre("p1", "p0"));
}

TEST(KvAwareTest, DecodeOnLoadOnlyWhenPrefillIsRemote) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(32);  // 512 of 1024 tokens
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Cached(&cache).Seqs(2),
                                           Worker("d1", Role::kDecode).Seqs(1),
                                           Worker("p0", Role::kPrefill)}};
  // On either, 512 or 1024 tokens are uncached: remote, so d0's cache earns nothing.
  const Decision d = PlaceOrDie(*policy, Prompt(1024), cluster);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_FALSE(d.local_prefill);
}

TEST(KvAwareTest, DecodeOverlapCountsWhenPrefillIsLocal) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(50);  // 800 of 1024 tokens
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  // d0: 224 uncached, local; score = -4/8 + 800/1024 = 0.28 > d1's 0.
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Cached(&cache).Seqs(4),
                                     Worker("d1", Role::kDecode), Worker("p0", Role::kPrefill)}};
  Decision d = PlaceOrDie(*policy, Prompt(1024), cluster);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_TRUE(d.local_prefill);
  EXPECT_EQ(d.reason, PrefillReason::kShortUncached);
  EXPECT_EQ(d.decode_cached_tokens, 800);
  // -7/8 + 0.78 < 0: too busy for its cache to matter.
  cluster.workers[0].running_seqs = 7;
  d = PlaceOrDie(*policy, Prompt(1024), cluster);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_FALSE(d.local_prefill);
}

TEST(KvAwareTest, DecodeOverlapCountsWithoutPrefillWorkers) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(32);  // 512 of 1024 tokens
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  // Local everywhere (no prefill pool): d0 scores -1/8 + 0.5 > d1's 0.
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Cached(&cache).Seqs(1), Worker("d1", Role::kDecode)}};
  const Decision d = PlaceOrDie(*policy, Prompt(1024), cluster);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_EQ(d.reason, PrefillReason::kNoPrefillWorker);
  EXPECT_EQ(d.uncached_tokens, 512);
}

TEST(KvAwareTest, TiesAreBrokenAtRandomOverAllTiedWorkers) {
  const absl::flat_hash_set<BlockHash> cache = CachedSet(20);
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware", {.seed = 11});
  ClusterView cluster;
  for (int i = 0; i < 4; ++i) {
    cluster.workers.push_back(Worker("d" + std::to_string(i), Role::kDecode));
    cluster.workers.push_back(Worker("p" + std::to_string(i), Role::kPrefill).Cached(&cache));
  }
  cluster.workers.push_back(Worker("p_worse", Role::kPrefill));
  std::map<std::string, int> first_prefill;
  const std::map<std::string, int> decode = Histogram(800, [&] {
    const Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
    ++first_prefill[d.prefill[0].worker_id];
    EXPECT_EQ(d.prefill.size(), 5u);
    EXPECT_EQ(d.prefill.back().worker_id, "p_worse");
    return d.decode_worker;
  });
  EXPECT_EQ(decode.size(), 4u);
  for (const auto& [id, count] : decode) EXPECT_NEAR(count, 200, 60) << id;
  EXPECT_EQ(first_prefill.size(), 4u);
  for (const auto& [id, count] : first_prefill) EXPECT_NEAR(count, 200, 60) << id;
}

TEST(KvAwareTest, SeedsGiveDifferentTieBreaks) {
  ClusterView cluster;
  for (int i = 0; i < 8; ++i)
    cluster.workers.push_back(Worker("d" + std::to_string(i), Role::kDecode));
  auto sequence = [&](uint64_t seed) {
    std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware", {.seed = seed});
    std::vector<std::string> chosen;
    for (int k = 0; k < 30; ++k)
      chosen.push_back(PlaceOrDie(*policy, Prompt(10), cluster).decode_worker);
    return chosen;
  };
  EXPECT_EQ(sequence(5), sequence(5));
  EXPECT_NE(sequence(5), sequence(6));
}

TEST(KvAwareTest, TemperatureSamplesTheFirstPrefillWorker) {
  const absl::flat_hash_set<BlockHash> best = CachedSet(40);
  const absl::flat_hash_set<BlockHash> good = CachedSet(20);
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode),
                                           Worker("p_best", Role::kPrefill).Cached(&best),
                                           Worker("p_good", Role::kPrefill).Cached(&good),
                                           Worker("p_none", Role::kPrefill)}};
  // Scaled scores 1, 0.5, 0. At temperature 1 the weights are 1, e^-0.5, e^-1: shares 0.506,
  // 0.307, 0.186.
  std::unique_ptr<PlacementPolicy> warm = MakePolicy("kv_aware", {.temperature = 1.0, .seed = 1});
  std::map<std::string, int> firsts = Histogram(3000, [&] {
    const Decision d = PlaceOrDie(*warm, Prompt(1000), cluster);
    EXPECT_EQ(d.prefill.size(), 3u);
    // The fallbacks follow by score.
    const std::vector<std::string> ids = Ids(d);
    const std::vector<std::string> rest(ids.begin() + 1, ids.end());
    std::vector<std::string> expected;
    for (const char* id : {"p_best", "p_good", "p_none"}) {
      if (id != d.prefill[0].worker_id) expected.push_back(id);
    }
    EXPECT_EQ(rest, expected);
    return d.prefill[0].worker_id;
  });
  EXPECT_NEAR(firsts["p_best"], 1518, 120);
  EXPECT_NEAR(firsts["p_good"], 921, 100);
  EXPECT_NEAR(firsts["p_none"], 559, 90);
  // A cold temperature is argmax in practice; a hot one is nearly uniform.
  std::unique_ptr<PlacementPolicy> cold = MakePolicy("kv_aware", {.temperature = 1e-3});
  firsts =
      Histogram(300, [&] { return PlaceOrDie(*cold, Prompt(1000), cluster).prefill[0].worker_id; });
  EXPECT_EQ(firsts["p_best"], 300);
  std::unique_ptr<PlacementPolicy> hot = MakePolicy("kv_aware", {.temperature = 1e6});
  firsts =
      Histogram(3000, [&] { return PlaceOrDie(*hot, Prompt(1000), cluster).prefill[0].worker_id; });
  for (const auto& [id, count] : firsts) EXPECT_NEAR(count, 1000, 110) << id;
}

TEST(KvAwareTest, TemperatureSamplesTheDecodeWorker) {
  // Loads 0, 4/8, 8/8: scaled scores 1, 0.5, 0.
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode),
                                           Worker("d1", Role::kDecode).Seqs(4),
                                           Worker("d2", Role::kDecode).Seqs(8)}};
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware", {.temperature = 1.0, .seed = 9});
  std::map<std::string, int> counts =
      Histogram(3000, [&] { return PlaceOrDie(*policy, Prompt(10), cluster).decode_worker; });
  EXPECT_NEAR(counts["d0"], 1518, 120);
  EXPECT_NEAR(counts["d1"], 921, 100);
  EXPECT_NEAR(counts["d2"], 559, 90);
  // Equal scores: uniform.
  const ClusterView equal = {.workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode)}};
  counts = Histogram(2000, [&] { return PlaceOrDie(*policy, Prompt(10), equal).decode_worker; });
  EXPECT_NEAR(counts["d0"], 1000, 100);
}

TEST(KvAwareTest, PicksThePrefixHolderInAMixedCluster) {
  // A realistic shape: two decode workers, three prefill workers, one of each holding a long
  // system prompt; the follow-up request's uncached tail is long, so prefill is remote.
  const absl::flat_hash_set<BlockHash> system_prompt = CachedSet(100);  // 1600 tokens
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("kv_aware");
  const ClusterView cluster = {.workers = {
                                   Worker("d0", Role::kDecode).Seqs(3),
                                   Worker("d1", Role::kDecode).Cached(&system_prompt).Seqs(5),
                                   Worker("p0", Role::kPrefill).Queue(200),
                                   Worker("p1", Role::kPrefill).Cached(&system_prompt).Queue(900),
                                   Worker("p2", Role::kPrefill).Queue(2000),
                               }};
  const Decision d = PlaceOrDie(*policy, Prompt(3000), cluster);
  EXPECT_EQ(d.decode_worker, "d0");  // remote prefill: decode on load only
  EXPECT_EQ(d.decode_cached_tokens, 0);
  EXPECT_THAT(Ids(d), ElementsAre("p1", "p0", "p2"));  // 1600 - 900 = 700 > -200 > -2000
  EXPECT_EQ(d.prefill[0].cached_tokens, 1600);
}

}  // namespace
}  // namespace tandem::placement
