#include "router/server/tool_calls.h"

#include <string>
#include <vector>

#include "common/status_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

const absl::flat_hash_set<std::string> kNames = {"get_weather", "add"};

// What the parser makes of `pieces` fed one after another: content joined, calls in order.
ParsedOutput FeedPieces(const std::vector<std::string>& pieces,
                        ToolCallFormat format = ToolCallFormat::kHermes) {
  ToolCallParser parser(kNames, format);
  ParsedOutput out;
  std::string content;
  auto take = [&](std::vector<ToolCallParser::Piece> got) {
    for (auto& p : got) {
      if (p.call.has_value()) {
        out.calls.push_back(*p.call);
      } else {
        EXPECT_FALSE(p.content.empty());
        content += p.content;
      }
    }
  };
  for (const std::string& p : pieces) take(parser.Feed(p));
  take(parser.Finish());
  if (!content.empty() || out.calls.empty()) out.content = content;
  return out;
}

// Every split of `text` into two pieces, and one byte at a time, parses as the whole does.
void ExpectSameWhateverTheSplit(const std::string& text,
                                ToolCallFormat format = ToolCallFormat::kHermes) {
  const ParsedOutput whole = ParseToolCalls(text, kNames, format);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const ParsedOutput by_byte = FeedPieces(bytes, format);
  EXPECT_EQ(by_byte.content, whole.content) << text;
  EXPECT_EQ(by_byte.calls, whole.calls) << text;
  for (size_t i = 0; i <= text.size(); ++i) {
    const ParsedOutput split = FeedPieces({text.substr(0, i), text.substr(i)}, format);
    EXPECT_EQ(split.content, whole.content) << text << " split at " << i;
    EXPECT_EQ(split.calls, whole.calls) << text << " split at " << i;
  }
}

TEST(ToolCallParserTest, PlainTextIsContentUnchanged) {
  const std::string text = "No call here: a < b and <tool_ is not a marker.  \n";
  const ParsedOutput out = ParseToolCalls(text, kNames);
  EXPECT_EQ(out.content, text);
  EXPECT_TRUE(out.calls.empty());
  ExpectSameWhateverTheSplit(text);
}

TEST(ToolCallParserTest, OneCallAloneHasNoContent) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
      "3}}\n</tool_call>";
  const ParsedOutput out = ParseToolCalls(text, kNames);
  EXPECT_EQ(out.content, std::nullopt);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  // The model's key order is kept.
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris","days":3})");
  ExpectSameWhateverTheSplit(text);
}

TEST(ToolCallParserTest, WhitespaceInsideTheArgumentsIsJson) {
  // As the grammar lets a model write it.
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\n\"city\": \"Paris\", "
      "\"unit\": \"celsius\"\n}}\n</tool_call>";
  const ParsedOutput out = ParseToolCalls(text, kNames);
  EXPECT_EQ(out.content, std::nullopt);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0], (ParsedToolCall{"get_weather", R"({"city":"Paris","unit":"celsius"})"}));
}

TEST(ToolCallParserTest, TextBeforeACallIsContentAndTwoCallsAreTwo) {
  const std::string text =
      "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"parameters\": {\"a\": 1, "
      "\"b\": 2}}\n</tool_call>\n";
  const ParsedOutput out = ParseToolCalls(text, kNames);
  EXPECT_EQ(out.content, "Let me look.");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0], (ParsedToolCall{"get_weather", R"({"city":"Oslo"})"}));
  EXPECT_EQ(out.calls[1], (ParsedToolCall{"add", R"({"a":1,"b":2})"}));
  ExpectSameWhateverTheSplit(text);
}

TEST(ToolCallParserTest, MalformedUnknownAndUnterminatedCallsStayContent) {
  for (const std::string& text : std::vector<std::string>{
           // Not JSON.
           std::string("Hi <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": }\n"
                       "</tool_call> bye"),
           // An unknown function.
           std::string("<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"),
           // Arguments that are not an object.
           std::string("<tool_call>{\"name\": \"add\", \"arguments\": [1, 2]}</tool_call>"),
           // Cut before its end marker.
           std::string("Sure \n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1"),
       }) {
    const ParsedOutput out = ParseToolCalls(text, kNames);
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text);  // nothing dropped
    ExpectSameWhateverTheSplit(text);
  }
}

