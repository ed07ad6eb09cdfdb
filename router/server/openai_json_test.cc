#include "router/server/openai_json.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_conversion.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

// A body that must be refused, the field its error names (param), and a word of its message.
struct Bad {
  const char* body;
  bool chat;
  const char* param;
  const char* says;
};

TEST(OpenAiJsonTest, InvalidBodiesAreRefusedNamingTheField) {
  const std::vector<Bad> cases = {
      {"not json", false, "body", "not valid JSON"},
      {"[1, 2]", false, "body", "JSON object"},
      {"{}", false, "prompt", "'prompt' is required"},
      {R"({"prompt": null})", false, "prompt", "'prompt' is required"},
      {R"({"prompt": {"text": "hi"}})", false, "prompt", "'prompt' must be"},
      {R"({"prompt": ["a", []]})", false, "prompt[1]", "non-empty array of token ids"},
      {R"({"prompt": [[1], [2, -3]]})", false, "prompt[1]", "out of range"},
      {R"({"prompt": ["a", [1, "b"]]})", false, "prompt[1]", "must be a string or"},
      {R"({"prompt": ["a", "b"], "best_of": 200})", false, "best_of", "must be in"},
      {R"({"prompt": [1, "b"]})", false, "prompt", "'prompt' must be"},
      {R"({"prompt": [-1]})", false, "prompt", "out of range"},
      {R"({"prompt": "hi", "model": 7})", false, "model", "'model'"},
      {R"({"prompt": "hi", "max_tokens": 0})", false, "max_tokens", "must be in [1, "},
      {R"({"prompt": "hi", "max_tokens": 1.5})", false, "max_tokens", "must be an integer"},
      {R"({"prompt": "hi", "max_tokens": "8"})", false, "max_tokens", "must be an integer"},
      {R"({"prompt": "hi", "max_tokens": 4294967296})", false, "max_tokens", "must be in"},
      {R"({"prompt": "hi", "temperature": "hot"})", false, "temperature", "must be a number"},
      {R"({"prompt": "hi", "temperature": 2.5})", false, "temperature", "[0, 2]"},
      {R"({"prompt": "hi", "top_p": 0})", false, "top_p", "(0, 1]"},
      {R"({"prompt": "hi", "top_k": 2.5})", false, "top_k", "must be an integer"},
      {R"({"prompt": "hi", "top_k": -2})", false, "top_k", "[-1, "},
      {R"({"prompt": "hi", "presence_penalty": 3})", false, "presence_penalty", "[-2, 2]"},
      {R"({"prompt": "hi", "seed": "s"})", false, "seed", "'seed'"},
      {R"({"prompt": "hi", "n": 0})", false, "n", "[1, 128]"},
      {R"({"prompt": "hi", "n": 2, "best_of": 1})", false, "best_of", "at least n"},
      {R"({"prompt": "hi", "best_of": 21})", false, "best_of", "[1, 20]"},
      {R"({"prompt": "hi", "best_of": 2, "stream": true})", false, "best_of", "streamed"},
      {R"({"prompt": "hi", "logprobs": 21})", false, "logprobs", "[0, 20]"},
      {R"({"prompt": "hi", "logprobs": true})", false, "logprobs", "must be an integer"},
      {R"({"prompt": "hi", "echo": "yes"})", false, "echo", "must be a boolean"},
      {R"({"prompt": "hi", "echo": true, "max_tokens": -1})", false, "max_tokens", "[0, "},
      {R"({"prompt": "hi", "echo": true, "max_tokens": 0, "min_tokens": 1})", false,
       "min_tokens", "must not exceed max_tokens (0)"},
      {R"({"prompt": "hi", "suffix": "end"})", false, "suffix", "not supported"},
      {R"({"prompt": "hi", "logit_bias": {"1": 5}})", false, "logit_bias", "not supported"},
      {R"({"prompt": "hi", "response_format": {"type": "yaml"}})", false, "response_format.type",
       "must be 'text', 'json_object' or 'json_schema'"},
      {R"({"prompt": "hi", "frobnicate": 1})", false, "frobnicate", "not a parameter"},
      {R"({"prompt": "hi", "stop": 3})", false, "stop", "'stop'"},
      {R"({"prompt": "hi", "stop": ["a", 1]})", false, "stop", "'stop'"},
      {R"({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", false, "stop", "at most 4"},
      {R"({"prompt": "hi", "stop": ""})", false, "stop", "empty"},
      {R"({"prompt": "hi", "stream": "yes"})", false, "stream", "must be a boolean"},
      {R"({"prompt": "hi", "stream_options": {"include_usage": true}})", false,
       "stream_options", "only allowed with 'stream'"},
      {R"({"prompt": "hi", "stream": true, "stream_options": {"x": 1}})", false,
       "stream_options.x", "not supported"},
      {R"({"prompt": "hi", "ignore_eos": "yes"})", false, "ignore_eos", "boolean"},
      {R"({"prompt": "hi", "min_tokens": 20})", false, "min_tokens", "must not exceed"},
      {R"({"prompt": "hi", "slo": 5})", false, "slo", "'slo' must be an object"},
      {R"({"prompt": "hi", "slo": {"ttft_ms": -1}})", false, "slo.ttft_ms", "'slo.ttft_ms'"},
      {R"({"prompt": "hi", "slo": {"tpot_ms": 1e9}})", false, "slo.tpot_ms", "'slo.tpot_ms'"},
      {R"({"prompt": "hi", "slo": {"e2e_ms": 5}})", false, "slo.e2e_ms", "not a field"},
      {R"({})", true, "messages", "'messages' must be a non-empty array"},
      {R"({"messages": []})", true, "messages", "'messages' must be a non-empty array"},
      {R"({"messages": ["hi"]})", true, "messages[0]", "must be an object"},
      {R"({"messages": [{"content": "hi"}]})", true, "messages[0].role", "must be a string"},
      {R"({"messages": [{"role": "robot", "content": "hi"}]})", true, "messages[0].role",
       "'robot'"},
      {R"({"messages": [{"role": "tool", "content": "hi"}]})", true,
       "messages[0].tool_call_id", "is required"},
      {R"({"messages": [{"role": "function", "content": "hi"}]})", true, "messages[0].role",
       "legacy"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
           "function": {"name": "f"}}]}]})", true,
       "messages[0].tool_calls[0].function.arguments", "is required"},
      {R"({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "c"}]}]})", true,
       "messages[0].tool_calls", "assistant"},
      {R"({"messages": [{"role": "user", "content": 5}]})", true, "messages[0].content",
       "'messages[0].content'"},
      {R"({"messages": [{"role": "user"}]})", true, "messages[0].content", "is required"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null}]})",
       true, "messages[1].content", "is required for a assistant"},
      {R"({"messages": [{"role": "user", "content": "hi", "name": "bob"}]})", true,
       "messages[0].name", "not supported"},
      {R"({"messages": [{"role": "user", "content": "hi", "mood": 1}]})", true,
       "messages[0].mood", "not a field"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true,
       "messages[0].content[0].type", "only text content parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", true,
       "messages[0].content[0].text", "must be a string"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", true,
       "max_completion_tokens", "'max_completion_tokens'"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
           "max_completion_tokens": 9})", true, "max_tokens", "differs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 5})", true, "logprobs",
       "must be a boolean"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", true,
       "top_logprobs", "needs 'logprobs': true"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
           "top_logprobs": 21})", true, "top_logprobs", "[0, 20]"},
      {R"({"messages": [{"role": "user", "content": "hi"}],
           "response_format": {"type": "json_object", "schema": {}}})", true,
       "response_format.schema", "is not a field of a 'json_object' response_format"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "response_format":
           {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "format": 1}}})",
       true, "response_format.json_schema.format", "is not a field of a json_schema"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})",
       true, "tools[0].function", "must be an object"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": {"type": "function"}})",
       true, "tools", "must be an array"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
           "function": {"name": "f", "parameters": "x"}}]})",
       true, "tools[0].function.parameters", "must be a JSON Schema object"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "always"})", true,
       "tool_choice", "must be"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]})",
       true, "functions", "legacy"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "store": true})", true, "store",
       "not supported"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "modalities": ["audio"]})", true,
       "modalities", "not supported"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "best_of": 2})", true, "best_of",
       "not a parameter of /v1/chat/completions"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "user": 5})", true, "user",
       "must be a string"},
  };
  for (const Bad& c : cases) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(c.body, c.chat);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.says)) << c.body;
    EXPECT_EQ(ParamOf(r.status()), c.param) << c.body;
    const nlohmann::json error = nlohmann::json::parse(OpenAiErrorBody(r.status()))["error"];
    EXPECT_EQ(error["param"], c.param) << c.body;
    EXPECT_EQ(error["type"], "invalid_request_error") << c.body;
  }
}

