// Tests of the simulator's input parsing (sim_config.h): good files parse field for field, and
// every bad one is refused with INVALID_ARGUMENT naming the file, the line and the field.
#include "sim/sim_config.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kProfile[] =
    R"({"format": "tandem-profile-v1", "model": "m", "engine": "cpu-avx512", "source": "measured",
        "step": {"base_seconds": 0.01, "prefill_token_seconds": 0.0002,
                 "decode_token_seconds": 0.0005, "context_token_seconds": 1e-8,
                 "prompt_context_token_seconds": 2e-8},
        "kv_bytes_per_token": 4096, "block_size": 16, "kv_blocks": 100, "max_running": 8,
        "token_budget": 256, "notes": "test"})";

std::string Cluster(const std::string& pools_extra = "", const std::string& top_extra = "") {
  return std::string(R"({"policy": "round_robin", "pools": [{"role": "decode", "count": 2, )") +
         pools_extra + R"("profile": )" + kProfile + "}]" + top_extra + "}";
}

TEST(SimConfigTest, ParsesAClusterWithAnInlineProfile) {
  absl::StatusOr<ClusterConfig> c = ParseCluster(
      Cluster(R"("max_running": 4, )",
              R"(, "links": {"bandwidth_gbps": 25, "latency_us": 10},
                  "failures": [{"at_s": 3.5, "worker": "d1"}], "step_noise": 0.1,
                  "admission": {"max_queued": 7, "max_queue_time_s": 2, "classes": "0:0:5"})"),
      "cluster.json", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->policy, "round_robin");
  ASSERT_EQ(c->pools.size(), 1u);
  const PoolConfig& p = c->pools[0];
  EXPECT_EQ(p.role, placement::Role::kDecode);
  EXPECT_EQ(p.count, 2);
  EXPECT_EQ(p.max_running, 4);  // the pool's own field wins over the profile's 8
  EXPECT_EQ(p.token_budget, 256);
  EXPECT_EQ(p.kv_blocks, 100);
  EXPECT_EQ(p.kv_bytes_per_token, 4096);
  EXPECT_DOUBLE_EQ(p.step.prompt_context_token_seconds, 2e-8);
  EXPECT_DOUBLE_EQ(c->links.bandwidth_gbps, 25);
  EXPECT_DOUBLE_EQ(c->links.latency_us, 10);
  ASSERT_EQ(c->failures.size(), 1u);
  EXPECT_EQ(c->failures[0].worker, "d1");
  EXPECT_DOUBLE_EQ(c->step_noise, 0.1);
  EXPECT_EQ(c->admission.max_queued, 7);
  ASSERT_EQ(c->admission.classes.size(), 1u);
  EXPECT_EQ(c->admission.classes[0].max_queued, 5);
}

TEST(SimConfigTest, PrefixIsKvAware) {
  std::string text = Cluster();
  text.replace(text.find("round_robin"), 11, "prefix");
  absl::StatusOr<ClusterConfig> c = ParseCluster(text, "cluster.json", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->policy, "kv_aware");
}

TEST(SimConfigTest, ReadsStepFactors) {
  absl::StatusOr<ClusterConfig> c =
      ParseCluster(Cluster("", R"(, "step_factors": [0.9, 1, 4.5])"), "cluster.json", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->step_factors, ElementsAre(0.9, 1.0, 4.5));
}

TEST(SimConfigTest, BadClustersNameTheField) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"{", "cluster.json: not valid JSON"},
      {Cluster(R"("count": 0, )"), "cluster.json: pools[0].count must be >= 1, not 0"},
      {Cluster(R"("count": 1.5, )"), "cluster.json: pools[0].count must be an integer"},
      {Cluster(R"("role": "router", )"), "pools[0].role must be \"prefill\", \"decode\" or"},
      {Cluster(R"("colour": "red", )"), "pools[0].colour is not a known field"},
      {Cluster("", R"(, "links": {"bandwidth_gbps": 0})"), "links.bandwidth_gbps must be > 0"},
      {Cluster("", R"(, "failures": [{"worker": "d1"}])"), "failures[0].at_s is missing"},
      {Cluster("", R"(, "step_noise": 1.5)"), "step_noise must be < 1"},
      {Cluster("", R"(, "step_factors": 2)"), "step_factors must be an array of numbers"},
      {Cluster("", R"(, "step_factors": [1.0, 0])"), "step_factors[1] must be > 0, not 0"},
      {Cluster("", R"(, "step_factors": [1.0], "step_noise": 0.1)"),
       "step_factors cannot be given with step_noise > 0"},
      {Cluster("", R"(, "admission": {"classes": "x"})"), "admission.classes"},
      {R"({"policy": "slo", "pools": []})", "pools must be a non-empty array"},
      {R"({"pools": [{"role": "decode", "profile": {"format": "v0"}}]})",
       "pools[0].profile.format must be \"tandem-profile-v1\""},
      {R"({"pools": [{"role": "decode", "profile": {"format": "tandem-profile-v1", "step": {}}}]})",
       "pools[0].profile.step.base_seconds is missing"},
      {R"({"pools": [{"role": "decode", "profile": "no/such/profile.json"}]})",
       "pools[0].profile names a file that cannot be read"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterConfig> got = ParseCluster(c.text, "cluster.json", "");
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(got.status().message(), HasSubstr(c.message)) << c.text;
  }
  std::string policy = Cluster();
  policy.replace(policy.find("round_robin"), 11, "fastest");
  EXPECT_THAT(ParseCluster(policy, "cluster.json", "").status().message(),
              HasSubstr("cluster.json: policy \"fastest\" is not a policy (known: "));
}

