#include "router/server/openai_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_conversion.h"
#include "common/status_macros.h"

namespace tandem::router {
namespace {

using nlohmann::json;
// Requests are read keeping their objects' key order (a JSON Schema's properties, a tool's
// parameters: the order the model is shown and generates).
using ojson = nlohmann::ordered_json;

// INVALID_ARGUMENT about the field `param`; the message names it.
absl::Status Invalid(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat("'", param, "' ", message)), param);
}

// A field Tandem does not implement, refused unless its value is the no-op one.
absl::Status Unsupported(absl::string_view param, absl::string_view why = "") {
  return Invalid(param, absl::StrCat("is not supported by Tandem", why.empty() ? "" : ": ", why));
}

bool Present(const ojson& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

// An optional integer field in [lo, hi]; nullopt when absent or null.
absl::StatusOr<std::optional<int64_t>> Int(const ojson& body, const char* key, int64_t lo,
                                           int64_t hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return Invalid(key, "must be an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(key, absl::StrCat("must be in [", lo, ", ", hi, "], not ", it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Invalid(key, absl::StrCat("must be in [", lo, ", ", hi, "], not ", v));
  }
  return v;
}

// An optional number field in [lo, hi] (open at lo when `open_lo`); nullopt when absent or null.
absl::StatusOr<std::optional<double>> Float(const ojson& body, const char* key, double lo, double hi,
                                            bool open_lo = false) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Invalid(key, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (open_lo && v == lo)) {
    return Invalid(key, absl::StrCat("must be in ", open_lo ? "(" : "[", lo, ", ", hi, "], not ",
                                     it->dump()));
  }
  return v;
}

absl::StatusOr<std::optional<bool>> Bool(const ojson& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Invalid(key, "must be a boolean");
  return it->get<bool>();
}

// The fields of each endpoint: OpenAI's (applied, or accepted with their no-op value only) and
// Tandem's extensions. Anything else is refused as unknown.
const absl::flat_hash_set<absl::string_view>& KnownFields(bool chat) {
  static const auto* completions = new absl::flat_hash_set<absl::string_view>{
      // OpenAI
      "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
      "max_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
      "stream_options", "suffix", "temperature", "top_p", "user",
      // Tandem (and vLLM's names)
      "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
      "priority", "slo"};
  static const auto* chat_fields = new absl::flat_hash_set<absl::string_view>{
      // OpenAI
      "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
      "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
      "n", "parallel_tool_calls", "prediction", "presence_penalty", "reasoning_effort",
      "response_format", "seed", "service_tier", "stop", "store", "stream", "stream_options",
      "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
      "web_search_options",
      // Tandem (and vLLM's names)
      "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
      "priority", "slo"};
  return chat ? *chat_fields : *completions;
}

// The legacy function-calling fields, which "tools" replaced: refused with the way forward.
absl::Status RefuseLegacyFunctions(const ojson& body, bool chat) {
  if (!chat) return absl::OkStatus();
  if (Present(body, "functions")) {
    return Unsupported("functions", "the legacy function-calling API; send 'tools'");
  }
  if (Present(body, "function_call")) {
    return Unsupported("function_call", "the legacy function-calling API; send 'tool_choice'");
  }
  return absl::OkStatus();
}

// A string field of `obj` at `path` into `out`; `required` refuses it absent or null.
absl::Status StringField(const ojson& obj, const char* key, const std::string& path,
                         bool required, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    return required ? Invalid(absl::StrCat(path, ".", key), "is required") : absl::OkStatus();
  }
  if (!it->is_string()) return Invalid(absl::StrCat(path, ".", key), "must be a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// Refuses keys of `obj` outside `known`, naming them under `path`.
absl::Status KnownKeys(const ojson& obj, std::initializer_list<absl::string_view> known,
                       const std::string& path) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Invalid(absl::StrCat(path, ".", key),
                     absl::StrCat("is not a field of ", path, " (", absl::StrJoin(known, ", "),
                                  ")"));
    }
  }
  return absl::OkStatus();
}

