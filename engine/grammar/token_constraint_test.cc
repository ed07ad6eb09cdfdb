#include "engine/grammar/token_constraint.h"

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sampling/random.h"
#include "engine/sampling/sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;
using sampling::ResponseFormat;

// A small vocabulary: every printable ASCII byte and newline alone, some multi-byte pieces that
// cross JSON's structure (so a mask must reason within tokens), a control token (empty bytes)
// and a stop token.
struct TestVocab {
  std::vector<std::string> bytes;
  int32_t control = -1;
  int32_t stop = -1;
};

TestVocab MakeVocab() {
  TestVocab v;
  for (int c = 0x20; c < 0x7F; ++c) v.bytes.emplace_back(1, static_cast<char>(c));
  v.bytes.emplace_back("\n");
  for (const char* piece : {"{\"", "\":", "\",", "\"}", "\":\"", "true", "false", "null", "name",
                            "age", "tags", "12", "-3", "0.5", "e+", "[\"", "\"]", "},{", "abc",
                            " {", "\\\"", "\\u00"}) {
    v.bytes.emplace_back(piece);
  }
  v.control = static_cast<int32_t>(v.bytes.size());
  v.bytes.emplace_back("");
  v.stop = static_cast<int32_t>(v.bytes.size());
  v.bytes.emplace_back("");
  return v;
}

std::unique_ptr<ResponseFormatCompiler> MakeCompiler(const TestVocab& v) {
  absl::StatusOr<std::unique_ptr<ResponseFormatCompiler>> c =
      ResponseFormatCompiler::Create({.token_bytes = v.bytes, .stop_token_ids = {v.stop}});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

bool Allowed(absl::Span<const uint32_t> mask, int32_t token) {
  return mask.empty() || (mask[static_cast<size_t>(token) / 32] >> (token % 32) & 1u) != 0;
}

// Generates with random logits through the real Sampler under the constraint until the grammar
// terminates (or max_steps). Checks at every step that the mask and Accept agree: every sampled
// (allowed) token is accepted, every masked token is refused without changing the state.
std::string Generate(const TestVocab& v, const CompiledFormat& format, uint64_t seed,
                     int max_steps, bool* terminated) {
  const int n = static_cast<int>(v.bytes.size());
  sampling::SamplingOptions options;
  options.seed = seed;
  sampling::Sampler sampler = *sampling::Sampler::Create(options, {.vocab_size = n});
  sampling::SplitMix64SeedSource bits(seed);
  TokenConstraint constraint(format);
  std::string text;
  for (int step = 0; step < max_steps && !constraint.Terminated(); ++step) {
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& x : logits) x = static_cast<float>(bits.NextSeed() >> 40) * 0x1.0p-21f;
    // Favor the stop token a little so that outputs end.
    logits[static_cast<size_t>(v.stop)] += 2.0f;
    const absl::Span<const uint32_t> mask = constraint.AllowedTokens();
    const std::vector<uint32_t> allowed(mask.begin(), mask.end());
    EXPECT_FALSE(Allowed(allowed, v.control) && !allowed.empty()) << "control token allowed";
    absl::StatusOr<sampling::SampledToken> t = sampler.Sample(logits, allowed);
    EXPECT_TRUE(t.ok()) << t.status() << " after " << text;
    if (!t.ok()) break;
    // A few masked tokens are refused and leave the state as it was.
    int refused = 0;
    for (int32_t other = 0; other < n && refused < 8; ++other) {
      if (Allowed(allowed, other)) continue;
      EXPECT_EQ(constraint.Accept(other).code(), absl::StatusCode::kInvalidArgument);
      ++refused;
    }
    EXPECT_TRUE(constraint.Accept(t->id).ok()) << "sampled token " << t->id << " after " << text;
    EXPECT_TRUE(sampler.Accept(t->id).ok());
    text += v.bytes[static_cast<size_t>(t->id)];
  }
  *terminated = constraint.Terminated();
  return text;
}

