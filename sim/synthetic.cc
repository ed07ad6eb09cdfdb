#include "sim/synthetic.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::sim {
namespace {

uint64_t Next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double Uniform(uint64_t* state) { return static_cast<double>(Next(state) >> 11) * 0x1.0p-53; }

int64_t Around(int64_t mean, uint64_t* state) {
  const double lo = static_cast<double>(mean) / 2, hi = static_cast<double>(mean) * 3 / 2;
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(lo + (hi - lo) * Uniform(state))));
}

}  // namespace

absl::StatusOr<SyntheticOptions> ParseSynthetic(absl::string_view spec) {
  SyntheticOptions o;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '=');
    const absl::string_view key = kv.first;
    double v = 0;
    if (!absl::SimpleAtod(kv.second, &v) || !std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--synthetic: ", key, "=", kv.second, " is not a number >= 0"));
    }
    const auto whole = [&](int64_t* out, int64_t min) -> absl::Status {
      if (std::floor(v) != v || v < static_cast<double>(min) || v > 4e9) {
        return absl::InvalidArgumentError(absl::StrCat("--synthetic: ", key, "=", kv.second,
                                                       " must be an integer >= ", min));
      }
      *out = static_cast<int64_t>(v);
      return absl::OkStatus();
    };
    absl::Status s;
    if (key == "requests") {
      s = whole(&o.requests, 1);
    } else if (key == "rate") {
      if (v <= 0) return absl::InvalidArgumentError("--synthetic: rate must be > 0");
      o.rate = v;
    } else if (key == "prompt") {
      s = whole(&o.prompt, 1);
    } else if (key == "output") {
      s = whole(&o.output, 1);
    } else if (key == "prefix_groups") {
      s = whole(&o.prefix_groups, 0);
    } else if (key == "prefix_tokens") {
      s = whole(&o.prefix_tokens, 0);
    } else if (key == "ttft_slo_ms") {
      o.ttft_slo_ms = v;
    } else if (key == "tpot_slo_ms") {
      o.tpot_slo_ms = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--synthetic: unknown key \"", key,
          "\" (known: requests, rate, prompt, output, prefix_groups, prefix_tokens, ttft_slo_ms, "
          "tpot_slo_ms)"));
    }
    if (!s.ok()) return s;
  }
  return o;
}

std::vector<TraceRequest> MakeSyntheticTrace(const SyntheticOptions& o, uint64_t seed) {
  uint64_t state = seed ^ 0xA5A5A5A5ULL;
  std::vector<TraceRequest> trace(static_cast<size_t>(o.requests));
  double t = 0;
  for (int64_t k = 0; k < o.requests; ++k) {
    TraceRequest& r = trace[static_cast<size_t>(k)];
    t += -std::log1p(-Uniform(&state)) / o.rate;
    r.id = absl::StrCat("s", k);
    r.arrival_s = t;
    r.prompt_tokens = Around(o.prompt, &state);
    r.output_tokens = Around(o.output, &state);
    if (o.prefix_groups > 0 && o.prefix_tokens > 0) {
      r.prefix_group = absl::StrCat("g", Next(&state) % static_cast<uint64_t>(o.prefix_groups));
      r.prefix_tokens = std::min(o.prefix_tokens, r.prompt_tokens);
    }
    if (o.ttft_slo_ms > 0) r.ttft_slo_ms = o.ttft_slo_ms;
    if (o.tpot_slo_ms > 0) r.tpot_slo_ms = o.tpot_slo_ms;
  }
  return trace;
}

}  // namespace tandem::sim
