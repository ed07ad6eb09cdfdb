// Tests of the slo policy: its choices and its predictions on hand-built clusters. Every expected
// number is worked out in the comments from the coefficients of the test's profile (docs/slo.md
// has the formulas).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/cost_model.h"
#include "router/placement/placement.h"
#include "router/placement/placement_test_util.h"

namespace tandem::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testing_util::CachedSet;
using testing_util::Ids;
using testing_util::MakePolicy;
using testing_util::OrDie;
using testing_util::PlaceOrDie;
using testing_util::Prompt;
using testing_util::Worker;

constexpr double kTol = 1e-9;

// 10 ms a step, 0.1 ms a prompt token, 1 ms a decoding sequence, no context cost (unless a test
// sets one); budget 512 tokens a step; KV of 10 kB a token moved at 1 ns a byte (10 us a token);
// a sequence holds its batch slot for 100 tokens. Objectives: TTFT 1 s, TPOT 50 ms.
PolicyOptions Options() {
  return {.seed = 1,
          .default_ttft_ms = 1000,
          .default_tpot_ms = 50,
          .default_step_profile = {.base_seconds = 0.010,
                                   .prefill_token_seconds = 1e-4,
                                   .decode_token_seconds = 1e-3,
                                   .context_token_seconds = 0,
                                   .prompt_context_token_seconds = 0},
          .default_max_tokens_per_step = 512,
          .default_kv_bytes_per_token = 10000,
          .default_transfer_seconds_per_byte = 1e-9,
          .expected_output_tokens = 100};
}

// Both kinds of attention at the same cost per context token.
PolicyOptions WithContextCost(double seconds_per_token) {
  PolicyOptions options = Options();
  options.default_step_profile.context_token_seconds = seconds_per_token;
  options.default_step_profile.prompt_context_token_seconds = seconds_per_token;
  return options;
}

Request WithSlo(Request r, int64_t ttft_ms, int64_t tpot_ms) {
  r.slo = {.ttft_ms = ttft_ms, .tpot_ms = tpot_ms};
  return r;
}

TEST(SloPolicyTest, LocalPrefillOnAnIdleWorkerByHand) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", WithContextCost(1e-6));
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode)}};
  // 1000 tokens in chunks of 512: 2 steps of 10 ms, 1000 * 0.1 ms, and their attention,
  // 1e-6 * 1000 * 1001 / 2: TTFT 0.6205. TPOT: one sequence with 1000 tokens of context:
  // 0.010 + 0.001 + 0.001.
  Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_TRUE(d.local_prefill);
  EXPECT_EQ(d.reason, PrefillReason::kNoPrefillWorker);
  EXPECT_THAT(d.prefill, IsEmpty());
  EXPECT_TRUE(d.predicted);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.6205, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.012, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0, kTol);
  EXPECT_NEAR(d.ttft_slo_seconds, 1.0, kTol);
  EXPECT_NEAR(d.tpot_slo_seconds, 0.05, kTol);
  // min((1 - 0.6205) / 1, (0.05 - 0.012) / 0.05) = min(0.3795, 0.76).
  EXPECT_NEAR(d.headroom, 0.3795, kTol);
  EXPECT_TRUE(d.meets_slo);

  // 20 blocks (320 tokens) cached: 680 to compute after them, still 2 chunks, attending to the
  // cached tokens too: 2 * 0.010 + 680e-4 + 1e-6 * (1000 * 1001 - 320 * 321) / 2 = 0.53714. The
  // TPOT still counts the whole prompt as context.
  const absl::flat_hash_set<BlockHash> cache = CachedSet(20);
  const ClusterView cached = {.workers = {Worker("d0", Role::kDecode).Cached(&cache)}};
  d = PlaceOrDie(*policy, Prompt(1000), cached);
  EXPECT_EQ(d.decode_cached_tokens, 320);
  EXPECT_EQ(d.uncached_tokens, 680);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.53714, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.012, kTol);
}

TEST(SloPolicyTest, RequestObjectivesOverrideTheDefaults) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode)}};
  // TTFT 2 * 0.010 + 0.1 = 0.12, TPOT 0.011 (no context cost). Against 200 ms and 20 ms:
  // min((0.2 - 0.12) / 0.2, (0.02 - 0.011) / 0.02) = min(0.4, 0.45).
  const Decision d = PlaceOrDie(*policy, WithSlo(Prompt(1000), 200, 20), cluster);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.12, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.011, kTol);
  EXPECT_NEAR(d.ttft_slo_seconds, 0.2, kTol);
  EXPECT_NEAR(d.tpot_slo_seconds, 0.02, kTol);
  EXPECT_NEAR(d.headroom, 0.4, kTol);
  EXPECT_TRUE(d.meets_slo);
}

