#include "decode_worker/decode_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_conversion.h"
#include "common/trace_context.h"
#include "proto/conversion.h"
#include "grpcpp/create_channel.h"

namespace tandem {
namespace {

void ToProto(const sampling::SampledToken& t, v1::TokenLogprobs* lp) {
  lp->set_token_id(t.id);
  lp->set_logprob(t.logprob.value_or(0.0f));
  for (const sampling::TokenLogprob& alt : t.top_logprobs) {
    v1::TopLogprob* top = lp->add_top_logprobs();
    top->set_token_id(alt.id);
    top->set_logprob(alt.logprob);
  }
}

// The delta's token and log-probabilities appended to `ids` / `logprobs`.
void AppendDelta(const GenerationDelta& d, google::protobuf::RepeatedField<int32_t>* ids,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* logprobs) {
  ids->Add(d.token);
  if (!d.logprob.has_value()) return;
  v1::TokenLogprobs* lp = logprobs->Add();
  lp->set_token_id(d.token);
  lp->set_logprob(*d.logprob);
  for (const sampling::TokenLogprob& t : d.top_logprobs) {
    v1::TopLogprob* top = lp->add_top_logprobs();
    top->set_token_id(t.id);
    top->set_logprob(t.logprob);
  }
}

}  // namespace

// One Generate stream. Owned by itself from Begin until gRPC's OnDone, and by every callback it
// handed out (the engine's delta callback, the prefill calls'), so a late callback finds it alive
// and only its state: once Finish was called the reactor is never touched again.
//
// Threads: Begin on gRPC's (inside Generate); OnDelta and the engine results on the engine
// thread; OnWriteDone, OnCancel and the prefill results on gRPC's. Everything shared is under mu_.
class DecodeService::GenerateCall final : public grpc::ServerWriteReactor<v1::DecodeResponse>,
                                          public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(DecodeService* service, grpc::CallbackServerContext* context,
               const v1::DecodeRequest& request)
      : service_(service),
        loop_(service->loop_),
        context_(context),
        request_(request),
        trace_(SpanForCall(*context, &trace_rejected_)),
        start_(absl::Now()),
        client_deadline_(context->deadline()) {}

  uint64_t id() const { return id_; }