TEST(TokenConstraintTest, JsonSchemaOutputsParseAndMatchTheSchema) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["name", "age"]})";
  absl::StatusOr<CompiledFormat> format =
      compiler->Compile({.kind = ResponseFormat::Kind::kJsonSchema, .text = schema});
  ASSERT_TRUE(format.ok()) << format.status();
  for (uint64_t seed = 0; seed < 20; ++seed) {
    bool terminated = false;
    const std::string text = Generate(v, *format, seed, 400, &terminated);
    ASSERT_TRUE(terminated) << "seed " << seed << ": " << text;
    // Checked by nlohmann::json, not by the grammar's own code.
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    EXPECT_LE(j["name"].get<std::string>().size(), 6u) << text;  // ASCII-only vocabulary
    ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
    EXPECT_GE(j["age"].get<int64_t>(), 0);
    EXPECT_LE(j["age"].get<int64_t>(), 150);
    for (const auto& [key, value] : j.items()) {
      EXPECT_TRUE(key == "name" || key == "age" || key == "tags") << "extra key " << key;
    }
    if (j.contains("tags")) {
      ASSERT_TRUE(j["tags"].is_array());
      EXPECT_LE(j["tags"].size(), 3u);
      for (const auto& t : j["tags"]) EXPECT_TRUE(t.is_boolean()) << text;
    }
  }
}

TEST(TokenConstraintTest, JsonObjectOutputsAreObjects) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  absl::StatusOr<CompiledFormat> format = compiler->Compile({.kind = ResponseFormat::Kind::kJsonObject});
  ASSERT_TRUE(format.ok()) << format.status();
  int ended = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    bool terminated = false;
    const std::string text = Generate(v, *format, seed, 1000, &terminated);
    if (!terminated) continue;  // random logits may nest deeper than the step budget
    ++ended;
    // JSON's grammar has no limit on exponents; nlohmann::json refuses numbers beyond double's
    // range (out_of_range 406, "number overflow"), which random logits can spell (1e61290).
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      EXPECT_TRUE(j.is_object()) << text;
    } catch (const nlohmann::json::out_of_range& e) {
      EXPECT_EQ(e.id, 406) << e.what() << ": " << text;
    } catch (const nlohmann::json::exception& e) {
      ADD_FAILURE() << e.what() << ": " << text;
    }
  }
  EXPECT_GE(ended, 10);
}

TEST(TokenConstraintTest, RegexOutputsMatch) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  const std::string pattern = "[0-9]{3}-(abc|name)+";
  absl::StatusOr<CompiledFormat> format =
      compiler->Compile({.kind = ResponseFormat::Kind::kRegex, .text = pattern});
  ASSERT_TRUE(format.ok()) << format.status();
  for (uint64_t seed = 0; seed < 20; ++seed) {
    bool terminated = false;
    const std::string text = Generate(v, *format, seed, 200, &terminated);
    ASSERT_TRUE(terminated) << text;
    EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << text;
  }
}

TEST(TokenConstraintTest, StopTokenOnlyWhenCompleteAndNothingAfterIt) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  absl::StatusOr<CompiledFormat> format =
      compiler->Compile({.kind = ResponseFormat::Kind::kRegex, .text = "ab"});
  ASSERT_TRUE(format.ok()) << format.status();
  TokenConstraint c(*format);
  const auto id = [&](const std::string& s) {
    return static_cast<int32_t>(std::find(v.bytes.begin(), v.bytes.end(), s) - v.bytes.begin());
  };
  EXPECT_FALSE(Allowed(c.AllowedTokens(), v.stop));
  EXPECT_EQ(c.Accept(v.stop).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.Accept(id("a")).ok());
  EXPECT_FALSE(Allowed(c.AllowedTokens(), v.stop));
  ASSERT_TRUE(c.Accept(id("b")).ok());
  const absl::Span<const uint32_t> mask = c.AllowedTokens();
  ASSERT_FALSE(mask.empty());
  for (int32_t t = 0; t < static_cast<int32_t>(v.bytes.size()); ++t) {
    EXPECT_EQ(Allowed(mask, t), t == v.stop) << t;
  }
  EXPECT_FALSE(c.Terminated());
  ASSERT_TRUE(c.Accept(v.stop).ok());
  EXPECT_TRUE(c.Terminated());
  EXPECT_EQ(c.Accept(id("a")).code(), absl::StatusCode::kInvalidArgument);
}