TEST(SloPolicyTest, LocalUntilItWouldStallTheRunningStreamsThenRemote) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // d0 decodes 20 streams with a 40 ms TPOT objective and 20 output tokens (10 left, on
  // average); p0 has 8000 prompt tokens queued: 16 steps, 0.16 + 0.8 = 0.96 s, too long for a
  // remote prefill to keep half of the 1 s TTFT objective.
  ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(20).MaxRunning(64).Running(40, 20),
                  Worker("p0", Role::kPrefill).Queue(8000)}};
  // Locally the prompt shares each step with 20 decode tokens: chunks of 492, each step
  // 0.010 + 0.020 + its chunk * 1e-4. With this request the batch steps in 0.010 + 0.021 = 0.031;
  // a local prefill of C seconds raises the streams' mean TPOT to 0.031 + C / 10.
  // 190 tokens: C = 0.049, streams 0.0359 <= 0.040, far better than remote (p0's queue and the
  // prompt are 16 steps of at most 512 tokens, 0.16 + 0.819, + 0.0019 of transfer = 0.9809).
  Decision d = PlaceOrDie(*policy, Prompt(190), cluster);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_TRUE(d.local_prefill);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_THAT(d.prefill, IsEmpty());
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.049, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.031, kTol);
  // min(0.951, the request's (0.05 - 0.031) / 0.05, the streams' (0.04 - 0.0359) / 0.04).
  EXPECT_NEAR(d.headroom, 0.1025, kTol);

  // 500 tokens: 2 chunks, C = 2 * 0.030 + 0.05 = 0.11; the streams would average 0.042 > 0.040:
  // remote, a predicted miss. p0's queue fills 15 steps of 512 alone (0.0612 each, 0.918); the
  // prompt's first 192 tokens share the 16th with its last 320, its other 308 take one more
  // step: 0.02 + 0.082 = 0.102 of its own; + 500 * 10 us transfer: 1.025 (the 16 queue steps
  // and a step of the prompt alone, as before, but the shared step is not waiting).
  d = PlaceOrDie(*policy, Prompt(500), cluster);
  EXPECT_FALSE(d.local_prefill);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_THAT(Ids(d), ElementsAre("p0"));
  EXPECT_NEAR(d.predicted_ttft_seconds, 1.025, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.918, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.031, kTol);
  // min(1 - 1.025, 0.38 for the request, (0.04 - 0.031) / 0.04 for the streams).
  EXPECT_NEAR(d.headroom, -0.025, kTol);
  EXPECT_FALSE(d.meets_slo);

  // Streams with more tokens left spread the same stall thinner: 60 ms and 200 tokens average
  // 0.031 + 0.11 / 100 = 0.0321: local again.
  cluster.workers[0].slo.running_groups = {{.tpot_ms = 60, .max_tokens = 200}};
  d = PlaceOrDie(*policy, Prompt(500), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.11, kTol);
  EXPECT_NEAR(d.headroom, 0.38, kTol);

  // The tightest group binds: adding back the 40 ms, 20-token streams sends it remote.
  cluster.workers[0].slo.running_groups.push_back({.tpot_ms = 40, .max_tokens = 20});
  d = PlaceOrDie(*policy, Prompt(500), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);

  // Unknown streams (placed by an earlier router) count as the defaults: 50 ms and 100 tokens,
  // 0.031 + 0.11 / 50 = 0.0332: local.
  cluster.workers[0].slo.running_groups.clear();
  d = PlaceOrDie(*policy, Prompt(500), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
}

TEST(SloPolicyTest, ARemotePrefillWaitsForTheDecodeWorkersStepBoundaries) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // d0 decodes 20 streams of 40 ms and 4 tokens (2 left), which no local prefill may stall by
  // more than 18 ms; p0 is idle. d0 reserves the prompt's blocks between two of its steps before
  // it asks p0, and takes the first token between two steps.
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(20).MaxRunning(64).Running(40, 4),
                  Worker("p0", Role::kPrefill)}};
  ClusterView queued = cluster;
  queued.workers[0].queued_prefill_tokens = 4000;
  // 100 tokens remote: 0.010 + 0.01 + 0.001 transfer = 0.021 on an idle d0...
  Decision d = PlaceOrDie(*policy, Prompt(100), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.021, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0, kTol);
  // ...but with 4000 prompt tokens queued on d0 (0.67 s of steps: chunks of 492 beside 20
  // decoding) d0 asks p0 only after a chunk's step of 0.010 + 492e-4 + 20e-3 = 0.0792, is still in
  // its queue when the KV is in place, and takes the token at its next step boundary: half such a
  // step on average. The steps count as waiting.
  d = PlaceOrDie(*policy, Prompt(100), queued);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.0792 + 0.021 + 0.0396, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.0792 + 0.0396, kTol);
  const struct {
    double step_elapsed, ttft, wait;
  } in_progress[] = {
      // A step of d0 that has run 0.05 s has 0.0292 s left.
      {0.05, 0.0292 + 0.021 + 0.0396, 0.0292 + 0.0396},
      // 0.1 s (the sample's 0.05 and as long since it came) is past one step: the queue keeps d0
      // busy, so it is 0.0208 s into the next, not between two.
      {0.1, 0.0584 + 0.021 + 0.0396, 0.0584 + 0.0396},
      // One that has run longer than the whole queue's prediction leaves neither a step nor a
      // queue to wait for (not a negative wait).
      {5, 0.021, 0},
  };
  for (const auto& c : in_progress) {
    queued.workers[0].slo.step_elapsed_seconds = c.step_elapsed;
    d = PlaceOrDie(*policy, Prompt(100), queued);
    EXPECT_NEAR(d.predicted_ttft_seconds, c.ttft, kTol) << c.step_elapsed;
    EXPECT_NEAR(d.predicted_wait_seconds, c.wait, kTol) << c.step_elapsed;
  }
}

