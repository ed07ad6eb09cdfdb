#include "router/server/tool_calls.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_conversion.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using ojson = nlohmann::ordered_json;

absl::Status Invalid(const std::string& param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat("'", param, "' ", message)), param);
}

bool ValidName(absl::string_view name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
         });
}

ojson ParseJson(absl::string_view text) {
  return ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// A tool's parameters schema, {"type": "object"} when it has none.
ojson Parameters(const v1::Tool& tool) {
  if (tool.parameters().empty()) return ojson{{"type", "object"}};
  return ParseJson(tool.parameters());
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first non-whitespace position of `text` at or after `from`; npos when there is none.
size_t SkipSpace(absl::string_view text, size_t from) {
  while (from < text.size() && IsSpace(text[from])) ++from;
  return from < text.size() ? from : absl::string_view::npos;
}

// Where the JSON list or object that opens at text[start] ('[' or '{') closes: the position
// after its closing bracket, strings (and their escapes) skipped; npos while it is still open.
// The brackets are counted without telling '[' from '{': a mismatched text ends somewhere and
// then fails to parse.
size_t JsonValueEnd(absl::string_view text, size_t start) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  return absl::string_view::npos;
}

// A JSON value as a call of one of `names`, or nullopt.
std::optional<ParsedToolCall> CallFromJson(const ojson& j,
                                           const absl::flat_hash_set<std::string>& names) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || !names.contains(name->get<std::string>())) {
    return std::nullopt;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) return ParsedToolCall{name->get<std::string>(), "{}"};
  if (args->is_object()) return ParsedToolCall{name->get<std::string>(), Dump(*args)};
  // Arguments given as the text of an object (OpenAI's own spelling).
  if (args->is_string() && ParseJson(args->get<std::string>()).is_object()) {
    return ParsedToolCall{name->get<std::string>(), Dump(ParseJson(args->get<std::string>()))};
  }
  return std::nullopt;
}

}  // namespace

std::optional<ToolCallFormat> ToolCallFormatOfTemplate(absl::string_view jinja) {
  if (absl::StrContains(jinja, kToolCallBegin)) return ToolCallFormat::kHermes;
  if (absl::StrContains(jinja, kMistralToolCalls) && !absl::StrContains(jinja, "[ARGS]")) {
    return ToolCallFormat::kMistral;
  }
  if (absl::StrContains(jinja, "<|start_header_id|>") &&
      absl::StrContains(jinja, "\"parameters\"")) {
    return ToolCallFormat::kLlama3Json;
  }
  return std::nullopt;
}

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "unknown";
}

v1::ToolChoice::Mode EffectiveToolChoice(const v1::GenerateRequest& request) {
  const v1::ToolChoice::Mode mode = request.tool_choice().mode();
  if (mode != v1::ToolChoice::MODE_UNSPECIFIED) return mode;
  return request.tools().empty() ? v1::ToolChoice::MODE_NONE : v1::ToolChoice::MODE_AUTO;
}

bool ParsesToolCalls(const v1::GenerateRequest& request) {
  return !request.tools().empty() && EffectiveToolChoice(request) != v1::ToolChoice::MODE_NONE;
}

bool ConstrainsToolCalls(const v1::GenerateRequest& request) {
  switch (EffectiveToolChoice(request)) {
    case v1::ToolChoice::MODE_REQUIRED:
    case v1::ToolChoice::MODE_FUNCTION:
      return true;
    case v1::ToolChoice::MODE_AUTO:
      return std::any_of(request.tools().begin(), request.tools().end(),
                         [](const v1::Tool& t) { return t.strict(); });
    default:
      return false;
  }
}

absl::flat_hash_set<std::string> ToolNames(const v1::GenerateRequest& request) {
  absl::flat_hash_set<std::string> names;
  for (const v1::Tool& t : request.tools()) names.insert(t.name());
  return names;
}

