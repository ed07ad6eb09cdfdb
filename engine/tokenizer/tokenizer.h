// Text <-> token ids for the models Tandem serves: byte-level BPE (GPT-2, SmolLM2, Llama 3) and
// SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama).
//
//   ASSIGN_OR_RETURN(TokenizerData data, TokenizerDataFromGguf(gguf));   // gguf_tokenizer.h
//   ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Create(std::move(data)));
//   std::vector<int32_t> ids = tok->Encode("Hello", {.add_bos = true});
//   std::string text = tok->Decode(ids);
//
// Thread-safety: a Tokenizer is immutable after Create(); every const method is thread-safe.
// Errors: Create() validates the data and returns INVALID_ARGUMENT (or UNIMPLEMENTED for an
// unknown pre-tokenizer); after that, Encode() accepts any bytes (invalid UTF-8 included) and
// Decode() any ids (out-of-range ids decode to nothing).
#ifndef TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace tandem {

// GGUF's token types (the numbers are tokenizer.ggml.token_type's values).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // e.g. <|im_start|>, <s>; matched in text only when parsing specials
  kUserDefined = 4,  // always matched in text as a whole
  kUnused = 5,
  kByte = 6,  // SentencePiece byte-fallback tokens "<0xAB>"
};

enum class TokenizerModel {
  kByteLevelBpe,       // GGUF "gpt2": GPT-2 byte-level BPE with ranked merges
  kSentencePieceBpe,   // GGUF "llama": SentencePiece BPE, score-based merges, byte fallback
};

// Everything a tokenizer is made of. A plain struct: fill it (from a GGUF file, a test, ...)
// and hand it to Tokenizer::Create(), which checks it.
struct TokenizerData {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  // Byte-level BPE only: the GGUF `tokenizer.ggml.pre` name (see PreTokenizerKindFromName()).
  std::string pre_tokenizer = "gpt2";

  // The vocabulary; index = token id. Byte-level BPE tokens are in GPT-2's byte-to-unicode
  // alphabet ("Ġthe"); SentencePiece tokens use U+2581 for spaces ("▁the").
  std::vector<std::string> tokens;
  // Per-token merge scores (SentencePiece BPE: higher merges first). Empty, or one per token.
  std::vector<float> scores;
  // Per-token types. Empty (all kNormal), or one per token.
  std::vector<TokenType> token_types;
  // BPE merges by rank (first = applied first): "left right", both tokens. Byte-level BPE
  // needs them; SentencePiece BPE merges by rank when they are given (Hugging Face
  // tokenizer.json), by score otherwise (GGUF).
  std::vector<std::string> merges;

  // Special ids; -1 when the model has none.
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;  // prepend bos_id when EncodeOptions::add_special is set
  bool add_eos = false;  // append eos_id when EncodeOptions::add_special is set
  // SentencePiece BPE only: prefix the text with a space (the "dummy prefix").
  bool add_space_prefix = true;
  // SentencePiece BPE only, as Hugging Face's Metaspace/Prepend do it: the dummy prefix goes on
  // every fragment between special tokens (not only the text's first), ...
  bool space_prefix_every_fragment = false;
  // ... but not on a fragment that already starts with a space ...
  bool space_prefix_unless_space = false;
  // ... and BPE works within words that each begin at a space (Metaspace `split`).
  bool split_at_spaces = false;
  // Byte-level BPE: a word that is itself a token is not split. Unset: as the pre-tokenizer
  // implies (Llama 3 sets it).
  std::optional<bool> ignore_merges;
  // Special tokens that, when matched in text, absorb the whitespace on their left / right
  // (Hugging Face added_tokens' lstrip / rstrip).
  std::vector<int32_t> lstrip_ids;
  std::vector<int32_t> rstrip_ids;
  // Text between special tokens is put in Unicode NFC before it is split (a tokenizer.json NFC
  // normalizer; GGUF files do not say, and llama.cpp does not normalize them). Text that is not
  // valid UTF-8 is split as it is.
  bool normalize_nfc = false;