// A step in progress on the worker that prefills is that far into the queue.
TEST(SloPolicyTest, TheStepInProgressShortensTheQueueWait) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Queue(4000)}};
  // Queue: 4000 tokens in chunks of 512: seven steps of 0.0612 (the first about to start, or the
  // one in progress) are waiting; the prompt shares the eighth with the last 416 (0.01 + 0.0516)
  // and its last 4 tokens take a step more (0.01 + 0.0004): 0.4284 + 0.0716 = 0.5 in all, as
  // 8 steps of the queue and one of the prompt. 0.03 s into the first step leaves 0.0312 of it;
  // 1 s is past the whole queue (0.48): the prompt alone, 0.010 + 0.01.
  const struct {
    double step_elapsed, wait, ttft;
  } cases[] = {{0, 0.4284, 0.5}, {0.03, 0.3984, 0.47}, {1, 0, 0.02}};
  for (const auto& c : cases) {
    cluster.workers[0].slo.step_elapsed_seconds = c.step_elapsed;
    const Decision d = PlaceOrDie(*policy, Prompt(100), cluster);
    EXPECT_TRUE(d.local_prefill) << c.step_elapsed;
    EXPECT_NEAR(d.predicted_wait_seconds, c.wait, kTol) << c.step_elapsed;
    EXPECT_NEAR(d.predicted_ttft_seconds, c.ttft, kTol) << c.step_elapsed;
  }
}

TEST(SloPolicyTest, LearnedCorrectionsScaleAWorkersPredictions) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode)}};
  cluster.workers[0].slo.ttft_correction = 0.5;
  cluster.workers[0].slo.tpot_correction = 2.0;
  // The step model says TTFT 2 * 0.010 + 0.1 = 0.12 and TPOT 0.011 here.
  Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.06, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.022, kTol);
  EXPECT_EQ(d.ttft_correction, 0.5);
  EXPECT_EQ(d.tpot_correction, 2.0);

  // A remote prefill takes the prefill worker's TTFT correction (the transfer is not scaled):
  // d0's streams (40 ms, 2 tokens left) allow no local prefill; p0's 0.02 s doubles.
  cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(20).MaxRunning(64).Running(40, 4),
                         Worker("p0", Role::kPrefill)}};
  cluster.workers[1].slo.ttft_correction = 2.0;
  d = PlaceOrDie(*policy, Prompt(100), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.041, kTol);
  EXPECT_EQ(d.ttft_correction, 2.0);
  EXPECT_EQ(d.tpot_correction, 1.0);
}

TEST(SloPolicyTest, APrefillWorkerThatKeepsTheTtftGetsThePromptEvenIfLocalIsFaster) {
  PolicyOptions options = Options();
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", options);
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode), Worker("p0", Role::kPrefill)}};
  // 1000 tokens: local 2 * 0.010 + 0.1 = 0.12; remote the same + 0.01 of transfer, 87% under the
  // 1 s objective (more than the 50% asked): remote, keeping d0's steps short for what comes next.
  Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.13, kTol);
  // Asked for 90% of the objective, the remote prefill is not enough: the faster one, local.
  options.remote_prefill_headroom = 0.9;
  policy = MakePolicy("slo", options);
  d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.12, kTol);
}

