// Tests of the step-time and transfer models (cost_model.h). Expected values are worked out by
// hand in the comments; fits of noisy data are checked against the coefficients that made it.
#include "router/placement/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement_test_util.h"

namespace tandem::placement {
namespace {

constexpr double kTight = 1e-12;

StepCostModel MakeModel(const StepCostModelOptions& options = {}) {
  return testing_util::OrDie(StepCostModel::Create(options));
}

TransferModel MakeTransfer(const TransferModelOptions& options = {}) {
  return testing_util::OrDie(TransferModel::Create(options));
}

bool Sane(const StepProfile& p) {
  for (double c : {p.base_seconds, p.prefill_token_seconds, p.decode_token_seconds,
                   p.context_token_seconds, p.prompt_context_token_seconds}) {
    if (!std::isfinite(c) || c < 0) return false;
  }
  return true;
}

StepObservation Step(int64_t prefill, int64_t decode, int64_t context, double seconds,
                     int64_t prompt_context = 0) {
  return {.batch_size = decode + (prefill > 0 ? 1 : 0),
          .prefill_tokens = prefill,
          .decode_tokens = decode,
          .context_tokens = context,
          .prompt_context_tokens = prompt_context,
          .duration_us = static_cast<int64_t>(std::llround(seconds * 1e6))};
}

// A random mix of prefill, decode and mixed steps timed by `truth` with multiplicative noise of
// `noise` (standard deviation). A prompt chunk starts after up to 2048 cached tokens.
class StepSource {
 public:
  explicit StepSource(uint64_t seed) : rng_(seed) {}
  StepObservation Next(const StepProfile& truth, double noise) {
    std::uniform_int_distribution<int64_t> coin(0, 2);
    std::uniform_int_distribution<int64_t> prompt(1, 2048);
    std::uniform_int_distribution<int64_t> batch(1, 64);
    std::uniform_int_distribution<int64_t> length(100, 16000);
    std::normal_distribution<double> jitter(0.0, noise);
    const int64_t kind = coin(rng_);  // 0 prefill only, 1 decode only, 2 both
    const int64_t prefill = kind == 1 ? 0 : prompt(rng_);
    const int64_t decode = kind == 0 ? 0 : batch(rng_);
    const int64_t start = prefill > 0 ? prompt(rng_) - 1 : 0;
    const int64_t prompt_context = prefill * start + prefill * (prefill + 1) / 2;
    const int64_t context = decode * length(rng_);
    const double seconds =
        truth.StepSeconds(static_cast<double>(prefill), static_cast<double>(decode),
                          static_cast<double>(context), static_cast<double>(prompt_context)) *
        (1.0 + jitter(rng_));
    return Step(prefill, decode, context, seconds, prompt_context);
  }

