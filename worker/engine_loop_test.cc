#include "worker/engine_loop.h"

#include <time.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {

struct EngineLoopTestPeer {
  static void Post(EngineLoop& loop, absl::AnyInvocable<void(LocalEngine*) &&> task) {
    loop.Post(std::move(task));
  }
  // Returns once the engine thread has finished its current step and run a task after it: the
  // step that delivered a request's last token is then recorded and its counters published.
  static void WaitForStepBoundary(EngineLoop& loop) {
    absl::Notification reached;
    loop.Post([&](LocalEngine*) { reached.Notify(); });
    reached.WaitForNotification();
  }
};

namespace {

std::string ModelPath() {
  return absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

std::unique_ptr<EngineLoop> StartLoop(int64_t max_requests = 64, Clock* clock = RealClock()) {
  EngineLoop::Options options;
  options.engine.cpu.num_threads = 2;
  options.engine.kv_blocks = 96;
  options.engine.scheduler.max_running = 8;
  options.max_requests = max_requests;
  options.clock = clock;
  auto loop = EngineLoop::Start(ModelPath(), options);
  CHECK(loop.ok()) << loop.status();
  return *std::move(loop);
}

GenerationRequest Greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// A request's deltas, collected on the engine thread, awaited on another.
struct Stream {
  absl::Mutex mu;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  LocalEngine::DeltaCallback Callback() {
    return [this](const GenerationDelta& d) {
      absl::MutexLock lock(&mu);
      tokens.push_back(d.token);
      if (d.finish != sampling::FinishReason::kNone) done = true;
    };
  }
  std::vector<int32_t> Wait() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    return tokens;
  }
};

TEST(EngineLoopTest, RequestsFromManyThreadsEachGetTheirOwnOutput) {
  auto loop = StartLoop();
  const std::vector<std::string> texts = {"The capital of France is", "1, 2, 3, 4,",
                                          "def add(a, b):", "Once upon a time"};
  // Each alone first: the reference.
  std::vector<std::vector<int32_t>> alone;
  for (const std::string& t : texts) {
    Stream s;
    ASSERT_TRUE(loop->Submit(100, Greedy(loop->EncodePrompt(t), 10), s.Callback()).ok());
    alone.push_back(s.Wait());
  }
  std::vector<Stream> streams(texts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < texts.size(); ++i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(loop->Submit(i, Greedy(loop->EncodePrompt(texts[i]), 10), streams[i].Callback())
                      .ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(streams[i].Wait(), alone[i]) << texts[i];
  // The last delta comes just before the engine releases the request: the counters follow soon.
  EXPECT_TRUE(loop->AwaitStats([](const SchedulerStats& s) { return s.used_blocks == 0; },
                               absl::Seconds(60)));
  uint64_t newest = 0;
  EXPECT_FALSE(loop->StepsAfter(0, &newest).empty());
  EXPECT_GT(newest, 0u);
}

TEST(EngineLoopTest, CancelStopsTheStreamAndFreesItsBlocks) {
  auto loop = StartLoop();
  absl::Notification first;
  absl::Mutex mu;
  int deltas = 0;
  ASSERT_TRUE(loop->Submit(1, Greedy(loop->EncodePrompt("Count: 1, 2, 3,"), 500),
                           [&](const GenerationDelta&) {
                             absl::MutexLock lock(&mu);
                             if (++deltas == 1) first.Notify();
                           })
                  .ok());
  first.WaitForNotification();
  EXPECT_TRUE(loop->Cancel(1));
  int seen;
  {
    absl::MutexLock lock(&mu);
    seen = deltas;
  }
  EXPECT_FALSE(loop->Cancel(1));
  EXPECT_EQ(loop->stats().used_blocks, 0);  // Cancel publishes the counters before it returns
  EXPECT_EQ(loop->stats().running, 0);
  // The loop still serves, and the cancelled stream got nothing more.
  Stream s;
  ASSERT_TRUE(loop->Submit(2, Greedy(loop->EncodePrompt("Hello"), 3), s.Callback()).ok());
  EXPECT_EQ(s.Wait().size(), 3u);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(deltas, seen);
}

TEST(EngineLoopTest, AHoldKvRequestKeepsItsBlocksUntilReleased) {
  auto loop = StartLoop();
  for (const bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "cancelled" : "finished");
    const uint64_t id = cancel ? 2 : 1;
    GenerationRequest r =
        Greedy(loop->EncodePrompt("A prompt of a few tokens, held"), cancel ? 500 : 2);
    r.hold_kv = true;
    Stream s;
    absl::Notification first;
    ASSERT_TRUE(loop->Submit(id, r, [&](const GenerationDelta& d) {
                      s.Callback()(d);
                      if (!first.HasBeenNotified()) first.Notify();
                    }).ok());
    if (cancel) {
      first.WaitForNotification();
      EXPECT_TRUE(loop->Cancel(id));
    } else {
      EXPECT_EQ(s.Wait().size(), 2u);
    }
    EngineLoopTestPeer::WaitForStepBoundary(*loop);
    const SchedulerStats held = loop->stats();
    EXPECT_EQ(held.running, 0);
    EXPECT_GT(held.used_blocks, 0);  // nothing runs, yet its blocks stay
    // The id stays in use until the release.
    EXPECT_EQ(loop->Submit(id, Greedy({1, 2, 3}, 1), [](const GenerationDelta&) {}).code(),
              absl::StatusCode::kInvalidArgument);

    absl::Notification released;
    bool found = false;
    loop->ReleaseKvAsync(id, [&](bool f) {
      found = f;
      released.Notify();
    });
    released.WaitForNotification();
    EXPECT_TRUE(found);
    EXPECT_EQ(loop->stats().used_blocks, 0);
    loop->ReleaseKvAsync(id, [&](bool f) { EXPECT_FALSE(f); });
  }
}

TEST(EngineLoopTest, TooManyRequestsAreRefused) {
  auto loop = StartLoop(/*max_requests=*/2);
  Stream a, b, c;
  ASSERT_TRUE(loop->Submit(1, Greedy(loop->EncodePrompt("a"), 40), a.Callback()).ok());
  ASSERT_TRUE(loop->Submit(2, Greedy(loop->EncodePrompt("b"), 40), b.Callback()).ok());
  const absl::Status third = loop->Submit(3, Greedy(loop->EncodePrompt("c"), 4), c.Callback());
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  a.Wait();
  b.Wait();
  EXPECT_TRUE(loop->Submit(3, Greedy(loop->EncodePrompt("c"), 4), c.Callback()).ok());
  c.Wait();
  // A bad request is refused and not counted.
  GenerationRequest empty;
  EXPECT_EQ(loop->Submit(4, empty, c.Callback()).code(), absl::StatusCode::kInvalidArgument);
}

// The asynchronous forms never block their caller: results come on the engine thread, refusals
// at once on the caller's, and every `done` runs exactly once.
TEST(EngineLoopTest, AsyncFormsReportOnTheEngineThreadOrAtOnceWhenRefused) {
  auto loop = StartLoop(/*max_requests=*/1);
  const std::thread::id caller = std::this_thread::get_id();
  Stream a;
  absl::Notification submitted;
  std::thread::id reported_on;
  loop->SubmitAsync(1, Greedy(loop->EncodePrompt("a"), 30), a.Callback(), [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    reported_on = std::this_thread::get_id();
    submitted.Notify();
  });
  submitted.WaitForNotification();
  EXPECT_NE(reported_on, caller);

  // Over max_requests: refused before SubmitAsync returns.
  bool refused = false;
  Stream b;
  loop->SubmitAsync(2, Greedy(loop->EncodePrompt("b"), 4), b.Callback(), [&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    refused = true;
  });
  EXPECT_TRUE(refused);
  loop->SubmitRemotePrefillAsync(3, Greedy(loop->EncodePrompt("c"), 4), b.Callback(),
                                 [&](absl::StatusOr<RemotePrefillPlan> plan) {
                                   EXPECT_EQ(plan.status().code(),
                                             absl::StatusCode::kResourceExhausted);
                                   refused = false;
                                 });
  EXPECT_FALSE(refused);

  // Cancelling: found once, then unknown; a remote-prefill call for an unknown id is NOT_FOUND.
  absl::Notification cancelled, unknown, complete;
  loop->CancelAsync(1, [&](bool found) {
    EXPECT_TRUE(found);
    cancelled.Notify();
  });
  loop->CancelAsync(1, [&](bool found) {
    EXPECT_FALSE(found);
    unknown.Notify();
  });
  loop->CompleteRemotePrefillAsync(42, {.id = 7, .logprob = {}, .top_logprobs = {}}, [&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    complete.Notify();
  });
  cancelled.WaitForNotification();
  unknown.WaitForNotification();
  complete.WaitForNotification();
  EXPECT_EQ(loop->stats().running + loop->stats().waiting, 0);

  // The count was released with the cancellation: a new request fits again.
  Stream c;
  EXPECT_TRUE(loop->Submit(4, Greedy(loop->EncodePrompt("c"), 3), c.Callback()).ok());
  EXPECT_EQ(c.Wait().size(), 3u);
}

// A response_format compiles on the submitting thread, never in the engine's step: with the
// engine thread held by another task, a schema that does not compile is refused at once, and one
// that does is compiled before SubmitAsync returns (the engine later finds it kept).
TEST(EngineLoopTest, AResponseFormatCompilesOnTheSubmittingThread) {
  auto loop = StartLoop();
  absl::Notification held, release;
  EngineLoopTestPeer::Post(*loop, [&](LocalEngine*) {
    held.Notify();
    release.WaitForNotification();
  });
  held.WaitForNotification();

  GenerationRequest bad = Greedy(loop->EncodePrompt("a"), 8);
  bad.sampling.ignore_eos = false;
  bad.sampling.response_format = {.kind = sampling::ResponseFormat::Kind::kJsonSchema,
                                  .text = R"({"type": "no-such-type"})"};
  bool refused = false;
  Stream a;
  loop->SubmitAsync(1, bad, a.Callback(), [&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    refused = true;
  });
  EXPECT_TRUE(refused);  // while the engine thread is still held

  GenerationRequest good = bad;
  good.sampling.response_format.text =
      R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";
  absl::Notification admitted;
  Stream b;
  loop->SubmitAsync(2, good, b.Callback(), [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    admitted.Notify();
  });
  EXPECT_FALSE(admitted.HasBeenNotified());  // it waits for the engine thread, compiled
  release.Notify();
  admitted.WaitForNotification();
  EXPECT_FALSE(b.Wait().empty());
}

// Calibration leaves steps of the shapes a cost model needs: big prefills, and decode batches of
// one and of many sequences, timed; and nothing running.
TEST(EngineLoopTest, CalibrationRunsPrefillAndDecodeStepsOfKnownShapes) {
  auto loop = StartLoop();
  ASSERT_TRUE(loop->Calibrate().ok());
  uint64_t newest = 0;
  const std::vector<StepInfo> steps = loop->StepsAfter(0, &newest);
  ASSERT_FALSE(steps.empty());
  int64_t largest_prefill = 0, largest_batch = 0, single_decodes = 0;
  // Decode-only steps of 4 sequences: with short contexts, and with ~200 tokens each (their
  // prompts mostly from the prefix cache), so that the fit can tell context from batch size.
  int64_t short_context_fours = 0, long_context_fours = 0;
  int64_t whole_prompt_steps = 0;
  for (const StepInfo& s : steps) {
    EXPECT_GT(s.total_seconds, 0);
    // Attention work: a decode token attends to its context, a prompt's n tokens from position
    // 0 to n (n + 1) / 2 in all.
    // The prompt tokens' part is reported apart.
    if (s.prefill_tokens == 0) {
      EXPECT_EQ(s.attended_tokens, s.context_tokens);
      EXPECT_EQ(s.prompt_attended_tokens, 0);
    } else {
      EXPECT_GT(s.prompt_attended_tokens, 0);
    }
    EXPECT_GE(s.attended_tokens, s.context_tokens);
    EXPECT_LE(s.prompt_attended_tokens, s.attended_tokens);
    if (s.batch_size == 1 && s.decode_tokens == 0 && s.context_tokens == s.prefill_tokens) {
      EXPECT_EQ(s.attended_tokens, s.prefill_tokens * (s.prefill_tokens + 1) / 2);
      EXPECT_EQ(s.prompt_attended_tokens, s.attended_tokens);
      ++whole_prompt_steps;
    }
    largest_prefill = std::max(largest_prefill, s.prefill_tokens);
    if (s.prefill_tokens == 0) {
      largest_batch = std::max(largest_batch, s.decode_tokens);
      if (s.decode_tokens == 1) ++single_decodes;
      if (s.decode_tokens == 4 && s.context_tokens < 100) ++short_context_fours;
      if (s.decode_tokens == 4 && s.context_tokens > 700) ++long_context_fours;
    }
  }
  EXPECT_GE(largest_prefill, 192);
  EXPECT_GE(whole_prompt_steps, 2);  // the 32- and 192-token prompts
  EXPECT_GE(single_decodes, 1);
  EXPECT_GE(short_context_fours, 1);
  EXPECT_GE(long_context_fours, 1);
  EXPECT_EQ(largest_batch, loop->max_running());  // 8 here: min(max_running, 48)
  EXPECT_EQ(loop->stats().running + loop->stats().waiting, 0);
}

// A request waiting for a peer to write its prompt's KV leaves nothing to compute: the engine
// thread sleeps until the KV comes (no empty steps recorded, no core spent spinning), then decodes.
TEST(EngineLoopTest, WaitingForRemoteKvMakesNoStepsAndSpendsNoCpu) {
  auto loop = StartLoop();
  uint64_t before = 0;
  loop->StepsAfter(0, &before);
  Stream stream;
  absl::Notification planned;
  loop->SubmitRemotePrefillAsync(5, Greedy(loop->EncodePrompt("hello there"), 3), stream.Callback(),
                                 [&](absl::StatusOr<RemotePrefillPlan> plan) {
                                   EXPECT_TRUE(plan.ok()) << plan.status();
                                   planned.Notify();
                                 });
  planned.WaitForNotification();
  EXPECT_EQ(loop->stats().remote_prefills, 1);
  timespec cpu_start;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_start);
  absl::SleepFor(absl::Milliseconds(300));
  timespec cpu_end;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_end);
  const double cpu_seconds = static_cast<double>(cpu_end.tv_sec - cpu_start.tv_sec) +
                             static_cast<double>(cpu_end.tv_nsec - cpu_start.tv_nsec) * 1e-9;
  uint64_t waited = 0;
  EXPECT_TRUE(loop->StepsAfter(before, &waited).empty());
  EXPECT_EQ(waited, before);
  // A spinning loop burns the whole 0.3 s; a sleeping process next to nothing.
  EXPECT_LT(cpu_seconds, 0.1);