// Function calling: "tools", "tool_choice" and "parallel_tool_calls" into the request. Their
// consistency (names, tool_choice naming a tool, messages' calls) is checked by ValidateTools
// (router/server/tool_calls.h) when the router prepares the request, for gRPC clients too.
absl::Status ParseTools(const ojson& body, v1::GenerateRequest* r) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Invalid("tools", "must be an array of tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return Invalid(at, "must be an object with 'type' and 'function'");
      RETURN_IF_ERROR(KnownKeys(t, {"type", "function"}, at));
      if (t.value("type", ojson()) != "function") {
        return Invalid(at + ".type", "must be \"function\"");
      }
      auto f = t.find("function");
      if (f == t.end() || !f->is_object()) {
        return Invalid(at + ".function", "must be an object with 'name'");
      }
      const std::string fat = at + ".function";
      RETURN_IF_ERROR(KnownKeys(*f, {"name", "description", "parameters", "strict"}, fat));
      v1::Tool* tool = r->add_tools();
      RETURN_IF_ERROR(StringField(*f, "name", fat, /*required=*/true, tool->mutable_name()));
      RETURN_IF_ERROR(
          StringField(*f, "description", fat, /*required=*/false, tool->mutable_description()));
      if (auto p = f->find("parameters"); p != f->end() && !p->is_null()) {
        if (!p->is_object()) return Invalid(fat + ".parameters", "must be a JSON Schema object");
        tool->set_parameters(p->dump(-1, ' ', false, ojson::error_handler_t::replace));
      }
      if (auto strict = f->find("strict"); strict != f->end() && !strict->is_null()) {
        if (!strict->is_boolean()) return Invalid(fat + ".strict", "must be a boolean");
        tool->set_strict(strict->get<bool>());
      }
    }
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    v1::ToolChoice* c = r->mutable_tool_choice();
    if (*choice == "none") {
      c->set_mode(v1::ToolChoice::MODE_NONE);
    } else if (*choice == "auto") {
      c->set_mode(v1::ToolChoice::MODE_AUTO);
    } else if (*choice == "required") {
      c->set_mode(v1::ToolChoice::MODE_REQUIRED);
    } else if (choice->is_object()) {
      RETURN_IF_ERROR(KnownKeys(*choice, {"type", "function"}, "tool_choice"));
      if (choice->value("type", ojson()) != "function") {
        return Invalid("tool_choice.type", "must be \"function\"");
      }
      auto f = choice->find("function");
      if (f == choice->end() || !f->is_object()) {
        return Invalid("tool_choice.function", "must be an object with 'name'");
      }
      RETURN_IF_ERROR(KnownKeys(*f, {"name"}, "tool_choice.function"));
      RETURN_IF_ERROR(StringField(*f, "name", "tool_choice.function", /*required=*/true,
                                  c->mutable_function_name()));
      c->set_mode(v1::ToolChoice::MODE_FUNCTION);
    } else {
      return Invalid("tool_choice",
                     "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}");
    }
  }
  ASSIGN_OR_RETURN(std::optional<bool> parallel, Bool(body, "parallel_tool_calls"));
  if (parallel.has_value()) r->set_parallel_tool_calls(*parallel);
  return absl::OkStatus();
}

// OpenAI's response_format (structured output, both endpoints): {"type": "text"},
// {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}},
// into SamplingParams.response_format. The schema compiles on the worker, which answers
// INVALID_ARGUMENT (a 400) with the compiler's message when it cannot.
absl::Status ParseResponseFormat(const ojson& body, v1::SamplingParams* s) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  const ojson& f = *it;
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    return Invalid("response_format", "must be an object with a string 'type'");
  }
  const std::string type = f["type"].get<std::string>();
  for (const auto& [key, value] : f.items()) {
    if (key != "type" && !(key == "json_schema" && type == "json_schema")) {
      return Invalid(absl::StrCat("response_format.", key),
                     absl::StrCat("is not a field of a '", type, "' response_format"));
    }
  }
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    s->mutable_response_format()->mutable_json_object();
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Invalid("response_format.type",
                   absl::StrCat("must be 'text', 'json_object' or 'json_schema', not '", type, "'"));
  }
  auto js = f.find("json_schema");
  if (js == f.end() || !js->is_object()) {
    return Invalid("response_format.json_schema", "must be an object with 'name' and 'schema'");
  }
  for (const auto& [key, value] : js->items()) {
    if (key != "name" && key != "schema" && key != "strict" && key != "description") {
      return Invalid(absl::StrCat("response_format.json_schema.", key),
                     "is not a field of a json_schema (name, description, schema, strict)");
    }
  }
  auto name = js->find("name");
  if (name == js->end() || !name->is_string() || name->get<std::string>().empty()) {
    return Invalid("response_format.json_schema.name", "must be a non-empty string");
  }
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() &&
                                         !strict->is_boolean()) {
    return Invalid("response_format.json_schema.strict", "must be a boolean");
  }
  if (auto d = js->find("description"); d != js->end() && !d->is_null() && !d->is_string()) {
    return Invalid("response_format.json_schema.description", "must be a string");
  }
  // OpenAI lets the schema be left out: any JSON object then.
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) {
    s->mutable_response_format()->mutable_json_object();
    return absl::OkStatus();
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return Invalid("response_format.json_schema.schema", "must be a JSON Schema object");
  }
  s->mutable_response_format()->set_json_schema(schema->dump());
  return absl::OkStatus();
}