 private:
  std::mt19937_64 rng_;
};

void ExpectNear(const StepProfile& got, const StepProfile& want, double relative) {
  EXPECT_NEAR(got.base_seconds, want.base_seconds, relative * want.base_seconds);
  EXPECT_NEAR(got.prefill_token_seconds, want.prefill_token_seconds,
              relative * want.prefill_token_seconds);
  EXPECT_NEAR(got.decode_token_seconds, want.decode_token_seconds,
              relative * want.decode_token_seconds);
  EXPECT_NEAR(got.context_token_seconds, want.context_token_seconds,
              relative * want.context_token_seconds);
  EXPECT_NEAR(got.prompt_context_token_seconds, want.prompt_context_token_seconds,
              relative * want.prompt_context_token_seconds);
}

// ----------------------------------------------------------------------------------------------
// Predictions from a profile

// The same cost per context token for both kinds of attention (PrefillUsesThePromptAttentionTerm
// tells them apart).
const StepProfile kProfile = {.base_seconds = 0.01,
                              .prefill_token_seconds = 1e-4,
                              .decode_token_seconds = 1e-3,
                              .context_token_seconds = 1e-6,
                              .prompt_context_token_seconds = 1e-6};

TEST(StepPredictionTest, StepAndDecodeStep) {
  // 0.01 + 100 * 1e-4 + 10 * 1e-3 + 20000 * 1e-6 = 0.01 + 0.01 + 0.01 + 0.02.
  EXPECT_NEAR(kProfile.StepSeconds(100, 10, 20000), 0.05, kTight);
  EXPECT_NEAR(DecodeStepSeconds(kProfile, 10, 20000), 0.04, kTight);
  EXPECT_NEAR(DecodeStepSeconds(kProfile, 0, 0), 0.01, kTight);
}

TEST(StepPredictionTest, ChunksShareTheBudgetWithDecodeTokens) {
  EXPECT_EQ(PrefillChunkTokens({.uncached_tokens = 1000, .token_budget = 512}), 512);
  EXPECT_EQ(PrefillChunkTokens({.token_budget = 512, .decode_seqs = 12}), 500);
  // Decode tokens fill the budget: the prompt still advances a token a step.
  EXPECT_EQ(PrefillChunkTokens({.token_budget = 16, .decode_seqs = 40}), 1);
  EXPECT_EQ(PrefillSteps({.uncached_tokens = 1000, .token_budget = 512, .decode_seqs = 12}), 2);
  EXPECT_EQ(PrefillSteps({.uncached_tokens = 1000, .token_budget = 500}), 2);
  EXPECT_EQ(PrefillSteps({.uncached_tokens = 1001, .token_budget = 500}), 3);
  // A fully cached prompt still computes its last token.
  EXPECT_EQ(PrefillSteps({.uncached_tokens = 0, .token_budget = 512}), 1);
}

TEST(StepPredictionTest, PrefillIsTheSumOfItsChunkedSteps) {
  // 1000 tokens after 320 cached, beside 12 decoding sequences with 5000 tokens of context, budget
  // 512: chunks of 500, two steps of 0.01 + 12e-3 + 5000e-6 = 0.027 besides the prompt; its
  // tokens, 1000 * 1e-4 = 0.1; their attention: positions 320 .. 1319 attend to 321 .. 1320
  // tokens, (1320 * 1321 - 320 * 321) / 2 = 820500, * 1e-6.
  PrefillShape shape = {.uncached_tokens = 1000,
                        .cached_tokens = 320,
                        .token_budget = 512,
                        .decode_seqs = 12,
                        .decode_context_tokens = 5000};
  EXPECT_NEAR(PrefillSeconds(kProfile, shape), 2 * 0.027 + 0.1 + 0.8205, kTight);
  // In one chunk the attention is the same: one fixed step less.
  shape.token_budget = 2000;
  EXPECT_NEAR(PrefillSeconds(kProfile, shape), 0.027 + 0.1 + 0.8205, kTight);
  // A prompt twice as long costs four times the attention: 0.01 + 100e-4 + 1e-6 * 100 * 101 / 2,
  // and 0.01 + 200e-4 + 1e-6 * 200 * 201 / 2.
  EXPECT_NEAR(PrefillSeconds(kProfile, {.uncached_tokens = 100, .token_budget = 512}), 0.02505,
              kTight);
  EXPECT_NEAR(PrefillSeconds(kProfile, {.uncached_tokens = 200, .token_budget = 512}), 0.0501,
              kTight);
  // Nothing uncached: one token, 0.01 + 1e-4 + 1e-6 * (64 + 1).
  EXPECT_NEAR(PrefillSeconds(kProfile, {.cached_tokens = 64, .token_budget = 512}), 0.010165,
              kTight);
}

TEST(StepPredictionTest, PrefillUsesThePromptAttentionTerm) {
  // kProfile with a prompt token's attention 3 times as costly per context token as a decode
  // token's: 100 tokens after 50 cached beside 4 sequences decoding over 1000 tokens, in one
  // chunk: 0.01 + 4e-3 + 1000 * 1e-6 fixed, 100 * 1e-4 for the tokens, and
  // (150 * 151 - 50 * 51) / 2 = 10050 context tokens attended at 3e-6.
  StepProfile profile = kProfile;
  profile.prompt_context_token_seconds = 3e-6;
  const PrefillShape shape = {.uncached_tokens = 100,
                              .cached_tokens = 50,
                              .token_budget = 512,
                              .decode_seqs = 4,
                              .decode_context_tokens = 1000};
  EXPECT_NEAR(PrefillSeconds(profile, shape), 0.015 + 0.01 + 0.03015, kTight);
  // Queued: 100 tokens in one prompt attend to 5050.
  EXPECT_NEAR(QueuedPrefillSeconds(profile, shape), 0.015 + 0.01 + 0.01515, kTight);
  // A decode step is the decode term's alone.
  EXPECT_NEAR(DecodeStepSeconds(profile, 4, 1000), 0.015, kTight);
  EXPECT_NEAR(profile.StepSeconds(100, 4, 1000, 10050), 0.015 + 0.01 + 0.03015, kTight);
}

TEST(StepPredictionTest, QueuedPromptsAttendWithinThemselves) {
  // 1000 queued tokens beside 12 decoding sequences: 2 steps of 0.01 + 12e-3 + 5000e-6 fixed, and
  // 1000 * 1e-4 for the tokens: 0.054 + 0.1. One prompt of 1000 tokens attends to 1000 * 1001 / 2.
  PrefillShape shape = {.uncached_tokens = 1000,
                        .cached_tokens = 999999,  // ignored
                        .token_budget = 512,
                        .decode_seqs = 12,
                        .decode_context_tokens = 5000};
  EXPECT_NEAR(QueuedPrefillSeconds(kProfile, shape), 0.154 + 0.5005, kTight);
  // Ten prompts of 100 attend to 10 * 100 * 101 / 2.
  shape.queued_prompts = 10;
  EXPECT_NEAR(QueuedPrefillSeconds(kProfile, shape), 0.154 + 0.0505, kTight);
  // More prompts than tokens: a token each.
  shape.queued_prompts = 5000;
  EXPECT_NEAR(QueuedPrefillSeconds(kProfile, shape), 0.154 + 0.001, kTight);
  EXPECT_EQ(QueuedPrefillSeconds(kProfile, {.uncached_tokens = 0, .token_budget = 512}), 0);
}

TEST(StepPredictionTest, ValidateProfile) {
  EXPECT_TRUE(ValidateProfile({}).ok());
  EXPECT_TRUE(ValidateProfile({0, 0, 0, 0, 0}).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const StepProfile& bad :
       {StepProfile{.base_seconds = -1e-9}, StepProfile{.prefill_token_seconds = nan},
        StepProfile{.decode_token_seconds = inf}, StepProfile{.context_token_seconds = -inf},
        StepProfile{.prompt_context_token_seconds = -1e-9}}) {
    EXPECT_EQ(ValidateProfile(bad).code(), absl::StatusCode::kInvalidArgument);
  }
}

// ----------------------------------------------------------------------------------------------
// StepCostModel

// The coefficients the fitting tests make their data with: every term off the defaults' prior by
// 25% to 100%.
const StepProfile kFitted = {.base_seconds = 0.008,
                             .prefill_token_seconds = 1.5e-4,
                             .decode_token_seconds = 6e-4,
                             .context_token_seconds = 2e-8,
                             .prompt_context_token_seconds = 1.5e-8};

TEST(StepCostModelTest, RejectsInvalidOptions) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const StepCostModelOptions bad[] = {
      {.prior = {.base_seconds = -1}},
      {.prior_weight = 0},
      {.prior_weight = nan},
      {.prior_weight = 0.5},  // below min_prior_weight
      {.min_prior_weight = 0},
      {.forgetting = 0},
      {.forgetting = 1.01},
      {.typical_prefill_tokens = 0},
      {.typical_decode_tokens = -1},
      {.typical_context_tokens = nan},
      {.typical_prompt_context_tokens = 0},
      {.outlier_factor = 0.5},
      {.recent_alpha = 0},
      {.recent_alpha = 1.5},
  };
  for (const StepCostModelOptions& options : bad) {
    EXPECT_EQ(StepCostModel::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(StepCostModel::Create({.forgetting = 1.0, .outlier_factor = 1.0}).ok());
}

TEST(StepCostModelTest, ZeroObservationsPredictWithThePrior) {
  const StepCostModel model = MakeModel({.prior = kProfile});
  EXPECT_EQ(model.observations(), 0);
  EXPECT_EQ(model.effective_observations(), 0);
  EXPECT_EQ(model.profile().base_seconds, kProfile.base_seconds);
  EXPECT_EQ(model.profile().prefill_token_seconds, kProfile.prefill_token_seconds);
  EXPECT_EQ(model.profile().decode_token_seconds, kProfile.decode_token_seconds);
  EXPECT_EQ(model.profile().context_token_seconds, kProfile.context_token_seconds);
  EXPECT_NEAR(model.DecodeStepSeconds(10, 20000), 0.04, kTight);
  EXPECT_NEAR(model.PrefillSeconds({.uncached_tokens = 100, .token_budget = 512}), 0.02505,
              kTight);
  EXPECT_NEAR(model.QueuedPrefillSeconds({.uncached_tokens = 100, .token_budget = 512}), 0.02505,
              kTight);
  EXPECT_NEAR(model.StepSeconds(Step(100, 10, 20000, 0)), 0.05, kTight);
}

TEST(StepCostModelTest, ThePriorDominatesAFewObservations) {
  // One step whose every term but the prompt attention has its typical size (512, 32, 4096): in
  // the scaled coordinates the fit runs in, x' = (1, 1, 1, 1, 0) and the prior is 20 * I, so
  // (Sherman-Morrison) the fitted prediction for that step moves by |x'|^2 / (20 + |x'|^2) = 4 / 24
  // of the error, and each coefficient by error / (24 * typical size). After n equal steps:
  // 4n / (20 + 4n).
  const StepProfile prior = {};
  const double predicted = prior.StepSeconds(512, 32, 4096);
  const double observed = 2 * predicted;  // under the outlier clip (10x)
  const double error = observed - predicted;
  StepCostModel model = MakeModel({.prior = prior, .prior_weight = 20, .forgetting = 1.0});
  ASSERT_TRUE(model.Observe(Step(512, 32, 4096, observed)).ok());
  // Rounding of the duration to whole microseconds.
  const double used = std::llround(observed * 1e6) * 1e-6;
  EXPECT_NEAR(model.StepSeconds(Step(512, 32, 4096, 0)), predicted + (used - predicted) * 4 / 24,
              1e-12);
  EXPECT_NEAR(model.profile().base_seconds, prior.base_seconds + (used - predicted) / 24, 1e-12);
  EXPECT_NEAR(model.profile().prefill_token_seconds,
              prior.prefill_token_seconds + (used - predicted) / (24 * 512), 1e-15);
  EXPECT_NEAR(model.profile().context_token_seconds,
              prior.context_token_seconds + (used - predicted) / (24 * 4096.0), 1e-15);
  ASSERT_TRUE(model.Observe(Step(512, 32, 4096, observed)).ok());
  EXPECT_NEAR(model.StepSeconds(Step(512, 32, 4096, 0)), predicted + (used - predicted) * 8 / 28,
              1e-12);
  // Still far nearer the prior than the data.
  EXPECT_LT(model.StepSeconds(Step(512, 32, 4096, 0)), predicted + error / 2);
}

TEST(StepCostModelTest, RecoversKnownCoefficientsFromNoisyData) {
  const StepProfile truth = kFitted;
  // The prior (the defaults) is off by 25% to 100% on every term.
  StepCostModel model = MakeModel({.forgetting = 0.999});
  StepSource source(1);
  for (int i = 0; i < 4000; ++i) ASSERT_TRUE(model.Observe(source.Next(truth, 0.01)).ok());
  EXPECT_EQ(model.observations(), 4000);
  // 1 - 0.999^4000 of the 1000-observation window is filled; the prior has faded to its floor.
  EXPECT_NEAR(model.effective_observations(), (1 - std::pow(0.999, 4000)) / 0.001, 1e-6);
  EXPECT_EQ(model.current_prior_weight(), 1.0);
  ExpectNear(model.profile(), truth, 0.05);
}

TEST(StepCostModelTest, TracksAChange) {
  const StepProfile before = kFitted;
  // Twice as slow, say after a neighbour started sharing the accelerator.
  const StepProfile after = {.base_seconds = 0.016,
                             .prefill_token_seconds = 3e-4,
                             .decode_token_seconds = 1.2e-3,
                             .context_token_seconds = 4e-8,
                             .prompt_context_token_seconds = 3e-8};
  StepCostModel model = MakeModel({.forgetting = 0.995});  // a window of about 200 steps
  StepSource source(2);
  // Predictions for a prefill chunk, a decode step and a mixed one.
  const StepObservation shapes[] = {Step(512, 0, 512, 0), Step(0, 48, 200'000, 0),
                                    Step(256, 16, 60'000, 0)};
  auto expect_predicts = [&](const StepProfile& truth) {
    for (const StepObservation& s : shapes) {
      const double want = truth.StepSeconds(static_cast<double>(s.prefill_tokens),
                                            static_cast<double>(s.decode_tokens),
                                            static_cast<double>(s.context_tokens));
      EXPECT_NEAR(model.StepSeconds(s), want, 0.05 * want) << s.prefill_tokens;
    }
  };
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(model.Observe(source.Next(before, 0.02)).ok());
  expect_predicts(before);
  // 200 steps later the fit is most of the way there; 2000 later it is there.
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(model.Observe(source.Next(after, 0.02)).ok());
  EXPECT_GT(model.StepSeconds(shapes[0]), 1.5 * before.StepSeconds(512, 0, 512));
  for (int i = 0; i < 1800; ++i) ASSERT_TRUE(model.Observe(source.Next(after, 0.02)).ok());
  expect_predicts(after);
}

TEST(StepCostModelTest, TheRecentRatioFollowsASlowdownWithinAFewSteps) {
  const StepProfile truth = kFitted;
  StepCostModel model = MakeModel({.prior = truth, .forgetting = 0.995});
  EXPECT_EQ(model.recent_ratio(), 1.0);
  StepSource source(3);
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(model.Observe(source.Next(truth, 0.02)).ok());
  // As fitted: the ratio is within the noise of 1.
  EXPECT_NEAR(model.recent_ratio(), 1.0, 0.03);
  const StepObservation decode = Step(0, 24, 20'000, 0);
  const double fitted = model.StepSeconds(decode);
  // Every step now takes 1.5 times as long (a process started to share the host's cores). Ten
  // steps later the fit has hardly moved, but the ratio shows it.
  StepProfile slower = truth;
  for (double* c : {&slower.base_seconds, &slower.prefill_token_seconds,
                    &slower.decode_token_seconds, &slower.context_token_seconds}) {
    *c *= 1.5;
  }
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(model.Observe(source.Next(slower, 0.02)).ok());
  EXPECT_LT(model.StepSeconds(decode), 1.1 * fitted);
  // 1 - 0.8^10 = 89% of the way in log scale if the fit did not move at all (1.5^0.89 = 1.43);
  // it moves a little towards the new steps.
  EXPECT_GT(model.recent_ratio(), 1.3);
  EXPECT_LT(model.recent_ratio(), 1.45);
  // Back to the old speed: it returns to 1 as fast.
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(model.Observe(source.Next(truth, 0.02)).ok());
  EXPECT_NEAR(model.recent_ratio(), 1.0, 0.05);
}

TEST(StepCostModelTest, TheRecentRatioIsBoundedAndResetForgetsIt) {
  StepCostModel model = MakeModel({.outlier_factor = 4});
  // Steps of no time and steps far slower than any prediction: clipped at 1/4 and 4.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(model.Observe(Step(0, 4, 100, 0)).ok());
  EXPECT_NEAR(model.recent_ratio(), 0.25, 1e-6);
  EXPECT_GE(model.recent_ratio(), 0.25 - 1e-12);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(model.Observe(Step(0, 4, 100, 1000)).ok());
  EXPECT_NEAR(model.recent_ratio(), 4, 1e-3);
  EXPECT_LE(model.recent_ratio(), 4 + 1e-12);
  ASSERT_TRUE(model.Reset({}).ok());
  EXPECT_EQ(model.recent_ratio(), 1.0);
}

TEST(StepCostModelTest, ACpuWorkersStepsTeachTheAttentionTermsOverAFewHundredSteps) {
  // A start-up calibration that missed the decode attention (0.3 us a token where the steps show
  // 8 us) and halved the prompt attention; then a CPU worker's steps: batches of 4 decoding over
  // ~80 or ~3300 tokens, and 40-token chats prefilled beside them.
  const StepProfile truth = {.base_seconds = 0.005,
                             .prefill_token_seconds = 3.5e-3,
                             .decode_token_seconds = 4.5e-3,
                             .context_token_seconds = 8e-6,
                             .prompt_context_token_seconds = 5e-6};
  StepProfile calibrated = truth;
  calibrated.context_token_seconds = 0.3e-6;
  calibrated.prompt_context_token_seconds = 2.5e-6;
  StepCostModel model = MakeModel({.prior = calibrated});
  std::mt19937_64 rng(5);
  std::normal_distribution<double> jitter(0.0, 0.05);
  for (int i = 0; i < 300; ++i) {
    const int64_t context = i % 2 == 0 ? 80 : 3300;
    const int64_t prefill = i % 10 == 0 ? 40 : 0;
    const int64_t pairs = prefill * (prefill + 1) / 2;
    const double seconds = truth.StepSeconds(static_cast<double>(prefill), 4,
                                             static_cast<double>(context),
                                             static_cast<double>(pairs)) *
                           (1.0 + jitter(rng));
    ASSERT_TRUE(model.Observe(Step(prefill, 4, context, seconds, pairs)).ok());
  }
  // A decode step over the long contexts is predicted within 10%, not at the calibration's 24 ms
  // against 49 (with the attention terms' typical sizes at 32768 and 131072 it stayed at 38).
  const double want = DecodeStepSeconds(truth, 4, 3300);
  EXPECT_NEAR(model.DecodeStepSeconds(4, 3300), want, 0.1 * want);
  EXPECT_NEAR(model.profile().context_token_seconds, 8e-6, 2e-6);
}

TEST(StepCostModelTest, EqualRowsFitTheirOwnShapeAndLeaveTheRestAtThePrior) {
  // The same prefill-only step 500 times: A = S x' x'^T with S = (1 - 0.995^500) / 0.005 and the
  // prior weighs w = 20 * 0.995^500, so the prediction for that step is
  // prior + S q (y - prior) / (w + S q), q = |x'|^2 (every coefficient rises, so none is held at
  // 0); the decode term, never seen, keeps its prior value.
  const StepProfile prior = {};
  StepCostModel model = MakeModel({.prior = prior});
  const StepObservation step = Step(512, 0, 512, 0.2);
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(model.Observe(step).ok());
  const double s = (1 - std::pow(0.995, 500)) / 0.005;
  const double w = 20 * std::pow(0.995, 500);  // 1.63, above the floor of 1
  EXPECT_NEAR(model.current_prior_weight(), w, 1e-9);
  const double q = 1 + 1 + (512.0 / 4096) * (512.0 / 4096);
  const double predicted = prior.StepSeconds(512, 0, 512);
  EXPECT_NEAR(model.StepSeconds(step), predicted + s * q * (0.2 - predicted) / (w + s * q), 1e-9);
  EXPECT_NEAR(model.profile().decode_token_seconds, prior.decode_token_seconds, 1e-15);
  EXPECT_TRUE(Sane(model.profile()));
}

TEST(StepCostModelTest, CoefficientsNeverGoNegative) {
  // Longer prompts that take less time: least squares would give a negative per-token cost.
  StepCostModel model = MakeModel();
  for (int i = 0; i < 400; ++i) {
    ASSERT_TRUE(model.Observe(Step(0, 0, 0, 0.05)).ok());
    ASSERT_TRUE(model.Observe(Step(2048, 0, 2048, 0.01)).ok());
  }
  EXPECT_TRUE(Sane(model.profile()));
  EXPECT_EQ(model.profile().prefill_token_seconds, 0);
  EXPECT_EQ(model.profile().context_token_seconds, 0);
  // With both slopes at 0 the best base is near the mean of the two durations.
  EXPECT_NEAR(model.profile().base_seconds, 0.03, 0.003);
}

TEST(StepCostModelTest, OutliersAreClippedAndTheFitStaysSane) {
  const StepProfile truth = kFitted;
  StepCostModel model = MakeModel({.prior = truth});
  StepSource source(3);
  for (int i = 0; i < 1000; ++i) {
    StepObservation step = source.Next(truth, 0.02);
    if (i % 100 == 50) step.duration_us = int64_t{1} << 60;  // a 36,000-year step
    ASSERT_TRUE(model.Observe(step).ok());
    ASSERT_TRUE(Sane(model.profile())) << i;
  }
  // Clipped at 10x, one outlier in 100 raises the fit by well under a factor of 2.
  const double typical = truth.StepSeconds(512, 32, 32768);
  EXPECT_LT(model.StepSeconds(Step(512, 32, 32768, 0)), 2 * typical);
  EXPECT_GT(model.StepSeconds(Step(512, 32, 32768, 0)), 0.5 * typical);
  // Absurd sizes and durations at once.
  const int64_t big = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(model
                  .Observe({.batch_size = big,
                            .prefill_tokens = big,
                            .decode_tokens = big,
                            .context_tokens = big,
                            .duration_us = big})
                  .ok());
  ASSERT_TRUE(model.Observe(Step(0, 0, 0, 0)).ok());
  EXPECT_TRUE(Sane(model.profile()));
  EXPECT_TRUE(std::isfinite(model.StepSeconds(Step(512, 32, 32768, 0))));
}

TEST(StepCostModelTest, ASlowdownBeyondTheClipIsStillFollowed) {
  const StepProfile prior = {};
  StepCostModel model = MakeModel({.prior = prior, .forgetting = 0.99});
  // Every step now takes 50 times the prior's prediction (the clip is 10x per step). The prior
  // fades to weight 1 against about 100 observations: the fit ends within 1% of the data.
  const StepObservation step = Step(256, 16, 16384, 50 * prior.StepSeconds(256, 16, 16384));
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(model.Observe(step).ok());
  EXPECT_NEAR(model.StepSeconds(step), 50 * prior.StepSeconds(256, 16, 16384),
              0.05 * 50 * prior.StepSeconds(256, 16, 16384));
}

TEST(StepCostModelTest, RefusesNegativeFieldsAndChangesNothing) {
  StepCostModel model = MakeModel({.prior = kProfile});
  ASSERT_TRUE(model.Observe(Step(100, 1, 100, 0.02)).ok());
  const StepProfile fitted = model.profile();
  const StepObservation bad[] = {
      {.batch_size = -1},     {.prefill_tokens = -1}, {.decode_tokens = -1},
      {.context_tokens = -1}, {.duration_us = -1},
  };
  for (const StepObservation& step : bad) {
    EXPECT_EQ(model.Observe(step).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(model.observations(), 1);
  EXPECT_EQ(model.profile().base_seconds, fitted.base_seconds);
  EXPECT_EQ(model.profile().prefill_token_seconds, fitted.prefill_token_seconds);
}

TEST(StepCostModelTest, ResetStartsAgainFromANewPrior) {
  StepCostModel model = MakeModel();
  ASSERT_TRUE(model.Observe(Step(100, 1, 100, 0.5)).ok());
  EXPECT_EQ(model.Reset({.base_seconds = -1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.observations(), 1);
  ASSERT_TRUE(model.Reset(kProfile).ok());
  EXPECT_EQ(model.observations(), 0);
  EXPECT_EQ(model.profile().base_seconds, kProfile.base_seconds);
  // The new prior is what a later fit is pulled towards: an observation that agrees with it
  // changes nothing.
  ASSERT_TRUE(model.Observe(Step(100, 10, 20000, 0.05)).ok());
  EXPECT_NEAR(model.profile().base_seconds, kProfile.base_seconds, 1e-12);
  EXPECT_NEAR(model.profile().decode_token_seconds, kProfile.decode_token_seconds, 1e-12);
}

// ----------------------------------------------------------------------------------------------
// TransferModel

// The steps a CPU worker's start-up calibration reported (EngineLoop::Calibrate, SmolLM2-135M on
// one thread): prefill about 4 ms per prompt token, decode about 5 ms per sequence on a 6 ms base,
// 20x the built-in profile. A prompt's context is its attention (n (n + 1) / 2 for n tokens; the
// 64-token step is two prompts of 32), reported apart from the decode tokens'. CalibrationOptions (a prior of next to no weight, no clipping) fits
// them closely at once; the router then starts the worker's model from that profile.
TEST(StepCostModelTest, FitsACalibrationFarFromThePrior) {
  StepCostModel model = MakeModel(CalibrationOptions());
  const StepObservation steps[] = {
      Step(32, 0, 0, 0.120028, 528),     Step(0, 1, 33, 0.010895),  Step(0, 1, 34, 0.011006),
      Step(192, 0, 0, 0.779295, 18528),  Step(0, 1, 193, 0.013048), Step(32, 0, 0, 0.121435, 528),
      Step(0, 4, 36, 0.022722),          Step(0, 4, 40, 0.023333),  Step(0, 4, 44, 0.022854),
      Step(64, 0, 0, 0.253192, 1056),    Step(0, 16, 80, 0.085031), Step(0, 16, 96, 0.084901),
      Step(0, 16, 112, 0.086306),
  };
  for (const StepObservation& s : steps) ASSERT_TRUE(model.Observe(s).ok());
  // Within 20%, or 5 ms for the shortest steps (one decoding sequence costs more than the linear
  // model's share).
  for (const StepObservation& s : steps) {
    const double seconds = s.duration_us * 1e-6;
    EXPECT_NEAR(model.StepSeconds(s), seconds, std::max(0.2 * seconds, 0.005))
        << s.prefill_tokens << " prompt tokens, " << s.decode_tokens << " decoding";
  }
  // What the policy asks: a 100-token prompt alone (about 4 ms a token), and a batch of 36
  // decoding, which costs more than twice the 16 of the calibration and less than its context
  // term could make of 100 tokens each.
  EXPECT_NEAR(model.PrefillSeconds({.uncached_tokens = 100, .token_budget = 512}), 0.4, 0.08);
  EXPECT_GT(model.DecodeStepSeconds(36, 36 * 100), 2 * 0.085);
  EXPECT_LT(model.DecodeStepSeconds(36, 36 * 100), 0.5);
}

TEST(TransferModelTest, RejectsInvalidOptions) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const TransferModelOptions bad[] = {
      {.default_seconds_per_byte = -1},
      {.default_seconds_per_byte = nan},
      {.alpha = 0},
      {.alpha = 1.5},
      {.min_observed_bytes = -1},
      {.outlier_factor = 0.9},
  };
  for (const TransferModelOptions& options : bad) {
    EXPECT_EQ(TransferModel::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TransferModelTest, MovingAverageByPairThenByPrefillWorkerThenDefault) {
  TransferModel model =
      MakeTransfer({.default_seconds_per_byte = 1e-9, .alpha = 0.5, .min_observed_bytes = 1000});
  EXPECT_EQ(model.SecondsPerByte("p0", "d0"), 1e-9);
  EXPECT_NEAR(model.TransferSeconds("p0", "d0", 2'000'000), 0.002, kTight);
  EXPECT_EQ(model.TransferSeconds("p0", "d0", 0), 0);
  // 1 MB in 2 ms: 2e-9 s/B. Pair and prefill worker: 0.5 * 1e-9 + 0.5 * 2e-9.
  ASSERT_TRUE(model.Observe("p0", "d0", 1'000'000, 0.002).ok());
  EXPECT_NEAR(model.SecondsPerByte("p0", "d0"), 1.5e-9, 1e-20);
  EXPECT_NEAR(model.SecondsPerByte("p0", "d1"), 1.5e-9, 1e-20);  // p0's average
  EXPECT_EQ(model.SecondsPerByte("p1", "d0"), 1e-9);             // nothing about p1
  // 4e-9 s/B to d1: d1's pair starts from p0's average: 0.5 * 1.5e-9 + 0.5 * 4e-9.
  ASSERT_TRUE(model.Observe("p0", "d1", 1'000'000, 0.004).ok());
  EXPECT_NEAR(model.SecondsPerByte("p0", "d1"), 2.75e-9, 1e-20);
  EXPECT_NEAR(model.SecondsPerByte("p0", "d0"), 1.5e-9, 1e-20);   // its own pair is unchanged
  EXPECT_NEAR(model.SecondsPerByte("p0", "d2"), 2.75e-9, 1e-20);  // p0: 0.5 * 1.5 + 0.5 * 4
  // Transfers under min_observed_bytes are ignored.
  ASSERT_TRUE(model.Observe("p1", "d0", 999, 10.0).ok());
  EXPECT_EQ(model.SecondsPerByte("p1", "d0"), 1e-9);
}

TEST(TransferModelTest, OutliersAreClipped) {
  TransferModel model = MakeTransfer({.default_seconds_per_byte = 1e-9, .alpha = 0.5});
  // 1e-6 s/B is 1000x the estimate: clipped to 10x (1e-8), then averaged.
  ASSERT_TRUE(model.Observe("p0", "d0", 1'000'000, 1.0).ok());
  EXPECT_NEAR(model.SecondsPerByte("p0", "d0"), 0.5e-9 + 0.5e-8, 1e-20);
  // A transfer that took no time: clipped to a tenth.
  ASSERT_TRUE(model.Observe("p0", "d0", 1'000'000, 0.0).ok());
  EXPECT_NEAR(model.SecondsPerByte("p0", "d0"), 0.5 * 5.5e-9 + 0.5 * 5.5e-10, 1e-20);
  EXPECT_TRUE(std::isfinite(model.SecondsPerByte("p0", "d0")));
}

TEST(TransferModelTest, RefusesInvalidObservations) {
  TransferModel model = MakeTransfer({.default_seconds_per_byte = 1e-9});
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(model.Observe("", "d0", 1 << 20, 0.1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Observe("p0", "", 1 << 20, 0.1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Observe("p0", "d0", -1, 0.1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Observe("p0", "d0", 1 << 20, -0.1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Observe("p0", "d0", 1 << 20, inf).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.SecondsPerByte("p0", "d0"), 1e-9);
}

TEST(TransferModelTest, ForgetWorkerDropsItsPairs) {
  TransferModel model = MakeTransfer({.default_seconds_per_byte = 1e-9, .alpha = 1.0});
  ASSERT_TRUE(model.Observe("p0", "d0", 1'000'000, 0.003).ok());
  ASSERT_TRUE(model.Observe("p1", "d1", 1'000'000, 0.005).ok());
  model.ForgetWorker("d0");
  EXPECT_NEAR(model.SecondsPerByte("p0", "d0"), 3e-9, 1e-20);  // p0's own average remains
  EXPECT_NEAR(model.SecondsPerByte("p1", "d1"), 5e-9, 1e-20);
  model.ForgetWorker("p0");
  EXPECT_EQ(model.SecondsPerByte("p0", "d0"), 1e-9);
  model.ForgetWorker("p1");
  EXPECT_EQ(model.SecondsPerByte("p1", "d1"), 1e-9);
}

LatencyCorrection MakeCorrection(const LatencyCorrectionOptions& options) {
  return testing_util::OrDie(LatencyCorrection::Create(options));
}

TEST(LatencyCorrectionTest, RejectsInvalidOptions) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const LatencyCorrectionOptions& bad : std::vector<LatencyCorrectionOptions>{
           {.alpha = 0}, {.alpha = 1.5}, {.alpha = nan}, {.max_factor = 0.5},
           {.max_factor = std::numeric_limits<double>::infinity()}}) {
    EXPECT_EQ(LatencyCorrection::Create(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.alpha << " " << bad.max_factor;
  }
}

TEST(LatencyCorrectionTest, FollowsTheGeometricMeanOfTheRatios) {
  LatencyCorrection c = MakeCorrection({.alpha = 0.5, .max_factor = 4.0});
  EXPECT_EQ(c.factor(), 1.0);
  // Observed twice the prediction: log factor 0 + 0.5 * (log 2 - 0) = log sqrt(2).
  ASSERT_TRUE(c.Observe(0.2, 0.1).ok());
  EXPECT_NEAR(c.factor(), std::sqrt(2.0), 1e-12);
  // Then half of it: 0.5 * log sqrt(2) + 0.5 * log 0.5 = log(2^0.25 * 2^-0.5).
  ASSERT_TRUE(c.Observe(0.05, 0.1).ok());
  EXPECT_NEAR(c.factor(), std::pow(2.0, -0.25), 1e-12);
  EXPECT_EQ(c.observations(), 2);
  // Ratios that alternate x3 and /3 leave it near 1 (the geometric mean), where an arithmetic
  // mean of the ratios would drift to 1.67.
  LatencyCorrection symmetric = MakeCorrection({.alpha = 0.1});
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(symmetric.Observe(i % 2 ? 3.0 : 1.0 / 3, 1.0).ok());
  EXPECT_NEAR(symmetric.factor(), 1.0, 0.12);
  // A steady ratio is reached.
  LatencyCorrection steady = MakeCorrection({.alpha = 0.1});
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(steady.Observe(0.013, 0.01).ok());
  EXPECT_NEAR(steady.factor(), 1.3, 1e-6);
}

TEST(LatencyCorrectionTest, OutliersAndTheFactorAreClipped) {
  LatencyCorrection c = MakeCorrection({.alpha = 1.0, .max_factor = 4.0});
  ASSERT_TRUE(c.Observe(1000.0, 1.0).ok());
  EXPECT_NEAR(c.factor(), 4.0, 1e-12);
  ASSERT_TRUE(c.Observe(1e-6, 1.0).ok());
  EXPECT_NEAR(c.factor(), 0.25, 1e-12);
}

TEST(LatencyCorrectionTest, RefusesInvalidObservations) {
  LatencyCorrection c = MakeCorrection({});
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [observed, predicted] : std::vector<std::pair<double, double>>{
           {0, 1}, {1, 0}, {-1, 1}, {1, -1}, {inf, 1}, {1, inf}, {nan, 1}, {1, nan}}) {
    EXPECT_EQ(c.Observe(observed, predicted).code(), absl::StatusCode::kInvalidArgument)
        << observed << " " << predicted;
  }
  EXPECT_EQ(c.factor(), 1.0);
  EXPECT_EQ(c.observations(), 0);
}

TEST(ClassedLatencyCorrectionTest, EachClassLearnsItsOwnFactorFromTheWorkersOne) {
  absl::StatusOr<ClassedLatencyCorrection> made =
      ClassedLatencyCorrection::Create({.alpha = 0.5, .max_factor = 4.0});
  ASSERT_TRUE(made.ok()) << made.status();
  ClassedLatencyCorrection c = *made;
  EXPECT_EQ(c.factor(0), 1.0);
  // A priority-1 request observed twice its prediction: the worker's factor and the new class's
  // (from the worker's 1) both become sqrt(2); priority 0, with none of its own, has the
  // worker's.
  ASSERT_TRUE(c.Observe(1, 0.2, 0.1).ok());
  EXPECT_NEAR(c.factor(1), std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(c.factor(0), std::sqrt(2.0), 1e-12);
  // Then a priority-0 one at half its prediction: its class starts from the worker's sqrt(2),
  // 0.5 * log sqrt(2) + 0.5 * log 0.5 = log 2^-0.25, as does the worker's; priority 1 keeps its
  // own.
  ASSERT_TRUE(c.Observe(0, 0.05, 0.1).ok());
  EXPECT_NEAR(c.factor(0), std::pow(2.0, -0.25), 1e-12);
  EXPECT_NEAR(c.overall().factor(), std::pow(2.0, -0.25), 1e-12);
  EXPECT_NEAR(c.factor(1), std::sqrt(2.0), 1e-12);
  // Classes that stay apart settle apart, where one factor would sit between them.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(c.Observe(1, 0.9, 1.0).ok());
    ASSERT_TRUE(c.Observe(0, 1.5, 1.0).ok());
  }
  EXPECT_NEAR(c.factor(1), 0.9, 1e-9);
  EXPECT_NEAR(c.factor(0), 1.5, 1e-9);
  EXPECT_GT(c.overall().factor(), 0.9);
  EXPECT_LT(c.overall().factor(), 1.5);
  EXPECT_NEAR(c.factor(7), c.overall().factor(), 1e-12);  // a class not seen yet
  EXPECT_EQ(c.by_priority().size(), 2u);
  // A refused observation creates no class and changes nothing.
  EXPECT_EQ(c.Observe(5, -1, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.by_priority().size(), 2u);
  EXPECT_EQ(c.overall().observations(), 202);
  EXPECT_EQ(ClassedLatencyCorrection::Create({.alpha = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::placement
