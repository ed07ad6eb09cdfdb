#include "engine/runtime/local_engine.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using ::testing::HasSubstr;

LocalEngine& Engine() {
  static LocalEngine* engine = [] {
    LocalEngine::Options options;
    options.cpu.num_threads = 2;
    options.scheduler.max_running = 4;
    options.kv_blocks = 256;
    auto e = LocalEngine::Open(absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
                               options);
    CHECK(e.ok()) << e.status();
    return e->release();
  }();
  return *engine;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  sampling::FinishReason finish = sampling::FinishReason::kNone;
};

std::vector<Result> GenerateAll(const std::vector<GenerationRequest>& requests, absl::Status* status) {
  std::vector<Result> results(requests.size());
  *status = Engine().Generate(requests, [&](const GenerationDelta& d) {
    Result& r = results[d.index];
    EXPECT_EQ(r.finish, sampling::FinishReason::kNone) << "a delta after the last one";
    r.tokens.push_back(d.token);
    r.text += d.text;
    r.finish = d.finish;
  });
  return results;
}

GenerationRequest Greedy(const std::string& prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = Engine().EncodePrompt(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(LocalEngineTest, ChatAboutFranceSaysParis) {
  auto prompt =
      Engine().EncodeChat({{"user", "What is the capital of France? Answer in one sentence."}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  GenerationRequest r;
  r.prompt = *prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 32;
  absl::Status status;
  const auto results = GenerateAll({r}, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(results[0].text, HasSubstr("Paris"));
  ASSERT_EQ(results[0].finish, sampling::FinishReason::kStop);  // <|im_end|>, not the length
  // The streamed text is the detokenized output, minus the stop token.
  std::vector<int32_t> body = results[0].tokens;
  body.pop_back();
  EXPECT_EQ(results[0].text, Engine().tokenizer().Decode(body));
}

// Batching changes nothing: each request's greedy output is the one it gets alone.
TEST(LocalEngineTest, BatchedRequestsMatchEachAlone) {
  const std::vector<GenerationRequest> requests = {
      Greedy("The capital of France is", 20), Greedy("def fibonacci(n):", 28),
      Greedy("Once upon a time, in a small village,", 12),
      Greedy("1, 2, 3, 4, 5,", 24)};
  absl::Status status;
  const auto together = GenerateAll(requests, &status);
  ASSERT_TRUE(status.ok()) << status;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto alone = GenerateAll({requests[i]}, &status);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, alone[0].text) << "request " << i;
  }
}

TEST(LocalEngineTest, SameSeedSameTextAndStopStrings) {
  GenerationRequest r = Greedy("Write a short poem about the sea.", 40);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  absl::Status status;
  const auto a = GenerateAll({r, r}, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(a[0].tokens, a[1].tokens);
  r.sampling.seed = 99;
  const auto b = GenerateAll({r}, &status);
  EXPECT_NE(a[0].tokens, b[0].tokens);

  // A stop string cuts the text before it and ends the request.
  GenerationRequest counting = Greedy("1, 2, 3, 4, 5,", 40);
  counting.sampling.stop = {"9"};
  const auto c = GenerateAll({counting}, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(c[0].finish, sampling::FinishReason::kStopString);
  EXPECT_THAT(c[0].text, ::testing::Not(HasSubstr("9")));
  EXPECT_THAT(c[0].text, HasSubstr("8"));
}

// A request resumed with its earlier output as prior_output_tokens (after its worker failed)
// continues exactly: the same seeded random stream, penalties, max_tokens and stop strings, and
// the same text, cut anywhere -- also inside a held-back stop-string prefix.
TEST(LocalEngineTest, ResumedRequestContinuesTheSameSeededStreamAndText) {
  GenerationRequest r = Greedy("Write a short poem about the sea.", 32);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.sampling.repetition_penalty = 1.3f;
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.ignore_eos = true;
  absl::Status status;
  const Result whole = GenerateAll({r}, &status)[0];
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(whole.tokens.size(), 32u);
  for (int cut : {1, 7, 20, 31}) {
    SCOPED_TRACE(absl::StrCat("resumed after ", cut, " tokens"));
    const Result head = GenerateAll({[&] {
                                       GenerationRequest h = r;
                                       h.sampling.max_tokens = cut;
                                       return h;
                                     }()},
                                    &status)[0];
    ASSERT_TRUE(status.ok()) << status;
    GenerationRequest tail = r;
    tail.prompt.insert(tail.prompt.end(), whole.tokens.begin(), whole.tokens.begin() + cut);
    tail.prior_output_tokens = cut;
    const Result rest = GenerateAll({tail}, &status)[0];
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(rest.tokens,
              std::vector<int32_t>(whole.tokens.begin() + cut, whole.tokens.end()));
    EXPECT_EQ(rest.finish, whole.finish);
    // The cut head emitted all its text at its end (kLength); an uncut run holds nothing back
    // mid-stream here, so the two texts together are the whole text.
    EXPECT_EQ(head.text + rest.text, whole.text);
  }

  // A stop string whose first characters came before the cut still matches after it.
  GenerationRequest counting = Greedy("1, 2, 3, 4, 5,", 40);
  counting.sampling.stop = {" 8, 9"};
  const Result counted = GenerateAll({counting}, &status)[0];
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(counted.finish, sampling::FinishReason::kStopString);
  size_t cut = 0;  // just after the token that brought " 8"
  for (std::string text; cut < counted.tokens.size() && text.find(" 8") == std::string::npos;
       ++cut) {
    text += Engine().tokenizer().TokenBytes(counted.tokens[cut]);
  }
  GenerationRequest resumed = counting;
  resumed.prompt.insert(resumed.prompt.end(), counted.tokens.begin(), counted.tokens.begin() + cut);
  resumed.prior_output_tokens = static_cast<int64_t>(cut);
  const Result after = GenerateAll({resumed}, &status)[0];
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(after.finish, sampling::FinishReason::kStopString);
  EXPECT_EQ(after.tokens,
            std::vector<int32_t>(counted.tokens.begin() + cut, counted.tokens.end()));

  // Prior output that already reaches max_tokens, or is the whole prompt, is refused.
  GenerationRequest full = r;
  full.prompt.insert(full.prompt.end(), whole.tokens.begin(), whole.tokens.end());
  full.prior_output_tokens = 32;
  EXPECT_THAT(Engine().Generate({full}, [](const GenerationDelta&) {}).message(),
              HasSubstr("already reach max_tokens"));
  full.prior_output_tokens = static_cast<int64_t>(full.prompt.size());
  EXPECT_THAT(Engine().Generate({full}, [](const GenerationDelta&) {}).message(),
              HasSubstr("prior_output_tokens must be in"));
}

// response_format on the real model: the seeded, sampled output is a JSON object with the
// schema's fields that nlohmann::json parses, it ends with kStop when the grammar is complete,
// and a request resumed after any cut (its grammar state rebuilt from the prior tokens) continues
// with the same tokens. A schema that does not compile is INVALID_ARGUMENT naming the parameter.
TEST(LocalEngineTest, ResponseFormatConstrainsAndSurvivesAResume) {
  GenerationRequest r;
  absl::StatusOr<std::vector<int32_t>> chat = Engine().EncodeChat({{"user", "Describe a cat as JSON."}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  r.prompt = *chat;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  r.sampling.max_tokens = 120;
  r.sampling.response_format = {
      .kind = sampling::ResponseFormat::Kind::kJsonSchema,
      .text = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                  "legs": {"type": "integer"}, "indoor": {"type": "boolean"}},
                  "required": ["name", "legs", "indoor"]})"};
  absl::Status status;
  const Result whole = GenerateAll({r}, &status)[0];
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(whole.finish, sampling::FinishReason::kStop) << whole.text;
  const nlohmann::json j = nlohmann::json::parse(whole.text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << whole.text;
  EXPECT_TRUE(j["name"].is_string() && j["legs"].is_number_integer() && j["indoor"].is_boolean())
      << whole.text;
  EXPECT_EQ(j.size(), 3u) << whole.text;
  for (size_t cut : {size_t{1}, whole.tokens.size() / 2, whole.tokens.size() - 1}) {
    SCOPED_TRACE(absl::StrCat("resumed after ", cut, " tokens"));
    GenerationRequest tail = r;
    tail.prompt.insert(tail.prompt.end(), whole.tokens.begin(),
                       whole.tokens.begin() + static_cast<ptrdiff_t>(cut));
    tail.prior_output_tokens = static_cast<int64_t>(cut);
    const Result rest = GenerateAll({tail}, &status)[0];
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + static_cast<ptrdiff_t>(cut),
                                                whole.tokens.end()));
    EXPECT_EQ(rest.finish, sampling::FinishReason::kStop);
  }
  // Prior tokens the grammar refuses (plain text where JSON must start) are refused.
  GenerationRequest off = r;
  const std::vector<int32_t> prose = Engine().tokenizer().Encode("Hello");
  off.prompt.insert(off.prompt.end(), prose.begin(), prose.end());
  off.prior_output_tokens = static_cast<int64_t>(prose.size());
  EXPECT_THAT(Engine().Add(900, off, [](const GenerationDelta&) {}).message(),
              HasSubstr("response_format"));

  GenerationRequest bad = r;
  bad.sampling.response_format.text = R"({"type": "no-such-type"})";
  const absl::Status refused = Engine().Add(901, bad, [](const GenerationDelta&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("response_format json_schema"));
}

TEST(LocalEngineTest, BadRequestsAreRejectedBeforeAnythingRuns) {
  const int64_t context = Engine().config().max_context;
  struct Case {
    const char* what;
    GenerationRequest request;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"empty prompt", GenerationRequest{}, absl::StatusCode::kInvalidArgument, "empty"});
  GenerationRequest too_long;
  too_long.prompt.assign(static_cast<size_t>(context), 100);
  cases.push_back({"prompt fills the context", too_long, absl::StatusCode::kInvalidArgument,
                   "context"});
  GenerationRequest over = Greedy("hello", context);
  cases.push_back({"prompt + max_tokens over the context", over,
                   absl::StatusCode::kInvalidArgument, "max_tokens"});
  GenerationRequest bad_id = Greedy("hello", 4);
  bad_id.prompt.push_back(static_cast<int32_t>(Engine().config().vocab_size));
  cases.push_back({"token id out of range", bad_id, absl::StatusCode::kInvalidArgument,
                   "outside the vocabulary"});
  GenerationRequest negative_temp = Greedy("hello", 4);
  negative_temp.sampling.temperature = -1;
  cases.push_back({"negative temperature", negative_temp, absl::StatusCode::kInvalidArgument,
                   "temperature"});
  GenerationRequest bad_top_p = Greedy("hello", 4);
  bad_top_p.sampling.top_p = 1.5f;
  cases.push_back({"top_p over 1", bad_top_p, absl::StatusCode::kInvalidArgument, "top_p"});
  GenerationRequest zero_max = Greedy("hello", 0);
  cases.push_back({"max_tokens 0", zero_max, absl::StatusCode::kInvalidArgument, "max_tokens"});
  for (const Case& c : cases) {
    int deltas = 0;
    // A valid request first: nothing of it may run when its neighbour is invalid.
    const absl::Status status = Engine().Generate(
        {Greedy("fine", 4), c.request}, [&](const GenerationDelta&) { ++deltas; });
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(std::string(status.message()), HasSubstr("request 1")) << c.what;
    EXPECT_EQ(deltas, 0) << c.what;
  }
  // A request the whole KV pool could never hold is refused up front, naming the pool.
  std::vector<GenerationRequest> huge = {Greedy("hi", 2), Greedy("hi", context - 8)};
  const absl::Status refused = Engine().Generate(huge, [](const GenerationDelta&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("KV pool"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("request 1"));
  // The pool is whole again afterwards.
  absl::Status status;
  GenerateAll({Greedy("still serving", 3)}, &status);
  EXPECT_TRUE(status.ok()) << status;
}

// Delegates to a CpuBackend and counts the phases LocalEngine drives.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const BackendSupport& support() const override { return inner_->support(); }
  const ModelConfig& config() const override { return inner_->config(); }
  KvLayout KvLayoutFor(int64_t num_blocks) const override { return inner_->KvLayoutFor(num_blocks); }
  absl::Status Plan(const StepBatch& batch, const KvStorage& kv) override {
    ++plans;
    return inner_->Plan(batch, kv);
  }
  absl::Status Embed(const TensorDump& dump) override { return inner_->Embed(dump); }
  absl::Status RunLayer(int64_t layer, KvStorage* kv, const TensorDump& dump) override {
    ++layers;
    return inner_->RunLayer(layer, kv, dump);
  }
  absl::Status Finish(StepOutput* out, const TensorDump& dump) override {
    return inner_->Finish(out, dump);
  }
  int64_t plans = 0, layers = 0;

 private:
  std::unique_ptr<Backend> inner_;
};

TEST(LocalEngineTest, StepsRunOnTheBackendItWasGiven) {
  CountingBackend* counting = nullptr;
  LocalEngine::Options options;
  options.kv_blocks = 64;
  options.backend = [&](const LoadedModel& model) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create(&model, {.num_threads = 2}));
    auto b = std::make_unique<CountingBackend>(std::move(cpu));
    counting = b.get();
    return b;
  };
  auto engine = LocalEngine::Open(
      absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE(counting, nullptr);
  EXPECT_EQ(&(*engine)->backend(), counting);
  const GenerationRequest request = Greedy("The capital of France is", 4);
  std::vector<int32_t> tokens;
  ASSERT_TRUE((*engine)
                  ->Generate({request}, [&](const GenerationDelta& d) { tokens.push_back(d.token); })
                  .ok());
  EXPECT_EQ(counting->plans, 4);  // the prompt, then three decode steps
  EXPECT_EQ(counting->layers, 4 * counting->config().num_layers);
  absl::Status status;
  EXPECT_EQ(tokens, GenerateAll({request}, &status)[0].tokens);  // the default engine's
  EXPECT_TRUE(status.ok());
}

// Prompt log-probabilities are those the decode path gives the same tokens: a greedy answer
// appended to its prompt and scored (in chunks of 7, its prefix in the prefix cache) gets, at each
// answer token, the logprob and alternatives the token had when it was generated one by one.
TEST(LocalEngineTest, PromptLogprobsEqualTheDecodePathsForTheSameTokens) {
  LocalEngine::Options options;
  options.cpu.num_threads = 2;
  options.kv_blocks = 64;
  options.scheduler.max_prefill_chunk = 7;
  auto engine = LocalEngine::Open(
      absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  LocalEngine& e = **engine;
  constexpr int kTop = 4;
  GenerationRequest generate;
  generate.prompt = e.EncodePrompt(
      "The history of the Roman Empire spans more than a thousand years, from the founding of "
      "the city to");
  ASSERT_GT(generate.prompt.size(), 16u);  // a whole KV block, cached by this request
  generate.sampling.temperature = 0;
  generate.sampling.max_tokens = 12;
  generate.sampling.ignore_eos = true;
  generate.sampling.logprobs = kTop;
  std::vector<GenerationDelta> decoded;
  ASSERT_TRUE(e.Generate({generate}, [&](const GenerationDelta& d) { decoded.push_back(d); }).ok());
  ASSERT_EQ(decoded.size(), 12u);

  GenerationRequest score;
  score.prompt = generate.prompt;
  for (const GenerationDelta& d : decoded) score.prompt.push_back(d.token);
  score.sampling.temperature = 0;
  score.sampling.max_tokens = 1;
  score.prompt_logprobs = kTop;
  std::vector<GenerationDelta> scored;
  ASSERT_TRUE(e.Generate(absl::MakeConstSpan(&score, 1),
                         [&](const GenerationDelta& d) { scored.push_back(d); }).ok());
  ASSERT_EQ(scored.size(), 1u);
  EXPECT_EQ(scored[0].cached_prompt_tokens, 0);  // computed whole, though its prefix is cached
  const std::vector<sampling::SampledToken>& lp = scored[0].prompt_logprobs;
  ASSERT_EQ(lp.size(), score.prompt.size() - 1);
  for (size_t p = 0; p < lp.size(); ++p) {
    EXPECT_EQ(lp[p].id, score.prompt[p + 1]) << p;
    ASSERT_TRUE(lp[p].logprob.has_value());
    EXPECT_LE(*lp[p].logprob, 0.0f);
    ASSERT_EQ(lp[p].top_logprobs.size(), static_cast<size_t>(kTop)) << p;
    EXPECT_GE(lp[p].top_logprobs[0].logprob, *lp[p].logprob) << p;
  }
  const size_t first = generate.prompt.size() - 1;  // the entry of the first answer token
  for (size_t i = 0; i < decoded.size(); ++i) {
    const sampling::SampledToken& s = lp[first + i];
    const GenerationDelta& d = decoded[i];
    // Prefill runs the matrix products over many rows at once, decode over one: the sums differ
    // in order and rounding only.
    EXPECT_NEAR(*s.logprob, *d.logprob, 2e-2) << "answer token " << i;
    ASSERT_EQ(s.top_logprobs.size(), d.top_logprobs.size());
    EXPECT_EQ(s.top_logprobs[0].id, d.top_logprobs[0].id) << "answer token " << i;  // greedy
    for (size_t k = 0; k < d.top_logprobs.size(); ++k) {
      EXPECT_NEAR(s.top_logprobs[k].logprob, d.top_logprobs[k].logprob, 2e-2) << i << " " << k;
    }
  }
  // Without prompt_logprobs nothing is scored.
  std::vector<GenerationDelta> plain;
  GenerationRequest unscored = score;
  unscored.prompt_logprobs = 0;
  ASSERT_TRUE(e.Generate({unscored}, [&](const GenerationDelta& d) { plain.push_back(d); }).ok());
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_TRUE(plain[0].prompt_logprobs.empty());
  EXPECT_GT(plain[0].cached_prompt_tokens, 0);  // and the prefix cache serves it
  EXPECT_EQ(plain[0].token, scored[0].token);
}

TEST(LocalEngineTest, PromptLogprobsOutOfRangeOrOnAResumedRequestAreRefused) {
  GenerationRequest r = Greedy("The capital of France is", 4);
  r.prompt_logprobs = 21;
  const absl::Status too_many = Engine().Add(900, r, [](const GenerationDelta&) {});
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.message(), HasSubstr("prompt_logprobs must be in [0, 20]"));
  r.prompt_logprobs = 2;
  r.prior_output_tokens = 1;
  const absl::Status resumed = Engine().Add(900, r, [](const GenerationDelta&) {});
  EXPECT_EQ(resumed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resumed.message()), HasSubstr("prior output tokens"));
  EXPECT_FALSE(Engine().HasWork());
}

}  // namespace
}  // namespace tandem