TEST(SloPolicyTest, ALongLocalPrefillLeavesADecodeWorkerFreeForTheNextArrivals) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // 5000 tokens: 10 steps, 0.1 + 0.5 = 0.6 s on an idle worker, longer than half the default
  // 1 s TTFT objective. p0 has 20000 tokens queued: with the prompt, 25000 tokens in 49 steps
  // of at most 512 (the prompt shares the queue's last one), 0.49 + 2.5, + 0.05 of transfer =
  // 3.04 s, a predicted miss.
  const WorkerCandidate busy_p0 = Worker("p0", Role::kPrefill).Queue(20000);
  // d1 has 600 prompt tokens queued; d0 none. Locally on d0 the prompt would leave no decode
  // worker free for the next arrivals; on d1 it leaves d0: d1, local, 5600 tokens in 11 steps,
  // 0.11 + 0.56 = 0.67.
  Decision d = PlaceOrDie(*policy, Prompt(5000),
                          {.workers = {Worker("d0", Role::kDecode),
                                       Worker("d1", Role::kDecode).Queue(600), busy_p0}});
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.67, kTol);
  // Both free: either may take it, locally.
  d = PlaceOrDie(*policy, Prompt(5000),
                 {.workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode), busy_p0}});
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.6, kTol);
  // Both with prompts queued: neither may hold its steps that long; the prefill worker, late,
  // after the decode worker's step of a 512-token chunk (0.010 + 0.0512) that it asks p0 after.
  d = PlaceOrDie(*policy, Prompt(5000),
                 {.workers = {Worker("d0", Role::kDecode).Queue(600),
                              Worker("d1", Role::kDecode).Queue(600), busy_p0}});
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.0612 + 3.04, kTol);
  EXPECT_FALSE(d.meets_slo);
  // A short prompt holds nobody long: local on either (100 tokens, 0.02 s; on d1 the 700 tokens
  // in 2 steps, 0.09).
  d = PlaceOrDie(*policy, Prompt(100),
                 {.workers = {Worker("d0", Role::kDecode).Queue(600),
                              Worker("d1", Role::kDecode).Queue(600), busy_p0}});
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.09, kTol);
}

TEST(SloPolicyTest, AfterHigherPriorityRequestsALowerPriorityPrefillHoldsADecodeWorkerOneStep) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // The cluster of the test above, but the decode workers take up to 8192 tokens a step: 5000
  // tokens are one step of 0.01 + 0.5 = 0.51 s on d0; on d1 after its 600 queued tokens (one
  // step, 0.07 s), 0.58. Remote on d0 3.04 s (as in the test above).
  const Worker p0 = Worker("p0", Role::kPrefill).Queue(20000);
  const ClusterView view = {.workers = {Worker("d0", Role::kDecode).Budget(8192),
                                        Worker("d1", Role::kDecode).Budget(8192).Queue(600), p0}};
  Request low = WithSlo(Prompt(5000), 6000, 50);
  low.priority = 0;
  // Alone, it may hold d1 for 0.58 s (longer than half the default 1 s objective) because d0
  // stays free for the next arrivals.
  Decision d = PlaceOrDie(*policy, low, view);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.58, kTol);
  // After a priority-1 chat whose TTFT objective is 0.8 s, a priority-0 prompt may hold a decode
  // worker's steps for 0.4 s at most: what a chat arriving next waits for, the worker taking
  // prompts by priority, is one step of it, here 0.51 s on either. Remote on d0, 3.04 s, within
  // its own 6 s objective.
  Request chat = WithSlo(Prompt(40), 800, 50);
  chat.priority = 1;
  PlaceOrDie(*policy, chat, view);
  d = PlaceOrDie(*policy, low, view);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 3.04, kTol);
  EXPECT_TRUE(d.meets_slo);
  // Workers that cut a prompt into chunks of 512 tokens hold a chat for one chunk's step, 0.0612
  // s: the prompt prefills locally in the background, on d0 (10 steps, 0.1 + 0.5 = 0.6 s; on d1,
  // behind its 600 tokens, 11 steps, 0.67).
  const ClusterView chunked = {
      .workers = {Worker("d0", Role::kDecode).Budget(8192).PrefillCap(512),
                  Worker("d1", Role::kDecode).Budget(8192).PrefillCap(512).Queue(600), p0}};
  d = PlaceOrDie(*policy, low, chunked);
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.6, kTol);
  // Placing a queued request again does not count as new traffic: 64 re-placements of a
  // priority-0 request leave the chat in the recent window.
  Request again = low;
  again.placed_before = true;
  for (int i = 0; i < 64; ++i) PlaceOrDie(*policy, again, view);
  d = PlaceOrDie(*policy, low, view);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  // The same long prompt at priority 1 has no higher class to yield to.
  Request high = low;
  high.priority = 1;
  d = PlaceOrDie(*policy, high, view);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  // Once the priority-1 requests are 64 placements back, the priority-0 prompt is local again.
  for (int i = 0; i < 64; ++i) PlaceOrDie(*policy, Prompt(40), view);
  d = PlaceOrDie(*policy, low, view);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
}

