#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "common/trace_context.h"
#include "kvtransfer/kv_grant.h"
#include "kvtransfer/prompt_write_plan.h"
#include "proto/conversion.h"

namespace tandem {
namespace {

// The prefill worker's transfer metrics (docs/metrics.md).
struct PrefillMetrics {
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("tandem_prefill_requests_total")
      .Help("Prefill requests by outcome: ok, error")
      .Register(ProcessMetrics());
  prometheus::Counter& bytes = prometheus::BuildCounter()
      .Name("tandem_prefill_transfer_bytes_total")
      .Help("KV bytes written into decode workers' pools")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Histogram& seconds = prometheus::BuildHistogram()
      .Name("tandem_prefill_transfer_seconds")
      .Help("From a request's arrival to its last KV write in place (compute and transfer overlap)")
      .Register(ProcessMetrics())
      .Add({}, RequestLatencyBuckets());
};

PrefillMetrics& Metrics() {
  static PrefillMetrics* metrics = new PrefillMetrics();
  return *metrics;
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

}  // namespace

// One Prefill call. Owned by itself from Begin until gRPC's OnDone, and by every callback it
// handed out (the engine's, the transport's, the timers'), so a late callback finds it alive;
// once Finish was called the reactor is never touched again.
//
// It ends when the first token is known and every KV write it started has ended, or, given up
// (the caller cancelled, the deadline passed), when the engine let go of the request and its
// writes ended (or 10 x abandon_grace later). The engine holds the request's blocks
// (GenerationRequest::hold_kv) until the engine let go and no write reads them; then the call
// releases them.
//
// Threads: Begin on gRPC's (inside Prefill); the deltas, the KV layers and the engine's results
// on the engine thread; write completions on the transport's; OnCancel on gRPC's; the timers on
// the timer queue's. Everything shared is under mu_.
class PrefillService::PrefillCall final : public grpc::ServerUnaryReactor,
                                         public std::enable_shared_from_this<PrefillCall> {
 public:
  PrefillCall(PrefillService* service, grpc::CallbackServerContext* context,
              const v1::PrefillRequest* request, v1::PrefillResponse* response)
      : service_(service),
        context_(context),
        request_(*request),
        trace_(SpanForCall(*context, &trace_rejected_)),
        response_(response),
        clock_(service->timers_->clock()),
        start_(clock_->Now()) {}

  void Begin(std::shared_ptr<PrefillCall> self) {
    self_ = self;
    if (!trace_rejected_.ok()) {
      LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id()
                << ": the traceparent sent was not used (" << trace_rejected_.message()
                << "); a new trace starts";
    }
    const uint64_t id = Prepare(self);
    if (id == 0) return;
    service_->loop_->SubmitAsync(
        id, MakeRequest(self), [self](const GenerationDelta& d) { self->OnDelta(d); },
        [self](absl::Status s) {
          if (s.ok()) return;
          absl::MutexLock lock(&self->mu_);
          self->refused_ = true;  // the engine never had it: nothing is held
          self->engine_done_ = true;
          self->FinishLocked(ToGrpcStatus(s));
        });
    // From here a CancelAsync reaches the engine after the submission. The call may have been
    // given up, or even answered, meanwhile.
    absl::MutexLock lock(&mu_);
    submitted_ = true;
    if (give_up_.has_value() && !engine_done_) CancelEngine();
    if (!finished_) {
      deadline_timer_ = service_->timers_->At(deadline_, [self] {
        self->GiveUp(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                  "the prefill's deadline passed"));
      });
    }
    Progress();
  }

