// Unicode helpers for the tokenizer: UTF-8 decoding and encoding, the character classes the
// pre-tokenizers need (\p{L}, \p{N}, \s), and GPT-2's byte <-> printable-character mapping.
//
// All functions are pure and thread-safe. Invalid UTF-8 never crashes: decoding reports it.
#ifndef TANDEM_ENGINE_TOKENIZER_UNICODE_H_
#define TANDEM_ENGINE_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// Character class bits returned by CodepointClass().
inline constexpr uint8_t kUnicodeLetter = 1;      // general category L*
inline constexpr uint8_t kUnicodeNumber = 2;      // general category N*
inline constexpr uint8_t kUnicodeWhitespace = 4;  // White_Space property

// Stands for a byte that does not start a valid UTF-8 sequence.
inline constexpr char32_t kInvalidCodepoint = 0xFFFFFFFF;

// The class bits of `cp`; 0 for kInvalidCodepoint and unassigned code points.
uint8_t CodepointClass(char32_t cp);

// Decodes the UTF-8 sequence starting at text[pos] (REQUIRES: pos < text.size()). Returns its
// length in bytes (1..4) and stores the code point in *cp. A byte that does not begin a complete,
// valid, shortest-form sequence (no surrogates, <= U+10FFFF) yields length 1 and
// kInvalidCodepoint.
int DecodeUtf8(absl::string_view text, size_t pos, char32_t* cp);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF).
void AppendUtf8(char32_t cp, std::string* out);

// The number of bytes at the start of `bytes` that form complete, valid UTF-8 up to where an
// incomplete-but-so-far-valid sequence begins at the very end. Example: "a\xE2\x82" -> 1.
// Invalid bytes in the middle count as consumed (callers replace them).
size_t CompleteUtf8Prefix(absl::string_view bytes);

// Converts `bytes` to valid UTF-8, replacing each maximal invalid subpart by U+FFFD (the same
// result as Python's bytes.decode("utf-8", "replace")).
std::string SanitizeUtf8(absl::string_view bytes);

// GPT-2 byte-level mapping: every byte has a printable code point (e.g. ' ' -> U+0120 'Ġ').
char32_t ByteToUnicode(uint8_t byte);
// The inverse; -1 when `cp` is not the image of a byte.
int UnicodeToByte(char32_t cp);

namespace unicode_internal {
struct CodepointRange {
  uint32_t first;
  uint32_t last;
  uint8_t flags;
};
extern const CodepointRange kCodepointRanges[];
extern const int kNumCodepointRanges;
}  // namespace unicode_internal

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_UNICODE_H_