// Fields accepted only with the value that changes nothing.
absl::Status RefuseNonNoOps(const ojson& body, bool chat) {
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null() &&
                                         !(it->is_object() && it->empty())) {
    return Unsupported("logit_bias", "only {} or null");
  }
  if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string()) {
    return Invalid("user", "must be a string");
  }
  if (!chat) {
    if (auto it = body.find("suffix"); it != body.end() && !it->is_null() && *it != "") {
      return Unsupported("suffix", "insertion (fill in the middle) is not available");
    }
    return absl::OkStatus();
  }
  if (auto store = Bool(body, "store"); !store.ok()) {
    return store.status();
  } else if (store->value_or(false)) {
    return Unsupported("store", "completions are not stored (only false)");
  }
  if (auto it = body.find("metadata"); it != body.end() && !it->is_null() &&
                                       !(it->is_object() && it->empty())) {
    return Unsupported("metadata", "it goes with 'store', which is not supported");
  }
  if (auto it = body.find("service_tier"); it != body.end() && !it->is_null() &&
                                           *it != "auto" && *it != "default") {
    return Unsupported("service_tier", "only \"auto\" or \"default\"");
  }
  if (auto it = body.find("modalities"); it != body.end() && !it->is_null() &&
                                         *it != ojson::array({"text"})) {
    return Unsupported("modalities", "only [\"text\"]");
  }
  for (const char* key : {"audio", "prediction", "reasoning_effort", "web_search_options"}) {
    if (Present(body, key)) return Unsupported(key);
  }
  return absl::OkStatus();
}

