#include "engine/tokenizer/chat_template.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "engine/tokenizer/test_vocab.h"
#include "engine/tokenizer/tokenizer.h"
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
  auto t = ChatTemplate::Recognize(kSmolLm2Template);
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
  auto t = ChatTemplate::Recognize(
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

TEST(ChatTemplateTest, RecognizeErrors) {
  EXPECT_EQ(ChatTemplate::Recognize("{{ messages }}").status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ChatTemplate::Recognize("").status().code(), absl::StatusCode::kInvalidArgument);
  // Variants whose logic is not understood are refused, not rendered approximately.
  for (const char* jinja : {
           "{%- if tools %}<|im_start|>system\n{{ tools }}<|im_end|>{% endif %}<|im_start|>",
           "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- else %}"
           "{{ '<|im_start|>system\nYou are Qwen.<|im_end|>\n' }}{%- endif %}<|im_start|>",
           "<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date<|eot_id|>",
       }) {
    EXPECT_EQ(ChatTemplate::Recognize(jinja).status().code(), absl::StatusCode::kUnimplemented)
        << jinja;
  }
  EXPECT_EQ(ChatTemplate::Recognize("{{'<|im_start|>' + m + '<|im_end|>'}}")->kind(),
            ChatTemplateKind::kChatMl);
  const ChatTemplate t = ChatTemplate::Of(ChatTemplateKind::kChatMl);
  EXPECT_EQ(t.Render({{"wizard", "x"}}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto empty = t.Render({}, Prompt(true));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "<|im_start|>assistant\n");
}

const std::vector<std::vector<ChatMessage>> kConversations = {
    {},
    {{"user", "Hi"}},
    {{"system", "Be brief."}, {"user", "What is 2+2?"}},
    {{"user", "  padded \n"}, {"assistant", "\tok\n"}, {"user", "\xec\x95\x88 <|im_end|>"}},
    {{"user", ""}, {"assistant", "x"}, {"system", "late system"}},
    {{"tool", "{\"result\": 4}"}},
};

// The default model's own template, run by the Jinja engine, renders exactly what the built-in
// ChatML renderer does (tests/tokenizer checks both against jinja2 with the real GGUF); a change
// to either is noticed here.
TEST(ChatTemplateTest, SmolLm2TemplateRunByJinjaMatchesBuiltinChatMl) {
  auto jinja = ChatTemplate::FromJinja(kSmolLm2Template);
  ASSERT_TRUE(jinja.ok()) << jinja.status();
  EXPECT_EQ(jinja->kind(), ChatTemplateKind::kJinja);
  EXPECT_EQ(jinja->fallback_reason(), "");
  auto builtin = ChatTemplate::Recognize(kSmolLm2Template);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  for (bool gen : {true, false}) {
    for (const auto& messages : kConversations) {
      auto a = jinja->Render(messages, Prompt(gen));
      auto b = builtin->Render(messages, Prompt(gen));
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(*a, *b) << "message count " << messages.size();
    }
  }
}

TEST(ChatTemplateTest, JinjaGetsBosEosToolsAndGenerationPrompt) {
  auto t = ChatTemplate::FromJinja(
      "{{ bos_token }}|{% for m in messages %}{{ m.role }}={{ m['content'] }};{% endfor %}|"
      "{{ tools | tojson if tools is defined else 'no tools' }}|"
      "{% if add_generation_prompt %}GEN{% endif %}{{ eos_token }}");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatTemplate::RenderOptions options = Prompt(true, "<s>");
  options.eos_token = "</s>";
  auto text = t->Render({{"system", "S"}, {"user", "U"}}, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<s>|system=S;user=U;|no tools|GEN</s>");
  jinja::ValueDict tool;
  tool.Set("name", jinja::Value::String("add"));
  options.tools = jinja::Value::List({jinja::Value::Dict(std::move(tool))});
  options.add_generation_prompt = false;
  text = t->Render({}, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<s>||[{\"name\": \"add\"}]|</s>");
}

// An assistant's calls reach a template as transformers passes them: arguments as an object
// (key order kept), content None; a tool message's tool_call_id and name as given.
TEST(ChatTemplateTest, JinjaGetsToolCallsAndToolMessages) {
  auto t = ChatTemplate::FromJinja(
      "{% for m in messages %}{{ m.role }}:{{ m.content is none }}:"
      "{% for c in m.tool_calls or [] %}{{ c.id }} {{ c.type }} {{ c.function.name }} "
      "{{ c.function.arguments | tojson }} {{ c.function.arguments.b }};{% endfor %}"
      "{{ m.tool_call_id or '' }}{{ m.name or '' }}|{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> messages = {
      {.role = "assistant",
       .content = "",
       .tool_calls = {{.id = "c1", .name = "add", .arguments = R"({"b": [1.5, null], "a": 2})"}}},
      {.role = "tool", .content = "3", .tool_call_id = "c1", .name = "add"},
      {.role = "assistant", .content = ""}};
  auto text = t->Render(messages, Prompt(false));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "assistant:True:c1 function add {\"b\": [1.5, null], \"a\": 2} [1.5, None];|"
            "tool:False:c1add|assistant:False:|");
  messages[0].tool_calls[0].arguments = "[1]";
  EXPECT_EQ(t->Render(messages, Prompt(false)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(JinjaValueFromJson("{oops").ok());
}

// A template that raises for a conversation (Mistral's and Gemma's "roles must alternate")
// fails that request with INVALID_ARGUMENT carrying its message; so does one that runs away.
TEST(ChatTemplateTest, RenderErrorsAreInvalidArgumentWithTheTemplatesMessage) {
  auto t = ChatTemplate::FromJinja(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->Render({{"user", "a"}, {"assistant", "b"}}, Prompt(true)).ok());
  auto bad = t->Render({{"user", "a"}, {"user", "b"}}, Prompt(true));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "roles must alternate"))
      << bad.status().message();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "line 1")) << bad.status().message();

  auto runaway = ChatTemplate::FromJinja(
      "{% for m in messages %}{% for i in range(100000) %}{{ m.content }}{% endfor %}"
      "{% endfor %}");
  ASSERT_TRUE(runaway.ok()) << runaway.status();
  ChatTemplate::RenderOptions options = Prompt(true);
  options.limits.max_output_bytes = 1000;
  auto big = runaway->Render({{"user", "0123456789"}}, options);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  // Unknown roles are refused before the template runs, whatever it would do with them.
  EXPECT_EQ(runaway->Render({{"wizard", "x"}}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A template that does not parse falls back to the built-in renderer that reproduces it, with the
// parse error kept (and logged); one that no built-in reproduces is refused with the parse error.
TEST(ChatTemplateTest, UnparsableTemplateFallsBackToItsFamilyOrIsRefused) {
  // SmolLM2's template with an unclosed block after the part that matters.
  const std::string broken = std::string(kSmolLm2Template) + "{% if add_generation_prompt %}";
  auto t = ChatTemplate::FromJinja(broken);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplateKind::kChatMl);
  // The unclosed block is on the template's last line.
  EXPECT_TRUE(absl::StartsWith(t->fallback_reason(), "line 6:")) << t->fallback_reason();
  EXPECT_EQ(t->default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

  auto refused = ChatTemplate::FromJinja("{% for m in messages %}{{ m.content }\n");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "does not parse (line "))
      << refused.status().message();
  EXPECT_EQ(ChatTemplate::FromJinja("").status().code(), absl::StatusCode::kInvalidArgument);
}

// Which renderer a model gets: its template when it has one (even when its vocabulary would
// suggest another family), else the built-in its vocabulary's special tokens imply, else none.
TEST(ChatTemplateTest, ForModelChoosesTemplateThenVocabulary) {
  struct Case {
    std::vector<std::string> specials;
    std::string chat_template;
    absl::StatusCode code;
    ChatTemplateKind kind;
  };
  for (const Case& c : {
           Case{{"<|im_start|>", "<|im_end|>"}, "", absl::StatusCode::kOk,
                ChatTemplateKind::kChatMl},
           Case{{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, "",
                absl::StatusCode::kOk, ChatTemplateKind::kLlama3},
           Case{{"<|im_start|>", "<|im_end|>"}, "{{ messages[0].content }}",
                absl::StatusCode::kOk, ChatTemplateKind::kJinja},
           Case{{"<|im_start|>"}, "", absl::StatusCode::kNotFound, ChatTemplateKind::kJinja},
           Case{{}, "", absl::StatusCode::kNotFound, ChatTemplateKind::kJinja},
           Case{{"<|im_start|>", "<|im_end|>"}, "{% if %}", absl::StatusCode::kInvalidArgument,
                ChatTemplateKind::kJinja},
       }) {
    TokenizerData data = testing::ByteLevelVocab({}, c.specials);
    data.chat_template = c.chat_template;
    auto tokenizer = Tokenizer::Create(std::move(data));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto t = ChatTemplate::ForModel(**tokenizer);
    EXPECT_EQ(t.status().code(), c.code) << c.chat_template << " " << t.status();
    if (t.ok()) {
      EXPECT_EQ(t->kind(), c.kind) << c.chat_template;
    }
  }
}

TEST(ChatTemplateTest, OptionsForSpellsTheTokenizersBosAndEos) {
  TokenizerData data = testing::SentencePieceVocab({});
  auto tokenizer = Tokenizer::Create(std::move(data));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const ChatTemplate::RenderOptions options = ChatTemplate::OptionsFor(**tokenizer);
  EXPECT_TRUE(options.add_generation_prompt);
  EXPECT_EQ(options.bos_token, "<s>");
  EXPECT_EQ(options.eos_token, "</s>");
  EXPECT_FALSE(options.tools.has_value());
}

}  // namespace
}  // namespace tandem
