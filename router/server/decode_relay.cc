#include "router/server/decode_relay.h"

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/keepalive.h"
#include "common/logging.h"
#include "common/serve.h"
#include "common/status_conversion.h"
#include "proto/conversion.h"
#include "router/server/planner_advisor.h"
#include "router/server/router_metrics.h"
#include "router/server/stall_watch.h"

namespace tandem::router {
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
  DecodeAttempt(std::shared_ptr<DecodeRelay> relay, absl::Time now, DecodeStreams* streams)
      : Stream(now), lease_(streams), relay_(std::move(relay)) {}

  void Begin(v1::Decode::Stub* stub, const v1::DecodeRequest& request, const TraceContext& trace,
             absl::Time deadline, std::shared_ptr<DecodeAttempt> self, StallWatch& watch) {
    self_ = self;
    watch.Add(std::move(self));
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
    AddTraceMetadata(trace, &context_);
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
  // The worker ended the stream because it drains (kDrainingMetadataKey). Valid in OnDone.
  bool handed_off() const {
    const auto& trailers = context_.GetServerTrailingMetadata();
    return trailers.find(kDrainingMetadataKey) != trailers.end();
  }
  int64_t silent_for_ms() const { return silent_for_ms_.load(std::memory_order_relaxed); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Declared first, so released last: after context_ (the call) is destroyed.
  const DecodeStreams::Lease lease_;
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
  DecodeRelay(RelayHost* host, RelayedRequest relayed, ResponseSink* sink)
      : host_(host),
        request_(std::move(relayed.request)),
        trace_(std::move(relayed.trace)),
        sink_(sink),
        placement_(std::move(relayed.placement)),
        deadline_(relayed.deadline),
        max_migrations_(relayed.max_migrations),
        start_(relayed.arrival),
        queue_us_(absl::ToInt64Microseconds(host->clock()->Now() - relayed.arrival)),
        prediction_(relayed.route.decision),
        route_(std::move(relayed.route)) {}

  void Begin(v1::Decode::Stub* stub) {
    LogPlacement();
    StartAttempt(stub, request_);
  }
  Clock* clock() const { return host_->clock(); }

  void Cancel() override {
    std::shared_ptr<DecodeAttempt> attempt;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      attempt = attempt_;
    }
    if (attempt != nullptr) attempt->Cancel();  // else the last attempt ended: nothing to cancel
  }

  // On the attempt's gRPC thread; attempts run one at a time, so the fields below are only
  // touched by one thread at a time.
  void OnResponse(const v1::DecodeResponse& response) {
    v1::GenerateResponse out;
    out.set_request_id(request_.request_id());
    *out.mutable_token_ids() = response.token_ids();
    out.set_text(response.text());
    *out.mutable_logprobs() = response.logprobs();
    *out.mutable_prompt_logprobs() = response.prompt_logprobs();
    out.set_finish_reason(response.finish_reason());
    out.set_error_message(response.error_message());
    if (response.has_usage()) *out.mutable_usage() = response.usage();
    generated_.insert(generated_.end(), response.token_ids().begin(), response.token_ids().end());
    const absl::Time now = clock()->Now();
    if (response.token_ids_size() > 0) {
      host_->registry().Progress(route_, response.token_ids_size(), now);
      if (first_) {
        host_->registry().PromptDone(route_);
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
          host_->registry().ObserveTtft(
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
      if (const v1::Timings& t = response.timings(); !t.prefill_worker().empty()) {
        prefilled_on_ =
            absl::StrCat(t.prefill_worker(), t.remote_prefill() ? " (remote)" : " (local)");
      }
      v1::Timings* t = out.mutable_timings();
      *t = response.timings();
      t->set_ttft_us(static_cast<uint64_t>(ttft_us_));
      t->set_e2e_us(MicrosForProto(now - start_));
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
        host_->registry().ObserveTransfer(
            response.timings().prefill_worker(), response.timings().decode_worker(), moved,
            static_cast<double>(transfer_us > compute_us ? transfer_us - compute_us : 0) * 1e-6);
      }
      if (response.finish_reason() != v1::FINISH_REASON_ERROR) ObserveSlo(*t);
    }
    sink_->OnResponse(out);
  }

  // `stalled`: the router cancelled the stream because the worker had been silent for
  // `silent_for_ms` (StallWatch); `status` then says CANCELLED. `handed_off`: the worker drains
  // and refused or ended the stream (a planned move, not a failure). The relay no longer holds
  // `attempt`: its call goes when its OnDone returns, however long the frontend holds the relay.
  void OnAttemptDone(const DecodeAttempt* attempt, grpc::Status status, bool stalled,
                     int64_t silent_for_ms, bool handed_off) {
    host_->registry().Release(route_);
    bool cancelled;
    std::shared_ptr<DecodeAttempt> ended;  // released outside the lock; its self_ still holds it
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
      if (attempt_.get() == attempt) ended = std::move(attempt_);
    }
    if (!status.ok() && !cancelled && !finished_ && !handed_off) {
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
      const absl::Status moved = Migrate(status, stalled, handed_off);
      if (stalled) {
        Metrics().stalled.Add({{"outcome", moved.ok() ? "migrated" : "failed"}}).Increment();
      }
      if (moved.ok()) return;
      LOG(WARNING) << TraceTag(trace_) << "request " << request_.request_id() << ": " << moved;
      // The worker is lost and the request cannot go on elsewhere: say why, retryable.
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(moved.message()));
    }
    const char* outcome = status.ok()                                        ? "ok"
                          : status.error_code() == grpc::StatusCode::CANCELLED ? "cancelled"
                                                                               : "error";
    Metrics().requests.Add({{"outcome", outcome}}).Increment();
    const absl::Duration e2e = clock()->Now() - start_;
    if (status.ok()) {
      Metrics().e2e.Observe(absl::ToDoubleSeconds(e2e));
      Metrics().vllm_e2e.Observe(absl::ToDoubleSeconds(e2e));
    }
    const absl::Status end = FromGrpcStatus(status);
    LogEnd(end, outcome, e2e);
    sink_->OnDone(end);
  }

