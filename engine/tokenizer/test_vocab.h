// Tiny hand-made vocabularies for the tokenizer's unit tests.
#ifndef TANDEM_ENGINE_TOKENIZER_TEST_VOCAB_H_
#define TANDEM_ENGINE_TOKENIZER_TEST_VOCAB_H_

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::testing {

// GPT-2 alphabet spelling of raw bytes ("a b" -> "aĠb").
inline std::string ByteLevel(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) AppendUtf8(ByteToUnicode(c), &out);
  return out;
}

// A byte-level BPE vocabulary: ids 0..255 are the bytes, then one token per merge (in order),
// then `specials` as control tokens. Merges are given in raw bytes: {"h", "e"} merges to "he".
inline TokenizerData ByteLevelVocab(const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::vector<std::string>& specials = {}) {
  TokenizerData d;
  d.model = TokenizerModel::kByteLevelBpe;
  d.pre_tokenizer = "gpt2";
  for (int b = 0; b < 256; ++b) d.tokens.push_back(ByteLevel(std::string(1, static_cast<char>(b))));
  for (const auto& [l, r] : merges) {
    d.merges.push_back(ByteLevel(l) + " " + ByteLevel(r));
    d.tokens.push_back(ByteLevel(l + r));
  }
  d.token_types.assign(d.tokens.size(), TokenType::kNormal);
  for (const auto& s : specials) {
    d.tokens.push_back(s);
    d.token_types.push_back(TokenType::kControl);
  }
  return d;
}

// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 <0xXX> byte tokens (ids 3..258), then
// `pieces` (spaces written as ▁) with the given scores.
inline TokenizerData SentencePieceVocab(const std::vector<std::pair<std::string, float>>& pieces) {
  TokenizerData d;
  d.model = TokenizerModel::kSentencePieceBpe;
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.token_types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  d.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    d.tokens.push_back(buf);
    d.token_types.push_back(TokenType::kByte);
    d.scores.push_back(0);
  }
  for (const auto& [p, s] : pieces) {
    d.tokens.push_back(p);
    d.token_types.push_back(TokenType::kNormal);
    d.scores.push_back(s);
  }
  d.unk_id = 0;
  d.bos_id = 1;
  d.eos_id = 2;
  d.add_bos = true;
  return d;
}

// EncodeOptions without designated initializers (GCC warns about the fields left out).
inline EncodeOptions Options(bool add_special, bool parse_special = true) {
  EncodeOptions o;
  o.add_special = add_special;
  o.parse_special = parse_special;
  return o;
}

}  // namespace tandem::testing

#endif  // TANDEM_ENGINE_TOKENIZER_TEST_VOCAB_H_
