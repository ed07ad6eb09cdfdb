#include "engine/tokenizer/streaming_detokenizer.h"

#include <string>
#include <vector>

#include "engine/tokenizer/test_vocab.h"
#include "engine/tokenizer/unicode.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// With single-byte tokens only, each multi-byte character arrives split at every byte.
TEST(StreamingDetokenizerTest, NeverEmitsHalfACharacter) {
  auto tok = Tokenizer::Create(testing::ByteLevelVocab({}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 \xED\x95\x9C\xEA\xB8\x80z";
  StreamingDetokenizer detok(**tok);
  std::string all;
  const std::vector<int32_t> ids = (*tok)->Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (int32_t id : ids) {
    const std::string piece = detok.Add(id);
    EXPECT_EQ(SanitizeUtf8(piece), piece) << "emitted invalid UTF-8";
    EXPECT_EQ(CompleteUtf8Prefix(piece), piece.size()) << "emitted half a character";
    all += piece;
  }
  EXPECT_EQ(detok.pending_bytes(), 0u);
  all += detok.Finish();
  EXPECT_EQ(all, text);
}

// Every split point of every multi-byte character: feed prefix bytes, check nothing is emitted
// until the character completes.
TEST(StreamingDetokenizerTest, HoldsBackEveryPrefix) {
  auto tok = Tokenizer::Create(testing::ByteLevelVocab({}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const std::string ch : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {
    for (size_t split = 1; split < ch.size(); ++split) {
      StreamingDetokenizer detok(**tok);
      EXPECT_EQ(detok.Add('x'), "x");
      for (size_t i = 0; i < split; ++i) {
        EXPECT_EQ(detok.Add(static_cast<uint8_t>(ch[i])), "") << "byte " << i;
      }
      EXPECT_EQ(detok.pending_bytes(), split);
      std::string rest;
      for (size_t i = split; i < ch.size(); ++i) rest += detok.Add(static_cast<uint8_t>(ch[i]));
      EXPECT_EQ(rest, ch);
      EXPECT_EQ(detok.Finish(), "");
    }
  }
}

TEST(StreamingDetokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  auto tok = Tokenizer::Create(testing::ByteLevelVocab({}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string r = "\xEF\xBF\xBD";
  StreamingDetokenizer detok(**tok);
  EXPECT_EQ(detok.Add(0xFF), r);             // never valid: replaced at once
  EXPECT_EQ(detok.Add(0xE2), "");            // could still complete
  EXPECT_EQ(detok.Add('a'), r + "a");        // did not
  EXPECT_EQ(detok.Add(0xF0), "");
  EXPECT_EQ(detok.Add(0x9F), "");
  EXPECT_EQ(detok.Finish(), r);              // truncated at the end
  EXPECT_EQ(detok.Add('b'), "b");            // reusable
}

TEST(StreamingDetokenizerTest, MatchesDecodeForSentencePiece) {
  auto tok = Tokenizer::Create(testing::SentencePieceVocab({{"\xE2\x96\x81", -1}, {"a", -2}}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (bool bos : {false, true}) {
    const std::string text = "a \xEC\x95\x88 a";
    const std::vector<int32_t> ids = (*tok)->Encode(text, testing::Options(bos));
    StreamingDetokenizer detok(**tok, {.skip_special = true});
    std::string all;
    for (int32_t id : ids) all += detok.Add(id);
    all += detok.Finish();
    EXPECT_EQ(all, text);
    EXPECT_EQ(all, (*tok)->Decode(ids, {.skip_special = true}));
  }
}

}  // namespace
}  // namespace tandem
