// Turns generated token ids into text incrementally, for streaming responses.
//
//   StreamingDetokenizer detok(tokenizer);
//   for (int32_t id : generated) send(detok.Add(id));
//   send(detok.Finish());
//
// Everything returned is valid UTF-8 and never half of a character: bytes of a multi-byte
// character that is still incomplete are held back until the rest arrives. Bytes that cannot
// become valid UTF-8 are replaced by U+FFFD (one per maximal invalid subpart, as Python's
// errors="replace" does). The concatenation of all returned strings equals
// SanitizeUtf8(tokenizer.Decode(ids, options)).
//
// Not thread-safe (one per sequence). The Tokenizer must outlive it.
#ifndef TANDEM_ENGINE_TOKENIZER_STREAMING_DETOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_STREAMING_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace tandem {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {})
      : tokenizer_(tokenizer), options_(options) {}

  // Appends one token; returns the text that became complete (possibly empty).
  std::string Add(int32_t id);

  // Ends the stream: returns what is held back, with incomplete bytes replaced by U+FFFD.
  // The detokenizer can then be reused for a new stream.
  std::string Finish();

  // Bytes held back (an incomplete UTF-8 sequence, at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  int64_t count_ = 0;     // tokens added in this stream
  int32_t first_id_ = -1;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_TOKENIZER_STREAMING_DETOKENIZER_H_