TEST(OpenAiJsonTest, NoOpValuesOfUnsupportedFieldsAreAccepted) {
  for (const char* body : {
           R"({"prompt": "hi", "user": "u1", "n": 1, "echo": false, "suffix": null,
               "logit_bias": {}, "presence_penalty": 0, "best_of": 1, "stream": false})",
           R"({"prompt": [[1, 2]], "top_k": -1, "stop_token_ids": [3]})",
       }) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, /*chat=*/false);
    EXPECT_TRUE(r.ok()) << body << ": " << r.status();
  }
  absl::StatusOr<OpenAiRequest> chat = ParseOpenAiRequest(
      R"({"messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": "hi", "tool_calls": []}],
          "user": "u", "store": false, "metadata": {}, "service_tier": "auto",
          "modalities": ["text"], "response_format": {"type": "text"}, "tools": [],
          "tool_choice": "none", "logit_bias": null, "logprobs": false})",
      /*chat=*/true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->request.chat().messages(0).role(), "system");  // developer is system
  EXPECT_FALSE(chat->logprobs.has_value());
  EXPECT_FALSE(chat->request.sampling().has_max_tokens());
}

TEST(OpenAiJsonTest, LogprobsNAndBestOf) {
  absl::StatusOr<OpenAiRequest> none = ParseOpenAiRequest(R"({"prompt": "x"})", false);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->logprobs.has_value());
  EXPECT_EQ(none->request.sampling().logprobs(), 0u);
  EXPECT_EQ(none->n, 1);
  EXPECT_EQ(none->best_of, 1);

  // logprobs 0: the sampled token's only, which the engine gives beside one alternative.
  absl::StatusOr<OpenAiRequest> zero = ParseOpenAiRequest(R"({"prompt": "x", "logprobs": 0})", false);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->logprobs, 0);
  EXPECT_EQ(zero->request.sampling().logprobs(), 1u);

  absl::StatusOr<OpenAiRequest> five =
      ParseOpenAiRequest(R"({"prompt": "x", "logprobs": 5, "n": 2, "best_of": 3})", false);
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(five->logprobs, 5);
  EXPECT_EQ(five->request.sampling().logprobs(), 5u);
  EXPECT_EQ(five->n, 2);
  EXPECT_EQ(five->best_of, 3);

  // best_of > n ranks candidates by log-probability: asked of the engine even when the client
  // did not ask for them.
  absl::StatusOr<OpenAiRequest> ranked =
      ParseOpenAiRequest(R"({"prompt": "x", "best_of": 3})", false);
  ASSERT_TRUE(ranked.ok());
  EXPECT_FALSE(ranked->logprobs.has_value());
  EXPECT_EQ(ranked->request.sampling().logprobs(), 1u);

  absl::StatusOr<OpenAiRequest> chat = ParseOpenAiRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 3,
          "n": 4})",
      true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->logprobs, 3);
  EXPECT_EQ(chat->request.sampling().logprobs(), 3u);
  EXPECT_EQ(chat->n, 4);
  EXPECT_EQ(chat->best_of, 4);
}

