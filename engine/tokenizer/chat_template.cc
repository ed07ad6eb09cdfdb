#include "engine/tokenizer/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

bool IsKnownRole(absl::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

// Python's str.isspace(), which Jinja's `trim` filter (str.strip()) uses.
bool IsPythonSpace(char32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) ||
         (cp != kInvalidCodepoint && (CodepointClass(cp) & kUnicodeWhitespace));
}

std::string PythonStrip(absl::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    char32_t cp;
    const int len = DecodeUtf8(s, begin, &cp);
    if (!IsPythonSpace(cp)) break;
    begin += len;
  }
  size_t end = begin;
  size_t pos = begin;
  while (pos < s.size()) {
    char32_t cp;
    const int len = DecodeUtf8(s, pos, &cp);
    pos += len;
    if (!IsPythonSpace(cp)) end = pos;
  }
  return std::string(s.substr(begin, end - begin));
}

jinja::Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return jinja::Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return jinja::Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return jinja::Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return jinja::Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return jinja::Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::ValueList list;
      for (const auto& item : j) list.push_back(FromJson(item));
      return jinja::Value::List(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::ValueDict dict;
      for (const auto& [key, value] : j.items()) dict.Set(key, FromJson(value));
      return jinja::Value::Dict(std::move(dict));
    }
    default:
      return jinja::Value::None();
  }
}

}  // namespace

absl::StatusOr<jinja::Value> JinjaValueFromJson(absl::string_view json) {
  const auto j = nlohmann::ordered_json::parse(json.begin(), json.end(), nullptr,
                                               /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", json.substr(0, 80)));
  }
  return FromJson(j);
}

ChatTemplate ChatTemplate::Of(ChatTemplateKind kind, std::string default_system) {
  CHECK(kind != ChatTemplateKind::kJinja) << "ChatTemplate::Of takes a built-in kind";
  return ChatTemplate(kind, std::move(default_system));
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForModel(const Tokenizer& tokenizer) {
  const std::string& jinja = tokenizer.data().chat_template;
  if (!jinja.empty()) return FromJinja(jinja);
  const auto has = [&](absl::string_view token) { return tokenizer.TokenToId(token) >= 0; };
  if (has("<|im_start|>") && has("<|im_end|>")) return Of(ChatTemplateKind::kChatMl);
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) {
    return Of(ChatTemplateKind::kLlama3);
  }
  return absl::NotFoundError(
      "chat template: the model has no chat template (tokenizer.chat_template), and its "
      "vocabulary has neither ChatML (<|im_start|>, <|im_end|>) nor Llama 3 "
      "(<|start_header_id|>, <|end_header_id|>, <|eot_id|>) tokens; give the prompt as plain "
      "text instead");
}

