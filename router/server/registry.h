// The router's live view of the cluster: discovers workers (a static address list, or a DNS name
// re-resolved periodically, e.g. a Kubernetes headless Service: WorkerDiscovery, discovery.h),
// follows each one's WatchState stream on a thread of its own (snapshot first, then events and
// load; reconnects with backoff), and places requests under one lock with a placement policy. A
// worker is healthy (placed on) while its stream is up, has given a snapshot, and brought
// something within the liveness timeout; a cut link is found by keepalive or that timeout, and
// the worker is re-admitted by the snapshot of a new stream once it answers again. A worker that
// says it drains (LoadSample.draining: it got SIGTERM) stays healthy but is placed on no more,
// and the end of its stream, or its removal by discovery, is a departure, not a loss: requests
// already streaming from it are not touched (their relays hold channels of their own).
#ifndef TANDEM_ROUTER_SERVER_REGISTRY_H_
#define TANDEM_ROUTER_SERVER_REGISTRY_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/keepalive.h"
#include "router/placement/placement.h"
#include "router/registry/worker_view.h"
#include "router/server/discovery.h"
#include "common/periodic_thread.h"

namespace tandem::router {

struct RegistryOptions {
  // Worker addresses (host:port).
  std::vector<std::string> addresses;
  // DNS names "host:port" whose A records are the workers (e.g. one headless Service per pool);
  // re-resolved every dns_interval.
  std::vector<std::string> dns_names;
  absl::Duration dns_interval = absl::Seconds(5);
  // Resolves the names (tests give a fake one).
  Resolver resolve = ResolveDns;
  // How often workers send load samples.
  absl::Duration load_interval = absl::Milliseconds(100);
  // Reconnect delays after a stream breaks: doubling from min to max.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Where each worker's step-time model starts (the slo policy's predictions) before its own
  // step timings refine it. The prior is weak: the built-in profile describes no particular
  // machine, and a worker's first snapshot already carries the steps of its start-up calibration
  // (EngineLoop::Calibrate), which should win at once.
  placement::StepCostModelOptions cost_model = {.prior_weight = 0.5, .min_prior_weight = 0.1};
  placement::TransferModelOptions transfer_model = {};
  // Load the router placed on a worker counts in its view until a load sample received this
  // long after the placement (by then the worker's own numbers include the request: they count
  // submissions its engine has not taken yet), or until the first token or the end. A prompt
  // sent to a prefill worker goes there only once the decode worker's engine has taken it, so
  // it counts until the prefill worker's received prompt tokens show it instead.
  absl::Duration report_lag = absl::Milliseconds(150);
  // How fast each worker's TTFT and TPOT corrections follow the observed latencies.
  placement::LatencyCorrectionOptions latency_correction = {};
  // Of the WatchState channels (common/keepalive.h).
  KeepaliveOptions keepalive = {};
  // Of the WatchState channels (common/tls.h): plaintext or (mutual) TLS.
  ChannelSecurity security = {};
  // A worker whose WatchState stream brings nothing (no snapshot, event or load sample, which
  // come every load_interval) for this long is taken for lost: it takes no requests, and the
  // router subscribes again (its fresh snapshot re-admits it). Several load_intervals;
  // InfiniteDuration: only a broken stream loses a worker.
  absl::Duration liveness_timeout = absl::Seconds(3);
  // When messages are received, placements made and streams ended (their ages: report_lag, the
  // liveness timeout). The request router's must be the same: its relays report progress in it.
  // Must outlive the registry.
  Clock* clock = RealClock();
};

// Where a request goes, with what the registry counted for it.
struct Route {
  placement::Decision decision;
  std::string decode_address;
  std::vector<std::pair<std::string, std::string>> prefill;  // (worker id, address), best first
  int64_t placed_prefill_tokens = 0;
  int64_t placed_decode_tokens = 0;
  // Identifies what Place counted for the route (the registry's pending placements).
  uint64_t serial = 0;
  // The TPOT objective (ms; 0: the policy's default) and max_tokens (0: not set) it counts with
  // among the decode worker's running requests (placement::RunningGroup) until Release.
  int64_t tpot_ms = 0;
  int64_t max_tokens = 0;
  // The request's priority: its TTFT teaches the correction of its class (ObserveTtft).
  int32_t priority = 0;
  // PromptDone uncounted the prompt tokens; Release the rest.
  bool prompt_done = false;
  bool released = false;
};

struct WorkerSummary {
  std::string address;
  std::string worker_id;
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
  bool ready = false;
  bool draining = false;  // it said so (kept after it left)
  WorkerLoad load;
};

class Registry {
 public:
  explicit Registry(RegistryOptions options);
  ~Registry();  // stops every watcher

