#include "engine/sampling/sampling_options.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr int kVocab = 1000;
constexpr int kContext = 2048;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  const char* name;
  std::function<void(SamplingOptions&)> mutate;
  const char* message;  // a substring the error message must contain ("" for OK cases)
};

TEST(ValidateSamplingOptionsTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateSamplingOptions(SamplingOptions{}, kVocab, kContext).ok());
}

TEST(ValidateSamplingOptionsTest, BadFieldsAreInvalidArgumentNamingTheField) {
  const Case cases[] = {
      {"negative temperature", [](auto& o) { o.temperature = -0.1f; }, "temperature"},
      {"NaN temperature", [](auto& o) { o.temperature = kNaN; }, "temperature"},
      {"inf temperature", [](auto& o) { o.temperature = kInf; }, "temperature"},
      {"top_p 0", [](auto& o) { o.top_p = 0.0f; }, "top_p must be in (0, 1]"},
      {"top_p > 1", [](auto& o) { o.top_p = 1.0001f; }, "top_p"},
      {"top_p negative", [](auto& o) { o.top_p = -0.5f; }, "top_p"},
      {"top_p NaN", [](auto& o) { o.top_p = kNaN; }, "top_p"},
      {"top_k negative", [](auto& o) { o.top_k = -1; }, "top_k must be >= 0"},
      {"min_p negative", [](auto& o) { o.min_p = -0.01f; }, "min_p must be in [0, 1]"},
      {"min_p > 1", [](auto& o) { o.min_p = 1.5f; }, "min_p"},
      {"min_p NaN", [](auto& o) { o.min_p = kNaN; }, "min_p"},
      {"repetition_penalty 0", [](auto& o) { o.repetition_penalty = 0.0f; },
       "repetition_penalty"},
      {"repetition_penalty negative", [](auto& o) { o.repetition_penalty = -1.0f; },
       "repetition_penalty"},
      {"repetition_penalty NaN", [](auto& o) { o.repetition_penalty = kNaN; },
       "repetition_penalty"},
      {"repetition_penalty inf", [](auto& o) { o.repetition_penalty = kInf; },
       "repetition_penalty"},
      {"frequency_penalty > 2", [](auto& o) { o.frequency_penalty = 2.01f; },
       "frequency_penalty must be in [-2, 2]"},
      {"frequency_penalty < -2", [](auto& o) { o.frequency_penalty = -2.01f; },
       "frequency_penalty"},
      {"frequency_penalty NaN", [](auto& o) { o.frequency_penalty = kNaN; },
       "frequency_penalty"},
      {"presence_penalty > 2", [](auto& o) { o.presence_penalty = 3.0f; },
       "presence_penalty must be in [-2, 2]"},
      {"presence_penalty < -2", [](auto& o) { o.presence_penalty = -kInf; }, "presence_penalty"},
      {"presence_penalty NaN", [](auto& o) { o.presence_penalty = kNaN; }, "presence_penalty"},
      {"max_tokens 0", [](auto& o) { o.max_tokens = 0; }, "max_tokens must be in [1, 2048]"},
      {"max_tokens negative", [](auto& o) { o.max_tokens = -3; }, "max_tokens"},
      {"max_tokens > context", [](auto& o) { o.max_tokens = kContext + 1; }, "max_tokens"},
      {"min_tokens negative", [](auto& o) { o.min_tokens = -1; }, "min_tokens"},
      {"min_tokens > max_tokens",
       [](auto& o) {
         o.max_tokens = 10;
         o.min_tokens = 11;
       },
       "min_tokens must be in [0, 10]"},
      {"min_tokens > context", [](auto& o) { o.min_tokens = kContext + 1; }, "min_tokens"},
      {"stop token id negative", [](auto& o) { o.stop_token_ids = {5, -1}; },
       "stop_token_ids[1] must be in [0, 1000)"},
      {"stop token id = vocab", [](auto& o) { o.stop_token_ids = {kVocab}; }, "stop_token_ids[0]"},
      {"too many stop token ids",
       [](auto& o) { o.stop_token_ids.assign(kMaxStopTokenIds + 1, 1); }, "stop_token_ids"},
      {"too many stop strings", [](auto& o) { o.stop.assign(kMaxStopStrings + 1, "x"); },
       "stop may hold at most 16"},
      {"empty stop string", [](auto& o) { o.stop = {"a", ""}; }, "stop[1] must be 1 to 256 bytes"},
      {"too long stop string",
       [](auto& o) { o.stop = {std::string(kMaxStopStringBytes + 1, 'a')}; }, "stop[0]"},
      {"logprobs > 20", [](auto& o) { o.logprobs = 21; }, "logprobs must be in [0, 20]"},
      {"logprobs negative", [](auto& o) { o.logprobs = -1; }, "logprobs"},
      {"empty json schema",
       [](auto& o) { o.response_format = {.kind = ResponseFormat::Kind::kJsonSchema}; },
       "response_format: the schema, regex or grammar is empty"},
      {"empty regex", [](auto& o) { o.response_format = {.kind = ResponseFormat::Kind::kRegex}; },
       "response_format"},
      {"json_object with a text",
       [](auto& o) { o.response_format = {.kind = ResponseFormat::Kind::kJsonObject, .text = "{}"}; },
       "json_object formats take no schema"},
      {"min_tokens with a response_format",
       [](auto& o) {
         o.min_tokens = 2;
         o.response_format = {.kind = ResponseFormat::Kind::kJsonObject};
       },
       "min_tokens cannot be combined with a response_format"},
      {"too long schema",
       [](auto& o) {
         o.response_format = {.kind = ResponseFormat::Kind::kJsonSchema,
                              .text = std::string(kMaxResponseFormatBytes + 1, ' ')};
       },
       "response_format: the schema, regex or grammar may hold at most 65536 bytes"},
  };
  for (const Case& c : cases) {
    SamplingOptions options;
    c.mutate(options);
    const absl::Status s = ValidateSamplingOptions(options, kVocab, kContext);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), testing::HasSubstr(c.message)) << c.name;
  }
}

