// A generated workload for the scale benchmark (tandem_sim --synthetic=...), so that a million
// requests need no trace file: Poisson arrivals, prompt and output lengths uniform around their
// means, and shared prefixes drawn from a fixed set of groups. Deterministic for a seed.
//
//   ASSIGN_OR_RETURN(sim::SyntheticOptions o,
//                    sim::ParseSynthetic("requests=1000000,rate=20000,prompt=256,output=64"));
//   std::vector<sim::TraceRequest> trace = sim::MakeSyntheticTrace(o, /*seed=*/1);
#ifndef TANDEM_SIM_SYNTHETIC_H_
#define TANDEM_SIM_SYNTHETIC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/sim_config.h"

namespace tandem::sim {

struct SyntheticOptions {
  int64_t requests = 1000;  // >= 1
  double rate = 10;         // requests per second, > 0 (Poisson)
  // Means of the lengths; each is uniform in [mean / 2, mean * 3 / 2], at least 1.
  int64_t prompt = 256;
  int64_t output = 64;
  // Requests share one of `prefix_groups` prefixes of `prefix_tokens` tokens (capped at the
  // prompt); 0 groups: no sharing.
  int64_t prefix_groups = 0;
  int64_t prefix_tokens = 0;
  // Objectives given to every request, ms; 0: none.
  double ttft_slo_ms = 0;
  double tpot_slo_ms = 0;
};

// "key=value,..." with the keys requests, rate, prompt, output, prefix_groups, prefix_tokens,
// ttft_slo_ms, tpot_slo_ms. INVALID_ARGUMENT naming the key for an unknown key or a bad value.
absl::StatusOr<SyntheticOptions> ParseSynthetic(absl::string_view spec);

std::vector<TraceRequest> MakeSyntheticTrace(const SyntheticOptions& options, uint64_t seed);

}  // namespace tandem::sim

#endif  // TANDEM_SIM_SYNTHETIC_H_
