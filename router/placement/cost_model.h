// Cost models that placement predicts latencies with (DESIGN.md §5, docs/slo.md): how long an
// engine step of a worker takes, fitted online from the step timings the worker reports, and how
// long a KV transfer between two workers takes. Pure: no clock, no I/O, no threads.
//
//   ASSIGN_OR_RETURN(placement::StepCostModel model, placement::StepCostModel::Create({}));
//   for (const v1::StepTiming& t : sample.recent_steps()) {
//     // The proto's fields, field for field, but for the attention, which StepObservationOf
//     // (router/registry/worker_view.h) splits by kind.
//     absl::Status s = model.Observe(StepObservationOf(t));
//     // A bad observation (negative numbers) is refused and changes nothing: log it, go on.
//   }
//   double ttft = model.PrefillSeconds({.uncached_tokens = 900, .token_budget = 512});
//
// The step model:
//
//   step_seconds = base + prefill_token * prefill_tokens + decode_token * decode_tokens
//                       + context_token * context_tokens
//                       + prompt_context_token * prompt_context_tokens
//
// where the last two terms are the step's attention work, the sum over every token it computed
// of the context that token attended to, split by kind: a decode token attends to its whole
// sequence (context_tokens), a prompt of L tokens to L (L + 1) / 2 in all
// (prompt_context_tokens). The five coefficients, kept >= 0, are fitted by least squares whose
// observations decay by a forgetting factor, regularized towards a prior profile whose weight
// fades to a floor. Why two attention terms, and the fit: docs/slo.md, section 1.
#ifndef TANDEM_ROUTER_PLACEMENT_COST_MODEL_H_
#define TANDEM_ROUTER_PLACEMENT_COST_MODEL_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::placement {

// One engine step as a worker reports it (tandem.v1.StepTiming, field for field; the router
// converts the unsigned proto fields).
struct StepObservation {
  // Sequences in the step's batch. Not a term of the model (decode_tokens counts the decoding
  // ones); checked only.
  int64_t batch_size = 0;
  // Prompt tokens computed in the step.
  int64_t prefill_tokens = 0;
  // Tokens decoded in the step (one per decoding sequence).
  int64_t decode_tokens = 0;
  // Sum over the step's decode tokens of the context each attended to (its position + 1):
  // tandem.v1.StepTiming.attended_tokens - prompt_attended_tokens.
  int64_t context_tokens = 0;
  // The same over its prompt tokens: tandem.v1.StepTiming.prompt_attended_tokens.
  int64_t prompt_context_tokens = 0;
  // Wall time of the step, microseconds.
  int64_t duration_us = 0;
};

// Coefficients of the step model, seconds. All finite and >= 0 (ValidateProfile). The defaults
// are placeholders (docs/slo.md, "Defaults"): a deployment measures its own at start-up
// (CalibrationOptions) or lets the online fit replace them.
struct StepProfile {
  // Fixed cost of a step (launches, sampling, the weights read once per step).
  double base_seconds = 0.010;
  // Per prompt token computed.
  double prefill_token_seconds = 0.0002;
  // Per decoding sequence.
  double decode_token_seconds = 0.0005;
  // Per token of context a decode token attends to, summed over the step's decode tokens
  // (StepObservation::context_tokens).
  double context_token_seconds = 1e-8;
  // Per token of context a prompt token attends to, summed over the step's prompt tokens
  // (StepObservation::prompt_context_tokens).
  double prompt_context_token_seconds = 1e-8;

  // base + prefill_token * prefill + decode_token * decode + context_token * context
  //      + prompt_context_token * prompt_context.
  double StepSeconds(double prefill_tokens, double decode_tokens, double context_tokens,
                     double prompt_context_tokens = 0) const;
};

// INVALID_ARGUMENT unless every coefficient is finite and >= 0.
absl::Status ValidateProfile(const StepProfile& profile);

