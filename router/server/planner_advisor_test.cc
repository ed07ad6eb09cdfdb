// Tests of the advisory planner's traffic window (planner_advisor.h, ObservedWorkload) on a fake
// clock: the rate over the arrivals seen, the mean lengths and objectives, attainment, and what
// falls out of the window. PlannerAdvisor itself runs against real workers in
// tests/cluster/planner_advise_test.py.
#include "router/server/planner_advisor.h"

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

TEST(ObservedWorkloadTest, RateLengthsObjectivesAndAttainment) {
  FakeClock clock;
  ObservedWorkload w(absl::Seconds(10), &clock);
  EXPECT_EQ(w.Snapshot().rate, 0);  // nothing yet
  // Five arrivals 0.5 s apart: 4 gaps in 2 s, 2 requests per second.
  for (int i = 0; i < 5; ++i) {
    if (i > 0) clock.Advance(absl::Milliseconds(500));
    w.Arrived();
  }
  w.Finished(100, 10, 0.5, 0.05, /*met=*/true);
  w.Finished(300, 30, 1.5, 0.15, /*met=*/false);
  w.Finished(200, 20, 0, 0,
             /*met=*/true);  // no objectives: not in the attainment
  const WorkloadSnapshot s = w.Snapshot();
  EXPECT_EQ(s.arrivals, 5);
  EXPECT_DOUBLE_EQ(s.rate, 2.0);
  EXPECT_EQ(s.finished, 3);
  EXPECT_DOUBLE_EQ(s.mean_prompt_tokens, 200);
  EXPECT_DOUBLE_EQ(s.mean_output_tokens, 20);
  EXPECT_DOUBLE_EQ(s.ttft_slo_ms, 1000);
  EXPECT_DOUBLE_EQ(s.tpot_slo_ms, 100);
  EXPECT_EQ(s.slo_requests, 2);
  EXPECT_DOUBLE_EQ(s.attainment, 0.5);
}

TEST(ObservedWorkloadTest, OldTrafficLeavesTheWindow) {
  FakeClock clock;
  ObservedWorkload w(absl::Seconds(10), &clock);
  w.Arrived();
  w.Finished(100, 10, 0.5, 0, true);
  clock.Advance(absl::Seconds(9));
  w.Arrived();
  EXPECT_EQ(w.Snapshot().arrivals, 2);
  clock.Advance(absl::Seconds(2));  // the first arrival and the finish are 11 s old
  const WorkloadSnapshot s = w.Snapshot();
  EXPECT_EQ(s.arrivals, 1);
  EXPECT_EQ(s.rate, 0);  // one arrival: no gap to measure
  EXPECT_EQ(s.finished, 0);
  EXPECT_EQ(s.attainment, -1);
}

}  // namespace
}  // namespace tandem::router
