#include "router/server/openai_json.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_conversion.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Reads an optional number field of `body` into `set`; INVALID_ARGUMENT for a wrong type.
template <typename T, typename Set>
absl::Status Number(const json& body, const char* key, Set set) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Invalid(absl::StrCat("'", key, "' must be a number"));
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return Invalid(absl::StrCat("'", key, "' must be an integer"));
    set(it->get<T>());
  } else {
    set(it->get<T>());
  }
  return absl::OkStatus();
}

// OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}.
// The schema's compilation (and its errors) happen on the worker.
absl::Status ParseResponseFormat(const json& body, v1::SamplingParams* s) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  const json& f = *it;
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    return Invalid("'response_format' must be an object with a string 'type'");
  }
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    s->mutable_response_format()->mutable_json_object();
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Invalid(absl::StrCat("'response_format.type' must be 'text', 'json_object' or "
                                "'json_schema', not '", type, "'"));
  }
  auto js = f.find("json_schema");
  if (js == f.end() || !js->is_object()) {
    return Invalid("'response_format.json_schema' must be an object with 'name' and 'schema'");
  }
  auto name = js->find("name");
  if (name == js->end() || !name->is_string() || name->get<std::string>().empty()) {
    return Invalid("'response_format.json_schema.name' must be a non-empty string");
  }
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() &&
                                         !strict->is_boolean()) {
    return Invalid("'response_format.json_schema.strict' must be a boolean");
  }
  // OpenAI allows the schema to be left out (any JSON then); an object schema otherwise.
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) {
    s->mutable_response_format()->mutable_json_object();
    return absl::OkStatus();
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return Invalid("'response_format.json_schema.schema' must be a JSON Schema object");
  }
  s->mutable_response_format()->set_json_schema(schema->dump());
  return absl::OkStatus();
}

