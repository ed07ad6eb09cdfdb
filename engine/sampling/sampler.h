// Sampler: picks the next token of one sequence from the model's logits.
//
//   ASSIGN_OR_RETURN(Sampler sampler,
//                    Sampler::Create(options, {.vocab_size = V, .eos_token_ids = eos,
//                                              .prompt_tokens = prompt}));
//   for (each decode step) {
//     ASSIGN_OR_RETURN(SampledToken token, sampler.Sample(logits));   // logits: [V]
//     RETURN_IF_ERROR(sampler.Accept(token.id));
//   }
//
// Processing order (vLLM's): min_tokens mask -> penalties -> temperature -> top-k -> top-p ->
// min-p -> sample.
//   - min_tokens: until min_tokens tokens were accepted, EOS (unless ignore_eos) and
//     stop_token_ids get logit -inf.
//   - Penalties (see SamplingOptions): repetition over prompt + output tokens, frequency and
//     presence over output tokens only.
//   - temperature == 0: greedy, argmax of the penalized logits; among equal logits the LOWEST
//     token id wins. Temperature, top-k, top-p and min-p do not apply (they cannot change the
//     argmax).
//   - Otherwise p_i = softmax(logits / T). top-k keeps the k largest (ties: lower id first);
//     top-p keeps the smallest prefix of the remaining tokens, most likely first, whose
//     renormalized mass is >= top_p; min-p keeps tokens with p_i >= min_p * max_j p_j. The token is
//     drawn by inverse CDF with one uniform number per output position (random.h: UniformAt(seed,
//     position)), so the same seed + same logits give the same token on every machine (IEEE
//     single/double arithmetic as on x86-64 and AArch64, DeterministicExp, fixed summation orders;
//     see deterministic_exp.h), and a sequence resumed elsewhere with the same seed and accepted
//     tokens continues the same stream.
//
// Cost per step (V = vocabulary): greedy is one argmax pass. Otherwise one vectorized pass
// computes the weights exp((logit - max) / T) (DeterministicExp), then:
//   - no top-k / top-p: O(V) inverse CDF (min-p is a threshold on the weights);
//   - top-k: O(V) nth_element + O(k log k) sort of the k kept;
//   - top-p alone: only tokens with weight > (1 - top_p) * total / (2V) can be in the nucleus, and
//     only those are partially sorted, in growing chunks (nth_element + sort) until the prefix
//     reaches top_p: a peaked distribution sorts a handful of tokens, never the vocabulary.
// Penalties and the min_tokens mask cost one O(V) copy plus O(distinct tokens seen); a grammar's
// token bitmask one O(V) copy plus one test per 32 tokens (all-allowed words are skipped).
//
// Log-probabilities (options.logprobs > 0) are those of the RAW logits (log_softmax before
// penalties, temperature and filtering), as the proto's TokenLogprobs says.
//
// Thread-compatible: one Sampler per sequence; concurrent calls on one Sampler need external
// synchronization. Movable, not copyable.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/sampling/random.h"
#include "engine/sampling/sampling_options.h"

namespace tandem::sampling {

// One alternative token with its log-probability under the raw logits.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  // The chosen token, in [0, vocab_size).
  int32_t id = 0;
  // ln P(id) under log_softmax(raw logits), computed in double. Set only when
  // options.logprobs > 0.
  std::optional<float> logprob;
  // The options.logprobs (capped at vocab_size) most likely tokens under the raw logits, most
  // likely first, equal logits by lower id. Empty when options.logprobs == 0.
  std::vector<TokenLogprob> top_logprobs;
};

// What the Sampler needs besides the request's options. The spans are read during Create only.
struct SamplerContext {
  // Number of logits per step, > 0.
  int vocab_size = 0;
  // The model's EOS token(s), each in [0, vocab_size); masked before min_tokens unless ignore_eos.
  absl::Span<const int32_t> eos_token_ids = {};
  // The prompt, each in [0, vocab_size); used only by the repetition penalty.
  absl::Span<const int32_t> prompt_tokens = {};
  // Where an unseeded request gets its seed; null: ProcessSeedSource(). Used during Create only.
  SeedSource* seed_source = nullptr;
};