// messages[i] into `out`.
absl::Status ParseMessage(const ojson& m, size_t i, v1::ChatMessage* out) {
  const std::string at = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return Invalid(at, "must be an object with 'role' and 'content'");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return Invalid(at + ".role", "must be a string");
  std::string r = role->get<std::string>();
  if (r == "developer") r = "system";  // OpenAI's newer name for the system role
  if (r == "function") {
    return Unsupported(at + ".role", "'function' messages are the legacy function-calling API; "
                                     "send 'tool' messages");
  }
  if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
    return Invalid(at + ".role", absl::StrCat("must be system, developer, user, assistant or "
                                              "tool, not '", r, "'"));
  }
  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content") continue;
    if (value.is_null() || (key == "tool_calls" && value.is_array() && value.empty())) continue;
    if ((key == "tool_calls" && r == "assistant") ||
        ((key == "tool_call_id" || key == "name") && r == "tool")) {
      continue;
    }
    if (key == "tool_calls" || key == "tool_call_id") {
      return Invalid(absl::StrCat(at, ".", key),
                     key == "tool_calls" ? "belong to an assistant message"
                                         : "belongs to a tool message");
    }
    if (key == "name" || key == "function_call" || key == "refusal" || key == "audio") {
      return Unsupported(absl::StrCat(at, ".", key));
    }
    return Invalid(absl::StrCat(at, ".", key), "is not a field of a chat message");
  }
  out->set_role(r);
  if (r == "tool") {
    RETURN_IF_ERROR(StringField(m, "tool_call_id", at, /*required=*/true,
                                out->mutable_tool_call_id()));
    RETURN_IF_ERROR(StringField(m, "name", at, /*required=*/false, out->mutable_name()));
  }
  if (auto calls = m.find("tool_calls"); r == "assistant" && calls != m.end() &&
                                         !calls->is_null()) {
    if (!calls->is_array()) return Invalid(at + ".tool_calls", "must be an array of tool calls");
    for (size_t j = 0; j < calls->size(); ++j) {
      const ojson& c = (*calls)[j];
      const std::string call_at = absl::StrCat(at, ".tool_calls[", j, "]");
      if (!c.is_object()) {
        return Invalid(call_at, "must be an object with 'id', 'type' and 'function'");
      }
      RETURN_IF_ERROR(KnownKeys(c, {"id", "type", "function"}, call_at));
      if (c.value("type", ojson()) != "function") {
        return Invalid(call_at + ".type", "must be \"function\"");
      }
      v1::ToolCall* call = out->add_tool_calls();
      RETURN_IF_ERROR(StringField(c, "id", call_at, /*required=*/true, call->mutable_id()));
      auto f = c.find("function");
      if (f == c.end() || !f->is_object()) {
        return Invalid(call_at + ".function", "must be an object with 'name' and 'arguments'");
      }
      const std::string fat = call_at + ".function";
      RETURN_IF_ERROR(KnownKeys(*f, {"name", "arguments"}, fat));
      RETURN_IF_ERROR(StringField(*f, "name", fat, /*required=*/true, call->mutable_name()));
      RETURN_IF_ERROR(
          StringField(*f, "arguments", fat, /*required=*/true, call->mutable_arguments()));
    }
  }
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    // An assistant message that only calls functions has no content.
    if (out->tool_calls_size() > 0) return absl::OkStatus();
    return Invalid(at + ".content", absl::StrCat("is required for a ", r, " message"));
  }
  if (content->is_string()) {
    out->set_content(content->get<std::string>());
  } else if (content->is_array()) {
    // [{"type": "text", "text": "..."}]: text parts only.
    for (size_t j = 0; j < content->size(); ++j) {
      const ojson& part = (*content)[j];
      const std::string part_at = absl::StrCat(at, ".content[", j, "]");
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        return Invalid(part_at, "must be an object with a string 'type'");
      }
      if (part["type"] != "text") {
        return Unsupported(part_at + ".type",
                           absl::StrCat("only text content parts, not '",
                                        part["type"].get<std::string>(), "'"));
      }
      if (!part.contains("text") || !part["text"].is_string()) {
        return Invalid(part_at + ".text", "must be a string");
      }
      out->mutable_content()->append(part["text"].get<std::string>());
    }
  } else {
    return Invalid(at + ".content", "must be a string or an array of text parts");
  }
  return absl::OkStatus();
}

// One prompt of completions' "prompt": a string or a non-empty array of token ids. `at` names
// it in errors ("prompt" or "prompt[3]").
absl::StatusOr<v1::GenerateRequest> ParseOnePrompt(const ojson& p, const std::string& at) {
  v1::GenerateRequest r;
  if (p.is_string()) {
    r.set_prompt(p.get<std::string>());
    return r;
  }
  if (!p.is_array() || p.empty() ||
      !std::all_of(p.begin(), p.end(), [](const ojson& t) { return t.is_number_integer(); })) {
    return Invalid(at, "must be a string or a non-empty array of token ids");
  }
  for (const ojson& t : p) {
    if (t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid(at, absl::StrCat("token id ", t.dump(), " is out of range"));
    }
    r.mutable_token_ids()->add_ids(t.get<int32_t>());
  }
  return r;
}

// Completions' "prompt": a string, an array of token ids, or an array of several of either (a
// batch: one request each, in order). Each request holds only its input.
absl::StatusOr<std::vector<v1::GenerateRequest>> ParsePrompts(const ojson& prompt) {
  const bool batch = prompt.is_array() && !prompt.empty() &&
                     std::all_of(prompt.begin(), prompt.end(),
                                 [](const ojson& p) { return p.is_string() || p.is_array(); });
  if (!batch) {
    ASSIGN_OR_RETURN(v1::GenerateRequest one, ParseOnePrompt(prompt, "prompt"));
    return std::vector<v1::GenerateRequest>{std::move(one)};
  }
  if (prompt.size() > static_cast<size_t>(kMaxPrompts)) {
    return Invalid("prompt", absl::StrCat("holds ", prompt.size(), " prompts; at most ",
                                          kMaxPrompts, " in one request"));
  }
  std::vector<v1::GenerateRequest> out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    ASSIGN_OR_RETURN(v1::GenerateRequest one,
                     ParseOnePrompt(prompt[i], absl::StrCat("prompt[", i, "]")));
    out.push_back(std::move(one));
  }
  return out;
}