TEST(SloPolicyTest, AHigherPriorityRequestWaitsOnlyForItsClassAndAboveAndOneChunk) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // d0 (no prefill worker) has a 5000-token priority-0 prompt queued, in chunks of 512.
  const ClusterView known = {.workers = {Worker("d0", Role::kDecode).PrefillCap(512).Classes(
                                 {{.priority = 0, .tokens = 5000, .prompts = 1}})}};
  // A 40-token priority-1 chat waits for the step of a chunk (0.01 + 0.0512), then shares its
  // own step with the next chunk of what the budget leaves, 512 - 40 = 472 tokens: 0.01 + 0.004
  // + 0.0472. TTFT 0.1224. The long prompt is computed between its decode steps: 0.6 s over its
  // 99 gaps of 100 expected tokens on top of 0.011.
  Request chat = Prompt(40);
  chat.priority = 1;
  Decision d = PlaceOrDie(*policy, chat, known);
  EXPECT_EQ(d.reason, PrefillReason::kNoPrefillWorker);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.1224, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.0612, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.011 + 0.6 / 99, kTol);
  // With d0 into a chunk's step it waits for the rest of that one: 0.03 s in, 0.0312 left;
  // 0.08 s in is 0.0188 s into the second of the 10 steps, 0.0424 left. 1 s in is past them all
  // (0.6): no wait, and no lower tokens left to share its step with, 0.014.
  const struct {
    double step_elapsed, wait, ttft;
  } in_progress[] = {
      {0.03, 0.0312, 0.0312 + 0.0612}, {0.08, 0.0424, 0.0424 + 0.0612}, {1, 0, 0.014}};
  for (const auto& c : in_progress) {
    ClusterView busy = known;
    busy.workers[0].slo.step_elapsed_seconds = c.step_elapsed;
    d = PlaceOrDie(*policy, chat, busy);
    EXPECT_NEAR(d.predicted_wait_seconds, c.wait, kTol) << c.step_elapsed;
    EXPECT_NEAR(d.predicted_ttft_seconds, c.ttft, kTol) << c.step_elapsed;
  }
  // Of its own class, it waits for the whole of it: the step about to start and 8 more of 512,
  // 9 * 0.0612 = 0.5508; it shares the tenth with the last 392 tokens: 0.01 + 0.0432. 0.604.
  Request same = Prompt(40);
  same.priority = 0;
  d = PlaceOrDie(*policy, same, known);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.604, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.5508, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.011, kTol);
  // A worker that does not report its queue by class: every queued token goes first.
  const ClusterView unknown = {
      .workers = {Worker("d0", Role::kDecode).PrefillCap(512).Queue(5000)}};
  d = PlaceOrDie(*policy, chat, unknown);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.604, kTol);
}

// The step in progress holds what the worker's last load sample showed queued; prompts the
// router placed since reached the worker after it began: they wait for it, then go first.
TEST(SloPolicyTest, PromptsPlacedSinceTheSampleWaitForTheStepInProgress) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // d0 prefills in chunks of 512 (a full step 0.01 + 0.0512 = 0.0612), 0.03 s into one; queued:
  // a 5000-token priority-0 prompt, and 600 tokens of priority-1 prompts, `placed` of them placed
  // by the router since the sample.
  auto view = [](int64_t placed) {
    WorkerCandidate w = Worker("d0", Role::kDecode)
                            .PrefillCap(512)
                            .Classes({{.priority = 1, .tokens = 600, .prompts = 2,
                                       .placed_tokens = placed},
                                      {.priority = 0, .tokens = 5000, .prompts = 1}});
    w.queued_prefill_tokens -= placed;
    w.placed_prefill_tokens = placed;
    w.placed_prompts = placed > 0 ? 2 : 0;
    w.slo.step_elapsed_seconds = 0.03;
    return ClusterView{.workers = {w}};
  };
  Request chat = Prompt(40);
  chat.priority = 1;
  // Shown, the 600 tokens went first into the step in progress (512 of them): a 40-token
  // priority-1 chat waits for its 0.0312 s left, then shares a step with their last 88 and 384
  // tokens of the long prompt, 0.0612.
  Decision d = PlaceOrDie(*policy, chat, view(0));
  EXPECT_NEAR(d.predicted_wait_seconds, 0.0312, kTol);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.0924, kTol);
  // Placed since, they are not in it: the step in progress is the long prompt's (0.0312 left);
  // 512 of them fill the next alone (0.0612), and the chat shares the one after with the last 88.
  d = PlaceOrDie(*policy, chat, view(600));
  EXPECT_NEAR(d.predicted_wait_seconds, 0.0924, kTol);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.1536, kTol);
}

TEST(SloPolicyTest, LocalWhenTheRemoteMissesAndTheDecodeWorkersQueueIsShorterThanTheTransfer) {
  PolicyOptions options = Options();
  options.default_ttft_ms = 2500;
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", options);
  // No streams decoding on d0, but 1000 prompt tokens queued for local prefill: 0.12 s. p0 is
  // idle; its only extra cost is the transfer, 10 us a token.
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Queue(1000), Worker("p0", Role::kPrefill)}};
  // 1024 tokens: local 0.12 + 2 * 0.010 + 0.1024 = 0.2424; remote, after d0's step of a
  // 512-token chunk (0.0612), 0.0612 + 0.1224 + 0.01024 = 0.19384 (d0's queue is done by then).
  Decision d = PlaceOrDie(*policy, Prompt(1024), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.19384, kTol);
  // 16000 tokens: remote 2.08 would not keep half of the 2.5 s objective, and the transfer (0.16)
  // now costs more than the queue (0.12): local, 17000 tokens in 34 steps, 0.34 + 1.7 = 2.04 (d0
  // is the only decode worker, so its long local prefill makes no arrival wait that could go
  // elsewhere). It waits for the queue's first step only; its first tokens share the second.
  d = PlaceOrDie(*policy, Prompt(16000), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.predicted_ttft_seconds, 2.04, kTol);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.0612, kTol);
}

