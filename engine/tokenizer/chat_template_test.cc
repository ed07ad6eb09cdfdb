#include "engine/tokenizer/chat_template.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

ChatTemplate::RenderOptions Prompt(bool add_generation_prompt, std::string bos = "") {
  ChatTemplate::RenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = std::move(bos);
  return o;
}

constexpr char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplateTest, ChatMlWithDefaultSystem) {
  auto t = ChatTemplate::FromJinja(kSmolLm2Template);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(t->default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  auto text = t->Render({{"user", "Hi"}}, Prompt(true));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  text = t->Render({{"system", "S"}, {"user", "U"}}, Prompt(false));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplateTest, Llama3) {
  auto t = ChatTemplate::FromJinja(
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
      "message['content'] | trim + '<|eot_id|>' %}");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplateKind::kLlama3);
  auto text = t->Render({{"system", " S \n"}, {"user", "U"}},
                        Prompt(true, "<|begin_of_text|>"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Errors) {
  EXPECT_EQ(ChatTemplate::FromJinja("{{ messages }}").status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ChatTemplate::FromJinja("").status().code(), absl::StatusCode::kInvalidArgument);
  // Variants whose logic is not understood are refused, not rendered approximately.
  for (const char* jinja : {
           "{%- if tools %}<|im_start|>system\n{{ tools }}<|im_end|>{% endif %}<|im_start|>",
           "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- else %}"
           "{{ '<|im_start|>system\nYou are Qwen.<|im_end|>\n' }}{%- endif %}<|im_start|>",
           "<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date<|eot_id|>",
       }) {
    EXPECT_EQ(ChatTemplate::FromJinja(jinja).status().code(), absl::StatusCode::kUnimplemented)
        << jinja;
  }
  EXPECT_EQ(ChatTemplate::FromJinja("{{'<|im_start|>' + m + '<|im_end|>'}}")->kind(),
            ChatTemplateKind::kChatMl);
  const ChatTemplate t = ChatTemplate::Of(ChatTemplateKind::kChatMl);
  EXPECT_EQ(t.Render({{"wizard", "x"}}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto empty = t.Render({}, Prompt(true));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "<|im_start|>assistant\n");
}

}  // namespace
}  // namespace tandem
