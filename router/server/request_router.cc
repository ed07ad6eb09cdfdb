#include "router/server/request_router.h"

#include <cmath>
#include <filesystem>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "common/status_macros.h"
#include "engine/kv/block_hash.h"
#include "engine/model/gguf.h"
#include "engine/sampling/sampling_options.h"
#include "engine/serving/proto_conversion.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "grpcpp/create_channel.h"

namespace tandem::router {
namespace {

// The router's metrics (docs/metrics.md), with vLLM's names where vLLM has the same histogram.
struct RouterMetrics {
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("tandem_router_requests_total")
      .Help("Requests by outcome: ok, error, cancelled, rejected (refused before placement)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& placements = prometheus::BuildCounter()
      .Name("tandem_router_placements_total")
      .Help("Placement decisions by policy, prefill location (local on the decode worker or remote) "
            "and the reason for it")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& admissions = prometheus::BuildCounter()
      .Name("tandem_router_admissions_total")
      .Help("Admission verdicts at arrival: admit (started at once), queue, reject")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& rejections = prometheus::BuildCounter()
      .Name("tandem_router_rejections_total")
      .Help("Requests refused by admission, by reason: slo_unreachable, queue_full, displaced, "
            "expired")
      .Register(ProcessMetrics());
  prometheus::Gauge& queued = prometheus::BuildGauge()
      .Name("tandem_router_admission_queue_requests")
      .Help("Requests waiting in the router's admission queue")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Histogram& queue_wait = Histogram("tandem_router_admission_queue_seconds",
                                                "Time a request waited in the admission queue before it started",
                                                RequestLatencyBuckets());
  prometheus::Histogram& ttft_error = Histogram(
      "tandem_router_ttft_prediction_error_ratio",
      "(observed - predicted) / predicted time to first token, for requests the policy predicted",
      ErrorRatioBuckets());
  prometheus::Histogram& tpot_error = Histogram(
      "tandem_router_tpot_prediction_error_ratio",
      "(observed - predicted) / predicted time per output token, for requests the policy predicted",
      ErrorRatioBuckets());
  prometheus::Family<prometheus::Counter>& slo = prometheus::BuildCounter()
      .Name("tandem_router_slo_requests_total")
      .Help("Finished requests with latency objectives by priority class (background < 0, "
            "normal 0, high > 0) and whether both objectives were met")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& migrations = prometheus::BuildCounter()
      .Name("tandem_router_migrations_total")
      .Help("Requests moved to another decode worker after theirs failed, by reason")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& stalled = prometheus::BuildCounter()
      .Name("tandem_router_stalled_streams_total")
      .Help("Decode streams that sent neither a token nor a heartbeat for the stall timeout, by "
            "what became of their request: migrated (to another decode worker) or failed "
            "(ended with UNAVAILABLE)")
      .Register(ProcessMetrics());
  prometheus::Family<prometheus::Counter>& broken = prometheus::BuildCounter()
      .Name("tandem_router_decode_stream_failures_total")
      .Help("Decode streams that broke before their last token, by cause: keepalive (a ping went "
            "unanswered), stalled (silent past the stall timeout), other")
      .Register(ProcessMetrics());
  prometheus::Histogram& ttft = Histogram("tandem_router_time_to_first_token_seconds",
                                          "From arrival at the router to the first token", RequestLatencyBuckets());
  prometheus::Histogram& itl = Histogram("tandem_router_inter_token_latency_seconds",
                                         "Between consecutive tokens of a stream", TokenLatencyBuckets());
  prometheus::Histogram& e2e = Histogram("tandem_router_e2e_latency_seconds",
                                         "From arrival to the last token", RequestLatencyBuckets());
  prometheus::Histogram& overhead = Histogram(
      "tandem_router_overhead_seconds",
      "The router's own work per request: hashing, placement and starting the relay",
      TokenLatencyBuckets());
  prometheus::Histogram& vllm_ttft = Histogram("vllm:time_to_first_token_seconds",
                                               "Time to first token (vLLM's name)", RequestLatencyBuckets());
  prometheus::Histogram& vllm_e2e = Histogram("vllm:e2e_request_latency_seconds",
                                              "End-to-end request latency (vLLM's name)", RequestLatencyBuckets());
  prometheus::Histogram& vllm_tpot = Histogram("vllm:time_per_output_token_seconds",
                                               "Time per output token (vLLM's name)", TokenLatencyBuckets());

  static prometheus::Histogram::BucketBoundaries ErrorRatioBuckets() {
    return {-0.75, -0.5, -0.3, -0.2, -0.1, -0.05, 0, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5};
  }
  static prometheus::Histogram& Histogram(const char* name, const char* help,
                                          const prometheus::Histogram::BucketBoundaries& b) {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(ProcessMetrics()).Add({}, b);
  }
};

RouterMetrics& Metrics() {
  static RouterMetrics* metrics = new RouterMetrics();
  return *metrics;
}

}  // namespace

void CountRejected() { Metrics().requests.Add({{"outcome", "rejected"}}).Increment(); }

namespace {

// Whether a decode stream that ended with `status` (no final response, not cancelled by us) may
// go on elsewhere: the worker died, dropped the stream or failed inside. Errors about the request
// itself (bad input, deadline) would fail the same way anywhere.
bool Migratable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:  // the worker shut down
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::DATA_LOSS:
      return true;
    default:
      return false;
  }
}

class DecodeRelay;

// One Decode.Generate stream to one decode worker, with gRPC's callback API. Alive until OnDone.
// Watched for silence (StallWatch) from Begin until OnDone: every message, heartbeats too, counts.
class DecodeAttempt final : public grpc::ClientReadReactor<v1::DecodeResponse>,
                            public StallWatch::Stream {
 public:
  DecodeAttempt(std::shared_ptr<DecodeRelay> relay, absl::Time now)
      : Stream(now), relay_(std::move(relay)) {}

  void Begin(v1::Decode::Stub* stub, const v1::DecodeRequest& request, absl::Time deadline,
             std::shared_ptr<DecodeAttempt> self, StallWatch& watch) {
    self_ = self;
    watch.Add(std::move(self));
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
    stub->async()->Generate(&context_, &request, this);
    StartRead(&response_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  // The worker was silent for too long: the stream is cancelled here, and OnDone sees stalled().
  void OnStalled(absl::Duration silent_for) override {
    silent_for_ms_.store(absl::ToInt64Milliseconds(silent_for), std::memory_order_relaxed);
    stalled_.store(true, std::memory_order_release);
    context_.TryCancel();
  }
  bool stalled() const { return stalled_.load(std::memory_order_acquire); }
  int64_t silent_for_ms() const { return silent_for_ms_.load(std::memory_order_relaxed); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  std::shared_ptr<DecodeRelay> relay_;
  grpc::ClientContext context_;
  v1::DecodeResponse response_;
  std::shared_ptr<DecodeAttempt> self_;
  std::atomic<bool> stalled_{false};
  std::atomic<int64_t> silent_for_ms_{0};
};

// Relays one request to its decode worker and the responses to a sink. When the decode worker
// dies or its stream breaks before the last response, the request moves to another decode worker
// with the tokens generated so far (prior_output_token_ids), up to RouterOptions::max_migrations
// times, and the client's stream goes on: the new worker replays those tokens, so greedy and
// seeded output are the same as if nothing had happened.
class DecodeRelay final : public RelayedCall, public std::enable_shared_from_this<DecodeRelay> {
 public:
  DecodeRelay(RequestRouter* router, Route route, v1::DecodeRequest request, ResponseSink* sink,
              placement::Request placement, absl::Time arrival, absl::Time deadline,
              int max_migrations)
      : router_(router),
        request_(std::move(request)),
        sink_(sink),
        placement_(std::move(placement)),
        deadline_(deadline),
        max_migrations_(max_migrations),
        start_(arrival),
        queue_us_(absl::ToInt64Microseconds(absl::Now() - arrival)),
        prediction_(route.decision),
        route_(std::move(route)) {}

  void Begin(v1::Decode::Stub* stub) { StartAttempt(stub, request_); }
  Clock* clock() const { return router_->clock(); }

  void Cancel() override {
    std::shared_ptr<DecodeAttempt> attempt;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      attempt = attempt_;
    }
    attempt->Cancel();
  }

  // On the attempt's gRPC thread; attempts run one at a time, so the fields below are only
  // touched by one thread at a time.
  void OnResponse(const v1::DecodeResponse& response) {
    v1::GenerateResponse out;
    out.set_request_id(request_.request_id());
    *out.mutable_token_ids() = response.token_ids();
    out.set_text(response.text());
    *out.mutable_logprobs() = response.logprobs();
    out.set_finish_reason(response.finish_reason());
    out.set_error_message(response.error_message());
    if (response.has_usage()) *out.mutable_usage() = response.usage();
    generated_.insert(generated_.end(), response.token_ids().begin(), response.token_ids().end());
    const absl::Time now = absl::Now();
    if (response.token_ids_size() > 0) {
      router_->registry().Progress(route_, response.token_ids_size(), now);
      if (first_) {
        router_->registry().PromptDone(route_);
        ttft_us_ = absl::ToInt64Microseconds(now - start_);
        Metrics().ttft.Observe(absl::ToDoubleSeconds(now - start_));
        Metrics().vllm_ttft.Observe(absl::ToDoubleSeconds(now - start_));
        if (prediction_.predicted && prediction_.predicted_ttft_seconds > 0) {
          Metrics().ttft_error.Observe(
              (absl::ToDoubleSeconds(now - start_) - PredictedTtftSeconds()) /
              PredictedTtftSeconds());
        }
        // From the placement (after any admission queue), which is what was predicted.
        if (migrations_ == 0) {
          router_->registry().ObserveTtft(
              route_, absl::ToDoubleSeconds(now - start_) - queue_us_ * 1e-6);
        }
        first_ = false;
      } else {
        // Tokens that came together share the gap since the previous message.
        const double gap = absl::ToDoubleSeconds(now - last_) / response.token_ids_size();
        for (int i = 0; i < response.token_ids_size(); ++i) {
          Metrics().itl.Observe(gap);
          Metrics().vllm_tpot.Observe(gap);
        }
      }
      last_ = now;
    }
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finished_ = true;
    if (response.has_timings()) {
      v1::Timings* t = out.mutable_timings();
      *t = response.timings();
      t->set_ttft_us(static_cast<uint64_t>(ttft_us_));
      t->set_e2e_us(MicrosForProto(absl::Now() - start_));
      t->set_migrations(static_cast<uint32_t>(migrations_));
      t->set_queue_us(static_cast<uint64_t>(queue_us_) + response.timings().queue_us());
      if (prediction_.predicted) {
        t->set_predicted_ttft_us(
            static_cast<uint64_t>(std::llround(PredictedTtftSeconds() * 1e6)));
        t->set_predicted_tpot_us(
            static_cast<uint64_t>(std::llround(prediction_.predicted_tpot_seconds * 1e6)));
      }
      if (response.timings().remote_prefill() && response.timings().kv_transfer_us() > 0 &&
          response.has_usage()) {
        const int64_t moved = static_cast<int64_t>(response.usage().prompt_tokens()) -
                              response.usage().cached_prompt_tokens();
        // The writes run beside the computation, layer by layer: what the move adds to the time
        // to first token is its tail after the last layer is computed.
        const uint64_t transfer_us = response.timings().kv_transfer_us();
        const uint64_t compute_us = response.timings().prefill_us();
        router_->registry().ObserveTransfer(
            response.timings().prefill_worker(), response.timings().decode_worker(), moved,
            static_cast<double>(transfer_us > compute_us ? transfer_us - compute_us : 0) * 1e-6);
      }
      if (response.finish_reason() != v1::FINISH_REASON_ERROR) ObserveSlo(*t);
    }
    sink_->OnResponse(out);
  }

  // `stalled`: the router cancelled the stream because the worker had been silent for
  // `silent_for_ms` (StallWatch); `status` then says CANCELLED.
  void OnAttemptDone(grpc::Status status, bool stalled, int64_t silent_for_ms) {
    router_->registry().Release(route_);
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    if (!status.ok() && !cancelled && !finished_) {
      const char* cause = stalled ? "stalled"
                          : IsKeepaliveFailure(status.error_message()) ? "keepalive"
                                                                       : "other";
      Metrics().broken.Add({{"cause", cause}}).Increment();
    }
    if (stalled && !cancelled && !finished_) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("decode worker ", route_.decision.decode_worker,
                                         " sent neither a token nor a heartbeat for ",
                                         silent_for_ms, " ms"));
    }
    if (!status.ok() && !cancelled && !finished_ && Migratable(status)) {
      const absl::Status moved = Migrate(status, stalled);
      if (stalled) {
        Metrics().stalled.Add({{"outcome", moved.ok() ? "migrated" : "failed"}}).Increment();
      }
      if (moved.ok()) return;
      LOG(WARNING) << "request " << request_.request_id() << ": " << moved;
      // The worker is lost and the request cannot go on elsewhere: say why, retryable.
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(moved.message()));
    }
    const char* outcome = status.ok()                                        ? "ok"
                          : status.error_code() == grpc::StatusCode::CANCELLED ? "cancelled"
                                                                               : "error";
    Metrics().requests.Add({{"outcome", outcome}}).Increment();
    if (status.ok()) {
      Metrics().e2e.Observe(absl::ToDoubleSeconds(absl::Now() - start_));
      Metrics().vllm_e2e.Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    sink_->OnDone(FromGrpcStatus(status));
  }

 private:
  void StartAttempt(v1::Decode::Stub* stub, const v1::DecodeRequest& request) {
    auto attempt = std::make_shared<DecodeAttempt>(shared_from_this(), router_->clock()->Now());
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      attempt_ = attempt;
      cancelled = cancelled_;
    }
    attempt->Begin(stub, request, deadline_, attempt, router_->stall_watch());
    if (cancelled) attempt->Cancel();  // Cancel() saw the previous attempt
  }