TEST(ToolCallParserTest, AGoodCallBesideABadOneIsParsed) {
  const std::string text =
      "<tool_call>{\"name\": \"nope\"}</tool_call>\n<tool_call>{\"name\": \"add\", "
      "\"arguments\": \"{\\\"a\\\": 5}\"}</tool_call>";
  const ParsedOutput out = ParseToolCalls(text, kNames);
  EXPECT_EQ(out.content, "<tool_call>{\"name\": \"nope\"}</tool_call>");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0], (ParsedToolCall{"add", R"({"a":5})"}));
  ExpectSameWhateverTheSplit(text);
}

TEST(ToolCallParserTest, AMarkerSplitAcrossPiecesIsHeldBackNotStreamed) {
  ToolCallParser parser(kNames);
  std::vector<ToolCallParser::Piece> a = parser.Feed("Checking <tool_");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].content, "Checking");  // the space and the possible marker wait
  EXPECT_TRUE(parser.Feed("ca").empty());
  EXPECT_TRUE(parser.Feed("ll>{\"name\": \"add\", \"arguments\": {}}").empty());
  std::vector<ToolCallParser::Piece> b = parser.Feed("</tool_call> done");
  ASSERT_EQ(b.size(), 2u);
  ASSERT_TRUE(b[0].call.has_value());
  EXPECT_EQ(*b[0].call, (ParsedToolCall{"add", "{}"}));
  EXPECT_EQ(b[1].content, "done");  // the whitespace after a call is dropped
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_EQ(parser.calls(), 1);
  // A prefix that turns out not to be a marker goes out as soon as it cannot be one.
  ToolCallParser other(kNames);
  EXPECT_EQ(other.Feed("x <tool").at(0).content, "x");
  EXPECT_EQ(other.Feed("box").at(0).content, " <toolbox");
}

v1::GenerateRequest ChatWithTools() {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("weather?");
  v1::Tool* t = r.add_tools();
  t->set_name("get_weather");
  t->set_parameters(R"({"type": "object", "properties": {"city": {"type": "string"}}})");
  r.add_tools()->set_name("add");
  return r;
}

TEST(ValidateToolsTest, BadRequestsNameTheirParameter) {
  struct Case {
    const char* what;
    void (*edit)(v1::GenerateRequest*);
    const char* param;
  };
  const std::vector<Case> cases = {
      {"bad name", [](v1::GenerateRequest* r) { r->mutable_tools(0)->set_name("get weather"); },
       "tools[0].function.name"},
      {"duplicate", [](v1::GenerateRequest* r) { r->mutable_tools(1)->set_name("get_weather"); },
       "tools[1].function.name"},
      {"parameters not an object",
       [](v1::GenerateRequest* r) { r->mutable_tools(0)->set_parameters("[1]"); },
       "tools[0].function.parameters"},
      {"unknown function",
       [](v1::GenerateRequest* r) {
         r->mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_FUNCTION);
         r->mutable_tool_choice()->set_function_name("nope");
       },
       "tool_choice.function.name"},
      {"required without tools",
       [](v1::GenerateRequest* r) {
         r->clear_tools();
         r->mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_REQUIRED);
       },
       "tool_choice"},
      {"tool message without id",
       [](v1::GenerateRequest* r) {
         v1::ChatMessage* m = r->mutable_chat()->add_messages();
         m->set_role("tool");
         m->set_content("5");
       },
       "messages[1].tool_call_id"},
      {"arguments not JSON",
       [](v1::GenerateRequest* r) {
         v1::ToolCall* c = r->mutable_chat()->add_messages()->add_tool_calls();
         r->mutable_chat()->mutable_messages(1)->set_role("assistant");
         c->set_id("call_1");
         c->set_name("add");
         c->set_arguments("{oops");
       },
       "messages[1].tool_calls[0].function.arguments"},
      {"tools without chat",
       [](v1::GenerateRequest* r) { r->set_prompt("hi"); }, "tools"},
  };
  EXPECT_TRUE(ValidateTools(ChatWithTools()).ok());
  for (const Case& c : cases) {
    v1::GenerateRequest r = ChatWithTools();
    c.edit(&r);
    const absl::Status s = ValidateTools(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(ParamOf(s), c.param) << c.what << ": " << s;
  }
}

