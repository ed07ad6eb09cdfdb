// The simulator's inputs (docs/sim.md; the contract with tandem bench is
// /work/notes/sim_contract.md, restated in docs/sim.md): a cluster description (cluster.json,
// with worker profiles inline or in their own files) and a trace (trace.jsonl, one request a
// line, sorted by arrival). Parsing only: every field is checked here, and a bad one is refused
// with INVALID_ARGUMENT naming the file, the line and the field.
//
//   ASSIGN_OR_RETURN(sim::ClusterConfig cluster, sim::ReadClusterFile("cluster.json"));
//   ASSIGN_OR_RETURN(std::vector<sim::TraceRequest> trace, sim::ReadTraceFile("trace.jsonl"));
#ifndef TANDEM_SIM_SIM_CONFIG_H_
#define TANDEM_SIM_SIM_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "router/placement/admission.h"
#include "router/placement/cost_model.h"
#include "router/placement/placement.h"

namespace tandem::sim {

// One request of the trace.
struct TraceRequest {
  std::string id;
  double arrival_s = 0;        // >= 0, not before the line above
  int64_t prompt_tokens = 0;   // >= 1
  int64_t output_tokens = 0;   // >= 1
  // The first prefix_tokens tokens equal those of every request of the group; empty group: no
  // shared prefix (prefix_tokens 0). prefix_tokens <= prompt_tokens.
  std::string prefix_group;
  int64_t prefix_tokens = 0;
  std::string slo_class;
  int32_t priority = 0;
  std::string tenant;
  // Objectives, ms; nullopt: none. > 0.
  std::optional<double> ttft_slo_ms;
  std::optional<double> tpot_slo_ms;
};

// A pool of identical workers.
struct PoolConfig {
  placement::Role role = placement::Role::kDecode;
  int64_t count = 1;  // >= 1
  // How fast a worker computes: its step model (cost_model.h) and what a token of KV weighs.
  placement::StepProfile step;
  int64_t kv_bytes_per_token = 131072;  // >= 0
  // The worker's scheduler (engine/sched/scheduler.h SchedulerOptions) and KV pool.
  int64_t max_running = 64;          // >= 1
  int64_t token_budget = 512;        // >= 1 (max_tokens_per_step)
  int64_t max_prefill_tokens = 0;    // >= 0; 0: the token budget
  int64_t max_prefill_chunk = 0;     // >= 0; 0: the token budget
  int64_t kv_blocks = 4096;          // >= 1
  int64_t block_size = 16;           // >= 1, the same in every pool
};

// The KV transfer model of every prefill -> decode pair.
struct LinkConfig {
  double bandwidth_gbps = 10;  // gigabits per second, > 0
  double latency_us = 50;      // >= 0
};

// A worker that dies at a time.
struct FailureConfig {
  double at_s = 0;     // >= 0
  std::string worker;  // a worker's id ("p0", "d3", "w1")
};

struct ClusterConfig {
  // router/placement's policy name (placement::KnownPolicies()); "prefix" is kv_aware.
  std::string policy = "slo";
  placement::PolicyOptions policy_options;
  placement::AdmissionOptions admission;
  std::vector<PoolConfig> pools;  // not empty; at least one decode-capable worker
  LinkConfig links;
  std::vector<FailureConfig> failures;
  // How long a decode worker waits for a remote prefill before it prefills the prompt itself
  // (the router's --prefill_timeout, default 30 s; the real decode worker first tries the next
  // prefill worker of its list). > 0.
  double prefill_timeout_s = 30;
  // Multiplicative jitter of every step's duration: uniform in [1 - step_noise, 1 + step_noise],
  // seeded. In [0, 1).
  double step_noise = 0;
  // Measured multipliers of step durations: each step's time is the profile's times one of these,
  // drawn by the same seeded hash of (worker, step) as step_noise. Made from a real worker's
  // recorded steps (measured seconds / the profile's prediction, bench/sim_fidelity.py), so the
  // simulated steps have the real ones' spread and tail (an OS preemption on a shared machine
  // makes a step many times longer), which a fitted mean cannot. Empty: none. Each > 0 and
  // finite; not with step_noise > 0.
  std::vector<double> step_factors;
  // Workers per router (0: one router over the whole cluster). Each router places on its own cell
  // of workers and arrivals go to routers in turn, as router replicas behind a load balancer do; a
  // placement scans its cell, so a 10,000-worker cluster needs cells to place a million requests
  // quickly.
  int64_t router_cell_size = 0;
};

// Parses cluster.json's text. `path` names the file in errors; profiles given as file names are
// read relative to `base_dir` (empty: the current directory).
absl::StatusOr<ClusterConfig> ParseCluster(absl::string_view text, absl::string_view path,
                                           absl::string_view base_dir);
absl::StatusOr<ClusterConfig> ReadClusterFile(const std::string& path);

// Parses a profile (profile.json's text, tandem-profile-v1) into `pool`: its step coefficients,
// kv_bytes_per_token and the scheduler and pool fields it has (ParseCluster applies a pool's own
// fields after its profile's, so they win). `where` names it in errors.
absl::Status ParseProfile(absl::string_view text, absl::string_view where, PoolConfig* pool);

// One trace line (1-based `line` number for errors).
absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view text, absl::string_view path,
                                            int64_t line);
// The whole trace; blank lines are skipped. Refuses a line whose arrival_s is before the one
// above it.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text,
                                                     absl::string_view path);
absl::StatusOr<std::vector<TraceRequest>> ReadTraceFile(const std::string& path);

}  // namespace tandem::sim

#endif  // TANDEM_SIM_SIM_CONFIG_H_
