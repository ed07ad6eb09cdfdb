#include "router/server/admission_queue.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A cluster of `slots` request slots. A placement takes one; its prediction meets the objectives
// (headroom 0.5) when a slot was free, else misses them (headroom -0.5, a 2 s predicted wait).
// Records what the queue did with each request, in order.
class FakeCluster {
 public:
  explicit FakeCluster(int slots) : free_(slots) {}

  void Free(int slots) {
    absl::MutexLock lock(&mu_);
    free_ += slots;
  }
  int placed() {
    absl::MutexLock lock(&mu_);
    return placed_;
  }
  std::vector<std::string> started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  // Blocks until `n` requests have started.
  void AwaitStarted(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return started_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }

  // Placement fails (no worker) while set.
  bool unreachable = false;
  // The predictions' TTFT objective (0: none) and predicted TTFT without a free slot.
  double ttft_slo_seconds = 0;
  double ttft_seconds = 0;

 private:
  friend class FakeRequest;
  absl::StatusOr<placement::SloPrediction> Place() {
    absl::MutexLock lock(&mu_);
    if (unreachable) return absl::UnavailableError("no decode worker is ready");
    const bool fits = placed_ < free_;
    ++placed_;
    return placement::SloPrediction{.predicted = true,
                                    .ttft_seconds = ttft_seconds,
                                    .wait_seconds = fits ? 0.0 : 2.0,
                                    .headroom = fits ? 0.5 : -0.5,
                                    .meets_slo = fits,
                                    .ttft_slo_seconds = ttft_slo_seconds};
  }
  void Unplace() {
    absl::MutexLock lock(&mu_);
    --placed_;
  }
  void Started(const std::string& name) {
    absl::MutexLock lock(&mu_);
    started_.push_back(name);
  }

  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  int placed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> started_ ABSL_GUARDED_BY(mu_);
};

class FakeRequest final : public WaitingRequest {
 public:
  FakeRequest(FakeCluster* cluster, std::string name) : cluster_(cluster), name_(std::move(name)) {}

  absl::StatusOr<placement::SloPrediction> Place() override {
    EXPECT_FALSE(holds_) << name_ << " placed twice without Unplace";
    absl::StatusOr<placement::SloPrediction> p = cluster_->Place();
    holds_ = p.ok();
    return p;
  }
  void Unplace() override {
    EXPECT_TRUE(holds_) << name_ << " gave back a placement it does not hold";
    holds_ = false;
    cluster_->Unplace();
  }
  void Start() override {
    EXPECT_TRUE(holds_) << name_ << " started without a placement";
    EXPECT_FALSE(ended()) << name_ << " ended twice";
    started_ = true;
    cluster_->Started(name_);
  }
  void Refuse(const absl::Status& status) override {
    EXPECT_FALSE(ended()) << name_ << " ended twice";
    refusal_ = status;
  }

  bool ended() const { return started_ || refusal_.has_value(); }
  bool holds() const { return holds_; }
  const std::optional<absl::Status>& refusal() const { return refusal_; }

 private:
  FakeCluster* const cluster_;
  const std::string name_;
  bool holds_ = false;
  bool started_ = false;
  std::optional<absl::Status> refusal_;
};

class AdmissionQueueTest : public ::testing::Test {
 protected:
  // A queue of every class's default size unless `max_queued` says otherwise.
  void MakeQueue(int64_t max_queued = 256) {
    placement::AdmissionOptions admission;
    admission.max_queued = max_queued;
    admission.max_queue_time = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<AdmissionQueue>> queue =
        AdmissionQueue::Create({.admission = admission, .clock = &clock_});
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = *std::move(queue);
  }

  // Places a new request and offers it, as the router does.
  std::shared_ptr<FakeRequest> Offer(const std::string& name, int32_t priority,
                                     absl::StatusOr<placement::Outcome>* outcome) {
    auto request = std::make_shared<FakeRequest>(&cluster_, name);
    absl::StatusOr<placement::SloPrediction> prediction = request->Place();
    EXPECT_TRUE(prediction.ok()) << prediction.status();
    *outcome = queue_->Offer(
        request, {.priority = priority, .arrival = clock_.Now(), .prediction = *prediction});
    return request;
  }
  std::shared_ptr<FakeRequest> OfferQueued(const std::string& name, int32_t priority = 0) {
    absl::StatusOr<placement::Outcome> outcome;
    std::shared_ptr<FakeRequest> request = Offer(name, priority, &outcome);
    EXPECT_TRUE(outcome.ok() && *outcome == placement::Outcome::kQueue) << name;
    return request;
  }

  FakeClock clock_;
  FakeCluster cluster_{0};
  std::unique_ptr<AdmissionQueue> queue_;
};

TEST_F(AdmissionQueueTest, ARequestThatFitsIsAdmittedOnItsPlacement) {
  MakeQueue();
  cluster_.Free(1);
  absl::StatusOr<placement::Outcome> outcome;
  std::shared_ptr<FakeRequest> request = Offer("a", 0, &outcome);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(*outcome, placement::Outcome::kAdmit);
  EXPECT_TRUE(request->holds());  // the caller starts it on that placement
  EXPECT_FALSE(request->ended());
  EXPECT_EQ(queue_->size(), 0);
}

