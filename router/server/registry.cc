#include "router/server/registry.h"

#include <netdb.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct Registry::Worker {
  Worker(std::string address, placement::StepCostModel cost)
      : address(std::move(address)), cost(std::move(cost)) {}

  std::string address;
  WorkerView view;           // guarded by Registry::mu_
  // Fitted from the worker's step timings; kept across reconnects (the same machine). Guarded by
  // Registry::mu_.
  placement::StepCostModel cost;
  bool connected = false;    // guarded by Registry::mu_: the stream is up and gave a snapshot
  bool removed = false;      // guarded by Registry::mu_: discovery dropped it
  grpc::ClientContext* context = nullptr;  // guarded by Registry::mu_: the open stream
  std::thread thread;
};

namespace {

placement::TransferModel MakeTransferModel(const placement::TransferModelOptions& options) {
  absl::StatusOr<placement::TransferModel> model = placement::TransferModel::Create(options);
  CHECK_OK(model.status());
  return *std::move(model);
}

// Fewer steps than this in a first snapshot are no calibration (an older worker, or one started
// with --nocalibrate): the model keeps its configured prior.
constexpr int kMinCalibrationSteps = 8;

// Feeds the steps a load sample reports (each only once: a stream sends the steps after the
// previous sample's) into the worker's model.
void ObserveSteps(const v1::LoadSample& sample, placement::StepCostModel& model) {
  for (const v1::StepTiming& t : sample.recent_steps()) {
    const absl::Status s = model.Observe({.batch_size = t.batch_size(),
                                          .prefill_tokens = t.prefill_tokens(),
                                          .decode_tokens = t.decode_tokens(),
                                          .context_tokens = static_cast<int64_t>(t.context_tokens()),
                                          .duration_us = static_cast<int64_t>(t.duration_us())});
    if (!s.ok()) LOG(WARNING) << "a step timing was refused: " << s;
  }
}

}  // namespace

Registry::Registry(RegistryOptions options)
    : options_(std::move(options)), transfers_(MakeTransferModel(options_.transfer_model)) {
  CHECK_OK(placement::StepCostModel::Create(options_.cost_model).status());
  absl::MutexLock lock(&mu_);
  for (const std::string& a : options_.addresses) AddWorker(a);
  if (!options_.dns_name.empty()) dns_thread_ = std::thread([this] { Discover(); });
}

Registry::~Registry() {
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
  if (dns_thread_.joinable()) dns_thread_.join();
}

void Registry::AddWorker(const std::string& address) {
  auto& slot = workers_[address];
  if (slot != nullptr) {
    slot->removed = false;
    return;
  }
  slot = std::make_unique<Worker>(address, *placement::StepCostModel::Create(options_.cost_model));
  Worker* w = slot.get();
  w->thread = std::thread([this, w] { Watch(w); });
}

void Registry::Watch(Worker* w) {
  absl::Duration backoff = options_.min_backoff;
  auto channel = grpc::CreateChannel(w->address, grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerState::NewStub(channel);
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      w->context = &context;
    }
    v1::WatchStateRequest request;
    request.set_subscriber("router");
    request.set_load_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.load_interval)));
    std::unique_ptr<grpc::ClientReader<v1::WorkerStateUpdate>> stream =
        stub->WatchState(&context, request);
    v1::WorkerStateUpdate update;
    while (stream->Read(&update)) {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = w->view.Apply(update); !s.ok()) {
        LOG(WARNING) << "worker " << w->address << ": " << s << "; re-subscribing";
        context.TryCancel();
        break;
      }
      if (update.has_load()) ObserveSteps(update.load(), w->cost);
      if (update.has_snapshot()) {
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
      if (!w->connected && w->view.ready()) {
        w->connected = true;
        backoff = options_.min_backoff;
        const placement::StepProfile& p = w->cost.profile();
        LOG(INFO) << "worker " << w->view.worker_id() << " at " << w->address << " joined ("
                  << v1::WorkerRole_Name(w->view.role()) << ", " << w->view.total_blocks()
                  << " blocks; step model from " << w->cost.observations() << " steps: "
                  << p.base_seconds * 1e3 << " ms + " << p.prefill_token_seconds * 1e3
                  << " ms/prompt token + " << p.decode_token_seconds * 1e3
                  << " ms/decoding sequence + " << p.context_token_seconds * 1e6
                  << " us/context token)";
      }
    }
    const grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      w->context = nullptr;
      if (w->connected) {
        LOG(WARNING) << "worker " << w->address << " lost: " << status.error_message();
      }
      // A lost worker takes no requests until it answers again with a fresh snapshot.
      if (w->connected) transfers_.ForgetWorker(w->view.worker_id());
      w->connected = false;
      w->view = WorkerView();
      if (stopping_ || w->removed) return;
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
      if (stopping_) return;
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void Registry::Discover() {
  const size_t colon = options_.dns_name.rfind(':');
  const std::string host = options_.dns_name.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : options_.dns_name.substr(colon + 1);
  while (true) {
    std::vector<std::string> found;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &result) == 0) {
      for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
        char ip[INET_ADDRSTRLEN];
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        found.push_back(absl::StrCat(ip, ":", port));
      }
      freeaddrinfo(result);
    } else {
      LOG(WARNING) << "cannot resolve " << options_.dns_name;
    }
    absl::MutexLock lock(&mu_);
    for (const std::string& a : found) AddWorker(a);
    for (auto& [address, w] : workers_) {
      if (std::find(found.begin(), found.end(), address) == found.end() &&
          std::find(options_.addresses.begin(), options_.addresses.end(), address) ==
              options_.addresses.end() &&
          !w->removed) {
        w->removed = true;
        if (w->context != nullptr) w->context->TryCancel();
        LOG(INFO) << "worker " << address << " is no longer in " << options_.dns_name;
      }
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.dns_interval);
    if (stopping_) return;
  }
}

