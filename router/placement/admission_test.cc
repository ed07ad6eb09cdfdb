// Tests of admission by priority (admission.h), with explicit times.
#include "router/placement/admission.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement.h"
#include "router/placement/placement_test_util.h"

namespace tandem::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing_util::MakePolicy;
using testing_util::OrDie;
using testing_util::PlaceOrDie;
using testing_util::Prompt;
using testing_util::Worker;

const absl::Time kNow = absl::FromUnixSeconds(1'767'225'600);

// Background (< 0) needs 20% headroom and queues 2; normal (0) needs 0 and queues 3; high (> 0)
// is admitted 25% over and queues 2; 4 queued in all; 5 s at most in the queue.
AdmissionOptions Options() {
  return {.classes = {{.min_priority = -1, .admit_headroom = 0.2, .max_queued = 2},
                      {.min_priority = 0, .admit_headroom = 0.0, .max_queued = 3},
                      {.min_priority = 1, .admit_headroom = -0.25, .max_queued = 2}},
          .max_queued = 4,
          .max_queue_time = absl::Seconds(5),
          .min_retry_after = absl::Seconds(1),
          .max_retry_after = absl::Seconds(60)};
}

Admission Make(const AdmissionOptions& options = Options()) {
  return OrDie(Admission::Create(options));
}

SloPrediction Predicted(double headroom, double ttft = 1.5, double wait = 1.0,
                        double ttft_slo = 100.0) {
  return {.predicted = true,
          .ttft_seconds = ttft,
          .wait_seconds = wait,
          .headroom = headroom,
          .meets_slo = headroom >= 0,
          .ttft_slo_seconds = ttft_slo};
}

QueuedRequest Req(uint64_t id, int32_t priority, SloPrediction prediction,
                  absl::Time arrival = absl::InfinitePast()) {
  return {.id = id, .priority = priority, .arrival = arrival, .prediction = prediction};
}

Verdict OfferOrDie(Admission& admission, const QueuedRequest& request, absl::Time now = kNow) {
  return OrDie(admission.Offer(request, now));
}

std::vector<uint64_t> IdsOf(const std::vector<QueuedRequest>& requests) {
  std::vector<uint64_t> ids;
  for (const QueuedRequest& r : requests) ids.push_back(r.id);
  return ids;
}

TEST(AdmissionTest, NamesAndDefaults) {
  EXPECT_EQ(OutcomeName(Outcome::kAdmit), "admit");
  EXPECT_EQ(OutcomeName(Outcome::kQueue), "queue");
  EXPECT_EQ(OutcomeName(Outcome::kReject), "reject");
  EXPECT_EQ(RejectReasonName(RejectReason::kNone), "none");
  EXPECT_EQ(RejectReasonName(RejectReason::kSloUnreachable), "slo_unreachable");
  EXPECT_EQ(RejectReasonName(RejectReason::kQueueFull), "queue_full");
  EXPECT_EQ(RejectReasonName(RejectReason::kDisplaced), "displaced");
  EXPECT_EQ(RejectReasonName(RejectReason::kExpired), "expired");
  const std::vector<PriorityClass> classes = DefaultPriorityClasses();
  ASSERT_EQ(classes.size(), 3u);
  EXPECT_EQ(classes[0].min_priority, -1);
  EXPECT_EQ(classes[1].min_priority, 0);
  EXPECT_EQ(classes[2].min_priority, 1);
  EXPECT_GT(classes[0].admit_headroom, classes[1].admit_headroom);
  EXPECT_GT(classes[1].admit_headroom, classes[2].admit_headroom);
  EXPECT_TRUE(Admission::Create({}).ok());
}

// The router's --priority_classes: the defaults when empty, classes as written otherwise, and a
// clear error naming the class that does not parse; order and ranges are Create's to check.
TEST(AdmissionTest, ParsesPriorityClassesFromAFlag) {
  absl::StatusOr<std::vector<PriorityClass>> classes = ParsePriorityClasses("");
  ASSERT_TRUE(classes.ok()) << classes.status();
  ASSERT_EQ(classes->size(), DefaultPriorityClasses().size());
  for (size_t i = 0; i < classes->size(); ++i) {
    EXPECT_EQ((*classes)[i].min_priority, DefaultPriorityClasses()[i].min_priority);
    EXPECT_EQ((*classes)[i].admit_headroom, DefaultPriorityClasses()[i].admit_headroom);
    EXPECT_EQ((*classes)[i].max_queued, DefaultPriorityClasses()[i].max_queued);
  }
  classes = ParsePriorityClasses("-5:0.3:8,2:-0.1:0");
  ASSERT_TRUE(classes.ok()) << classes.status();
  ASSERT_EQ(classes->size(), 2u);
  EXPECT_EQ((*classes)[0].min_priority, -5);
  EXPECT_EQ((*classes)[0].admit_headroom, 0.3);
  EXPECT_EQ((*classes)[0].max_queued, 8);
  EXPECT_EQ((*classes)[1].min_priority, 2);
  EXPECT_EQ((*classes)[1].admit_headroom, -0.1);
  EXPECT_EQ((*classes)[1].max_queued, 0);
  AdmissionOptions options;
  options.classes = *classes;
  EXPECT_TRUE(Admission::Create(options).ok());
  for (const char* bad : {"0:0.1", "0:0.1:8:9", "x:0.1:8", "0:high:8", "0:0.1:1.5", "0:0.1:8,",
                          ",0:0.1:8"}) {
    classes = ParsePriorityClasses(bad);
    EXPECT_EQ(classes.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(classes.status().message(), HasSubstr("MIN_PRIORITY:ADMIT_HEADROOM:MAX_QUEUED"))
        << bad;
  }
  EXPECT_THAT(ParsePriorityClasses("0:0:8,1:x:8").status().message(), HasSubstr("class 2"));
  // Parsed, but out of order: Create refuses it.
  classes = ParsePriorityClasses("1:0:8,0:0:8");
  ASSERT_TRUE(classes.ok());
  options.classes = *classes;
  EXPECT_EQ(Admission::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AdmissionTest, RejectsInvalidOptions) {
  std::vector<AdmissionOptions> bad(11, Options());
  bad[0].classes.clear();
  bad[1].classes[1].min_priority = -1;  // not above the previous class
  bad[2].classes[2].admit_headroom = std::numeric_limits<double>::quiet_NaN();
  bad[3].classes[0].max_queued = -1;
  bad[4].max_queued = -1;
  bad[5].max_queue_time = absl::ZeroDuration();
  bad[6].max_queue_time = absl::InfiniteDuration();
  bad[7].min_retry_after = -absl::Seconds(1);
  bad[8].min_retry_after = absl::Seconds(61);
  bad[9].max_retry_after = absl::InfiniteDuration();
  bad[10].classes[1].admit_headroom = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < bad.size(); ++k) {
    EXPECT_EQ(Admission::Create(bad[k]).status().code(), absl::StatusCode::kInvalidArgument) << k;
  }
}

TEST(AdmissionTest, LowerClassesNeedMoreHeadroom) {
  struct Case {
    int32_t priority;
    double headroom;
    Outcome outcome;
  };
  const Case cases[] = {
      {-5, 0.3, Outcome::kAdmit},  {-1, 0.3, Outcome::kAdmit}, {-1, 0.2, Outcome::kAdmit},
      {-5, 0.1, Outcome::kQueue},  {-1, 0.1, Outcome::kQueue}, {0, 0.1, Outcome::kAdmit},
      {0, 0.0, Outcome::kAdmit},   {0, -0.1, Outcome::kQueue}, {7, -0.1, Outcome::kAdmit},
      {1, -0.25, Outcome::kAdmit}, {1, -0.3, Outcome::kQueue},
  };
  for (const Case& c : cases) {
    Admission admission = Make();
    const Verdict v = OfferOrDie(admission, Req(1, c.priority, Predicted(c.headroom)));
    EXPECT_EQ(v.outcome, c.outcome) << c.priority << " " << c.headroom;
    EXPECT_EQ(admission.Admits(c.priority, Predicted(c.headroom)), c.outcome == Outcome::kAdmit);
    EXPECT_EQ(admission.counters().admitted, c.outcome == Outcome::kAdmit ? 1 : 0);
    EXPECT_EQ(admission.counters().queued, c.outcome == Outcome::kQueue ? 1 : 0);
    EXPECT_EQ(admission.Size(), c.outcome == Outcome::kQueue ? 1 : 0);
  }
  // Nothing predicted (a policy other than slo): admitted whatever the numbers.
  Admission admission = Make();
  SloPrediction none = Predicted(-10);
  none.predicted = false;
  EXPECT_EQ(OfferOrDie(admission, Req(1, -5, none)).outcome, Outcome::kAdmit);
}

TEST(AdmissionTest, QueuedUntilItCouldNoLongerMakeItsTtft) {
  Admission admission = Make();
  // Received 200 ms ago; 1.5 s predicted of which 1 s is waiting: its own work takes 0.5 s, so it
  // can leave the queue until 0.5 s after arrival against a 1 s objective: 300 ms from now.
  Verdict v = OfferOrDie(admission,
                         Req(1, 0, Predicted(-0.5, 1.5, 1.0, 1.0), kNow - absl::Milliseconds(200)));
  EXPECT_EQ(v.outcome, Outcome::kQueue);
  EXPECT_EQ(v.deadline, kNow + absl::Milliseconds(300));
  EXPECT_FALSE(v.displaced.has_value());
  // A loose objective: max_queue_time bounds the wait.
  v = OfferOrDie(admission, Req(2, 0, Predicted(-0.5, 1.5, 1.0, 100.0)));
  EXPECT_EQ(v.deadline, kNow + absl::Seconds(5));
  // No arrival given: it arrived now. 0.5 s of work, 0.8 s objective: 300 ms.
  v = OfferOrDie(admission, Req(3, 0, Predicted(-0.5, 1.5, 1.0, 0.8)));
  EXPECT_EQ(v.deadline, kNow + absl::Milliseconds(300));
  // No TTFT objective at all: max_queue_time.
  v = OfferOrDie(admission, Req(4, 1, Predicted(-0.5, 1.5, 1.0, 0.0)));
  EXPECT_EQ(v.deadline, kNow + absl::Seconds(5));
  EXPECT_EQ(admission.Size(), 4);
  EXPECT_EQ(admission.ClassSize(0), 3);
  EXPECT_EQ(admission.ClassSize(5), 1);
  EXPECT_EQ(admission.NextDeadline(), kNow + absl::Milliseconds(300));
}

TEST(AdmissionTest, TheTimeAQueuedRequestWaitedCountsAgainstItsObjective) {
  Admission admission = Make();
  // 1 s objective, 1.5 s predicted of which 1 s is waiting: queued until 0.5 s after arrival.
  ASSERT_EQ(OfferOrDie(admission, Req(1, 0, Predicted(-0.5, 1.5, 1.0, 1.0))).outcome,
            Outcome::kQueue);
  // 300 ms later a fresh placement predicts 0.6 s (headroom 0.4 on its own): with the 0.3 s it
  // waited, 0.9 s, headroom 0.1: admitted. 0.8 s would make 1.1 s: not, though 0.2 on its own.
  const absl::Time later = kNow + absl::Milliseconds(300);
  const QueuedRequest queued = Req(1, 0, Predicted(-0.5, 1.5, 1.0, 1.0), kNow);
  EXPECT_TRUE(admission.AdmitsQueued(queued, Predicted(0.4, 0.6, 0.0, 1.0), later));
  EXPECT_FALSE(admission.AdmitsQueued(queued, Predicted(0.2, 0.8, 0.0, 1.0), later));
  EXPECT_TRUE(admission.Admits(0, Predicted(0.2, 0.8, 0.0, 1.0)));
  // A lower headroom from another objective (TPOT) stays.
  EXPECT_FALSE(admission.AdmitsQueued(queued, Predicted(-0.1, 0.6, 0.0, 1.0), later));
  // The high class takes up to 25% over: 0.8 + 0.3 = 1.1 s is -0.1, admitted.
  EXPECT_TRUE(admission.AdmitsQueued(Req(2, 1, Predicted(-0.5, 1.5, 1.0, 1.0), kNow),
                                     Predicted(0.2, 0.8, 0.0, 1.0), later));
  // An arrival that waited before the offer: the same rule at once (0.8 s predicted, 0.3 of it
  // waiting, 0.3 s waited before: queued; with no waiting in the 0.8 s it cannot make it).
  EXPECT_EQ(OfferOrDie(admission,
                       Req(3, 0, Predicted(0.2, 0.8, 0.3, 1.0), kNow - absl::Milliseconds(300)))
                .outcome,
            Outcome::kQueue);
  EXPECT_EQ(OfferOrDie(admission,
                       Req(4, 0, Predicted(0.2, 0.8, 0.0, 1.0), kNow - absl::Milliseconds(300)))
                .reason,
            RejectReason::kSloUnreachable);

  const SloPrediction aged = AfterWaiting(Predicted(0.2, 0.8, 0.1, 1.0), absl::Milliseconds(300));
  EXPECT_DOUBLE_EQ(aged.ttft_seconds, 1.1);
  EXPECT_DOUBLE_EQ(aged.wait_seconds, 0.4);
  EXPECT_NEAR(aged.headroom, -0.1, 1e-12);
  EXPECT_FALSE(aged.meets_slo);
  EXPECT_DOUBLE_EQ(AfterWaiting(Predicted(0.2, 0.8), -absl::Seconds(1)).ttft_seconds, 0.8);
}

TEST(AdmissionTest, RefusesWhatCannotMakeItsTtftEvenAfterWaiting) {
  Admission admission = Make();
  // 3 s predicted, 1.8 s of it waiting: 1.2 s of its own work > the 1 s objective. Retry after
  // the larger of the wait (1.8 s) and the overshoot (2 s).
  Verdict v = OfferOrDie(admission, Req(1, 0, Predicted(-2.0, 3.0, 1.8, 1.0)));
  EXPECT_EQ(v.outcome, Outcome::kReject);
  EXPECT_EQ(v.reason, RejectReason::kSloUnreachable);
  EXPECT_THAT(v.message, HasSubstr("objective"));
  EXPECT_EQ(v.retry_after, absl::Seconds(2));
  // Received 900 ms ago, 0.2 s of work left to do against 1 s: 100 ms too late.
  v = OfferOrDie(admission,
                 Req(2, 0, Predicted(-0.1, 0.5, 0.3, 1.0), kNow - absl::Milliseconds(900)));
  EXPECT_EQ(v.reason, RejectReason::kSloUnreachable);
  // Exactly on time is too late as well: no wait is left.
  v = OfferOrDie(admission,
                 Req(3, 0, Predicted(-0.1, 0.5, 0.3, 1.0), kNow - absl::Milliseconds(800)));
  EXPECT_EQ(v.reason, RejectReason::kSloUnreachable);
  EXPECT_EQ(admission.Size(), 0);
  EXPECT_EQ(admission.counters().rejected[static_cast<int>(RejectReason::kSloUnreachable)], 3);
  EXPECT_EQ(admission.counters().rejected_total(), 3);
}

TEST(AdmissionTest, RetryAfterIsTheDrainTimeWithinBounds) {
  Admission admission = Make();
  const absl::Time long_ago = kNow - absl::Seconds(10);
  // Drain max(0.2, 0.5 - 1) = 0.2 s: raised to 1 s.
  Verdict v = OfferOrDie(admission, Req(1, 0, Predicted(-0.1, 0.5, 0.2, 1.0), long_ago));
  EXPECT_EQ(v.retry_after, absl::Seconds(1));
  // Drain max(500, 599) s: cut to 60 s.
  v = OfferOrDie(admission, Req(2, 0, Predicted(-598, 600, 500, 1.0), long_ago));
  EXPECT_EQ(v.retry_after, absl::Seconds(60));
  // Drain max(7.5, 3) s.
  v = OfferOrDie(admission, Req(3, 0, Predicted(-2, 9, 7.5, 6), long_ago));
  EXPECT_EQ(v.retry_after, absl::Seconds(7.5));
}

TEST(AdmissionTest, NextReadyServesHigherPrioritiesFirstThenArrivalOrder) {
  AdmissionOptions options = Options();
  options.max_queued = 8;
  Admission admission = Make(options);
  const absl::Time t0 = kNow - absl::Seconds(1);
  OfferOrDie(admission, Req(1, -1, Predicted(0.1), t0));
  OfferOrDie(admission, Req(2, 0, Predicted(-0.1), t0 + absl::Milliseconds(300)));
  OfferOrDie(admission, Req(3, 0, Predicted(-0.1), t0 + absl::Milliseconds(100)));
  OfferOrDie(admission, Req(4, 1, Predicted(-0.5), t0 + absl::Milliseconds(900)));
  OfferOrDie(admission, Req(5, -2, Predicted(0.1), t0 - absl::Seconds(1)));
  // Expires 100 ms from now (0.5 s of work, 0.6 s objective).
  OfferOrDie(admission, Req(6, 3, Predicted(-1.0, 1.5, 1.0, 0.6)));
  ASSERT_EQ(admission.Size(), 6);

  std::vector<uint64_t> offered;
  const std::vector<QueuedRequest> started =
      admission.NextReady(kNow + absl::Milliseconds(100), [&](const QueuedRequest& q) {
        offered.push_back(q.id);
        return q.id != 3;  // 3 still does not fit
      });
  // 6 has expired: not offered (PopExpired returns it).
  EXPECT_THAT(offered, ElementsAre(4, 3, 2, 1, 5));
  EXPECT_THAT(IdsOf(started), ElementsAre(4, 2, 1, 5));
  EXPECT_EQ(started[0].priority, 1);
  EXPECT_EQ(admission.Size(), 2);
  EXPECT_EQ(admission.ClassSize(0), 1);
  EXPECT_EQ(admission.ClassSize(-1), 0);
  EXPECT_EQ(admission.counters().dequeued, 4);
  // Nothing fits: nothing leaves.
  EXPECT_THAT(admission.NextReady(kNow, [](const QueuedRequest&) { return false; }), IsEmpty());
  EXPECT_EQ(admission.Size(), 2);
}

TEST(AdmissionTest, PopExpiredReturnsTheExpiredEarliestFirst) {
  Admission admission = Make();
  // Deadlines: 1 at +300 ms, 2 at +500 ms, 3 at +5 s.
  OfferOrDie(admission, Req(2, 0, Predicted(-0.5, 1.5, 1.0, 1.0)));  // 0.5 s of work, 1 s objective
  OfferOrDie(admission, Req(1, 1, Predicted(-3, 3.5, 3.0, 1.0), kNow - absl::Milliseconds(200)));
  OfferOrDie(admission, Req(3, 0, Predicted(-0.5)));
  EXPECT_EQ(admission.NextDeadline(), kNow + absl::Milliseconds(300));
  EXPECT_THAT(admission.PopExpired(kNow + absl::Milliseconds(299)), IsEmpty());
  const std::vector<Rejection> expired = admission.PopExpired(kNow + absl::Milliseconds(500));
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].id, 1u);
  EXPECT_EQ(expired[0].priority, 1);
  EXPECT_EQ(expired[0].reason, RejectReason::kExpired);
  EXPECT_EQ(expired[0].retry_after, absl::Seconds(3));  // max(3.0 wait, 2.5 overshoot)
  EXPECT_EQ(expired[1].id, 2u);
  EXPECT_EQ(expired[1].retry_after, absl::Seconds(1));  // max(1.0, 0.5)
  EXPECT_EQ(admission.Size(), 1);
  EXPECT_EQ(admission.NextDeadline(), kNow + absl::Seconds(5));
  EXPECT_EQ(admission.counters().rejected[static_cast<int>(RejectReason::kExpired)], 2);
  EXPECT_EQ(admission.PopExpired(kNow + absl::Seconds(5)).size(), 1u);
  EXPECT_EQ(admission.NextDeadline(), std::nullopt);
}

