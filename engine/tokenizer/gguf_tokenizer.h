// Reads a tokenizer out of a GGUF file's `tokenizer.*` metadata (keys listed in gguf.h).
#ifndef TANDEM_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

// Copies the tokenizer metadata of `gguf` into a TokenizerData (which does not refer to `gguf`
// afterwards). Required: tokenizer.ggml.model ("gpt2" or "llama") and tokenizer.ggml.tokens;
// "gpt2" also needs tokenizer.ggml.merges. Missing optional keys take their defaults
// (llama.cpp's: add_bos true for "llama", false for "gpt2"; add_space_prefix true for "llama").
// NOT_FOUND for a missing required key, INVALID_ARGUMENT for a key of the wrong type,
// UNIMPLEMENTED for another tokenizer model (e.g. "bert", "t5"). The data is not validated
// here; Tokenizer::Create() does that.
absl::StatusOr<TokenizerData> TokenizerDataFromGguf(const GgufFile& gguf);

// TokenizerDataFromGguf() followed by Tokenizer::Create().
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf);

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