  // Places the request again, away from the workers that failed it, and resumes it there.
  absl::Status Migrate(const grpc::Status& why, bool stalled) {
    const std::string& failed = route_.decision.decode_worker;
    if (migrations_ >= max_migrations_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "decode worker ", failed, " failed (", why.error_message(), ") after ", migrations_,
          " migrations, the limit"));
    }
    if (absl::Now() >= deadline_) {
      return absl::DeadlineExceededError(absl::StrCat("decode worker ", failed,
                                                      " failed and the deadline has passed"));
    }
    avoid_.insert(failed);
    placement_.placed_before = true;
    v1::Decode::Stub* stub;
    absl::StatusOr<Route> route = router_->PlaceForRelay(placement_, avoid_, &stub);
    if (!route.ok()) {
      return absl::Status(route.status().code(),
                          absl::StrCat("decode worker ", failed, " failed (", why.error_message(),
                                       ") and the request cannot move: ", route.status().message()));
    }
    ++migrations_;
    Metrics().migrations.Add({{"reason", stalled ? "stream_stalled"
                                         : grpc::StatusCode::CANCELLED == why.error_code()
                                             ? "stream_cancelled"
                                             : "worker_failed"}})
        .Increment();
    LOG(WARNING) << "request " << request_.request_id() << ": decode worker " << failed
                 << " failed (" << why.error_message() << ") after " << generated_.size()
                 << " tokens; moving it to " << route->decision.decode_worker;
    route_ = *std::move(route);
    v1::DecodeRequest resumed = request_;
    *resumed.mutable_prior_output_token_ids() = {generated_.begin(), generated_.end()};
    resumed.clear_prefill_targets();
    for (const auto& [id, address] : route_.prefill) {
      v1::PrefillTarget* t = resumed.add_prefill_targets();
      t->set_worker_id(id);
      t->set_address(address);
    }
    StartAttempt(stub, resumed);
    return absl::OkStatus();
  }

  // The TTFT predicted at placement, from the request's arrival like the observed one: the time
  // it waited in the admission queue before it was placed, then the prediction.
  double PredictedTtftSeconds() const {
    return static_cast<double>(queue_us_) * 1e-6 + prediction_.predicted_ttft_seconds;
  }

  // The TPOT prediction's error, and whether the objectives held (the request's, else those the
  // policy held it against), for a finished request.
  void ObserveSlo(const v1::Timings& t) {
    const int64_t tokens = static_cast<int64_t>(generated_.size());
    const double tpot = tokens > 1 ? (t.e2e_us() - t.ttft_us()) * 1e-6 / static_cast<double>(tokens - 1)
                                   : 0;
    if (prediction_.predicted && prediction_.predicted_tpot_seconds > 0 && tokens > 1) {
      Metrics().tpot_error.Observe((tpot - prediction_.predicted_tpot_seconds) /
                                   prediction_.predicted_tpot_seconds);
    }
    if (migrations_ == 0 && tokens > 1) router_->registry().ObserveTpot(route_, tpot);
    const double ttft_slo = placement_.slo.ttft_ms > 0 ? placement_.slo.ttft_ms * 1e-3
                                                        : prediction_.ttft_slo_seconds;
    const double tpot_slo = placement_.slo.tpot_ms > 0 ? placement_.slo.tpot_ms * 1e-3
                                                        : prediction_.tpot_slo_seconds;
    if (ttft_slo <= 0 && tpot_slo <= 0) return;
    const bool met = (ttft_slo <= 0 || t.ttft_us() * 1e-6 <= ttft_slo) &&
                     (tpot_slo <= 0 || tokens <= 1 || tpot <= tpot_slo);
    const int32_t priority = placement_.priority;
    Metrics()
        .slo
        .Add({{"class", priority < 0 ? "background" : priority == 0 ? "normal" : "high"},
              {"attained", met ? "true" : "false"}})
        .Increment();
  }

  RequestRouter* const router_;
  const v1::DecodeRequest request_;
  ResponseSink* const sink_;
  placement::Request placement_;  // placed_before is set when it moves
  const absl::Time deadline_;
  const int max_migrations_;
  const absl::Time start_;       // arrival at the router
  const int64_t queue_us_;       // in the admission queue
  const placement::Decision prediction_;  // the first placement's

  // Touched by one attempt's thread at a time.
  Route route_;
  std::vector<int32_t> generated_;
  absl::flat_hash_set<std::string> avoid_;
  int migrations_ = 0;
  bool finished_ = false;  // the last response came
  bool first_ = true;
  int64_t ttft_us_ = 0;
  absl::Time last_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<DecodeAttempt> attempt_ ABSL_GUARDED_BY(mu_);
};

