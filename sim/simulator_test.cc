// Tests of the simulator (simulator.h). Expected latencies come from router/placement's cost
// model functions (PrefillSeconds, DecodeStepSeconds: not simulator code) on hand-built request
// shapes; the rest checks behaviour that the trace or the cluster implies (prefix groups, a pool
// too small, a worker death, an overload).
#include "sim/simulator.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/logging.h"
#include "router/placement/cost_model.h"
#include "sim/synthetic.h"

namespace tandem::sim {
namespace {

using placement::Role;

placement::StepProfile Profile() {
  return {.base_seconds = 0.01,
          .prefill_token_seconds = 0.0002,
          .decode_token_seconds = 0.0005,
          .context_token_seconds = 1e-7,
          .prompt_context_token_seconds = 3e-8};
}

PoolConfig Pool(Role role, int64_t count) {
  PoolConfig p;
  p.role = role;
  p.count = count;
  p.step = Profile();
  p.kv_bytes_per_token = 4096;
  p.max_running = 16;
  p.token_budget = 256;
  p.kv_blocks = 1000;
  return p;
}

TraceRequest Req(std::string id, double arrival, int64_t prompt, int64_t output,
                 std::string group = "", int64_t prefix = 0) {
  TraceRequest r;
  r.id = std::move(id);
  r.arrival_s = arrival;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.prefix_group = std::move(group);
  r.prefix_tokens = prefix;
  return r;
}

struct Outcome {
  std::vector<RequestResult> results;
  SimSummary summary;
};

Outcome RunOrDie(const ClusterConfig& cluster, const std::vector<TraceRequest>& trace,
                 SimulatorOptions options = {.check_invariants = true}) {
  absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(cluster, options);
  CHECK_OK(sim.status());
  absl::StatusOr<std::vector<RequestResult>> results = (*sim)->Run(trace);
  CHECK_OK(results.status());
  return {*std::move(results), (*sim)->summary()};
}

ClusterConfig OneWorker(const std::string& policy = "round_robin") {
  ClusterConfig c;
  c.policy = policy;
  c.pools = {Pool(Role::kDecode, 1)};
  return c;
}

constexpr double kMs = 1e-9;  // tolerance on milliseconds: exact up to rounding

TEST(SimulatorTest, OneWorkerAloneTakesWhatTheCostModelSays) {
  // A 1000-token prompt on a 256-token budget: four chunks; then 5 decode steps of one sequence,
  // the k-th attending to 1000 + k positions. A 100-token prompt with one output token: TTFT only.
  const Outcome out = RunOrDie(OneWorker(), {Req("a", 0.0, 1000, 6), Req("b", 100.0, 100, 1)});
  const placement::StepProfile p = Profile();
  const double ttft_a = placement::PrefillSeconds(p, {.uncached_tokens = 1000, .token_budget = 256});
  double e2e_a = ttft_a;
  for (int k = 1; k <= 5; ++k) e2e_a += placement::DecodeStepSeconds(p, 1, 1000 + k);
  ASSERT_TRUE(out.results[0].ok) << out.results[0].error;
  EXPECT_NEAR(out.results[0].ttft_ms, ttft_a * 1e3, kMs);
  EXPECT_NEAR(out.results[0].e2e_ms, e2e_a * 1e3, kMs);
  EXPECT_EQ(out.results[0].output_tokens, 6);
  EXPECT_EQ(out.results[0].decode_worker, "d0");
  EXPECT_EQ(out.results[0].prefill_worker, "");
  const double ttft_b = placement::PrefillSeconds(p, {.uncached_tokens = 100, .token_budget = 256});
  EXPECT_NEAR(out.results[1].ttft_ms, ttft_b * 1e3, kMs);
  EXPECT_NEAR(out.results[1].e2e_ms, ttft_b * 1e3, kMs);
  EXPECT_EQ(out.summary.steps, 4 + 5 + 1);
}

TEST(SimulatorTest, StepFactorsMultiplyEveryStepByAMeasuredFactor) {
  // One factor: every step (prefill chunks, a fast decode run's steps) lasts exactly that many
  // times the profile's, so every time doubles.
  const std::vector<TraceRequest> trace = {Req("a", 0.0, 1000, 6), Req("b", 100.0, 100, 1)};
  const Outcome plain = RunOrDie(OneWorker(), trace);
  ClusterConfig doubled = OneWorker();
  doubled.step_factors = {2.0};
  const Outcome out = RunOrDie(doubled, trace);
  for (size_t k = 0; k < trace.size(); ++k) {
    ASSERT_TRUE(out.results[k].ok) << out.results[k].error;
    EXPECT_NEAR(out.results[k].ttft_ms, 2 * plain.results[k].ttft_ms, 1e-6) << k;
    EXPECT_NEAR(out.results[k].e2e_ms, 2 * plain.results[k].e2e_ms, 1e-6) << k;
  }
  // Two factors: each of request a's ten steps takes one of them, and over a seeded run both
  // are drawn, so its end lies strictly between the all-1 and the all-3 times.
  ClusterConfig mixed = OneWorker();
  mixed.step_factors = {1.0, 3.0};
  const double e2e = RunOrDie(mixed, trace, {.seed = 5}).results[0].e2e_ms;
  EXPECT_GT(e2e, plain.results[0].e2e_ms + 1e-6);
  EXPECT_LT(e2e, 3 * plain.results[0].e2e_ms - 1e-6);
}

TEST(SimulatorTest, ADisaggregatedPromptPaysPrefillThenTheTransfer) {
  ClusterConfig c;
  c.policy = "round_robin";
  c.policy_options.local_prefill_threshold_tokens = 0;  // every uncached prompt goes remote
  c.pools = {Pool(Role::kPrefill, 1), Pool(Role::kDecode, 1)};
  c.links = {.bandwidth_gbps = 10, .latency_us = 50};
  const Outcome out = RunOrDie(c, {Req("a", 1.0, 300, 3)});
  const placement::StepProfile p = Profile();
  const double transfer = 50e-6 + 300.0 * 4096 * 8 / 10e9;
  const double ttft = placement::PrefillSeconds(p, {.uncached_tokens = 300, .token_budget = 256}) +
                      transfer;
  const double e2e = ttft + placement::DecodeStepSeconds(p, 1, 301) +
                     placement::DecodeStepSeconds(p, 1, 302);
  const RequestResult& r = out.results[0];
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.prefill_worker, "p0");
  EXPECT_EQ(r.decode_worker, "d0");
  EXPECT_NEAR(r.ttft_ms, ttft * 1e3, kMs);
  EXPECT_NEAR(r.e2e_ms, e2e * 1e3, kMs);
}

TEST(SimulatorTest, PrefixGroupsRaiseCachedTokensByTheirWholeBlocks) {
  // Requests far apart, so each runs alone. A group's later requests find its prefix's whole
  // 16-token blocks: 100 shared tokens are 6 blocks (96 tokens); 50 are 3 (48).
  const Outcome out = RunOrDie(OneWorker(), {Req("a1", 0, 150, 2, "a", 100),
                                             Req("b1", 10, 150, 2, "b", 100),
                                             Req("a2", 20, 150, 2, "a", 100),
                                             Req("none", 30, 150, 2),
                                             Req("a3", 40, 120, 2, "a", 100),
                                             Req("a4", 50, 200, 2, "a", 50),
                                             Req("b2", 60, 100, 2, "b", 100)});
  std::vector<int64_t> cached;
  for (const RequestResult& r : out.results) {
    ASSERT_TRUE(r.ok) << r.error;
    cached.push_back(r.cached_tokens);
  }
  // b2's prompt is all prefix: all but its last block is reused (the last token is computed).
  EXPECT_EQ(cached, (std::vector<int64_t>{0, 0, 96, 0, 96, 48, 96}));
}

TEST(SimulatorTest, AFullPoolEvictsCachedPrefixes) {
  // 24 blocks: a 350-token prompt after group a's first request needs 22 of them, so a's cached
  // blocks are evicted (tails first) and a's second request finds less than its 96 tokens.
  ClusterConfig c = OneWorker();
  c.pools[0].kv_blocks = 24;
  const Outcome out = RunOrDie(c, {Req("a1", 0, 150, 2, "a", 100), Req("big", 10, 350, 2),
                                   Req("a2", 20, 150, 2, "a", 100)});
  for (const RequestResult& r : out.results) ASSERT_TRUE(r.ok) << r.error;
  EXPECT_LT(out.results[2].cached_tokens, 96);
  const Outcome kept = RunOrDie(OneWorker(), {Req("a1", 0, 150, 2, "a", 100), Req("big", 10, 350, 2),
                                              Req("a2", 20, 150, 2, "a", 100)});
  EXPECT_EQ(kept.results[2].cached_tokens, 96);
}

TEST(SimulatorTest, ASmallPoolPreemptsAndEveryRequestStillFinishes) {
  // 12 sequences that grow to 164 tokens (11 blocks each) in a pool of 40 blocks.
  ClusterConfig c = OneWorker();
  c.pools[0].kv_blocks = 40;
  std::vector<TraceRequest> trace;
  for (int k = 0; k < 12; ++k) trace.push_back(Req("r" + std::to_string(k), 0, 64, 100));
  const Outcome out = RunOrDie(c, trace);
  EXPECT_GT(out.summary.preemptions, 0);
  int64_t preempted = 0;
  for (const RequestResult& r : out.results) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 100);
    preempted += r.preemptions;
  }
  EXPECT_EQ(preempted, out.summary.preemptions);
  // With room for all, nothing is preempted.
  EXPECT_EQ(RunOrDie(OneWorker(), trace).summary.preemptions, 0);
}

