#include "engine/tokenizer/streaming_detokenizer.h"

#include <vector>

#include "engine/tokenizer/unicode.h"

namespace tandem {

std::string StreamingDetokenizer::Add(int32_t id) {
  // Decode the token in the context of the stream's start, so the SentencePiece dummy-prefix
  // rule of Tokenizer::Decode applies here the same way.
  std::string piece;
  if (count_ == 0) {
    piece = tokenizer_.Decode({id}, options_);
    first_id_ = id;
  } else if (count_ == 1) {
    piece = tokenizer_.Decode({first_id_, id}, options_);
    piece.erase(0, tokenizer_.Decode({first_id_}, options_).size());
  } else {
    piece = tokenizer_.TokenBytes(id, options_);
  }
  ++count_;
  pending_ += piece;
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = SanitizeUtf8(absl::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  count_ = 0;
  first_id_ = -1;
  return out;
}

}  // namespace tandem
