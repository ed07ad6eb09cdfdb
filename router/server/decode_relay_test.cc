// The decode relay against fake decode workers: real gRPC servers on loopback (port 0) that play
// a script of responses and then end the stream, fail it, or hold it open in silence. A request
// whose worker fails moves to another with the tokens so far, and the client sees every token
// once, in order.
#include "router/server/decode_relay.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/serve.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// How a fake decode worker's stream ends once its responses are sent.
// kHandOff: UNAVAILABLE with the trailing metadata of a draining worker.
enum class End { kFinish, kFail, kFailWithBadRequest, kHang, kHandOff };

// A decode worker that answers every Generate with `responses`, then ends as `end` says, and
// keeps the requests it was sent.
class FakeDecode final : public v1::Decode::CallbackService {
 public:
  FakeDecode(std::vector<v1::DecodeResponse> responses, End end)
      : responses_(std::move(responses)), end_(end) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    stub_ = v1::Decode::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  ~FakeDecode() override { server_->Shutdown(std::chrono::system_clock::now()); }

  grpc::ServerWriteReactor<v1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::DecodeRequest* request) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
      std::string trace;
      for (const char* key : {"traceparent", "tracestate"}) {
        for (auto [it, end] = context->client_metadata().equal_range(key); it != end; ++it) {
          absl::StrAppend(&trace, trace.empty() ? "" : " ",
                          absl::string_view(it->second.data(), it->second.size()));
        }
      }
      traces_.push_back(trace);
    }
    return new Stream(this, context);
  }

  v1::Decode::Stub* stub() { return stub_.get(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<v1::DecodeRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Each request's traceparent and tracestate metadata, joined by a space.
  std::vector<std::string> traces() {
    absl::MutexLock lock(&mu_);
    return traces_;
  }

 private:
  // Reactions may run on several threads at once (OnCancel beside OnWriteDone); OnDone comes
  // only after every other reaction has returned.
  class Stream final : public grpc::ServerWriteReactor<v1::DecodeResponse> {
   public:
    Stream(FakeDecode* service, grpc::CallbackServerContext* context)
        : service_(service), context_(context) {
      absl::MutexLock lock(&mu_);
      NextLocked();
    }
    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) return FinishLocked(grpc::Status::CANCELLED);
      NextLocked();
    }
    void OnCancel() override {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_) FinishLocked(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (next_ < service_->responses_.size()) {
        writing_ = true;
        return StartWrite(&service_->responses_[next_++]);
      }
      switch (service_->end_) {
        case End::kFinish:
          return FinishLocked(grpc::Status::OK);
        case End::kFail:
          return FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker died"));
        case End::kFailWithBadRequest:
          return FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad sampling"));
        case End::kHang:
          return;  // silent until the client cancels
        case End::kHandOff:
          context_->AddTrailingMetadata(kDrainingMetadataKey, "1");
          return FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "decode worker decode-a is draining; stream handed off"));
      }
    }
    void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_) return;
      finished_ = true;
      Finish(status);
    }

    FakeDecode* const service_;
    grpc::CallbackServerContext* const context_;
    absl::Mutex mu_;
    size_t next_ ABSL_GUARDED_BY(mu_) = 0;
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  const std::vector<v1::DecodeResponse> responses_;
  const End end_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Decode::Stub> stub_;
  absl::Mutex mu_;
  std::vector<v1::DecodeRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> traces_ ABSL_GUARDED_BY(mu_);
};

v1::DecodeResponse Tokens(std::vector<int32_t> ids) {
  v1::DecodeResponse r;
  r.mutable_token_ids()->Add(ids.begin(), ids.end());
  return r;
}
v1::DecodeResponse Heartbeat() {
  v1::DecodeResponse r;
  r.set_heartbeat(true);
  return r;
}
v1::DecodeResponse Last(std::vector<int32_t> ids) {
  v1::DecodeResponse r = Tokens(std::move(ids));
  r.set_finish_reason(v1::FINISH_REASON_LENGTH);
  r.mutable_timings();
  return r;
}