// A prompt computed in chunks (the engine's chunked prefill, engine/sched/scheduler.h): each step
// first gives one token to every decoding sequence, then up to the rest of the token budget to
// the prompt.
struct PrefillShape {
  // Prompt tokens to compute. 0 counts as 1: the last prompt token is always computed, because
  // its logits give the first output token.
  int64_t uncached_tokens = 0;
  // Leading prompt tokens already in the cache: the context the first chunk attends to.
  int64_t cached_tokens = 0;
  // Most tokens per step, decode tokens included (SchedulerOptions::max_tokens_per_step). >= 1.
  int64_t token_budget = 512;
  // Most prompt tokens per step, all prompts together (SchedulerOptions::max_prefill_tokens); 0:
  // no cap.
  int64_t max_prefill_tokens = 0;
  // Sequences decoding in the same steps (each takes one token of the budget), and the sum of
  // their context lengths.
  int64_t decode_seqs = 0;
  int64_t decode_context_tokens = 0;
  // QueuedPrefillSeconds only: how many prompts uncached_tokens belong to (their lengths are not
  // known, so each counts as the average). <= 1: one prompt.
  int64_t queued_prompts = 0;
};

// Tokens of a prompt computed per step beside `shape.decode_seqs` decoding sequences:
// token_budget - min(decode_seqs, token_budget), at least 1, and at most max_prefill_tokens
// when set.
int64_t PrefillChunkTokens(const PrefillShape& shape);
// Steps the prompt takes: ceil(max(uncached_tokens, 1) / chunk).
int64_t PrefillSteps(const PrefillShape& shape);
// Seconds to compute the prompt: the sum over its steps of StepSeconds(chunk, decode tokens,
// decode context, the chunk's attention), where the prompt's attention over all its chunks is
// E (E + 1) / 2 - C (C + 1) / 2 with C = cached_tokens and E = C + uncached_tokens; closed form
// in docs/slo.md.
double PrefillSeconds(const StepProfile& profile, const PrefillShape& shape);
// Seconds to compute `uncached_tokens` prompt tokens of other requests queued ahead (reported +
// placed), chunked as PrefillShape (cached_tokens ignored): `queued_prompts` prompts of the
// average length L, uncached, each attending to L (L + 1) / 2. 0 queued: 0 seconds.
double QueuedPrefillSeconds(const StepProfile& profile, const PrefillShape& shape);
// Seconds of one decode step of `batch_size` sequences attending to `context_tokens` in all:
// StepSeconds(0, batch_size, context_tokens).
double DecodeStepSeconds(const StepProfile& profile, int64_t batch_size, int64_t context_tokens);

// Options of a StepCostModel. StepCostModel::Create validates them.
struct StepCostModelOptions {
  // Where the fit starts and what it is pulled towards. ValidateProfile.
  StepProfile prior = {};
  // Strength of the prior at the start: it weighs as much as this many observations in which one
  // term alone has its typical size (below). It decays with every observation like they do
  // (forgetting), down to min_prior_weight. What that means for one step: docs/slo.md, "Fit".
  // > 0, finite.
  double prior_weight = 20.0;
  // The least weight the prior keeps. In (0, prior_weight].
  double min_prior_weight = 1.0;
  // Every observation's weight is multiplied by this at each later one: the fit sees about the
  // last 1 / (1 - forgetting) observations. In (0, 1]; 1 never forgets.
  double forgetting = 0.995;
  // Typical sizes of the terms (the unit the prior is counted in; the choice: docs/slo.md, "Fit").
  // > 0, finite.
  double typical_prefill_tokens = 512;
  double typical_decode_tokens = 32;
  double typical_context_tokens = 4096;
  double typical_prompt_context_tokens = 16384;
  // An observed duration above this many times the current prediction is clipped to that. A real
  // slowdown is still followed: each observation can raise the fit up to this factor. >= 1,
  // finite.
  double outlier_factor = 10.0;
  // Weight of the newest step in the moving average behind recent_ratio(): it follows about the
  // last 2 / recent_alpha - 1 steps. In (0, 1].
  double recent_alpha = 0.2;
};