  // Checks the request, connects to the destination and registers the call; returns its engine
  // id, or 0 when the call has finished with an error instead.
  uint64_t Prepare(const std::shared_ptr<PrefillCall>& self) {
    absl::MutexLock lock(&mu_);
    if (grpc::Status invalid = Validate(); !invalid.ok()) {
      FinishLocked(invalid);
      return 0;
    }
    const absl::Duration timeout = request_.timeout_ms() > 0
                                       ? absl::Milliseconds(request_.timeout_ms())
                                       : service_->options_.default_timeout;
    deadline_ = start_ + timeout;
    const auto client = context_->deadline();
    if (client != std::chrono::system_clock::time_point::max()) {
      deadline_ = std::min(deadline_, absl::FromChrono(client));
    }
    absl::StatusOr<kvtransfer::PromptWritePlan> plan = kvtransfer::PromptWritePlan::Create(
        {.block_size = service_->loop_->kv_layout().block_size,
         .num_layers = service_->loop_->kv_layout().num_layers,
         .destination_cached_tokens = request_.num_destination_cached_tokens(),
         .destination_blocks = grant_->blocks});
    if (!plan.ok()) {
      FinishLocked(ToGrpcStatus(plan.status()));
      return 0;
    }
    plan_.emplace(*std::move(plan));
    absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> conn =
        service_->ConnectionTo(request_.destination(), grant_->pool, deadline_);
    if (!conn.ok()) {
      FinishLocked(ToGrpcStatus(conn.status()));
      return 0;
    }
    connection_ = *std::move(conn);
    // Every write of this call goes through its grant, which FinishLocked and GiveUp revoke.
    granted_ = std::make_shared<kvtransfer::GrantedConnection>(
        connection_, *std::move(grant_), absl::StrCat("request ", request_.request_id()));
    grant_.reset();
    {
      absl::MutexLock service_lock(&service_->mu_);
      id_ = service_->next_id_++;
      service_->calls_[request_.request_id()] = self;
    }
    return id_;
  }

  // Runs `then` once the call has answered (at once if it has): its writes have ended by then,
  // but for a transport that does not end them when cancelled (StopWaiting).
  void WhenFinished(absl::AnyInvocable<void() &&> then) {
    {
      absl::MutexLock lock(&mu_);
      if (!finished_) {
        when_finished_.push_back(std::move(then));
        return;
      }
    }
    std::move(then)();
  }

  void OnCancel() override {
    GiveUp(grpc::Status(grpc::StatusCode::CANCELLED, "the caller cancelled the prefill"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&service_->mu_);
      --service_->active_;
      auto it = service_->calls_.find(request_.request_id());
      if (it != service_->calls_.end() && it->second.lock().get() == this) {
        service_->calls_.erase(it);
      }
    }
    self_.reset();  // the last callback still holding the call frees it
  }

  // The caller went away, the deadline passed, or the Cancel RPC: the engine drops the request
  // (if it still has it), writes still running abandon_grace later are ended by cancelling the
  // connection. False when the call had already ended or was given up.
  bool GiveUp(grpc::Status why) {
    absl::MutexLock lock(&mu_);
    if (finished_ || give_up_.has_value()) return false;
    // The token came but the writes did not end in time.
    if (have_token_ && why.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      why = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                         "the KV writes did not finish before the deadline");
    }
    give_up_ = why;
    given_up_at_ = clock_->Now();
    if (granted_ != nullptr) granted_->Revoke();  // no write starts after this
    std::shared_ptr<PrefillCall> self = shared_from_this();
    if (submitted_ && !engine_done_) CancelEngine();
    grace_timer_ = service_->timers_->At(given_up_at_ + service_->options_.abandon_grace,
                                         [self] { self->AbandonWrites(); });
    last_timer_ = service_->timers_->At(given_up_at_ + 10 * service_->options_.abandon_grace,
                                        [self] { self->StopWaiting(); });
    Progress();
    return true;
  }

