#include "router/placement/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace tandem::placement {
namespace {

constexpr int kTerms = 5;  // base, prefill, decode, context, prompt context

bool FiniteNonNegative(double x) { return std::isfinite(x) && x >= 0; }

std::array<double, kTerms> AsArray(const StepProfile& p) {
  return {p.base_seconds, p.prefill_token_seconds, p.decode_token_seconds, p.context_token_seconds,
          p.prompt_context_token_seconds};
}

StepProfile FromArray(const std::array<double, kTerms>& a) {
  return {.base_seconds = a[0],
          .prefill_token_seconds = a[1],
          .decode_token_seconds = a[2],
          .context_token_seconds = a[3],
          .prompt_context_token_seconds = a[4]};
}

// Solves a x = b for the symmetric positive definite n x n top-left block of `a` (Cholesky).
// False when a pivot is not positive (never for the regularized systems of StepCostModel, short
// of overflow).
bool SolveSpd(int n, std::array<std::array<double, kTerms>, kTerms> a, std::array<double, kTerms> b,
              std::array<double, kTerms>* x) {
  // a = L L^T, L stored in the lower triangle of a.
  for (int j = 0; j < n; ++j) {
    double d = a[j][j];
    for (int k = 0; k < j; ++k) d -= a[j][k] * a[j][k];
    if (!(d > 0) || !std::isfinite(d)) return false;
    a[j][j] = std::sqrt(d);
    for (int i = j + 1; i < n; ++i) {
      double s = a[i][j];
      for (int k = 0; k < j; ++k) s -= a[i][k] * a[j][k];
      a[i][j] = s / a[j][j];
    }
  }
  for (int i = 0; i < n; ++i) {  // L y = b
    for (int k = 0; k < i; ++k) b[i] -= a[i][k] * b[k];
    b[i] /= a[i][i];
  }
  for (int i = n - 1; i >= 0; --i) {  // L^T x = y
    for (int k = i + 1; k < n; ++k) b[i] -= a[k][i] * b[k];
    b[i] /= a[i][i];
  }
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(b[i])) return false;
    (*x)[i] = b[i];
  }
  return true;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ----------------------------------------------------------------------------------------------
// Profiles and predictions

double StepProfile::StepSeconds(double prefill_tokens, double decode_tokens, double context_tokens,
                                double prompt_context_tokens) const {
  return base_seconds + prefill_token_seconds * prefill_tokens +
         decode_token_seconds * decode_tokens + context_token_seconds * context_tokens +
         prompt_context_token_seconds * prompt_context_tokens;
}

