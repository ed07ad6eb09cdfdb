// The router's advisory planner (--planner=advise; docs/sim.md "Planning", docs/metrics.md):
// what `tandem plan` would recommend for the traffic the router sees now.
//
// ObservedWorkload keeps a sliding window of the router's requests: arrivals (the request path
// counts them at placement) and finished requests (prompt and output tokens, their objectives
// and whether they met them). PlannerAdvisor, every interval on a thread of its own (off the
// request path), turns a snapshot of it into a synthetic workload of the same rate, mean lengths
// and objectives (sim/synthetic.h), takes each role's worker template from the registry (the
// first ready worker of the role: its fitted step profile and KV pool size), runs the planner
// (sim/planner.h) in-process with a bound on its simulations, and exports the recommendation:
// tandem_router_planner_* gauges, and one INFO log line whenever the recommended configuration
// changes. Nothing is changed in the cluster: operators act on it.
//
//   InstallRouterWorkload(&workload);
//   PlannerAdvisor advisor(options, &registry, &workload);
//   advisor.Start();   // or AdviseOnce() in tests
//
// Both classes are thread-safe.
#ifndef TANDEM_ROUTER_SERVER_PLANNER_ADVISOR_H_
#define TANDEM_ROUTER_SERVER_PLANNER_ADVISOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/periodic_thread.h"
#include "router/server/registry.h"
#include "sim/planner.h"

namespace tandem::router {

// What the window says about the traffic.
struct WorkloadSnapshot {
  int64_t arrivals = 0;  // in the window
  double rate = 0;       // arrivals per second over the window (or since the first arrival)
  int64_t finished = 0;  // requests finished in the window
  double mean_prompt_tokens = 0;
  double mean_output_tokens = 0;
  // Means of the finished requests' objectives, ms (0: none had one).
  double ttft_slo_ms = 0;
  double tpot_slo_ms = 0;
  // Finished requests with objectives, and the fraction that met them (-1: none).
  int64_t slo_requests = 0;
  double attainment = -1;
};

class ObservedWorkload {
 public:
  // REQUIRES: window > 0. `clock` must outlive this.
  explicit ObservedWorkload(absl::Duration window = absl::Seconds(60), Clock* clock = RealClock());

  void Arrived();
  // A request finished with these lengths; its objectives in seconds (0: none) and whether it met
  // them (meaningful only when it had one).
  void Finished(int64_t prompt_tokens, int64_t output_tokens, double ttft_slo_s, double tpot_slo_s,
                bool met);
  WorkloadSnapshot Snapshot();

 private:
  struct Done {
    absl::Time at;
    int64_t prompt_tokens;
    int64_t output_tokens;
    double ttft_slo_s;
    double tpot_slo_s;
    bool met;
  };
  void TrimLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration window_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::deque<absl::Time> arrivals_ ABSL_GUARDED_BY(mu_);
  std::deque<Done> finished_ ABSL_GUARDED_BY(mu_);
};

// The process's window, fed by the request path (decode_relay.cc, request_router.cc): null (and
// nothing recorded, for one atomic load per request) until the router's main installs one for
// --planner=advise. `workload` must outlive every request. Thread-safe.
ObservedWorkload* RouterWorkload();
void InstallRouterWorkload(ObservedWorkload* workload);

struct PlannerAdvisorOptions {
  // Between the end of one advice and the start of the next. > 0.
  absl::Duration interval = absl::Seconds(30);
  // Objectives for requests that carried none (the slo policy's defaults), ms; > 0.
  double default_ttft_slo_ms = 2000;
  double default_tpot_slo_ms = 100;
  double attainment_target = 0.9;
  // The planner's search: the router's policy by default; at most max_workers per configuration.
  std::vector<std::string> policies = {"slo"};
  int64_t max_workers = 16;
  // Bounds one advice's time: requests of the synthetic workload, and simulations.
  int64_t trace_requests = 200;
  int64_t max_simulations = 200;
  // Scheduler settings the workers do not report (their KV pool size comes from their load).
  int64_t max_running = 64;
  int64_t token_budget = 512;
  uint64_t seed = 0;
};

// One advice's outcome.
struct Advice {
  WorkloadSnapshot workload;
  // Why there is no plan ("no traffic", "no ready worker profile"); empty when planned.
  std::string skipped;
  std::optional<sim::Plan> plan;
};

class PlannerAdvisor {
 public:
  // `registry` and `workload` must outlive this.
  PlannerAdvisor(PlannerAdvisorOptions options, Registry* registry, ObservedWorkload* workload);
  ~PlannerAdvisor();  // stops the thread

  // Starts advising every interval on a thread of its own.
  void Start();
  // One advice now (the thread's body): plans, exports the metrics, logs a change. INVALID_ARGUMENT
  // for options the planner refuses.
  absl::StatusOr<Advice> AdviseOnce();

 private:
  const PlannerAdvisorOptions options_;
  Registry* const registry_;
  ObservedWorkload* const workload_;
  absl::Mutex mu_;  // one advice at a time
  std::string last_label_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_PLANNER_ADVISOR_H_