void DecodeAttempt::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  Touch(relay_->clock()->Now());
  if (!response_.heartbeat()) relay_->OnResponse(response_);  // a heartbeat only says "alive"
  StartRead(&response_);
}

void DecodeAttempt::OnDone(const grpc::Status& status) {
  Done();
  relay_->OnAttemptDone(status, stalled(), silent_for_ms());
  relay_.reset();
  self_.reset();  // may destroy this
}

}  // namespace

RequestRouter::RequestRouter(const RouterOptions& options, Registry* registry)
    : options_(options), registry_(registry), chat_template_(absl::NotFoundError("no template")) {}

absl::StatusOr<std::unique_ptr<RequestRouter>> RequestRouter::Create(const RouterOptions& options,
                                                                     Registry* registry) {
  auto router = std::unique_ptr<RequestRouter>(new RequestRouter(options, registry));
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(options.model_path));
  ASSIGN_OR_RETURN(router->tokenizer_, TokenizerFromGguf(*file));
  const std::string& jinja = router->tokenizer_->data().chat_template;
  if (!jinja.empty()) router->chat_template_ = ChatTemplate::FromJinja(jinja);
  router->file_model_id_ = std::filesystem::path(options.model_path).stem().string();
  absl::StatusOr<absl::string_view> arch = file->GetString("general.architecture");
  if (arch.ok()) {
    absl::StatusOr<uint32_t> context = file->GetUint32(absl::StrCat(*arch, ".context_length"));
    if (context.ok()) router->file_max_context_ = *context;
  }
  {
    absl::MutexLock lock(&router->mu_);
    ASSIGN_OR_RETURN(router->policy_,
                     placement::CreatePolicy(options.policy, options.policy_options));
    ASSIGN_OR_RETURN(placement::Admission admission, placement::Admission::Create(options.admission));
    router->admission_.emplace(std::move(admission));
  }
  if (options.stream_stall_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the stream stall timeout must be positive");
  }
  RETURN_IF_ERROR(ValidateKeepalive(options.keepalive));
  router->stall_watch_ = std::make_unique<StallWatch>(
      StallWatch::Options{.timeout = options.stream_stall_timeout,
                          .period = std::min(absl::Milliseconds(250), options.stream_stall_timeout / 4),
                          .clock = options.clock});
  router->stall_watch_->Start();
  router->admission_thread_ = std::thread([raw = router.get()] { raw->AdmissionLoop(); });
  return router;
}

