#include "router/server/inference_service.h"

#include <deque>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "common/status_conversion.h"

namespace tandem::router {
namespace {

// Hands a relayed call's responses to the thread that writes them to the client.
class QueueSink final : public ResponseSink {
 public:
  void OnResponse(const v1::GenerateResponse& response) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(response);
  }
  void OnDone(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    done_ = status;
  }
  // Waits up to `timeout` for something; moves out what came. True once done (and drained).
  bool Take(std::deque<v1::GenerateResponse>* out, absl::Status* status, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](QueueSink* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                               return !s->queue_.empty() || s->done_.has_value();
                             },
                             this),
                         timeout);
    out->swap(queue_);
    queue_.clear();
    if (done_.has_value()) *status = *done_;
    return done_.has_value();
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::Status InferenceService::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<RequestRouter::Prepared> prepared = router_->Prepare(*request);
  if (!prepared.ok()) {
    CountRejected();
    return ToGrpcStatus(prepared.status());
  }
  QueueSink sink;
  const auto client_deadline = context->deadline();
  const absl::Time deadline = client_deadline == std::chrono::system_clock::time_point::max()
                                  ? absl::InfiniteFuture()
                                  : absl::FromChrono(client_deadline);
  absl::StatusOr<std::shared_ptr<RelayedCall>> call =
      router_->Start(*std::move(prepared), &sink, deadline);
  if (!call.ok()) {
    CountRejected();
    return ToGrpcStatus(call.status());
  }
  bool cancelled = false;
  bool broken = false;
  while (true) {
    std::deque<v1::GenerateResponse> responses;
    absl::Status status;
    const bool done = sink.Take(&responses, &status, absl::Milliseconds(50));
    for (const v1::GenerateResponse& r : responses) {
      if (!broken && !writer->Write(r)) broken = true;
    }
    if (done) return ToGrpcStatus(status);
    if (!cancelled && (broken || context->IsCancelled())) {
      (*call)->Cancel();  // OnDone follows; the sink must live until then
      cancelled = true;
    }
  }
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* /*context*/,
                                        const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  absl::StatusOr<v1::TokenizeResponse> r = router_->Tokenize(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* /*context*/,
                                          const v1::ListModelsRequest* /*request*/,
                                          v1::ListModelsResponse* response) {
  *response = router_->ListModels();
  return grpc::Status::OK;
}

}  // namespace tandem::router