TEST(ToolCallStructuralTagTest, NamesTheAllowedFunctionsWithTheirSchemas) {
  v1::GenerateRequest r = ChatWithTools();
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_FUNCTION);
  r.mutable_tool_choice()->set_function_name("get_weather");
  r.set_parallel_tool_calls(false);
  const nlohmann::json tag = nlohmann::json::parse(ToolCallStructuralTag(r));
  EXPECT_EQ(tag["type"], "structural_tag");
  const nlohmann::json& format = tag["format"];
  EXPECT_EQ(format["stop_after_first"], true);
  EXPECT_EQ(format["at_least_one"], true);
  ASSERT_EQ(format["tags"].size(), 1u);
  EXPECT_EQ(format["tags"][0]["begin"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(format["tags"][0]["content"]["json_schema"]["properties"]["city"]["type"], "string");
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_REQUIRED);
  r.mutable_tool_choice()->clear_function_name();
  r.clear_parallel_tool_calls();
  const nlohmann::json all = nlohmann::json::parse(ToolCallStructuralTag(r));
  EXPECT_EQ(all["format"]["tags"].size(), 2u);
  EXPECT_EQ(all["format"]["stop_after_first"], false);
  // "auto" is constrained only with a strict tool: free text, calls after the trigger.
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_AUTO);
  EXPECT_FALSE(ConstrainsToolCalls(r));
  r.mutable_tools(1)->set_strict(true);
  EXPECT_TRUE(ConstrainsToolCalls(r));
  const nlohmann::json triggered = nlohmann::json::parse(ToolCallStructuralTag(r));
  EXPECT_EQ(triggered["format"]["type"], "triggered_tags");
  EXPECT_EQ(triggered["format"]["triggers"], nlohmann::json::array({"<tool_call>"}));
  EXPECT_EQ(triggered["format"]["tags"].size(), 2u);
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_NONE);
  EXPECT_FALSE(ConstrainsToolCalls(r));
  // A call written as ToolCallText parses back.
  const ParsedOutput out =
      ParseToolCalls(ToolCallText("add", R"({"a": 1})"), {"add"});
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0], (ParsedToolCall{"add", R"({"a":1})"}));
}