std::string RequestRouter::ModelId() {
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  return model.has_value() ? model->model_id : file_model_id_;
}

absl::StatusOr<std::vector<int32_t>> RequestRouter::Encode(const v1::GenerateRequest& r) const {
  switch (r.input_case()) {
    case v1::GenerateRequest::kPrompt:
      return tokenizer_->Encode(r.prompt(), {.add_special = true, .parse_special = true});
    case v1::GenerateRequest::kChat: {
      if (!chat_template_.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the model has no usable chat template: ", chat_template_.status().message()));
      }
      std::vector<ChatMessage> messages;
      for (const v1::ChatMessage& m : r.chat().messages()) {
        if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
          return absl::InvalidArgumentError(
              absl::StrCat("chat role '", m.role(), "' is not system, user or assistant"));
        }
        messages.push_back({m.role(), m.content()});
      }
      if (messages.empty()) return absl::InvalidArgumentError("the chat has no messages");
      const int32_t bos = tokenizer_->bos_id();
      ASSIGN_OR_RETURN(std::string text,
                       chat_template_->Render(messages, {.add_generation_prompt = true,
                                                         .bos_token = bos >= 0
                                                                          ? tokenizer_->TokenBytes(bos)
                                                                          : ""}));
      return tokenizer_->Encode(text, {.add_special = false, .parse_special = true});
    }
    case v1::GenerateRequest::kTokenIds:
      return std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end());
    default:
      return absl::InvalidArgumentError("the request has no prompt, chat or token ids");
  }
}