TEST(SimConfigTest, ParsesATrace) {
  absl::StatusOr<std::vector<TraceRequest>> t = ParseTrace(
      R"({"id": "r1", "arrival_s": 0.5, "prompt_tokens": 812, "output_tokens": 128, "prefix_group": "sys3", "prefix_tokens": 512, "slo_class": "interactive", "priority": 1, "tenant": "a", "ttft_slo_ms": 500, "tpot_slo_ms": 50}

{"id": "r2", "arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 1, "prefix_group": null}
)",
      "trace.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  const TraceRequest& a = (*t)[0];
  EXPECT_EQ(a.id, "r1");
  EXPECT_EQ(a.prompt_tokens, 812);
  EXPECT_EQ(a.prefix_group, "sys3");
  EXPECT_EQ(a.prefix_tokens, 512);
  EXPECT_EQ(a.slo_class, "interactive");
  EXPECT_EQ(a.priority, 1);
  EXPECT_EQ(a.tenant, "a");
  EXPECT_EQ(a.ttft_slo_ms, 500);
  EXPECT_EQ(a.tpot_slo_ms, 50);
  const TraceRequest& b = (*t)[1];
  EXPECT_EQ(b.prefix_group, "");
  EXPECT_EQ(b.prefix_tokens, 0);
  EXPECT_FALSE(b.ttft_slo_ms.has_value());
}

TEST(SimConfigTest, BadTraceLinesAreRefusedWithTheirLineNumber) {
  const std::string good = R"({"id": "a", "arrival_s": 1, "prompt_tokens": 8, "output_tokens": 2})";
  struct Case {
    std::string line;
    std::string message;
  };
  const Case cases[] = {
      {"not json", "trace.jsonl:3: not valid JSON"},
      {"[1, 2]", "trace.jsonl:3: not a JSON object"},
      {R"({"arrival_s": 2, "prompt_tokens": 8, "output_tokens": 2})", "trace.jsonl:3: id is missing"},
      {R"({"id": "b", "arrival_s": 2, "output_tokens": 2})", "trace.jsonl:3: prompt_tokens is missing"},
      {R"({"id": "b", "arrival_s": 2, "prompt_tokens": 0, "output_tokens": 2})",
       "trace.jsonl:3: prompt_tokens must be >= 1, not 0"},
      {R"({"id": "b", "arrival_s": 2, "prompt_tokens": "8", "output_tokens": 2})",
       "trace.jsonl:3: prompt_tokens must be an integer"},
      {R"({"id": "b", "arrival_s": -1, "prompt_tokens": 8, "output_tokens": 2})",
       "trace.jsonl:3: arrival_s must be >= 0"},
      {R"({"id": "b", "arrival_s": 0.5, "prompt_tokens": 8, "output_tokens": 2})",
       "trace.jsonl:3: arrival_s 0.5 is before the line above's"},
      {R"({"id": "b", "arrival_s": 2, "prompt_tokens": 8, "output_tokens": 2, "prefix_group": "g", "prefix_tokens": 9})",
       "trace.jsonl:3: prefix_tokens is 9, more than prompt_tokens 8"},
      {R"({"id": "b", "arrival_s": 2, "prompt_tokens": 8, "output_tokens": 2, "ttft_slo_ms": 0})",
       "trace.jsonl:3: ttft_slo_ms must be > 0"},
      {R"({"id": "b", "arrival_s": 2, "prompt_tokens": 8, "output_tokens": 2, "max_tokens": 2})",
       "trace.jsonl:3: max_tokens is not a known field"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<TraceRequest>> t =
        ParseTrace(good + "\n" + good + "\n" + c.line + "\n" + good + "\n", "trace.jsonl");
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.message)) << c.line;
  }
}

}  // namespace
}  // namespace tandem::sim