TEST(AdmissionTest, AFullQueueMakesRoomByDisplacingTheLowestPriority) {
  Admission admission = Make();
  // Background: 10 (priority -3), 11 (-2), the class full; normal: 12, 13. All 4 places taken.
  OfferOrDie(admission, Req(10, -3, Predicted(0.1)));
  OfferOrDie(admission, Req(11, -2, Predicted(0.1)));
  OfferOrDie(admission, Req(12, 0, Predicted(-0.1)));
  OfferOrDie(admission, Req(13, 0, Predicted(-0.1)));
  ASSERT_EQ(admission.Size(), 4);

  // A normal request: its class has room, the queue does not. 10 is the lowest: pushed out.
  Verdict v = OfferOrDie(admission, Req(14, 0, Predicted(-0.1, 2.5, 2.0)));
  EXPECT_EQ(v.outcome, Outcome::kQueue);
  ASSERT_TRUE(v.displaced.has_value());
  EXPECT_EQ(v.displaced->id, 10u);
  EXPECT_EQ(v.displaced->priority, -3);
  EXPECT_EQ(v.displaced->reason, RejectReason::kDisplaced);
  EXPECT_EQ(v.displaced->retry_after, absl::Seconds(1));  // its own prediction: 1 s wait
  EXPECT_EQ(admission.Size(), 4);

  // Priority -2: nothing lower is queued.
  v = OfferOrDie(admission, Req(15, -2, Predicted(0.1)));
  EXPECT_EQ(v.outcome, Outcome::kReject);
  EXPECT_EQ(v.reason, RejectReason::kQueueFull);
  EXPECT_THAT(v.message, HasSubstr("admission queue is full"));

  // Another normal request: its class is full (12, 13, 14) and holds nothing lower.
  v = OfferOrDie(admission, Req(16, 0, Predicted(-0.1)));
  EXPECT_EQ(v.reason, RejectReason::kQueueFull);
  EXPECT_THAT(v.message, HasSubstr("priority class 1"));

  // A high-priority request (predicted 50% over): 11 goes.
  v = OfferOrDie(admission, Req(17, 1, Predicted(-0.5)));
  EXPECT_EQ(v.outcome, Outcome::kQueue);
  ASSERT_TRUE(v.displaced.has_value());
  EXPECT_EQ(v.displaced->id, 11u);

  const std::vector<QueuedRequest> all =
      admission.NextReady(kNow, [](const QueuedRequest&) { return true; });
  EXPECT_THAT(IdsOf(all), ElementsAre(17, 12, 13, 14));
  const AdmissionCounters& c = admission.counters();
  EXPECT_EQ(c.queued, 6);
  EXPECT_EQ(c.rejected[static_cast<int>(RejectReason::kDisplaced)], 2);
  EXPECT_EQ(c.rejected[static_cast<int>(RejectReason::kQueueFull)], 2);
  EXPECT_EQ(c.rejected_total(), 4);
}