absl::StatusOr<Route> Registry::Place(placement::PlacementPolicy& policy,
                                      const placement::Request& request,
                                      const absl::flat_hash_set<std::string>& avoid) {
  absl::MutexLock lock(&mu_);
  placement::ClusterView view;
  absl::flat_hash_map<std::string, Worker*> by_id;
  for (auto& [address, w] : workers_) {
    if (!w->connected || w->removed || !w->view.ready()) continue;
    std::optional<placement::WorkerCandidate> candidate = ToCandidate(w->view);
    if (!candidate.has_value()) continue;
    placement::WorkerCandidate& c = *candidate;
    if (avoid.contains(c.id)) c.healthy = false;
    c.cost_model = &w->cost;
    by_id[c.id] = w.get();
    view.workers.push_back(std::move(*candidate));
  }
  view.transfers = &transfers_;
  absl::StatusOr<placement::Decision> decision = policy.Place(request, view);
  if (!decision.ok()) return decision.status();
  Route route;
  route.decision = *decision;
  Worker* decode = by_id.at(decision->decode_worker);
  route.decode_address = decode->address;
  route.placed_prefill_tokens = decision->local_prefill ? decision->uncached_tokens : 0;
  route.placed_decode_tokens = request.prompt_tokens;
  decode->view.AddPlaced(route.placed_prefill_tokens, 1, route.placed_decode_tokens);
  for (const placement::PrefillChoice& p : decision->prefill) {
    Worker* w = by_id.at(p.worker_id);
    route.prefill.emplace_back(p.worker_id, w->address);
  }
  if (!route.prefill.empty()) {
    by_id.at(route.prefill[0].first)->view.AddPlaced(decision->uncached_tokens, 0);
  }
  return route;
}

void Registry::PromptDone(Route& route) {
  if (route.prompt_done || route.released) return;
  route.prompt_done = true;
  absl::MutexLock lock(&mu_);
  for (auto& [address, w] : workers_) {
    if (address == route.decode_address) w->view.RemovePlaced(route.placed_prefill_tokens, 0, 0);
    if (!route.prefill.empty() && address == route.prefill[0].second) {
      w->view.RemovePlaced(route.decision.uncached_tokens, 0);
    }
  }
}

void Registry::Release(Route& route) {
  if (route.released) return;
  route.released = true;
  absl::MutexLock lock(&mu_);
  for (auto& [address, w] : workers_) {
    if (address == route.decode_address) {
      w->view.RemovePlaced(route.prompt_done ? 0 : route.placed_prefill_tokens, 1,
                           route.placed_decode_tokens);
    }
    if (!route.prompt_done && !route.prefill.empty() && address == route.prefill[0].second) {
      w->view.RemovePlaced(route.decision.uncached_tokens, 0);
    }
  }
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

std::optional<Registry::ModelInfo> Registry::Model() {
  absl::MutexLock lock(&mu_);
  for (auto& [address, w] : workers_) {
    if (w->connected && w->view.ready() && w->view.role() != v1::ROLE_PREFILL) {
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
                   .ready = w->connected && w->view.ready(), .load = w->view.load()});
  }
  return out;
}

}  // namespace tandem::router