 private:
  void StartAttempt(v1::Decode::Stub* stub, const v1::DecodeRequest& request) {
    auto attempt = std::make_shared<DecodeAttempt>(shared_from_this(), clock()->Now(),
                                                   &host_->decode_streams());
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      attempt_ = attempt;
      cancelled = cancelled_;
    }
    attempt->Begin(stub, request, trace_, deadline_, attempt, host_->stall_watch());
    if (cancelled) attempt->Cancel();  // Cancel() saw the previous attempt
  }

  // The request's first INFO line: where it was placed (a move has its own WARNING line).
  void LogPlacement() const {
    std::string prefill;
    for (const auto& [id, address] : route_.prefill) {
      absl::StrAppend(&prefill, prefill.empty() ? "prefill on " : ", then ", id);
    }
    std::string queued;
    if (queue_us_ >= 1000) {
      queued = absl::StrCat(", after ", queue_us_ / 1000, " ms in the admission queue");
    }
    LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id()
              << ": placed on decode worker " << route_.decision.decode_worker << ", "
              << (prefill.empty() ? "prefill there" : prefill) << "; "
              << request_.prompt_token_ids_size() << " prompt tokens, "
              << route_.decision.decode_cached_tokens << " cached there" << queued
              << ParentOf(trace_);
  }

  // The request's last INFO line: how it ended, its tokens, where it was prefilled, latencies.
  void LogEnd(const absl::Status& end, const char* outcome, absl::Duration e2e) const {
    LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": " << outcome
              << (end.ok() ? "" : absl::StrCat(" (", end.ToString(), ")")) << "; "
              << request_.prompt_token_ids_size() << " prompt + " << generated_.size()
              << " completion tokens, decode worker " << route_.decision.decode_worker
              << (prefilled_on_.empty() ? "" : absl::StrCat(", prefill on ", prefilled_on_))
              << ", ttft " << ttft_us_ / 1000 << " ms, e2e " << absl::ToInt64Milliseconds(e2e)
              << " ms, " << migrations_ << (migrations_ == 1 ? " migration" : " migrations");
  }

  // Places the request again, away from the workers that failed it, and resumes it there.
  absl::Status Migrate(const grpc::Status& why, bool stalled, bool handed_off) {
    const std::string& failed = route_.decision.decode_worker;
    if (migrations_ >= max_migrations_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "decode worker ", failed, " failed (", why.error_message(), ") after ", migrations_,
          " migrations, the limit"));
    }
    if (absl::Now() >= deadline_) {  // gRPC's deadlines are on the system clock
      return absl::DeadlineExceededError(absl::StrCat("decode worker ", failed,
                                                      " failed and the deadline has passed"));
    }
    avoid_.insert(failed);
    placement_.placed_before = true;
    v1::Decode::Stub* stub;
    absl::StatusOr<Route> route = host_->PlaceForRelay(placement_, avoid_, &stub);
    if (!route.ok()) {
      return absl::Status(route.status().code(),
                          absl::StrCat("decode worker ", failed, " failed (", why.error_message(),
                                       ") and the request cannot move: ", route.status().message()));
    }
    ++migrations_;
    Metrics().migrations.Add({{"reason", stalled      ? "stream_stalled"
                                         : handed_off ? "worker_draining"
                                         : grpc::StatusCode::CANCELLED == why.error_code()
                                             ? "stream_cancelled"
                                             : "worker_failed"}})
        .Increment();
    if (handed_off) {
      LOG(INFO) << TraceTag(trace_) << "request " << request_.request_id() << ": decode worker "
                << failed << " is draining and handed the request off after " << generated_.size()
                << " tokens; moving it to " << route->decision.decode_worker;
    } else {
      LOG(WARNING) << TraceTag(trace_) << "request " << request_.request_id() << ": decode worker "
                   << failed << " failed (" << why.error_message() << ") after "
                   << generated_.size() << " tokens; moving it to " << route->decision.decode_worker;
    }
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
    if (migrations_ == 0 && tokens > 1) host_->registry().ObserveTpot(route_, tpot);
    const double ttft_slo = placement_.slo.ttft_ms > 0 ? placement_.slo.ttft_ms * 1e-3
                                                        : prediction_.ttft_slo_seconds;
    const double tpot_slo = placement_.slo.tpot_ms > 0 ? placement_.slo.tpot_ms * 1e-3
                                                        : prediction_.tpot_slo_seconds;
    const bool met = (ttft_slo <= 0 || t.ttft_us() * 1e-6 <= ttft_slo) &&
                     (tpot_slo <= 0 || tokens <= 1 || tpot <= tpot_slo);
    if (ObservedWorkload* w = RouterWorkload()) {
      w->Finished(placement_.prompt_tokens, tokens, ttft_slo, tpot_slo, met);
    }
    if (ttft_slo <= 0 && tpot_slo <= 0) return;
    const int32_t priority = placement_.priority;
    Metrics()
        .slo
        .Add({{"class", priority < 0 ? "background" : priority == 0 ? "normal" : "high"},
              {"attained", met ? "true" : "false"}})
        .Increment();
  }

  RelayHost* const host_;
  const v1::DecodeRequest request_;
  const TraceContext trace_;  // the router's span: the same for every attempt
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
  std::string prefilled_on_;  // "<worker id> (remote|local)", from the last response's timings

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The attempt running now; null once it ended and no other started.
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
  relay_->OnAttemptDone(this, status, stalled(), silent_for_ms(), handed_off());
  relay_.reset();
  self_.reset();  // may destroy this
}

}  // namespace

std::shared_ptr<RelayedCall> StartDecodeRelay(RelayHost* host, RelayedRequest relayed,
                                              ResponseSink* sink) {
  v1::Decode::Stub* stub = relayed.stub;
  auto relay = std::make_shared<DecodeRelay>(host, std::move(relayed), sink);
  relay->Begin(stub);
  return relay;
}

}  // namespace tandem::router
