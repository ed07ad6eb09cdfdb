#include "router/server/openai_json.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

// A body that must be refused, and a word its message must contain (the field it names).
struct Bad {
  const char* body;
  bool chat;
  const char* says;
};

TEST(OpenAiJsonTest, InvalidBodiesAreRefusedNamingTheField) {
  const std::vector<Bad> cases = {
      {"not json", false, "not valid JSON"},
      {"[1, 2]", false, "JSON object"},
      {"{}", false, "'prompt' is required"},
      {R"({"prompt": null})", false, "'prompt' is required"},
      {R"({"prompt": {"text": "hi"}})", false, "'prompt' must be"},
      {R"({"prompt": ["a", "b"]})", false, "'prompt' must be"},
      {R"({"prompt": [1, "b"]})", false, "'prompt' must be"},
      {R"({"prompt": "hi", "model": 7})", false, "'model'"},
      {R"({"prompt": "hi", "max_tokens": 0})", false, "'max_tokens' must be at least 1"},
      {R"({"prompt": "hi", "max_tokens": 1.5})", false, "'max_tokens' must be an integer"},
      {R"({"prompt": "hi", "max_tokens": "8"})", false, "'max_tokens' must be a number"},
      {R"({"prompt": "hi", "max_tokens": 4294967296})", false, "'max_tokens' must be at least 1"},
      {R"({"prompt": "hi", "temperature": "hot"})", false, "'temperature'"},
      {R"({"prompt": "hi", "top_k": 2.5})", false, "'top_k' must be an integer"},
      {R"({"prompt": "hi", "seed": "s"})", false, "'seed'"},
      {R"({"prompt": "hi", "n": 2})", false, "n = 1"},
      {R"({"prompt": "hi", "stop": 3})", false, "'stop'"},
      {R"({"prompt": "hi", "stop": ["a", 1]})", false, "'stop'"},
      {R"({"prompt": "hi", "stream": "yes"})", false, "'stream' must be a boolean"},
      {R"({"prompt": "hi", "slo": 5})", false, "'slo' must be an object"},
      {R"({"prompt": "hi", "slo": {"ttft_ms": -1}})", false, "'slo.ttft_ms'"},
      {R"({"prompt": "hi", "slo": {"tpot_ms": 1e9}})", false, "'slo.tpot_ms'"},
      {R"({})", true, "'messages' must be a non-empty array"},
      {R"({"messages": []})", true, "'messages' must be a non-empty array"},
      {R"({"messages": ["hi"]})", true, "'role'"},
      {R"({"messages": [{"content": "hi"}]})", true, "'role'"},
      {R"({"messages": [{"role": "user", "content": 5}]})", true, "'content'"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true,
       "text content parts"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", true,
       "'max_completion_tokens'"},
  };
  for (const Bad& c : cases) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(c.body, c.chat);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.says)) << c.body;
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
                       {"role": "assistant", "content": null}],
          "max_tokens": 4, "max_completion_tokens": 9})",
      /*chat=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatMessages& chat = r->request.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).content(), "Name a river.");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(r->request.sampling().max_tokens(), 9u);  // max_completion_tokens wins

  absl::StatusOr<OpenAiRequest> unset =
      ParseOpenAiRequest(R"({"messages": [{"role": "user", "content": "hi"}]})", true);
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FALSE(unset->request.sampling().has_max_tokens());  // up to the context
}

TEST(OpenAiJsonTest, ErrorBodiesAndFinishReasonsHaveOpenAisShape) {
  EXPECT_EQ(OpenAiErrorBody(absl::InvalidArgumentError("bad \"x\"")),
            R"({"error":{"code":"INVALID_ARGUMENT","message":"bad \"x\"","type":"invalid_request_error"}})");
  EXPECT_THAT(OpenAiErrorBody(absl::ResourceExhaustedError("busy")), HasSubstr("rate_limit_error"));
  EXPECT_THAT(OpenAiErrorBody(absl::UnavailableError("gone")), HasSubstr("server_error"));
  EXPECT_THAT(OpenAiErrorBody(absl::NotFoundError("no model")), HasSubstr("invalid_request_error"));
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