TEST(SloPolicyTest, AvoidsAnOverloadedDecodeWorker) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // d0: 8 running + 4 waiting in 8 slots; d1: 4 running.
  const WorkerCandidate full = Worker("d0", Role::kDecode).Seqs(8, 4).MaxRunning(8);
  const ClusterView cluster = {
      .workers = {full, Worker("d1", Role::kDecode).Seqs(4).MaxRunning(8)}};
  // d1: local prefill of 100 tokens beside 4 decode tokens, 0.010 + 0.004 + 0.01 = 0.024; TPOT
  // with 5 sequences 0.015. The streams (the defaults: 50 ms, 100 tokens, 50 left) average
  // 0.015 + 0.024 / 50 = 0.01548. min(0.976, 0.7, (0.05 - 0.01548) / 0.05 = 0.6904).
  Decision d = PlaceOrDie(*policy, Prompt(100), cluster);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.024, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.015, kTol);
  EXPECT_NEAR(d.headroom, 0.6904, kTol);
  EXPECT_TRUE(d.meets_slo);

  // d0 alone: 13 sequences for 8 slots. TPOT of a full batch 0.018; the request is 5th in line
  // for a slot, and a slot frees every 100 * 0.018 / 8 s: wait 5 * 0.225 = 1.125. Then a local
  // prefill beside 8 decode tokens: 0.010 + 0.008 + 0.01 = 0.028. TTFT 1.153 > 1 s.
  d = PlaceOrDie(*policy, Prompt(100), {.workers = {full}});
  EXPECT_EQ(d.decode_worker, "d0");
  EXPECT_NEAR(d.predicted_wait_seconds, 1.125, kTol);
  EXPECT_NEAR(d.predicted_ttft_seconds, 1.153, kTol);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.018, kTol);
  EXPECT_NEAR(d.headroom, -0.153, kTol);
  EXPECT_FALSE(d.meets_slo);
}

TEST(SloPolicyTest, WhenNoWorkerCanMeetTheSloTheLeastBadOneIsChosen) {
  // d1's fitted model computes prompts twice as fast as the default profile of d0.
  const StepCostModel fast = OrDie(StepCostModel::Create({.prior = {
                                                              .base_seconds = 0.010,
                                                              .prefill_token_seconds = 5e-5,
                                                              .decode_token_seconds = 1e-3,
                                                              .context_token_seconds = 0,
                                                              .prompt_context_token_seconds = 0,
                                                          }}));
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode).Model(&fast)}};
  // 2000 tokens, 4 chunks, against a 100 ms TTFT: d0 0.04 + 0.2 = 0.24 (headroom -1.4), d1
  // 0.04 + 0.1 = 0.14 (headroom -0.4).
  const Decision d = PlaceOrDie(*policy, WithSlo(Prompt(2000), 100, 0), cluster);
  EXPECT_EQ(d.decode_worker, "d1");
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.14, kTol);
  EXPECT_NEAR(d.headroom, -0.4, kTol);
  EXPECT_FALSE(d.meets_slo);
  // The TPOT objective is the default one (the request set none).
  EXPECT_NEAR(d.tpot_slo_seconds, 0.05, kTol);
}

TEST(SloPolicyTest, RanksPrefillWorkersByPredictedTtftWithTheirTransfers) {
  PolicyOptions options = Options();
  options.default_tpot_ms = 100;
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", options);
  TransferModel transfers =
      OrDie(TransferModel::Create({.default_seconds_per_byte = 1e-9, .alpha = 1.0}));
  // p0 -> d0 measured at 5 ns a byte.
  ASSERT_TRUE(transfers.Observe("p0", "d0", 100'000'000, 0.5).ok());
  const absl::flat_hash_set<BlockHash> cache = CachedSet(40);  // 640 tokens
  ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(40).MaxRunning(64).Running(60, 20),
                  Worker("p0", Role::kPrefill), Worker("p1", Role::kPrefill).KvBytes(20000),
                  Worker("p2", Role::kPrefill).Cached(&cache),
                  Worker("p3", Role::kPrefill).Unhealthy()},
      .transfers = &transfers};
  // Local: chunks of 472 beside 40 decode tokens, 3 steps of 0.05 + 0.1 = 0.25, which would
  // raise the streams' mean TPOT (10 tokens left) to 0.051 + 0.025 > their 60 ms: not allowed.
  // Remote, 1000 tokens to move to d0:
  //   p0: 2 * 0.010 + 0.1 = 0.12, + 1e7 B * 5e-9 = 0.05: 0.17
  //   p1: 0.12 + 2e7 B * 1e-9 = 0.02: 0.14
  //   p2: 360 uncached, 0.010 + 0.036 = 0.046, + 1e7 B * 1e-9 = 0.01: 0.056
  Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_THAT(Ids(d), ElementsAre("p2", "p1", "p0"));
  EXPECT_EQ(d.prefill[0].cached_tokens, 640);
  EXPECT_EQ(d.decode_cached_tokens, 0);
  EXPECT_EQ(d.uncached_tokens, 1000);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.056, kTol);
  // 41 sequences: 0.051. min(0.944, (0.1 - 0.051) / 0.1, streams (0.06 - 0.051) / 0.06).
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.051, kTol);
  EXPECT_NEAR(d.headroom, 0.15, kTol);
  // Without measured transfers p0 moves at the default 1 ns a byte: 0.13, ahead of p1.
  cluster.transfers = nullptr;
  d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_THAT(Ids(d), ElementsAre("p2", "p0", "p1"));
}

