#include "engine/tokenizer/pre_tokenizer.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/unicode.h"

namespace tandem {
namespace {

// The text as code points with their byte offsets (offsets has one extra entry: the end).
struct Codepoints {
  std::vector<char32_t> cps;
  std::vector<uint8_t> cls;
  std::vector<size_t> offsets;

  explicit Codepoints(absl::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
      char32_t cp;
      const int len = DecodeUtf8(text, pos, &cp);
      cps.push_back(cp);
      cls.push_back(CodepointClass(cp));
      offsets.push_back(pos);
      pos += len;
    }
    offsets.push_back(pos);
  }
  size_t size() const { return cps.size(); }
  bool IsL(size_t i) const { return cls[i] & kUnicodeLetter; }
  bool IsN(size_t i) const { return cls[i] & kUnicodeNumber; }
  bool IsS(size_t i) const { return cls[i] & kUnicodeWhitespace; }
  bool IsOther(size_t i) const { return cls[i] == 0; }  // [^\s\p{L}\p{N}]
};

char32_t Lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t Contraction(const Codepoints& t, size_t i, bool ignore_case) {
  const size_t n = t.size();
  if (t.cps[i] != '\'' || i + 1 >= n) return 0;
  auto at = [&](size_t k) { return ignore_case ? Lower(t.cps[k]) : t.cps[k]; };
  const char32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < n) {
    const char32_t b = at(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// \s+(?!\S)|\s+ at i (REQUIRES: t.IsS(i)).
size_t Whitespace(const Codepoints& t, size_t i) {
  size_t k = i;
  while (k < t.size() && t.IsS(k)) ++k;
  if (k == t.size() || k - i == 1) return k - i;
  return k - 1 - i;
}

size_t MatchGpt2(const Codepoints& t, size_t i) {
  const size_t n = t.size();
  if (size_t len = Contraction(t, i, /*ignore_case=*/false)) return len;
  size_t j = (t.cps[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (j == i + 1 && t.IsS(j)) j = i;  // " " followed by whitespace: a whitespace run
  if (t.IsL(j)) {
    while (j < n && t.IsL(j)) ++j;
    return j - i;
  }
  if (t.IsN(j)) {
    while (j < n && t.IsN(j)) ++j;
    return j - i;
  }
  if (t.IsOther(j)) {
    while (j < n && t.IsOther(j)) ++j;
    return j - i;
  }
  return Whitespace(t, i);
}

bool IsCrLf(char32_t c) { return c == '\r' || c == '\n'; }

size_t MatchLlama3(const Codepoints& t, size_t i, size_t max_digits) {
  const size_t n = t.size();
  if (size_t len = Contraction(t, i, /*ignore_case=*/true)) return len;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!t.IsL(j) && !t.IsN(j) && !IsCrLf(t.cps[j]) && j + 1 < n && t.IsL(j + 1)) ++j;
    if (t.IsL(j)) {
      while (j < n && t.IsL(j)) ++j;
      return j - i;
    }
  }
  // \p{N}{1,max_digits}
  if (t.IsN(i)) {
    size_t j = i;
    while (j < n && t.IsN(j) && j - i < max_digits) ++j;
    return j - i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = (t.cps[i] == ' ' && i + 1 < n) ? i + 1 : i;
    if (t.IsOther(j)) {
      while (j < n && t.IsOther(j)) ++j;
      while (j < n && IsCrLf(t.cps[j])) ++j;
      return j - i;
    }
  }
  // \s*[\r\n]+ : through the last \r or \n of the whitespace run.
  size_t k = i;
  size_t last_crlf = n;
  while (k < n && t.IsS(k)) {
    if (IsCrLf(t.cps[k])) last_crlf = k;
    ++k;
  }
  if (last_crlf != n) return last_crlf + 1 - i;
  if (t.IsS(i)) return Whitespace(t, i);
  return 1;  // unreachable: every code point is in exactly one of the classes above
}

void SplitWith(PreTokenizerKind kind, absl::string_view text,
               std::vector<absl::string_view>* out) {
  const Codepoints t(text);
  size_t i = 0;
  while (i < t.size()) {
    size_t len = 0;
    switch (kind) {
      case PreTokenizerKind::kGpt2:
      case PreTokenizerKind::kSmolLm:
        len = MatchGpt2(t, i);
        break;
      case PreTokenizerKind::kLlama3:
        len = MatchLlama3(t, i, 3);
        break;
      case PreTokenizerKind::kQwen2:
        len = MatchLlama3(t, i, 1);
        break;
    }
    if (len == 0) len = 1;  // defensive: always make progress
    out->push_back(text.substr(t.offsets[i], t.offsets[i + len] - t.offsets[i]));
    i += len;
  }
}

}  // namespace

absl::StatusOr<PreTokenizerKind> PreTokenizerKindFromName(absl::string_view name) {
  if (name.empty() || name == "gpt2" || name == "default") return PreTokenizerKind::kGpt2;
  if (name == "smollm" || name == "starcoder" || name == "refact") return PreTokenizerKind::kSmolLm;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizerKind::kLlama3;
  if (name == "qwen2") return PreTokenizerKind::kQwen2;
  return absl::UnimplementedError(absl::StrCat(
      "unsupported pre-tokenizer '", name,
      "' (supported: gpt2, default, smollm, starcoder, refact, llama-bpe, llama3, qwen2)"));
}

std::vector<absl::string_view> PreTokenize(PreTokenizerKind kind, absl::string_view text) {
  std::vector<absl::string_view> out;
  if (kind != PreTokenizerKind::kSmolLm) {
    SplitWith(kind, text, &out);
    return out;
  }
  // Each \p{N} is its own piece; the text between them goes through the GPT-2 rules.
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    const int len = DecodeUtf8(text, pos, &cp);
    if (CodepointClass(cp) & kUnicodeNumber) {
      if (pos > start) SplitWith(PreTokenizerKind::kGpt2, text.substr(start, pos - start), &out);
      out.push_back(text.substr(pos, len));
      start = pos + len;
    }
    pos += len;
  }
  if (pos > start) SplitWith(PreTokenizerKind::kGpt2, text.substr(start, pos - start), &out);
  return out;
}

}  // namespace tandem
