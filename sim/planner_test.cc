// Tests of the planner (planner.h) on workloads whose cheapest configuration is known by
// construction: a decode step of k sequences lasts 10 ms + 10 ms * k (the profile's terms, nothing
// else), so a TPOT objective of 25 ms holds only while a worker decodes one sequence at a time. A
// request decodes 100 tokens (about 2 s alone) and one arrives every 1.25 s: one worker must hold
// two or more at once (TPOT >= 30 ms for all but the first few), two workers taking turns
// (round_robin) hold one each (TPOT 20 ms), so the cheapest configuration has two decoding workers.
#include "sim/planner.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sim/synthetic.h"

namespace tandem::sim {
namespace {

using placement::Role;
using ::testing::HasSubstr;

PoolConfig Pool(Role role) {
  PoolConfig p;
  p.role = role;
  p.count = 1;
  p.step = {.base_seconds = 0.010,
            .prefill_token_seconds = 0,
            .decode_token_seconds = 0.010,
            .context_token_seconds = 0,
            .prompt_context_token_seconds = 0};
  p.kv_bytes_per_token = 1024;
  p.max_running = 32;
  p.token_budget = 256;
  p.kv_blocks = 4096;
  return p;
}

ClusterConfig Templates() {
  ClusterConfig c;
  c.policy = "round_robin";
  c.pools = {Pool(Role::kPrefill), Pool(Role::kDecode), Pool(Role::kBoth)};
  return c;
}

std::vector<TraceRequest> Trace(int n = 20, double gap_s = 1.25) {
  std::vector<TraceRequest> trace;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = "r" + std::to_string(i);
    r.arrival_s = gap_s * i;
    r.prompt_tokens = 16;
    r.output_tokens = 100;
    trace.push_back(r);
  }
  return trace;
}

PlanOptions Options() {
  PlanOptions o;
  o.tpot_slo_ms = 25;
  o.attainment_target = 0.9;
  o.policies = {"round_robin"};
  o.max_workers = 8;
  o.headroom_steps = 5;
  o.max_rate_scale = 4;
  return o;
}

TEST(PlannerTest, TwoWorkersWhereOneProvablyMissesTpot) {
  absl::StatusOr<Plan> plan = PlanCluster(Templates(), Trace(), Options());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->best.has_value());
  // Aggregated 2 workers cost 2; disaggregated needs 1 prefill + 2 decode (cost 3).
  EXPECT_EQ(plan->best->config.Label(), "2x both round_robin");
  EXPECT_DOUBLE_EQ(plan->best->config.cost, 2);
  EXPECT_DOUBLE_EQ(plan->best->config.attainment, 1.0);
  EXPECT_NEAR(plan->best->margin, 0.1, 1e-12);
  ASSERT_TRUE(plan->runner_up.has_value());
  EXPECT_EQ(plan->runner_up->config.Label(), "1P+2D round_robin");
  EXPECT_DOUBLE_EQ(plan->runner_up->config.cost, 3);
  // Headroom: at twice the rate each of two workers sees what one sees at the base rate, which
  // misses; at the base rate it meets.
  EXPECT_GE(plan->best->headroom_scale, 1.0);
  EXPECT_LT(plan->best->headroom_scale, 2.0);
  EXPECT_FALSE(plan->best->headroom_capped);
  EXPECT_NEAR(plan->best->headroom_rate, plan->best->headroom_scale * plan->offered_rate, 1e-9);
  EXPECT_NEAR(plan->offered_rate, 1 / 1.25, 1e-9);
  EXPECT_FALSE(plan->truncated);
}

TEST(PlannerTest, OneWorkerMissesAndTheFamiliesSayWhy) {
  // Only the aggregated shape, capped at one worker: nothing meets; the family reports 1 worker and
  // its (low) attainment.
  PlanOptions o = Options();
  o.disaggregated = false;
  o.max_workers = 1;
  absl::StatusOr<Plan> plan = PlanCluster(Templates(), Trace(), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->best.has_value());
  ASSERT_EQ(plan->families.size(), 1u);
  EXPECT_EQ(plan->families[0].both_workers, 1);
  EXPECT_FALSE(plan->families[0].meets);
  EXPECT_LT(plan->families[0].attainment, 0.5);
}

