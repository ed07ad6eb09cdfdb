#include "router/server/registry.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "grpcpp/grpcpp.h"
#include "router/registry/load_ledger.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct Registry::Worker {
  Worker(std::string address, placement::StepCostModel cost,
         placement::ClassedLatencyCorrection ttft, placement::LatencyCorrection tpot,
         absl::Duration report_lag)
      : address(std::move(address)),
        cost(std::move(cost)),
        ledger(report_lag),
        ttft(std::move(ttft)),
        tpot(tpot) {}

  std::string address;
  WorkerView view;           // guarded by Registry::mu_
  // Fitted from the worker's step timings; kept across reconnects (the same machine). Guarded by
  // Registry::mu_.
  placement::StepCostModel cost;
  bool connected = false;    // guarded by Registry::mu_: the stream is up and gave a snapshot
  bool removed = false;      // guarded by Registry::mu_: discovery dropped it
  grpc::ClientContext* context = nullptr;  // guarded by Registry::mu_: the open stream
  // When the open stream started or last brought a message (the router's clock); whether the
  // liveness check cancelled it. Guarded by Registry::mu_.
  absl::Time heard_at = absl::InfinitePast();
  bool silenced = false;
  bool healthy = false;  // guarded by Registry::mu_: as last exported
  // Guarded by Registry::mu_: the worker said it drains (LoadSample.draining), as last exported;
  // kept after its stream ends (it left after draining) until a new stream's snapshot says
  // otherwise.
  bool draining = false;
  // Guarded by Registry::mu_: `thread` runs Watch (false once Watch returned: removed, or the
  // registry stops).
  bool watching = false;
  std::thread thread;

  // What the router placed here and the worker's samples may not show yet, what decodes here,
  // and the streams that ended that its last sample may still count; by DecodeKey or PrefillKey
  // of the route's serial (a worker of both roles may hold both). Guarded by Registry::mu_.
  LoadLedger ledger;
  // When the router received the worker's last load sample (its clock, not the worker's).
  absl::Time load_received_at = absl::InfinitePast();
  // Corrections of the slo policy's predictions for this worker, learned from what requests then
  // observed: the TTFT of prompts it prefilled (by priority class), the TPOT of streams it
  // decoded. Kept across reconnects, like `cost`. Guarded by Registry::mu_.
  placement::ClassedLatencyCorrection ttft;
  placement::LatencyCorrection tpot;
};

namespace {

placement::TransferModel MakeTransferModel(const placement::TransferModelOptions& options) {
  absl::StatusOr<placement::TransferModel> model = placement::TransferModel::Create(options);
  CHECK_OK(model.status());
  return *std::move(model);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(ProcessMetrics());
}

// The learned correction factors, by worker and kind (ttft, tpot).
prometheus::Family<prometheus::Gauge>& CorrectionGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_latency_correction",
      "Factor the slo policy multiplies a worker's predictions by, learned from observed "
      "latencies (kind: ttft of the prompts it prefills, tpot of the streams it decodes); 1 is "
      "none");
  return family;
}

// The TTFT factors of each priority class, by worker and priority.
prometheus::Family<prometheus::Gauge>& ClassCorrectionGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_ttft_correction_by_priority",
      "Factor the slo policy multiplies its TTFT predictions for the prompts a worker prefills "
      "by, for requests of one priority class, learned from their observed TTFTs; 1 is none");
  return family;
}

// Whether each worker takes requests, and how often that changed.
prometheus::Family<prometheus::Gauge>& HealthGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_worker_healthy",
      "1 while the worker takes requests (its WatchState stream is up, gave a snapshot and "
      "brought something within the liveness timeout), else 0; by worker address");
  return family;
}

// Which workers are draining.
prometheus::Family<prometheus::Gauge>& DrainingGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_worker_draining",
      "1 from when the worker said it drains (it got SIGTERM: no new requests are placed on it, "
      "its streams finish or are handed off) until a new stream says otherwise, also after it "
      "left; else 0; by worker address");
  return family;
}

// The last KV event of each worker that the router's view holds.
prometheus::Family<prometheus::Gauge>& KvEventGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_worker_kv_event_id",
      "Id of the worker's last KV event (WatchState) that the router's view of its prefix cache "
      "holds; the worker's own last_event_id shows how far behind it is; by worker address");
  return family;
}

