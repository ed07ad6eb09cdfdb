#include "engine/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace tandem {
namespace {

struct ByteMap {
  std::array<char32_t, 256> to_unicode{};
  // Images are < 0x200 (bytes map to themselves or to 256 + n).
  std::array<int16_t, 0x200> to_byte{};

  ByteMap() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_unicode[b] = cp;
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& GetByteMap() {
  static const ByteMap* const map = new ByteMap();
  return *map;
}

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The length of the longest prefix of bytes[pos..] that is a valid beginning of a UTF-8
// sequence (0 when bytes[pos] is not a valid lead byte), and the full length the sequence needs.
void ValidPrefix(absl::string_view bytes, size_t pos, int* valid, int* needed) {
  const auto b0 = static_cast<uint8_t>(bytes[pos]);
  *valid = 0;
  *needed = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    *valid = *needed = 1;
    return;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    *needed = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    *needed = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    *needed = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return;
  }
  *valid = 1;
  for (int i = 1; i < *needed && pos + i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[pos + i]);
    if (i == 1 ? (b < lo || b > hi) : !IsContinuation(b)) return;
    ++*valid;
  }
}

}  // namespace

uint8_t CodepointClass(char32_t cp) {
  using unicode_internal::kCodepointRanges;
  using unicode_internal::kNumCodepointRanges;
  const auto* end = kCodepointRanges + kNumCodepointRanges;
  const auto* it = std::upper_bound(
      kCodepointRanges, end, cp,
      [](char32_t c, const unicode_internal::CodepointRange& r) { return c < r.first; });
  if (it == kCodepointRanges) return 0;
  --it;
  return cp <= it->last ? it->flags : 0;
}

int DecodeUtf8(absl::string_view text, size_t pos, char32_t* cp) {
  int valid = 0, needed = 0;
  ValidPrefix(text, pos, &valid, &needed);
  if (valid == 0 || valid < needed) {
    *cp = kInvalidCodepoint;
    return 1;
  }
  const auto b0 = static_cast<uint8_t>(text[pos]);
  static constexpr uint8_t kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t c = b0 & kLeadMask[needed];
  for (int i = 1; i < needed; ++i) c = (c << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  *cp = c;
  return needed;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t CompleteUtf8Prefix(absl::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    int valid = 0, needed = 0;
    ValidPrefix(bytes, pos, &valid, &needed);
    if (valid == 0) {
      ++pos;  // invalid lead byte: consumed (replaced by the caller)
    } else if (valid == needed) {
      pos += valid;
    } else if (pos + valid == bytes.size()) {
      return pos;  // a valid but incomplete sequence at the end: hold it back
    } else {
      pos += valid;  // truncated by a bad byte: the maximal subpart is consumed
    }
  }
  return pos;
}

std::string SanitizeUtf8(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    int valid = 0, needed = 0;
    ValidPrefix(bytes, pos, &valid, &needed);
    if (valid != 0 && valid == needed) {
      out.append(bytes.data() + pos, valid);
      pos += valid;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += valid == 0 ? 1 : valid;
    }
  }
  return out;
}

char32_t ByteToUnicode(uint8_t byte) { return GetByteMap().to_unicode[byte]; }

int UnicodeToByte(char32_t cp) {
  if (cp >= 0x200) return -1;
  return GetByteMap().to_byte[cp];
}

}  // namespace tandem