  // Places `request` with `policy` over the ready workers but those whose id is in `avoid`, and
  // counts the placed load. UNAVAILABLE when no decode-capable worker is ready.
  absl::StatusOr<Route> Place(placement::PlacementPolicy& policy, const placement::Request& request,
                              const absl::flat_hash_set<std::string>& avoid = {});
  // The request's first token came: its prompt is computed, so the prompt tokens placed on the
  // worker that prefilled it (and on the decode worker) are uncounted if they still were. What
  // Place counted is otherwise uncounted once the worker's load samples include the request
  // (RegistryOptions::report_lag), so that nothing counts twice.
  void PromptDone(Route& route);
  // The request's stream received `tokens` more output tokens at `now`: how far it is, which the
  // slo policy weighs when it adds work to the decode worker (placement::RunningGroup).
  void Progress(const Route& route, int64_t tokens, absl::Time now);
  // The request ended or failed: uncounts what is left of its placed load, once.
  void Release(Route& route);
  // A request placed on `route` (with predictions: the slo policy) saw its first token `seconds`
  // after its placement, or decoded at `seconds` a token on average: teaches the TTFT correction
  // of the worker that prefilled it (of its priority class), or the TPOT correction of its decode
  // worker (placement::LatencyCorrection, against the prediction without the correction it
  // included).
  void ObserveTtft(const Route& route, double seconds);
  void ObserveTpot(const Route& route, double seconds);
  // A prefill worker moved the KV of `tokens` prompt tokens to a decode worker, and the move took
  // `seconds` beyond the computation it overlaps (the transfer model, in bytes of the decode
  // worker's KV layout).
  void ObserveTransfer(const std::string& prefill_worker, const std::string& decode_worker,
                       int64_t tokens, double seconds);
  // A copy of the worker's fitted step profile; nullopt for an unknown id (tests, metrics).
  std::optional<placement::StepProfile> CostProfile(const std::string& worker_id);
  // Whether some decode-capable worker is ready and not draining (takes requests); its model id,
  // block size and context.
  bool Ready();
  // Waits up to `timeout` until Ready() is `ready`; false when it did not come to be.
  bool AwaitReady(bool ready, absl::Duration timeout);
  // Waits up to `timeout` until the registry follows the worker at `address` (its watch runs) or,
  // with `following` false, no longer does (discovery dropped it and its watch ended).
  bool AwaitFollowing(const std::string& address, bool following, absl::Duration timeout);
  struct ModelInfo {
    std::string model_id;
    int64_t block_size = 16;
    int64_t max_context = 0;
  };
  std::optional<ModelInfo> Model();
  std::vector<WorkerSummary> Workers();

  // Takes the workers whose stream has brought nothing for longer than liveness_timeout for lost:
  // their streams are cancelled, and they take no requests until a new stream's snapshot. Returns
  // how many. A thread calls it every liveness_timeout / 4 (real time); a test with a FakeClock
  // may call it after moving the clock.
  int CheckLiveness();
  Clock* clock() const { return options_.clock; }

 private:
  std::optional<ModelInfo> ModelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Worker;
  void Watch(Worker* worker);
  // The worker's health gauge and transition counter (docs/metrics.md).
  void SetHealthy(Worker* w, bool healthy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's draining gauge, and the flag Watch keeps past the stream's end.
  void SetDraining(Worker* w, bool draining) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the worker's per-address series (healthy, draining, KV event id) from /metrics.
  void ForgetSeries(Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddWorker(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Discovery dropped `address`: its stream ends and it is not followed again.
  void RemoveWorker(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Worker* FindLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const RegistryOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  placement::TransferModel transfers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<PeriodicThread> liveness_thread_;
  std::unique_ptr<WorkerDiscovery> discovery_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_REGISTRY_H_