prometheus::Family<prometheus::Counter>& CounterFamily(const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(ProcessMetrics());
}

prometheus::Family<prometheus::Counter>& HealthTransitions() {
  static auto& family = CounterFamily(
      "tandem_router_worker_health_transitions_total",
      "Times a worker became healthy (to=healthy: joined, or re-admitted after a fresh "
      "snapshot) or unhealthy (to=unhealthy: lost), by worker address");
  return family;
}

// Why WatchState streams of healthy workers ended.
prometheus::Family<prometheus::Counter>& ConnectionLosses() {
  static auto& family = CounterFamily(
      "tandem_router_worker_connection_lost_total",
      "WatchState streams of healthy workers that ended, by worker address and cause: "
      "keepalive (a ping went unanswered), liveness (nothing came for the liveness timeout), "
      "closed (the worker ended the stream or its connection), resync (missed KV events)");
  return family;
}

// How much slower or faster than its step model each worker's latest steps ran.
prometheus::Family<prometheus::Gauge>& StepSpeedGauges() {
  static auto& family = GaugeFamily(
      "tandem_router_step_speed_ratio",
      "Observed over predicted duration of a worker's latest engine steps (a moving average over "
      "about ten steps): how well its step model fits now; 1 is as fitted");
  return family;
}

uint64_t DecodeKey(uint64_t serial) { return serial * 2; }
uint64_t PrefillKey(uint64_t serial) { return serial * 2 + 1; }

// Fewer steps than this in a first snapshot are no calibration (an older worker, or one started
// with --nocalibrate): the model keeps its configured prior.
constexpr int kMinCalibrationSteps = 8;

// Feeds the steps a load sample reports (each only once: a stream sends the steps after the
// previous sample's) into the worker's model.
void ObserveSteps(const v1::LoadSample& sample, placement::StepCostModel& model) {
  for (const v1::StepTiming& t : sample.recent_steps()) {
    // A step that computed nothing (an older worker reported those while it waited for remote
    // KV) says nothing about step costs and would pull the fit's base towards 0.
    if (t.batch_size() == 0) continue;
    const absl::Status s = model.Observe(StepObservationOf(t));
    if (!s.ok()) LOG(WARNING) << "a step timing was refused: " << s;
  }
}

}  // namespace

Registry::Registry(RegistryOptions options)
    : options_(std::move(options)), transfers_(MakeTransferModel(options_.transfer_model)) {
  CHECK_OK(placement::StepCostModel::Create(options_.cost_model).status());
  CHECK_OK(placement::LatencyCorrection::Create(options_.latency_correction).status());
  if (options_.liveness_timeout != absl::InfiniteDuration()) {
    liveness_thread_ = std::make_unique<PeriodicThread>(
        PeriodicThread::Options{
            .period = std::max(options_.liveness_timeout / 4, absl::Milliseconds(10))},
        [this] { CheckLiveness(); });
  }
  discovery_ = std::make_unique<WorkerDiscovery>(
      WorkerDiscovery::Options{.addresses = options_.addresses,
                               .dns_names = options_.dns_names,
                               .interval = options_.dns_interval,
                               .resolve = options_.resolve},
      WorkerDiscovery::Listener{.joined =
                                    [this](const std::string& address) {
                                      absl::MutexLock lock(&mu_);
                                      AddWorker(address);
                                    },
                                .left =
                                    [this](const std::string& address) {
                                      absl::MutexLock lock(&mu_);
                                      RemoveWorker(address);
                                    }});
  discovery_->Start();
}

Registry::~Registry() {
  discovery_.reset();  // first: it adds and removes workers
  liveness_thread_.reset();
  std::vector<Worker*> all;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [address, w] : workers_) {
      if (w->context != nullptr) w->context->TryCancel();
      all.push_back(w.get());
    }
  }
  for (Worker* w : all) w->thread.join();
}

int Registry::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  int lost = 0;
  for (auto& [address, w] : workers_) {
    if (w->context == nullptr || w->silenced || now - w->heard_at <= options_.liveness_timeout) {
      continue;
    }
    LOG(WARNING) << "worker " << address << " sent nothing for "
                 << absl::FormatDuration(now - w->heard_at) << "; taking it for lost";
    w->silenced = true;
    w->context->TryCancel();
    ++lost;
  }
  return lost;
}

