#include "router/server/in_flight.h"

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

// A frontend's sink: what it was given.
class RecordingSink final : public ResponseSink {
 public:
  void OnResponse(const v1::GenerateResponse& response) override { responses.push_back(response); }
  void OnDone(const absl::Status& status) override { end = status; }
  void OnAdmitted() override { ++admitted; }

  std::vector<v1::GenerateResponse> responses;
  std::optional<absl::Status> end;
  int admitted = 0;
};

// A request's relay: counts its cancellations; with `end_on_cancel`, ends its sink with
// CANCELLED at once (as a queued request does).
class FakeCall final : public RelayedCall {
 public:
  explicit FakeCall(ResponseSink* sink, bool end_on_cancel = false)
      : sink_(sink), end_on_cancel_(end_on_cancel) {}
  void Cancel() override {
    ++cancels;
    if (end_on_cancel_ && !ended_) End(absl::CancelledError("cancelled"));
  }
  void End(const absl::Status& status) {
    ended_ = true;
    sink_->OnDone(status);
  }
  int cancels = 0;

 private:
  ResponseSink* const sink_;
  const bool end_on_cancel_;
  bool ended_ = false;
};

TEST(InFlightRequestsTest, ARequestPassesItsResponsesAndEndOnAndThenLeaves) {
  InFlightRequests in_flight;
  RecordingSink sink;
  absl::StatusOr<std::shared_ptr<InFlightRequests::Entry>> entry = in_flight.Enter(&sink);
  ASSERT_TRUE(entry.ok()) << entry.status();
  auto call = std::make_shared<FakeCall>(entry->get());
  in_flight.Started(**entry, call);
  EXPECT_EQ(in_flight.size(), 1);
  EXPECT_FALSE(in_flight.AwaitIdle(absl::Now()));

  v1::GenerateResponse r;
  r.add_token_ids(7);
  (*entry)->OnAdmitted();
  (*entry)->OnResponse(r);
  call->End(absl::OkStatus());
  ASSERT_EQ(sink.responses.size(), 1u);
  EXPECT_EQ(sink.responses[0].token_ids(0), 7);
  EXPECT_EQ(sink.admitted, 1);
  ASSERT_TRUE(sink.end.has_value());
  EXPECT_TRUE(sink.end->ok());
  EXPECT_EQ(in_flight.size(), 0);
  EXPECT_TRUE(in_flight.AwaitIdle(absl::Now()));
}

TEST(InFlightRequestsTest, ARequestThatDidNotStartLeavesWhenAbandoned) {
  InFlightRequests in_flight;
  RecordingSink sink;
  absl::StatusOr<std::shared_ptr<InFlightRequests::Entry>> entry = in_flight.Enter(&sink);
  ASSERT_TRUE(entry.ok());
  in_flight.Abandon(**entry);
  EXPECT_EQ(in_flight.size(), 0);
  EXPECT_FALSE(sink.end.has_value());
}

TEST(InFlightRequestsTest, ADrainRefusesNewRequestsAndWaitsForThoseInFlight) {
  InFlightRequests in_flight;
  RecordingSink first, second, late;
  auto a = in_flight.Enter(&first);
  auto b = in_flight.Enter(&second);
  ASSERT_TRUE(a.ok() && b.ok());
  auto call_a = std::make_shared<FakeCall>(a->get());
  auto call_b = std::make_shared<FakeCall>(b->get());
  in_flight.Started(**a, call_a);
  in_flight.Started(**b, call_b);

  EXPECT_FALSE(in_flight.draining());
  EXPECT_EQ(in_flight.StartDrain(), 2);
  EXPECT_TRUE(in_flight.draining());
  absl::StatusOr<std::shared_ptr<InFlightRequests::Entry>> refused = in_flight.Enter(&late);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(), "router is draining");
  EXPECT_EQ(RetryAfter(refused.status()), absl::Seconds(1));
  EXPECT_FALSE(late.end.has_value());

  // The requests in flight go on, untouched.
  call_a->End(absl::OkStatus());
  EXPECT_FALSE(in_flight.AwaitIdle(absl::Now()));
  EXPECT_EQ(call_b->cancels, 0);
  // The last end wakes a waiter.
  std::thread ender([&] { call_b->End(absl::OkStatus()); });
  EXPECT_TRUE(in_flight.AwaitIdle(absl::InfiniteFuture()));
  ender.join();
  EXPECT_TRUE(first.end->ok());
  EXPECT_TRUE(second.end->ok());
}

TEST(InFlightRequestsTest, ACutCancelsWhatRunsAndItEndsWithUnavailable) {
  for (const bool end_on_cancel : {false, true}) {
    SCOPED_TRACE(end_on_cancel ? "ends inside Cancel" : "ends later");
    InFlightRequests in_flight;
    RecordingSink sink;
    auto entry = in_flight.Enter(&sink);
    ASSERT_TRUE(entry.ok());
    auto call = std::make_shared<FakeCall>(entry->get(), end_on_cancel);
    in_flight.Started(**entry, call);
    in_flight.StartDrain();
    EXPECT_EQ(in_flight.Cut(), 1);
    EXPECT_EQ(call->cancels, 1);
    if (!end_on_cancel) call->End(absl::CancelledError("cancelled"));
    ASSERT_TRUE(sink.end.has_value());
    EXPECT_EQ(sink.end->code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(sink.end->message(),
              "router is draining: the request was cut as the drain ended");
    EXPECT_EQ(RetryAfter(*sink.end), absl::Seconds(1));
    EXPECT_EQ(in_flight.size(), 0);
    EXPECT_EQ(in_flight.Cut(), 0);
  }
}

TEST(InFlightRequestsTest, ARequestThatEndedWellAsItWasCutKeepsItsOk) {
  InFlightRequests in_flight;
  RecordingSink sink;
  auto entry = in_flight.Enter(&sink);
  ASSERT_TRUE(entry.ok());
  auto call = std::make_shared<FakeCall>(entry->get());
  in_flight.Started(**entry, call);
  in_flight.Cut();
  call->End(absl::OkStatus());
  ASSERT_TRUE(sink.end.has_value());
  EXPECT_TRUE(sink.end->ok());
}

TEST(InFlightRequestsTest, ARequestCutBeforeItStartedIsCancelledAsItStarts) {
  InFlightRequests in_flight;
  RecordingSink sink;
  auto entry = in_flight.Enter(&sink);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(in_flight.Cut(), 1);
  auto call = std::make_shared<FakeCall>(entry->get(), /*end_on_cancel=*/true);
  in_flight.Started(**entry, call);
  EXPECT_EQ(call->cancels, 1);
  ASSERT_TRUE(sink.end.has_value());
  EXPECT_EQ(sink.end->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(in_flight.size(), 0);
}

}  // namespace
}  // namespace tandem::router