  // The Jinja chat template text (tokenizer.chat_template); may be empty.
  std::string chat_template;
};

struct EncodeOptions {
  // Add BOS/EOS as TokenizerData::add_bos / add_eos say.
  bool add_special = false;
  // Match control tokens (<|im_start|>, <s>, ...) written in the text. When false they are
  // tokenized as plain text. User-defined tokens are always matched.
  bool parse_special = true;
};

struct DecodeOptions {
  // Leave out control tokens (BOS, EOS, <|im_end|>, ...).
  bool skip_special = false;
};

class Tokenizer {
 public:
  // Validates `data`: a non-empty vocabulary of non-empty tokens (for a token spelled twice,
  // lookups find the lower id), scores and types sized to match, known token types, special
  // ids in range, merges naming known tokens whose concatenation is a token, <0xXX> byte
  // tokens well-formed, and (SentencePiece) every byte representable by a byte token or the
  // unknown token. INVALID_ARGUMENT otherwise. Byte-level BPE vocabularies
  // may lack some single-byte tokens: Encode() drops such bytes (as Hugging Face and llama.cpp
  // do), so Decode(Encode(x)) == x holds only for text made of bytes that have tokens.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerData data);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  std::vector<int32_t> Encode(absl::string_view text, const EncodeOptions& options = {}) const;

  // The bytes the ids stand for (may be invalid UTF-8 when a sequence is cut in the middle of
  // a character; use SanitizeUtf8() or a StreamingDetokenizer for display).
  std::string Decode(const std::vector<int32_t>& ids, const DecodeOptions& options = {}) const;

  // The bytes of one token as they appear in decoded text (no dummy-prefix removal). Empty for
  // an out-of-range id, and for a control token when skip_special is set.
  std::string TokenBytes(int32_t id, const DecodeOptions& options = {}) const;

  int32_t vocab_size() const { return static_cast<int32_t>(data_.tokens.size()); }
  const TokenizerData& data() const { return data_; }
  int32_t bos_id() const { return data_.bos_id; }
  int32_t eos_id() const { return data_.eos_id; }
  // The id of the token spelled exactly `token` (vocabulary spelling), or -1.
  int32_t TokenToId(absl::string_view token) const;
  bool IsControl(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };

  explicit Tokenizer(TokenizerData data);
  absl::Status Init();
  absl::Status InitMerges();

  // One fragment of raw text (no special tokens inside) appended to `out`.
  void EncodeByteLevel(absl::string_view text, std::vector<int32_t>* out) const;
  void EncodeSentencePiece(absl::string_view text, std::vector<int32_t>* out) const;
  void BpeWord(absl::string_view word, std::vector<int32_t>* out) const;
  void EncodeSentencePieceRanked(absl::string_view text, std::vector<int32_t>* out) const;
  // Applies merges_ by rank to `ids` (-1 entries never merge and are dropped) into `out`.
  void MergeRanked(std::vector<int32_t> ids, std::vector<int32_t>* out) const;

  TokenType type(int32_t id) const;

  TokenizerData data_;
  PreTokenizerKind pre_kind_ = PreTokenizerKind::kGpt2;
  bool ignore_merges_ = false;  // Llama 3: a word that is a token is not split
  // Decoded bytes of each token (byte-level: GPT-2 alphabet undone; SPM: "▁" -> " ", <0xAB>).
  std::vector<std::string> token_bytes_;
  // Normal-text lookup: bytes -> id (byte-level), vocabulary text -> id (SentencePiece).
  absl::flat_hash_map<std::string, int32_t> text_to_id_;
  // Vocabulary spelling -> id, for TokenToId().
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  // Byte-level: byte -> id of its single-byte token; SentencePiece: byte -> <0xXX> id. -1: none.
  int32_t byte_ids_[256];
  // Byte-level BPE merges keyed by (left id << 32 | right id).
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Specials matched in the text, longest first per first byte.
  struct Special {
    std::string text;
    int32_t id;
    bool control;
    bool lstrip = false;
    bool rstrip = false;
  };
  std::vector<std::vector<Special>> specials_by_first_byte_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