TEST(SimulatorTest, ADecodeWorkerDeathMigratesItsRequestsAndTheyFinish) {
  ClusterConfig c;
  c.policy = "round_robin";
  c.pools = {Pool(Role::kDecode, 2)};
  c.failures = {{.at_s = 0.5, .worker = "d0"}};
  std::vector<TraceRequest> trace;
  for (int k = 0; k < 4; ++k) trace.push_back(Req("r" + std::to_string(k), 0, 100, 200));
  const Outcome out = RunOrDie(c, trace);
  int migrated = 0;
  for (const RequestResult& r : out.results) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 200);
    EXPECT_EQ(r.decode_worker, "d1");
    migrated += r.migrated;
  }
  EXPECT_EQ(migrated, 2);  // round robin put two on d0
  EXPECT_EQ(out.summary.migrations, 2);
}

TEST(SimulatorTest, APrefillWorkerDeathFallsBackToLocalPrefill) {
  ClusterConfig c;
  c.policy = "round_robin";
  c.policy_options.local_prefill_threshold_tokens = 0;
  c.pools = {Pool(Role::kPrefill, 1), Pool(Role::kDecode, 1)};
  // The 2000-token prompt takes 8 chunks on p0 (well over 0.1 s): p0 dies while computing it.
  c.failures = {{.at_s = 0.1, .worker = "p0"}};
  const Outcome out = RunOrDie(c, {Req("a", 0, 2000, 4), Req("b", 1, 500, 4)});
  for (const RequestResult& r : out.results) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.prefill_worker, "");  // both prefilled on d0
    EXPECT_EQ(r.decode_worker, "d0");
  }
}