ChatTemplate::RenderOptions ChatTemplate::OptionsFor(const Tokenizer& tokenizer) {
  RenderOptions options;
  options.add_generation_prompt = true;
  if (tokenizer.bos_id() >= 0) options.bos_token = tokenizer.TokenBytes(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) options.eos_token = tokenizer.TokenBytes(tokenizer.eos_id());
  return options;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(absl::string_view jinja) {
  if (jinja.empty()) {
    return absl::InvalidArgumentError("chat template: the template is empty");
  }
  absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(jinja);
  if (parsed.ok()) {
    ChatTemplate t(ChatTemplateKind::kJinja, "");
    t.jinja_ = *std::move(parsed);
    return t;
  }
  absl::StatusOr<ChatTemplate> builtin = Recognize(jinja);
  if (!builtin.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template: the model's template does not parse (", parsed.status().message(),
        ") and is not one the built-in renderers reproduce (", builtin.status().message(),
        ")"));
  }
  builtin->fallback_reason_ = std::string(parsed.status().message());
  LOG(WARNING) << "the model's chat template does not parse (" << parsed.status().message()
               << "); using the built-in "
               << (builtin->kind() == ChatTemplateKind::kLlama3 ? "Llama 3" : "ChatML")
               << " renderer, which reproduces it";
  return builtin;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Recognize(absl::string_view jinja) {
  if (jinja.empty()) {
    return absl::InvalidArgumentError("chat template: the model has no chat template");
  }
  if (absl::StrContains(jinja, "<|start_header_id|>") &&
      absl::StrContains(jinja, "<|end_header_id|>") && absl::StrContains(jinja, "<|eot_id|>")) {
    // Llama 3.1 and later add a dated system preamble and tool calls.
    if (absl::StrContains(jinja, "tools") || absl::StrContains(jinja, "Cutting Knowledge")) {
      return absl::UnimplementedError(
          "chat template: Llama 3.1+ templates (tools, dated system preamble) are not "
          "supported; only the Llama 3 template is");
    }
    return Of(ChatTemplateKind::kLlama3);
  }
  if (absl::StrContains(jinja, "<|im_start|>") && absl::StrContains(jinja, "<|im_end|>")) {
    // A default system message: "{% if loop.first and messages[0]['role'] != 'system' %}
    // {{ '<|im_start|>system\n...<|im_end|>\n' }}{% endif %}".
    std::string default_system;
    constexpr absl::string_view kOpen = "<|im_start|>system\n";
    const size_t cond = jinja.find("messages[0]['role'] != 'system'");
    if (cond != absl::string_view::npos) {
      const size_t open = jinja.find(kOpen, cond);
      const size_t close =
          open == absl::string_view::npos ? open : jinja.find("<|im_end|>", open);
      if (close != absl::string_view::npos) {
        const absl::string_view text =
            jinja.substr(open + kOpen.size(), close - open - kOpen.size());
        // Only literal text; a template that computes the message is not understood.
        if (absl::StrContains(text, "{") || absl::StrContains(text, "'")) {
          return absl::UnimplementedError(
              "chat template: ChatML template with a computed default system message is not "
              "supported");
        }
        default_system = std::string(text);
      }
    }
    // Other logic around system messages or tools (e.g. Qwen2.5's) is not understood: refuse
    // rather than render something the model was not trained on.
    if ((default_system.empty() && absl::StrContains(jinja, "<|im_start|>system")) ||
        absl::StrContains(jinja, "tools")) {
      return absl::UnimplementedError(
          "chat template: this ChatML variant (tools or conditional system messages) is not "
          "supported; supported are plain ChatML, optionally with a fixed default system "
          "message");
    }
    return Of(ChatTemplateKind::kChatMl, std::move(default_system));
  }
  return absl::UnimplementedError(
      "chat template: unsupported template (supported: ChatML with <|im_start|>/<|im_end|>, "
      "Llama 3 with <|start_header_id|>/<|eot_id|>); give the prompt as plain text instead");
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const RenderOptions& options) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!IsKnownRole(messages[i].role)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template: message ", i, " has unknown role '", messages[i].role,
          "' (expected system, user, assistant or tool)"));
    }
  }
  if (kind_ != ChatTemplateKind::kJinja) return RenderBuiltin(messages, options);
  // The variables transformers' apply_chat_template passes.
  jinja::ValueList list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::ValueDict message;
    message.Set("role", jinja::Value::String(m.role));
    message.Set("content", m.content.empty() && !m.tool_calls.empty()
                               ? jinja::Value::None()
                               : jinja::Value::String(m.content));
    if (!m.tool_calls.empty()) {
      jinja::ValueList calls;
      for (const ChatToolCall& c : m.tool_calls) {
        absl::StatusOr<jinja::Value> arguments = JinjaValueFromJson(c.arguments);
        if (!arguments.ok() || !arguments->is_dict()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat template: the arguments of call '", c.id, "' are not a JSON object"));
        }
        jinja::ValueDict function;
        function.Set("name", jinja::Value::String(c.name));
        function.Set("arguments", *std::move(arguments));
        jinja::ValueDict call;
        call.Set("id", jinja::Value::String(c.id));
        call.Set("type", jinja::Value::String("function"));
        call.Set("function", jinja::Value::Dict(std::move(function)));
        calls.push_back(jinja::Value::Dict(std::move(call)));
      }
      message.Set("tool_calls", jinja::Value::List(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) message.Set("tool_call_id", jinja::Value::String(m.tool_call_id));
    if (!m.name.empty()) message.Set("name", jinja::Value::String(m.name));
    list.push_back(jinja::Value::Dict(std::move(message)));
  }
  jinja::ValueDict context;
  context.Set("messages", jinja::Value::List(std::move(list)));
  context.Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  context.Set("bos_token", jinja::Value::String(options.bos_token));
  context.Set("eos_token", jinja::Value::String(options.eos_token));
  if (options.tools.has_value()) context.Set("tools", *options.tools);
  absl::StatusOr<std::string> text = jinja_->Render(
      jinja::Value::Dict(std::move(context)), {.limits = options.limits, .now = options.now});
  if (!text.ok()) {
    // Whatever the template raised is about this conversation: the request is bad, not the
    // server (HTTP 400, whatever the engine's code was).
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ChatTemplate::RenderBuiltin(const std::vector<ChatMessage>& messages,
                                                        const RenderOptions& options) const {
  std::string out;
  switch (kind_) {
    case ChatTemplateKind::kChatMl:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && !default_system_.empty() && messages[0].role != "system") {
          absl::StrAppend(&out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
        }
        absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                        "<|im_end|>\n");
      }
      if (options.add_generation_prompt) absl::StrAppend(&out, "<|im_start|>assistant\n");
      break;
    case ChatTemplateKind::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += options.bos_token;
        absl::StrAppend(&out, "<|start_header_id|>", messages[i].role, "<|end_header_id|>\n\n",
                        PythonStrip(messages[i].content), "<|eot_id|>");
      }
      if (options.add_generation_prompt) {
        absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
      }
      break;
    case ChatTemplateKind::kJinja:
      return absl::InternalError("chat template: not a built-in renderer");
  }
  return out;
}

}  // namespace tandem