TEST_F(AdmissionQueueTest, WithoutAPredictionEveryRequestIsAdmitted) {
  MakeQueue();
  auto request = std::make_shared<FakeRequest>(&cluster_, "a");
  ASSERT_TRUE(request->Place().ok());
  for (const placement::SloPrediction& p :
       {placement::SloPrediction{.predicted = false},
        // One admission cannot read is logged and admitted.
        placement::SloPrediction{.predicted = true, .ttft_seconds = -1, .headroom = -1}}) {
    absl::StatusOr<placement::Outcome> outcome =
        queue_->Offer(request, {.arrival = clock_.Now(), .prediction = p});
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(*outcome, placement::Outcome::kAdmit);
  }
  EXPECT_EQ(queue_->size(), 0);
}

TEST_F(AdmissionQueueTest, AQueuedRequestGivesBackItsPlacementAndStartsWhenCapacityFrees) {
  MakeQueue();
  std::shared_ptr<FakeRequest> request = OfferQueued("a");
  EXPECT_FALSE(request->holds());
  EXPECT_EQ(cluster_.placed(), 0);
  EXPECT_EQ(queue_->size(), 1);

  for (int i = 0; i < 3; ++i) {  // no capacity: placed again, given back, waits on
    clock_.Advance(absl::Seconds(1));
    queue_->Pump();
    EXPECT_FALSE(request->ended());
    EXPECT_EQ(cluster_.placed(), 0);
  }
  cluster_.Free(1);
  queue_->Pump();
  EXPECT_THAT(cluster_.started(), ElementsAre("a"));
  EXPECT_EQ(cluster_.placed(), 1);  // it runs on the placement it started with
  EXPECT_EQ(queue_->size(), 0);
  queue_->Pump();
  EXPECT_EQ(cluster_.started().size(), 1u);
}

TEST_F(AdmissionQueueTest, ARequestThatCannotBePlacedWaitsOn) {
  MakeQueue();
  std::shared_ptr<FakeRequest> request = OfferQueued("a");
  cluster_.unreachable = true;
  cluster_.Free(1);
  queue_->Pump();
  EXPECT_FALSE(request->ended());
  EXPECT_EQ(queue_->size(), 1);
  cluster_.unreachable = false;
  queue_->Pump();
  EXPECT_THAT(cluster_.started(), ElementsAre("a"));
}

TEST_F(AdmissionQueueTest, HigherPriorityStartsFirstThenEarlierArrival) {
  MakeQueue();
  OfferQueued("normal-1", 0);
  clock_.Advance(absl::Milliseconds(1));
  OfferQueued("background", -1);
  clock_.Advance(absl::Milliseconds(1));
  OfferQueued("high", 1);
  clock_.Advance(absl::Milliseconds(1));
  OfferQueued("normal-2", 0);

  cluster_.Free(1);
  queue_->Pump();
  EXPECT_THAT(cluster_.started(), ElementsAre("high"));
  cluster_.Free(3);
  queue_->Pump();
  EXPECT_THAT(cluster_.started(), ElementsAre("high", "normal-1", "normal-2", "background"));
  EXPECT_EQ(cluster_.placed(), 4);
}