absl::StatusOr<RequestRouter::Prepared> RequestRouter::Prepare(const v1::GenerateRequest& request) {
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  const std::string model_id = model.has_value() ? model->model_id : file_model_id_;
  if (!request.model().empty() && request.model() != model_id) {
    return absl::NotFoundError(
        absl::StrCat("model '", request.model(), "' does not exist; this cluster serves '",
                     model_id, "'"));
  }
  Prepared p;
  p.request = request;
  ASSIGN_OR_RETURN(p.tokens, Encode(request));
  if (p.tokens.empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int64_t vocab = tokenizer_->vocab_size();
  for (int32_t t : p.tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const int64_t context = model.has_value() ? model->max_context : file_max_context_;
  const sampling::SamplingOptions s = SamplingFromProto(request.sampling());
  if (request.sampling().has_max_tokens() && request.sampling().max_tokens() == 0) {
    return absl::InvalidArgumentError("max_tokens must be at least 1");
  }
  RETURN_IF_ERROR(
      sampling::ValidateSamplingOptions(s, static_cast<int>(vocab), static_cast<int>(context)));
  RETURN_IF_ERROR(sampling::ValidatePromptLength(s, static_cast<int64_t>(p.tokens.size()),
                                                 static_cast<int>(context)));
  if (request.request_id().empty()) {
    static std::atomic<uint64_t> next{1};
    p.request.set_request_id(absl::StrCat("req-", absl::ToUnixMicros(absl::Now()), "-", next++));
  }
  return p;
}

// A request waiting in the admission queue (RequestRouter::Start, AdmissionLoop): it becomes a
// DecodeRelay when it starts, or ends with RESOURCE_EXHAUSTED, or with CANCELLED when its client
// cancels it first.
class QueuedCall final : public RelayedCall {
 public:
  QueuedCall(RequestRouter* router, uint64_t id, RequestRouter::Prepared prepared,
             placement::Request req, ResponseSink* sink, absl::Time arrival, absl::Time deadline)
      : router_(router),
        id_(id),
        prepared_(std::move(prepared)),
        req_(std::move(req)),
        sink_(sink),
        arrival_(arrival),
        deadline_(deadline) {}

  bool queued() const override { return true; }
  const placement::Request& request() const { return req_; }

  void Cancel() override {
    std::shared_ptr<RelayedCall> relay;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      relay = relay_;
    }
    if (relay != nullptr) return relay->Cancel();
    if (router_->RemoveQueued(id_)) {
      sink_->OnDone(absl::CancelledError("the client cancelled the request while it waited"));
    }
    // Else it is starting: Start below sees cancelled_.
  }

  // Out of the queue (by the admission thread, without the router's lock): run it on `route`.
  void Start(Route route, v1::Decode::Stub* stub) {
    Metrics().queue_wait.Observe(absl::ToDoubleSeconds(absl::Now() - arrival_));
    sink_->OnAdmitted();
    std::shared_ptr<RelayedCall> relay =
        router_->StartRelay(std::move(route), stub, prepared_, req_, sink_, arrival_, deadline_);
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      relay_ = relay;
      cancelled = cancelled_;
    }
    if (cancelled) relay->Cancel();
  }

  // Out of the queue, refused.
  void Refuse(const placement::Rejection& r) {
    Metrics().rejections.Add({{"reason", std::string(placement::RejectReasonName(r.reason))}})
        .Increment();
    CountRejected();
    sink_->OnDone(WithRetryAfter(absl::ResourceExhaustedError(r.message), r.retry_after));
  }

 private:
  RequestRouter* const router_;
  const uint64_t id_;
  const RequestRouter::Prepared prepared_;
  const placement::Request req_;
  ResponseSink* const sink_;
  const absl::Time arrival_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<RelayedCall> relay_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<RelayedCall>> RequestRouter::Start(Prepared p, ResponseSink* sink,
                                                                  absl::Time deadline) {
  const absl::Time begin = absl::Now();
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  if (!model.has_value()) return absl::UnavailableError("no decode worker is ready");
  placement::Request req;
  req.prompt_tokens = static_cast<int64_t>(p.tokens.size());
  req.block_size = model->block_size;
  req.block_hashes = HashFullBlocks(ModelIdHash(model->model_id), p.tokens, model->block_size);
  req.priority = p.request.priority();
  req.slo = {.ttft_ms = p.request.slo().ttft_ms(), .tpot_ms = p.request.slo().tpot_ms()};
  req.max_tokens = p.request.sampling().has_max_tokens()
                       ? static_cast<int64_t>(p.request.sampling().max_tokens())
                       : 0;
  if (deadline == absl::InfiniteFuture()) deadline = begin + options_.default_deadline;
  v1::Decode::Stub* stub;
  std::shared_ptr<QueuedCall> queued;
  std::optional<placement::Rejection> displaced;
  absl::StatusOr<Route> route;
  {
    absl::MutexLock lock(&mu_);
    route = PlaceLocked(req, {}, &stub);
    if (!route.ok()) return route.status();
    const uint64_t id = next_admission_id_++;
    absl::StatusOr<placement::Verdict> verdict = admission_->Offer(
        {.id = id, .priority = req.priority, .arrival = begin,
         .prediction = placement::PredictionOf(route->decision)},
        begin);
    if (!verdict.ok()) {
      LOG(WARNING) << "admission: " << verdict.status() << "; admitting the request";
      verdict = placement::Verdict{};
    }
    Metrics().admissions.Add({{"outcome", std::string(placement::OutcomeName(verdict->outcome))}})
        .Increment();
    if (verdict->outcome != placement::Outcome::kAdmit) {
      registry_->Release(*route);  // placed again when it starts
    }
    if (verdict->outcome == placement::Outcome::kReject) {
      Metrics()
          .rejections.Add({{"reason", std::string(placement::RejectReasonName(verdict->reason))}})
          .Increment();
      return WithRetryAfter(absl::ResourceExhaustedError(verdict->message), verdict->retry_after);
    }
    if (verdict->outcome == placement::Outcome::kQueue) {
      req.placed_before = true;  // every later placement of it is a re-placement
      queued = std::make_shared<QueuedCall>(this, id, std::move(p), req, sink, begin, deadline);
      queued_[id] = queued;
      if (verdict->displaced.has_value()) {
        displaced = verdict->displaced;
      }
      Metrics().queued.Set(static_cast<double>(admission_->Size()));
    }
  }
  if (displaced.has_value()) {
    std::shared_ptr<QueuedCall> out;
    {
      absl::MutexLock lock(&mu_);
      auto it = queued_.find(displaced->id);
      if (it != queued_.end()) {
        out = it->second;
        queued_.erase(it);
      }
    }
    if (out != nullptr) out->Refuse(*displaced);
  }
  Metrics().overhead.Observe(absl::ToDoubleSeconds(absl::Now() - begin));
  if (queued != nullptr) return std::shared_ptr<RelayedCall>(queued);
  return StartRelay(*std::move(route), stub, p, req, sink, begin, deadline);
}

std::shared_ptr<RelayedCall> RequestRouter::StartRelay(Route route, v1::Decode::Stub* stub,
                                                       const Prepared& p,
                                                       const placement::Request& req,
                                                       ResponseSink* sink, absl::Time arrival,
                                                       absl::Time deadline) {
  v1::DecodeRequest d;
  d.set_request_id(p.request.request_id());
  d.set_model(p.request.model().empty() ? ModelId() : p.request.model());
  d.mutable_prompt_token_ids()->Add(p.tokens.begin(), p.tokens.end());
  *d.mutable_sampling() = p.request.sampling();
  *d.mutable_slo() = p.request.slo();
  d.set_priority(p.request.priority());
  d.set_omit_text(p.request.omit_text());
  d.set_prefill_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.prefill_timeout)));
  for (const auto& [id, address] : route.prefill) {
    v1::PrefillTarget* t = d.add_prefill_targets();
    t->set_worker_id(id);
    t->set_address(address);
  }
  auto relay = std::make_shared<DecodeRelay>(this, std::move(route), std::move(d), sink, req,
                                             arrival, deadline, options_.max_migrations);
  relay->Begin(stub);
  return relay;
}