TEST(SloPolicyTest, CountsLoadTheRouterPlaced) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", WithContextCost(1e-6));
  // 2 streams decoding with 3000 tokens of context, and 2 more placed (1000 prompt tokens to
  // decode after, 1024 still to prefill here).
  const ClusterView cluster = {
      .workers = {
          Worker("d0", Role::kDecode).Seqs(2).Placed(2, 1024).Active(3000).PlacedDecode(1000),
      }};
  // Steps carry 4 decode tokens and 4000 tokens of their context: a fixed 0.010 + 0.004 + 0.004.
  // Queue: 1024 tokens of the 2 placed prompts in chunks of 508, each token attending to 256.5
  // on average (prompts of 512). Placed, they are not in a step in progress: two steps of 508
  // go first, 0.036 + 1016 * (1e-4 + 1e-6 * 256.5) = 0.398204; the prompt shares the third with
  // the last 8: 0.018 + 108 * 1e-4 + 1e-6 * (8 * 256.5 + 100 * 101 / 2) = 0.035902.
  const Decision d = PlaceOrDie(*policy, Prompt(100), cluster);
  EXPECT_NEAR(d.predicted_wait_seconds, 0.398204, kTol);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.398204 + 0.035902, kTol);
  // 5 sequences, 3000 + 1000 + 100 tokens of context: 0.010 + 0.005 + 0.0041.
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.0191, kTol);
  // min(1 - 0.434106, (0.05 - 0.0191) / 0.05, and the streams, which the whole queue stalls too
  // (3 steps: 0.054 + 0.1024 + 2 * 1e-6 * 512 * 513 / 2 = 0.419056): (0.05 - (0.0191 +
  // (0.419056 + 0.035902) / 50)) / 0.05).
  EXPECT_NEAR(d.headroom, 0.4360168, kTol);
}

TEST(SloPolicyTest, ABatchAboveTheTokenBudgetDecodesSlower) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  const ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(31).MaxRunning(64).Budget(16)}};
  // 32 sequences, 16 tokens a step: each step decodes 16, each sequence every other step:
  // (0.010 + 0.016) * 32 / 16 = 0.052. The prompt gets 1 token a step: 10 steps of 0.026 + 1e-4.
  const Decision d = PlaceOrDie(*policy, Prompt(10), cluster);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.052, kTol);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.261, kTol);
  // The request's (0.05 - 0.052) / 0.05, and the streams' through the prefill it forces (no
  // prefill worker): (0.05 - (0.052 + 0.261 / 50)) / 0.05.
  EXPECT_NEAR(d.headroom, -0.1444, kTol);
  EXPECT_FALSE(d.meets_slo);
}

TEST(SloPolicyTest, WhatAStreamHasSeenSoFarCounts) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // As in LocalUntilItWouldStallTheRunningStreamsThenRemote: 20 streams of 40 ms and 20 tokens
  // (19 gaps between them) on d0, p0 queued 0.96 s. The batch steps in 0.030, with this request
  // 0.031; a local prefill of 190 tokens takes 0.049.
  ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(20).MaxRunning(64),
                                     Worker("p0", Role::kPrefill).Queue(8000)}};
  auto streams = [&](int64_t decoded, double seconds) {
    cluster.workers[0].slo.running_groups = {
        {.tpot_ms = 40, .max_tokens = 20, .decoded_tokens = decoded, .decode_seconds = seconds}};
  };
  // Streams before their first token have all 19 gaps to spread the stall over:
  // (0.049 + 19 * 0.031) / 19 = 0.033579.
  streams(0, 0);
  Decision d = PlaceOrDie(*policy, Prompt(190), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  EXPECT_NEAR(d.headroom, (0.04 - 0.049 / 19 - 0.031) / 0.04, kTol);
  // Streams 9 gaps in that took 0.41 s (stalled by earlier prompts: 45.6 ms a token so far) can
  // still make 40 ms, (0.41 + 10 * 0.030) / 19 = 0.03737, but not with the local prefill:
  // (0.41 + 0.049 + 10 * 0.031) / 19 = 0.04047. Remote keeps them at (0.41 + 0.31) / 19.
  streams(9, 0.41);
  d = PlaceOrDie(*policy, Prompt(190), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.predicted_ttft_seconds, 0.9809, kTol);
  EXPECT_NEAR(d.headroom, 1 - 0.9809, kTol);
  // The same streams with no time behind them would have allowed it.
  streams(9, 0.27);
  EXPECT_EQ(PlaceOrDie(*policy, Prompt(190), cluster).reason, PrefillReason::kPredictedLocal);
  // Streams 0.6 s in miss their objective even without this request, (0.6 + 0.3) / 19 = 0.0474;
  // they still hold it back (remote stalls them least): (0.04 - (0.6 + 0.31) / 19) / 0.04.
  streams(9, 0.6);
  d = PlaceOrDie(*policy, Prompt(190), cluster);
  EXPECT_EQ(d.reason, PrefillReason::kRemote);
  EXPECT_NEAR(d.headroom, (0.04 - 0.91 / 19) / 0.04, kTol);
  EXPECT_FALSE(d.meets_slo);
}