absl::Status ValidateProfile(const StepProfile& profile) {
  const std::pair<absl::string_view, double> terms[] = {
      {"base_seconds", profile.base_seconds},
      {"prefill_token_seconds", profile.prefill_token_seconds},
      {"decode_token_seconds", profile.decode_token_seconds},
      {"context_token_seconds", profile.context_token_seconds},
      {"prompt_context_token_seconds", profile.prompt_context_token_seconds},
  };
  for (const auto& [name, value] : terms) {
    if (!FiniteNonNegative(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step profile: ", name, " ", value, " is not finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

int64_t PrefillChunkTokens(const PrefillShape& shape) {
  const int64_t budget = std::max<int64_t>(shape.token_budget, 1);
  const int64_t decode = std::clamp<int64_t>(shape.decode_seqs, 0, budget);
  const int64_t chunk = std::max<int64_t>(budget - decode, 1);
  return shape.max_prefill_tokens > 0 ? std::min(chunk, shape.max_prefill_tokens) : chunk;
}

int64_t PrefillSteps(const PrefillShape& shape) {
  return CeilDiv(std::max<int64_t>(shape.uncached_tokens, 1), PrefillChunkTokens(shape));
}

namespace {

// Tokens attended to by prompt positions [from, to): sum of (position + 1) = T(to) - T(from),
// T(n) = n (n + 1) / 2.
double AttendedTokens(double from, double to) { return (to * (to + 1) - from * (from + 1)) / 2; }

}  // namespace

double PrefillSeconds(const StepProfile& profile, const PrefillShape& shape) {
  const double tokens = static_cast<double>(std::max<int64_t>(shape.uncached_tokens, 1));
  const double steps = static_cast<double>(PrefillSteps(shape));
  const double decode = static_cast<double>(
      std::clamp<int64_t>(shape.decode_seqs, 0, std::max<int64_t>(shape.token_budget, 1)));
  // However the prompt is chunked, its tokens attend to the positions before them once each.
  const double cached = static_cast<double>(std::max<int64_t>(shape.cached_tokens, 0));
  return steps * profile.StepSeconds(0, decode, static_cast<double>(shape.decode_context_tokens)) +
         profile.prefill_token_seconds * tokens +
         profile.prompt_context_token_seconds * AttendedTokens(cached, cached + tokens);
}

double QueuedPrefillSeconds(const StepProfile& profile, const PrefillShape& shape) {
  if (shape.uncached_tokens <= 0) return 0;
  const double tokens = static_cast<double>(shape.uncached_tokens);
  const double prompts = static_cast<double>(
      std::clamp<int64_t>(shape.queued_prompts, 1, shape.uncached_tokens));
  const double steps = static_cast<double>(PrefillSteps(shape));
  const double decode = static_cast<double>(
      std::clamp<int64_t>(shape.decode_seqs, 0, std::max<int64_t>(shape.token_budget, 1)));
  return steps * profile.StepSeconds(0, decode, static_cast<double>(shape.decode_context_tokens)) +
         profile.prefill_token_seconds * tokens +
         profile.prompt_context_token_seconds * prompts * AttendedTokens(0, tokens / prompts);
}

double DecodeStepSeconds(const StepProfile& profile, int64_t batch_size, int64_t context_tokens) {
  return profile.StepSeconds(0, static_cast<double>(batch_size),
                             static_cast<double>(context_tokens));
}

// ----------------------------------------------------------------------------------------------
// StepCostModel

absl::StatusOr<StepCostModel> StepCostModel::Create(const StepCostModelOptions& options) {
  RETURN_IF_ERROR(ValidateProfile(options.prior));
  if (!std::isfinite(options.prior_weight) || options.prior_weight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("step cost model: prior_weight ",
                                                   options.prior_weight, " is not finite and > 0"));
  }
  if (!(options.min_prior_weight > 0 && options.min_prior_weight <= options.prior_weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step cost model: min_prior_weight ", options.min_prior_weight,
                     " is not in (0, prior_weight = ", options.prior_weight, "]"));
  }
  if (!(options.forgetting > 0 && options.forgetting <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step cost model: forgetting ", options.forgetting, " is not in (0, 1]"));
  }
  const std::pair<absl::string_view, double> typical[] = {
      {"typical_prefill_tokens", options.typical_prefill_tokens},
      {"typical_decode_tokens", options.typical_decode_tokens},
      {"typical_context_tokens", options.typical_context_tokens},
      {"typical_prompt_context_tokens", options.typical_prompt_context_tokens},
  };
  for (const auto& [name, value] : typical) {
    if (!std::isfinite(value) || value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step cost model: ", name, " ", value, " is not finite and > 0"));
    }
  }
  if (!std::isfinite(options.outlier_factor) || options.outlier_factor < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step cost model: outlier_factor ", options.outlier_factor, " is not finite and >= 1"));
  }
  if (!(options.recent_alpha > 0 && options.recent_alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step cost model: recent_alpha ", options.recent_alpha, " is not in (0, 1]"));
  }
  return StepCostModel(options);
}

StepCostModel::StepCostModel(const StepCostModelOptions& options)
    : options_(options),
      scale_({1.0, options.typical_prefill_tokens, options.typical_decode_tokens,
              options.typical_context_tokens, options.typical_prompt_context_tokens}),
      prior_weight_(options.prior_weight),
      profile_(options.prior) {}

absl::Status StepCostModel::Reset(const StepProfile& prior) {
  RETURN_IF_ERROR(ValidateProfile(prior));
  options_.prior = prior;
  xx_ = {};
  xy_ = {};
  observations_ = 0;
  effective_observations_ = 0;
  prior_weight_ = options_.prior_weight;
  profile_ = prior;
  recent_log_ratio_ = 0;
  return absl::OkStatus();
}

absl::Status StepCostModel::Observe(const StepObservation& step) {
  const std::pair<absl::string_view, int64_t> fields[] = {
      {"batch_size", step.batch_size},       {"prefill_tokens", step.prefill_tokens},
      {"decode_tokens", step.decode_tokens}, {"context_tokens", step.context_tokens},
      {"prompt_context_tokens", step.prompt_context_tokens},
      {"duration_us", step.duration_us},
  };
  for (const auto& [name, value] : fields) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step cost model: observation has ", name, " ", value, " < 0"));
    }
  }
  const std::array<double, kTerms> x = {1.0 / scale_[0],
                                        static_cast<double>(step.prefill_tokens) / scale_[1],
                                        static_cast<double>(step.decode_tokens) / scale_[2],
                                        static_cast<double>(step.context_tokens) / scale_[3],
                                        static_cast<double>(step.prompt_context_tokens) / scale_[4]};
  // Clip against the current prediction, with a 1 ms floor so that a profile near 0 can rise.
  const double predicted = StepSeconds(step);
  const double y = std::min(static_cast<double>(step.duration_us) * 1e-6,
                            options_.outlier_factor * std::max(predicted, 1e-3));
  const double bound = std::log(options_.outlier_factor);
  const double residual =
      std::clamp(std::log(std::max(y, 1e-6) / std::max(predicted, 1e-6)), -bound, bound);
  recent_log_ratio_ += options_.recent_alpha * (residual - recent_log_ratio_);
  const double lambda = options_.forgetting;
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) xx_[i][j] = lambda * xx_[i][j] + x[i] * x[j];
    xy_[i] = lambda * xy_[i] + x[i] * y;
  }
  ++observations_;
  effective_observations_ = lambda * effective_observations_ + 1;
  prior_weight_ = std::max(lambda * prior_weight_, options_.min_prior_weight);
  Solve();
  return absl::OkStatus();
}