  absl::Notification completed;
  loop->CompleteRemotePrefillAsync(5, {.id = 42, .logprob = {}, .top_logprobs = {}}, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    completed.Notify();
  });
  completed.WaitForNotification();
  const std::vector<int32_t> tokens = stream.Wait();
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_EQ(tokens[0], 42);  // the peer's first token, then two decoded here
  EngineLoopTestPeer::WaitForStepBoundary(*loop);
  uint64_t after = 0;
  EXPECT_EQ(loop->StepsAfter(before, &after).size(), 2u);
}

// StepElapsed tells a load sample how far the step in progress has got: above zero while the
// engine computes a prompt, zero between steps.
TEST(EngineLoopTest, StepElapsedRunsDuringAStepOnly) {
  FakeClock clock;
  auto loop = StartLoop(/*max_requests=*/64, &clock);
  EXPECT_EQ(loop->StepElapsed(), absl::ZeroDuration());
  // The delta callback runs inside the step: time moves there, as it would in a long step.
  absl::Duration seen = absl::ZeroDuration();
  Stream stream;
  ASSERT_TRUE(loop->Submit(9, Greedy(loop->EncodePrompt("a step of some length"), 1),
                           [&](const GenerationDelta& d) {
                             clock.Advance(absl::Seconds(3));
                             seen = loop->StepElapsed();
                             stream.Callback()(d);
                           })
                  .ok());
  stream.Wait();
  EXPECT_EQ(seen, absl::Seconds(3));
  EngineLoopTestPeer::WaitForStepBoundary(*loop);
  EXPECT_EQ(loop->StepElapsed(), absl::ZeroDuration());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(loop->StepElapsed(), absl::ZeroDuration());
}