// echo scores the prompt when logprobs are asked for; max_tokens 0 (echo only) asks the engine
// for its least, one token, which the reply drops.
TEST(OpenAiJsonTest, EchoAndMaxTokensZero) {
  absl::StatusOr<OpenAiRequest> plain =
      ParseOpenAiRequest(R"({"prompt": "x", "echo": true})", false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->echo);
  EXPECT_FALSE(plain->max_tokens_zero);
  EXPECT_EQ(plain->request.sampling().prompt_logprobs(), 0u);
  EXPECT_EQ(plain->request.sampling().max_tokens(), 16u);

  absl::StatusOr<OpenAiRequest> scored = ParseOpenAiRequest(
      R"({"prompt": "x", "echo": true, "logprobs": 5, "max_tokens": 0})", false);
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_TRUE(scored->max_tokens_zero);
  EXPECT_EQ(scored->request.sampling().max_tokens(), 1u);
  EXPECT_EQ(scored->request.sampling().prompt_logprobs(), 5u);
  EXPECT_EQ(scored->request.sampling().logprobs(), 5u);

  absl::StatusOr<OpenAiRequest> zero =
      ParseOpenAiRequest(R"({"prompt": "x", "echo": true, "logprobs": 0})", false);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->request.sampling().prompt_logprobs(), 1u);  // the engine's least, as logprobs

  absl::StatusOr<OpenAiRequest> off =
      ParseOpenAiRequest(R"({"prompt": "x", "echo": false, "logprobs": 2})", false);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->echo);
  EXPECT_EQ(off->request.sampling().prompt_logprobs(), 0u);
}

