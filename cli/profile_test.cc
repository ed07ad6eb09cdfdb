#include "cli/profile.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/cost_model.h"

namespace tandem {
namespace {

// A worker's step costs, known here, and steps of varied shapes timed by them (whole
// microseconds, as workers report).
constexpr placement::StepProfile kTruth = {.base_seconds = 0.1,
                                           .prefill_token_seconds = 0.002,
                                           .decode_token_seconds = 0.004,
                                           .context_token_seconds = 2e-6,
                                           .prompt_context_token_seconds = 5e-7};

v1::StepTiming Step(int64_t prefill, int64_t decode, int64_t context, int64_t prompt_context) {
  v1::StepTiming t;
  t.set_batch_size(static_cast<uint32_t>(decode + (prefill > 0 ? 1 : 0)));
  t.set_prefill_tokens(static_cast<uint32_t>(prefill));
  t.set_decode_tokens(static_cast<uint32_t>(decode));
  t.set_context_tokens(static_cast<uint64_t>(context + prompt_context));
  t.set_attended_tokens(static_cast<uint64_t>(context + prompt_context));
  t.set_prompt_attended_tokens(static_cast<uint64_t>(prompt_context));
  const double seconds =
      kTruth.StepSeconds(static_cast<double>(prefill), static_cast<double>(decode),
                         static_cast<double>(context), static_cast<double>(prompt_context));
  t.set_duration_us(static_cast<uint64_t>(std::llround(seconds * 1e6)));
  return t;
}

v1::Snapshot SnapshotWithSteps(int steps) {
  v1::Snapshot s;
  s.set_worker_id("d7");
  s.set_role(v1::ROLE_DECODE);
  s.set_model_id("m");
  s.set_engine("cpu");
  s.set_version("0.1.0");
  s.set_block_size(16);
  s.set_total_blocks(182);
  s.set_max_running(64);
  s.set_max_tokens_per_step(512);
  s.set_max_prefill_tokens(128);
  v1::KvLayout* layout = s.mutable_kv_pool()->mutable_layout();
  layout->set_num_layers(30);
  layout->set_num_kv_heads(3);
  layout->set_head_dim(64);
  layout->set_dtype(v1::DTYPE_F16);
  for (int i = 0; i < steps; ++i) {
    const int64_t prefill = (i % 3 == 0) ? 16 * (i + 1) : 0;
    const int64_t decode = 1 + (i * 7) % 13;
    *s.mutable_load()->add_recent_steps() =
        Step(prefill, decode, decode * (100 + 37 * i), prefill * (prefill + 1) / 2 + 11 * i);
  }
  return s;
}

TEST(ProfileOfWorkerTest, RecoversTheCostsTheStepsWereTimedWith) {
  absl::StatusOr<CapturedProfile> got = ProfileOfWorker(SnapshotWithSteps(40), {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->steps, 40);
  const nlohmann::json& step = got->profile["step"];
  EXPECT_NEAR(step["base_seconds"].get<double>(), kTruth.base_seconds, 1e-3 * kTruth.base_seconds);
  EXPECT_NEAR(step["prefill_token_seconds"].get<double>(), kTruth.prefill_token_seconds,
              1e-3 * kTruth.prefill_token_seconds);
  EXPECT_NEAR(step["decode_token_seconds"].get<double>(), kTruth.decode_token_seconds,
              1e-3 * kTruth.decode_token_seconds);
  EXPECT_NEAR(step["context_token_seconds"].get<double>(), kTruth.context_token_seconds,
              1e-3 * kTruth.context_token_seconds);
  EXPECT_NEAR(step["prompt_context_token_seconds"].get<double>(),
              kTruth.prompt_context_token_seconds, 1e-3 * kTruth.prompt_context_token_seconds);
}

TEST(ProfileOfWorkerTest, CopiesTheSettingsAndWritesExactlyTheFormatsKeys) {
  absl::StatusOr<CapturedProfile> got = ProfileOfWorker(SnapshotWithSteps(12), {});
  ASSERT_TRUE(got.ok()) << got.status();
  const nlohmann::json& p = got->profile;
  std::set<std::string> keys;
  for (const auto& [key, value] : p.items()) keys.insert(key);
  EXPECT_THAT(keys, ::testing::ElementsAre("block_size", "engine", "format", "kv_blocks",
                                           "kv_bytes_per_token", "max_prefill_tokens",
                                           "max_running", "model", "notes", "source", "step",
                                           "token_budget"));
  EXPECT_EQ(p["format"], "tandem-profile-v1");
  EXPECT_EQ(p["source"], "measured");
  EXPECT_EQ(p["model"], "m");
  EXPECT_EQ(p["engine"], "cpu");
  EXPECT_EQ(p["block_size"], 16);
  EXPECT_EQ(p["kv_blocks"], 182);
  EXPECT_EQ(p["max_running"], 64);
  EXPECT_EQ(p["token_budget"], 512);
  EXPECT_EQ(p["max_prefill_tokens"], 128);
  EXPECT_EQ(p["kv_bytes_per_token"], 2 * 30 * 3 * 64 * 2);  // K and V, every layer, f16
  EXPECT_THAT(p["notes"].get<std::string>(), ::testing::HasSubstr("worker d7 (ROLE_DECODE"));
}

TEST(ProfileOfWorkerTest, KvBytesAreNullWithoutAPoolLayout) {
  v1::Snapshot s = SnapshotWithSteps(12);
  s.clear_kv_pool();
  absl::StatusOr<CapturedProfile> got = ProfileOfWorker(s, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->profile["kv_bytes_per_token"].is_null());
}

TEST(ProfileOfWorkerTest, LaterSamplesAddTheirStepsAndEmptyStepsDoNotCount) {
  v1::Snapshot s = SnapshotWithSteps(5);
  for (int i = 0; i < 4; ++i) s.mutable_load()->add_recent_steps();  // batch_size 0
  absl::StatusOr<CapturedProfile> few = ProfileOfWorker(s, {});
  EXPECT_EQ(few.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(few.status().message(), ::testing::HasSubstr("reports 5 engine steps"));
  std::vector<v1::LoadSample> later(2);
  *later[0].add_recent_steps() = Step(0, 3, 900, 0);
  *later[1].add_recent_steps() = Step(64, 2, 400, 64 * 65 / 2);
  *later[1].add_recent_steps() = Step(0, 9, 5000, 0);
  absl::StatusOr<CapturedProfile> enough = ProfileOfWorker(s, later);
  ASSERT_TRUE(enough.ok()) << enough.status();
  EXPECT_EQ(enough->steps, 8);
}

}  // namespace
}  // namespace tandem