void Registry::SetHealthy(Worker* w, bool healthy) {
  if (w->healthy == healthy) return;
  w->healthy = healthy;
  HealthGauges().Add({{"worker", w->address}}).Set(healthy ? 1 : 0);
  HealthTransitions().Add({{"worker", w->address}, {"to", healthy ? "healthy" : "unhealthy"}})
      .Increment();
}

void Registry::SetDraining(Worker* w, bool draining) {
  if (w->draining == draining) return;
  w->draining = draining;
  DrainingGauges().Add({{"worker", w->address}}).Set(draining ? 1 : 0);
  if (draining) {
    LOG(INFO) << "worker " << w->view.worker_id() << " at " << w->address
              << " is draining: no new requests go to it";
  }
}

void Registry::ForgetSeries(Worker* w) {
  HealthGauges().Remove(&HealthGauges().Add({{"worker", w->address}}));
  DrainingGauges().Remove(&DrainingGauges().Add({{"worker", w->address}}));
  KvEventGauges().Remove(&KvEventGauges().Add({{"worker", w->address}}));
  w->healthy = false;
  w->draining = false;
}

void Registry::AddWorker(const std::string& address) {
  // Followed from now on: unhealthy until its first snapshot, and exported so (a worker that
  // never answers is an unhealthy one, not an absent series).
  auto export_health = [](Worker* w) {
    HealthGauges().Add({{"worker", w->address}}).Set(w->healthy ? 1 : 0);
  };
  auto& slot = workers_[address];
  if (slot != nullptr) {
    export_health(slot.get());
    slot->removed = false;
    // Back after it left: its watch may have ended (it ends once it sees `removed`; one that has
    // not yet goes on). Watch does nothing once it has set `watching` false: the join is short.
    if (!slot->watching && !stopping_) {
      Worker* w = slot.get();
      w->thread.join();
      w->watching = true;
      w->thread = std::thread([this, w] { Watch(w); });
    }
    return;
  }
  slot = std::make_unique<Worker>(
      address, *placement::StepCostModel::Create(options_.cost_model),
      *placement::ClassedLatencyCorrection::Create(options_.latency_correction),
      *placement::LatencyCorrection::Create(options_.latency_correction), options_.report_lag);
  Worker* w = slot.get();
  export_health(w);
  w->watching = true;
  w->thread = std::thread([this, w] { Watch(w); });
}

void Registry::RemoveWorker(const std::string& address) {
  Worker* w = FindLocked(address);
  if (w == nullptr || w->removed) return;
  w->removed = true;
  if (w->context != nullptr) w->context->TryCancel();
}