TEST(SloPolicyTest, ANewStreamSharesItsStepsOnlyWithWhatOutlastsIt) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", WithContextCost(1e-6));
  // d0 decodes 3 streams the router placed and holds 1 it placed whose prompt is still queued
  // elsewhere, over 1000 context tokens in all: two chats with 2 of 32 tokens left, one that has
  // just begun (0 of 32 decoded), and a not-started 8-token one. A 32-token request of 100 prompt
  // tokens shares 2/32 + 2/32 + 32/32 + 8/32 = 1.375 of them over its window: batch 2.375, their
  // context in the same proportion, 1.375 / 4 * 1000 = 343.75, plus its own 100. TPOT
  // 0.010 + 0.002375 + 443.75e-6.
  ClusterView cluster = {
      .workers = {Worker("d0", Role::kDecode).Seqs(3).Placed(1, 0).Active(1000)}};
  cluster.workers[0].slo.running_groups = {
      {.tpot_ms = 50, .max_tokens = 32, .decoded_tokens = 30, .decode_seconds = 0.3},
      {.tpot_ms = 50, .max_tokens = 32, .decoded_tokens = 30, .decode_seconds = 0.3},
      {.tpot_ms = 50, .max_tokens = 32, .decoded_tokens = 0, .decode_seconds = 0},
      {.tpot_ms = 50, .max_tokens = 8, .decoded_tokens = 0, .decode_seconds = 0}};
  Request request = Prompt(100);
  request.max_tokens = 32;
  Decision d = PlaceOrDie(*policy, request, cluster);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.010 + 0.002375 + 443.75e-6, kTol);
  // A request of 4 tokens outlasts none of them: each counts min(1, left / 4): 0.5 + 0.5 + 1 + 1.
  request.max_tokens = 4;
  d = PlaceOrDie(*policy, request, cluster);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.010 + 0.004 + (100 + 750) * 1e-6, kTol);
  // Streams whose progress the router does not know count whole: batch 5, all the context.
  cluster.workers[0].slo.running_groups.clear();
  request.max_tokens = 32;
  d = PlaceOrDie(*policy, request, cluster);
  EXPECT_NEAR(d.predicted_tpot_seconds, 0.010 + 0.005 + 1100e-6, kTol);
}

TEST(SloPolicyTest, EqualWorkersAreChosenAtRandom) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode), Worker("d1", Role::kDecode),
                                           Worker("d2", Role::kDecode).Seqs(1)}};
  std::map<std::string, int> counts;
  for (int k = 0; k < 600; ++k) ++counts[PlaceOrDie(*policy, Prompt(100), cluster).decode_worker];
  EXPECT_EQ(counts.count("d2"), 0u);
  EXPECT_NEAR(counts["d0"], 300, 60);
  EXPECT_NEAR(counts["d1"], 300, 60);
}

TEST(SloPolicyTest, BothRoleWorkersPrefillForOthersButNotForThemselves) {
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", Options());
  // b0 decodes 40 streams (no local prefill of a long prompt), b1 is idle: b1 decodes and
  // prefills it itself (no transfer), whatever b0 could do.
  const ClusterView cluster = {
      .workers = {Worker("b0", Role::kBoth).Seqs(40).MaxRunning(64), Worker("b1", Role::kBoth)}};
  Decision d = PlaceOrDie(*policy, Prompt(1000), cluster);
  EXPECT_EQ(d.decode_worker, "b1");
  EXPECT_EQ(d.reason, PrefillReason::kPredictedLocal);
  // Only b0, busy: b1 prefills for it.
  const ClusterView busy = {
      .workers = {Worker("b0", Role::kBoth).Seqs(40).MaxRunning(64), Worker("b1", Role::kPrefill)}};
  d = PlaceOrDie(*policy, Prompt(1000), busy);
  EXPECT_EQ(d.decode_worker, "b0");
  EXPECT_THAT(Ids(d), ElementsAre("b1"));
}

}  // namespace
}  // namespace tandem::placement
