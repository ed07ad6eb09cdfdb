// `tandem profile --worker=HOST:PORT --out=FILE`: a running worker's step profile, saved as
// profile.json (docs/sim.md, "Profiles"), for `tandem sim` and `tandem plan`.
//
// The worker's WatchState snapshot carries its latest engine steps (at start-up, those of its
// calibration) and its settings; the steps are fitted with the router's own step model
// (router/placement/cost_model.h, StepCostModel with CalibrationOptions: what the router starts a
// new worker's model from). --watch_s=S also fits the steps the worker reports over S more
// seconds. `tandem profile --roofline ...` is bench/tandem_bench/profile.py (the `tandem` binary
// hands it over).
#ifndef TANDEM_CLI_PROFILE_H_
#define TANDEM_CLI_PROFILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// Fewer steps than this are no fit (five coefficients; the router asks as many of a snapshot).
inline constexpr int kMinProfileSteps = 8;

// profile.json of a worker from its snapshot and the load samples that followed it. Steps that
// computed nothing (batch_size 0) are left out, as the router does. FAILED_PRECONDITION when
// fewer than kMinProfileSteps steps remain (a worker started with --nocalibrate that has served
// nothing yet); INVALID_ARGUMENT for a step the model refuses. kv_bytes_per_token is null when
// the snapshot has no KV pool layout (prefill workers export none).
struct CapturedProfile {
  nlohmann::json profile;  // profile.json: exactly the keys of docs/sim.md's format
  int64_t steps = 0;       // engine steps fitted
};
absl::StatusOr<CapturedProfile> ProfileOfWorker(const v1::Snapshot& snapshot,
                                                absl::Span<const v1::LoadSample> later);

// The command. Returns the exit code: 0, 2 for bad flags, 1 for other failures.
int RunProfile();

}  // namespace tandem

#endif  // TANDEM_CLI_PROFILE_H_