// An OpenAI request body as an OpenAiRequest.
absl::StatusOr<OpenAiRequest> ParseBody(const ojson& body, bool chat) {
  if (!body.is_object()) {
    return WithParam(absl::InvalidArgumentError("the body must be a JSON object"), "body");
  }
  const auto& known = KnownFields(chat);
  for (const auto& [key, value] : body.items()) {
    if (!known.contains(key)) {
      return Invalid(key, absl::StrCat("is not a parameter of ",
                                       chat ? "/v1/chat/completions" : "/v1/completions"));
    }
  }
  if (absl::Status s = RefuseLegacyFunctions(body, chat); !s.ok()) return s;
  if (absl::Status s = RefuseNonNoOps(body, chat); !s.ok()) return s;

  OpenAiRequest out;
  v1::GenerateRequest& r = out.request;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return Invalid("model", "must be a string");
    r.set_model(m->get<std::string>());
  }
  if (chat) {
    auto messages = body.find("messages");
    if (messages == body.end() || !messages->is_array() || messages->empty()) {
      return Invalid("messages", "must be a non-empty array");
    }
    for (size_t i = 0; i < messages->size(); ++i) {
      if (absl::Status s = ParseMessage((*messages)[i], i, r.mutable_chat()->add_messages());
          !s.ok()) {
        return s;
      }
    }
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) return Invalid("prompt", "is required");
    ASSIGN_OR_RETURN(std::vector<v1::GenerateRequest> prompts, ParsePrompts(*prompt));
    r.MergeFrom(prompts[0]);
    if (prompts.size() > 1) out.batch = std::move(prompts);
  }

  v1::SamplingParams* s = r.mutable_sampling();
  const bool has_mct = Present(body, "max_completion_tokens");
  const bool has_mt = Present(body, "max_tokens");
  if (chat && has_mct && has_mt && body["max_tokens"] != body["max_completion_tokens"]) {
    return Invalid("max_tokens", "differs from 'max_completion_tokens'; send one of them");
  }
  const char* max_key = chat && has_mct ? "max_completion_tokens" : "max_tokens";
  // Completions' "echo": the prompt's text (and its log-probabilities) before the generated text;
  // with it, max_tokens may be 0 (score the prompt only).
  if (!chat) {
    ASSIGN_OR_RETURN(std::optional<bool> echo, Bool(body, "echo"));
    out.echo = echo.value_or(false);
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens,
                   Int(body, max_key, out.echo ? 0 : 1, std::numeric_limits<uint32_t>::max()));
  if (max_tokens == 0) {
    // The engine generates at least one token: one is generated and dropped.
    out.max_tokens_zero = true;
    s->set_max_tokens(1);
  } else if (max_tokens.has_value()) {
    s->set_max_tokens(static_cast<uint32_t>(*max_tokens));
  } else if (!chat) {
    s->set_max_tokens(16);  // OpenAI's default for completions
  }
  ASSIGN_OR_RETURN(std::optional<double> temperature, Float(body, "temperature", 0, 2));
  if (temperature) s->set_temperature(static_cast<float>(*temperature));
  ASSIGN_OR_RETURN(std::optional<double> top_p, Float(body, "top_p", 0, 1, /*open_lo=*/true));
  if (top_p) s->set_top_p(static_cast<float>(*top_p));
  ASSIGN_OR_RETURN(std::optional<double> min_p, Float(body, "min_p", 0, 1));
  if (min_p) s->set_min_p(static_cast<float>(*min_p));
  // -1 is vLLM's "disabled", as 0.
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k,
                   Int(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k) s->set_top_k(static_cast<int32_t>(std::max<int64_t>(0, *top_k)));
  ASSIGN_OR_RETURN(std::optional<double> presence, Float(body, "presence_penalty", -2, 2));
  if (presence) s->set_presence_penalty(static_cast<float>(*presence));
  ASSIGN_OR_RETURN(std::optional<double> frequency, Float(body, "frequency_penalty", -2, 2));
  if (frequency) s->set_frequency_penalty(static_cast<float>(*frequency));
  ASSIGN_OR_RETURN(std::optional<double> repetition,
                   Float(body, "repetition_penalty", 0, 100, /*open_lo=*/true));
  if (repetition) s->set_repetition_penalty(static_cast<float>(*repetition));
  ASSIGN_OR_RETURN(std::optional<int64_t> seed, Int(body, "seed",
                                                    std::numeric_limits<int64_t>::min(),
                                                    std::numeric_limits<int64_t>::max()));
  if (seed) s->set_seed(static_cast<uint64_t>(*seed));
  ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens,
                   Int(body, "min_tokens", 0, std::numeric_limits<uint32_t>::max()));
  if (min_tokens) {
    if (s->has_max_tokens() && *min_tokens > (out.max_tokens_zero ? 0 : s->max_tokens())) {
      return Invalid("min_tokens", absl::StrCat("must not exceed ", max_key, " (",
                                                out.max_tokens_zero ? 0 : s->max_tokens(),
                                                "), not ", *min_tokens));
    }
    s->set_min_tokens(static_cast<uint32_t>(*min_tokens));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> priority,
                   Int(body, "priority", std::numeric_limits<int32_t>::min(),
                       std::numeric_limits<int32_t>::max()));
  if (priority) r.set_priority(static_cast<int32_t>(*priority));
  ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, Bool(body, "ignore_eos"));
  if (ignore_eos) s->set_ignore_eos(*ignore_eos);
  if (auto ids = body.find("stop_token_ids"); ids != body.end() && !ids->is_null()) {
    if (!ids->is_array() || !std::all_of(ids->begin(), ids->end(), [](const ojson& t) {
          return t.is_number_integer() && t.get<int64_t>() >= 0 &&
                 t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
        })) {
      return Invalid("stop_token_ids", "must be an array of token ids");
    }
    for (const ojson& t : *ids) s->add_stop_token_ids(t.get<int32_t>());
  }
  // Tandem's latency objectives: "slo": {"ttft_ms": 500, "tpot_ms": 50}.
  if (auto slo = body.find("slo"); slo != body.end() && !slo->is_null()) {
    if (!slo->is_object()) return Invalid("slo", "must be an object with ttft_ms and/or tpot_ms");
    for (const auto& [key, v] : slo->items()) {
      if (key != "ttft_ms" && key != "tpot_ms") {
        return Invalid(absl::StrCat("slo.", key), "is not a field of 'slo' (ttft_ms, tpot_ms)");
      }
      if (v.is_null()) continue;
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 3.6e6) {
        return Invalid(absl::StrCat("slo.", key), "must be a number of milliseconds in [0, 3600000]");
      }
      const auto ms = static_cast<uint32_t>(std::ceil(v.get<double>()));
      if (key == "ttft_ms") {
        r.mutable_slo()->set_ttft_ms(ms);
      } else {
        r.mutable_slo()->set_tpot_ms(ms);
      }
    }
  }
  if (absl::Status f = ParseResponseFormat(body, s); !f.ok()) return f;
  if (chat) RETURN_IF_ERROR(ParseTools(body, &r));
  if (auto stop = body.find("stop"); stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      if (stop->get<std::string>().empty()) return Invalid("stop", "must not be empty");
      s->add_stop(stop->get<std::string>());
    } else if (stop->is_array() && std::all_of(stop->begin(), stop->end(), [](const ojson& x) {
                 return x.is_string() && !x.get<std::string>().empty();
               })) {
      if (stop->size() > kMaxStops) {
        return Invalid("stop", absl::StrCat("may hold at most ", kMaxStops, " strings, not ",
                                            stop->size()));
      }
      for (const ojson& x : *stop) s->add_stop(x.get<std::string>());
    } else {
      return Invalid("stop", "must be a non-empty string or an array of them");
    }
  }

  ASSIGN_OR_RETURN(std::optional<int64_t> n, Int(body, "n", 1, kMaxChoices));
  out.n = static_cast<int>(n.value_or(1));
  ASSIGN_OR_RETURN(std::optional<int64_t> best_of, Int(body, "best_of", 1, kMaxBestOf));
  out.best_of = static_cast<int>(best_of.value_or(out.n));
  if (out.best_of < out.n) {
    return Invalid("best_of", absl::StrCat("must be at least n (", out.n, "), not ", out.best_of));
  }
  if (!out.batch.empty() &&
      static_cast<int64_t>(out.batch.size()) * out.best_of > kMaxBatchCandidates) {
    return Invalid(out.best_of > 1 ? "best_of" : "prompt",
                   absl::StrCat(out.batch.size(), " prompts with ", out.best_of,
                                " candidates each exceed ", kMaxBatchCandidates,
                                " sequences in one request"));
  }

  ASSIGN_OR_RETURN(std::optional<bool> stream, Bool(body, "stream"));
  out.stream = stream.value_or(false);
  if (out.stream && out.best_of > out.n) {
    return Invalid("best_of", "above n cannot be streamed: the best are known only at the end");
  }
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!out.stream) return Invalid("stream_options", "is only allowed with 'stream': true");
    if (!so->is_object()) return Invalid("stream_options", "must be an object");
    for (const auto& [key, v] : so->items()) {
      if (key != "include_usage") {
        return Invalid(absl::StrCat("stream_options.", key), "is not supported (include_usage)");
      }
      if (!v.is_null() && !v.is_boolean()) {
        return Invalid("stream_options.include_usage", "must be a boolean");
      }
      out.include_usage = v.is_boolean() && v.get<bool>();
    }
  }

  // Log-probabilities: completions' integer "logprobs"; chat's boolean "logprobs" with
  // "top_logprobs".
  if (chat) {
    ASSIGN_OR_RETURN(std::optional<bool> logprobs, Bool(body, "logprobs"));
    ASSIGN_OR_RETURN(std::optional<int64_t> top, Int(body, "top_logprobs", 0, kMaxTopLogprobs));
    if (top.has_value() && !logprobs.value_or(false)) {
      return Invalid("top_logprobs", "needs 'logprobs': true");
    }
    if (logprobs.value_or(false)) out.logprobs = static_cast<int>(top.value_or(0));
  } else {
    ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, Int(body, "logprobs", 0, kMaxTopLogprobs));
    if (logprobs.has_value()) out.logprobs = static_cast<int>(*logprobs);
  }
  // The engine returns the sampled token's log-probability only beside at least one alternative;
  // best_of ranks candidates by them.
  if (out.logprobs.has_value() || out.best_of > out.n) {
    s->set_logprobs(static_cast<uint32_t>(std::max(1, out.logprobs.value_or(0))));
  }
  if (out.echo && out.logprobs.has_value()) {
    s->set_prompt_logprobs(static_cast<uint32_t>(std::max(1, *out.logprobs)));
  }
  // A batch: each prompt's request is the first one with its own input.
  for (size_t i = 1; i < out.batch.size(); ++i) {
    v1::GenerateRequest one = out.request;
    one.clear_input();
    one.MergeFrom(out.batch[i]);
    out.batch[i] = std::move(one);
  }
  if (!out.batch.empty()) out.batch[0] = out.request;
  return out;
}