StepCostModelOptions CalibrationOptions() {
  StepCostModelOptions options;
  options.prior_weight = 1e-6;
  options.min_prior_weight = 1e-6;
  options.forgetting = 1.0;
  options.outlier_factor = 1e9;
  return options;
}

void StepCostModel::Solve() {
  // Minimize sum_i w_i (y_i - x'_i . phi)^2 + w |phi - phi0|^2 over phi >= 0, where
  // phi = theta * scale and w the prior's weight now. M = xx + w I is positive definite, so the
  // objective is strictly convex; its minimizer over the orthant is the unconstrained minimizer
  // on its own support. Trying all 32 supports and keeping the best one whose solution is >= 0
  // is therefore exact (non-negative least squares for five unknowns).
  const std::array<double, kTerms> prior = AsArray(options_.prior);
  std::array<std::array<double, kTerms>, kTerms> m = xx_;
  std::array<double, kTerms> g = xy_;
  for (int i = 0; i < kTerms; ++i) {
    m[i][i] += prior_weight_;
    g[i] += prior_weight_ * prior[i] * scale_[i];
  }
  std::array<double, kTerms> best = {};  // the empty support: phi = 0, objective 0
  double best_objective = 0;
  for (unsigned support = 1; support < (1u << kTerms); ++support) {
    int idx[kTerms] = {};
    int n = 0;
    for (int i = 0; i < kTerms; ++i) {
      if (support & (1u << i)) idx[n++] = i;
    }
    std::array<std::array<double, kTerms>, kTerms> ms = {};
    std::array<double, kTerms> gs = {};
    for (int r = 0; r < n; ++r) {
      gs[r] = g[idx[r]];
      for (int c = 0; c < n; ++c) ms[r][c] = m[idx[r]][idx[c]];
    }
    std::array<double, kTerms> phi = {};
    if (!SolveSpd(n, ms, gs, &phi)) continue;
    bool feasible = true;
    double objective = 0;  // phi^T M phi - 2 g^T phi = -g^T phi at the support's minimizer
    for (int r = 0; r < n; ++r) {
      if (phi[r] < 0) feasible = false;
      objective -= gs[r] * phi[r];
    }
    if (!feasible || !(objective < best_objective)) continue;
    best_objective = objective;
    best = {};
    for (int r = 0; r < n; ++r) best[idx[r]] = phi[r];
  }
  std::array<double, kTerms> theta = {};
  for (int i = 0; i < kTerms; ++i) {
    theta[i] = best[i] / scale_[i];
    // Never publish a value that is not finite and >= 0 (a solve gone wrong keeps the old fit).
    if (!FiniteNonNegative(theta[i])) return;
  }
  profile_ = FromArray(theta);
}