// An OpenAI request body as a tandem.v1.GenerateRequest.
absl::StatusOr<v1::GenerateRequest> ParseBody(const json& body, bool chat, bool* stream,
                                              bool* include_usage) {
  if (!body.is_object()) return Invalid("the body must be a JSON object");
  v1::GenerateRequest r;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return Invalid("'model' must be a string");
    r.set_model(m->get<std::string>());
  }
  if (chat) {
    auto messages = body.find("messages");
    if (messages == body.end() || !messages->is_array() || messages->empty()) {
      return Invalid("'messages' must be a non-empty array");
    }
    for (const json& m : *messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return Invalid("each message needs a string 'role'");
      }
      v1::ChatMessage* out = r.mutable_chat()->add_messages();
      out->set_role(m["role"].get<std::string>());
      const json& content = m.contains("content") ? m["content"] : json();
      if (content.is_string()) {
        out->set_content(content.get<std::string>());
      } else if (content.is_array()) {
        // [{"type": "text", "text": "..."}]: text parts only.
        for (const json& part : content) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return Invalid("only text content parts are supported");
          }
          out->mutable_content()->append(part["text"].get<std::string>());
        }
      } else if (!content.is_null()) {
        return Invalid("'content' must be a string or an array of text parts");
      }
    }
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) return Invalid("'prompt' is required");
    if (prompt->is_string()) {
      r.set_prompt(prompt->get<std::string>());
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.set_prompt((*prompt)[0].get<std::string>());
    } else if (prompt->is_array() && !prompt->empty() &&
               std::all_of(prompt->begin(), prompt->end(),
                           [](const json& t) { return t.is_number_integer(); })) {
      for (const json& t : *prompt) r.mutable_token_ids()->add_ids(t.get<int32_t>());
    } else {
      return Invalid("'prompt' must be a string, a one-string array or an array of token ids");
    }
  }
  v1::SamplingParams* s = r.mutable_sampling();
  absl::Status st;
  const char* max_key = chat && body.contains("max_completion_tokens") ? "max_completion_tokens"
                                                                        : "max_tokens";
  int64_t max_tokens = -1;
  st.Update(Number<int64_t>(body, max_key, [&](int64_t v) { max_tokens = v; }));
  if (!st.ok()) return st;
  if (body.contains(max_key) && !body[max_key].is_null()) {
    if (max_tokens <= 0 || max_tokens > (int64_t{1} << 31)) {
      return Invalid(absl::StrCat("'", max_key, "' must be at least 1, not ", max_tokens));
    }
    s->set_max_tokens(static_cast<uint32_t>(max_tokens));
  } else if (!chat) {
    s->set_max_tokens(16);  // OpenAI's default for completions
  }
  st.Update(Number<double>(body, "temperature", [&](double v) { s->set_temperature(static_cast<float>(v)); }));
  st.Update(Number<double>(body, "top_p", [&](double v) { s->set_top_p(static_cast<float>(v)); }));
  st.Update(Number<double>(body, "min_p", [&](double v) { s->set_min_p(static_cast<float>(v)); }));
  st.Update(Number<int64_t>(body, "top_k", [&](int64_t v) { s->set_top_k(static_cast<int32_t>(v)); }));
  st.Update(Number<double>(body, "presence_penalty", [&](double v) { s->set_presence_penalty(static_cast<float>(v)); }));
  st.Update(Number<double>(body, "frequency_penalty", [&](double v) { s->set_frequency_penalty(static_cast<float>(v)); }));
  st.Update(Number<double>(body, "repetition_penalty", [&](double v) { s->set_repetition_penalty(static_cast<float>(v)); }));
  st.Update(Number<int64_t>(body, "seed", [&](int64_t v) { s->set_seed(static_cast<uint64_t>(v)); }));
  st.Update(Number<int64_t>(body, "min_tokens", [&](int64_t v) { s->set_min_tokens(static_cast<uint32_t>(std::max<int64_t>(0, v))); }));
  st.Update(Number<int64_t>(body, "priority", [&](int64_t v) { r.set_priority(static_cast<int32_t>(v)); }));
  if (!st.ok()) return st;
  // Tandem's latency objectives: "slo": {"ttft_ms": 500, "tpot_ms": 50}.
  if (auto slo = body.find("slo"); slo != body.end() && !slo->is_null()) {
    if (!slo->is_object()) return Invalid("'slo' must be an object with ttft_ms and/or tpot_ms");
    for (const char* key : {"ttft_ms", "tpot_ms"}) {
      auto v = slo->find(key);
      if (v == slo->end() || v->is_null()) continue;
      if (!v->is_number() || v->get<double>() < 0 || v->get<double>() > 3.6e6) {
        return Invalid(absl::StrCat("'slo.", key, "' must be a number of milliseconds in [0, 3600000]"));
      }
      const auto ms = static_cast<uint32_t>(std::ceil(v->get<double>()));
      if (std::string_view(key) == "ttft_ms") {
        r.mutable_slo()->set_ttft_ms(ms);
      } else {
        r.mutable_slo()->set_tpot_ms(ms);
      }
    }
  }
  if (auto n = body.find("n"); n != body.end() && !n->is_null() && *n != 1) {
    return Invalid("only n = 1 is supported");
  }
  if (absl::Status f = ParseResponseFormat(body, s); !f.ok()) return f;
  if (auto stop = body.find("stop"); stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      s->add_stop(stop->get<std::string>());
    } else if (stop->is_array() &&
               std::all_of(stop->begin(), stop->end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : *stop) s->add_stop(x.get<std::string>());
    } else {
      return Invalid("'stop' must be a string or an array of strings");
    }
  }
  if (auto ignore = body.find("ignore_eos"); ignore != body.end() && ignore->is_boolean()) {
    s->set_ignore_eos(ignore->get<bool>());
  }
  *stream = false;
  if (auto st_it = body.find("stream"); st_it != body.end() && !st_it->is_null()) {
    if (!st_it->is_boolean()) return Invalid("'stream' must be a boolean");
    *stream = st_it->get<bool>();
  }
  *include_usage = false;
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    *include_usage = so->value("include_usage", false);
  }
  return r;
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat) {
  const json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Invalid("the body is not valid JSON");
  OpenAiRequest out;
  absl::StatusOr<v1::GenerateRequest> request =
      ParseBody(parsed, chat, &out.stream, &out.include_usage);
  if (!request.ok()) return request.status();
  out.request = *std::move(request);
  return out;
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
  const char* type = http == 400 || http == 404 || http == 413 ? "invalid_request_error"
                     : http == 429                             ? "rate_limit_error"
                                                               : "server_error";
  return json{{"error",
               {{"message", std::string(status.message())},
                {"type", type},
                {"code", absl::StatusCodeToString(status.code())}}}}
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

}  // namespace tandem::router
