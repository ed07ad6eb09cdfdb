// Per-request sampling options: the C++ form of tandem.v1.SamplingParams
// (proto/tandem/v1/inference.proto), with the engine's defaults filled in. The proto's field
// comments are the contract; this header repeats the parts the engine relies on.
//
// A later layer converts the proto into SamplingOptions (unset optional fields keep the defaults
// below) and calls ValidateSamplingOptions() once, when the request arrives. Sampler and
// StopChecker assume validated options and validate again the parts they depend on, so bad input
// is an error value, never a crash.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::sampling {

// Limits enforced by ValidateSamplingOptions().
inline constexpr int kMaxStopStrings = 16;          // SamplingParams.stop: at most 16 strings
inline constexpr int kMaxStopStringBytes = 256;     // each at most 256 bytes (engine limit)
inline constexpr int kMaxStopTokenIds = 1024;       // SamplingParams.stop_token_ids (engine limit)
inline constexpr int64_t kMaxLogprobs = 20;         // SamplingParams.logprobs: the server's limit
inline constexpr float kMaxAbsFrequencyPenalty = 2.0f;  // frequency_penalty in [-2, 2]
inline constexpr float kMaxAbsPresencePenalty = 2.0f;   // presence_penalty in [-2, 2]
inline constexpr size_t kMaxResponseFormatBytes = 64 << 10;  // a schema/regex/grammar's text

// A constraint on the generated text (tandem.v1.ResponseFormat), enforced by grammar-constrained
// decoding (engine/grammar): at every step the tokens that cannot continue a valid output are
// masked, the model's EOS tokens are allowed exactly when the output is complete, and the request
// ends (FinishReason::kStop) when the grammar has ended.
struct ResponseFormat {
  enum class Kind {
    kText,        // no constraint (the default)
    kJsonObject,  // any JSON object (OpenAI's {"type": "json_object"})
    kJsonSchema,  // JSON valid against the JSON Schema in `text`
    kRegex,       // text matching the regular expression in `text` (whole output)
    kEbnf,        // text of the EBNF grammar in `text` (xgrammar's dialect, root rule `root`)
    kStructuralTag,  // xgrammar's structural-tag JSON in `text` (tool calls, docs/api.md)
  };
  Kind kind = Kind::kText;
  // The schema, regex or grammar; empty for kText and kJsonObject. At most
  // kMaxResponseFormatBytes bytes.
  std::string text = {};

  bool constrained() const { return kind != Kind::kText; }
  bool operator==(const ResponseFormat&) const = default;
};

struct SamplingOptions {
  // Softmax temperature, finite and >= 0. 0 means greedy: always the most likely token after
  // penalties, the lowest token id among equal logits. Default 1.0.
  float temperature = 1.0f;

  // Nucleus sampling: keep the smallest set of most likely tokens whose probabilities add up to at
  // least top_p, in (0, 1]. 1.0 (the default) disables it.
  float top_p = 1.0f;

  // Keep only the top_k most likely tokens; >= 0. 0 (the default) disables it; a value >= the
  // vocabulary size keeps every token.
  int32_t top_k = 0;

  // Drop tokens whose probability is below min_p times the most likely token's, in [0, 1].
  // 0 (the default) disables it.
  float min_p = 0.0f;

  // Penalties, vLLM semantics (applied to the logits before temperature):
  //   repetition_penalty (> 0, finite; 1.0 = none): for every token that occurs in the prompt OR
  //     the output so far, logit > 0 ? logit / r : logit * r.
  //   frequency_penalty ([-2, 2]; 0 = none): logit -= f * (occurrences of the token in the output).
  //   presence_penalty ([-2, 2]; 0 = none): logit -= p if the token occurs in the output at all.
  // Frequency and presence penalties count output tokens only, never prompt tokens.
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;

  // Seed of the request's random stream. Unset (the default): the Sampler draws one from the
  // process-wide SeedSource (random.h). Same seed + same logits => same tokens, on every machine.
  std::optional<uint64_t> seed;

  // Generation stops when the output text contains one of these strings (at most
  // kMaxStopStrings, each 1..kMaxStopStringBytes bytes). The stop string itself is not emitted.
  std::vector<std::string> stop;

  // Generation stops when one of these tokens is generated, besides the model's EOS tokens. Each
  // in [0, vocab_size); at most kMaxStopTokenIds of them.
  std::vector<int32_t> stop_token_ids;

  // Keep generating past the model's EOS tokens. `stop` and `stop_token_ids` still apply.
  bool ignore_eos = false;

  // No stop condition except max_tokens applies before min_tokens tokens were generated; the
  // Sampler masks EOS and stop tokens until then. >= 0, <= max_tokens when that is set. Default 0.
  int64_t min_tokens = 0;

  // Largest number of tokens to generate (the stop token included), >= 1. Unset (the default):
  // until a stop condition or until the context is full. int64_t so that every uint32 of the wire
  // converts without loss; values above max_context are rejected.
  std::optional<int64_t> max_tokens;

  // Number of most likely alternatives to return with each token, in [0, kMaxLogprobs]. 0 (the
  // default): no log-probabilities at all, not even the sampled token's.
  int64_t logprobs = 0;

  // What the output must look like; kText (the default): anything. Checked when the request is
  // added (a schema that does not compile is INVALID_ARGUMENT with the compiler's message).
  // Not with min_tokens > 0: the format decides where the output ends.
  ResponseFormat response_format = {};
};

// Checks every field against the ranges documented above. `vocab_size` (> 0) bounds
// stop_token_ids; `max_context` (> 0) bounds max_tokens and min_tokens. NaN or infinity in any
// float field is rejected. Returns INVALID_ARGUMENT whose message names the field, the allowed
// range and the value; OK otherwise.
[[nodiscard]] absl::Status ValidateSamplingOptions(const SamplingOptions& options, int vocab_size,
                                                   int max_context);

// Checks that a prompt of `prompt_tokens` tokens leaves room for at least one generated token and
// that prompt_tokens + max_tokens (when set) <= max_context; INVALID_ARGUMENT otherwise.
[[nodiscard]] absl::Status ValidatePromptLength(const SamplingOptions& options, int64_t prompt_tokens,
                                                int max_context);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