TEST(SimulatorTest, ASlowPrefillWorkerTimesOutAndTheDecodeWorkerPrefills) {
  // The prefill worker takes 1 s per prompt token; after prefill_timeout_s the decode worker
  // gives up on it and prefills the prompt itself (as after the router's --prefill_timeout).
  ClusterConfig c;
  c.policy = "round_robin";
  c.policy_options.local_prefill_threshold_tokens = 0;
  c.pools = {Pool(Role::kPrefill, 1), Pool(Role::kDecode, 1)};
  c.pools[0].step.prefill_token_seconds = 1.0;
  c.prefill_timeout_s = 0.5;
  const Outcome out = RunOrDie(c, {Req("a", 2.0, 300, 2)});
  const RequestResult& r = out.results[0];
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.prefill_worker, "");
  EXPECT_EQ(out.summary.prefill_timeouts, 1);
  const double ttft =
      0.5 + placement::PrefillSeconds(Profile(), {.uncached_tokens = 300, .token_budget = 256});
  EXPECT_NEAR(r.ttft_ms, ttft * 1e3, kMs);
}

TEST(SimulatorTest, LosingEveryDecodeWorkerFailsWithTheRoutersStatus) {
  ClusterConfig c = OneWorker();
  c.failures = {{.at_s = 0.05, .worker = "d0"}};
  const Outcome out = RunOrDie(c, {Req("a", 0, 100, 50), Req("b", 1, 100, 5)});
  for (const RequestResult& r : out.results) {
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(absl::StartsWith(r.error, "UNAVAILABLE: ")) << r.error;
  }
}

