#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/sampling/deterministic_exp.h"

namespace tandem::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status CheckTokenIds(absl::Span<const int32_t> ids, int vocab_size, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%d] must be in [0, %d) (the vocabulary), got %d", field, i, vocab_size, ids[i]));
    }
  }
  return absl::OkStatus();
}

// A penalized logit that overflows upward is clamped to the largest float (a huge repetition
// penalty could do that), so the softmax stays defined; -inf (a masked token) stays -inf.
float ClampFinite(float x) {
  if (x == -kInf) return x;
  return std::clamp(x, -std::numeric_limits<float>::max(), std::numeric_limits<float>::max());
}

// The largest value and the lowest index holding it. REQUIRES: n > 0, no NaN. Eight independent
// max chains (which the compiler vectorizes), then a scan for the first index equal to the max:
// the same answer as a strict-">" scalar scan, about twice as fast.
std::pair<int32_t, float> ArgMaxLowestId(const float* x, int32_t n) {
  float lane[8];
  std::fill(lane, lane + 8, -kInf);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float best = -kInf;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (float v : lane) best = v > best ? v : best;
  for (i = 0; i < n; ++i) {
    if (x[i] == best) return {i, best};
  }
  return {0, best};  // unreachable without NaN
}

// Strict total order: larger logit first, then lower id.
template <typename T>
bool MoreLikely(const T& a, const T& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

}  // namespace

absl::StatusOr<Sampler> Sampler::Create(const SamplingOptions& options,
                                        const SamplerContext& context) {
  if (absl::Status s = ValidateSamplingOptions(options, context.vocab_size,
                                               std::numeric_limits<int>::max());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTokenIds(context.eos_token_ids, context.vocab_size, "eos_token_ids");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTokenIds(context.prompt_tokens, context.vocab_size, "prompt_tokens");
      !s.ok()) {
    return s;
  }
  Sampler sampler;
  sampler.temperature_ = options.temperature;
  sampler.top_p_ = options.top_p;
  sampler.top_k_ = options.top_k;
  sampler.min_p_ = options.min_p;
  sampler.repetition_penalty_ = options.repetition_penalty;
  sampler.frequency_penalty_ = options.frequency_penalty;
  sampler.presence_penalty_ = options.presence_penalty;
  sampler.min_tokens_ = options.min_tokens;
  sampler.logprobs_ = static_cast<int>(std::min<int64_t>(options.logprobs, context.vocab_size));
  sampler.vocab_size_ = context.vocab_size;
  if (options.seed.has_value()) {
    sampler.seed_ = *options.seed;
  } else {
    SeedSource& source =
        context.seed_source != nullptr ? *context.seed_source : ProcessSeedSource();
    sampler.seed_ = source.NextSeed();
  }
  if (options.min_tokens > 0) {
    auto& mask = sampler.min_tokens_mask_;
    mask.assign(options.stop_token_ids.begin(), options.stop_token_ids.end());
    if (!options.ignore_eos) {
      mask.insert(mask.end(), context.eos_token_ids.begin(), context.eos_token_ids.end());
    }
    std::sort(mask.begin(), mask.end());
    mask.erase(std::unique(mask.begin(), mask.end()), mask.end());
  }
  if (sampler.repetition_penalty_ != 1.0f) {
    sampler.seen_tokens_.insert(context.prompt_tokens.begin(), context.prompt_tokens.end());
  }
  return sampler;
}

bool Sampler::HasPenalties() const {
  return repetition_penalty_ != 1.0f || frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f;
}

absl::Status Sampler::Accept(int32_t token) {
  if (token < 0 || token >= vocab_size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "accepted token must be in [0, %d) (the vocabulary), got %d", vocab_size_, token));
  }
  ++num_accepted_;
  if (repetition_penalty_ != 1.0f) {
    seen_tokens_.insert(token);
  }
  if (frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f) {
    ++output_counts_[token];
  }
  return absl::OkStatus();
}

void Sampler::ApplyMaskAndPenalties(absl::Span<const float> logits) {
  work_.assign(logits.begin(), logits.end());
  if (num_accepted_ < min_tokens_) {
    for (int32_t id : min_tokens_mask_) {
      work_[id] = -kInf;
    }
  }
  if (repetition_penalty_ != 1.0f) {
    const float r = repetition_penalty_;
    for (int32_t id : seen_tokens_) {
      float& x = work_[id];
      x = ClampFinite(x > 0.0f ? x / r : x * r);
    }
  }
  if (frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      float& x = work_[id];
      x = ClampFinite(x - (frequency_penalty_ * static_cast<float>(count) + presence_penalty_));
    }
  }
}

absl::StatusOr<int32_t> Sampler::Greedy(const float* logits) const {
  const auto [best, best_logit] = ArgMaxLowestId(logits, vocab_size_);
  if (best_logit == -kInf) {
    return absl::FailedPreconditionError("no token has a finite logit after masking and penalties");
  }
  return best;
}

