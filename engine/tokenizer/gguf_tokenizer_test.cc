#include "engine/tokenizer/gguf_tokenizer.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/test_vocab.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

// Builds a GGUF v3 file with metadata only.
class GgufBuilder {
 public:
  GgufBuilder& String(const std::string& key, const std::string& value) {
    Key(key, GgufValueType::kString);
    Str(value);
    return *this;
  }
  GgufBuilder& Uint32(const std::string& key, uint32_t value) {
    Key(key, GgufValueType::kUint32);
    Pod(value);
    return *this;
  }
  GgufBuilder& Bool(const std::string& key, bool value) {
    Key(key, GgufValueType::kBool);
    Pod(static_cast<uint8_t>(value));
    return *this;
  }
  GgufBuilder& Strings(const std::string& key, const std::vector<std::string>& values) {
    Key(key, GgufValueType::kArray);
    Pod(static_cast<uint32_t>(GgufValueType::kString));
    Pod(static_cast<uint64_t>(values.size()));
    for (const auto& v : values) Str(v);
    return *this;
  }
  GgufBuilder& Int32s(const std::string& key, const std::vector<int32_t>& values) {
    Key(key, GgufValueType::kArray);
    Pod(static_cast<uint32_t>(GgufValueType::kInt32));
    Pod(static_cast<uint64_t>(values.size()));
    for (int32_t v : values) Pod(v);
    return *this;
  }
  GgufBuilder& Floats(const std::string& key, const std::vector<float>& values) {
    Key(key, GgufValueType::kArray);
    Pod(static_cast<uint32_t>(GgufValueType::kFloat32));
    Pod(static_cast<uint64_t>(values.size()));
    for (float v : values) Pod(v);
    return *this;
  }

  absl::StatusOr<std::unique_ptr<GgufFile>> Build() const {
    std::string out = "GGUF";
    auto pod = [&out](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    pod(uint32_t{3});
    pod(uint64_t{0});
    pod(static_cast<uint64_t>(count_));
    out += body_;
    return GgufFile::FromBytes(out, "test.gguf");
  }

 private:
  template <typename T>
  void Pod(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Str(const std::string& s) {
    Pod(static_cast<uint64_t>(s.size()));
    body_ += s;
  }
  void Key(const std::string& key, GgufValueType type) {
    Str(key);
    Pod(static_cast<uint32_t>(type));
    ++count_;
  }
  std::string body_;
  int count_ = 0;
};

GgufBuilder ByteLevelGguf() {
  TokenizerData d = testing::ByteLevelVocab({{"h", "i"}}, {"<|im_start|>", "<|im_end|>"});
  std::vector<int32_t> types;
  for (TokenType t : d.token_types) types.push_back(static_cast<int32_t>(t));
  GgufBuilder b;
  b.String("tokenizer.ggml.model", "gpt2")
      .String("tokenizer.ggml.pre", "smollm")
      .Strings("tokenizer.ggml.tokens", d.tokens)
      .Int32s("tokenizer.ggml.token_type", types)
      .Strings("tokenizer.ggml.merges", d.merges)
      .Uint32("tokenizer.ggml.bos_token_id", 257)
      .Uint32("tokenizer.ggml.eos_token_id", 258)
      .Bool("tokenizer.ggml.add_bos_token", false)
      .String("tokenizer.chat_template", "<|im_start|><|im_end|>");
  return b;
}

TEST(GgufTokenizerTest, ReadsByteLevelBpe) {
  auto gguf = ByteLevelGguf().Build();
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto data = TokenizerDataFromGguf(**gguf);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->model, TokenizerModel::kByteLevelBpe);
  EXPECT_EQ(data->pre_tokenizer, "smollm");
  EXPECT_EQ(data->tokens.size(), 259u);
  EXPECT_EQ(data->merges.size(), 1u);
  EXPECT_EQ(data->bos_id, 257);
  EXPECT_EQ(data->eos_id, 258);
  EXPECT_EQ(data->unk_id, -1);
  EXPECT_FALSE(data->add_bos);
  EXPECT_EQ(data->chat_template, "<|im_start|><|im_end|>");
  auto tok = TokenizerFromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("<|im_start|>hi 42"), ElementsAre(257, 256, ' ', '4', '2'));
}

TEST(GgufTokenizerTest, ReadsSentencePiece) {
  TokenizerData d = testing::SentencePieceVocab({{"\xE2\x96\x81" "a", -1}});
  std::vector<int32_t> types;
  for (TokenType t : d.token_types) types.push_back(static_cast<int32_t>(t));
  auto gguf = GgufBuilder()
                  .String("tokenizer.ggml.model", "llama")
                  .Strings("tokenizer.ggml.tokens", d.tokens)
                  .Int32s("tokenizer.ggml.token_type", types)
                  .Floats("tokenizer.ggml.scores", d.scores)
                  .Uint32("tokenizer.ggml.bos_token_id", 1)
                  .Uint32("tokenizer.ggml.unknown_token_id", 0)
                  .Build();
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = TokenizerFromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE((*tok)->data().add_bos);  // llama.cpp's default for "llama"
  EXPECT_TRUE((*tok)->data().add_space_prefix);
  EXPECT_THAT((*tok)->Encode("a", testing::Options(true)), ElementsAre(1, 259));
}

TEST(GgufTokenizerTest, Errors) {
  struct Case {
    const char* name;
    GgufBuilder builder;
    absl::StatusCode code;
  };
  std::vector<Case> cases;
  cases.push_back({"no model key", GgufBuilder().Strings("tokenizer.ggml.tokens", {"a"}),
                   absl::StatusCode::kNotFound});
  cases.push_back({"unsupported model",
                   GgufBuilder().String("tokenizer.ggml.model", "bert").Strings(
                       "tokenizer.ggml.tokens", {"a"}),
                   absl::StatusCode::kUnimplemented});
  cases.push_back({"no tokens", GgufBuilder().String("tokenizer.ggml.model", "llama"),
                   absl::StatusCode::kNotFound});
  cases.push_back({"gpt2 without merges",
                   GgufBuilder().String("tokenizer.ggml.model", "gpt2").Strings(
                       "tokenizer.ggml.tokens", {"a"}),
                   absl::StatusCode::kNotFound});
  cases.push_back({"tokens of the wrong type",
                   GgufBuilder().String("tokenizer.ggml.model", "llama").Int32s(
                       "tokenizer.ggml.tokens", {1, 2}),
                   absl::StatusCode::kInvalidArgument});
  cases.push_back({"bos id of the wrong type",
                   ByteLevelGguf().String("tokenizer.ggml.unknown_token_id", "x"),
                   absl::StatusCode::kInvalidArgument});
  for (const auto& c : cases) {
    auto gguf = c.builder.Build();
    ASSERT_TRUE(gguf.ok()) << c.name << ": " << gguf.status();
    EXPECT_EQ(TokenizerDataFromGguf(**gguf).status().code(), c.code) << c.name;
  }
  // Parsed, but rejected by validation: an id out of range.
  auto gguf = ByteLevelGguf().Uint32("tokenizer.ggml.padding_token_id", 5000).Build();
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  EXPECT_EQ(TokenizerFromGguf(**gguf).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