// A request posted while the engine thread is busy counts in stats() at once: a router reading
// the worker's load in the middle of a long step must see it.
TEST(EngineLoopTest, StatsCountSubmissionsTheEngineHasNotTakenYet) {
  auto loop = StartLoop();
  absl::Notification busy, release;
  EngineLoopTestPeer::Post(*loop, [&](LocalEngine*) {  // holds the engine thread like a long step
    busy.Notify();
    release.WaitForNotification();
  });
  busy.WaitForNotification();
  const SchedulerStats before = loop->stats();
  Stream stream;
  absl::Notification added;
  GenerationRequest request = Greedy({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2);
  request.priority = 3;
  loop->SubmitAsync(7, std::move(request), stream.Callback(), [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    added.Notify();
  });
  const SchedulerStats posted = loop->stats();
  EXPECT_EQ(posted.waiting, before.waiting + 1);
  EXPECT_EQ(posted.queued_prefill_tokens, before.queued_prefill_tokens + 10);
  EXPECT_EQ(posted.prompt_tokens, before.prompt_tokens + 10);
  // In its class, which the router reads to tell what a request of each priority waits for.
  ASSERT_FALSE(posted.queued_by_priority.empty());
  EXPECT_EQ(posted.queued_by_priority.front().priority, 3);
  EXPECT_EQ(posted.queued_by_priority.front().tokens, 10);
  EXPECT_EQ(posted.queued_by_priority.front().prompts, 1);
  release.Notify();
  added.WaitForNotification();
  EXPECT_EQ(stream.Wait().size(), 2u);
  // Taken and finished: nothing of it is left in the counters (published after the step that
  // finished it, before the engine thread runs the next task).
  EngineLoopTestPeer::WaitForStepBoundary(*loop);
  const SchedulerStats after = loop->stats();
  EXPECT_EQ(after.waiting + after.running, 0);
  EXPECT_EQ(after.queued_prefill_tokens, 0);
  EXPECT_TRUE(after.queued_by_priority.empty());
  EXPECT_EQ(after.prompt_tokens, before.prompt_tokens + 10);  // counted once
}

// A subscriber that takes a snapshot and then follows the events holds what a later snapshot
// holds.
TEST(EngineLoopTest, SnapshotPlusEventsEqualsTheNextSnapshot) {
  auto loop = StartLoop();
  const EngineLoop::State first = loop->Snapshot();
  std::set<BlockHash> view(first.cache.hashes.begin(), first.cache.hashes.end());
  uint64_t last = first.cache.last_event_id;
  for (int i = 0; i < 3; ++i) {
    Stream s;
    std::vector<int32_t> prompt = loop->EncodePrompt(
        absl::StrCat("Request ", i, ": the quick brown fox jumps over the lazy dog again and again"));
    ASSERT_TRUE(loop->Submit(10 + i, Greedy(prompt, 20), s.Callback()).ok());
    s.Wait();
  }
  while (true) {
    auto events = loop->EventsAfter(last, absl::Milliseconds(50));
    ASSERT_TRUE(events.ok()) << events.status();
    if (events->empty()) break;
    for (const KvEvent& e : *events) {
      ASSERT_EQ(e.event_id, last + 1);
      last = e.event_id;
      if (e.kind == KvEvent::Kind::kStored) view.insert(e.hashes.begin(), e.hashes.end());
      if (e.kind == KvEvent::Kind::kRemoved) {
        for (BlockHash h : e.hashes) view.erase(h);
      }
      if (e.kind == KvEvent::Kind::kCleared) view.clear();
    }
  }
  const EngineLoop::State second = loop->Snapshot();
  EXPECT_EQ(second.cache.last_event_id, last);
  EXPECT_EQ(std::vector<BlockHash>(view.begin(), view.end()), second.cache.hashes);
  EXPECT_FALSE(second.cache.hashes.empty());
}

}  // namespace
}  // namespace tandem