// A tool call's structural tag (what the router writes for tool_choice "required"): every output
// is "<tool_call>" + {"name": ..., "arguments": <JSON valid against the schema>} + "</tool_call>".
TEST(TokenConstraintTest, StructuralTagOutputsAreToolCallsWithValidArguments) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  const std::string tag = R"({"type": "structural_tag", "format": {
      "type": "tags_with_separator", "separator": "\n", "at_least_one": true,
      "stop_after_first": true, "tags": [{"type": "tag",
        "begin": "<tool_call>\n{\"name\": \"f\", \"arguments\": ",
        "content": {"type": "json_schema", "max_whitespace_cnt": 1, "json_schema": {
          "type": "object",
          "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["age"]}},
        "end": "}\n</tool_call>"}]}})";
  absl::StatusOr<CompiledFormat> format =
      compiler->Compile({.kind = ResponseFormat::Kind::kStructuralTag, .text = tag});
  ASSERT_TRUE(format.ok()) << format.status();
  const std::regex call(R"(<tool_call>\n(\{[\s\S]*\})\n</tool_call>)");
  for (uint64_t seed = 0; seed < 10; ++seed) {
    bool terminated = false;
    const std::string text = Generate(v, *format, seed, 400, &terminated);
    ASSERT_TRUE(terminated) << "seed " << seed << ": " << text;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, call)) << text;
    const nlohmann::json j = nlohmann::json::parse(m[1].str(), nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j["name"], "f") << text;
    ASSERT_TRUE(j["arguments"].is_object() && j["arguments"].contains("age")) << text;
    EXPECT_TRUE(j["arguments"]["age"].is_number_integer()) << text;
    EXPECT_GE(j["arguments"]["age"].get<int64_t>(), 0) << text;
    EXPECT_LE(j["arguments"]["age"].get<int64_t>(), 150) << text;
  }
  EXPECT_EQ(compiler->Compile({.kind = ResponseFormat::Kind::kStructuralTag, .text = "{}"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenConstraintTest, InvalidFormatsAreInvalidArgumentWithTheCompilersMessage) {
  const TestVocab v = MakeVocab();
  auto compiler = MakeCompiler(v);
  struct Case {
    ResponseFormat format;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{.kind = ResponseFormat::Kind::kJsonSchema, .text = "{not json"}, "json_schema"},
           {{.kind = ResponseFormat::Kind::kJsonSchema, .text = R"({"type": "no-such-type"})"},
            "json_schema"},
           {{.kind = ResponseFormat::Kind::kRegex, .text = "(unclosed"}, "regex"},
           {{.kind = ResponseFormat::Kind::kEbnf, .text = "root ::= missing_rule"}, "grammar"},
           {{.kind = ResponseFormat::Kind::kText}, "text"}}) {
    absl::StatusOr<CompiledFormat> f = compiler->Compile(c.format);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.format.text;
    EXPECT_THAT(f.status().message(), HasSubstr(c.message)) << f.status();
  }
  // The compiler still works after errors.
  EXPECT_TRUE(compiler->Compile({.kind = ResponseFormat::Kind::kJsonObject}).ok());
}

TEST(TokenConstraintTest, BadVocabulariesAreRefused) {
  EXPECT_EQ(ResponseFormatCompiler::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResponseFormatCompiler::Create({.token_bytes = {"a"}, .stop_token_ids = {1}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::grammar
