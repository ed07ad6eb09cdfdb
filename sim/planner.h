// The planner (docs/sim.md, "Planning"): the cheapest cluster configuration that meets a
// workload's service-level objectives, found by simulating candidates (simulator.h).
//
// A configuration is a shape (aggregated: N workers that both prefill and decode; disaggregated:
// P prefill + D decode workers), a placement policy and a token budget per engine step (the
// chunk size of chunked prefill). Its cost is the sum of its workers' per-role costs. The search
// runs one "family" (shape, policy, token budget) at a time and, inside it, looks for the
// smallest pools that meet the target:
//   - aggregated: N = 1, 2, 4, ... until one meets the target, then a binary search below it;
//   - disaggregated: for P = 1, 2, ... the smallest D by the same search (bounded above by the D
//     of P - 1, which is verified, not assumed); P stops growing once another prefill worker
//     saves no decode worker, once one more did not raise the attainment of a P that missed, or
//     once P prefill workers alone cost more than the family's best.
// Attainment is assumed to grow with pool sizes (more workers never hurt); the search is exact
// where that holds. The cheapest family's configuration is the plan; the runner-up is the
// cheapest of the other families with different pools (else simply the next family). For both,
// the rate headroom is the highest multiple of the workload's arrival rate (arrival times
// divided by it) at which the configuration still meets the target, by bisection.
//
// Deterministic: the same inputs give the same plan, whatever `jobs` is.
//
//   ASSIGN_OR_RETURN(sim::Plan plan, sim::PlanCluster(base_cluster, trace, options));
//   if (plan.best) Print(plan.best->config.Label(), plan.best->config.cost);
//
// Thread-safe (no shared state); PlanCluster runs up to options.jobs simulations at once on its
// own threads and returns when they are done.
#ifndef TANDEM_SIM_PLANNER_H_
#define TANDEM_SIM_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json_fwd.hpp"
#include "sim/sim_config.h"
#include "sim/simulator.h"

namespace tandem::sim {

struct PlanOptions {
  // Objectives given to every request of the trace that has none of its own, ms; 0: none. The trace
  // and these together must give at least one objective.
  double ttft_slo_ms = 0;
  double tpot_slo_ms = 0;
  // The fraction of requests that must meet their objectives (finish, within TTFT and TPOT),
  // in (0, 1].
  double attainment_target = 0.9;

  // The cost of one worker of each role (>= 0; a configuration's cost is the sum).
  double prefill_cost = 1;
  double decode_cost = 1;
  double both_cost = 1;

  // The search space. Policies: router/placement's names ("prefix" is kv_aware); token budgets: >=
  // 1, empty: the template pools' own. At least one shape.
  std::vector<std::string> policies = {"slo"};
  std::vector<int64_t> token_budgets;
  bool aggregated = true;
  bool disaggregated = true;
  // The most workers in one configuration (>= 1; >= 2 for the disaggregated shape).
  int64_t max_workers = 64;

  // Rate headroom: bisection over rate multiples in [1, max_rate_scale] (>= 1), with headroom_steps
  // (>= 0) simulations per configuration.
  double max_rate_scale = 8;
  int32_t headroom_steps = 6;
  // Attainment of the best `curves` families' configurations (>= 0) at these rate multiples (each >
  // 0), for a plot of attainment versus rate.
  std::vector<double> curve_scales;
  int32_t curves = 4;

  // At most this many simulations in all (0: no bound); once reached, searches stop and the plan
  // says so (`truncated`). Bounds the router's advisory runs.
  int64_t max_simulations = 0;
  // Simulations run at once, >= 1.
  int32_t jobs = 1;
  uint64_t seed = 0;
};

// One configuration and what the simulator made of it at the workload's rate.
struct PlanCandidate {
  std::string policy;
  int64_t token_budget = 0;
  int64_t prefill_workers = 0;
  int64_t decode_workers = 0;
  int64_t both_workers = 0;  // aggregated: the only pool
  double cost = 0;
  double attainment = 0;
  bool meets = false;

  bool aggregated() const { return both_workers > 0; }
  int64_t workers() const { return prefill_workers + decode_workers + both_workers; }
  // "2P+3D slo budget=512" or "4x both least_loaded budget=256".
  std::string Label() const;
};

// A recommended configuration with its margins.
struct PlanChoice {
  PlanCandidate config;
  double margin = 0;  // attainment - target, at the workload's rate
  // The highest rate multiple found still meeting the target (>= 1), and that rate (requests/s);
  // headroom_capped: it met the target at max_rate_scale too, so the headroom is at least that.
  double headroom_scale = 1;
  double headroom_rate = 0;
  bool headroom_capped = false;
};

struct PlanCurve {
  std::string label;
  std::vector<double> rates;        // requests per second
  std::vector<double> attainments;  // at those rates
};

struct Plan {
  double offered_rate = 0;  // the trace's requests per second
  int64_t requests = 0;
  double attainment_target = 0;
  std::optional<PlanChoice> best;       // none: nothing within max_workers meets the target
  // The cheapest other family whose pools differ from the best's (else the next family).
  std::optional<PlanChoice> runner_up;
  // Each family's cheapest configuration meeting the target (or, where none does, its largest one
  // tried), cheapest first.
  std::vector<PlanCandidate> families;
  std::vector<PlanCurve> curves;
  int64_t simulations = 0;
  bool truncated = false;  // max_simulations stopped the search
};

// INVALID_ARGUMENT for bad options, a base cluster with failures (worker ids would not survive
// resizing), an empty trace or a workload with no objective.
//
// `base` gives everything but the pool sizes: its pools are the templates of each role's workers
// (profile, scheduler, KV pool): the prefill template is its first prefill pool (else its first
// pool), the decode template its first decode pool (else its first both pool, else its first), the
// aggregated template its first both pool (else the decode template); links, admission and policy
// options are kept.
absl::StatusOr<Plan> PlanCluster(const ClusterConfig& base, absl::Span<const TraceRequest> trace,
                                 const PlanOptions& options);

// The fraction of `trace`'s requests that finished within their objectives (failed ones miss).
double Attainment(absl::Span<const TraceRequest> trace, absl::Span<const RequestResult> results);

// plan.json (tandem_sim --plan; docs/sim.md): the options above as a JSON object with keys
// ttft_slo_ms, tpot_slo_ms, attainment_target, costs {prefill, decode, both}, policies,
// token_budgets, shapes ["aggregated", "disaggregated"], max_workers, max_rate_scale,
// headroom_steps, curve_scales, curves, max_simulations, jobs. Unknown keys and bad values are
// refused with INVALID_ARGUMENT naming `path` and the key.
absl::StatusOr<PlanOptions> ParsePlanOptions(absl::string_view text, absl::string_view path);

// The plan as one JSON object (tandem_sim --plan's stdout line; docs/sim.md).
nlohmann::json PlanToJson(const Plan& plan);

}  // namespace tandem::sim

#endif  // TANDEM_SIM_PLANNER_H_
