// LocalEngine under continuous batching, on the default model: requests that join at any step,
// chunked prompts beside running streams, prefix reuse, preemption and cancellation all give each
// request exactly the greedy output it gets alone on an engine without any of that.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/version.h"
#include "engine/runtime/local_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string ModelPath() {
  return absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

struct EngineConfig {
  int64_t kv_blocks = 256;
  int64_t max_running = 8;
  int64_t budget = 512;
  bool caching = true;
};

std::unique_ptr<LocalEngine> OpenEngine(const EngineConfig& c) {
  LocalEngine::Options options;
  options.cpu.num_threads = 2;
  options.kv_blocks = c.kv_blocks;
  options.scheduler.max_running = c.max_running;
  options.scheduler.max_tokens_per_step = c.budget;
  options.enable_prefix_caching = c.caching;
  auto e = LocalEngine::Open(ModelPath(), options);
  CHECK(e.ok()) << e.status();
  return *std::move(e);
}

// The reference: one request at a time, whole prompts, no prefix cache, a pool that never runs
// out.
LocalEngine& Reference() {
  static LocalEngine* engine = OpenEngine({.kv_blocks = 128, .max_running = 1, .budget = 4096,
                                           .caching = false}).release();
  return *engine;
}

GenerationRequest Greedy(const std::vector<int32_t>& prompt, int64_t max_tokens, int priority = 0) {
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;  // every request runs its full length
  r.sampling.max_tokens = max_tokens;
  r.priority = priority;
  return r;
}

std::vector<int32_t> Tokens(const std::string& text) { return Reference().EncodePrompt(text); }

std::vector<int32_t> AloneTokens(const GenerationRequest& r) {
  std::vector<int32_t> tokens;
  CHECK_OK(Reference().Generate({r}, [&](const GenerationDelta& d) { tokens.push_back(d.token); }));
  return tokens;
}

const char* const kTexts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "1, 2, 3, 4, 5,",
    "The three laws of thermodynamics are",
    "Here is a recipe for pancakes. Ingredients:",
    "A haiku about the sea:",
    "SELECT name, COUNT(*) FROM users GROUP BY",
};

// A long prompt (about 290 tokens) that needs several chunks under a small budget.
std::vector<int32_t> LongPrompt() {
  std::string text;
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&text, "Paragraph ", i, ": the quick brown fox jumps over the lazy dog. ");
  }
  return Tokens(text);
}

struct Collected {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, sampling::FinishReason> finish;
  std::vector<uint64_t> finish_order;
  LocalEngine::DeltaCallback Callback() {
    return [this](const GenerationDelta& d) {
      EXPECT_FALSE(finish.contains(d.index)) << "a delta after the last one of " << d.index;
      tokens[d.index].push_back(d.token);
      if (d.finish != sampling::FinishReason::kNone) {
        finish[d.index] = d.finish;
        finish_order.push_back(d.index);
      }
    };
  }
};

TEST(ContinuousBatchingTest, RequestsJoiningAtAnyStepMatchEachAlone) {
  auto engine = OpenEngine({.kv_blocks = 256, .max_running = 4, .budget = 64});
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < std::size(kTexts); ++i) {
    requests.push_back(Greedy(Tokens(kTexts[i]), 12 + 3 * static_cast<int64_t>(i)));
  }
  requests.push_back(Greedy(LongPrompt(), 10));
  // Request i arrives before step arrival[i].
  const std::vector<int> arrival = {0, 0, 0, 2, 3, 5, 8, 13, 4};
  Collected got;
  int step = 0;
  bool mixed_step = false;
  size_t added = 0;
  while (added < requests.size() || engine->HasWork()) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (arrival[i] == step) {
        ASSERT_TRUE(engine->Add(i, requests[i], got.Callback()).ok());
        ++added;
      }
    }
    StepInfo info;
    ASSERT_TRUE(engine->Step(&info).ok());
    EXPECT_LE(info.prefill_tokens + info.decode_tokens, 64);
    EXPECT_LE(info.batch_size, 4);
    if (info.prefill_tokens > 0 && info.decode_tokens > 0) mixed_step = true;
    ++step;
    ASSERT_LT(step, 1000);
  }
  EXPECT_TRUE(mixed_step) << "no step mixed a prompt chunk with decode tokens";
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got.tokens[i], AloneTokens(requests[i])) << "request " << i;
    EXPECT_EQ(got.finish[i], sampling::FinishReason::kLength);
  }
  const SchedulerStats stats = engine->scheduler_stats();
  EXPECT_EQ(stats.running + stats.waiting, 0);
  EXPECT_EQ(stats.used_blocks, 0);
}