absl::Status ValidateTools(const v1::GenerateRequest& request) {
  if (!request.tools().empty() && !request.has_chat()) {
    return Invalid("tools", "go with chat messages only");
  }
  if (request.tools_size() > kMaxTools) {
    return Invalid("tools", absl::StrCat("may hold at most ", kMaxTools, " functions, not ",
                                         request.tools_size()));
  }
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < request.tools_size(); ++i) {
    const v1::Tool& t = request.tools(i);
    const std::string at = absl::StrCat("tools[", i, "].function");
    if (!ValidName(t.name())) {
      return Invalid(at + ".name", absl::StrCat("must be 1 to 64 characters of a-z, A-Z, 0-9, _ "
                                                "and -, not '", t.name(), "'"));
    }
    if (!names.insert(t.name()).second) {
      return Invalid(at + ".name", absl::StrCat("'", t.name(), "' names two tools"));
    }
    if (!t.parameters().empty() && !ParseJson(t.parameters()).is_object()) {
      return Invalid(at + ".parameters", "must be a JSON Schema object");
    }
  }
  const v1::ToolChoice& choice = request.tool_choice();
  const v1::ToolChoice::Mode mode = choice.mode();
  if (mode != v1::ToolChoice::MODE_FUNCTION && !choice.function_name().empty()) {
    return Invalid("tool_choice", "names a function only with the function form");
  }
  if ((mode == v1::ToolChoice::MODE_AUTO || mode == v1::ToolChoice::MODE_REQUIRED ||
       mode == v1::ToolChoice::MODE_FUNCTION) &&
      request.tools().empty()) {
    return Invalid("tool_choice", "needs 'tools'");
  }
  if (mode == v1::ToolChoice::MODE_FUNCTION && !names.contains(choice.function_name())) {
    return Invalid("tool_choice.function.name",
                   absl::StrCat("'", choice.function_name(), "' is not one of the tools"));
  }
  if (mode < v1::ToolChoice::MODE_UNSPECIFIED || mode > v1::ToolChoice::MODE_FUNCTION) {
    return Invalid("tool_choice", absl::StrCat("has an unknown mode ", static_cast<int>(mode)));
  }
  if (request.has_parallel_tool_calls() && request.tools().empty()) {
    return Invalid("parallel_tool_calls", "is only allowed with 'tools'");
  }
  if (ConstrainsToolCalls(request) && request.sampling().has_response_format() &&
      request.sampling().response_format().format_case() !=
          v1::ResponseFormat::FORMAT_NOT_SET) {
    return Invalid("response_format", "cannot be combined with tool_choice \"required\", a "
                                      "named function or strict tools (the calls' grammar is the "
                                      "format)");
  }
  for (int i = 0; i < request.chat().messages_size(); ++i) {
    const v1::ChatMessage& m = request.chat().messages(i);
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.tool_calls().empty() && m.role() != "assistant") {
      return Invalid(at + ".tool_calls", "belong to an assistant message");
    }
    for (int j = 0; j < m.tool_calls_size(); ++j) {
      const v1::ToolCall& c = m.tool_calls(j);
      const std::string call_at = absl::StrCat(at, ".tool_calls[", j, "]");
      if (c.id().empty()) return Invalid(call_at + ".id", "must be a non-empty string");
      if (!ValidName(c.name())) {
        return Invalid(call_at + ".function.name", "must be a function name");
      }
      if (!ParseJson(c.arguments()).is_object()) {
        return Invalid(call_at + ".function.arguments", "must be the text of a JSON object");
      }
    }
    if (m.role() == "tool" && m.tool_call_id().empty()) {
      return Invalid(at + ".tool_call_id", "is required for a tool message");
    }
    if (m.role() != "tool" && !m.tool_call_id().empty()) {
      return Invalid(at + ".tool_call_id", "belongs to a tool message");
    }
  }
  return absl::OkStatus();
}

