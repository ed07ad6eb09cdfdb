#include "engine/tokenizer/gguf_tokenizer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Reads an optional token id: -1 when absent.
absl::StatusOr<int32_t> OptionalId(const GgufFile& gguf, absl::string_view key) {
  if (!gguf.Has(key)) return -1;
  ASSIGN_OR_RETURN(uint32_t id, gguf.GetUint32(key));
  if (id > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", id, " is not a token id"));
  }
  return static_cast<int32_t>(id);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& gguf, absl::string_view key, bool fallback) {
  if (!gguf.Has(key)) return fallback;
  return gguf.GetBool(key);
}

}  // namespace

absl::StatusOr<TokenizerData> TokenizerDataFromGguf(const GgufFile& gguf) {
  TokenizerData data;
  ASSIGN_OR_RETURN(absl::string_view model, gguf.GetString("tokenizer.ggml.model"));
  if (model == "gpt2") {
    data.model = TokenizerModel::kByteLevelBpe;
  } else if (model == "llama") {
    data.model = TokenizerModel::kSentencePieceBpe;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        gguf.path(), ": tokenizer.ggml.model '", model,
        "' is not supported (supported: gpt2 = byte-level BPE, llama = SentencePiece BPE)"));
  }
  const bool spm = data.model == TokenizerModel::kSentencePieceBpe;

  if (gguf.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(absl::string_view pre, gguf.GetString("tokenizer.ggml.pre"));
    data.pre_tokenizer = std::string(pre);
  } else {
    data.pre_tokenizer = "default";
  }

  ASSIGN_OR_RETURN(std::vector<absl::string_view> tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  data.tokens.reserve(tokens.size());
  for (absl::string_view t : tokens) data.tokens.emplace_back(t);

  if (gguf.Has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(data.scores, gguf.GetFloat32Array("tokenizer.ggml.scores"));
  }
  if (gguf.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(std::vector<int32_t> types, gguf.GetInt32Array("tokenizer.ggml.token_type"));
    data.token_types.reserve(types.size());
    for (int32_t t : types) data.token_types.push_back(static_cast<TokenType>(t));
  }
  if (!spm) {
    ASSIGN_OR_RETURN(std::vector<absl::string_view> merges,
                     gguf.GetStringArray("tokenizer.ggml.merges"));
    data.merges.reserve(merges.size());
    for (absl::string_view m : merges) data.merges.emplace_back(m);
  }

  ASSIGN_OR_RETURN(data.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(data.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  ASSIGN_OR_RETURN(data.unk_id, OptionalId(gguf, "tokenizer.ggml.unknown_token_id"));
  ASSIGN_OR_RETURN(data.pad_id, OptionalId(gguf, "tokenizer.ggml.padding_token_id"));
  ASSIGN_OR_RETURN(data.add_bos, OptionalBool(gguf, "tokenizer.ggml.add_bos_token", spm));
  ASSIGN_OR_RETURN(data.add_eos, OptionalBool(gguf, "tokenizer.ggml.add_eos_token", false));
  ASSIGN_OR_RETURN(data.add_space_prefix,
                   OptionalBool(gguf, "tokenizer.ggml.add_space_prefix", spm));
  if (gguf.Has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(absl::string_view tmpl, gguf.GetString("tokenizer.chat_template"));
    data.chat_template = std::string(tmpl);
  }
  return data;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(TokenizerData data, TokenizerDataFromGguf(gguf));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(data));
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), gguf.path());
  return tokenizer;
}

}  // namespace tandem