void Registry::Watch(Worker* w) {
  absl::Duration backoff = options_.min_backoff;
  auto channel = CreateKeepaliveChannel(w->address, options_.keepalive, options_.security);
  auto stub = v1::WorkerState::NewStub(channel);
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        w->watching = false;
        return;
      }
      w->context = &context;
      // A stream that brings no snapshot in time is cancelled too.
      w->heard_at = options_.clock->Now();
      w->silenced = false;
    }
    v1::WatchStateRequest request;
    request.set_subscriber("router");
    request.set_load_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.load_interval)));
    std::unique_ptr<grpc::ClientReader<v1::WorkerStateUpdate>> stream =
        stub->WatchState(&context, request);
    v1::WorkerStateUpdate update;
    bool resync = false;
    while (stream->Read(&update)) {
      absl::MutexLock lock(&mu_);
      const absl::Time received = options_.clock->Now();
      w->heard_at = received;
      if (absl::Status s = w->view.Apply(update); !s.ok()) {
        LOG(WARNING) << "worker " << w->address << ": " << s << "; re-subscribing";
        resync = true;
        context.TryCancel();
        break;
      }
      if (update.has_load() || update.has_snapshot()) {
        w->load_received_at = received;
        SetDraining(w, w->view.draining());
      }
      if (update.has_kv_events() || update.has_snapshot()) {
        KvEventGauges().Add({{"worker", w->address}}).Set(static_cast<double>(w->view.last_event_id()));
      }
      if (update.has_load()) {
        ObserveSteps(update.load(), w->cost);
        if (update.load().recent_steps_size() > 0 && w->view.ready()) {
          StepSpeedGauges().Add({{"worker", w->view.worker_id()}}).Set(w->cost.recent_ratio());
        }
        w->ledger.OnLoadSample(static_cast<int64_t>(update.load().prompt_tokens()),
                               static_cast<int64_t>(update.load().finished_seqs()), received);
      }
      if (update.has_snapshot()) {
        w->ledger.OnSnapshot(static_cast<int64_t>(update.snapshot().load().finished_seqs()));
        // A worker seen for the first time: its snapshot carries the steps of its start-up
        // calibration; their own fit is where its model starts.
        const v1::LoadSample& load = update.snapshot().load();
        if (w->cost.observations() == 0 && load.recent_steps_size() >= kMinCalibrationSteps) {
          placement::StepCostModel calibration =
              *placement::StepCostModel::Create(placement::CalibrationOptions());
          ObserveSteps(load, calibration);
          CHECK_OK(w->cost.Reset(calibration.profile()));
        }
        ObserveSteps(load, w->cost);
      }
      if (!w->connected && w->view.ready() && !w->silenced) {
        w->connected = true;
        SetHealthy(w, true);
        DrainingGauges().Add({{"worker", w->address}}).Set(w->draining ? 1 : 0);
        backoff = options_.min_backoff;
        const placement::StepProfile& p = w->cost.profile();
        LOG(INFO) << "worker " << w->view.worker_id() << " at " << w->address << " joined ("
                  << v1::WorkerRole_Name(w->view.role()) << ", " << w->view.total_blocks()
                  << " blocks; step model from " << w->cost.observations() << " steps: "
                  << p.base_seconds * 1e3 << " ms + " << p.prefill_token_seconds * 1e3
                  << " ms/prompt token + " << p.decode_token_seconds * 1e3
                  << " ms/decoding sequence + " << p.context_token_seconds * 1e6
                  << " us/decode context token + " << p.prompt_context_token_seconds * 1e6
                  << " us/prompt context token)";
      }
    }
    const grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      w->context = nullptr;
      if (w->connected && (w->draining || w->removed) && !w->silenced && !resync) {
        // Planned: the worker drained and ended the stream (or its process is gone), or
        // discovery dropped it (the router ended the stream). Its streams in progress go on.
        LOG(INFO) << "worker " << w->address << " left ("
                  << (w->draining ? "drained" : "no longer discovered") << ")";
      } else if (w->connected) {
        const char* cause = w->silenced                              ? "liveness"
                            : resync                                 ? "resync"
                            : IsKeepaliveFailure(status.error_message()) ? "keepalive"
                                                                     : "closed";
        LOG(WARNING) << "worker " << w->address << " lost (" << cause
                     << "): " << status.error_message();
        if (!stopping_) ConnectionLosses().Add({{"worker", w->address}, {"cause", cause}}).Increment();
      }
      SetHealthy(w, false);
      // A lost worker takes no requests until it answers again with a fresh snapshot.
      if (w->connected) transfers_.ForgetWorker(w->view.worker_id());
      w->connected = false;
      w->view = WorkerView();
      w->ledger.ForgetPlaced();  // the fresh view counts nothing placed
      if (stopping_ || w->removed) {
        // A worker discovery dropped (scaled down, replaced) leaves no series behind: a gauge
        // stuck at healthy 0 would keep an alert firing for a worker that no longer exists.
        if (w->removed && !stopping_) ForgetSeries(w);
        w->watching = false;
        return;
      }
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
      if (stopping_) {
        w->watching = false;
        return;
      }
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::StatusOr<Route> Registry::Place(placement::PlacementPolicy& policy,
                                      const placement::Request& request,
                                      const absl::flat_hash_set<std::string>& avoid) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  placement::ClusterView view;
  absl::flat_hash_map<std::string, Worker*> by_id;
  for (auto& [address, w] : workers_) {
    if (!w->connected || w->removed || w->silenced || !w->view.ready()) continue;
    std::optional<placement::WorkerCandidate> candidate = ToCandidate(w->view);
    if (!candidate.has_value()) continue;
    placement::WorkerCandidate& c = *candidate;
    if (avoid.contains(c.id)) c.healthy = false;
    c.slo.cost_model = &w->cost;
    c.slo.ttft_correction = w->ttft.factor(request.priority);
    c.slo.tpot_correction = w->tpot.factor();
    // The step the worker was in at its last sample has gone on since (if it has ended, the next
    // sample says so within load_interval).
    if (const int64_t elapsed_us = w->view.load().step_elapsed_us; elapsed_us > 0) {
      c.slo.step_elapsed_seconds = static_cast<double>(elapsed_us) * 1e-6 +
                                   std::max(absl::ToDoubleSeconds(now - w->load_received_at), 0.0);
    }
    w->ledger.Apply(now, &c);
    by_id[c.id] = w.get();
    view.workers.push_back(std::move(*candidate));
  }
  view.transfers = &transfers_;
  absl::StatusOr<placement::Decision> decision = policy.Place(request, view);
  if (!decision.ok()) return decision.status();
  Route route;
  route.decision = *decision;
  route.serial = ++next_serial_;
  Worker* decode = by_id.at(decision->decode_worker);
  route.decode_address = decode->address;
  route.placed_prefill_tokens = decision->local_prefill ? decision->uncached_tokens : 0;
  route.placed_decode_tokens = request.prompt_tokens;
  auto count = [&](Worker* w, uint64_t key, const PlacedLoad& load, int64_t receipt_tokens = 0) {
    w->ledger.Place(key, load, {.receipt_tokens = receipt_tokens, .priority = request.priority},
                    now);
  };
  count(decode, DecodeKey(route.serial), {.prefill_tokens = route.placed_prefill_tokens,
                 .sequences = 1,
                 .decode_tokens = route.placed_decode_tokens,
                 .prompts = decision->local_prefill ? 1 : 0});
  for (const placement::PrefillChoice& p : decision->prefill) {
    Worker* w = by_id.at(p.worker_id);
    route.prefill.emplace_back(p.worker_id, w->address);
  }
  if (!route.prefill.empty()) {
    count(by_id.at(route.prefill[0].first), PrefillKey(route.serial),
          {.prefill_tokens = decision->uncached_tokens, .prompts = 1},
          std::max<int64_t>(request.prompt_tokens, 1));
  }
  route.priority = request.priority;
  route.tpot_ms = decision->predicted ? static_cast<int64_t>(decision->tpot_slo_seconds * 1e3)
                                      : request.slo.tpot_ms;
  route.max_tokens = request.max_tokens;
  decode->ledger.StartRunning(route.serial, {.tpot_ms = route.tpot_ms, .max_tokens = route.max_tokens});
  return route;
}