class Sampler {
 public:
  // Validates `options` (as ValidateSamplingOptions with an unbounded context) and `context`;
  // INVALID_ARGUMENT naming the field otherwise.
  [[nodiscard]] static absl::StatusOr<Sampler> Create(const SamplingOptions& options,
                                                      const SamplerContext& context);

  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Picks the token for output position num_accepted(). Does not change the state: calling it
  // twice with the same logits gives the same token. Errors: INVALID_ARGUMENT when
  // logits.size() != vocab_size or a logit is NaN or +inf (-inf is allowed and means "never");
  // FAILED_PRECONDITION when no token has a finite logit after masking and penalties.
  //
  // `allowed`, when not empty, is a token bitmask of ceil(vocab_size / 32) words (bit t % 32 of
  // word t / 32 set: token t may be sampled), a grammar's (engine/grammar): the other tokens get
  // logit -inf after the min_tokens mask and the penalties, for greedy and random sampling alike.
  // Log-probabilities stay those of the raw logits. INVALID_ARGUMENT for a bitmask of another size.
  [[nodiscard]] absl::StatusOr<SampledToken> Sample(absl::Span<const float> logits,
                                                    absl::Span<const uint32_t> allowed = {});

  // The logits after the min_tokens mask and the penalties, before temperature: what the
  // sampling stages see (for tests and for dumping a step). Same errors as Sample; no state change.
  [[nodiscard]] absl::StatusOr<std::vector<float>> PenalizedLogits(absl::Span<const float> logits);

  // Records `token` as the next generated token (the sampled one, or a token generated earlier
  // when a sequence is resumed on another worker): advances the output position and updates the
  // counts used by the penalties. INVALID_ARGUMENT when token is outside [0, vocab_size).
  [[nodiscard]] absl::Status Accept(int32_t token);

  // The request's seed (options.seed, or the one drawn from the SeedSource): report it so that an
  // unseeded request can be reproduced.
  uint64_t seed() const { return seed_; }
  // Tokens accepted so far.
  int64_t num_accepted() const { return num_accepted_; }
  int vocab_size() const { return vocab_size_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
    float weight;  // exp((logit - max) / T)
  };

  Sampler() = default;
  bool HasPenalties() const;
  absl::Status CheckLogits(absl::Span<const float> logits) const;
  // Copies `logits` into work_ and applies the min_tokens mask and the penalties.
  void ApplyMaskAndPenalties(absl::Span<const float> logits);
  // Sets work_[t] = -inf for every token t whose bit in `allowed` is clear.
  void ApplyAllowedTokens(absl::Span<const uint32_t> allowed);
  absl::StatusOr<int32_t> Greedy(const float* logits) const;
  absl::StatusOr<int32_t> Draw(const float* logits);
  void FillLogprobs(absl::Span<const float> logits, SampledToken* out);

  // Options.
  float temperature_ = 1.0f;
  double top_p_ = 1.0;
  int32_t top_k_ = 0;
  double min_p_ = 0.0;
  float repetition_penalty_ = 1.0f;
  float frequency_penalty_ = 0.0f;
  float presence_penalty_ = 0.0f;
  int64_t min_tokens_ = 0;
  int logprobs_ = 0;
  uint64_t seed_ = 0;
  int vocab_size_ = 0;
  // Tokens masked before min_tokens: stop_token_ids, plus EOS unless ignore_eos (sorted, unique).
  std::vector<int32_t> min_tokens_mask_;

  // State.
  int64_t num_accepted_ = 0;
  // Distinct tokens of prompt + output (only kept when repetition_penalty != 1).
  absl::flat_hash_set<int32_t> seen_tokens_;
  // Occurrences of each token in the output (only kept when a frequency/presence penalty is set).
  absl::flat_hash_map<int32_t, int32_t> output_counts_;

  // Scratch, reused between steps.
  std::vector<float> work_;
  std::vector<Candidate> candidates_;
  std::vector<float> weights_;
};

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