TEST(OpenAiJsonTest, LogprobsHaveOpenAisShapes) {
  const std::vector<TokenWithLogprobs> tokens = {
      {.token = " Par", .logprob = -0.5f, .top = {{" Par", -0.5f}, {" Lyon", -1.5f}}},
      {.token = "\xC3\xA9", .logprob = -0.25f, .top = {{"\xC3\xA9", -0.25f}, {"is", -2.0f}}},
  };
  const nlohmann::json completion = CompletionLogprobs(tokens, 2, /*offset=*/10);
  EXPECT_EQ(completion["tokens"], nlohmann::json({" Par", "\xC3\xA9"}));
  EXPECT_EQ(completion["token_logprobs"], nlohmann::json({-0.5, -0.25}));
  EXPECT_EQ(completion["top_logprobs"][0], nlohmann::json({{" Par", -0.5}, {" Lyon", -1.5}}));
  EXPECT_EQ(completion["text_offset"], nlohmann::json({10, 14}));  // characters, not bytes
  EXPECT_EQ(CompletionLogprobs(tokens, 1, 0)["top_logprobs"][1].size(), 1u);
  EXPECT_TRUE(CompletionLogprobs(tokens, 0, 0)["top_logprobs"][0].is_null());

  const nlohmann::json chat = ChatLogprobs(tokens, 1);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][1]["token"], "\xC3\xA9");
  EXPECT_EQ(chat["content"][1]["bytes"], nlohmann::json({0xC3, 0xA9}));
  EXPECT_EQ(chat["content"][1]["logprob"], -0.25);
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][0]["token"], " Par");
  EXPECT_EQ(ChatLogprobs(tokens, 0)["content"][0]["top_logprobs"].size(), 0u);
  EXPECT_EQ(CountCharacters("a\xC3\xA9\xE2\x82\xAC"), 3);
}