std::string ToolCallStructuralTag(const v1::GenerateRequest& request, ToolCallFormat format) {
  const bool named = request.tool_choice().mode() == v1::ToolChoice::MODE_FUNCTION;
  const bool parallel = !request.has_parallel_tool_calls() || request.parallel_tool_calls();
  const bool automatic = EffectiveToolChoice(request) == v1::ToolChoice::MODE_AUTO;
  // One call's begin (up to its arguments) and end, the separator between calls, and under AUTO
  // the trigger that starts a call. kMistral under AUTO: each call its own one-call list.
  std::string begin_prefix, args_key = "arguments", end, separator, trigger;
  switch (format) {
    case ToolCallFormat::kHermes:
      begin_prefix = absl::StrCat(kToolCallBegin, "\n");
      end = absl::StrCat("}\n", kToolCallEnd);
      separator = "\n";
      trigger = std::string(kToolCallBegin);
      break;
    case ToolCallFormat::kLlama3Json:
      args_key = "parameters";
      end = "}";
      separator = "; ";
      trigger = "{\"name\": ";
      break;
    case ToolCallFormat::kMistral:
      begin_prefix = automatic ? absl::StrCat(kMistralToolCalls, "[") : "";
      end = automatic ? "}]" : "}";
      separator = ", ";
      trigger = std::string(kMistralToolCalls);
      break;
  }
  ojson tags = ojson::array();
  for (const v1::Tool& t : request.tools()) {
    if (named && t.name() != request.tool_choice().function_name()) continue;
    tags.push_back({{"type", "tag"},
                    {"begin", absl::StrCat(begin_prefix, "{\"name\": ", Dump(ojson(t.name())),
                                           ", \"", args_key, "\": ")},
                    // At most one whitespace character in a row: a small model cannot stall in
                    // whitespace.
                    {"content",
                     {{"type", "json_schema"}, {"json_schema", Parameters(t)},
                      {"max_whitespace_cnt", 1}}},
                    {"end", end}});
  }
  if (automatic) {
    return Dump(ojson{{"type", "structural_tag"},
                      {"format",
                       {{"type", "triggered_tags"},
                        {"triggers", ojson::array({trigger})},
                        {"tags", std::move(tags)},
                        {"at_least_one", false},
                        {"stop_after_first", !parallel}}}});
  }
  ojson calls = {{"type", "tags_with_separator"},
                 {"tags", std::move(tags)},
                 {"separator", separator},
                 {"at_least_one", true},
                 {"stop_after_first", !parallel}};
  if (format == ToolCallFormat::kMistral) {
    // One list: "[TOOL_CALLS][" call, call, ... "]".
    calls = {{"type", "sequence"},
             {"elements",
              ojson::array({ojson{{"type", "const_string"},
                                  {"value", absl::StrCat(kMistralToolCalls, "[")}},
                            std::move(calls),
                            ojson{{"type", "const_string"}, {"value", "]"}}})}};
  }
  return Dump(ojson{{"type", "structural_tag"}, {"format", std::move(calls)}});
}

std::string ToolsJson(const google::protobuf::RepeatedPtrField<v1::Tool>& tools) {
  ojson list = ojson::array();
  for (const v1::Tool& t : tools) {
    ojson function = {{"name", t.name()}};
    if (!t.description().empty()) function["description"] = t.description();
    if (!t.parameters().empty()) function["parameters"] = ParseJson(t.parameters());
    list.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return Dump(list);
}

std::string FallbackToolsPrompt(const google::protobuf::RepeatedPtrField<v1::Tool>& tools) {
  std::string out =
      "You can call functions to answer. Each function's signature is a JSON object on its own "
      "line between <tools> and </tools>:\n<tools>\n";
  const ojson list = ParseJson(ToolsJson(tools));
  for (const ojson& t : list) absl::StrAppend(&out, Dump(t), "\n");
  absl::StrAppend(
      &out,
      "</tools>\n\nTo call a function, answer with a JSON object holding the function's name "
      "and its arguments between <tool_call> and </tool_call>, one call per pair:\n"
      "<tool_call>\n{\"name\": \"<the function's name>\", \"arguments\": {<the arguments>}}\n"
      "</tool_call>\nWhen no function helps, answer in plain text.");
  return out;
}

std::string ToolCallText(absl::string_view name, absl::string_view arguments) {
  return absl::StrCat(kToolCallBegin, "\n{\"name\": ", Dump(ojson(std::string(name))),
                      ", \"arguments\": ", arguments, "}\n", kToolCallEnd);
}

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr absl::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen bits;
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) {
    id += kAlphabet[absl::Uniform<size_t>(bits, 0, kAlphabet.size())];
  }
  return id;
}

