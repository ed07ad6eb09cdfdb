#include "engine/tokenizer/unicode.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(UnicodeTest, Classes) {
  EXPECT_EQ(CodepointClass('a'), kUnicodeLetter);
  EXPECT_EQ(CodepointClass(U'한'), kUnicodeLetter);
  EXPECT_EQ(CodepointClass(U'中'), kUnicodeLetter);
  EXPECT_EQ(CodepointClass('7'), kUnicodeNumber);
  EXPECT_EQ(CodepointClass(U'½'), kUnicodeNumber);
  EXPECT_EQ(CodepointClass(U'٣'), kUnicodeNumber);
  EXPECT_EQ(CodepointClass(' '), kUnicodeWhitespace);
  EXPECT_EQ(CodepointClass('\n'), kUnicodeWhitespace);
  EXPECT_EQ(CodepointClass(0x3000), kUnicodeWhitespace);
  EXPECT_EQ(CodepointClass(0x1C), 0);  // not White_Space, although Python's isspace() says so
  EXPECT_EQ(CodepointClass('!'), 0);
  EXPECT_EQ(CodepointClass(0x1F600), 0);  // emoji
  EXPECT_EQ(CodepointClass(0x10FFFF), 0);
  EXPECT_EQ(CodepointClass(kInvalidCodepoint), 0);
}

TEST(UnicodeTest, DecodeValidAndInvalid) {
  struct Case {
    std::string bytes;
    int len;
    char32_t cp;
  } cases[] = {
      {"a", 1, 'a'},
      {"\xC3\xA9", 2, 0xE9},
      {"\xE2\x82\xAC", 3, 0x20AC},
      {"\xF0\x9F\x98\x80", 4, 0x1F600},
      {"\xC3", 1, kInvalidCodepoint},              // truncated
      {"\xC0\x80", 1, kInvalidCodepoint},          // overlong
      {"\xED\xA0\x80", 1, kInvalidCodepoint},      // surrogate
      {"\xF4\x90\x80\x80", 1, kInvalidCodepoint},  // > U+10FFFF
      {"\x80", 1, kInvalidCodepoint},              // lone continuation
      {"\xFF", 1, kInvalidCodepoint},
  };
  for (const auto& c : cases) {
    char32_t cp = 0;
    EXPECT_EQ(DecodeUtf8(c.bytes, 0, &cp), c.len) << c.bytes;
    EXPECT_EQ(cp, c.cp);
  }
}

TEST(UnicodeTest, AppendUtf8RoundTrips) {
  for (char32_t cp : {0x0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF}) {
    std::string s;
    AppendUtf8(cp, &s);
    char32_t back = 0;
    EXPECT_EQ(DecodeUtf8(s, 0, &back), static_cast<int>(s.size()));
    EXPECT_EQ(back, cp);
  }
}

TEST(UnicodeTest, SanitizeMatchesPythonReplace) {
  // Expected values from Python: bytes.decode("utf-8", "replace").
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(SanitizeUtf8("abc"), "abc");
  EXPECT_EQ(SanitizeUtf8("a\xE2\x82"), "a" + r);          // one U+FFFD for a truncated char
  EXPECT_EQ(SanitizeUtf8("\xE2\x82" "b"), r + "b");
  EXPECT_EQ(SanitizeUtf8("\xFF\xFE"), r + r);
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(SanitizeUtf8("\xE0\x80\x80"), r + r + r);     // overlong: each byte
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), r + r + r);     // surrogate: each byte
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(UnicodeTest, CompleteUtf8Prefix) {
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("ab"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82"), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2"), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);         // invalid: not held back
  EXPECT_EQ(CompleteUtf8Prefix("\xE2\x82x\xF0"), 3u);  // broken in the middle, held at the end
}

TEST(UnicodeTest, ByteMapIsABijection) {
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    EXPECT_EQ(UnicodeToByte(cp), b);
  }
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToUnicode('a'), static_cast<char32_t>('a'));
  EXPECT_EQ(UnicodeToByte(0x4E2D), -1);
}

}  // namespace
}  // namespace tandem