 private:
  // Drops the request in the engine; the engine has let go of it once this is done.
  void CancelEngine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    service_->loop_->CancelAsync(id_, [self = shared_from_this()](bool) {
      absl::MutexLock lock(&self->mu_);
      self->engine_done_ = true;
      self->Progress();
    });
  }

  grpc::Status Validate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EngineLoop* loop = service_->loop_;
    if (!request_.model().empty() && request_.model() != loop->model_id()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("model '", request_.model(), "' is not served here"));
    }
    if (request_.token_ids_size() == 0) return Invalid("the prompt is empty");
    // The destination, checked before anything connects to it or is written into it.
    absl::StatusOr<kvtransfer::KvGrant> grant = kvtransfer::CheckGrant(
        request_.destination(),
        {.num_tokens = request_.token_ids_size(),
         .cached_tokens = request_.num_destination_cached_tokens()},
        loop->kv_layout());
    if (!grant.ok()) return ToGrpcStatus(grant.status());
    grant_.emplace(*std::move(grant));
    return grpc::Status::OK;
  }

  GenerationRequest MakeRequest(const std::shared_ptr<PrefillCall>& self) {
    GenerationRequest r;
    r.prompt.assign(request_.token_ids().begin(), request_.token_ids().end());
    r.sampling = SamplingFromProto(request_.sampling());
    r.priority = request_.priority();
    // Only the next token, sampled after the request's earlier output (a migrated request).
    r.prior_output_tokens = request_.num_prior_output_tokens();
    r.sampling.max_tokens = r.prior_output_tokens + 1;
    r.sampling.min_tokens = std::min<int64_t>(r.sampling.min_tokens, r.prior_output_tokens + 1);
    r.on_kv_layer = [self](const KvLayerDone& d) { self->OnKvLayer(d); };
    r.hold_kv = true;  // released once no write reads the blocks
    return r;
  }

  // On the engine thread: starts the writes of one computed layer; the transport ends them on
  // its own thread.
  void OnKvLayer(const KvLayerDone& d) {
    std::vector<kvtransfer::WriteOp> ops;
    absl::Time deadline;
    std::shared_ptr<kvtransfer::Connection> connection;
    {
      absl::MutexLock lock(&mu_);
      if (reused_tokens_ < 0) reused_tokens_ = d.first_position;
      ops = plan_->OnLayer(d.layer, d.first_position, d.num_tokens, d.block_table);
      if (!error_.ok() || give_up_.has_value()) return;  // nobody will read them
      const uint64_t block_bytes =
          static_cast<uint64_t>(service_->loop_->kv_layout().block_bytes());
      for (const kvtransfer::WriteOp& op : ops) {
        bytes_ += op.blocks.size() * static_cast<uint64_t>(op.num_layers) * block_bytes;
      }
      outstanding_ += static_cast<int64_t>(ops.size());  // counted before any can end
      deadline = deadline_;
      connection = granted_;
    }
    std::shared_ptr<PrefillCall> self = shared_from_this();
    for (const kvtransfer::WriteOp& op : ops) {
      absl::Status started = connection->Write(
          op, deadline, [self](absl::Status s) { self->OnWriteDone(std::move(s)); });
      if (!started.ok()) {
        absl::MutexLock lock(&mu_);
        --outstanding_;
        error_.Update(started);
        Progress();
      }
    }
  }

  void OnWriteDone(absl::Status s) {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (!s.ok()) error_.Update(s);
    writes_done_ = clock_->Now();
    Progress();
  }

  // The request's only delta (max_tokens is one more than its prior output), on the engine
  // thread; the engine has let go of the request.
  void OnDelta(const GenerationDelta& d) {
    absl::MutexLock lock(&mu_);
    engine_done_ = true;
    if (d.finish == sampling::FinishReason::kError || d.token < 0) {
      error_.Update(absl::InternalError("the engine failed computing the prompt"));
    } else {
      have_token_ = true;
      token_ = d.token;
      logprob_ = d.logprob;
      top_logprobs_ = d.top_logprobs;
    }
    compute_done_ = clock_->Now();
    compute_seconds_ = d.prompt_seconds;
    Progress();
  }

  // abandon_grace after giving up: writes still running end by cancelling their connection.
  void AbandonWrites() {
    std::shared_ptr<kvtransfer::Connection> connection;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || outstanding_ == 0) return;
      LOG(WARNING) << TraceTag(trace_) << "request " << request_.request_id() << ": "
                   << outstanding_ << " KV writes to " << request_.destination().worker_id()
                   << " still running after the prefill was given up; closing the connection";
      connection = connection_;
    }
    // Outside mu_: the writes' completions run inside Cancel.
    connection->Cancel();
    service_->ForgetConnection(connection.get());
  }

  // 10 x abandon_grace after giving up: the call answers even though writes did not end; the
  // engine keeps the blocks until they do.
  void StopWaiting() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    LOG(ERROR) << TraceTag(trace_) << "request " << request_.request_id() << ": " << outstanding_
               << " KV writes did not end after their connection was cancelled";
    FinishLocked(*give_up_);
  }

  // Finishes the call when it is complete, and releases the blocks once nothing reads them.
  void Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (submitted_ && !refused_ && engine_done_ && outstanding_ == 0 && !released_) {
      released_ = true;
      service_->loop_->ReleaseKvAsync(id_);
    }
    if (finished_) return;
    if (give_up_.has_value()) {
      if (engine_done_ && outstanding_ == 0) FinishLocked(*give_up_);
      return;
    }
    if (!engine_done_ || outstanding_ > 0) return;
    if (!have_token_ || !error_.ok()) {
      // The connection may be broken for good: the next request connects again.
      if (connection_ != nullptr) service_->ForgetConnection(connection_.get());
      return FinishLocked(
          have_token_ ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     absl::StrCat("writing the KV to ",
                                                  request_.destination().worker_id(),
                                                  " failed: ", error_.message()))
                      : ToGrpcStatus(error_));
    }
    FillResponse();
    FinishLocked(grpc::Status::OK);
  }

  void FillResponse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Metrics().bytes.Increment(static_cast<double>(bytes_));
    const absl::Time in_place = std::max(writes_done_, compute_done_);
    Metrics().seconds.Observe(absl::ToDoubleSeconds(in_place - start_));
    response_->set_first_token_id(token_);
    if (logprob_.has_value()) {
      response_->mutable_first_token_logprobs()->set_token_id(token_);
      response_->mutable_first_token_logprobs()->set_logprob(*logprob_);
      for (const sampling::TokenLogprob& t : top_logprobs_) {
        v1::TopLogprob* top = response_->mutable_first_token_logprobs()->add_top_logprobs();
        top->set_token_id(t.id);
        top->set_logprob(t.logprob);
      }
    }
    const int64_t n = request_.token_ids_size();
    const int64_t reused = std::max<int64_t>(0, reused_tokens_);
    response_->set_num_reused_tokens(static_cast<uint32_t>(reused));
    response_->set_num_computed_tokens(static_cast<uint32_t>(n - reused));
    // The engine timed the prompt's steps; before them it queued.
    const absl::Time compute_start =
        std::max(compute_done_ - absl::Seconds(compute_seconds_), start_);
    v1::PrefillTimings* t = response_->mutable_timings();
    t->set_queue_us(MicrosForProto(compute_start - start_));
    t->set_compute_us(MicrosForProto(compute_done_ - compute_start));
    t->set_transfer_us(MicrosForProto(in_place - compute_start));
    t->set_transfer_bytes(bytes_);
  }

  // The request's one INFO line here, as the call answers `status`.
  void LogEnd(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string& to = request_.destination().worker_id();
    if (status.ok()) {
      const v1::PrefillTimings& t = response_->timings();
      LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": prefilled "
                << response_->num_computed_tokens() << " tokens ("
                << response_->num_reused_tokens() << " cached here); KV writes to " << to
                << " done, " << t.transfer_bytes() << " bytes; queue " << t.queue_us() / 1000
                << " ms, compute " << t.compute_us() / 1000 << " ms, in place after "
                << t.transfer_us() / 1000 << " ms" << ParentOf(trace_);
    } else {
      LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": prefill for "
                << (to.empty() ? std::string("?") : to) << " failed (" << FromGrpcStatus(status)
                << ")" << ParentOf(trace_);
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    if (granted_ != nullptr) granted_->Revoke();  // no write starts after the answer
    for (TimerQueue::Id timer : {deadline_timer_, grace_timer_, last_timer_}) {
      if (timer != 0) service_->timers_->Cancel(timer);
    }
    Metrics().requests.Add({{"outcome", status.ok() ? "ok" : "error"}}).Increment();
    LogEnd(status);
    Finish(status);
    // Cancel RPCs waiting for this answer (they only finish their own reactors).
    for (auto& then : when_finished_) std::move(then)();
    when_finished_.clear();
  }

  PrefillService* const service_;
  grpc::CallbackServerContext* const context_;
  const v1::PrefillRequest request_;  // a copy: the callbacks may outlive gRPC's
  // This worker's span of the request's trace (the decode worker's is its parent), and why a
  // traceparent that came could not be used.
  absl::Status trace_rejected_;
  const TraceContext trace_;
  v1::PrefillResponse* const response_;
  Clock* const clock_;
  const absl::Time start_;
  std::shared_ptr<PrefillCall> self_;  // from Begin until OnDone

  absl::Mutex mu_;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;  // the engine's
  // The checked destination, from Validate until the connection takes it.
  std::optional<kvtransfer::KvGrant> grant_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::shared_ptr<kvtransfer::Connection> connection_ ABSL_GUARDED_BY(mu_);  // shared, cached
  std::shared_ptr<kvtransfer::GrantedConnection> granted_ ABSL_GUARDED_BY(mu_);  // over it
  std::optional<kvtransfer::PromptWritePlan> plan_ ABSL_GUARDED_BY(mu_);
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;    // posted to the engine (it may refuse it)
  bool refused_ ABSL_GUARDED_BY(mu_) = false;      // ... and it did
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;  // ... and has let go of it
  bool released_ ABSL_GUARDED_BY(mu_) = false;     // its held blocks were released
  bool finished_ ABSL_GUARDED_BY(mu_) = false;     // Finish was called
  std::optional<grpc::Status> give_up_ ABSL_GUARDED_BY(mu_);
  absl::Time given_up_at_ ABSL_GUARDED_BY(mu_);
  TimerQueue::Id deadline_timer_ ABSL_GUARDED_BY(mu_) = 0;
  TimerQueue::Id grace_timer_ ABSL_GUARDED_BY(mu_) = 0;
  TimerQueue::Id last_timer_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // writes started and not ended
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool have_token_ ABSL_GUARDED_BY(mu_) = false;
  int32_t token_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<float> logprob_ ABSL_GUARDED_BY(mu_);
  std::vector<sampling::TokenLogprob> top_logprobs_ ABSL_GUARDED_BY(mu_);
  int64_t reused_tokens_ ABSL_GUARDED_BY(mu_) = -1;  // prefix found in this worker's own cache
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time compute_done_ ABSL_GUARDED_BY(mu_);
  double compute_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // the delta's prompt_seconds
  absl::Time writes_done_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void() &&>> when_finished_ ABSL_GUARDED_BY(mu_);
};

