#include "engine/tokenizer/tokenizer.h"

#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/test_vocab.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using testing::ByteLevel;
using testing::ByteLevelVocab;
using testing::SentencePieceVocab;

std::unique_ptr<Tokenizer> MustCreate(TokenizerData data) {
  auto t = Tokenizer::Create(std::move(data));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// ---- Byte-level BPE --------------------------------------------------------------------------

TEST(ByteLevelBpeTest, AppliesMergesByRank) {
  // 256: "lo", 257: "low", 258: "er", 259: "Ġl" ...
  auto tok = MustCreate(ByteLevelVocab({{"l", "o"}, {"lo", "w"}, {"e", "r"}, {"w", "er"}}));
  ASSERT_NE(tok, nullptr);
  // "lower": l o w e r -> lo w e r -> low e r -> low er ("w er" loses: w is already in "low").
  EXPECT_THAT(tok->Encode("lower"), ElementsAre(257, 258));
  EXPECT_EQ(tok->Decode({257, 258}), "lower");
  // Merges stay inside pre-tokenizer words: " lo" is "Ġ" + "lo" (there is no "Ġl" merge).
  EXPECT_THAT(tok->Encode("lo lo"), ElementsAre(256, ' ', 256));
  EXPECT_THAT(tok->Encode("ol"), ElementsAre('o', 'l'));
}

TEST(ByteLevelBpeTest, RankBeatsPosition) {
  // "abc": "b c" (rank 0) beats "a b" (rank 1) although it is further right.
  auto tok = MustCreate(ByteLevelVocab({{"b", "c"}, {"a", "b"}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc"), ElementsAre('a', 256));
  // Equal rank: leftmost first. "aaa" -> "aa" "a".
  auto tok2 = MustCreate(ByteLevelVocab({{"a", "a"}}));
  ASSERT_NE(tok2, nullptr);
  EXPECT_THAT(tok2->Encode("aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(tok2->Encode("aaaa"), ElementsAre(256, 256));
}

TEST(ByteLevelBpeTest, AllBytesRoundTrip) {
  auto tok = MustCreate(ByteLevelVocab({{"a", "b"}}));
  ASSERT_NE(tok, nullptr);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(tok->Decode(tok->Encode(all)), all);
  EXPECT_EQ(tok->Decode(tok->Encode("\xFF\xFE invalid \xC3")), "\xFF\xFE invalid \xC3");
}

TEST(ByteLevelBpeTest, BytesWithoutTokensAreDropped) {
  TokenizerData d = ByteLevelVocab({{"a", "b"}});
  d.tokens[0xFF] = "not-a-byte";
  d.tokens[0x04] = "also-not";
  auto tok = MustCreate(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a\xFF" "b\x04"), ElementsAre('a', 'b'));
  EXPECT_THAT(tok->Encode("\xFF"), ElementsAre());
  EXPECT_THAT(tok->Encode("ab\xFF\xFF"), ElementsAre(256));
}

TEST(ByteLevelBpeTest, LongWordIsFast) {
  // 200k-byte single word with merges everywhere: the heap keeps this O(n log n).
  auto tok = MustCreate(ByteLevelVocab({{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}}));
  ASSERT_NE(tok, nullptr);
  const std::string word(200000, 'a');
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->Encode(word);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ids.size(), 200000u / 8);
  EXPECT_EQ(tok->Decode(ids), word);
  EXPECT_LT(elapsed, std::chrono::seconds(5));
}

TEST(ByteLevelBpeTest, SpecialTokens) {
  auto tok = MustCreate(ByteLevelVocab({{"h", "i"}}, {"<|im_start|>", "<|im_end|>"}));
  ASSERT_NE(tok, nullptr);
  const int32_t start = tok->TokenToId("<|im_start|>");
  const int32_t end = tok->TokenToId("<|im_end|>");
  ASSERT_EQ(start, 257);
  EXPECT_THAT(tok->Encode("<|im_start|>hi<|im_end|>"), ElementsAre(start, 256, end));
  // Disabled: the same text is plain bytes.
  const auto plain = tok->Encode("<|im_start|>", testing::Options(false, false));
  EXPECT_EQ(plain.size(), 12u);
  EXPECT_EQ(tok->Decode(plain), "<|im_start|>");
  EXPECT_EQ(tok->Decode({start, 256, end}), "<|im_start|>hi<|im_end|>");
  EXPECT_EQ(tok->Decode({start, 256, end}, {.skip_special = true}), "hi");
  // A partial special is text.
  EXPECT_EQ(tok->Decode(tok->Encode("<|im_sta")), "<|im_sta");
}

TEST(ByteLevelBpeTest, BosEos) {
  TokenizerData d = ByteLevelVocab({}, {"<s>", "</s>"});
  d.bos_id = 256;
  d.eos_id = 257;
  d.add_bos = true;
  d.add_eos = true;
  auto tok = MustCreate(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a", testing::Options(true)), ElementsAre(256, 'a', 257));
  EXPECT_THAT(tok->Encode("a"), ElementsAre('a'));
  EXPECT_EQ(tok->Decode({256, 'a', 999, -5}), "<s>a");  // out-of-range ids decode to nothing
}

TEST(ByteLevelBpeTest, Llama3IgnoresMergesForWholeTokens) {
  // "abc" is a token but no merge chain reaches it from "a b c" in rank order.
  TokenizerData d = ByteLevelVocab({{"b", "c"}, {"a", "b"}});
  d.tokens.push_back(ByteLevel("abc"));
  d.token_types.push_back(TokenType::kNormal);
  auto gpt2 = MustCreate(d);
  d.pre_tokenizer = "llama-bpe";
  auto llama3 = MustCreate(d);
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(llama3, nullptr);
  EXPECT_THAT(gpt2->Encode("abc"), ElementsAre('a', 256));
  EXPECT_THAT(llama3->Encode("abc"), ElementsAre(258));
}

// ---- Validation ------------------------------------------------------------------------------

TEST(TokenizerValidationTest, RejectsBadData) {
  struct Case {
    const char* name;
    std::function<void(TokenizerData&)> mutate;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"empty", [](TokenizerData& d) { d.tokens.clear(); d.token_types.clear(); },
       absl::StatusCode::kInvalidArgument},
      {"bos out of range", [](TokenizerData& d) { d.bos_id = 100000; },
       absl::StatusCode::kInvalidArgument},
      {"negative eos", [](TokenizerData& d) { d.eos_id = -7; }, absl::StatusCode::kInvalidArgument},
      {"add_bos without bos", [](TokenizerData& d) { d.add_bos = true; },
       absl::StatusCode::kInvalidArgument},
      {"types size", [](TokenizerData& d) { d.token_types.pop_back(); },
       absl::StatusCode::kInvalidArgument},
      {"bad type", [](TokenizerData& d) { d.token_types[5] = static_cast<TokenType>(9); },
       absl::StatusCode::kInvalidArgument},
      {"scores size", [](TokenizerData& d) { d.scores = {1.0f}; },
       absl::StatusCode::kInvalidArgument},
      {"merge of unknown token", [](TokenizerData& d) { d.merges.push_back("zz q"); },
       absl::StatusCode::kInvalidArgument},
      {"merge result unknown", [](TokenizerData& d) { d.merges.push_back("x y"); },
       absl::StatusCode::kInvalidArgument},
      {"merge without space", [](TokenizerData& d) { d.merges.push_back("xy"); },
       absl::StatusCode::kInvalidArgument},
      {"empty token", [](TokenizerData& d) { d.tokens[300 - 44] = ""; },
       absl::StatusCode::kInvalidArgument},
      {"unknown pre-tokenizer", [](TokenizerData& d) { d.pre_tokenizer = "bloom"; },
       absl::StatusCode::kUnimplemented},
  };
  for (const auto& c : cases) {
    TokenizerData d = ByteLevelVocab({{"a", "b"}});
    c.mutate(d);
    EXPECT_EQ(Tokenizer::Create(std::move(d)).status().code(), c.code) << c.name;
  }
}

TEST(TokenizerValidationTest, RejectsBadSentencePieceData) {
  TokenizerData d = SentencePieceVocab({{"\xE2\x96\x81" "a", -1}});
  d.tokens[3 + 0x41] = "<0xZZ>";
  EXPECT_EQ(Tokenizer::Create(d).status().code(), absl::StatusCode::kInvalidArgument);
  d = SentencePieceVocab({});
  d.merges = {"a b"};
  EXPECT_EQ(Tokenizer::Create(d).status().code(), absl::StatusCode::kInvalidArgument);
  // No byte tokens and no <unk>: some text would be unencodable.
  TokenizerData small;
  small.model = TokenizerModel::kSentencePieceBpe;
  small.tokens = {"a"};
  EXPECT_EQ(Tokenizer::Create(small).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- SentencePiece BPE -----------------------------------------------------------------------

constexpr char kSp[] = "\xE2\x96\x81";  // ▁

TEST(SentencePieceBpeTest, MergesByScoreWithDummyPrefix) {
  // ids: 259 ▁, 260 h, 261 e, 262 l, 263 o, 264 he, 265 ll, 266 ▁he, 267 llo, 268 ▁hello
  auto tok = MustCreate(SentencePieceVocab({{kSp, -10},
                                            {"h", -11},
                                            {"e", -12},
                                            {"l", -13},
                                            {"o", -14},
                                            {"he", -1},
                                            {"ll", -2},
                                            {std::string(kSp) + "he", -3},
                                            {"llo", -4},
                                            {std::string(kSp) + "hello", -5}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello", testing::Options(true)), ElementsAre(1, 268));
  EXPECT_THAT(tok->Encode("hello hell"), ElementsAre(268, 266, 265));
  EXPECT_EQ(tok->Decode({1, 268, 266, 265}), "<s>hello hell");
  EXPECT_EQ(tok->Decode({1, 268, 266, 265}, {.skip_special = true}), "hello hell");
  EXPECT_EQ(tok->Decode({268, 266, 265}), "hello hell");
}

TEST(SentencePieceBpeTest, ByteFallbackAndSpecials) {
  auto tok = MustCreate(SentencePieceVocab({{kSp, -1}, {"a", -2}}));
  ASSERT_NE(tok, nullptr);
  // "é" (C3 A9) is no token: two byte tokens.
  EXPECT_THAT(tok->Encode("a\xC3\xA9"), ElementsAre(259, 260, 3 + 0xC3, 3 + 0xA9));
  EXPECT_EQ(tok->Decode(tok->Encode("a\xC3\xA9 \xFF")), "a\xC3\xA9 \xFF");
  // A control token in the text splits it; the dummy prefix is only at the start.
  EXPECT_THAT(tok->Encode("a</s>a"), ElementsAre(259, 260, 2, 260));
  EXPECT_THAT(tok->Encode("</s>", testing::Options(false, false)).size(), 5u);
  // Empty text: nothing (BOS only when asked).
  EXPECT_TRUE(tok->Encode("").empty());
  EXPECT_THAT(tok->Encode("", testing::Options(true)), ElementsAre(1));
}

TEST(SentencePieceBpeTest, UnknownWithoutByteTokens) {
  TokenizerData d;
  d.model = TokenizerModel::kSentencePieceBpe;
  d.tokens = {"<unk>", kSp, "a"};
  d.token_types = {TokenType::kUnknown, TokenType::kNormal, TokenType::kNormal};
  d.unk_id = 0;
  auto tok = MustCreate(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("ab"), ElementsAre(1, 2, 0));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Arbitrary bytes and ids never crash, and byte-level text with all bytes round-trips.
TEST(TokenizerRobustnessTest, RandomInput) {
  std::mt19937 rng(42);
  auto byte_level = Tokenizer::Create(testing::ByteLevelVocab(
      {{"a", "b"}, {"ab", "c"}, {"\xC3", "\xA9"}, {" ", "a"}}, {"<|x|>"}));
  auto spm = Tokenizer::Create(testing::SentencePieceVocab(
      {{"\xE2\x96\x81", -1}, {"a", -2}, {"b", -3}, {"ab", -0.5f}, {"\xE2\x96\x81" "ab", -0.1f}}));
  ASSERT_TRUE(byte_level.ok() && spm.ok());
  const char alphabet[] = "ab c<|x>\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xFF\n";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      text.push_back(rng() % 4 == 0 ? static_cast<char>(rng() % 256)
                                    : alphabet[rng() % (sizeof(alphabet) - 1)]);
    }
    for (const auto* tok : {byte_level->get(), spm->get()}) {
      const bool parse = rng() % 2 == 0;
      const std::vector<int32_t> ids = tok->Encode(text, testing::Options(false, parse));
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size()) << id;
      ASSERT_EQ(tok->Decode(ids), text);
      std::vector<int32_t> junk;
      for (int i = 0; i < 10; ++i) junk.push_back(static_cast<int32_t>(rng() % 600) - 100);
      (void)tok->Decode(junk);
    }
  }
}

}  // namespace
}  // namespace tandem
