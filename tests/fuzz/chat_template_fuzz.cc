// Fuzzes chat template rendering (engine/tokenizer/chat_template.h, jinja.h): the input is a
// Jinja template, then optionally a NUL byte and the JSON text of `tools`. The template is parsed
// (or recognized as a built-in family) and renders a conversation with every role and a tool call,
// under tight render limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::string_view source = input;
  absl::string_view tools_json;
  if (const size_t nul = input.find('\0'); nul != absl::string_view::npos) {
    source = input.substr(0, nul);
    tools_json = input.substr(nul + 1);
  }
  (void)tandem::ChatTemplate::Recognize(source);
  auto chat = tandem::ChatTemplate::FromJinja(source);
  if (!chat.ok()) return 0;
  tandem::ChatTemplate::RenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.now = absl::FromUnixSeconds(1700000000);
  options.limits.max_steps = 100'000;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_call_depth = 16;
  if (!tools_json.empty()) {
    auto tools = tandem::JinjaValueFromJson(tools_json);
    if (tools.ok()) options.tools = *tools;
  }
  const std::vector<tandem::ChatMessage> messages = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "What is 2+2?"},
      {.role = "assistant",
       .content = "",
       .tool_calls = {{.id = "call_1", .name = "add", .arguments = R"({"a": 2, "b": 2})"}}},
      {.role = "tool", .content = "4", .tool_call_id = "call_1", .name = "add"},
      {.role = "assistant", .content = "4"},
      {.role = "user", .content = "Thanks \xff"},
  };
  (void)chat->Render(messages, options);
  options.add_generation_prompt = false;
  (void)chat->Render({messages[1]}, options);
  return 0;
}