PrefillService::PrefillService(EngineLoop* loop, kvtransfer::KvTransport* transport,
                               Options options)
    : loop_(loop),
      transport_(transport),
      options_(std::move(options)),
      own_timers_(options_.timers == nullptr ? std::make_unique<TimerQueue>() : nullptr),
      timers_(options_.timers != nullptr ? options_.timers : own_timers_.get()) {}

PrefillService::~PrefillService() = default;

absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> PrefillService::ConnectionTo(
    const v1::KvDestination& destination, const kvtransfer::PoolDescriptor& pool,
    absl::Time deadline) {
  const std::string key = absl::StrCat(destination.worker_id(), "#", pool.pool_epoch, "#",
                                       pool.regions[0].base_address);
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(key);
    if (it != connections_.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> conn =
      transport_->Connect(pool, deadline);
  if (!conn.ok()) return conn.status();
  absl::MutexLock lock(&mu_);
  connections_[key] = *conn;
  return conn;
}

void PrefillService::ForgetConnection(const kvtransfer::Connection* connection) {
  absl::MutexLock lock(&mu_);
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    if (it->second.get() == connection) {
      connections_.erase(it);
      return;
    }
  }
}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
    if (!draining) ++active_;  // until the call's OnDone
  }
  if (draining) {
    LOG(INFO) << "prefill of request " << request->request_id()
              << " refused: the worker is draining";
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    context->AddTrailingMetadata(kDrainingMetadataKey, "1");
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 absl::StrCat("prefill worker ", options_.worker_id,
                                              " is draining")));
    return reactor;
  }
  auto call = std::make_shared<PrefillCall>(this, context, request, response);
  call->Begin(call);
  return call.get();
}