double StepCostModel::StepSeconds(const StepObservation& step) const {
  return profile_.StepSeconds(static_cast<double>(step.prefill_tokens),
                              static_cast<double>(step.decode_tokens),
                              static_cast<double>(step.context_tokens),
                              static_cast<double>(step.prompt_context_tokens));
}

double StepCostModel::PrefillSeconds(const PrefillShape& shape) const {
  return placement::PrefillSeconds(profile_, shape);
}

double StepCostModel::QueuedPrefillSeconds(const PrefillShape& shape) const {
  return placement::QueuedPrefillSeconds(profile_, shape);
}

double StepCostModel::DecodeStepSeconds(int64_t batch_size, int64_t context_tokens) const {
  return placement::DecodeStepSeconds(profile_, batch_size, context_tokens);
}

// ----------------------------------------------------------------------------------------------
// TransferModel

namespace {

std::string PairKey(absl::string_view prefill_worker, absl::string_view decode_worker) {
  return absl::StrCat(prefill_worker, absl::string_view("\0", 1), decode_worker);
}

}  // namespace

absl::StatusOr<TransferModel> TransferModel::Create(const TransferModelOptions& options) {
  if (!FiniteNonNegative(options.default_seconds_per_byte)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer model: default_seconds_per_byte ",
                                                   options.default_seconds_per_byte,
                                                   " is not finite and >= 0"));
  }
  if (!(options.alpha > 0 && options.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer model: alpha ", options.alpha, " is not in (0, 1]"));
  }
  if (options.min_observed_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer model: min_observed_bytes ", options.min_observed_bytes, " < 0"));
  }
  if (!std::isfinite(options.outlier_factor) || options.outlier_factor < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer model: outlier_factor ", options.outlier_factor, " is not finite and >= 1"));
  }
  return TransferModel(options);
}

double TransferModel::Update(double estimate, double rate, const TransferModelOptions& options) {
  // An estimate of 0 (a default of 0) has no scale to clip against: the first rate is taken.
  if (estimate > 0) {
    rate = std::clamp(rate, estimate / options.outlier_factor, estimate * options.outlier_factor);
  }
  return (1 - options.alpha) * estimate + options.alpha * rate;
}

absl::Status TransferModel::Observe(absl::string_view prefill_worker,
                                    absl::string_view decode_worker, int64_t bytes,
                                    double seconds) {
  if (prefill_worker.empty() || decode_worker.empty()) {
    return absl::InvalidArgumentError("transfer model: empty worker id");
  }
  if (bytes < 0 || !FiniteNonNegative(seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer model: observation of ", bytes,
                                                   " bytes in ", seconds, " s is invalid"));
  }
  if (bytes == 0 || bytes < options_.min_observed_bytes) return absl::OkStatus();
  const double rate = seconds / static_cast<double>(bytes);
  const std::string prefill_key(prefill_worker);
  const auto prefill_it = prefill_rate_.find(prefill_key);
  const double prefill_estimate =
      prefill_it != prefill_rate_.end() ? prefill_it->second : options_.default_seconds_per_byte;
  const std::string pair_key = PairKey(prefill_worker, decode_worker);
  const auto pair_it = pair_rate_.find(pair_key);
  const double pair_estimate = pair_it != pair_rate_.end() ? pair_it->second : prefill_estimate;
  pair_rate_[pair_key] = Update(pair_estimate, rate, options_);
  prefill_rate_[prefill_key] = Update(prefill_estimate, rate, options_);
  return absl::OkStatus();
}

