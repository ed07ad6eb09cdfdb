// Pre-tokenizers for byte-level BPE: split text into the pieces ("words") that BPE merges work
// inside, the way the regexes of GPT-2, StarCoder/SmolLM and Llama 3 do. The regexes are
// hand-written matchers over code points (no std::regex); character classes come from
// unicode_tables.cc.
//
//   kGpt2:     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLm:   every \p{N} on its own, then kGpt2 on the rest (StarCoder, SmolLM, Refact)
//   kLlama3:   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//              | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:    kLlama3 with \p{N} (single digits) instead of \p{N}{1,3}
//
// Invalid UTF-8 bytes are treated as single characters outside every class. Thread-safe.
#ifndef TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class PreTokenizerKind { kGpt2, kSmolLm, kLlama3, kQwen2 };

// Maps a GGUF `tokenizer.ggml.pre` name to a kind: "gpt2", "default", "" -> kGpt2;
// "smollm", "starcoder", "refact" -> kSmolLm; "llama-bpe", "llama3" -> kLlama3; "qwen2" -> kQwen2.
// Other names -> UNIMPLEMENTED naming the pre-tokenizer.
absl::StatusOr<PreTokenizerKind> PreTokenizerKindFromName(absl::string_view name);

// Splits `text` into consecutive pieces that together are exactly `text`. The returned views
// point into `text`.
std::vector<absl::string_view> PreTokenize(PreTokenizerKind kind, absl::string_view text);

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