absl::StatusOr<int32_t> Sampler::Draw(const float* logits) {
  const int n_vocab = vocab_size_;
  const auto [max_id, max_logit] = ArgMaxLowestId(logits, n_vocab);
  if (max_logit == -kInf) {
    return absl::FailedPreconditionError("no token has a finite logit after masking and penalties");
  }
  // The largest weight is exp(0) = 1, so min-p keeps the tokens with weight >= min_p.
  const auto min_p = static_cast<float>(min_p_);
  const double u = UniformAt(seed_, static_cast<uint64_t>(num_accepted_), RandomStream::kSampling);
  const bool use_top_k = top_k_ > 0 && top_k_ < n_vocab;
  const bool use_top_p = top_p_ < 1.0;

  // Weights exp((logit - max) / T) in [0, 1], the most likely token's exactly 1: one pass that
  // the compiler vectorizes. (Division, not a multiplication by 1/T: 1/T overflows for tiny T.)
  const float t = temperature_;
  weights_.resize(static_cast<size_t>(n_vocab));
  float* const w = weights_.data();
  for (int32_t i = 0; i < n_vocab; ++i) w[i] = DeterministicExp((logits[i] - max_logit) / t);

  if (!use_top_k && !use_top_p) {
    // O(V): inverse CDF in id order, skipping whole blocks of 8 (the same blocks, summed the
    // same way, as FixedOrderSum).
    if (min_p > 0.0f) {
      for (int32_t i = 0; i < n_vocab; ++i) w[i] = w[i] < min_p ? 0.0f : w[i];
    }
    const auto n = static_cast<size_t>(n_vocab);
    const double target = u * FixedOrderSum(w, n);
    double cum = 0.0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const double block = BlockSum8(w + i);
      if (cum + block > target) break;
      cum += block;
    }
    for (; i < n; ++i) {
      cum += w[i];
      if (cum > target) return static_cast<int32_t>(i);
    }
    return max_id;  // rounding left target >= cum: the most likely token is always kept
  }

  auto by_likelihood = [](const Candidate& a, const Candidate& b) { return MoreLikely(a, b); };
  candidates_.clear();
  auto first = candidates_.begin();
  size_t n = 0;
  bool sorted = false;
  double total = 0.0;
  if (use_top_k) {
    // The k most likely of the tokens with a finite logit, sorted: O(V + k log k).
    for (int32_t i = 0; i < n_vocab; ++i) {
      if (logits[i] != -kInf) candidates_.push_back({logits[i], i, w[i]});
    }
    first = candidates_.begin();
    n = std::min(candidates_.size(), static_cast<size_t>(top_k_));
    if (n < candidates_.size()) {
      std::nth_element(first, first + static_cast<ptrdiff_t>(n), candidates_.end(), by_likelihood);
    }
    std::sort(first, first + static_cast<ptrdiff_t>(n), by_likelihood);
    sorted = true;
    for (size_t i = 0; i < n; ++i) total += candidates_[i].weight;
  } else {
    // Top-p alone. Total weight in id order. Every token of the top-p prefix has weight
    // > (1 - top_p) * total / V (if the last one kept had less, the tokens from it on, at most V of
    // them, would hold less than the 1 - top_p of the mass that they must hold), so only tokens
    // above half that bound can be in it and the others are never sorted.
    total = FixedOrderSum(w, static_cast<size_t>(n_vocab));
    const double floor_weight = 0.5 * (1.0 - top_p_) * total / n_vocab;
    for (int32_t i = 0; i < n_vocab; ++i) {
      if (w[i] > floor_weight) candidates_.push_back({logits[i], i, w[i]});
    }
    first = candidates_.begin();
    n = candidates_.size();
  }
  if (use_top_p) {
    const double need = top_p_ * total;
    double cum = 0.0;
    size_t keep = n;  // all, should rounding keep cum below need
    size_t begin = 0;
    size_t chunk = 128;
    while (begin < n) {
      const size_t end = std::min(n, begin + chunk);
      if (!sorted) {
        std::nth_element(first + static_cast<ptrdiff_t>(begin), first + static_cast<ptrdiff_t>(end),
                         first + static_cast<ptrdiff_t>(n), by_likelihood);
        std::sort(first + static_cast<ptrdiff_t>(begin), first + static_cast<ptrdiff_t>(end),
                  by_likelihood);
      }
      size_t i = begin;
      for (; i < end; ++i) {
        cum += candidates_[i].weight;
        if (cum >= need) break;
      }
      if (i < end) {
        keep = i + 1;
        break;
      }
      begin = end;
      chunk *= 4;
    }
    n = keep;  // candidates_[0, keep) are sorted: the chunks were sorted one after the other
  }
  // Here candidates_[0, n) are sorted, most likely first; candidates_[0].weight == 1.
  if (min_p > 0.0) {
    size_t keep = 1;
    while (keep < n && candidates_[keep].weight >= min_p) ++keep;
    n = keep;
  }
  total = 0.0;
  for (size_t i = 0; i < n; ++i) total += candidates_[i].weight;
  const double target = u * total;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += candidates_[i].weight;
    if (cum > target) return candidates_[i].id;
  }
  return candidates_[0].id;
}