Registry::Worker* Registry::FindLocked(const std::string& address) {
  auto it = workers_.find(address);
  return it == workers_.end() ? nullptr : it->second.get();
}

void Registry::PromptDone(Route& route) {
  if (route.prompt_done || route.released) return;
  route.prompt_done = true;
  absl::MutexLock lock(&mu_);
  if (Worker* decode = FindLocked(route.decode_address); decode != nullptr) {
    decode->ledger.Uncount(DecodeKey(route.serial), /*prompt_only=*/true);
  }
  if (!route.prefill.empty()) {
    if (Worker* p = FindLocked(route.prefill[0].second); p != nullptr) {
      p->ledger.Uncount(PrefillKey(route.serial), /*prompt_only=*/false);
    }
  }
}

void Registry::Progress(const Route& route, int64_t tokens, absl::Time now) {
  if (route.released || tokens <= 0) return;
  absl::MutexLock lock(&mu_);
  if (Worker* decode = FindLocked(route.decode_address); decode != nullptr) {
    decode->ledger.Progress(route.serial, tokens, now);
  }
}

void Registry::Release(Route& route) {
  if (route.released) return;
  route.released = true;
  absl::MutexLock lock(&mu_);
  if (Worker* decode = FindLocked(route.decode_address); decode != nullptr) {
    decode->ledger.Uncount(DecodeKey(route.serial), /*prompt_only=*/false);
    decode->ledger.EndStream(route.serial, route.placed_decode_tokens, options_.clock->Now());
  }
  if (!route.prefill.empty()) {
    if (Worker* p = FindLocked(route.prefill[0].second); p != nullptr) {
      p->ledger.Uncount(PrefillKey(route.serial), /*prompt_only=*/false);
    }
  }
}