TEST(NewToolCallIdTest, IsCallAnd24Alphanumerics) {
  const std::string a = NewToolCallId();
  EXPECT_THAT(a, ::testing::MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_NE(a, NewToolCallId());
}

TEST(NewToolCallIdTest, MistralIdsAre9Alphanumerics) {
  const std::string a = NewToolCallId(ToolCallFormat::kMistral);
  EXPECT_THAT(a, ::testing::MatchesRegex("[A-Za-z0-9]{9}"));
  EXPECT_NE(a, NewToolCallId(ToolCallFormat::kMistral));
  EXPECT_THAT(NewToolCallId(ToolCallFormat::kLlama3Json),
              ::testing::MatchesRegex("call_[A-Za-z0-9]{24}"));
}

// A parse expected of one output in one format: its content and calls.
struct FormatCase {
  std::string what;
  std::string text;
  std::optional<std::string> content;
  std::vector<ParsedToolCall> calls;
};

void ExpectCases(ToolCallFormat format, const std::vector<FormatCase>& cases) {
  for (const FormatCase& c : cases) {
    const ParsedOutput out = ParseToolCalls(c.text, kNames, format);
    EXPECT_EQ(out.content, c.content) << c.what;
    EXPECT_EQ(out.calls, c.calls) << c.what;
    ExpectSameWhateverTheSplit(c.text, format);
  }
}

TEST(ToolCallParserTest, Llama3Json) {
  const ParsedToolCall weather{"get_weather", R"({"city":"Oslo","unit":"celsius"})"};
  const ParsedToolCall add{"add", R"({"a":2,"b":3})"};
  const std::string weather_text =
      R"({"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}})";
  const std::string add_text = R"({"name": "add", "parameters": {"a": 2, "b": 3}})";
  ExpectCases(
      ToolCallFormat::kLlama3Json,
      {
          {"one call", weather_text, std::nullopt, {weather}},
          {"whitespace around", "\n " + weather_text + " \n", std::nullopt, {weather}},
          {"after <|python_tag|>", "<|python_tag|>" + add_text, std::nullopt, {add}},
          {"\"arguments\" spelling", R"({"name": "add", "arguments": {"a": 2, "b": 3}})",
           std::nullopt, {add}},
          {"braces and escapes inside strings",
           R"({"name": "get_weather", "parameters": {"city": "}{\"]", "unit": "celsius"}})",
           std::nullopt, {{"get_weather", R"({"city":"}{\"]","unit":"celsius"})"}}},
          {"several separated by ;", weather_text + "; " + add_text + ";" + add_text,
           std::nullopt, {weather, add, add}},
          {"text after a call is content", add_text + "\nDone.", "Done.", {add}},
          {"a ; not followed by a call is content", add_text + " ; and more", "; and more",
           {add}},
          {"text first: all content", "Sure. " + add_text, "Sure. " + add_text, {}},
          {"plain text unchanged", "  It is {warm} today; { no call }  ",
           "  It is {warm} today; { no call }  ", {}},
          {"an unknown function stays content",
           R"( {"name": "nope", "parameters": {}})", R"( {"name": "nope", "parameters": {}})",
           {}},
          {"malformed JSON stays content", R"({"name": "add", "parameters": {"a": }})",
           R"({"name": "add", "parameters": {"a": }})", {}},
          {"cut off stays content", R"(<|python_tag|>{"name": "add", "parameters": {"a": 2)",
           R"(<|python_tag|>{"name": "add", "parameters": {"a": 2)", {}},
          {"a bad call after a good one", add_text + R"(; {"name": "nope"})",
           R"(; {"name": "nope"})", {add}},
          {"a prefix of the python tag only", "<|python", "<|python", {}},
          {"no parameters is {}", R"({"name": "add"})", std::nullopt, {{"add", "{}"}}},
      });
}

TEST(ToolCallParserTest, Llama3JsonStreamsContentAtOnceAndHoldsACall) {
  ToolCallParser text(kNames, ToolCallFormat::kLlama3Json);
  std::vector<ToolCallParser::Piece> a = text.Feed("Hello");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].content, "Hello");
  ToolCallParser call(kNames, ToolCallFormat::kLlama3Json);
  EXPECT_TRUE(call.Feed(R"({"name": "add", "parameters": {"a": 1)").empty());
  std::vector<ToolCallParser::Piece> b = call.Feed("}}");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].call, (ParsedToolCall{"add", R"({"a":1})"}));
  EXPECT_EQ(call.calls(), 1);
}