void Sampler::FillLogprobs(absl::Span<const float> logits, SampledToken* out) {
  const size_t n = logits.size();
  float mx = -kInf;
  for (float x : logits) mx = std::max(mx, x);
  if (mx == -kInf) return;  // Sample fails before: no token is possible
  weights_.resize(n);
  float* const w = weights_.data();
  for (size_t i = 0; i < n; ++i) w[i] = DeterministicExp(logits[i] - mx);
  const double log_z = static_cast<double>(mx) + std::log(FixedOrderSum(w, n));
  out->logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(out->id)]) - log_z);

  // The logprobs_ most likely, in one pass: `top` stays sorted, most likely first. Scanning in id
  // order, an equal logit later never displaces an earlier (lower) id.
  std::vector<TokenLogprob>& top = out->top_logprobs;
  top.clear();
  top.reserve(static_cast<size_t>(logprobs_) + 1);
  const auto limit = static_cast<size_t>(logprobs_);
  for (size_t i = 0; i < n; ++i) {
    const float x = logits[i];
    if (top.size() == limit && !(x > top.back().logprob)) continue;
    // Compare on the logit itself (stored in .logprob until the end), larger first.
    auto pos = std::upper_bound(top.begin(), top.end(), x,
                                [](float v, const TokenLogprob& t) { return v > t.logprob; });
    top.insert(pos, {static_cast<int32_t>(i), x});
    if (top.size() > limit) top.pop_back();
  }
  for (TokenLogprob& t : top) {
    t.logprob = static_cast<float>(static_cast<double>(t.logprob) - log_z);
  }
}

absl::Status Sampler::CheckLogits(absl::Span<const float> logits) const {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits must hold vocab_size = %d values, got %d", vocab_size_, logits.size()));
  }
  // NaN or +inf anywhere? Integer bit tests, so that the loop vectorizes; the slow loop below
  // only runs to name the offender.
  uint32_t bad = 0;
  for (float x : logits) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7FFFFFFFu) >= 0x7F800000u) &
           static_cast<uint32_t>(bits != 0xFF800000u);
  }
  if (bad == 0) return absl::OkStatus();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] < kInf)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logits[%d] must be finite or -inf, got %f", i, logits[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Sampler::PenalizedLogits(absl::Span<const float> logits) {
  if (absl::Status s = CheckLogits(logits); !s.ok()) return s;
  ApplyMaskAndPenalties(logits);
  return work_;
}

void Sampler::ApplyAllowedTokens(absl::Span<const uint32_t> allowed) {
  float* const w = work_.data();
  const auto n = static_cast<size_t>(vocab_size_);
  for (size_t word = 0; word < allowed.size(); ++word) {
    const uint32_t bits = allowed[word];
    if (bits == ~uint32_t{0}) continue;
    const size_t base = word * 32;
    const size_t end = std::min(n, base + 32);
    for (size_t t = base; t < end; ++t) {
      if ((bits >> (t - base) & 1u) == 0) w[t] = -kInf;
    }
  }
}

absl::StatusOr<SampledToken> Sampler::Sample(absl::Span<const float> logits,
                                             absl::Span<const uint32_t> allowed) {
  if (absl::Status s = CheckLogits(logits); !s.ok()) return s;
  const size_t mask_words = (static_cast<size_t>(vocab_size_) + 31) / 32;
  if (!allowed.empty() && allowed.size() != mask_words) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the allowed-token bitmask must hold %d words for %d tokens, got %d", mask_words,
        vocab_size_, allowed.size()));
  }
  const float* processed = logits.data();
  if (HasPenalties() || (num_accepted_ < min_tokens_ && !min_tokens_mask_.empty())) {
    ApplyMaskAndPenalties(logits);
    processed = work_.data();
  }
  if (!allowed.empty()) {
    if (processed != work_.data()) work_.assign(logits.begin(), logits.end());
    ApplyAllowedTokens(allowed);
    processed = work_.data();
  }
  SampledToken out;
  absl::StatusOr<int32_t> id = temperature_ == 0.0 ? Greedy(processed) : Draw(processed);
  if (!id.ok()) return id.status();
  out.id = *id;
  if (logprobs_ > 0) FillLogprobs(logits, &out);
  return out;
}

}  // namespace tandem::sampling