bool RequestRouter::RemoveQueued(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (!admission_->Remove(id)) return false;
  queued_.erase(id);
  Metrics().queued.Set(static_cast<double>(admission_->Size()));
  return true;
}

int64_t RequestRouter::QueuedRequests() {
  absl::MutexLock lock(&mu_);
  return admission_->Size();
}

void RequestRouter::AdmissionLoop() {
  while (true) {
    std::vector<std::pair<std::shared_ptr<QueuedCall>, placement::Rejection>> refused;
    std::vector<std::tuple<std::shared_ptr<QueuedCall>, Route, v1::Decode::Stub*>> started;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.admission_poll);
      stopping = stopping_;
      const absl::Time now = absl::Now();
      if (stopping) {
        for (auto& [id, call] : queued_) {
          refused.emplace_back(call, placement::Rejection{
                                         .id = id,
                                         .reason = placement::RejectReason::kExpired,
                                         .message = "the router is shutting down"});
          admission_->Remove(id);
        }
        queued_.clear();
      } else if (admission_->Size() > 0) {
        for (placement::Rejection& r : admission_->PopExpired(now)) {
          auto it = queued_.find(r.id);
          if (it == queued_.end()) continue;
          refused.emplace_back(it->second, std::move(r));
          queued_.erase(it);
        }
        admission_->NextReady(now, [&](const placement::QueuedRequest& q) {
          auto it = queued_.find(q.id);
          if (it == queued_.end()) return false;
          v1::Decode::Stub* stub;
          absl::StatusOr<Route> route = PlaceLocked(it->second->request(), {}, &stub);
          if (!route.ok()) return false;
          if (!admission_->AdmitsQueued(q, placement::PredictionOf(route->decision), now)) {
            registry_->Release(*route);
            return false;
          }
          started.emplace_back(it->second, *std::move(route), stub);
          queued_.erase(it);
          return true;
        });
      }
      Metrics().queued.Set(static_cast<double>(admission_->Size()));
    }
    for (auto& [call, rejection] : refused) call->Refuse(rejection);
    for (auto& [call, route, stub] : started) call->Start(std::move(route), stub);
    if (stopping) return;
  }
}