// A long prompt is chunked and never stalls a running stream: while it is prefilled, every step
// still decodes the running request.
TEST(ContinuousBatchingTest, LongPromptDoesNotStallRunningStreams) {
  auto engine = OpenEngine({.kv_blocks = 256, .max_running = 4, .budget = 48});
  Collected got;
  ASSERT_TRUE(engine->Add(0, Greedy(Tokens(kTexts[0]), 40), got.Callback()).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(engine->Step().ok());
  ASSERT_TRUE(engine->Add(1, Greedy(LongPrompt(), 4), got.Callback()).ok());
  int prefill_steps = 0;
  while (!got.tokens.contains(1)) {
    StepInfo info;
    ASSERT_TRUE(engine->Step(&info).ok());
    EXPECT_EQ(info.decode_tokens, 1) << "the running request skipped a step";
    EXPECT_LE(info.prefill_tokens, 47);
    ++prefill_steps;
  }
  EXPECT_GE(prefill_steps, static_cast<int>(LongPrompt().size() / 47));
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(got.tokens[0], AloneTokens(Greedy(Tokens(kTexts[0]), 40)));
  EXPECT_EQ(got.tokens[1], AloneTokens(Greedy(LongPrompt(), 4)));
}

// The first delta says how long the prompt was computed: from the start of the step that took
// its first chunk to its first token, every chunk's step in it, the wait before not.
TEST(ContinuousBatchingTest, FirstDeltaTimesThePromptsStepsButNotItsWait) {
  using Clock = std::chrono::steady_clock;
  auto engine = OpenEngine({.kv_blocks = 256, .max_running = 4, .budget = 48});
  std::map<uint64_t, std::vector<double>> prompt_seconds;
  std::map<uint64_t, Clock::time_point> first_token_at;
  auto callback = [&](const GenerationDelta& d) {
    if (!first_token_at.contains(d.index)) first_token_at[d.index] = Clock::now();
    prompt_seconds[d.index].push_back(d.prompt_seconds);
  };
  ASSERT_TRUE(engine->Add(0, Greedy(LongPrompt(), 3), callback).ok());
  absl::SleepFor(absl::Milliseconds(100));  // waiting: not the prompt's time
  const Clock::time_point before_first_step = Clock::now();
  ASSERT_TRUE(engine->Step().ok());
  const Clock::time_point after_first_step = Clock::now();
  // A short prompt that joins while the long one is in progress starts with a later step.
  ASSERT_TRUE(engine->Add(1, Greedy(Tokens(kTexts[0]), 3), callback).ok());
  const Clock::time_point before_second = Clock::now();
  int steps = 1;
  while (engine->HasWork()) {
    ASSERT_TRUE(engine->Step().ok());
    ++steps;
  }
  ASSERT_GE(steps, static_cast<int>(LongPrompt().size() / 48));
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const double long_seconds = prompt_seconds[0].front();
  EXPECT_LE(long_seconds, seconds(first_token_at[0] - before_first_step));
  EXPECT_GE(long_seconds, seconds(first_token_at[0] - after_first_step));
  const double short_seconds = prompt_seconds[1].front();
  EXPECT_GT(short_seconds, 0);
  EXPECT_LE(short_seconds, seconds(first_token_at[1] - before_second));
  for (const auto& [id, all] : prompt_seconds) {
    ASSERT_EQ(all.size(), 3u) << id;
    EXPECT_EQ(all[1], 0) << id;
    EXPECT_EQ(all[2], 0) << id;
  }
}

// A second request with the same 200-token prefix computes only what the cache lacks (the prefix's
// partial last block and its own tokens) and generates what it would without the cache.
TEST(ContinuousBatchingTest, SharedPrefixIsComputedOnce) {
  std::vector<int32_t> prefix = LongPrompt();
  ASSERT_GE(prefix.size(), 200u);
  prefix.resize(200);
  std::vector<int32_t> a = prefix, b = prefix;
  for (int32_t t : Tokens(" Question: what did the fox do?")) a.push_back(t);
  for (int32_t t : Tokens(" Summarize the paragraphs above in five words.")) b.push_back(t);

  auto engine = OpenEngine({.kv_blocks = 256, .max_running = 4, .budget = 512});
  auto run = [&](const GenerationRequest& r, int64_t* prompt_tokens_computed) {
    std::vector<int32_t> tokens;
    ASSERT_TRUE(engine->Add(7, r, [&](const GenerationDelta& d) { tokens.push_back(d.token); }).ok());
    *prompt_tokens_computed = 0;
    while (engine->HasWork()) {
      StepInfo info;
      ASSERT_TRUE(engine->Step(&info).ok());
      *prompt_tokens_computed += info.prefill_tokens;
    }
    EXPECT_EQ(tokens, AloneTokens(r));
  };
  int64_t computed_a = 0, computed_b = 0;
  run(Greedy(a, 16), &computed_a);
  EXPECT_EQ(computed_a, static_cast<int64_t>(a.size()));
  const SchedulerStats before = engine->scheduler_stats();
  run(Greedy(b, 16), &computed_b);
  const SchedulerStats after = engine->scheduler_stats();
  const int64_t reused = 200 / 16 * 16;  // full blocks of the shared prefix
  EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, reused);
  EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()) - reused);
  EXPECT_GT(after.prefix_hit_rate(), 0.4);

  // The same prompt again reuses all but its last block, and still generates the same tokens.
  int64_t computed_again = 0;
  run(Greedy(b, 16), &computed_again);
  EXPECT_LE(computed_again, 16);
  EXPECT_GE(computed_again, 1);
}