  void Begin(std::shared_ptr<GenerateCall> self) {
    self_ = self;
    if (!trace_rejected_.ok()) {
      LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id()
                << ": the traceparent sent was not used (" << trace_rejected_.message()
                << "); a new trace starts";
    }
    LogStart();
    if (!request_.model().empty() && request_.model() != loop_->model_id()) {
      return End(grpc::Status(grpc::StatusCode::NOT_FOUND,
                              absl::StrCat("model '", request_.model(), "' is not served here (",
                                           loop_->model_id(), " is)")));
    }
    GenerationRequest r;
    r.prompt.assign(request_.prompt_token_ids().begin(), request_.prompt_token_ids().end());
    r.prompt.insert(r.prompt.end(), request_.prior_output_token_ids().begin(),
                    request_.prior_output_token_ids().end());
    r.sampling = SamplingFromProto(request_.sampling());
    r.prior_output_tokens = prior_;  // the engine checks them against max_tokens
    r.priority = request_.priority();
    // A request that resumes here (prior output) had its prompt scored where it started.
    if (prior_ == 0) {
      r.prompt_logprobs = static_cast<int>(
          std::min<uint32_t>(request_.sampling().prompt_logprobs(), 1u << 20));  // checked there
    }
    bool draining;
    {
      absl::MutexLock lock(&service_->mu_);
      id_ = service_->next_id_++;
      service_->live_[id_] = self;
      draining = service_->draining_;
    }
    if (draining) {
      LOG(INFO) << "request " << request_.request_id() << " refused: the worker is draining";
      return HandOff(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  absl::StrCat("decode worker ", service_->options_.worker_id,
                                               " is draining")));
    }
    {
      absl::MutexLock lock(&service_->mu_);
      if (!request_.request_id().empty() &&
          !service_->calls_.try_emplace(request_.request_id(), self).second) {
        return End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                absl::StrCat("request id '", request_.request_id(), "' is in use")));
      }
      registered_ = !request_.request_id().empty();
    }
    timings_.set_decode_worker(service_->options_.worker_id);
    if (PrefillsHere()) return SubmitLocally(std::move(r));
    // Kept in case the engine has no room to receive a remote prefill now.
    GenerationRequest copy = r;
    // A prefill worker writes into the blocks: the engine keeps them when the request ends until
    // no write can land any more (ReleaseWhenQuiet), so that none lands in a block another
    // request was given since.
    r.hold_kv = true;
    loop_->SubmitRemotePrefillAsync(
        id_, std::move(r), DeltaCallback(),
        [self, copy = std::move(copy)](absl::StatusOr<RemotePrefillPlan> plan) mutable {
          if (plan.ok()) return self->PrefillRemotely(*plan);
          if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
            return self->SubmitLocally(std::move(copy));  // queued here instead
          }
          self->End(ToGrpcStatus(plan.status()));
        });
  }

  // The engine's delta, on the engine thread; or a cancellation by the Cancel RPC.
  void OnDelta(const GenerationDelta& d) {
    if (d.finish != sampling::FinishReason::kNone) EngineLetGo();
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      if (first_delta_at_ == absl::InfinitePast()) {
        first_delta_at_ = now;
        local_prompt_seconds_ = d.prompt_seconds;
      }
      last_delta_at_ = now;
      deltas_.push_back(d);
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) Abort(grpc::Status(grpc::StatusCode::CANCELLED, "the stream to the client broke"));
    Pump();
  }

  void OnCancel() override {
    Abort(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&service_->mu_);
      if (registered_) service_->calls_.erase(request_.request_id());
      service_->live_.erase(id_);
    }
    self_.reset();  // the last callback still holding the call frees it
  }

  // The worker drains: the stream ends with `status` (UNAVAILABLE) and the trailing metadata that
  // tells the router to move the request, after the write in flight; the request stops here.
  void HandOff(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (end_.has_value()) return;  // ends anyway (its last tokens are out, or it failed)
      handed_off_ = true;
    }
    Abort(status);
  }

  // From the heartbeat thread: a stream with nothing written for `interval` and nothing to
  // write sends a heartbeat.
  void Heartbeat(absl::Time now, absl::Duration interval) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ || end_.has_value() || !deltas_.empty()) return;
      if (now - last_write_at_ < interval) return;
      heartbeat_ = true;
    }
    Pump();
  }

 private:
  // Whether the prompt is computed here: no prefill worker was named, this worker has no KV pool
  // to receive one, or the request scores its prompt (the logits of every position are needed
  // here, where they are returned).
  bool PrefillsHere() const {
    return request_.prefill_targets().empty() || service_->options_.kv_pool.regions_size() == 0 ||
           request_.sampling().prompt_logprobs() > 0;
  }

  // The request's first INFO line here: what it asks and where its prompt is to be computed.
  void LogStart() {
    std::string prefill;
    if (PrefillsHere()) {
      prefill = "prefill here";
    } else {
      for (const v1::PrefillTarget& t : request_.prefill_targets()) {
        absl::StrAppend(&prefill, prefill.empty() ? "prefill on " : ", then ", t.worker_id());
      }
    }
    LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": started; "
              << request_.prompt_token_ids_size() << " prompt tokens"
              << (prior_ > 0 ? absl::StrCat(" + ", prior_, " generated before it moved here") : "")
              << ", " << prefill << ParentOf(trace_);
  }

  // The request's last INFO line here, when its stream finishes with `status`.
  void LogEnd(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const char* outcome = status.ok()  ? "finished"
                          : handed_off_ ? "handed off (draining)"
                          : status.error_code() == grpc::StatusCode::CANCELLED ? "cancelled"
                                                                             : "failed";
    LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": " << outcome
              << (status.ok() ? std::string()
                              : absl::StrCat(" (", FromGrpcStatus(status).ToString(), ")"))
              << "; " << completion_tokens_ << " tokens generated, " << cached_tokens_
              << " prompt tokens cached, prefill "
              << (timings_.remote_prefill()
                      ? absl::StrCat("on ", timings_.prefill_worker())
                      : std::string(first_delta_at_ == absl::InfinitePast() ? "not done"
                                                                            : "here"))
              << ", " << absl::ToInt64Milliseconds(absl::Now() - start_) << " ms";
  }

  LocalEngine::DeltaCallback DeltaCallback() {
    return [self = self_](const GenerationDelta& d) { self->OnDelta(d); };
  }

  void SubmitLocally(GenerationRequest r) {
    if (Cancelled()) return;
    loop_->SubmitAsync(id_, std::move(r), DeltaCallback(), [self = self_](absl::Status s) {
      if (!s.ok()) return self->End(ToGrpcStatus(s));
      self->CancelIfAborted();
    });
  }

  // The plan's blocks are reserved: ask the prefill targets in order.
  void PrefillRemotely(const RemotePrefillPlan& plan) {
    {
      absl::MutexLock lock(&mu_);
      holds_kv_ = true;  // the engine holds the blocks once the request ends
    }
    if (CancelIfAborted()) return;
    const absl::Duration timeout = request_.prefill_timeout_ms() > 0
                                       ? absl::Milliseconds(request_.prefill_timeout_ms())
                                       : service_->options_.default_prefill_timeout;
    prefill_timeout_ = timeout;
    {
      absl::MutexLock lock(&mu_);
      cached_tokens_ = plan.cached_tokens;
    }
    v1::PrefillRequest& prefill = prefill_request_;
    prefill.set_request_id(request_.request_id());
    prefill.set_model(request_.model());
    prefill.mutable_token_ids()->Add(request_.prompt_token_ids().begin(),
                                     request_.prompt_token_ids().end());
    prefill.mutable_token_ids()->Add(request_.prior_output_token_ids().begin(),
                                     request_.prior_output_token_ids().end());
    prefill.set_num_destination_cached_tokens(static_cast<uint32_t>(plan.cached_tokens));
    prefill.set_num_prior_output_tokens(static_cast<uint32_t>(prior_));
    prefill.set_priority(request_.priority());
    v1::KvDestination* dst = prefill.mutable_destination();
    dst->set_worker_id(service_->options_.worker_id);
    *dst->mutable_pool() = service_->options_.kv_pool;
    for (int32_t b : plan.blocks) dst->add_block_ids(static_cast<uint32_t>(b));
    *prefill.mutable_sampling() = request_.sampling();
    prefill.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
    TryPrefillTarget(0);
  }

  void TryPrefillTarget(int index) {
    if (index >= request_.prefill_targets_size()) {
      if (Cancelled()) return;
      LOG(WARNING) << TraceTag(trace_) << "request " << request_.request_id()
                   << ": no prefill worker took the prompt; prefilling it here";
      loop_->FallBackToLocalPrefillAsync(id_, [self = self_](absl::Status s) {
        if (!s.ok()) {
          LOG(ERROR) << TraceTag(self->trace_) << "request " << self->request_.request_id() << ": "
                     << s;
        }
      });
      return;
    }
    const v1::PrefillTarget& target = request_.prefill_targets(index);
    grpc::ClientContext* context;
    {
      absl::MutexLock lock(&mu_);
      if (end_.has_value()) return;  // Abort cancels the engine's side
      prefill_contexts_.push_back(std::make_unique<grpc::ClientContext>());
      context = prefill_contexts_.back().get();
    }
    // The client's deadline, capped at the prefill timeout; Abort cancels the call.
    const auto cap = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::ToInt64Milliseconds(prefill_timeout_));
    context->set_deadline(std::min(client_deadline_, cap));
    AddTraceMetadata(trace_, context);  // this span is the prefill worker's parent
    {
      absl::MutexLock lock(&mu_);
      prefill_sent_at_ = absl::Now();
      ++prefills_open_;
    }
    service_->PrefillStub(target.address())
        ->async()
        ->Prefill(context, &prefill_request_, &prefill_response_,
                  [self = self_, index](grpc::Status status) {
                    self->OnPrefillDone(index, status);
                  });
  }

  void OnPrefillDone(int index, const grpc::Status& status) {
    const v1::PrefillTarget& target = request_.prefill_targets(index);
    if (!status.ok()) {
      LOG(WARNING) << TraceTag(trace_) << "request " << request_.request_id() << ": prefill worker "
                   << target.worker_id() << " (" << target.address()
                   << ") failed: " << status.error_message() << "; trying the next";
      // The status may be this side's (cancelled, deadline, a broken channel) while that worker
      // still writes: its Cancel answers once nothing more of the request can land.
      CancelPrefill(target);
      return TryPrefillTarget(index + 1);
    }
    PrefillQuiet();  // it answered: its writes have ended
    {
      absl::MutexLock lock(&mu_);
      const v1::PrefillTimings& t = prefill_response_.timings();
      timings_.set_remote_prefill(true);
      timings_.set_prefill_worker(target.worker_id());
      timings_.set_prefill_us(t.compute_us());
      timings_.set_kv_transfer_us(t.transfer_us());
      // Until the prefill worker started: reserving the blocks here, the targets tried before
      // this one, and that worker's own queue.
      timings_.set_queue_us(MicrosForProto(prefill_sent_at_ - start_) + t.queue_us());
    }
    sampling::SampledToken first;
    first.id = prefill_response_.first_token_id();
    if (prefill_response_.has_first_token_logprobs()) {
      const v1::TokenLogprobs& lp = prefill_response_.first_token_logprobs();
      first.logprob = lp.logprob();
      for (const v1::TopLogprob& t : lp.top_logprobs()) {
        first.top_logprobs.push_back({.id = t.token_id(), .logprob = t.logprob()});
      }
    }
    loop_->CompleteRemotePrefillAsync(
        id_, std::move(first), [self = self_](absl::Status s) {
          // A bad answer: the engine prefills here instead.
          if (!s.ok()) {
            LOG(WARNING) << TraceTag(self->trace_) << "request " << self->request_.request_id()
                         << ": " << s;
          }
        });
  }

  bool Cancelled() {
    absl::MutexLock lock(&mu_);
    return end_.has_value() && !end_->ok();
  }

  // After the engine accepted the request: an Abort that came first posted its cancellation
  // before the request existed there, so cancel again.
  bool CancelIfAborted() {
    if (!Cancelled()) return false;
    loop_->CancelAsync(id_, [self = shared_from_this()](bool found) {
      if (found) self->EngineLetGo();
    });
    return true;
  }

  // The engine ended the request (its last delta, or a cancellation that found it).
  void EngineLetGo() {
    {
      absl::MutexLock lock(&mu_);
      engine_let_go_ = true;
    }
    ReleaseWhenQuiet();
  }

  // A prefill call ended with its writes.
  void PrefillQuiet() {
    {
      absl::MutexLock lock(&mu_);
      --prefills_open_;
    }
    ReleaseWhenQuiet();
  }

  // Prefill.Cancel to a prefill worker whose call failed on this side; the call counts as quiet
  // when it answers (or cannot: that worker is gone or cut off, and the blocks go back anyway).
  void CancelPrefill(const v1::PrefillTarget& target) {
    struct Cancel {
      grpc::ClientContext context;
      v1::CancelRequest request;
      v1::CancelResponse response;
    };
    auto cancel = std::make_shared<Cancel>();
    cancel->request.set_request_id(request_.request_id());
    cancel->request.set_reason("the decode worker gave the prefill up");
    cancel->context.set_deadline(
        absl::ToChronoTime(absl::Now() + service_->options_.default_prefill_timeout));
    Cancel* c = cancel.get();
    service_->PrefillStub(target.address())
        ->async()
        ->Cancel(&c->context, &c->request, &c->response,
                 [self = shared_from_this(), cancel,
                  worker = target.worker_id()](grpc::Status status) {
                   if (!status.ok()) {
                     LOG(WARNING) << TraceTag(self->trace_) << "request "
                                  << self->request_.request_id() << ": cancelling its prefill on "
                                  << worker << " failed (" << status.error_message()
                                  << "); its blocks are released anyway";
                   }
                   self->PrefillQuiet();
                 });
  }

  // Releases the blocks the engine holds for the request once it let go of them and no prefill
  // call can write into them any more.
  void ReleaseWhenQuiet() {
    {
      absl::MutexLock lock(&mu_);
      if (!holds_kv_ || released_ || !engine_let_go_ || prefills_open_ > 0) return;
      released_ = true;
    }
    loop_->ReleaseKvAsync(id_);
  }

  // Ends the stream with an error after the write in flight, and stops the request everywhere.
  void Abort(const grpc::Status& status) {
    std::vector<grpc::ClientContext*> prefills;
    {
      absl::MutexLock lock(&mu_);
      if (end_.has_value()) return;
      end_ = status;
      for (auto& c : prefill_contexts_) prefills.push_back(c.get());
    }
    loop_->CancelAsync(id_, [self = shared_from_this()](bool found) {
      if (found) self->EngineLetGo();
    });
    for (grpc::ClientContext* c : prefills) c->TryCancel();
    Pump();
  }

  // Ends the stream with `status` after the write in flight; the engine holds nothing for it.
  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (!end_.has_value()) end_ = status;
    }
    Pump();
  }

  // Starts the next write, or finishes, when nothing is in flight.
  void Pump() {
    std::optional<grpc::Status> finish;
    bool handed_off = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (end_.has_value()) {
        finished_ = true;
        finish = *end_;
        handed_off = handed_off_;
        LogEnd(*finish);
      } else if (!deltas_.empty()) {
        writing_ = true;
        BuildResponse();
      } else if (heartbeat_) {
        writing_ = true;
        response_.Clear();
        response_.set_heartbeat(true);
      } else {
        return;
      }
      heartbeat_ = false;  // whatever is written says the worker is alive
      last_write_at_ = absl::Now();
    }
    if (finish.has_value()) {
      if (handed_off) context_->AddTrailingMetadata(kDrainingMetadataKey, "1");
      Finish(*finish);
    } else {
      StartWrite(&response_);
    }
  }

  // Moves the queued deltas into response_, up to the request's last.
  void BuildResponse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    response_.Clear();
    bool last = false;
    while (!deltas_.empty() && !last) {
      const GenerationDelta& d = deltas_.front();
      // Reported on the first delta (local prefill too); a resumed request's cache may cover
      // some of its earlier output, which is not prompt.
      cached_tokens_ = std::max(
          cached_tokens_,
          std::min<int64_t>(d.cached_prompt_tokens, request_.prompt_token_ids_size()));
      for (const sampling::SampledToken& t : d.prompt_logprobs) {
        ToProto(t, response_.add_prompt_logprobs());
      }
      if (d.token >= 0) {
        AppendDelta(d, response_.mutable_token_ids(), response_.mutable_logprobs());
        ++completion_tokens_;
      }
      if (!request_.omit_text()) response_.mutable_text()->append(d.text);
      if (d.finish != sampling::FinishReason::kNone) {
        response_.set_finish_reason(FinishReasonToProto(d.finish));
        if (d.finish == sampling::FinishReason::kError) {
          response_.set_error_message("the engine failed while computing this request");
        }
        last = true;
      }
      deltas_.pop_front();
    }
    const absl::Time now = absl::Now();
    if (first_) {
      timings_.set_ttft_us(MicrosForProto(now - start_));
      first_ = false;
    }
    if (last) {
      deltas_.clear();
      v1::Usage* usage = response_.mutable_usage();
      usage->set_prompt_tokens(static_cast<uint32_t>(request_.prompt_token_ids_size()));
      usage->set_completion_tokens(static_cast<uint32_t>(completion_tokens_ + prior_));
      usage->set_cached_prompt_tokens(static_cast<uint32_t>(cached_tokens_));
      timings_.set_e2e_us(MicrosForProto(now - start_));
      SetLocalTimings();
      *response_.mutable_timings() = timings_;
      end_ = grpc::Status::OK;  // finish once this write is done
    }
  }

  // The parts of timings_ measured here, once the last delta is in.
  void SetLocalTimings() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (first_delta_at_ != absl::InfinitePast()) {
      timings_.set_decode_us(MicrosForProto(last_delta_at_ - first_delta_at_));
    }
    if (local_prompt_seconds_ > 0) {
      // Computed here: a local prefill, or one taken back from a prefill worker that failed or
      // answered wrongly.
      const absl::Duration prompt = absl::Seconds(local_prompt_seconds_);
      timings_.set_remote_prefill(false);
      timings_.set_kv_transfer_us(0);
      timings_.set_prefill_us(MicrosForProto(prompt));
      timings_.set_queue_us(MicrosForProto(first_delta_at_ - start_ - prompt));
    }
    if (!timings_.remote_prefill()) timings_.set_prefill_worker(service_->options_.worker_id);
  }

  DecodeService* const service_;
  EngineLoop* const loop_;
  grpc::CallbackServerContext* const context_;  // valid until OnDone
  const v1::DecodeRequest request_;
  // This worker's span of the request's trace (the router's is its parent), and why a
  // traceparent that came could not be used.
  absl::Status trace_rejected_;
  const TraceContext trace_;
  const int64_t prior_ = request_.prior_output_token_ids_size();
  const absl::Time start_;
  const std::chrono::system_clock::time_point client_deadline_;
  uint64_t id_ = 0;          // set in Begin
  bool registered_ = false;  // in service_->calls_ (set in Begin)
  std::shared_ptr<GenerateCall> self_;

  // Set before the first prefill call and read-only after: the calls run one at a time.
  absl::Duration prefill_timeout_;
  v1::PrefillRequest prefill_request_;
  v1::PrefillResponse prefill_response_;

  absl::Mutex mu_;
  std::deque<GenerationDelta> deltas_ ABSL_GUARDED_BY(mu_);
  // How the stream ends once the write in flight is done: OK after the last delta, or an error.
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called: the reactor is off limits
  bool handed_off_ ABSL_GUARDED_BY(mu_) = false;  // ended by the drain (HandOff)
  v1::DecodeResponse response_ ABSL_GUARDED_BY(mu_);
  v1::Timings timings_ ABSL_GUARDED_BY(mu_);
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  // When the engine's first and latest deltas came, and the first one's prompt_seconds.
  absl::Time first_delta_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_delta_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double local_prompt_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // A heartbeat is due (Heartbeat), and when the latest write started (from the call's start).
  bool heartbeat_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_write_at_ ABSL_GUARDED_BY(mu_) = start_;
  // When the latest prefill call went out.
  absl::Time prefill_sent_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Every prefill call made, kept so that Abort can cancel the one in flight.
  std::vector<std::unique_ptr<grpc::ClientContext>> prefill_contexts_ ABSL_GUARDED_BY(mu_);
  // The remote prefill's blocks: the engine holds them once the request ended (hold_kv) until
  // ReleaseWhenQuiet: it has let go, and no prefill call is open (sent, and neither answered nor
  // answered by Prefill.Cancel).
  bool holds_kv_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_let_go_ ABSL_GUARDED_BY(mu_) = false;
  int prefills_open_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