ojson Parse(absl::string_view body) {
  return ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
}

absl::Status NotJson() {
  return WithParam(absl::InvalidArgumentError("the body is not valid JSON"), "body");
}

// Refuses fields of `body` outside `known`.
absl::Status OnlyFields(const ojson& body, std::initializer_list<absl::string_view> known,
                        absl::string_view path) {
  if (!body.is_object()) {
    return WithParam(absl::InvalidArgumentError("the body must be a JSON object"), "body");
  }
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Invalid(key, absl::StrCat("is not a parameter of ", path));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat) {
  const ojson parsed = Parse(body);
  if (parsed.is_discarded()) return NotJson();
  return ParseBody(parsed, chat);
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(absl::string_view raw) {
  const ojson body = Parse(raw);
  if (body.is_discarded()) return NotJson();
  RETURN_IF_ERROR(OnlyFields(body,
                             {"model", "prompt", "messages", "add_special_tokens",
                              "add_generation_prompt", "return_token_strs", "tools"},
                             "/tokenize"));
  v1::TokenizeRequest r;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return Invalid("model", "must be a string");
    r.set_model(m->get<std::string>());
  }
  const bool has_prompt = Present(body, "prompt");
  const bool has_messages = Present(body, "messages");
  if (has_prompt == has_messages) return Invalid("prompt", "or 'messages' is required (one)");
  if (has_prompt) {
    if (!body["prompt"].is_string()) return Invalid("prompt", "must be a string");
    r.set_prompt(body["prompt"].get<std::string>());
    if (Present(body, "add_generation_prompt")) {
      return Invalid("add_generation_prompt", "goes with 'messages'");
    }
    if (Present(body, "tools")) return Invalid("tools", "go with 'messages'");
  } else {
    const ojson& messages = body["messages"];
    if (!messages.is_array() || messages.empty()) {
      return Invalid("messages", "must be a non-empty array");
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      RETURN_IF_ERROR(ParseMessage(messages[i], i, r.mutable_chat()->add_messages()));
    }
    // The tools a template renders (as a chat request's with tool_choice "auto").
    v1::GenerateRequest with_tools;
    RETURN_IF_ERROR(ParseTools(body, &with_tools));
    *r.mutable_tools() = with_tools.tools();
    ASSIGN_OR_RETURN(std::optional<bool> gen, Bool(body, "add_generation_prompt"));
    r.set_add_generation_prompt(gen.value_or(true));
  }
  ASSIGN_OR_RETURN(std::optional<bool> special, Bool(body, "add_special_tokens"));
  // vLLM's defaults: special tokens for a prompt, none for a chat (its template has them).
  r.set_add_special_tokens(special.value_or(has_prompt));
  ASSIGN_OR_RETURN(std::optional<bool> strs, Bool(body, "return_token_strs"));
  r.set_return_pieces(strs.value_or(false));
  return r;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view raw) {
  const ojson body = Parse(raw);
  if (body.is_discarded()) return NotJson();
  RETURN_IF_ERROR(OnlyFields(body, {"model", "tokens"}, "/detokenize"));
  DetokenizeRequest r;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return Invalid("model", "must be a string");
    r.model = m->get<std::string>();
  }
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    return Invalid("tokens", "must be an array of token ids");
  }
  for (const ojson& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid("tokens", absl::StrCat("must hold token ids, not ", t.dump()));
    }
    r.tokens.push_back(t.get<int32_t>());
  }
  return r;
}