// The client's side: every response and the end, with a wait for either.
class RecordingSink final : public ResponseSink {
 public:
  void OnResponse(const v1::GenerateResponse& response) override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(status_.has_value()) << "a response after OnDone";
    responses_.push_back(response);
  }
  void OnDone(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(status_.has_value()) << "OnDone twice";
    status_ = status;
  }

  absl::Status AwaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* s) { return s->has_value(); }, &status_));
    return *status_;
  }
  void AwaitTokens(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return TokensLocked().size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<int32_t> tokens() {
    absl::MutexLock lock(&mu_);
    return TokensLocked();
  }
  std::vector<v1::GenerateResponse> responses() {
    absl::MutexLock lock(&mu_);
    return responses_;
  }

 private:
  std::vector<int32_t> TokensLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int32_t> out;
    for (const v1::GenerateResponse& r : responses_) {
      out.insert(out.end(), r.token_ids().begin(), r.token_ids().end());
    }
    return out;
  }
  absl::Mutex mu_;
  std::vector<v1::GenerateResponse> responses_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
};

// The value of the process's series `name` whose one label has `label_value` (0 when absent).
double MetricValue(absl::string_view name, absl::string_view label_value) {
  const std::string text = SerializeMetrics(ProcessMetrics());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, absl::StrCat(name, "{")) &&
        absl::StrContains(line, absl::StrCat("=\"", label_value, "\"}"))) {
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) << line;
      return value;
    }
  }
  return 0;
}

Route RouteTo(const std::string& worker_id, const std::string& address) {
  Route route;
  route.decision.decode_worker = worker_id;
  route.decode_address = address;
  return route;
}

RegistryOptions NoWorkers() {
  RegistryOptions options;
  options.liveness_timeout = absl::InfiniteDuration();
  return options;
}

// The router's side: a fake clock, a stall watch the test checks itself, a registry without
// workers (its bookkeeping of unknown routes does nothing), and placements from a list.
class FakeHost final : public RelayHost {
 public:
  FakeHost() : registry_(NoWorkers()) {}

  // The routes PlaceForRelay gives, in order; then UNAVAILABLE.
  void AddPlacement(Route route, v1::Decode::Stub* stub) {
    absl::MutexLock lock(&mu_);
    placements_.emplace_back(std::move(route), stub);
  }
  std::vector<absl::flat_hash_set<std::string>> avoided() {
    absl::MutexLock lock(&mu_);
    return avoided_;
  }

  absl::StatusOr<Route> PlaceForRelay(const placement::Request& request,
                                      const absl::flat_hash_set<std::string>& avoid,
                                      v1::Decode::Stub** stub) override {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(request.placed_before);
    avoided_.push_back(avoid);
    if (placements_.empty()) return absl::UnavailableError("no decode worker is ready");
    Route route = std::move(placements_.front().first);
    *stub = placements_.front().second;
    placements_.erase(placements_.begin());
    return route;
  }
  Registry& registry() override { return registry_; }
  StallWatch& stall_watch() override { return watch_; }
  Clock* clock() const override { return &clock_; }
  DecodeStreams& decode_streams() override { return streams_; }

  mutable FakeClock clock_;
  StallWatch watch_{{.timeout = absl::Seconds(6), .clock = &clock_}};
  DecodeStreams streams_;

 private:
  Registry registry_;
  absl::Mutex mu_;
  std::vector<std::pair<Route, v1::Decode::Stub*>> placements_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::flat_hash_set<std::string>> avoided_ ABSL_GUARDED_BY(mu_);
};

class DecodeRelayTest : public ::testing::Test {
 protected:
  // Starts the request on `worker` (worker id "decode-a").
  std::shared_ptr<RelayedCall> Start(FakeDecode& worker, int max_migrations = 2) {
    v1::DecodeRequest request;
    request.set_request_id("req-1");
    request.add_prompt_token_ids(7);
    request.add_prompt_token_ids(8);
    return StartDecodeRelay(&host_,
                            {.route = RouteTo("decode-a", worker.address()),
                             .stub = worker.stub(),
                             .request = request,
                             .trace = trace_,
                             .placement = {.prompt_tokens = 2, .block_size = 16},
                             .arrival = host_.clock_.Now(),
                             .max_migrations = max_migrations},
                            &sink_);
  }

