// Stop conditions of one generation: stop tokens and EOS, max_tokens / the context limit, and stop
// strings matched on the detokenized text stream across token boundaries.
//
//   ASSIGN_OR_RETURN(StopChecker stop, StopChecker::Create(options, {.eos_token_ids = eos,
//                                          .prompt_tokens = n, .max_context = ctx}));
//   for (each generated token) {
//     StopStep step = stop.Append(token, detokenizer_delta);
//     send(token, step.text);
//     if (step.finish != FinishReason::kNone) break;
//   }
//   // Finished for another reason (cancelled, error): send stop.Flush() if the text is wanted.
//
// Thread-compatible. Movable.
#ifndef TANDEM_ENGINE_SAMPLING_STOP_CHECKER_H_
#define TANDEM_ENGINE_SAMPLING_STOP_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/sampling/sampling_options.h"

namespace tandem::sampling {

// Why a generation ended; the values equal tandem.v1.FinishReason's.
enum class FinishReason : int {
  kNone = 0,        // not finished (FINISH_REASON_UNSPECIFIED)
  kStop = 1,        // EOS or a stop_token_ids token was generated
  kStopString = 2,  // the output text matched a stop string
  kLength = 3,      // max_tokens generated, or the context is full
  kCancelled = 4,   // the server cancelled the request (never set by StopChecker)
  kError = 5,       // an error ended the generation (never set by StopChecker)
};

// "none", "stop", "stop_string", "length", "cancelled", "error".
absl::string_view FinishReasonName(FinishReason reason);

// Finds stop strings in a text stream that arrives in deltas, holding back only what could still
// become a stop string. Streaming KMP: O(bytes * number of stop strings) in total.
//
// Semantics (independent of how the text is split into deltas):
//   - The generation stops at the earliest END of any stop string in the text; when several end
//     there, the longest (earliest-starting) one is the match. The text before the match is
//     emitted in full; the match and anything after it are never emitted.
//   - Without a match, everything is emitted except the longest suffix of the text that is a
//     proper prefix of some stop string: the holdback, at most (longest stop string - 1) bytes.
//     The holdback starts where a stop string would start, so text made of whole UTF-8 characters
//     is never split inside a character (stop strings are valid UTF-8 on the wire).
class StopStringMatcher {
 public:
  // REQUIRES: every string non-empty (ValidateSamplingOptions checks it; empty ones are ignored).
  explicit StopStringMatcher(const std::vector<std::string>& stop_strings);

  struct Result {
    // Text that is safe to emit now (owned).
    std::string text;
    // True when a stop string matched; `text` ends right before it. No text comes out after.
    bool matched = false;
    // Index into stop_strings of the match, or -1.
    int stop_index = -1;
  };

  // Feeds the next delta. With allow_match == false (before min_tokens), completed stop strings
  // ending in this delta are not matches (text is still held back as usual). After a match,
  // further deltas are ignored.
  Result Append(absl::string_view delta, bool allow_match = true);

  // Releases the held-back text (the generation ended for another reason) and clears it.
  std::string Flush();

  size_t held_bytes() const { return held_.size(); }
  // The largest possible holdback: longest stop string - 1 bytes (0 without stop strings).
  size_t max_holdback() const { return max_holdback_; }

 private:
  struct Pattern {
    std::string text;
    std::vector<int> fail;  // KMP prefix function
    int state = 0;          // longest prefix of `text` that is a suffix of the stream
  };
  std::vector<Pattern> patterns_;
  std::string held_;
  size_t max_holdback_ = 0;
  bool matched_ = false;
};

struct StopCheckerContext {
  // The model's EOS token(s); a stop unless options.ignore_eos. Read during Create only.
  absl::Span<const int32_t> eos_token_ids = {};
  // Prompt length and the model's context; the generation ends with kLength when
  // prompt_tokens + generated tokens reaches max_context. max_context 0: no such limit.
  int64_t prompt_tokens = 0;
  int64_t max_context = 0;
};

// What to do after one generated token.
struct StopStep {
  // Text safe to send now (owned): the token's text minus any holdback, plus earlier held text
  // that is now safe. On kStop / kLength it includes all held text.
  std::string text;
  // kNone while generation goes on; otherwise kStop, kStopString or kLength.
  FinishReason finish = FinishReason::kNone;
};

class StopChecker {
 public:
  // Validates the stop-related fields of `options` (as ValidateSamplingOptions does, without a
  // vocabulary bound on token ids); INVALID_ARGUMENT naming the field otherwise.
  [[nodiscard]] static absl::StatusOr<StopChecker> Create(const SamplingOptions& options,
                                                          const StopCheckerContext& context);

  // Records the next generated token and its text delta (whole UTF-8 characters, from the
  // detokenizer; may be empty). Order of checks, vLLM's:
  //   1. Before min_tokens tokens (this one included) nothing but max_tokens stops.
  //   2. A stop token (stop_token_ids, or EOS unless ignore_eos) -> kStop; its own text is not
  //      emitted (the proto: a stop token produces no text), held text is.
  //   3. A stop string completed in the text -> kStopString, text cut before it.
  //   4. max_tokens tokens, or prompt + tokens == max_context -> kLength, all held text emitted.
  // After a finish, further calls return {"", that finish} and change nothing.
  StopStep Append(int32_t token, absl::string_view text_delta);

  // Releases held-back text when the generation ends for a reason outside this checker.
  std::string Flush() { return matcher_.Flush(); }

  FinishReason finish_reason() const { return finish_; }
  int64_t num_tokens() const { return num_tokens_; }
  const StopStringMatcher& matcher() const { return matcher_; }

 private:
  StopChecker(const SamplingOptions& options, const StopCheckerContext& context);

  absl::flat_hash_set<int32_t> stop_tokens_;
  int64_t min_tokens_ = 0;
  int64_t max_tokens_ = 0;  // 0: no limit
  int64_t prompt_tokens_ = 0;
  int64_t max_context_ = 0;
  StopStringMatcher matcher_;
  int64_t num_tokens_ = 0;
  FinishReason finish_ = FinishReason::kNone;
};

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_STOP_CHECKER_H_