TEST(AdmissionTest, DisplacesTheNewestAmongTheLowest) {
  Admission admission = Make(
      {.classes = {{.min_priority = 0, .admit_headroom = 0, .max_queued = 10}}, .max_queued = 2});
  OfferOrDie(admission, Req(1, 0, Predicted(-0.1), kNow - absl::Seconds(1)));
  OfferOrDie(admission, Req(2, 0, Predicted(-0.1), kNow - absl::Seconds(2)));  // older
  const Verdict v = OfferOrDie(admission, Req(3, 5, Predicted(-0.1)));
  ASSERT_TRUE(v.displaced.has_value());
  EXPECT_EQ(v.displaced->id, 1u);
  // Every priority is in the one class: priorities below its min_priority belong to it too.
  EXPECT_EQ(admission.ClassSize(-100), 2);
}

TEST(AdmissionTest, AClassWithoutQueuePlacesRefusesAtOnce) {
  AdmissionOptions options = Options();
  options.classes[0].max_queued = 0;
  Admission admission = Make(options);
  const Verdict v = OfferOrDie(admission, Req(1, -1, Predicted(0.1)));
  EXPECT_EQ(v.reason, RejectReason::kQueueFull);
  // Still admitted when there is headroom enough.
  EXPECT_EQ(OfferOrDie(admission, Req(2, -1, Predicted(0.3))).outcome, Outcome::kAdmit);
}