  // The router's span of the request.
  const TraceContext trace_ =
      *TraceContext::Parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v");
  FakeHost host_;
  RecordingSink sink_;
};

TEST_F(DecodeRelayTest, ARequestRelaysEveryTokenButHeartbeats) {
  FakeDecode a({Tokens({1}), Heartbeat(), Tokens({2, 3}), Last({4})}, End::kFinish);
  Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(sink_.responses().size(), 3u);
  EXPECT_EQ(sink_.responses().back().request_id(), "req-1");
  EXPECT_EQ(sink_.responses().back().timings().migrations(), 0u);
  EXPECT_THAT(host_.avoided(), IsEmpty());
}

TEST_F(DecodeRelayTest, AWorkerThatFailsMidStreamHandsTheRequestOnWithTheTokensSoFar) {
  FakeDecode a({Tokens({1}), Heartbeat(), Tokens({2, 3})}, End::kFail);
  FakeDecode b({Tokens({4}), Tokens({5}), Last({6})}, End::kFinish);
  Route to_b = RouteTo("decode-b", b.address());
  to_b.prefill = {{"prefill-x", "10.0.0.9:7100"}};
  host_.AddPlacement(to_b, b.stub());
  Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());

  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2, 3, 4, 5, 6));  // none lost, none twice
  EXPECT_EQ(sink_.responses().back().timings().migrations(), 1u);
  ASSERT_EQ(host_.avoided().size(), 1u);
  EXPECT_THAT(host_.avoided()[0], ElementsAre("decode-a"));
  const std::vector<v1::DecodeRequest> resumed = b.requests();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].request_id(), "req-1");
  EXPECT_THAT(resumed[0].prompt_token_ids(), ElementsAre(7, 8));
  EXPECT_THAT(resumed[0].prior_output_token_ids(), ElementsAre(1, 2, 3));
  ASSERT_EQ(resumed[0].prefill_targets_size(), 1);  // the new route's prefill workers
  EXPECT_EQ(resumed[0].prefill_targets(0).worker_id(), "prefill-x");
  EXPECT_THAT(a.requests()[0].prior_output_token_ids(), IsEmpty());
}