TEST_F(AdmissionQueueTest, ARequestWaitsNoLongerThanTheQueueTime) {
  MakeQueue();
  std::shared_ptr<FakeRequest> request = OfferQueued("a");
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  queue_->Pump();
  EXPECT_FALSE(request->ended());
  clock_.Advance(absl::Milliseconds(1));
  cluster_.Free(1);  // too late: it expires before it is placed again
  queue_->Pump();
  ASSERT_TRUE(request->refusal().has_value());
  EXPECT_EQ(request->refusal()->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(request->refusal()->message(), HasSubstr("no capacity came in time"));
  EXPECT_EQ(RetryAfter(*request->refusal()), absl::Seconds(2));  // the predicted wait
  EXPECT_EQ(queue_->size(), 0);
  EXPECT_EQ(cluster_.placed(), 0);
  EXPECT_TRUE(cluster_.started().empty());
}

TEST_F(AdmissionQueueTest, ARequestWaitsNoLongerThanItsTtftObjectiveAllows) {
  MakeQueue();
  // 1 s objective, 0.3 s of the predicted 0.5 s is work, not waiting: it may wait 0.7 s.
  auto request = std::make_shared<FakeRequest>(&cluster_, "a");
  ASSERT_TRUE(request->Place().ok());
  absl::StatusOr<placement::Outcome> outcome = queue_->Offer(request, {.arrival = clock_.Now(),
                                    .prediction = {.predicted = true, .ttft_seconds = 0.5,
                                                   .wait_seconds = 0.2, .headroom = -0.1,
                                                   .meets_slo = false, .ttft_slo_seconds = 1}});
  ASSERT_TRUE(outcome.ok() && *outcome == placement::Outcome::kQueue);
  clock_.Advance(absl::Milliseconds(699));
  queue_->Pump();
  EXPECT_FALSE(request->ended());
  clock_.Advance(absl::Milliseconds(1));
  queue_->Pump();
  ASSERT_TRUE(request->refusal().has_value());
  EXPECT_EQ(request->refusal()->code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(AdmissionQueueTest, WaitingCountsAgainstTheObjectiveWhenPlacedAgain) {
  MakeQueue();
  // A 2 s objective: with a slot, 1.5 s is predicted (headroom 0.25 at once). After 0.6 s in the
  // queue that is 2.1 s, over the objective: it is not started on it.
  cluster_.ttft_slo_seconds = 2;
  cluster_.ttft_seconds = 1.5;
  auto request = std::make_shared<FakeRequest>(&cluster_, "a");
  ASSERT_TRUE(request->Place().ok());
  absl::StatusOr<placement::Outcome> outcome = queue_->Offer(
      request, {.arrival = clock_.Now(),
                .prediction = {.predicted = true, .ttft_seconds = 1.5, .wait_seconds = 1,
                               .headroom = -0.1, .meets_slo = false, .ttft_slo_seconds = 2}});
  ASSERT_TRUE(outcome.ok() && *outcome == placement::Outcome::kQueue);
  clock_.Advance(absl::Milliseconds(600));
  cluster_.Free(1);
  queue_->Pump();
  EXPECT_FALSE(request->ended());
  EXPECT_EQ(cluster_.placed(), 0);
}

TEST_F(AdmissionQueueTest, AFullQueueShedsWithResourceExhaustedAndARetryHint) {
  MakeQueue(/*max_queued=*/1);
  OfferQueued("first");
  absl::StatusOr<placement::Outcome> outcome;
  std::shared_ptr<FakeRequest> second = Offer("second", 0, &outcome);
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(outcome.status().message(), HasSubstr("the admission queue is full (1 requests)"));
  EXPECT_EQ(RetryAfter(outcome.status()), absl::Seconds(2));
  EXPECT_FALSE(second->holds());  // its placement was given back
  EXPECT_FALSE(second->ended());  // refused by Offer's status, not by Refuse
  EXPECT_EQ(cluster_.placed(), 0);
  EXPECT_EQ(queue_->size(), 1);
}

TEST_F(AdmissionQueueTest, AHigherPriorityRequestDisplacesALowerOne) {
  MakeQueue(/*max_queued=*/1);
  std::shared_ptr<FakeRequest> low = OfferQueued("low", 0);
  std::shared_ptr<FakeRequest> high = OfferQueued("high", 1);
  ASSERT_TRUE(low->refusal().has_value());
  EXPECT_EQ(low->refusal()->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(low->refusal()->message(), HasSubstr("took its queue place"));
  EXPECT_TRUE(RetryAfter(*low->refusal()).has_value());
  EXPECT_FALSE(high->ended());
  EXPECT_EQ(queue_->size(), 1);
  cluster_.Free(1);
  queue_->Pump();
  EXPECT_THAT(cluster_.started(), ElementsAre("high"));
}

TEST_F(AdmissionQueueTest, ARemovedRequestIsNeitherStartedNorRefused) {
  MakeQueue();
  std::shared_ptr<FakeRequest> request = OfferQueued("a");
  EXPECT_TRUE(queue_->Remove(request.get()));
  EXPECT_FALSE(queue_->Remove(request.get()));
  EXPECT_EQ(queue_->size(), 0);
  cluster_.Free(1);
  queue_->Pump();
  clock_.Advance(absl::Minutes(1));
  queue_->Pump();
  queue_.reset();
  EXPECT_FALSE(request->ended());
  EXPECT_EQ(cluster_.placed(), 0);
}

TEST_F(AdmissionQueueTest, DestroyingTheQueueRefusesWhatWaits) {
  MakeQueue();
  std::shared_ptr<FakeRequest> request = OfferQueued("a");
  queue_.reset();
  ASSERT_TRUE(request->refusal().has_value());
  EXPECT_EQ(request->refusal()->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(request->refusal()->message(), HasSubstr("shutting down"));
}

TEST_F(AdmissionQueueTest, ItsOwnThreadStartsWhatFits) {
  MakeQueue();
  queue_->Start();
  OfferQueued("a");
  cluster_.Free(1);
  cluster_.AwaitStarted(1);  // the queue's own thread started it
  EXPECT_THAT(cluster_.started(), ElementsAre("a"));
  EXPECT_EQ(queue_->size(), 0);
}

TEST_F(AdmissionQueueTest, OptionsAreChecked) {
  EXPECT_EQ(AdmissionQueue::Create({.poll = absl::ZeroDuration(), .clock = &clock_})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  placement::AdmissionOptions admission;
  admission.max_queued = -1;
  EXPECT_EQ(AdmissionQueue::Create({.admission = admission, .clock = &clock_}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::router