RequestRouter::~RequestRouter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (admission_thread_.joinable()) admission_thread_.join();
}

absl::StatusOr<Route> RequestRouter::PlaceForRelay(const placement::Request& request,
                                                   const absl::flat_hash_set<std::string>& avoid,
                                                   v1::Decode::Stub** stub) {
  absl::MutexLock lock(&mu_);
  return PlaceLocked(request, avoid, stub);
}

absl::StatusOr<Route> RequestRouter::PlaceLocked(const placement::Request& request,
                                                 const absl::flat_hash_set<std::string>& avoid,
                                                 v1::Decode::Stub** stub) {
  absl::StatusOr<Route> route = registry_->Place(*policy_, request, avoid);
  if (!route.ok()) return route.status();
  Metrics()
      .placements
      .Add({{"policy", std::string(policy_->name())},
            {"prefill", route->decision.local_prefill ? "local" : "remote"},
            {"reason", std::string(placement::PrefillReasonName(route->decision.reason))}})
      .Increment();
  auto& slot = stubs_[route->decode_address];
  if (slot == nullptr) {
    slot = v1::Decode::NewStub(CreateKeepaliveChannel(route->decode_address, options_.keepalive));
  }
  *stub = slot.get();
  return route;
}

absl::StatusOr<v1::TokenizeResponse> RequestRouter::Tokenize(const v1::TokenizeRequest& request) {
  v1::GenerateRequest g;
  g.set_model(request.model());
  if (request.has_chat()) {
    *g.mutable_chat() = request.chat();
  } else {
    g.set_prompt(request.prompt());
  }
  const std::string model_id = ModelId();
  if (!request.model().empty() && request.model() != model_id) {
    return absl::NotFoundError(absl::StrCat("model '", request.model(), "' does not exist"));
  }
  std::vector<int32_t> ids;
  if (request.has_chat()) {
    ASSIGN_OR_RETURN(ids, Encode(g));
  } else {
    ids = tokenizer_->Encode(request.prompt(),
                             {.add_special = request.has_add_special_tokens() ? request.add_special_tokens() : true,
                              .parse_special = true});
  }
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids.begin(), ids.end());
  if (request.return_pieces()) {
    for (int32_t id : ids) response.add_pieces(tokenizer_->TokenBytes(id));
  }
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  response.set_max_model_len(
      static_cast<uint32_t>(model.has_value() ? model->max_context : file_max_context_));
  return response;
}

v1::ListModelsResponse RequestRouter::ListModels() {
  v1::ListModelsResponse response;
  v1::ModelInfo* m = response.add_models();
  m->set_id(ModelId());
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  m->set_max_context(static_cast<uint32_t>(model.has_value() ? model->max_context : file_max_context_));
  m->set_vocab_size(static_cast<uint32_t>(tokenizer_->vocab_size()));
  m->set_owned_by("tandem");
  return response;
}

}  // namespace tandem::router