TEST(PlannerTest, PerRoleCostsChangeTheChoice) {
  // "both" workers five times the price of a decode worker: 1P+2D (cost 3) beats 2x both (10).
  PlanOptions o = Options();
  o.both_cost = 5;
  absl::StatusOr<Plan> plan = PlanCluster(Templates(), Trace(), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->best.has_value());
  EXPECT_EQ(plan->best->config.Label(), "1P+2D round_robin");
  ASSERT_TRUE(plan->runner_up.has_value());
  EXPECT_EQ(plan->runner_up->config.Label(), "2x both round_robin");
}

TEST(PlannerTest, SameAnswerWhateverTheJobs) {
  PlanOptions o = Options();
  o.policies = {"round_robin", "least_loaded"};
  o.token_budgets = {64, 256};
  o.curve_scales = {0.5, 1, 2};
  o.jobs = 1;
  absl::StatusOr<Plan> one = PlanCluster(Templates(), Trace(), o);
  o.jobs = 4;
  absl::StatusOr<Plan> four = PlanCluster(Templates(), Trace(), o);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(PlanToJson(*one).dump(), PlanToJson(*four).dump());
  EXPECT_EQ(one->families.size(), 8u);
  ASSERT_EQ(one->curves.size(), 4u);
  EXPECT_EQ(one->curves[0].rates.size(), 3u);
  EXPECT_EQ(one->best->config.workers(), 2);
  // Eight families meet the target; the runner-up is the cheapest whose pools differ from the
  // best's (two aggregated workers under another policy or budget would tell nothing new).
  ASSERT_TRUE(one->runner_up.has_value());
  EXPECT_EQ(one->best->config.both_workers, 2);
  EXPECT_EQ(one->runner_up->config.prefill_workers, 1);
  EXPECT_EQ(one->runner_up->config.decode_workers, 2);
}

// The pruned search against every configuration of up to 6 workers simulated directly (the
// Simulator, not the planner): on a Poisson workload whose answer is not known in advance, the
// planner finds the same cheapest cost, and its pick meets the target when simulated alone.
TEST(PlannerTest, PrunedSearchFindsWhatExhaustiveSearchFinds) {
  SyntheticOptions w;
  w.requests = 120;
  w.rate = 3;
  w.prompt = 200;
  w.output = 40;
  const std::vector<TraceRequest> trace = MakeSyntheticTrace(w, /*seed=*/3);
  ClusterConfig base = Templates();
  for (PoolConfig& p : base.pools) {
    p.step = {.base_seconds = 0.01,
              .prefill_token_seconds = 0.0004,
              .decode_token_seconds = 0.002,
              .context_token_seconds = 1e-7,
              .prompt_context_token_seconds = 1e-8};
  }
  PlanOptions o = Options();
  o.ttft_slo_ms = 300;
  o.tpot_slo_ms = 20;
  o.max_workers = 6;
  o.prefill_cost = 1.5;  // so that the two shapes' costs interleave
  auto attainment = [&](int64_t prefill, int64_t decode, int64_t both) {
    ClusterConfig c = base;
    c.pools.clear();
    if (prefill > 0) c.pools.push_back(base.pools[0]), c.pools.back().count = prefill;
    if (decode > 0) c.pools.push_back(base.pools[1]), c.pools.back().count = decode;
    if (both > 0) c.pools.push_back(base.pools[2]), c.pools.back().count = both;
    std::vector<TraceRequest> slo = trace;
    for (TraceRequest& r : slo) r.ttft_slo_ms = o.ttft_slo_ms, r.tpot_slo_ms = o.tpot_slo_ms;
    absl::StatusOr<std::unique_ptr<Simulator>> sim = Simulator::Create(c, {.seed = 0});
    CHECK_OK(sim.status());
    absl::StatusOr<std::vector<RequestResult>> results = (*sim)->Run(slo);
    CHECK_OK(results.status());
    return Attainment(slo, *results);
  };
  double cheapest = 1e9;
  for (int64_t n = 1; n <= 6; ++n) {
    if (attainment(0, 0, n) >= o.attainment_target) cheapest = std::min(cheapest, 1.0 * n);
  }
  for (int64_t p = 1; p < 6; ++p) {
    for (int64_t d = 1; p + d <= 6; ++d) {
      if (attainment(p, d, 0) >= o.attainment_target) cheapest = std::min(cheapest, 1.5 * p + d);
    }
  }
  ASSERT_LT(cheapest, 1e9) << "the workload should be servable within 6 workers";
  absl::StatusOr<Plan> plan = PlanCluster(base, trace, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->best.has_value());
  EXPECT_DOUBLE_EQ(plan->best->config.cost, cheapest) << plan->best->config.Label();
  EXPECT_GT(cheapest, 1) << "one worker suffices: the comparison would say little";
  const PlanCandidate& c = plan->best->config;
  EXPECT_DOUBLE_EQ(attainment(c.prefill_workers, c.decode_workers, c.both_workers),
                   c.attainment);
}