// Options for fitting a start-up calibration (a few dozen steps of known shapes): the prior
// weighs next to nothing and nothing is clipped, so the fit is the data's. Its profile is the
// prior a worker's online model then starts from (StepCostModel::Reset).
StepCostModelOptions CalibrationOptions();

// The step-time model of one worker, fitted online. Thread-compatible: the router feeds and reads
// it under its lock. Copyable.
class StepCostModel {
 public:
  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<StepCostModel> Create(const StepCostModelOptions& options);

  // Adds one step. INVALID_ARGUMENT (nothing changes) for a negative field. The duration is
  // clipped at outlier_factor times the current prediction.
  absl::Status Observe(const StepObservation& step);

  // Forgets every observation and starts again from `prior` (e.g. one measured at start-up).
  // INVALID_ARGUMENT (nothing changes) when ValidateProfile fails.
  absl::Status Reset(const StepProfile& prior);

  // The fitted coefficients (the prior before any observation). Always finite and >= 0.
  const StepProfile& profile() const { return profile_; }
  // Observations accepted since Create or Reset, and the decayed count the fit rests on.
  int64_t observations() const { return observations_; }
  double effective_observations() const { return effective_observations_; }
  // What the prior weighs now: max(prior_weight * forgetting^observations, min_prior_weight).
  double current_prior_weight() const { return prior_weight_; }

  // How much slower (> 1) or faster than the fit the worker's latest steps ran: exp of a moving
  // average (recent_alpha) of log(observed / predicted), each step predicted before it was
  // fitted. A diagnostic: predictions do not use it (why: docs/slo.md, "How well the fit holds
  // now"). 1 before any observation and after Reset; within [1 / outlier_factor,
  // outlier_factor].
  double recent_ratio() const { return std::exp(recent_log_ratio_); }

  // Predictions with profile(): see the free functions of the same names.
  double StepSeconds(const StepObservation& step) const;
  double PrefillSeconds(const PrefillShape& shape) const;
  double QueuedPrefillSeconds(const PrefillShape& shape) const;
  double DecodeStepSeconds(int64_t batch_size, int64_t context_tokens) const;

 private:
  explicit StepCostModel(const StepCostModelOptions& options);
  void Solve();

  StepCostModelOptions options_;
  // Scale of each term (1 for base, then the typical sizes): the fit runs on x / scale, where the
  // prior is prior_weight * identity.
  std::array<double, 5> scale_ = {};
  // Decayed sums over the observations of x' x'^T and x' y (x' = x / scale, y = seconds).
  std::array<std::array<double, 5>, 5> xx_ = {};
  std::array<double, 5> xy_ = {};
  int64_t observations_ = 0;
  double effective_observations_ = 0;
  double prior_weight_ = 0;  // now
  double recent_log_ratio_ = 0;
  StepProfile profile_ = {};
};

// Options of a TransferModel. TransferModel::Create validates them.
struct TransferModelOptions {
  // Seconds per KV byte before any observation: 1e-10 is 10 GB/s. Finite, >= 0.
  double default_seconds_per_byte = 1e-10;
  // Weight of a new observation in the moving average. In (0, 1].
  double alpha = 0.2;
  // Transfers smaller than this are not observed (fixed costs dominate them). >= 0.
  int64_t min_observed_bytes = 64 * 1024;
  // An observed rate is clipped into [estimate / outlier_factor, estimate * outlier_factor].
  // >= 1, finite.
  double outlier_factor = 10.0;
};

// How long moving KV from a prefill worker to a decode worker takes: seconds per byte, an
// exponentially weighted moving average of observed transfers per (prefill, decode) pair, falling
// back to the prefill worker's average over all its pairs, then to the default. Thread-compatible;
// copyable.
class TransferModel {
 public:
  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<TransferModel> Create(const TransferModelOptions& options);

  // One transfer of `bytes` that took `seconds` (from the first KV write to the last one
  // acknowledged). INVALID_ARGUMENT (nothing changes) for empty ids, negative bytes, or seconds
  // negative or not finite. Transfers under min_observed_bytes are accepted and ignored.
  absl::Status Observe(absl::string_view prefill_worker, absl::string_view decode_worker,
                       int64_t bytes, double seconds);

