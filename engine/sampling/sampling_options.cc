#include "engine/sampling/sampling_options.h"

#include <cmath>
#include <cstddef>

#include "absl/strings/str_format.h"

namespace tandem::sampling {
namespace {

absl::Status Invalid(const absl::FormatSpec<double>& format, double value) {
  return absl::InvalidArgumentError(absl::StrFormat(format, value));
}

}  // namespace

absl::Status ValidateSamplingOptions(const SamplingOptions& o, int vocab_size, int max_context) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("vocab_size must be > 0, got %d", vocab_size));
  }
  if (max_context <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_context must be > 0, got %d", max_context));
  }
  // Written as !(in range) so that NaN fails every check.
  if (!(std::isfinite(o.temperature) && o.temperature >= 0.0f)) {
    return Invalid("temperature must be a finite number >= 0 (0 = greedy), got %g",
                   o.temperature);
  }
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
    return Invalid("top_p must be in (0, 1], got %g", o.top_p);
  }
  if (o.top_k < 0) {
    return Invalid("top_k must be >= 0 (0 = disabled), got %.0f", o.top_k);
  }
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) {
    return Invalid("min_p must be in [0, 1], got %g", o.min_p);
  }
  if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.0f)) {
    return Invalid("repetition_penalty must be a finite number > 0 (1 = none), got %g",
                   o.repetition_penalty);
  }
  if (!(std::fabs(o.frequency_penalty) <= kMaxAbsFrequencyPenalty)) {
    return Invalid("frequency_penalty must be in [-2, 2], got %g", o.frequency_penalty);
  }
  if (!(std::fabs(o.presence_penalty) <= kMaxAbsPresencePenalty)) {
    return Invalid("presence_penalty must be in [-2, 2], got %g", o.presence_penalty);
  }
  if (o.max_tokens.has_value() && (*o.max_tokens < 1 || *o.max_tokens > max_context)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be in [1, %d] (the model's max_context), got %d",
                        max_context, *o.max_tokens));
  }
  const int64_t min_tokens_limit = o.max_tokens.value_or(max_context);
  if (o.min_tokens < 0 || o.min_tokens > min_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "min_tokens must be in [0, %d] (%s), got %d", min_tokens_limit,
        o.max_tokens.has_value() ? "max_tokens" : "the model's max_context", o.min_tokens));
  }
  if (o.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stop_token_ids may hold at most %d ids, got %d", kMaxStopTokenIds,
        o.stop_token_ids.size()));
  }
  for (size_t i = 0; i < o.stop_token_ids.size(); ++i) {
    const int32_t id = o.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_token_ids[%d] must be in [0, %d) (the vocabulary), got %d", i, vocab_size, id));
    }
  }
  if (o.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stop may hold at most %d strings, got %d", kMaxStopStrings, o.stop.size()));
  }
  for (size_t i = 0; i < o.stop.size(); ++i) {
    const size_t n = o.stop[i].size();
    if (n == 0 || n > static_cast<size_t>(kMaxStopStringBytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop[%d] must be 1 to %d bytes long, got %d bytes", i, kMaxStopStringBytes, n));
    }
  }
  if (o.logprobs < 0 || o.logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logprobs must be in [0, %d], got %d", kMaxLogprobs, o.logprobs));
  }
  const ResponseFormat& f = o.response_format;
  const bool wants_text = f.kind == ResponseFormat::Kind::kJsonSchema ||
                          f.kind == ResponseFormat::Kind::kRegex ||
                          f.kind == ResponseFormat::Kind::kEbnf ||
                          f.kind == ResponseFormat::Kind::kStructuralTag;
  if (wants_text && f.text.empty()) {
    return absl::InvalidArgumentError("response_format: the schema, regex or grammar is empty");
  }
  if (!wants_text && !f.text.empty()) {
    return absl::InvalidArgumentError(
        "response_format: text and json_object formats take no schema, regex or grammar");
  }
  if (f.constrained() && o.min_tokens > 0) {
    // The grammar decides where the output may end; masking EOS before min_tokens could leave a
    // complete output with no allowed token.
    return absl::InvalidArgumentError(
        "min_tokens cannot be combined with a response_format (the format decides where the "
        "output ends)");
  }
  if (f.text.size() > kMaxResponseFormatBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "response_format: the schema, regex or grammar may hold at most %d bytes, got %d",
        kMaxResponseFormatBytes, f.text.size()));
  }
  return absl::OkStatus();
}

absl::Status ValidatePromptLength(const SamplingOptions& options, int64_t prompt_tokens,
                                  int max_context) {
  if (prompt_tokens < 1 || prompt_tokens >= max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt must have 1 to %d tokens (max_context %d minus one to generate), got %d",
        static_cast<int64_t>(max_context) - 1, max_context, prompt_tokens));
  }
  if (options.max_tokens.has_value() && prompt_tokens + *options.max_tokens > max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt tokens + max_tokens must be <= %d (max_context), got %d + %d", max_context,
        prompt_tokens, *options.max_tokens));
  }
  return absl::OkStatus();
}

}  // namespace tandem::sampling