TEST(OpenAiJsonTest, TokenizeAndDetokenizeBodies) {
  absl::StatusOr<v1::TokenizeRequest> prompt =
      ParseTokenizeRequest(R"({"model": "m", "prompt": "hi"})");
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->prompt(), "hi");
  EXPECT_TRUE(prompt->add_special_tokens());  // vLLM's default for a prompt
  absl::StatusOr<v1::TokenizeRequest> chat = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->chat().messages_size(), 1);
  EXPECT_FALSE(chat->add_special_tokens());  // the template has them
  EXPECT_FALSE(chat->add_generation_prompt());
  for (const auto& [body, param] : std::vector<std::pair<const char*, const char*>>{
           {"{}", "prompt"},
           {R"({"prompt": "a", "messages": []})", "prompt"},
           {R"({"prompt": 5})", "prompt"},
           {R"({"prompt": "a", "add_generation_prompt": true})", "add_generation_prompt"},
           {R"({"prompt": "a", "add_special_tokens": 1})", "add_special_tokens"},
           {R"({"prompt": "a", "extra": 1})", "extra"},
           {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
       }) {
    absl::StatusOr<v1::TokenizeRequest> r = ParseTokenizeRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(ParamOf(r.status()), param) << body;
  }
  absl::StatusOr<DetokenizeRequest> ids = ParseDetokenizeRequest(R"({"tokens": [1, 2]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(ids->tokens, ::testing::ElementsAre(1, 2));
  for (const char* body : {"{}", R"({"tokens": "12"})", R"({"tokens": [-1]})",
                           R"({"tokens": [1.5]})"}) {
    absl::StatusOr<DetokenizeRequest> r = ParseDetokenizeRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(ParamOf(r.status()), "tokens") << body;
  }
}

TEST(OpenAiJsonTest, ACompletionsBodyBecomesARequest) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "The capital of France is", "max_tokens": 8,
          "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
          "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
          "min_tokens": 2, "priority": -1, "stop": ["\n", "."], "ignore_eos": true,
          "stream": true, "stream_options": {"include_usage": true},
          "slo": {"ttft_ms": 499.5, "tpot_ms": 50}})",
      /*chat=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->request;
  EXPECT_EQ(g.model(), "m");
  EXPECT_EQ(g.prompt(), "The capital of France is");
  const v1::SamplingParams& s = g.sampling();
  EXPECT_EQ(s.max_tokens(), 8u);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  EXPECT_EQ(s.seed(), 7u);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.1f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), 0.2f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_EQ(s.min_tokens(), 2u);
  EXPECT_EQ(g.priority(), -1);
  EXPECT_THAT(std::vector<std::string>(s.stop().begin(), s.stop().end()),
              ::testing::ElementsAre("\n", "."));
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(g.slo().ttft_ms(), 500u);  // rounded up
  EXPECT_EQ(g.slo().tpot_ms(), 50u);
}

TEST(OpenAiJsonTest, PromptFormsAndDefaults) {
  absl::StatusOr<OpenAiRequest> one = ParseOpenAiRequest(R"({"prompt": ["hi"]})", false);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->request.prompt(), "hi");
  EXPECT_EQ(one->request.sampling().max_tokens(), 16u);  // OpenAI's default for completions
  EXPECT_FALSE(one->stream);
  EXPECT_FALSE(one->include_usage);

  absl::StatusOr<OpenAiRequest> ids = ParseOpenAiRequest(R"({"prompt": [1, 2, 3]})", false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(std::vector<int32_t>(ids->request.token_ids().ids().begin(),
                                   ids->request.token_ids().ids().end()),
              ::testing::ElementsAre(1, 2, 3));

  EXPECT_TRUE(ids->batch.empty());

  // A batch: one request per prompt, each with every parameter and its own input.
  absl::StatusOr<OpenAiRequest> batch = ParseOpenAiRequest(
      R"({"prompt": ["a", [5, 6]], "max_tokens": 3, "n": 2, "seed": 9})", false);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->batch.size(), 2u);
  EXPECT_EQ(batch->batch[0].prompt(), "a");
  EXPECT_EQ(batch->request.prompt(), "a");
  EXPECT_THAT(std::vector<int32_t>(batch->batch[1].token_ids().ids().begin(),
                                   batch->batch[1].token_ids().ids().end()),
              ::testing::ElementsAre(5, 6));
  for (const v1::GenerateRequest& one : batch->batch) {
    EXPECT_EQ(one.sampling().max_tokens(), 3u);
    EXPECT_EQ(one.sampling().seed(), 9u);
  }
  EXPECT_EQ(batch->n, 2);
  const std::string many = absl::StrCat(
      R"({"prompt": [)", absl::StrJoin(std::vector<std::string>(kMaxPrompts + 1, R"("x")"), ","),
      "]}");
  EXPECT_THAT(ParseOpenAiRequest(many, false).status().message(),
              ::testing::HasSubstr("at most 256"));
  const std::string wide = absl::StrCat(
      R"({"prompt": [)", absl::StrJoin(std::vector<std::string>(20, R"("x")"), ","),
      R"(], "best_of": 20})");
  EXPECT_THAT(ParseOpenAiRequest(wide, false).status().message(),
              ::testing::HasSubstr("exceed 256 sequences"));

  absl::StatusOr<OpenAiRequest> stop = ParseOpenAiRequest(R"({"prompt": "x", "stop": "END"})",
                                                          false);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_EQ(stop->request.sampling().stop_size(), 1);
}

TEST(OpenAiJsonTest, AChatBodyBecomesARequest) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Name "},
                                                     {"type": "text", "text": "a river."}]},
                       {"role": "assistant", "content": ""}],
          "max_tokens": 9, "max_completion_tokens": 9})",
      /*chat=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatMessages& chat = r->request.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).content(), "Name a river.");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(r->request.sampling().max_tokens(), 9u);

  absl::StatusOr<OpenAiRequest> unset =
      ParseOpenAiRequest(R"({"messages": [{"role": "user", "content": "hi"}]})", true);
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FALSE(unset->request.sampling().has_max_tokens());  // up to the context
}

TEST(OpenAiJsonTest, ErrorBodiesAndFinishReasonsHaveOpenAisShape) {
  EXPECT_EQ(OpenAiErrorBody(absl::InvalidArgumentError("bad \"x\"")),
            R"({"error":{"code":"INVALID_ARGUMENT","message":"bad \"x\"","param":null,"type":"invalid_request_error"}})");
  EXPECT_THAT(OpenAiErrorBody(absl::ResourceExhaustedError("busy")), HasSubstr("rate_limit_error"));
  EXPECT_THAT(OpenAiErrorBody(absl::UnavailableError("gone")), HasSubstr("server_error"));
  EXPECT_THAT(OpenAiErrorBody(absl::NotFoundError("no model")), HasSubstr("invalid_request_error"));
  // A missing or wrong API key: OpenAI's type and code for it.
  EXPECT_EQ(OpenAiErrorBody(absl::UnauthenticatedError("invalid API key")),
            R"({"error":{"code":"invalid_api_key","message":"invalid API key","param":null,"type":"invalid_request_error"}})");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_STOP_STRING), "stop");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_CANCELLED), "abort");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_ERROR), "error");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_UNSPECIFIED), "");
}

TEST(OpenAiJsonTest, ModelListHasOpenAisShapeAndTheModelsFacts) {
  v1::ListModelsResponse models;
  v1::ModelInfo* m = models.add_models();
  m->set_id("SmolLM2-135M-Instruct.Q4_1");
  m->set_architecture("llama");
  m->set_max_context(8192);
  m->set_created_unix_s(1700000000);
  m->set_owned_by("tandem");
  m->set_format("gguf");
  v1::ModelInfo* hf = models.add_models();
  hf->set_id("Qwen2.5-0.5B");
  hf->set_format("hf");
  hf->set_max_context(32768);
  const nlohmann::json body = nlohmann::json::parse(OpenAiModelList(models));
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 2u);
  const nlohmann::json& first = body["data"][0];
  EXPECT_EQ(first["id"], "SmolLM2-135M-Instruct.Q4_1");
  EXPECT_EQ(first["object"], "model");
  EXPECT_EQ(first["created"], 1700000000);
  EXPECT_EQ(first["owned_by"], "tandem");
  EXPECT_EQ(first["max_model_len"], 8192);
  EXPECT_EQ(first["format"], "gguf");
  EXPECT_EQ(first["architecture"], "llama");
  EXPECT_EQ(body["data"][1]["format"], "hf");
  EXPECT_EQ(body["data"][1]["max_model_len"], 32768);
  EXPECT_EQ(OpenAiModelList({}), R"({"data":[],"object":"list"})");
}

// response_format: OpenAI's three types map to SamplingParams.response_format (the schema as its
// JSON text); malformed ones are refused naming the field. Whether a schema compiles is the
// worker's question.
TEST(OpenAiJsonTest, ResponseFormatMapsToTheProtoAndBadOnesAreRefused) {
  auto parse = [](const std::string& format) {
    return ParseOpenAiRequest(
        R"({"messages": [{"role": "user", "content": "hi"}], "response_format": )" + format + "}",
        true);
  };
  absl::StatusOr<OpenAiRequest> text = parse(R"({"type": "text"})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->request.sampling().has_response_format());
  absl::StatusOr<OpenAiRequest> object = parse(R"({"type": "json_object"})");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_TRUE(object->request.sampling().response_format().has_json_object());
  absl::StatusOr<OpenAiRequest> schema = parse(
      R"({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
          "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(nlohmann::json::parse(schema->request.sampling().response_format().json_schema()),
            nlohmann::json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
  absl::StatusOr<OpenAiRequest> no_schema =
      parse(R"({"type": "json_schema", "json_schema": {"name": "x"}})");
  ASSERT_TRUE(no_schema.ok()) << no_schema.status();
  EXPECT_TRUE(no_schema->request.sampling().response_format().has_json_object());

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("json")", "'response_format' must be an object"},
      {R"({"kind": "json_object"})", "'response_format' must be an object with a string 'type'"},
      {R"({"type": "xml"})", "'response_format.type' must be"},
      {R"({"type": "json_schema"})", "'response_format.json_schema' must be an object"},
      {R"({"type": "json_schema", "json_schema": {"schema": {}}})",
       "'response_format.json_schema.name'"},
      {R"({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}})",
       "'response_format.json_schema.strict'"},
      {R"({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}})",
       "'response_format.json_schema.schema'"},
  };
  for (const auto& [format, says] : bad) {
    absl::StatusOr<OpenAiRequest> r = parse(format);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << format;
    EXPECT_THAT(r.status().message(), HasSubstr(says)) << format;
  }
}

}  // namespace
}  // namespace tandem::router