TEST_F(DecodeRelayTest, EveryAttemptSendsTheRoutersSpanAsItsDecodeWorkersParent) {
  FakeDecode a({Tokens({1})}, End::kFail);
  FakeDecode b({Last({2})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  // The moved request goes on in the same trace, under the same parent.
  const std::string sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 k=v";
  EXPECT_THAT(a.traces(), ElementsAre(sent));
  EXPECT_THAT(b.traces(), ElementsAre(sent));
}

// A draining worker that hands its stream off (or refuses it): the request moves like one whose
// worker failed, but is counted as a planned move, not as a broken stream.
TEST_F(DecodeRelayTest, AStreamHandedOffByADrainingWorkerMovesWithoutCountingAFailure) {
  const double drained_before = MetricValue("tandem_router_migrations_total", "worker_draining");
  const double failed_before = MetricValue("tandem_router_migrations_total", "worker_failed");
  const double broken_before = MetricValue("tandem_router_decode_stream_failures_total", "other");
  FakeDecode a({Tokens({1}), Tokens({2})}, End::kHandOff);
  FakeDecode b({Tokens({3}), Last({4})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());

  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(sink_.responses().back().timings().migrations(), 1u);
  ASSERT_EQ(b.requests().size(), 1u);
  EXPECT_THAT(b.requests()[0].prior_output_token_ids(), ElementsAre(1, 2));
  EXPECT_EQ(MetricValue("tandem_router_migrations_total", "worker_draining"), drained_before + 1);
  EXPECT_EQ(MetricValue("tandem_router_migrations_total", "worker_failed"), failed_before);
  EXPECT_EQ(MetricValue("tandem_router_decode_stream_failures_total", "other"), broken_before);
}

TEST_F(DecodeRelayTest, ARequestMovesAsOftenAsAllowedAndAvoidsEveryFailedWorker) {
  FakeDecode a({Tokens({1})}, End::kFail);
  FakeDecode b({Tokens({2})}, End::kFail);
  FakeDecode c({Last({3})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  host_.AddPlacement(RouteTo("decode-c", c.address()), c.stub());
  Start(a, /*max_migrations=*/2);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2, 3));
  ASSERT_EQ(host_.avoided().size(), 2u);
  EXPECT_THAT(host_.avoided()[1], UnorderedElementsAre("decode-a", "decode-b"));
  EXPECT_THAT(c.requests()[0].prior_output_token_ids(), ElementsAre(1, 2));
}

TEST_F(DecodeRelayTest, PastTheMigrationLimitTheClientGetsUnavailable) {
  FakeDecode a({Tokens({1})}, End::kFail);
  Start(a, /*max_migrations=*/0);
  const absl::Status status = sink_.AwaitDone();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("after 0 migrations, the limit"));
  EXPECT_THAT(sink_.tokens(), ElementsAre(1));
  EXPECT_THAT(host_.avoided(), IsEmpty());
}

TEST_F(DecodeRelayTest, WithNowhereToMoveTheClientGetsUnavailable) {
  FakeDecode a({Tokens({1})}, End::kFail);
  Start(a);
  const absl::Status status = sink_.AwaitDone();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("the request cannot move"));
  EXPECT_EQ(host_.avoided().size(), 1u);
}

TEST_F(DecodeRelayTest, AnErrorAboutTheRequestItselfDoesNotMove) {
  FakeDecode a({Tokens({1})}, End::kFailWithBadRequest);
  FakeDecode b({Last({2})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  Start(a);
  EXPECT_EQ(sink_.AwaitDone().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host_.avoided(), IsEmpty());
  EXPECT_THAT(b.requests(), IsEmpty());
}

TEST_F(DecodeRelayTest, ASilentWorkerIsLeftAfterTheStallTimeout) {
  FakeDecode a({Tokens({1}), Tokens({2})}, End::kHang);
  FakeDecode b({Last({3})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  Start(a);
  sink_.AwaitTokens(2);  // what A sent has come; from here A says nothing
  host_.clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(host_.watch_.Check(), 0);  // silent for exactly the timeout: not yet
  host_.clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(host_.watch_.Check(), 1);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2, 3));
  EXPECT_THAT(b.requests()[0].prior_output_token_ids(), ElementsAre(1, 2));
}

TEST_F(DecodeRelayTest, ACancelledRequestEndsWithoutMoving) {
  FakeDecode a({Tokens({1})}, End::kHang);
  FakeDecode b({Last({2})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  std::shared_ptr<RelayedCall> call = Start(a);
  sink_.AwaitTokens(1);
  call->Cancel();
  EXPECT_EQ(sink_.AwaitDone().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(host_.avoided(), IsEmpty());
  EXPECT_THAT(b.requests(), IsEmpty());
}

// The router waits for DecodeStreams to be empty before its stubs' channels go (a sink's OnDone
// comes while the call is still open). So a call must be gone once the request ended, even while
// its frontend still holds the relay, as frontends do until their reply is written.
TEST_F(DecodeRelayTest, ARequestsCallIsGoneOnceItEndedWhileItsFrontendStillHoldsTheRelay) {
  FakeDecode a({Tokens({1}), Last({2})}, End::kFinish);
  std::shared_ptr<RelayedCall> call = Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  // Returns at once when the call is gone; the bound only keeps a failure from hanging.
  EXPECT_TRUE(host_.streams_.AwaitNone(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(host_.streams_.open(), 0);
  call->Cancel();  // after the end: nothing left to cancel
  EXPECT_EQ(sink_.responses().size(), 2u);
}

// The same for a request that moved: the call of every attempt is gone.
TEST_F(DecodeRelayTest, EveryAttemptsCallIsGoneOnceAMovedRequestEnded) {
  FakeDecode a({Tokens({1})}, End::kFail);
  FakeDecode b({Last({2})}, End::kFinish);
  host_.AddPlacement(RouteTo("decode-b", b.address()), b.stub());
  std::shared_ptr<RelayedCall> call = Start(a);
  ASSERT_TRUE(sink_.AwaitDone().ok());
  EXPECT_THAT(sink_.tokens(), ElementsAre(1, 2));
  EXPECT_TRUE(host_.streams_.AwaitNone(absl::Now() + absl::Seconds(30)));
}

}  // namespace
}  // namespace tandem::router