TEST(PlannerTest, MaxSimulationsStopsTheSearch) {
  PlanOptions o = Options();
  o.max_simulations = 2;
  absl::StatusOr<Plan> plan = PlanCluster(Templates(), Trace(), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->truncated);
  EXPECT_EQ(plan->simulations, 2);
}

TEST(PlannerTest, BadOptionsAreRefused) {
  struct Case {
    std::string what;
    std::function<void(PlanOptions&, ClusterConfig&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no objective", [](PlanOptions& o, ClusterConfig&) { o.tpot_slo_ms = 0; }, "no objective"},
      {"target", [](PlanOptions& o, ClusterConfig&) { o.attainment_target = 1.5; },
       "attainment_target"},
      {"policy", [](PlanOptions& o, ClusterConfig&) { o.policies = {"fastest"}; }, "'fastest'"},
      {"budget", [](PlanOptions& o, ClusterConfig&) { o.token_budgets = {0}; }, "token_budgets"},
      {"shapes", [](PlanOptions& o, ClusterConfig&) { o.aggregated = o.disaggregated = false; },
       "shapes"},
      {"jobs", [](PlanOptions& o, ClusterConfig&) { o.jobs = 0; }, "jobs"},
      {"failures",
       [](PlanOptions&, ClusterConfig& c) {
         c.failures = {{1.0, "d0"}};
       },
       "failures"},
  };
  for (const Case& c : cases) {
    PlanOptions o = Options();
    ClusterConfig cluster = Templates();
    c.edit(o, cluster);
    absl::StatusOr<Plan> plan = PlanCluster(cluster, Trace(), o);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(PlanCluster(Templates(), {}, Options()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, PlanJsonIsParsedAndCheckedKeyByKey) {
  absl::StatusOr<PlanOptions> o = ParsePlanOptions(
      R"({"tpot_slo_ms": 25, "attainment_target": 0.95, "costs": {"prefill": 2},
          "policies": ["slo", "prefix"], "token_budgets": [128, 512],
          "shapes": ["disaggregated"], "max_workers": 16, "jobs": 3, "curve_scales": [1, 2]})",
      "plan.json");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tpot_slo_ms, 25);
  EXPECT_EQ(o->attainment_target, 0.95);
  EXPECT_EQ(o->prefill_cost, 2);
  EXPECT_EQ(o->decode_cost, 1);
  EXPECT_EQ(o->policies, (std::vector<std::string>{"slo", "prefix"}));
  EXPECT_EQ(o->token_budgets, (std::vector<int64_t>{128, 512}));
  EXPECT_FALSE(o->aggregated);
  EXPECT_TRUE(o->disaggregated);
  EXPECT_EQ(o->max_workers, 16);
  EXPECT_EQ(o->jobs, 3);
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"tpot": 25})", "tpot: unknown key"},
           {R"({"max_workers": "8"})", "max_workers: must be an integer"},
           {R"({"costs": {"gpu": 1}})", "costs.gpu: unknown role"},
           {R"({"shapes": ["both"]})", "shapes: \"both\""},
           {"[1]", "not a JSON object"}}) {
    absl::StatusOr<PlanOptions> bad = ParsePlanOptions(text, "plan.json");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(bad.status().message(), HasSubstr(key)) << text;
  }
}

}  // namespace
}  // namespace tandem::sim