TEST(SimulatorTest, AdmissionShedsAnOverloadWithResourceExhausted) {
  ClusterConfig c = OneWorker("slo");
  c.pools[0].max_running = 4;
  std::vector<TraceRequest> trace;
  for (int k = 0; k < 200; ++k) {
    TraceRequest r = Req("r" + std::to_string(k), 0.002 * k, 500, 50);
    r.ttft_slo_ms = 400;
    r.tpot_slo_ms = 100;
    trace.push_back(r);
  }
  const Outcome out = RunOrDie(c, trace);
  int ok = 0, shed = 0;
  for (const RequestResult& r : out.results) {
    if (r.ok) {
      ++ok;
    } else {
      EXPECT_TRUE(absl::StartsWith(r.error, "RESOURCE_EXHAUSTED: ")) << r.error;
      EXPECT_GT(r.error.size(), std::string("RESOURCE_EXHAUSTED: ").size());
      ++shed;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(shed, 100);
  // The same requests spaced out are all admitted.
  for (size_t k = 0; k < trace.size(); ++k) trace[k].arrival_s = 2.0 * static_cast<double>(k);
  for (const RequestResult& r : RunOrDie(c, trace).results) EXPECT_TRUE(r.ok) << r.error;
}

ClusterConfig Mixed(const std::string& policy) {
  ClusterConfig c;
  c.policy = policy;
  c.pools = {Pool(Role::kPrefill, 2), Pool(Role::kDecode, 3)};
  c.step_noise = 0.2;
  c.failures = {{.at_s = 3, .worker = "d2"}};
  return c;
}

std::vector<TraceRequest> Workload(int64_t n) {
  return MakeSyntheticTrace({.requests = n, .rate = 40, .prompt = 400, .output = 40,
                             .prefix_groups = 3, .prefix_tokens = 128, .ttft_slo_ms = 2000,
                             .tpot_slo_ms = 200},
                            /*seed=*/3);
}

bool Same(const RequestResult& a, const RequestResult& b) {
  return a.ok == b.ok && a.error == b.error && a.ttft_ms == b.ttft_ms && a.e2e_ms == b.e2e_ms &&
         a.output_tokens == b.output_tokens && a.cached_tokens == b.cached_tokens &&
         a.prefill_worker == b.prefill_worker && a.decode_worker == b.decode_worker &&
         a.migrated == b.migrated && a.preemptions == b.preemptions;
}

TEST(SimulatorTest, ASeedGivesTheSameRunEveryTime) {
  const std::vector<TraceRequest> trace = Workload(300);
  for (const std::string policy : {"round_robin", "least_loaded", "kv_aware", "slo"}) {
    const Outcome a = RunOrDie(Mixed(policy), trace, {.seed = 7});
    const Outcome b = RunOrDie(Mixed(policy), trace, {.seed = 7});
    const Outcome other = RunOrDie(Mixed(policy), trace, {.seed = 8});
    int differ = 0;
    for (size_t k = 0; k < trace.size(); ++k) {
      EXPECT_TRUE(Same(a.results[k], b.results[k])) << policy << " request " << k;
      differ += !Same(a.results[k], other.results[k]);
    }
    EXPECT_GT(differ, 0) << policy << ": the seed changes nothing";
    EXPECT_EQ(a.summary.migrations, b.summary.migrations);
    EXPECT_GT(a.summary.migrations, 0) << policy;
  }
}

TEST(SimulatorTest, DecodeRunsGiveTheSameResultsAsOneEventPerStep) {
  // fast_decode advances runs of identical decode steps at once; every request's times, workers
  // and counts must be those of stepping one event at a time. Noise, prefix sharing, a failure,
  // remote and local prefills, and a small pool (blocks run out: runs stop at the free blocks).
  std::vector<TraceRequest> trace = Workload(400);
  for (const std::string policy : {"round_robin", "least_loaded", "kv_aware"}) {
    for (int64_t kv_blocks : {1000, 120}) {
      ClusterConfig c = Mixed(policy);
      c.pools[1].kv_blocks = kv_blocks;
      const Outcome slow = RunOrDie(c, trace, {.seed = 5, .fast_decode = false});
      const Outcome fast = RunOrDie(c, trace, {.seed = 5, .fast_decode = true,
                                               .check_invariants = true});
      for (size_t k = 0; k < trace.size(); ++k) {
        EXPECT_TRUE(Same(slow.results[k], fast.results[k]))
            << policy << " kv_blocks " << kv_blocks << " request " << k << ": ttft "
            << slow.results[k].ttft_ms << " vs " << fast.results[k].ttft_ms << ", e2e "
            << slow.results[k].e2e_ms << " vs " << fast.results[k].e2e_ms;
      }
      EXPECT_EQ(slow.summary.steps, fast.summary.steps) << policy;
      EXPECT_EQ(slow.summary.preemptions, fast.summary.preemptions) << policy;
      // The fast path did skip events (here arrivals interrupt runs often).
      EXPECT_LT(fast.summary.step_events, slow.summary.step_events) << policy;
    }
  }
}

TEST(SimulatorTest, RefusesAClusterTheRouterWouldNot) {
  ClusterConfig c = OneWorker();
  c.failures = {{.at_s = 1, .worker = "d7"}};
  EXPECT_EQ(Simulator::Create(c, {}).status().code(), absl::StatusCode::kInvalidArgument);
  ClusterConfig cells;
  cells.pools = {Pool(Role::kPrefill, 3), Pool(Role::kDecode, 1)};
  cells.router_cell_size = 1;  // cells of one prefill worker: nothing to decode on
  EXPECT_THAT(Simulator::Create(cells, {}).status().message(),
              ::testing::HasSubstr("has no decode-capable worker"));
}

}  // namespace
}  // namespace tandem::sim