// Far fewer KV blocks than the requests need at once: sequences are preempted and recomputed,
// and every request still completes with its own greedy output.
TEST(ContinuousBatchingTest, PreemptionUnderATinyPoolKeepsEveryOutput) {
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    auto engine = OpenEngine({.kv_blocks = 10, .max_running = 8, .budget = 128, .caching = caching});
    std::vector<GenerationRequest> requests;
    for (size_t i = 0; i < 5; ++i) requests.push_back(Greedy(Tokens(kTexts[i]), 28));
    Collected got;
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(engine->Add(i, requests[i], got.Callback()).ok());
    }
    int steps = 0;
    while (engine->HasWork()) {
      ASSERT_TRUE(engine->Step().ok());
      ASSERT_LT(++steps, 5000);
    }
    EXPECT_GT(engine->scheduler_stats().preemptions, 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got.tokens[i], AloneTokens(requests[i])) << "request " << i;
    }
  }
}

TEST(ContinuousBatchingTest, CancelFreesBlocksAtOnce) {
  auto engine = OpenEngine({.kv_blocks = 64, .max_running = 4, .budget = 512, .caching = false});
  Collected got;
  ASSERT_TRUE(engine->Add(1, Greedy(LongPrompt(), 30), got.Callback()).ok());
  ASSERT_TRUE(engine->Add(2, Greedy(Tokens(kTexts[3]), 20), got.Callback()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->Step().ok());
  const int64_t used = engine->scheduler_stats().used_blocks;
  const size_t seen = got.tokens[1].size();
  EXPECT_TRUE(engine->Cancel(1));
  EXPECT_FALSE(engine->Cancel(1));
  EXPECT_FALSE(engine->Cancel(99));
  EXPECT_LE(engine->scheduler_stats().used_blocks,
            used - static_cast<int64_t>(LongPrompt().size()) / 16);
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(got.tokens[1].size(), seen) << "deltas after cancellation";
  EXPECT_EQ(got.tokens[2], AloneTokens(Greedy(Tokens(kTexts[3]), 20)));
  EXPECT_EQ(engine->scheduler_stats().used_blocks, 0);
}

TEST(ContinuousBatchingTest, HigherPriorityRunsFirst) {
  auto engine = OpenEngine({.kv_blocks = 64, .max_running = 1, .budget = 512});
  Collected got;
  ASSERT_TRUE(engine->Add(1, Greedy(Tokens(kTexts[0]), 5, /*priority=*/0), got.Callback()).ok());
  ASSERT_TRUE(engine->Add(2, Greedy(Tokens(kTexts[1]), 5, /*priority=*/0), got.Callback()).ok());
  ASSERT_TRUE(engine->Add(3, Greedy(Tokens(kTexts[2]), 5, /*priority=*/5), got.Callback()).ok());
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_THAT(got.finish_order, ::testing::ElementsAre(3, 1, 2));
}

TEST(ContinuousBatchingTest, DuplicateIdIsRefused) {
  auto engine = OpenEngine({.kv_blocks = 64});
  ASSERT_TRUE(engine->Add(1, Greedy(Tokens(kTexts[0]), 2), [](const GenerationDelta&) {}).ok());
  EXPECT_EQ(engine->Add(1, Greedy(Tokens(kTexts[0]), 2), [](const GenerationDelta&) {}).code(),
            absl::StatusCode::kInvalidArgument);
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
}

// Disaggregated prefill between two engines in one process: the "prefill" engine computes the
// prompt and hands each layer's K/V to the "decode" engine's reserved blocks as soon as the layer
// is done (a memcpy standing in for the transfer); the decode engine continues from the first
// token. Both engines keep their own prefix caches.
class Disaggregated {
 public:
  Disaggregated()
      : prefill_(OpenEngine({.kv_blocks = 128, .max_running = 4, .budget = 64})),
        decode_(OpenEngine({.kv_blocks = 128, .max_running = 4, .budget = 64})) {}

  // Runs `r` prefilled remotely; returns every token the client sees.
  std::vector<int32_t> Run(uint64_t id, GenerationRequest r, int64_t* transferred_blocks) {
    std::vector<int32_t> out;
    auto plan = decode_->AddRemotePrefill(id, r, [&](const GenerationDelta& d) {
      out.push_back(d.token);
      // The first token's prompt was computed by the peer, not by a step here.
      EXPECT_EQ(d.prompt_seconds, 0) << "request " << id;
    });
    CHECK(plan.ok()) << plan.status();
    const int64_t bs = decode_->kv_pool().block_size();
    KvStorage& src = prefill_->kv_pool().storage();
    KvStorage& dst = decode_->kv_pool().storage();
    const size_t slice = static_cast<size_t>(src.layout().block_bytes());
    std::set<int64_t> sent;  // logical blocks that reached the decode pool
    bool first = true;
    GenerationRequest p = r;
    p.sampling.max_tokens = 1;
    p.on_kv_layer = [&](const KvLayerDone& done) {
      // Logical block k of the prompt lives in done.block_table[k] here and plan->blocks[k] there;
      // the decode side needs blocks from plan->cached_tokens on.
      auto copy = [&](int64_t k, int64_t first_layer, int64_t layers) {
        if ((k + 1) * bs <= plan->cached_tokens) return;  // the decode side has it cached
        for (int64_t l = first_layer; l < first_layer + layers; ++l) {
          std::memcpy(dst.KeyBlock<std::byte>(plan->blocks[static_cast<size_t>(k)], l),
                      src.KeyBlock<std::byte>(done.block_table[static_cast<size_t>(k)], l), slice);
        }
        sent.insert(k);
      };
      if (first && done.layer == 0) {
        // What the prefill engine's own cache held was not computed: send all of it now.
        for (int64_t k = 0; k < done.first_position / bs; ++k) copy(k, 0, src.layout().num_layers);
      }
      first = false;
      const int64_t end = done.first_position + done.num_tokens;
      for (int64_t k = done.first_position / bs; k * bs < end; ++k) copy(k, done.layer, 1);
    };
    int32_t first_token = -1;
    CHECK_OK(prefill_->Add(id, p, [&](const GenerationDelta& d) {
      first_token = d.token;
      EXPECT_GT(d.prompt_seconds, 0) << "request " << id;
    }));
    while (prefill_->HasWork()) CHECK_OK(prefill_->Step());
    CHECK_OK(decode_->CompleteRemotePrefill(id, {.id = first_token, .logprob = {}, .top_logprobs = {}}));
    while (decode_->HasWork()) CHECK_OK(decode_->Step());
    *transferred_blocks = static_cast<int64_t>(sent.size());
    return out;
  }

  LocalEngine& decode() { return *decode_; }

 private:
  std::unique_ptr<LocalEngine> prefill_;
  std::unique_ptr<LocalEngine> decode_;
};

TEST(DisaggregatedPrefillTest, DecodeContinuesFromThePeersKvExactly) {
  Disaggregated d;
  std::vector<int32_t> prefix = LongPrompt();
  prefix.resize(160);
  std::vector<int32_t> a = prefix, b = prefix;
  for (int32_t t : Tokens(" Question: what did the fox do?")) a.push_back(t);
  for (int32_t t : Tokens(" Summarize the paragraphs above in five words.")) b.push_back(t);
  int64_t sent_a = 0, sent_b = 0;
  EXPECT_EQ(d.Run(1, Greedy(a, 12), &sent_a), AloneTokens(Greedy(a, 12)));
  EXPECT_EQ(sent_a, (static_cast<int64_t>(a.size()) + 15) / 16);
  // The shared prefix is cached on both sides now: only the new blocks travel.
  EXPECT_EQ(d.Run(2, Greedy(b, 12), &sent_b), AloneTokens(Greedy(b, 12)));
  EXPECT_EQ(sent_b, (static_cast<int64_t>(b.size()) + 15) / 16 - 160 / 16);
  EXPECT_EQ(d.decode().scheduler_stats().used_blocks, 0);
}

TEST(DisaggregatedPrefillTest, FallBackToLocalPrefillGivesTheSameOutput) {
  auto engine = OpenEngine({.kv_blocks = 64, .max_running = 4, .budget = 64});
  const GenerationRequest r = Greedy(Tokens(kTexts[2]), 10);
  std::vector<int32_t> got;
  auto plan = engine->AddRemotePrefill(5, r, [&](const GenerationDelta& d) { got.push_back(d.token); });
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(engine->scheduler_stats().used_blocks, 0);
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_TRUE(got.empty()) << "a request waiting for its remote prefill ran";
  EXPECT_EQ(engine->CompleteRemotePrefill(6, {.id = 1, .logprob = {}, .top_logprobs = {}}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine->FallBackToLocalPrefill(5).ok());
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(got, AloneTokens(r));
}

TEST(DisaggregatedPrefillTest, ABadFirstTokenFromThePeerIsRefusedAndPrefilledHere) {
  auto engine = OpenEngine({.kv_blocks = 64, .max_running = 4, .budget = 64});
  const GenerationRequest r = Greedy(Tokens(kTexts[4]), 6);
  std::vector<int32_t> got;
  ASSERT_TRUE(engine->AddRemotePrefill(1, r, [&](const GenerationDelta& d) { got.push_back(d.token); }).ok());
  const absl::Status bad = engine->CompleteRemotePrefill(1, {.id = -3, .logprob = {}, .top_logprobs = {}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(got, AloneTokens(r));
}

}  // namespace
}  // namespace tandem
