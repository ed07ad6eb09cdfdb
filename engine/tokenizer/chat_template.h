// Chat templates: render a conversation into the prompt text a chat model was trained on.
//
// Tandem does not run Jinja. It recognizes the template families it supports from the model's
// `tokenizer.chat_template` text and renders them in C++, producing exactly what the Jinja
// template produces (checked against jinja2 in tests/tokenizer/):
//
//   kChatMl  "<|im_start|>{role}\n{content}<|im_end|>\n" per message, and
//            "<|im_start|>assistant\n" as the generation prompt (SmolLM2, Qwen2). When the
//            template injects a default system message for conversations without one
//            (SmolLM2's "You are a helpful AI assistant named SmolLM, ..."), so does Render().
//   kLlama3  "{bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>",
//            BOS before the first message only, and
//            "<|start_header_id|>assistant<|end_header_id|>\n\n" as the generation prompt.
//
// Thread-safe (immutable after creation).
#ifndef TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
};

enum class ChatTemplateKind { kChatMl, kLlama3 };

class ChatTemplate {
 public:
  // Recognizes the family of a Jinja template text. UNIMPLEMENTED when it is none of the
  // supported ones (the message says which are), or a variant whose extra logic is not
  // understood (tool calls, Llama 3.1's dated system preamble, system messages chosen by
  // conditions other than SmolLM2's "no system message first"): such templates are refused
  // rather than rendered approximately. INVALID_ARGUMENT when the text is empty.
  static absl::StatusOr<ChatTemplate> FromJinja(absl::string_view jinja);

  // A template of a known family. `default_system` (ChatML only): the system message to insert
  // when a conversation has none; empty for none.
  static ChatTemplate Of(ChatTemplateKind kind, std::string default_system = "");

  // Renders `messages`; with `add_generation_prompt`, ends with the header of an assistant
  // turn. `bos_token` is the BOS text the Llama 3 template writes first (ignored by ChatML).
  // INVALID_ARGUMENT for a role other than system/user/assistant/tool.
  struct RenderOptions {
    bool add_generation_prompt = true;
    std::string bos_token;
  };
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const RenderOptions& options) const;

  ChatTemplateKind kind() const { return kind_; }
  const std::string& default_system() const { return default_system_; }

 private:
  ChatTemplate(ChatTemplateKind kind, std::string default_system)
      : kind_(kind), default_system_(std::move(default_system)) {}

  ChatTemplateKind kind_;
  std::string default_system_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