TEST(ValidateSamplingOptionsTest, BoundaryValuesAreValid) {
  const Case cases[] = {
      {"greedy", [](auto& o) { o.temperature = 0.0f; }, ""},
      {"huge temperature", [](auto& o) { o.temperature = 1e30f; }, ""},
      {"top_p 1", [](auto& o) { o.top_p = 1.0f; }, ""},
      {"top_p tiny", [](auto& o) { o.top_p = 1e-6f; }, ""},
      {"top_k above vocab", [](auto& o) { o.top_k = kVocab * 10; }, ""},
      {"min_p 0 and 1", [](auto& o) { o.min_p = 1.0f; }, ""},
      {"penalties at the limits",
       [](auto& o) {
         o.frequency_penalty = -2.0f;
         o.presence_penalty = 2.0f;
         o.repetition_penalty = 1e-3f;
       },
       ""},
      {"max_tokens = context", [](auto& o) { o.max_tokens = kContext; }, ""},
      {"min_tokens = max_tokens",
       [](auto& o) {
         o.max_tokens = 7;
         o.min_tokens = 7;
       },
       ""},
      {"stop token ids at the ends", [](auto& o) { o.stop_token_ids = {0, kVocab - 1}; }, ""},
      {"16 stop strings of 256 bytes",
       [](auto& o) { o.stop.assign(kMaxStopStrings, std::string(kMaxStopStringBytes, 'z')); }, ""},
      {"logprobs 20", [](auto& o) { o.logprobs = kMaxLogprobs; }, ""},
  };
  for (const Case& c : cases) {
    SamplingOptions options;
    c.mutate(options);
    EXPECT_TRUE(ValidateSamplingOptions(options, kVocab, kContext).ok()) << c.name;
  }
}

TEST(ValidateSamplingOptionsTest, BadModelLimitsAreInvalidArgument) {
  EXPECT_EQ(ValidateSamplingOptions({}, 0, kContext).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingOptions({}, kVocab, -1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidatePromptLengthTest, PromptPlusMaxTokensMustFit) {
  SamplingOptions options;
  EXPECT_TRUE(ValidatePromptLength(options, 100, 128).ok());
  EXPECT_EQ(ValidatePromptLength(options, 128, 128).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePromptLength(options, 0, 128).code(), absl::StatusCode::kInvalidArgument);
  options.max_tokens = 28;
  EXPECT_TRUE(ValidatePromptLength(options, 100, 128).ok());
  options.max_tokens = 29;
  const absl::Status s = ValidatePromptLength(options, 100, 128);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("max_tokens"));
}

}  // namespace
}  // namespace tandem::sampling