void ToolCallParser::EmitContent(absl::string_view text, std::vector<Piece>* out) {
  if (text.empty()) return;
  if (!out->empty() && !out->back().call.has_value()) {
    out->back().content.append(text.data(), text.size());
  } else {
    out->push_back({std::string(text), std::nullopt});
  }
}

absl::string_view ToolCallParser::marker() const {
  return format_ == ToolCallFormat::kMistral ? kMistralToolCalls : kToolCallBegin;
}

bool ToolCallParser::FindBlockEnd(size_t* body_end, size_t* block_end) const {
  if (format_ == ToolCallFormat::kHermes) {
    const size_t end = pending_.find(kToolCallEnd.data(), 0, kToolCallEnd.size());
    if (end == std::string::npos) return false;
    *body_end = end;
    *block_end = end + kToolCallEnd.size();
    return true;
  }
  // kMistral: whitespace, then a list or object that ends where its brackets close. Anything
  // else ends the block right there (an empty body: content).
  const size_t first = SkipSpace(pending_, 0);
  if (first == absl::string_view::npos) return false;
  if (pending_[first] != '[' && pending_[first] != '{') {
    *body_end = *block_end = first;
    return true;
  }
  const size_t end = JsonValueEnd(pending_, first);
  if (end == absl::string_view::npos) return false;
  *body_end = *block_end = end;
  return true;
}

std::optional<std::vector<ParsedToolCall>> ToolCallParser::ParseBlock(
    absl::string_view body) const {
  const ojson j = ParseJson(body);
  std::vector<ParsedToolCall> calls;
  if (format_ == ToolCallFormat::kMistral && j.is_array()) {
    for (const ojson& item : j) {
      std::optional<ParsedToolCall> call = CallFromJson(item, names_);
      if (!call.has_value()) return std::nullopt;
      calls.push_back(*std::move(call));
    }
    if (calls.empty()) return std::nullopt;
    return calls;
  }
  std::optional<ParsedToolCall> call = CallFromJson(j, names_);
  if (!call.has_value()) return std::nullopt;
  calls.push_back(*std::move(call));
  return calls;
}

std::vector<ToolCallParser::Piece> ToolCallParser::Feed(absl::string_view text) {
  pending_.append(text.data(), text.size());
  std::vector<Piece> out;
  if (format_ == ToolCallFormat::kLlama3Json) {
    FeedLlama(&out);
  } else {
    FeedMarked(&out);
  }
  return out;
}

void ToolCallParser::FeedMarked(std::vector<Piece>* out) {
  const absl::string_view begin_marker = marker();
  while (true) {
    if (in_call_) {
      size_t body_end = 0, block_end = 0;
      if (!FindBlockEnd(&body_end, &block_end)) return;
      const absl::string_view body = absl::string_view(pending_).substr(0, body_end);
      if (std::optional<std::vector<ParsedToolCall>> calls = ParseBlock(body); calls.has_value()) {
        for (ParsedToolCall& c : *calls) out->push_back({"", std::move(c)});
        calls_ += static_cast<int>(calls->size());
        after_call_ = true;
      } else {
        EmitContent(absl::StrCat(ws_before_call_, begin_marker,
                                 absl::string_view(pending_).substr(0, block_end)),
                    out);
      }
      ws_before_call_.clear();
      pending_.erase(0, block_end);
      in_call_ = false;
      continue;
    }
    if (after_call_) {
      const auto first = std::find_if(pending_.begin(), pending_.end(),
                                       [](char c) { return !IsSpace(c); });
      pending_.erase(pending_.begin(), first);
      if (pending_.empty()) return;
      after_call_ = false;
    }
    if (const size_t begin = pending_.find(begin_marker.data(), 0, begin_marker.size());
        begin != std::string::npos) {
      size_t content_end = begin;
      while (content_end > 0 && IsSpace(pending_[content_end - 1])) --content_end;
      EmitContent(absl::string_view(pending_).substr(0, content_end), out);
      ws_before_call_ = pending_.substr(content_end, begin - content_end);
      pending_.erase(0, begin + begin_marker.size());
      in_call_ = true;
      continue;
    }
    // Hold back a possible start of a marker, and the whitespace before it.
    size_t hold = pending_.size();
    for (size_t k = std::min(pending_.size(), begin_marker.size() - 1); k > 0; --k) {
      if (absl::EndsWith(pending_, begin_marker.substr(0, k))) {
        hold = pending_.size() - k;
        break;
      }
    }
    while (hold > 0 && IsSpace(pending_[hold - 1])) --hold;
    EmitContent(absl::string_view(pending_).substr(0, hold), out);
    pending_.erase(0, hold);
    return;
  }
}

