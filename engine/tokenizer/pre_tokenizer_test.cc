#include "engine/tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAreArray;

std::vector<std::string> Split(PreTokenizerKind kind, const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view p : PreTokenize(kind, text)) out.emplace_back(p);
  EXPECT_EQ(absl::StrJoin(out, ""), text);
  return out;
}

TEST(PreTokenizerTest, Names) {
  EXPECT_EQ(*PreTokenizerKindFromName("smollm"), PreTokenizerKind::kSmolLm);
  EXPECT_EQ(*PreTokenizerKindFromName("llama-bpe"), PreTokenizerKind::kLlama3);
  EXPECT_EQ(*PreTokenizerKindFromName("gpt2"), PreTokenizerKind::kGpt2);
  EXPECT_EQ(PreTokenizerKindFromName("deepseek-coder").status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(PreTokenizerTest, Gpt2) {
  const auto k = PreTokenizerKind::kGpt2;
  EXPECT_THAT(Split(k, "Hello world's 123 !!"),
              ElementsAreArray({"Hello", " world", "'s", " 123", " !!"}));
  // Whitespace runs leave their last space to the next word; trailing runs stay whole.
  EXPECT_THAT(Split(k, "a   b  "), ElementsAreArray({"a", "  ", " b", "  "}));
  EXPECT_THAT(Split(k, "a\n\nb"), ElementsAreArray({"a", "\n", "\n", "b"}));
  EXPECT_THAT(Split(k, "x\n b"), ElementsAreArray({"x", "\n", " b"}));
  EXPECT_THAT(Split(k, "I'M"), ElementsAreArray({"I", "'", "M"}));  // case-sensitive
  EXPECT_THAT(Split(k, "안녕하세요 世界"), ElementsAreArray({"안녕하세요", " 世界"}));
}

TEST(PreTokenizerTest, SmolLmSplitsDigits) {
  EXPECT_THAT(Split(PreTokenizerKind::kSmolLm, "ab 2024x"),
              ElementsAreArray({"ab", " ", "2", "0", "2", "4", "x"}));
}

TEST(PreTokenizerTest, Llama3) {
  const auto k = PreTokenizerKind::kLlama3;
  EXPECT_THAT(Split(k, "1234567 I'M (hello)"),
              ElementsAreArray({"123", "456", "7", " I", "'M", " (", "hello", ")"}));
  EXPECT_THAT(Split(k, "a  \n\n b"), ElementsAreArray({"a", "  \n\n", " b"}));
  EXPECT_THAT(Split(k, "x;\n\ny"), ElementsAreArray({"x", ";\n\n", "y"}));
}

TEST(PreTokenizerTest, InvalidUtf8IsKept) {
  const std::string text = "a\xFF\xFE b\xC3";
  EXPECT_THAT(Split(PreTokenizerKind::kGpt2, text),
              ElementsAreArray({"a", "\xFF\xFE", " b", "\xC3"}));
  Split(PreTokenizerKind::kLlama3, text);
}

}  // namespace
}  // namespace tandem
