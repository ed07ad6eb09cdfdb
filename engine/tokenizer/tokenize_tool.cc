// tokenize_tool: the tokenizer from the command line, for reference tests and debugging.
//
//   tokenize_tool --model=M.gguf [--add-special] [--no-parse-special] < input
//       input: a JSON list of strings, or (when it is not JSON) the raw text.
//       output: for a list, [{"ids": [...], "decoded": "...", "streamed": "..."}, ...];
//               for raw text, the id list. "decoded" is Decode(ids); "streamed" is the text a
//               StreamingDetokenizer gives token by token.
//   tokenize_tool --hf=DIR ...
//       as --model, with the tokenizer read from DIR/tokenizer.json (+ tokenizer_config.json)
//       (hf_tokenizer.h). --hf-info prints {"bos": id, "eos": id, "add_bos": bool,
//       "chat_template": "..."} instead.
//   tokenize_tool --model=M.gguf --decode < [[ids...], ...]
//       output: the decoded strings (invalid UTF-8 replaced by U+FFFD).
//   tokenize_tool [--model=M.gguf] --chat < {"messages": [{"role":..., "content":...}],
//                                            "add_generation_prompt": true, "bos_token": "",
//                                            "eos_token": "", "tools": [...], "now": unix_seconds,
//                                            "template": "..." (default: the model's),
//                                            "builtin": false}
//       renders with ChatTemplate as a server does: the template given, else the model's
//       (ChatTemplate::ForModel); bos/eos default to the model's tokens. "builtin": true uses the
//       built-in renderer the template is recognized as (ChatTemplate::Recognize) instead.
//       output: {"text": "...", "kind": "jinja"|"chatml"|"llama3"} or
//               {"error": "INVALID_ARGUMENT", "message": "..."} (exit 1).
//   tokenize_tool --jinja < {"template": "...", "context": {...}, "now": unix_seconds}
//       renders a Jinja template with the JSON context (jinja.h); output as for --chat.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/jinja.h"
#include "engine/tokenizer/streaming_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int Fail(const absl::Status& status) {
  json err = {{"error", std::string(absl::StatusCodeToString(status.code()))},
              {"message", std::string(status.message())}};
  std::cout << Dump(err) << "\n";
  std::cerr << "tokenize_tool: " << status << "\n";
  return 1;
}

using Json = nlohmann::ordered_json;

