#include "router/server/inference_service.h"

#include <atomic>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_conversion.h"
#include "common/trace_context.h"
#include "router/server/tool_calls.h"

namespace tandem::router {

// One Generate stream: the relay's responses are queued and written one at a time. The object
// ends when both gRPC (OnDone) and the relay (the sink's OnDone) are through with it.
class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                           public ResponseSink {
 public:
  GenerateCall(InferenceService* service, RequestRouter* router,
               grpc::CallbackServerContext* context, const v1::GenerateRequest& request)
      : service_(service), context_(context) {
    service_->StreamOpened();
    if (ParsesToolCalls(request)) tool_names_ = ToolNames(request);
    tool_format_ = router->tool_call_format();
    // The router's span of the request, answered in the initial metadata (errors too).
    absl::Status rejected;
    const TraceContext span = SpanForCall(*context, &rejected);
    if (!rejected.ok()) {
      LOG(INFO) << TraceTag(span) << "the client's traceparent was not used ("
                << rejected.message() << "); a new trace starts";
    }
    context->AddInitialMetadata(std::string(kTraceparentKey), span.traceparent());
    absl::StatusOr<auth::TenantLease> admitted = service->Admit(*context);
    if (!admitted.ok()) {
      LOG(INFO) << TraceTag(span) << "request refused: " << admitted.status();
      CountRejected();
      Refuse(admitted.status());
      return;
    }
    lease_ = *std::move(admitted);
    absl::StatusOr<RequestRouter::Prepared> prepared = router->Prepare(request, span);
    if (!prepared.ok()) {
      LOG(INFO) << TraceTag(span) << "request refused: " << prepared.status();
      CountRejected();
      Refuse(prepared.status());
      return;
    }
    const auto client_deadline = context->deadline();
    const absl::Time deadline = client_deadline == std::chrono::system_clock::time_point::max()
                                    ? absl::InfiniteFuture()
                                    : absl::FromChrono(client_deadline);
    absl::StatusOr<std::shared_ptr<RelayedCall>> call =
        router->Start(*std::move(prepared), this, deadline);
    if (!call.ok()) {
      LOG(INFO) << TraceTag(span) << "request refused: " << call.status();
      CountRejected();
      Refuse(call.status());
      return;
    }
    bool cancel;
    {
      absl::MutexLock lock(&mu_);
      relay_ = *std::move(call);
      cancel = cancel_;
    }
    if (cancel) relay_->Cancel();  // the client left before the relay started
  }

  // ResponseSink, on the relay's threads.
  void OnResponse(const v1::GenerateResponse& response) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      queue_.push_back(response);
      if (tool_names_.has_value()) {
        // The last message carries the calls parsed from the whole output.
        output_ += response.text();
        if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          for (const ParsedToolCall& c :
               ParseToolCalls(output_, *tool_names_, tool_format_).calls) {
            v1::ToolCall* call = queue_.back().add_tool_calls();
            call->set_id(NewToolCallId(tool_format_));
            call->set_name(c.name);
            call->set_arguments(c.arguments);
          }
        }
      }
    }
    Pump();
  }
  void OnDone(const absl::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      if (!end_.has_value()) end_ = Ending(status);
    }
    Pump();
    Unref();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) CancelRelay();  // the client is gone; the relay's OnDone ends the stream
    Pump();
  }
  void OnCancel() override { CancelRelay(); }
  void OnDone() override {
    InferenceService* service = service_;
    Unref();
    service->StreamClosed();
  }

 private:
  // Finishes at once, before any relay started: only gRPC holds the call.
  void Refuse(const absl::Status& status) {
    refs_.store(1);
    {
      absl::MutexLock lock(&mu_);
      end_ = Ending(status);
    }
    Pump();
  }

  // The call's final status; a retry-after hint goes into the trailing metadata (before Finish,
  // which is the only other user of the context's trailers).
  grpc::Status Ending(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (std::optional<absl::Duration> after = RetryAfter(status); after.has_value()) {
      context_->AddTrailingMetadata(kRetryAfterKey, absl::StrCat(RetryAfterSeconds(*after)));
    }
    return ToGrpcStatus(status);
  }

  void CancelRelay() {
    std::shared_ptr<RelayedCall> relay;
    {
      absl::MutexLock lock(&mu_);
      if (cancel_) return;
      cancel_ = true;
      relay = relay_;
    }
    if (relay != nullptr) relay->Cancel();  // else the constructor cancels it
  }

  // Starts the next write, or finishes once the relay is done and its responses are written.
  void Pump() {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (!queue_.empty() && !cancel_) {
        writing_ = true;
        current_ = std::move(queue_.front());
        queue_.pop_front();
      } else if (end_.has_value()) {
        finished_ = true;
        queue_.clear();
        finish = *end_;
      } else {
        return;
      }
    }
    if (finish.has_value()) {
      Finish(*finish);
    } else {
      StartWrite(&current_);
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  InferenceService* const service_;
  grpc::CallbackServerContext* const context_;  // valid until gRPC's OnDone
  auth::TenantLease lease_;  // the tenant's place among its concurrent requests, until the end
  std::atomic<int> refs_{2};  // gRPC's OnDone and the relay's
  absl::Mutex mu_;
  std::shared_ptr<RelayedCall> relay_ ABSL_GUARDED_BY(mu_);
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  // A request whose output is parsed for calls: its tools' names, and the output so far.
  std::optional<absl::flat_hash_set<std::string>> tool_names_;
  ToolCallFormat tool_format_ = ToolCallFormat::kHermes;  // the model's (parsing, call ids)
  std::string output_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse current_;  // the response being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateCall(this, router_, context, *request);
}

void InferenceService::StreamOpened() {
  absl::MutexLock lock(&mu_);
  ++open_streams_;
}

void InferenceService::StreamClosed() {
  absl::MutexLock lock(&mu_);
  --open_streams_;
}

bool InferenceService::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_streams_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

absl::StatusOr<auth::TenantLease> InferenceService::Admit(
    const grpc::CallbackServerContext& context) {
  if (api_keys_ == nullptr) return auth::TenantLease();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  return api_keys_->Admit(it == metadata.end()
                              ? std::nullopt
                              : std::optional<absl::string_view>(absl::string_view(
                                    it->second.data(), it->second.size())));
}

namespace {

// A unary call refused at the door, its retry-after hint in the trailing metadata.
grpc::ServerUnaryReactor* RefuseUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  CountRejected();
  if (std::optional<absl::Duration> after = RetryAfter(status); after.has_value()) {
    context->AddTrailingMetadata(kRetryAfterKey, absl::StrCat(RetryAfterSeconds(*after)));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  absl::StatusOr<auth::TenantLease> lease = Admit(*context);
  if (!lease.ok()) return RefuseUnary(context, lease.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::TokenizeResponse> r = router_->Tokenize(*request);
  if (r.ok()) *response = *std::move(r);
  reactor->Finish(r.ok() ? grpc::Status::OK : ToGrpcStatus(r.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* context,
                                                       const v1::ListModelsRequest* /*request*/,
                                                       v1::ListModelsResponse* response) {
  absl::StatusOr<auth::TenantLease> lease = Admit(*context);
  if (!lease.ok()) return RefuseUnary(context, lease.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  *response = router_->ListModels();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::router