std::string OpenAiFinishReason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
    case v1::FINISH_REASON_STOP_STRING:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "";
  }
}

std::string OpenAiErrorBody(const absl::Status& status) {
  const int http = HttpStatusFromCode(status.code());
  const char* type = http == 400 || http == 401 || http == 404 || http == 413
                         ? "invalid_request_error"
                     : http == 429 ? "rate_limit_error"
                                   : "server_error";
  const std::optional<std::string> param = ParamOf(status);
  return json{{"error",
               {{"message", std::string(status.message())},
                {"type", type},
                {"param", param.has_value() ? json(*param) : json(nullptr)},
                // OpenAI's code for a missing or wrong key, which clients look for.
                {"code", http == 401 ? "invalid_api_key" : absl::StatusCodeToString(status.code())}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string OpenAiModelList(const v1::ListModelsResponse& models) {
  json data = json::array();
  for (const v1::ModelInfo& m : models.models()) {
    data.push_back({{"id", m.id()},
                    {"object", "model"},
                    {"created", m.created_unix_s()},
                    {"owned_by", m.owned_by()},
                    {"max_model_len", m.max_context()},
                    {"format", m.format()},
                    {"architecture", m.architecture()}});
  }
  return json{{"object", "list"}, {"data", data}}.dump(-1, ' ', false,
                                                       json::error_handler_t::replace);
}

int64_t CountCharacters(absl::string_view utf8) {
  return std::count_if(utf8.begin(), utf8.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  });
}

json CompletionLogprobs(const std::vector<TokenWithLogprobs>& tokens, int top_n,
                        int64_t offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenWithLogprobs& t : tokens) {
    out["tokens"].push_back(t.token);
    out["token_logprobs"].push_back(t.logprob);
    if (top_n > 0) {
      json top = json::object();
      for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(top_n); ++i) {
        // Two alternatives spelled alike (distinct ids, same bytes) keep the more likely.
        if (!top.contains(t.top[i].first)) top[t.top[i].first] = t.top[i].second;
      }
      out["top_logprobs"].push_back(top);
    } else {
      out["top_logprobs"].push_back(nullptr);
    }
    out["text_offset"].push_back(offset);
    offset += CountCharacters(t.token);
  }
  return out;
}

namespace {
json Bytes(const std::string& s) {
  json b = json::array();
  for (char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return b;
}
}  // namespace

json ChatLogprobs(const std::vector<TokenWithLogprobs>& tokens, int top_n) {
  json content = json::array();
  for (const TokenWithLogprobs& t : tokens) {
    json top = json::array();
    for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(top_n); ++i) {
      top.push_back({{"token", t.top[i].first},
                     {"logprob", t.top[i].second},
                     {"bytes", Bytes(t.top[i].first)}});
    }
    content.push_back(
        {{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace tandem::router
