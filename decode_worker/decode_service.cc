#include "decode_worker/decode_service.h"

#include <algorithm>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_conversion.h"
#include "engine/serving/proto_conversion.h"
#include "grpcpp/create_channel.h"

namespace tandem {

// One Generate stream: the deltas the engine thread hands over, for the RPC thread to send.
struct DecodeService::Call {
  absl::Mutex mu;
  std::deque<GenerationDelta> deltas ABSL_GUARDED_BY(mu);
  uint64_t id = 0;
};

DecodeService::DecodeService(EngineLoop* loop, Options options)
    : loop_(loop), options_(std::move(options)) {}

v1::Prefill::StubInterface* DecodeService::PrefillStub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Prefill::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

bool DecodeService::PrefillRemotely(const v1::DecodeRequest& request, uint64_t id,
                                    const RemotePrefillPlan& plan, grpc::ServerContext* context,
                                    v1::Timings* timings) {
  const absl::Duration timeout = request.prefill_timeout_ms() > 0
                                     ? absl::Milliseconds(request.prefill_timeout_ms())
                                     : options_.default_prefill_timeout;
  v1::PrefillRequest prefill;
  prefill.set_request_id(request.request_id());
  prefill.set_model(request.model());
  prefill.mutable_token_ids()->Add(request.prompt_token_ids().begin(),
                                   request.prompt_token_ids().end());
  prefill.mutable_token_ids()->Add(request.prior_output_token_ids().begin(),
                                   request.prior_output_token_ids().end());
  prefill.set_num_destination_cached_tokens(static_cast<uint32_t>(plan.cached_tokens));
  prefill.set_num_prior_output_tokens(
      static_cast<uint32_t>(request.prior_output_token_ids_size()));
  v1::KvDestination* dst = prefill.mutable_destination();
  dst->set_worker_id(options_.worker_id);
  *dst->mutable_pool() = options_.kv_pool;
  for (int32_t b : plan.blocks) dst->add_block_ids(static_cast<uint32_t>(b));
  *prefill.mutable_sampling() = request.sampling();
  prefill.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));

  for (const v1::PrefillTarget& target : request.prefill_targets()) {
    if (context->IsCancelled()) break;
    // The call inherits the client's deadline and cancellation, capped at the prefill timeout.
    std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(*context);
    const auto cap = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
    if (call->deadline() > cap) call->set_deadline(cap);
    v1::PrefillResponse response;
    const grpc::Status status =
        PrefillStub(target.address())->Prefill(call.get(), prefill, &response);
    if (!status.ok()) {
      LOG(WARNING) << "request " << request.request_id() << ": prefill worker "
                   << target.worker_id() << " (" << target.address()
                   << ") failed: " << status.error_message() << "; trying the next";
      continue;
    }
    if (absl::Status s = loop_->CompleteRemotePrefill(id, response.first_token_id()); !s.ok()) {
      // A bad answer: the engine prefills here instead.
      LOG(WARNING) << "request " << request.request_id() << ": " << s;
      return true;
    }
    timings->set_remote_prefill(true);
    timings->set_prefill_worker(target.worker_id());
    timings->set_prefill_us(response.timings().compute_us());
    timings->set_kv_transfer_us(response.timings().transfer_us());
    return true;
  }
  if (absl::Status s = loop_->FallBackToLocalPrefill(id); !s.ok()) {
    LOG(ERROR) << "request " << request.request_id() << ": " << s;
  }
  return false;
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context,
                                     const v1::DecodeRequest* request,
                                     grpc::ServerWriter<v1::DecodeResponse>* writer) {
  const absl::Time start = absl::Now();
  if (!request->model().empty() && request->model() != loop_->model_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model '", request->model(), "' is not served here (",
                                     loop_->model_id(), " is)"));
  }
  GenerationRequest r;
  r.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  r.prompt.insert(r.prompt.end(), request->prior_output_token_ids().begin(),
                  request->prior_output_token_ids().end());
  r.sampling = SamplingFromProto(request->sampling());
  const int64_t prior = request->prior_output_token_ids_size();
  if (prior > 0 && r.sampling.max_tokens.has_value()) {
    *r.sampling.max_tokens -= prior;
    if (*r.sampling.max_tokens <= 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "prior_output_token_ids already reach max_tokens");
    }
  }
  r.priority = request->priority();
  const int64_t prompt_tokens = request->prompt_token_ids_size();

  auto call = std::make_shared<Call>();
  {
    absl::MutexLock lock(&mu_);
    call->id = next_id_++;
    if (!request->request_id().empty() &&
        !calls_.try_emplace(request->request_id(), call).second) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrCat("request id '", request->request_id(), "' is in use"));
    }
  }
  struct Unregister {
    DecodeService* self;
    const std::string& key;
    ~Unregister() {
      absl::MutexLock lock(&self->mu_);
      self->calls_.erase(key);
    }
  } unregister{this, request->request_id()};

  LocalEngine::DeltaCallback on_delta = [call](const GenerationDelta& d) {
    absl::MutexLock lock(&call->mu);
    call->deltas.push_back(d);
  };
  v1::Timings timings;
  timings.set_decode_worker(options_.worker_id);
  int64_t cached_tokens = 0;
  bool submitted = false;
  if (!request->prefill_targets().empty() && options_.kv_pool.regions_size() > 0) {
    absl::StatusOr<RemotePrefillPlan> plan = loop_->SubmitRemotePrefill(call->id, r, on_delta);
    if (plan.ok()) {
      cached_tokens = plan->cached_tokens;
      PrefillRemotely(*request, call->id, *plan, context, &timings);
      submitted = true;
    } else if (plan.status().code() != absl::StatusCode::kResourceExhausted) {
      return ToGrpcStatus(plan.status());
    }
    // No room to receive a remote prefill now: queue the request here instead.
  }
  if (!submitted) {
    if (absl::Status s = loop_->Submit(call->id, std::move(r), on_delta); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }

  int64_t completion_tokens = 0;
  bool first = true;
  while (true) {
    std::vector<GenerationDelta> batch;
    {
      absl::MutexLock lock(&call->mu);
      call->mu.AwaitWithTimeout(
          absl::Condition(
              +[](std::deque<GenerationDelta>* q) { return !q->empty(); }, &call->deltas),
          absl::Milliseconds(50));
      batch.assign(call->deltas.begin(), call->deltas.end());
      call->deltas.clear();
    }
    if (context->IsCancelled()) {
      loop_->Cancel(call->id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
    }
    if (batch.empty()) continue;
    v1::DecodeResponse response;
    bool finished = false;
    for (const GenerationDelta& d : batch) {
      if (d.token >= 0) {
        AppendDelta(d, response.mutable_token_ids(), response.mutable_logprobs());
        ++completion_tokens;
      }
      if (!request->omit_text()) response.mutable_text()->append(d.text);
      if (d.finish != sampling::FinishReason::kNone) {
        response.set_finish_reason(FinishReasonToProto(d.finish));
        if (d.finish == sampling::FinishReason::kError) {
          response.set_error_message("the engine failed while computing this request");
        }
        finished = true;
        break;
      }
    }
    if (first) {
      timings.set_ttft_us(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)));
      first = false;
    }
    if (finished) {
      v1::Usage* usage = response.mutable_usage();
      usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
      usage->set_completion_tokens(static_cast<uint32_t>(completion_tokens + prior));
      usage->set_cached_prompt_tokens(static_cast<uint32_t>(cached_tokens));
      timings.set_e2e_us(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)));
      *response.mutable_timings() = timings;
    }
    if (!writer->Write(response)) {
      loop_->Cancel(call->id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stream to the client broke");
    }
    if (finished) return grpc::Status::OK;
  }
}

grpc::Status DecodeService::Cancel(grpc::ServerContext* /*context*/,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(request->request_id());
    if (it != calls_.end()) call = it->second;
  }
  response->set_found(call != nullptr && loop_->Cancel(call->id));
  if (call != nullptr) {
    // The stream ends with the cancellation as its finish reason.
    GenerationDelta d;
    d.token = -1;
    d.finish = sampling::FinishReason::kCancelled;
    absl::MutexLock lock(&call->mu);
    call->deltas.push_back(d);
  }
  return grpc::Status::OK;
}

}  // namespace tandem