void PrefillService::StartDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  LOG(INFO) << "draining: new prefills are refused; " << active_ << " in progress may finish";
}

bool PrefillService::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void PrefillService::HandOff() {
  std::vector<std::shared_ptr<PrefillCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, weak] : calls_) {
      if (std::shared_ptr<PrefillCall> call = weak.lock(); call != nullptr) {
        calls.push_back(std::move(call));
      }
    }
  }
  if (!calls.empty()) LOG(INFO) << "giving up " << calls.size() << " prefills still in progress";
  for (const auto& call : calls) {
    call->GiveUp(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("prefill worker ", options_.worker_id,
                                           " is draining")));
  }
  calls.clear();  // a call's last reference may go here: outside the lock, which OnDone takes
}

grpc::ServerUnaryReactor* PrefillService::Cancel(grpc::CallbackServerContext* context,
                                                 const v1::CancelRequest* request,
                                                 v1::CancelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<PrefillCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(request->request_id());
    if (it != calls_.end()) call = it->second.lock();
  }
  // The call answers CANCELLED once the engine let go of it and its writes ended; so does this
  // RPC (Prefill.Cancel's promise): after it, nothing more lands in the destination's blocks.
  response->set_found(call != nullptr &&
                      call->GiveUp(grpc::Status(grpc::StatusCode::CANCELLED,
                                                "the prefill was cancelled by its caller")));
  if (call == nullptr) {
    reactor->Finish(grpc::Status::OK);
  } else {
    call->WhenFinished([reactor] { reactor->Finish(grpc::Status::OK); });
  }
  return reactor;
}

}  // namespace tandem