TEST(ToolCallParserTest, Mistral) {
  const ParsedToolCall weather{"get_weather", R"({"city":"Oslo","unit":"celsius"})"};
  const ParsedToolCall add{"add", R"({"a":2,"b":3})"};
  ExpectCases(
      ToolCallFormat::kMistral,
      {
          {"one call",
           R"([TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}])", std::nullopt,
           {add}},
          {"no space, two calls",
           R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", )"
           R"("unit": "celsius"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}])",
           std::nullopt, {weather, add}},
          {"text before and after",
           "Let me see.\n[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]"
           "\n Done.",
           "Let me see.Done.", {add}},
          {"two blocks",
           R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}])"
           R"([TOOL_CALLS][{"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}])",
           std::nullopt, {add, add}},
          {"one object without a list",
           R"([TOOL_CALLS] {"name": "add", "arguments": {"a": 2, "b": 3}})", std::nullopt,
           {add}},
          {"an id beside the call is ignored",
           R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcDEF123"}])",
           std::nullopt, {add}},
          {"brackets inside strings",
           R"([TOOL_CALLS][{"name": "get_weather", )"
           R"("arguments": {"city": "]}[", "unit": "celsius"}}])",
           std::nullopt, {{"get_weather", R"({"city":"]}[","unit":"celsius"})"}}},
          {"an unknown function: the whole block stays content",
           R"(A [TOOL_CALLS][{"name": "add", "arguments": {}}, )"
           R"({"name": "nope", "arguments": {}}] B)",
           R"(A [TOOL_CALLS][{"name": "add", "arguments": {}}, )"
           R"({"name": "nope", "arguments": {}}] B)",
           {}},
          {"malformed stays content", R"([TOOL_CALLS][{"name": "add", "arguments": {"a": }])",
           R"([TOOL_CALLS][{"name": "add", "arguments": {"a": }])", {}},
          {"cut off stays content", R"(x [TOOL_CALLS] [{"name": "add", "argu)",
           R"(x [TOOL_CALLS] [{"name": "add", "argu)", {}},
          {"a marker without a list", "[TOOL_CALLS] nothing", "[TOOL_CALLS] nothing", {}},
          {"an empty list", "[TOOL_CALLS] []", "[TOOL_CALLS] []", {}},
          {"plain text, a marker's prefix", "see [TOOL_ and [x]", "see [TOOL_ and [x]", {}},
          {"a bad block beside a good one",
           R"([TOOL_CALLS][{"name": "nope", "arguments": {}}] )"
           R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}])",
           R"([TOOL_CALLS][{"name": "nope", "arguments": {}}])", {add}},
      });
}

TEST(ToolCallFormatTest, ChosenFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOfTemplate("{% if tools %}<tool_call>{% endif %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]["),
            ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOfTemplate("{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]"), std::nullopt);
  EXPECT_EQ(ToolCallFormatOfTemplate(
                "<|start_header_id|>{{ tools }}{\"name\": \"' + n + '\", \"parameters\": "),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOfTemplate("<|start_header_id|>{{ tools }} functools"), std::nullopt);
}

TEST(ToolCallStructuralTagTest, EachFormatsCallsAndSeparators) {
  v1::GenerateRequest r = ChatWithTools();
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_REQUIRED);
  const nlohmann::json llama =
      nlohmann::json::parse(ToolCallStructuralTag(r, ToolCallFormat::kLlama3Json));
  EXPECT_EQ(llama["format"]["type"], "tags_with_separator");
  EXPECT_EQ(llama["format"]["separator"], "; ");
  EXPECT_EQ(llama["format"]["tags"][0]["begin"], "{\"name\": \"get_weather\", \"parameters\": ");
  EXPECT_EQ(llama["format"]["tags"][0]["end"], "}");
  const nlohmann::json mistral =
      nlohmann::json::parse(ToolCallStructuralTag(r, ToolCallFormat::kMistral));
  EXPECT_EQ(mistral["format"]["type"], "sequence");
  const nlohmann::json& elements = mistral["format"]["elements"];
  ASSERT_EQ(elements.size(), 3u);
  EXPECT_EQ(elements[0]["value"], "[TOOL_CALLS][");
  EXPECT_EQ(elements[1]["separator"], ", ");
  EXPECT_EQ(elements[1]["tags"][1]["begin"], "{\"name\": \"add\", \"arguments\": ");
  EXPECT_EQ(elements[2]["value"], "]");
  r.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_AUTO);
  r.mutable_tools(0)->set_strict(true);
  const nlohmann::json llama_auto =
      nlohmann::json::parse(ToolCallStructuralTag(r, ToolCallFormat::kLlama3Json));
  EXPECT_EQ(llama_auto["format"]["triggers"], nlohmann::json::array({"{\"name\": "}));
  const nlohmann::json mistral_auto =
      nlohmann::json::parse(ToolCallStructuralTag(r, ToolCallFormat::kMistral));
  EXPECT_EQ(mistral_auto["format"]["triggers"], nlohmann::json::array({"[TOOL_CALLS]"}));
  EXPECT_EQ(mistral_auto["format"]["tags"][1]["begin"],
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": ");
  EXPECT_EQ(mistral_auto["format"]["tags"][1]["end"], "}]");
}

}  // namespace
}  // namespace tandem::router
