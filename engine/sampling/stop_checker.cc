#include "engine/sampling/stop_checker.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace tandem::sampling {

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

StopStringMatcher::StopStringMatcher(const std::vector<std::string>& stop_strings) {
  for (const std::string& s : stop_strings) {
    if (s.empty()) continue;
    Pattern p;
    p.text = s;
    p.fail.assign(s.size(), 0);
    for (size_t i = 1, k = 0; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = static_cast<size_t>(p.fail[k - 1]);
      if (s[i] == s[k]) ++k;
      p.fail[i] = static_cast<int>(k);
    }
    max_holdback_ = std::max(max_holdback_, s.size() - 1);
    patterns_.push_back(std::move(p));
  }
}

StopStringMatcher::Result StopStringMatcher::Append(absl::string_view delta, bool allow_match) {
  Result result;
  if (matched_) return result;
  const size_t old_size = held_.size();
  held_.append(delta.data(), delta.size());
  for (size_t pos = old_size; pos < held_.size(); ++pos) {
    const char c = held_[pos];
    int best = -1;  // the longest pattern completed at this byte
    for (size_t j = 0; j < patterns_.size(); ++j) {
      Pattern& p = patterns_[j];
      const int len = static_cast<int>(p.text.size());
      int k = p.state;
      if (k == len) k = p.fail[static_cast<size_t>(len - 1)];  // completed earlier, not a match
      while (k > 0 && p.text[static_cast<size_t>(k)] != c) k = p.fail[static_cast<size_t>(k - 1)];
      if (p.text[static_cast<size_t>(k)] == c) ++k;
      p.state = k;
      if (k == len && (best < 0 || len > static_cast<int>(patterns_[static_cast<size_t>(best)].text.size()))) {
        best = static_cast<int>(j);
      }
    }
    if (best >= 0 && allow_match) {
      const size_t start = pos + 1 - patterns_[static_cast<size_t>(best)].text.size();
      result.text = held_.substr(0, start);
      result.matched = true;
      result.stop_index = best;
      matched_ = true;
      held_.clear();
      return result;
    }
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (Pattern& p : patterns_) {
    const int len = static_cast<int>(p.text.size());
    if (p.state == len) p.state = p.fail[static_cast<size_t>(len - 1)];  // normalize
    hold = std::max(hold, static_cast<size_t>(p.state));
  }
  hold = std::min(hold, held_.size());
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string text = std::move(held_);
  held_.clear();
  for (Pattern& p : patterns_) p.state = 0;
  return text;
}

absl::StatusOr<StopChecker> StopChecker::Create(const SamplingOptions& options,
                                                const StopCheckerContext& context) {
  // Token ids are bounded by the vocabulary in ValidateSamplingOptions; here any id >= 0 will do.
  const int max_context = context.max_context > 0 && context.max_context <= std::numeric_limits<int>::max()
                              ? static_cast<int>(context.max_context)
                              : std::numeric_limits<int>::max();
  if (absl::Status s = ValidateSamplingOptions(options, std::numeric_limits<int>::max(), max_context);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < context.eos_token_ids.size(); ++i) {
    if (context.eos_token_ids[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "eos_token_ids[%d] must be >= 0, got %d", i, context.eos_token_ids[i]));
    }
  }
  if (context.prompt_tokens < 0 || context.max_context < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt_tokens and max_context must be >= 0, got %d and %d", context.prompt_tokens,
        context.max_context));
  }
  return StopChecker(options, context);
}

StopChecker::StopChecker(const SamplingOptions& options, const StopCheckerContext& context)
    : min_tokens_(options.min_tokens),
      max_tokens_(options.max_tokens.value_or(0)),
      prompt_tokens_(context.prompt_tokens),
      max_context_(context.max_context),
      matcher_(options.stop) {
  stop_tokens_.insert(options.stop_token_ids.begin(), options.stop_token_ids.end());
  if (!options.ignore_eos) {
    stop_tokens_.insert(context.eos_token_ids.begin(), context.eos_token_ids.end());
  }
}

StopStep StopChecker::Append(int32_t token, absl::string_view text_delta) {
  StopStep step;
  if (finish_ != FinishReason::kNone) {
    step.finish = finish_;
    return step;
  }
  ++num_tokens_;
  const bool stops_allowed = num_tokens_ >= min_tokens_;
  if (stops_allowed && stop_tokens_.contains(token)) {
    finish_ = step.finish = FinishReason::kStop;
    step.text = matcher_.Flush();
    return step;
  }
  StopStringMatcher::Result r = matcher_.Append(text_delta, stops_allowed);
  step.text = std::move(r.text);
  if (r.matched) {
    finish_ = step.finish = FinishReason::kStopString;
    return step;
  }
  if ((max_tokens_ > 0 && num_tokens_ >= max_tokens_) ||
      (max_context_ > 0 && prompt_tokens_ + num_tokens_ >= max_context_)) {
    finish_ = step.finish = FinishReason::kLength;
    step.text += matcher_.Flush();
  }
  return step;
}

}  // namespace tandem::sampling
