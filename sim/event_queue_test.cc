// Tests of the simulator's agenda (event_queue.h): time order, first-pushed-first at equal times.
#include "sim/event_queue.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem::sim {
namespace {

TEST(EventQueueTest, PopsByTimeThenPushOrder) {
  EventQueue q;
  q.Push(2.0, {.worker = 20});
  q.Push(1.0, {.worker = 10});
  q.Push(2.0, {.worker = 21});
  q.Push(0.5, {.worker = 5});
  q.Push(2.0, {.worker = 22});
  std::vector<uint32_t> order;
  std::vector<double> times;
  while (!q.empty()) {
    const Event e = q.Pop();
    order.push_back(e.worker);
    times.push_back(q.now());
    EXPECT_EQ(e.time, q.now());
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{5, 10, 20, 21, 22}));
  EXPECT_EQ(times, (std::vector<double>{0.5, 1.0, 2.0, 2.0, 2.0}));
  EXPECT_EQ(q.popped(), 5u);
}

TEST(EventQueueTest, EventsPushedWhilePoppingKeepTheOrder) {
  EventQueue q;
  q.Push(1.0, {.worker = 1});
  q.Push(3.0, {.worker = 3});
  EXPECT_EQ(q.Pop().worker, 1u);
  q.Push(1.0, {.worker = 11});  // at now: after nothing else, before 3
  q.Push(2.0, {.worker = 2});
  EXPECT_EQ(q.Pop().worker, 11u);
  EXPECT_EQ(q.Pop().worker, 2u);
  EXPECT_EQ(q.Pop().worker, 3u);
  EXPECT_TRUE(q.empty());
}

TEST(EventQueueDeathTest, AnEventInThePastIsABug) {
  EventQueue q;
  q.Push(1.0, {});
  q.Pop();
  EXPECT_DEATH(q.Push(0.5, {}), "before now");
}

}  // namespace
}  // namespace tandem::sim