void ToolCallParser::FeedLlama(std::vector<Piece>* out) {
  while (true) {
    if (llama_phase_ == LlamaPhase::kContent) {
      EmitContent(pending_, out);
      pending_.clear();
      return;
    }
    const size_t first = SkipSpace(pending_, 0);
    if (first == absl::string_view::npos) return;  // whitespace only: wait
    size_t object = absl::string_view::npos;       // where the call's object opens
    if (llama_phase_ == LlamaPhase::kAfterCall) {
      if (pending_[first] == ';') object = SkipSpace(pending_, first + 1);
      if (pending_[first] == ';' && object == absl::string_view::npos) return;
    } else if (pending_[first] == '{') {
      object = first;
    } else if (absl::StartsWith(absl::string_view(pending_).substr(first), kLlamaPythonTag)) {
      object = SkipSpace(pending_, first + kLlamaPythonTag.size());
      if (object == absl::string_view::npos) return;
    } else if (absl::StartsWith(kLlamaPythonTag, absl::string_view(pending_).substr(first))) {
      return;  // may still become <|python_tag|>
    }
    size_t end = absl::string_view::npos;
    if (object != absl::string_view::npos && pending_[object] == '{') {
      end = JsonValueEnd(pending_, object);
      if (end == absl::string_view::npos) return;  // the object is still being written
      std::optional<ParsedToolCall> call = CallFromJson(
          ParseJson(absl::string_view(pending_).substr(object, end - object)), names_);
      if (call.has_value()) {
        out->push_back({"", *std::move(call)});
        ++calls_;
        pending_.erase(0, end);
        llama_phase_ = LlamaPhase::kAfterCall;
        continue;
      }
    }
    // Not a call: content from here on (after a call, without the whitespace that follows it).
    if (llama_phase_ == LlamaPhase::kAfterCall) pending_.erase(0, first);
    llama_phase_ = LlamaPhase::kContent;
  }
}

std::vector<ToolCallParser::Piece> ToolCallParser::Finish() {
  std::vector<Piece> out;
  if (in_call_) {
    EmitContent(absl::StrCat(ws_before_call_, marker(), pending_), &out);
  } else if (format_ == ToolCallFormat::kLlama3Json &&
             llama_phase_ == LlamaPhase::kAfterCall) {
    const size_t first = SkipSpace(pending_, 0);
    if (first != absl::string_view::npos) EmitContent(pending_.substr(first), &out);
  } else {
    EmitContent(pending_, &out);
  }
  pending_.clear();
  ws_before_call_.clear();
  in_call_ = false;
  after_call_ = false;
  llama_phase_ = LlamaPhase::kContent;
  return out;
}

ParsedOutput ParseToolCalls(absl::string_view text, const absl::flat_hash_set<std::string>& names,
                            ToolCallFormat format) {
  ToolCallParser parser(names, format);
  std::vector<ToolCallParser::Piece> pieces = parser.Feed(text);
  for (ToolCallParser::Piece& p : parser.Finish()) pieces.push_back(std::move(p));
  ParsedOutput out;
  std::string content;
  for (ToolCallParser::Piece& p : pieces) {
    if (p.call.has_value()) {
      out.calls.push_back(*std::move(p.call));
    } else {
      content += p.content;
    }
  }
  if (!content.empty() || out.calls.empty()) out.content = std::move(content);
  return out;
}

}  // namespace tandem::router
