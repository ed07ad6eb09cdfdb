#include "router/registry/load_ledger.h"

#include "gtest/gtest.h"
#include "router/placement/placement_test_util.h"

namespace tandem {
namespace {

constexpr absl::Duration kLag = absl::Milliseconds(150);

class LoadLedgerTest : public ::testing::Test {
 protected:
  // A decode worker's reported load, as ToCandidate makes it.
  static placement::WorkerCandidate Reported(int64_t running, int64_t waiting,
                                             int64_t context = 0) {
    return placement::testing_util::Worker("d0", placement::Role::kDecode)
        .Seqs(running, waiting)
        .Active(context);
  }
  placement::WorkerCandidate Applied(placement::WorkerCandidate c) const {
    ledger_.Apply(t0_, &c);
    return c;
  }
  // A stream placed, decoded and ended at t0_ + `at`.
  void DecodeAndEnd(uint64_t serial, int64_t prompt, int64_t tokens, absl::Duration at) {
    ledger_.Place(serial, {.sequences = 1, .decode_tokens = prompt}, {}, t0_);
    ledger_.StartRunning(serial, {.max_tokens = tokens});
    ledger_.Progress(serial, tokens, t0_ + at / 2);
    ledger_.Uncount(serial, /*prompt_only=*/false);
    ledger_.EndStream(serial, prompt, t0_ + at);
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1767225600);
  LoadLedger ledger_{kLag};
};

TEST_F(LoadLedgerTest, PlacedLoadAddsUpAndNeverGoesNegative) {
  ledger_.Place(1, {.prefill_tokens = 1000, .sequences = 1, .decode_tokens = 1000, .prompts = 1},
                {}, t0_);
  ledger_.Place(2, {.prefill_tokens = 500, .sequences = 1, .prompts = 1}, {}, t0_);
  ledger_.Place(3, {.prefill_tokens = -5, .sequences = -1}, {}, t0_);  // counts as nothing
  EXPECT_EQ(ledger_.placed().prefill_tokens, 1500);
  EXPECT_EQ(ledger_.placed().sequences, 2);
  EXPECT_EQ(ledger_.placed().decode_tokens, 1000);
  EXPECT_EQ(ledger_.placed().prompts, 2);
  ledger_.Uncount(1, /*prompt_only=*/true);  // its prompt is computed; it still decodes
  EXPECT_EQ(ledger_.placed().prefill_tokens, 500);
  EXPECT_EQ(ledger_.placed().prompts, 1);
  EXPECT_EQ(ledger_.placed().sequences, 2);
  ledger_.Uncount(1, /*prompt_only=*/false);
  ledger_.Uncount(1, /*prompt_only=*/false);  // once only
  ledger_.Uncount(99, /*prompt_only=*/false);  // unknown: nothing
  EXPECT_EQ(ledger_.placed().sequences, 1);
  EXPECT_EQ(ledger_.placed().decode_tokens, 0);
  placement::WorkerCandidate c = Applied(Reported(0, 0));
  EXPECT_EQ(c.placed_sequences, 1);
  EXPECT_EQ(c.placed_prefill_tokens, 500);
  EXPECT_EQ(c.placed_prompts, 1);
  ledger_.ForgetPlaced();  // the worker was lost
  EXPECT_EQ(ledger_.placed().sequences, 0);
  EXPECT_EQ(ledger_.placed().prefill_tokens, 0);
}

TEST_F(LoadLedgerTest, PlacedLoadCountsUntilASampleReceivedReportLagLater) {
  ledger_.Place(1, {.prefill_tokens = 100, .sequences = 1}, {}, t0_);
  ledger_.OnLoadSample(0, 0, t0_ + kLag - absl::Milliseconds(1));
  EXPECT_EQ(ledger_.placed().sequences, 1);  // that sample may predate the request
  ledger_.OnLoadSample(0, 0, t0_ + kLag);
  EXPECT_EQ(ledger_.placed().sequences, 0);
  EXPECT_EQ(ledger_.placed().prefill_tokens, 0);
}

TEST_F(LoadLedgerTest, PromptsSentToAPrefillWorkerCountUntilItsReceivedTokensShowThem) {
  ledger_.OnLoadSample(/*received_prompt_tokens=*/1000, 0, t0_);  // its counter before
  ledger_.Place(1, {.prefill_tokens = 300, .prompts = 1}, {.receipt_tokens = 300}, t0_);
  ledger_.Place(2, {.prefill_tokens = 200, .prompts = 1}, {.receipt_tokens = 200}, t0_);
  // Seconds later, the first one reached it (the decode worker's engine was busy): only it goes.
  ledger_.OnLoadSample(1300, 0, t0_ + absl::Seconds(2));
  EXPECT_EQ(ledger_.placed().prefill_tokens, 200);
  EXPECT_EQ(ledger_.placed().prompts, 1);
  // Another prompt of 100 tokens (not ours: too short to be the second) does not pay for it.
  ledger_.OnLoadSample(1400, 0, t0_ + absl::Seconds(3));
  EXPECT_EQ(ledger_.placed().prefill_tokens, 200);
  ledger_.OnLoadSample(1600, 0, t0_ + absl::Seconds(4));
  EXPECT_EQ(ledger_.placed().prefill_tokens, 0);
}

TEST_F(LoadLedgerTest, EndedStreamsAreSubtractedUntilASampleShowsThemFinish) {
  ledger_.OnSnapshot(/*finished_seqs=*/10);
  DecodeAndEnd(1, 100, 20, absl::Milliseconds(10));
  DecodeAndEnd(2, 100, 20, absl::Milliseconds(10));
  EXPECT_EQ(ledger_.ended_streams(), 2);
  EXPECT_EQ(ledger_.running_requests(), 0);
  // The last sample still counts both as running, with their context (prompt + 20 output).
  placement::WorkerCandidate c = Applied(Reported(3, 0, 3 * 120));
  EXPECT_EQ(c.running_seqs, 1);
  EXPECT_EQ(c.slo.active_decode_tokens, 120);
  // A sample showing one of them finished: one is left to subtract.
  ledger_.OnLoadSample(0, 11, t0_ + absl::Milliseconds(20));
  EXPECT_EQ(ledger_.ended_streams(), 1);
  ledger_.OnLoadSample(0, 12, t0_ + absl::Milliseconds(30));
  EXPECT_EQ(ledger_.ended_streams(), 0);
  EXPECT_EQ(Applied(Reported(1, 0)).running_seqs, 1);
}

// The flaky slo test's sequence: a sample taken as a burst of six started shows one running
// and five posted to the engine (waiting); the burst ends before the next sample. The request
// right after must see an idle worker, not a batch of six.
TEST_F(LoadLedgerTest, EndedStreamsComeOffWaitingTooWhenTheSamplePredatesTheirStart) {
  ledger_.OnSnapshot(10);
  for (uint64_t s = 1; s <= 6; ++s) DecodeAndEnd(s, 8, 12, absl::Milliseconds(200));
  const placement::WorkerCandidate c = Applied(Reported(/*running=*/1, /*waiting=*/5));
  EXPECT_EQ(c.running_seqs, 0);
  EXPECT_EQ(c.waiting_seqs, 0);
  EXPECT_EQ(c.placed_sequences, 0);
  EXPECT_TRUE(c.slo.running_groups.empty());
  // Ended streams never take the counts below zero, nor other work the sample shows.
  EXPECT_EQ(Applied(Reported(2, 7)).running_seqs, 0);
  EXPECT_EQ(Applied(Reported(2, 7)).waiting_seqs, 3);
}

TEST_F(LoadLedgerTest, AFinishTheSampleShowedFirstIsMatchedByTheStreamsEnd) {
  ledger_.OnSnapshot(10);
  ledger_.Place(1, {.sequences = 1, .decode_tokens = 50}, {}, t0_);
  ledger_.StartRunning(1, {});
  ledger_.Progress(1, 5, t0_);
  // The worker's sample says it finished before the router saw its last token.
  ledger_.OnLoadSample(0, 11, t0_ + absl::Milliseconds(5));
  ledger_.Uncount(1, false);
  ledger_.EndStream(1, 50, t0_ + absl::Milliseconds(6));
  EXPECT_EQ(ledger_.ended_streams(), 0);  // nothing left to subtract
  EXPECT_EQ(Applied(Reported(0, 0)).running_seqs, 0);
}

TEST_F(LoadLedgerTest, EndedStreamsExpireAfterReportLagAndWithASnapshotOrARestart) {
  ledger_.OnSnapshot(10);
  DecodeAndEnd(1, 10, 4, absl::Milliseconds(1));
  ledger_.OnLoadSample(0, 10, t0_ + absl::Milliseconds(1) + kLag - absl::Milliseconds(1));
  EXPECT_EQ(ledger_.ended_streams(), 1);
  ledger_.OnLoadSample(0, 10, t0_ + absl::Milliseconds(1) + kLag);
  EXPECT_EQ(ledger_.ended_streams(), 0);

  DecodeAndEnd(2, 10, 4, absl::Milliseconds(1));
  ledger_.OnSnapshot(10);  // a snapshot restates the load
  EXPECT_EQ(ledger_.ended_streams(), 0);

  DecodeAndEnd(3, 10, 4, absl::Milliseconds(1));
  ledger_.OnLoadSample(0, 2, t0_ + absl::Milliseconds(2));  // the counter went back: restarted
  EXPECT_EQ(ledger_.ended_streams(), 0);
}

TEST_F(LoadLedgerTest, NothingIsSubtractedForAWorkerThatReportsNoFinishes) {
  // An older worker (finished_seqs 0), or a stream that ended before its first token.
  DecodeAndEnd(1, 10, 4, absl::Milliseconds(1));
  EXPECT_EQ(ledger_.ended_streams(), 0);
  ledger_.OnSnapshot(10);
  ledger_.Place(2, {.sequences = 1}, {}, t0_);
  ledger_.StartRunning(2, {});
  ledger_.EndStream(2, 10, t0_);  // no token came
  EXPECT_EQ(ledger_.ended_streams(), 0);
}

TEST_F(LoadLedgerTest, RunningRequestsSayHowFarTheyAre) {
  ledger_.StartRunning(1, {.tpot_ms = 80, .max_tokens = 64});
  ledger_.StartRunning(2, {.tpot_ms = 0, .max_tokens = 0});
  ledger_.Progress(1, 1, t0_ - absl::Seconds(2));  // the first token starts its decoding
  ledger_.Progress(1, 10, t0_ - absl::Seconds(1));
  ledger_.Progress(7, 3, t0_);  // unknown: nothing
  placement::WorkerCandidate c = Applied(Reported(2, 0));
  ASSERT_EQ(c.slo.running_groups.size(), 2u);
  for (const placement::RunningGroup& g : c.slo.running_groups) {
    if (g.tpot_ms == 80) {
      EXPECT_EQ(g.max_tokens, 64);
      EXPECT_EQ(g.decoded_tokens, 10);
      EXPECT_DOUBLE_EQ(g.decode_seconds, 2.0);
    } else {
      EXPECT_EQ(g.decoded_tokens, 0);  // not started
      EXPECT_DOUBLE_EQ(g.decode_seconds, 0.0);
    }
  }
}

TEST_F(LoadLedgerTest, PlacedPromptsJoinTheQueueOfTheirClass) {
  ledger_.Place(1, {.prefill_tokens = 300, .prompts = 1}, {.priority = 1}, t0_);
  ledger_.Place(2, {.prefill_tokens = 200, .prompts = 1}, {.priority = 0}, t0_);
  ledger_.Place(3, {.sequences = 1}, {.priority = 5}, t0_);  // no prompt: no class
  placement::WorkerCandidate reported = Reported(0, 1);
  reported.queued_prefill_tokens = 100;
  reported.slo.queued_by_priority = {{.priority = 0, .tokens = 100, .prompts = 1}};
  const placement::WorkerCandidate c = Applied(reported);
  ASSERT_EQ(c.slo.queued_by_priority.size(), 2u);
  EXPECT_EQ(c.slo.queued_by_priority[0].priority, 1);
  EXPECT_EQ(c.slo.queued_by_priority[0].tokens, 300);
  EXPECT_EQ(c.slo.queued_by_priority[0].placed_tokens, 300);
  EXPECT_EQ(c.slo.queued_by_priority[1].priority, 0);
  EXPECT_EQ(c.slo.queued_by_priority[1].tokens, 300);
  EXPECT_EQ(c.slo.queued_by_priority[1].prompts, 2);
  EXPECT_EQ(c.slo.queued_by_priority[1].placed_tokens, 200);
  // A worker that queues prompts but reports no classes is not known by class.
  placement::WorkerCandidate unknown = Reported(0, 1);
  unknown.queued_prefill_tokens = 100;
  EXPECT_TRUE(Applied(unknown).slo.queued_by_priority.empty());
}

}  // namespace
}  // namespace tandem