double TransferModel::SecondsPerByte(absl::string_view prefill_worker,
                                     absl::string_view decode_worker) const {
  if (auto it = pair_rate_.find(PairKey(prefill_worker, decode_worker)); it != pair_rate_.end()) {
    return it->second;
  }
  if (auto it = prefill_rate_.find(std::string(prefill_worker)); it != prefill_rate_.end()) {
    return it->second;
  }
  return options_.default_seconds_per_byte;
}

double TransferModel::TransferSeconds(absl::string_view prefill_worker,
                                      absl::string_view decode_worker, int64_t bytes) const {
  if (bytes <= 0) return 0;
  return static_cast<double>(bytes) * SecondsPerByte(prefill_worker, decode_worker);
}

void TransferModel::ForgetWorker(absl::string_view worker) {
  prefill_rate_.erase(std::string(worker));
  for (auto it = pair_rate_.begin(); it != pair_rate_.end();) {
    const absl::string_view key = it->first;
    const size_t sep = key.find('\0');
    if (key.substr(0, sep) == worker || key.substr(sep + 1) == worker) {
      pair_rate_.erase(it++);
    } else {
      ++it;
    }
  }
}

// ----------------------------------------------------------------------------------------------
// LatencyCorrection

absl::StatusOr<LatencyCorrection> LatencyCorrection::Create(
    const LatencyCorrectionOptions& options) {
  if (!(options.alpha > 0 && options.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("latency correction: alpha ", options.alpha, " is not in (0, 1]"));
  }
  if (!std::isfinite(options.max_factor) || options.max_factor < 1) {
    return absl::InvalidArgumentError(absl::StrCat("latency correction: max_factor ",
                                                   options.max_factor, " is not finite and >= 1"));
  }
  return LatencyCorrection(options);
}

absl::Status LatencyCorrection::Observe(double observed_seconds, double predicted_seconds) {
  if (!std::isfinite(observed_seconds) || observed_seconds <= 0 ||
      !std::isfinite(predicted_seconds) || predicted_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("latency correction: observed ", observed_seconds, " s against predicted ",
                     predicted_seconds, " s (both must be finite and > 0)"));
  }
  const double bound = std::log(options_.max_factor);
  const double ratio = std::clamp(std::log(observed_seconds / predicted_seconds), -bound, bound);
  log_factor_ = std::clamp(log_factor_ + options_.alpha * (ratio - log_factor_), -bound, bound);
  ++observations_;
  return absl::OkStatus();
}

double LatencyCorrection::factor() const { return std::exp(log_factor_); }

// ----------------------------------------------------------------------------------------------
// ClassedLatencyCorrection

absl::StatusOr<ClassedLatencyCorrection> ClassedLatencyCorrection::Create(
    const LatencyCorrectionOptions& options) {
  ASSIGN_OR_RETURN(LatencyCorrection overall, LatencyCorrection::Create(options));
  return ClassedLatencyCorrection(overall);
}

absl::Status ClassedLatencyCorrection::Observe(int32_t priority, double observed_seconds,
                                               double predicted_seconds) {
  // Validated by the worker-wide one first, so that a refused observation creates no class.
  const LatencyCorrection before = overall_;
  RETURN_IF_ERROR(overall_.Observe(observed_seconds, predicted_seconds));
  return by_priority_.try_emplace(priority, before)
      .first->second.Observe(observed_seconds, predicted_seconds);
}

double ClassedLatencyCorrection::factor(int32_t priority) const {
  auto it = by_priority_.find(priority);
  return it != by_priority_.end() ? it->second.factor() : overall_.factor();
}

}  // namespace tandem::placement
