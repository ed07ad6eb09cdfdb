// A discrete-event simulation of a Tandem cluster (docs/sim.md): requests of a trace arrive at
// the router, which places them with router/placement's real policies and admission; simulated
// prefill and decode workers run the real engine Scheduler (engine/sched) over a real BlockPool
// (engine/kv) — continuous batching, chunked prefill, prefix cache by block hashes with eviction,
// preemption — and each engine step lasts what the worker's StepProfile says for the step's
// prefill, decode and attention counts (router/placement/cost_model.h). A prompt prefilled on a
// prefill worker moves to its decode worker as the real one does (AddRemotePrefill on the decode
// worker, the prefill worker computes it, the KV transfer takes latency + bytes / bandwidth, then
// CompleteRemotePrefill). A worker that dies loses its work; the router re-places what it was
// decoding, with the tokens generated so far, on another worker.
//
// Simulated time only: the result is a function of the cluster, the trace and the seed.
//
//   ASSIGN_OR_RETURN(auto sim, sim::Simulator::Create(cluster, {.seed = 1}));
//   ASSIGN_OR_RETURN(std::vector<sim::RequestResult> results, sim->Run(trace));
//
// Not thread-safe; one Run per Simulator.
#ifndef TANDEM_SIM_SIMULATOR_H_
#define TANDEM_SIM_SIMULATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sim/sim_config.h"

namespace tandem::sim {

struct SimulatorOptions {
  // Seeds the policies' random tie-breaks and the step noise.
  uint64_t seed = 0;
  // Runs of pure decode steps on a worker (no prompt work, nothing waiting) are advanced in one
  // event up to the next thing that could change them (a finish, a block boundary, any other
  // event anywhere); false runs every step as its own event. Both give the same results
  // (simulator_test checks it).
  bool fast_decode = true;
  // Calls Scheduler::CheckInvariants after every step (slow; for tests).
  bool check_invariants = false;
};

// One request's outcome (the per-request record of tandem bench's results; times simulated).
struct RequestResult {
  bool ok = false;
  std::string error;  // "RESOURCE_EXHAUSTED: ..." as the router would answer; empty when ok
  double ttft_ms = -1;  // < 0: no first token
  double e2e_ms = -1;
  int64_t output_tokens = 0;  // generated
  // Leading prompt tokens the worker that computed the prompt found in its prefix cache.
  int64_t cached_tokens = 0;
  std::string prefill_worker;  // empty: prefilled on the decode worker
  std::string decode_worker;
  bool migrated = false;  // re-placed after its decode or prefill worker died
  int64_t preemptions = 0;
};

struct SimSummary {
  int64_t requests = 0;
  int64_t ok = 0;
  int64_t failed = 0;  // refused by admission or placement, or lost
  double simulated_seconds = 0;  // when the last request ended
  int64_t events = 0;
  int64_t steps = 0;          // engine steps, all workers
  int64_t step_events = 0;    // events that ran them (fewer with fast_decode)
  int64_t preemptions = 0;
  int64_t migrations = 0;
  int64_t prefill_timeouts = 0;  // remote prefills given up for local ones (prefill_timeout_s)
  int64_t workers = 0;
};

class Simulator {
 public:
  // INVALID_ARGUMENT for a cluster the real components refuse (policy options, admission
  // options, a failure naming no worker).
  static absl::StatusOr<std::unique_ptr<Simulator>> Create(const ClusterConfig& cluster,
                                                           const SimulatorOptions& options);
  ~Simulator();

  // Simulates `trace` (sorted by arrival) to the end: results[i] is trace[i]'s.
  absl::StatusOr<std::vector<RequestResult>> Run(absl::Span<const TraceRequest> trace);
  const SimSummary& summary() const;

  // Token ids: those of a shared prefix are a function of (prefix group, position), the rest of
  // (index in the trace, position), so the prefix cache sees exactly the sharing the trace says.

  // Worker ids in order: prefill workers "p0".., decode "d0".., both "w0.." (numbered per role
  // across pools, in pool order).
  std::vector<std::string> WorkerIds() const;

 private:
  class Impl;
  explicit Simulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::sim

#endif  // TANDEM_SIM_SIMULATOR_H_
