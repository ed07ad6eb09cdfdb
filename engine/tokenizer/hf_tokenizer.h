// Reads a Hugging Face tokenizer (tokenizer.json, and tokenizer_config.json beside it) into the
// TokenizerData a GGUF file gives (gguf_tokenizer.h), so both paths share one Tokenizer.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, TokenizerFromHfFolder("/models/llama"));
//
// Supported (anything else is UNIMPLEMENTED naming the component):
//   model:          BPE (vocab + merges as "a b" strings or [a, b] pairs; byte_fallback;
//                   ignore_merges; unk_token)
//   byte-level:     pre_tokenizer ByteLevel (GPT-2 regex), or a Sequence of Split(regex of
//                   GPT-2 / Llama 3 / Qwen2) or Digits(individual) followed by ByteLevel
//                   without its regex; normalizer none or NFC
//   SentencePiece:  pre_tokenizer Metaspace (prepend_scheme always/first/never, split), or the
//                   normalizers Replace(" ", "▁") (Gemma: no dummy prefix) or Prepend("▁") +
//                   Replace(" ", "▁") (Llama 2 exports) with no pre-tokenizer
//   added_tokens:   special -> control tokens, others user-defined; lstrip / rstrip
//   post_processor: TemplateProcessing (a leading special token = BOS, a trailing one = EOS),
//                   ByteLevel, or a Sequence of them
//   tokenizer_config.json: bos_token, eos_token (string or {content}), add_bos_token,
//                   add_eos_token, chat_template (a string, or [{name, template}] -> "default");
//                   chat_template.jinja beside it also counts
#ifndef TANDEM_ENGINE_TOKENIZER_HF_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_HF_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

// From the two files' contents; `config_json` may be empty (no tokenizer_config.json). `name`
// prefixes error messages.
absl::StatusOr<TokenizerData> TokenizerDataFromHfJson(absl::string_view tokenizer_json,
                                                      absl::string_view config_json,
                                                      absl::string_view name);

// Reads <dir>/tokenizer.json (NOT_FOUND naming it when missing), <dir>/tokenizer_config.json and
// <dir>/chat_template.jinja when present.
absl::StatusOr<TokenizerData> TokenizerDataFromHfFolder(const std::string& dir);
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromHfFolder(const std::string& dir);

// The tokenizer of the model at `path`: TokenizerFromHfFolder for a folder, else the GGUF file's.
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerForModel(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_HF_TOKENIZER_H_