DecodeService::DecodeService(EngineLoop* loop, Options options)
    : loop_(loop), options_(std::move(options)) {
  CHECK_OK(ValidateKeepalive(options_.keepalive));
  CHECK(options_.heartbeat > absl::ZeroDuration()) << "heartbeat must be positive";
  if (options_.heartbeat != absl::InfiniteDuration()) {
    heartbeat_thread_ = std::make_unique<PeriodicThread>(
        PeriodicThread::Options{.period = options_.heartbeat / 4}, [this] { SendHeartbeats(); });
  }
}

DecodeService::~DecodeService() { heartbeat_thread_.reset(); }

void DecodeService::SendHeartbeats() {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    calls.reserve(live_.size());
    for (const auto& [id, weak] : live_) {
      if (std::shared_ptr<GenerateCall> call = weak.lock(); call != nullptr) {
        calls.push_back(std::move(call));
      }
    }
  }
  const absl::Time now = absl::Now();
  for (const auto& call : calls) call->Heartbeat(now, options_.heartbeat);
  calls.clear();  // a call's last reference may go here: outside the lock, which OnDone takes
}

void DecodeService::StartDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  LOG(INFO) << "draining: new streams are refused; " << live_.size()
            << " in progress may finish";
}

bool DecodeService::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_.empty(); };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void DecodeService::HandOff() {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, weak] : live_) {
      if (std::shared_ptr<GenerateCall> call = weak.lock(); call != nullptr) {
        calls.push_back(std::move(call));
      }
    }
  }
  if (!calls.empty()) {
    LOG(INFO) << "handing off " << calls.size() << " streams still in progress to the router";
  }
  for (const auto& call : calls) {
    call->HandOff(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("decode worker ", options_.worker_id,
                                            " is draining; stream handed off")));
  }
  calls.clear();  // a call's last reference may go here: outside the lock, which OnDone takes
}

v1::Prefill::Stub* DecodeService::PrefillStub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Prefill::NewStub(CreateKeepaliveChannel(address, options_.keepalive, options_.security));
  }
  return stub.get();
}

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Generate(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  auto call = std::make_shared<GenerateCall>(this, context, *request);
  call->Begin(call);
  return call.get();
}

grpc::ServerUnaryReactor* DecodeService::Cancel(grpc::CallbackServerContext* context,
                                                const v1::CancelRequest* request,
                                                v1::CancelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<GenerateCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(request->request_id());
    if (it != calls_.end()) call = it->second;
  }
  if (call == nullptr) {
    response->set_found(false);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  loop_->CancelAsync(call->id(), [call, reactor, response](bool found) {
    response->set_found(found);
    if (found) {
      // The stream ends with the cancellation as its finish reason.
      GenerationDelta d;
      d.token = -1;
      d.finish = sampling::FinishReason::kCancelled;
      call->OnDelta(d);
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace tandem