void Registry::ObserveTtft(const Route& route, double seconds) {
  const placement::Decision& d = route.decision;
  if (!d.predicted || d.predicted_ttft_seconds <= 0 || !(seconds > 0)) return;
  absl::MutexLock lock(&mu_);
  Worker* w = FindLocked(d.local_prefill || route.prefill.empty() ? route.decode_address
                                                                  : route.prefill[0].second);
  if (w == nullptr) return;
  if (absl::Status s =
          w->ttft.Observe(route.priority, seconds, d.predicted_ttft_seconds / d.ttft_correction);
      !s.ok()) {
    LOG(WARNING) << "a ttft observation was refused: " << s;
  }
  if (w->view.worker_id().empty()) return;
  CorrectionGauges()
      .Add({{"worker", w->view.worker_id()}, {"kind", "ttft"}})
      .Set(w->ttft.overall().factor());
  ClassCorrectionGauges()
      .Add({{"worker", w->view.worker_id()}, {"priority", absl::StrCat(route.priority)}})
      .Set(w->ttft.factor(route.priority));
}

void Registry::ObserveTpot(const Route& route, double seconds) {
  const placement::Decision& d = route.decision;
  if (!d.predicted || d.predicted_tpot_seconds <= 0 || !(seconds > 0)) return;
  absl::MutexLock lock(&mu_);
  Worker* w = FindLocked(route.decode_address);
  if (w == nullptr) return;
  if (absl::Status s = w->tpot.Observe(seconds, d.predicted_tpot_seconds / d.tpot_correction);
      !s.ok()) {
    LOG(WARNING) << "a tpot observation was refused: " << s;
  }
  if (w->view.worker_id().empty()) return;
  CorrectionGauges()
      .Add({{"worker", w->view.worker_id()}, {"kind", "tpot"}})
      .Set(w->tpot.factor());
}

void Registry::ObserveTransfer(const std::string& prefill_worker, const std::string& decode_worker,
                               int64_t tokens, double seconds) {
  absl::MutexLock lock(&mu_);
  int64_t bytes_per_token = 0;
  for (auto& [address, w] : workers_) {
    if (w->view.worker_id() == decode_worker) {
      bytes_per_token = KvBytesPerToken(w->view.kv_pool().layout());
    }
  }
  if (bytes_per_token <= 0 || tokens <= 0) return;
  if (absl::Status s = transfers_.Observe(prefill_worker, decode_worker, tokens * bytes_per_token,
                                          seconds);
      !s.ok()) {
    LOG(WARNING) << "a KV transfer timing was refused: " << s;
  }
}

std::optional<placement::StepProfile> Registry::CostProfile(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [address, w] : workers_) {
    if (w->view.worker_id() == worker_id) return w->cost.profile();
  }
  return std::nullopt;
}

bool Registry::Ready() { return Model().has_value(); }

bool Registry::AwaitFollowing(const std::string& address, bool following,
                              absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Worker* w = FindLocked(address);
    return (w != nullptr && w->watching && !w->removed) == following;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool Registry::AwaitReady(bool ready, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ModelLocked().has_value() == ready;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

std::optional<Registry::ModelInfo> Registry::Model() {
  absl::MutexLock lock(&mu_);
  return ModelLocked();
}

std::optional<Registry::ModelInfo> Registry::ModelLocked() {
  for (auto& [address, w] : workers_) {
    if (w->connected && !w->silenced && w->view.ready() && !w->view.draining() &&
        w->view.role() != v1::ROLE_PREFILL) {
      return ModelInfo{.model_id = w->view.model_id(), .block_size = w->view.block_size(),
                       .max_context = w->view.max_context()};
    }
  }
  return std::nullopt;
}

std::vector<WorkerSummary> Registry::Workers() {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerSummary> out;
  for (auto& [address, w] : workers_) {
    out.push_back({.address = address, .worker_id = w->view.worker_id(), .role = w->view.role(),
                   .ready = w->connected && !w->silenced && w->view.ready(),
                   .draining = w->draining,
                   .load = w->view.load()});
  }
  return out;
}

}  // namespace tandem::router