  // The current estimate for the pair (see the class comment). Finite, >= 0.
  double SecondsPerByte(absl::string_view prefill_worker, absl::string_view decode_worker) const;
  // bytes * SecondsPerByte; 0 for bytes <= 0.
  double TransferSeconds(absl::string_view prefill_worker, absl::string_view decode_worker,
                         int64_t bytes) const;

  // Drops every estimate that involves `worker` (it left the cluster).
  void ForgetWorker(absl::string_view worker);

 private:
  explicit TransferModel(const TransferModelOptions& options) : options_(options) {}
  static double Update(double estimate, double rate, const TransferModelOptions& options);

  TransferModelOptions options_;
  // Keyed by prefill worker id + '\0' + decode worker id.
  absl::flat_hash_map<std::string, double> pair_rate_;
  absl::flat_hash_map<std::string, double> prefill_rate_;
};

// Options of a LatencyCorrection. LatencyCorrection::Create validates them.
struct LatencyCorrectionOptions {
  // Weight of a new observation in the moving average (of log ratios). In (0, 1].
  double alpha = 0.1;
  // The factor stays in [1 / max_factor, max_factor]; each observed ratio is clipped to that
  // range too, so one outlier moves it by at most alpha * log(max_factor). >= 1, finite.
  double max_factor = 4.0;
};

// A multiplicative correction of one kind of prediction (a worker's TTFTs, or its TPOTs), learned
// from the latencies requests then observe: an exponentially weighted moving average of
// log(observed / predicted), i.e. a geometric mean of the ratios. What it corrects for:
// docs/slo.md, "Latency corrections". Thread-compatible; copyable.
class LatencyCorrection {
 public:
  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<LatencyCorrection> Create(const LatencyCorrectionOptions& options);

  // A request observed `observed_seconds` where the uncorrected prediction said
  // `predicted_seconds`. INVALID_ARGUMENT (nothing changes) unless both are finite and > 0.
  absl::Status Observe(double observed_seconds, double predicted_seconds);

  // What to multiply an uncorrected prediction by: 1 before any observation.
  double factor() const;
  int64_t observations() const { return observations_; }

 private:
  explicit LatencyCorrection(const LatencyCorrectionOptions& options) : options_(options) {}

  LatencyCorrectionOptions options_;
  double log_factor_ = 0;
  int64_t observations_ = 0;
};

// A LatencyCorrection per priority class of one worker's predictions, beside one over all of
// them (why per class: docs/slo.md, "Latency corrections"). A class uses its own factor from its
// first observation on, which starts from the worker-wide one (what its predictions had until
// then). Thread-compatible; copyable.
class ClassedLatencyCorrection {
 public:
  // INVALID_ARGUMENT for options out of range (LatencyCorrection::Create).
  static absl::StatusOr<ClassedLatencyCorrection> Create(const LatencyCorrectionOptions& options);

  // A request of `priority` observed `observed_seconds` where the uncorrected prediction said
  // `predicted_seconds`: teaches its class and the worker-wide factor. INVALID_ARGUMENT (nothing
  // changes) unless both are finite and > 0.
  absl::Status Observe(int32_t priority, double observed_seconds, double predicted_seconds);

  // What to multiply an uncorrected prediction for a request of `priority` by: its class's
  // factor once it has one, else the worker-wide one.
  double factor(int32_t priority) const;
  // Over every request, whatever its class.
  const LatencyCorrection& overall() const { return overall_; }
  // The classes observed so far, by priority.
  const absl::flat_hash_map<int32_t, LatencyCorrection>& by_priority() const {
    return by_priority_;
  }

 private:
  explicit ClassedLatencyCorrection(LatencyCorrection overall) : overall_(overall) {}

  LatencyCorrection overall_;
  absl::flat_hash_map<int32_t, LatencyCorrection> by_priority_;
};

}  // namespace tandem::placement

#endif  // TANDEM_ROUTER_PLACEMENT_COST_MODEL_H_