tandem::jinja::Value FromJson(const Json& j) {
  using tandem::jinja::Value;
  switch (j.type()) {
    case Json::value_t::null: return Value::None();
    case Json::value_t::boolean: return Value::Bool(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return Value::Int(j.get<int64_t>());
    case Json::value_t::number_float: return Value::Float(j.get<double>());
    case Json::value_t::string: return Value::String(j.get<std::string>());
    case Json::value_t::array: {
      tandem::jinja::ValueList items;
      for (const auto& item : j) items.push_back(FromJson(item));
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      tandem::jinja::ValueDict dict;
      for (const auto& [k, v] : j.items()) dict.Set(k, FromJson(v));
      return Value::Dict(std::move(dict));
    }
    default: return Value::None();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, hf_dir;
  bool hf_info = false;
  bool add_special = false, parse_special = true, decode = false, chat = false, jinja = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--model=")) {
      model_path = arg.substr(8);
    } else if (absl::StartsWith(arg, "--hf=")) {
      hf_dir = arg.substr(5);
    } else if (arg == "--hf-info") {
      hf_info = true;
    } else if (arg == "--add-special") {
      add_special = true;
    } else if (arg == "--no-parse-special") {
      parse_special = false;
    } else if (arg == "--decode") {
      decode = true;
    } else if (arg == "--jinja") {
      jinja = true;
    } else if (arg == "--chat") {
      chat = true;
    } else {
      std::cerr << "tokenize_tool: unknown argument '" << arg << "'\n";
      return 2;
    }
  }
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());

  if (jinja) {
    // nlohmann keeps object keys sorted unless ordered_json; the context's order matters for
    // dict iteration, so parse with ordered_json.
    const nlohmann::ordered_json request =
        nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
    if (!request.is_object() || !request.contains("template")) {
      return Fail(absl::InvalidArgumentError("jinja: expected {\"template\": ..., \"context\": {...}}"));
    }
    auto tmpl = tandem::jinja::Template::Parse(request["template"].get<std::string>());
    if (!tmpl.ok()) return Fail(tmpl.status());
    tandem::jinja::RenderOptions options;
    options.now = absl::FromUnixSeconds(request.value("now", int64_t{0}));
    auto text = tmpl->Render(FromJson(request.contains("context") ? request["context"]
                                                                         : nlohmann::ordered_json::object()),
                             options);
    if (!text.ok()) return Fail(text.status());
    std::cout << Dump(json{{"text", *text}}) << "\n";
    return 0;
  }

  std::unique_ptr<tandem::GgufFile> gguf;
  std::unique_ptr<tandem::Tokenizer> tokenizer;
  if (!hf_dir.empty()) {
    auto tok = tandem::TokenizerFromHfFolder(hf_dir);
    if (!tok.ok()) return Fail(tok.status());
    tokenizer = std::move(tok).value();
    if (hf_info) {
      const tandem::TokenizerData& d = tokenizer->data();
      std::cout << Dump(json{{"bos", d.bos_id}, {"eos", d.eos_id}, {"add_bos", d.add_bos},
                             {"chat_template", d.chat_template}})
                << "\n";
      return 0;
    }
  } else if (!model_path.empty()) {
    auto file = tandem::GgufFile::Open(model_path);
    if (!file.ok()) return Fail(file.status());
    gguf = std::move(file).value();
    auto tok = tandem::TokenizerFromGguf(*gguf);
    if (!tok.ok()) return Fail(tok.status());
    tokenizer = std::move(tok).value();
  } else if (!chat) {
    std::cerr << "tokenize_tool: --model is required\n";
    return 2;
  }

  if (chat) {
    const Json request = Json::parse(input, nullptr, /*allow_exceptions=*/false);
    if (!request.is_object() || !request.contains("messages")) {
      return Fail(absl::InvalidArgumentError("chat: expected {\"messages\": [...]}"));
    }
    absl::StatusOr<tandem::ChatTemplate> chat_template =
        absl::InvalidArgumentError("chat: give --model or a \"template\"");
    const bool builtin = request.value("builtin", false);
    if (request.contains("template") || (builtin && tokenizer)) {
      const std::string tmpl = request.contains("template")
                                   ? request["template"].get<std::string>()
                                   : tokenizer->data().chat_template;
      chat_template = builtin ? tandem::ChatTemplate::Recognize(tmpl)
                              : tandem::ChatTemplate::FromJinja(tmpl);
    } else if (tokenizer) {
      chat_template = tandem::ChatTemplate::ForModel(*tokenizer);
    }
    if (!chat_template.ok()) return Fail(chat_template.status());
    std::vector<tandem::ChatMessage> messages;
    for (const auto& m : request["messages"]) {
      messages.push_back({m.value("role", ""), m.value("content", "")});
    }
    tandem::ChatTemplate::RenderOptions options;
    if (tokenizer) options = tandem::ChatTemplate::OptionsFor(*tokenizer);
    options.add_generation_prompt = request.value("add_generation_prompt", true);
    options.bos_token = request.value("bos_token", options.bos_token);
    options.eos_token = request.value("eos_token", options.eos_token);
    if (request.contains("tools")) options.tools = FromJson(request["tools"]);
    options.now = absl::FromUnixSeconds(request.value("now", int64_t{0}));
    auto text = chat_template->Render(messages, options);
    if (!text.ok()) return Fail(text.status());
    const char* kind = "jinja";
    if (chat_template->kind() == tandem::ChatTemplateKind::kChatMl) kind = "chatml";
    if (chat_template->kind() == tandem::ChatTemplateKind::kLlama3) kind = "llama3";
    std::cout << Dump(json{{"text", *text}, {"kind", kind}}) << "\n";
    return 0;
  }

  const json parsed = json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (decode) {
    if (!parsed.is_array()) return Fail(absl::InvalidArgumentError("decode: expected [[ids]]"));
    json out = json::array();
    for (const auto& ids : parsed) {
      out.push_back(tandem::SanitizeUtf8(tokenizer->Decode(ids.get<std::vector<int32_t>>())));
    }
    std::cout << Dump(out) << "\n";
    return 0;
  }
  tandem::EncodeOptions options;
  options.add_special = add_special;
  options.parse_special = parse_special;
  if (!parsed.is_array()) {
    std::cout << Dump(json(tokenizer->Encode(input, options))) << "\n";
    return 0;
  }
  json out = json::array();
  for (const auto& item : parsed) {
    const std::string text = item.get<std::string>();
    const std::vector<int32_t> ids = tokenizer->Encode(text, options);
    tandem::StreamingDetokenizer detok(*tokenizer);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.Add(id);
    streamed += detok.Finish();
    out.push_back({{"ids", ids},
                   {"decoded", tandem::SanitizeUtf8(tokenizer->Decode(ids))},
                   {"streamed", streamed}});
  }
  std::cout << Dump(out) << "\n";
  return 0;
}
