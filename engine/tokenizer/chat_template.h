// Chat templates: render a conversation into the prompt text a chat model was trained on.
//
// Which renderer a model gets (ForModel):
//   1. The model ships a template (GGUF `tokenizer.chat_template`): it is parsed and rendered by
//      the Jinja engine (jinja.h), the way Hugging Face transformers renders it (kJinja).
//   2. The template does not parse: a warning is logged naming the parse error, and the built-in
//      renderer is used if the text is recognized as one of the families below (Recognize); if it
//      is not, the model has no chat template (INVALID_ARGUMENT with the parse error) and chat
//      requests are refused with that message.
//   3. The model has no template: the built-in renderer its vocabulary implies (<|im_start|> and
//      <|im_end|> tokens: ChatML; <|start_header_id|>, <|end_header_id|> and <|eot_id|>: Llama 3);
//      NOT_FOUND when it has neither.
//
// The built-in renderers (checked against jinja2 in tests/tokenizer/):
//   kChatMl  "<|im_start|>{role}\n{content}<|im_end|>\n" per message, and
//            "<|im_start|>assistant\n" as the generation prompt (SmolLM2, Qwen2). When the
//            template injects a default system message for conversations without one
//            (SmolLM2's "You are a helpful AI assistant named SmolLM, ..."), so does Render().
//   kLlama3  "{bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>",
//            BOS before the first message only, and
//            "<|start_header_id|>assistant<|end_header_id|>\n\n" as the generation prompt.
//
// Thread-safe (immutable after creation; Render may run concurrently).
#ifndef TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja.h"

namespace tandem {

class Tokenizer;

// A function call made by an assistant message (OpenAI's tool_calls entry).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the text of a JSON object
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // An assistant message's calls. Jinja templates get them as transformers passes them:
  // [{"id", "type": "function", "function": {"name", "arguments": <the object>}}], and the
  // message's content as None when it is empty.
  std::vector<ChatToolCall> tool_calls = {};
  // A tool message: the call it answers, and the function's name (given to Jinja templates when
  // not empty).
  std::string tool_call_id = {};
  std::string name = {};
};

// The Jinja value of a JSON text (objects keep their key order), as Python's json.loads gives
// it to a template. INVALID_ARGUMENT when the text is not JSON.
absl::StatusOr<jinja::Value> JinjaValueFromJson(absl::string_view json);

enum class ChatTemplateKind { kJinja, kChatMl, kLlama3 };

class ChatTemplate {
 public:
  // The renderer for a model, chosen as the file comment says (1-3), with the tokenizer's
  // vocabulary for case 3.
  static absl::StatusOr<ChatTemplate> ForModel(const Tokenizer& tokenizer);

  // Cases 1 and 2 for a template text. INVALID_ARGUMENT when it is empty, or does not parse and
  // is not a recognized family (the message carries the parse error and its line).
  static absl::StatusOr<ChatTemplate> FromJinja(absl::string_view jinja);

  // The built-in renderer for a template text, without running it: UNIMPLEMENTED when it is
  // none of the supported families, or a variant whose extra logic is not understood (tool
  // calls, Llama 3.1's dated system preamble, system messages chosen by conditions other than
  // SmolLM2's "no system message first"): such templates are refused rather than rendered
  // approximately. INVALID_ARGUMENT when the text is empty.
  static absl::StatusOr<ChatTemplate> Recognize(absl::string_view jinja);

  // A built-in template. `default_system` (ChatML only): the system message to insert when a
  // conversation has none; empty for none. REQUIRES: kind != kJinja.
  static ChatTemplate Of(ChatTemplateKind kind, std::string default_system = "");

  struct RenderOptions {
    // End with the header of an assistant turn.
    bool add_generation_prompt = true;
    // The tokenizer's BOS/EOS token text (`bos_token`/`eos_token` in the template; the Llama 3
    // built-in writes bos_token first, ChatML uses neither).
    std::string bos_token;
    std::string eos_token;
    // Tool definitions (`tools`, a list), given to Jinja templates only when set.
    std::optional<jinja::Value> tools;
    // What strftime_now() formats (templates that date their system prompt).
    absl::Time now = absl::Now();
    // Bounds on one Jinja render.
    jinja::RenderLimits limits;
  };

  // Options for a model's requests: the generation prompt, and bos_token/eos_token spelled as
  // the tokenizer's BOS/EOS tokens (empty where it has none).
  static RenderOptions OptionsFor(const Tokenizer& tokenizer);

  // Renders `messages`. INVALID_ARGUMENT for a role other than system/user/assistant/tool, a
  // tool call whose arguments are not a JSON object (Jinja only), and
  // for a Jinja template that fails on this conversation — raise_exception() (e.g. "roles must
  // alternate"), a type error, or a render past `limits` — with the template's message and line.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const RenderOptions& options) const;

  ChatTemplateKind kind() const { return kind_; }
  // ChatML's default system message (built-in kChatMl only).
  const std::string& default_system() const { return default_system_; }
  // Why this is a built-in renderer although the model ships a template (the parse error);
  // empty otherwise.
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  ChatTemplate(ChatTemplateKind kind, std::string default_system)
      : kind_(kind), default_system_(std::move(default_system)) {}

  absl::StatusOr<std::string> RenderBuiltin(const std::vector<ChatMessage>& messages,
                                            const RenderOptions& options) const;

  ChatTemplateKind kind_;
  std::string default_system_;
  std::string fallback_reason_;
  std::optional<jinja::Template> jinja_;  // kJinja only
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