TEST(AdmissionTest, RemoveDuplicatesAndBadNumbers) {
  Admission admission = Make();
  EXPECT_EQ(OfferOrDie(admission, Req(1, 0, Predicted(-0.1))).outcome, Outcome::kQueue);
  EXPECT_EQ(admission.Offer(Req(1, 0, Predicted(-0.1)), kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const SloPrediction bad[] = {Predicted(-0.1, nan), Predicted(-0.1, 1.0, -1.0),
                               Predicted(-0.1, 1.0, 1.0, inf), Predicted(nan)};
  for (const SloPrediction& p : bad) {
    EXPECT_EQ(admission.Offer(Req(2, 0, p), kNow).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(admission.Size(), 1);
  EXPECT_TRUE(admission.Remove(1));
  EXPECT_FALSE(admission.Remove(1));
  EXPECT_EQ(admission.Size(), 0);
  EXPECT_EQ(admission.ClassSize(0), 0);
  EXPECT_EQ(admission.counters().removed, 1);
  // The id is free again.
  EXPECT_EQ(OfferOrDie(admission, Req(1, 0, Predicted(-0.1))).outcome, Outcome::kQueue);
}

TEST(AdmissionTest, DrivenByTheSloPolicysDecisions) {
  PolicyOptions options = {.default_ttft_ms = 1000,
                           .default_tpot_ms = 50,
                           .default_step_profile = {.base_seconds = 0.010,
                                                    .prefill_token_seconds = 1e-4,
                                                    .decode_token_seconds = 1e-3,
                                                    .context_token_seconds = 0,
                                                    .prompt_context_token_seconds = 0},
                           .expected_output_tokens = 100};
  std::unique_ptr<PlacementPolicy> policy = MakePolicy("slo", options);
  // 13 sequences for 8 slots (slo_policy_test.cc works it out): TTFT 1.153 s of which 1.125 s is
  // waiting, headroom -0.153.
  const ClusterView cluster = {.workers = {Worker("d0", Role::kDecode).Seqs(8, 4).MaxRunning(8)}};
  const Decision d = PlaceOrDie(*policy, Prompt(100), cluster);
  const SloPrediction p = PredictionOf(d);
  EXPECT_TRUE(p.predicted);
  EXPECT_EQ(p.ttft_seconds, d.predicted_ttft_seconds);
  EXPECT_EQ(p.wait_seconds, d.predicted_wait_seconds);
  EXPECT_EQ(p.headroom, d.headroom);
  EXPECT_FALSE(p.meets_slo);
  EXPECT_EQ(p.ttft_slo_seconds, 1.0);

  Admission admission = Make();
  // Normal priority: queued while its 28 ms of own work still fits in the 1 s: until +972 ms.
  Verdict v = OfferOrDie(admission, Req(1, 0, p));
  EXPECT_EQ(v.outcome, Outcome::kQueue);
  EXPECT_NEAR(absl::ToDoubleSeconds(v.deadline - kNow), 0.972, 1e-6);
  // High priority: admitted 15% over.
  EXPECT_EQ(OfferOrDie(admission, Req(2, 1, p)).outcome, Outcome::kAdmit);
  // A policy that predicts nothing: admitted.
  std::unique_ptr<PlacementPolicy> plain = MakePolicy("least_loaded");
  EXPECT_EQ(
      OfferOrDie(admission, Req(3, -1, PredictionOf(PlaceOrDie(*plain, Prompt(100), cluster))))
          .outcome,
      Outcome::kAdmit);
}

}  // namespace
}  // namespace tandem::placement
