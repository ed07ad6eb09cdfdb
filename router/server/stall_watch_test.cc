#include "router/server/stall_watch.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

class RecordingStream final : public StallWatch::Stream {
 public:
  explicit RecordingStream(absl::Time now) : Stream(now) {}
  void OnStalled(absl::Duration silent_for) override { stalls.push_back(silent_for); }
  std::vector<absl::Duration> stalls;
};

class StallWatchTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  StallWatch watch_{{.timeout = absl::Seconds(6), .clock = &clock_}};
};

TEST_F(StallWatchTest, AStreamSilentLongerThanTheTimeoutStallsOnce) {
  auto s = std::make_shared<RecordingStream>(clock_.Now());
  watch_.Add(s);
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(watch_.Check(), 0);  // silent for exactly the timeout: not yet
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(watch_.Check(), 1);
  ASSERT_EQ(s->stalls.size(), 1u);
  EXPECT_EQ(s->stalls[0], absl::Seconds(6) + absl::Milliseconds(1));
  clock_.Advance(absl::Seconds(60));
  EXPECT_EQ(watch_.Check(), 0);  // no longer watched
  EXPECT_EQ(s->stalls.size(), 1u);
  EXPECT_EQ(watch_.watched(), 0);
}

TEST_F(StallWatchTest, EveryMessageStartsTheSilenceAgain) {
  auto s = std::make_shared<RecordingStream>(clock_.Now());
  watch_.Add(s);
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(5));
    s->Touch(clock_.Now());  // a token or a heartbeat
    EXPECT_EQ(watch_.Check(), 0);
  }
  EXPECT_TRUE(s->stalls.empty());
  EXPECT_EQ(watch_.watched(), 1);
}

TEST_F(StallWatchTest, OnlyTheSilentStreamStalls) {
  auto quiet = std::make_shared<RecordingStream>(clock_.Now());
  auto busy = std::make_shared<RecordingStream>(clock_.Now());
  watch_.Add(quiet);
  watch_.Add(busy);
  clock_.Advance(absl::Seconds(4));
  busy->Touch(clock_.Now());
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(watch_.Check(), 1);
  EXPECT_EQ(quiet->stalls.size(), 1u);
  EXPECT_TRUE(busy->stalls.empty());
  EXPECT_EQ(watch_.watched(), 1);
}

TEST_F(StallWatchTest, EndedAndDestroyedStreamsAreForgotten) {
  auto ended = std::make_shared<RecordingStream>(clock_.Now());
  auto destroyed = std::make_shared<RecordingStream>(clock_.Now());
  watch_.Add(ended);
  watch_.Add(destroyed);
  ended->Done();
  destroyed.reset();
  clock_.Advance(absl::Minutes(1));
  EXPECT_EQ(watch_.Check(), 0);
  EXPECT_TRUE(ended->stalls.empty());
  EXPECT_EQ(watch_.watched(), 0);
}

TEST_F(StallWatchTest, AnInfiniteTimeoutNeverStalls) {
  StallWatch never({.timeout = absl::InfiniteDuration(), .clock = &clock_});
  auto s = std::make_shared<RecordingStream>(clock_.Now());
  never.Add(s);
  clock_.Advance(absl::Hours(24));
  EXPECT_EQ(never.Check(), 0);
  EXPECT_TRUE(s->stalls.empty());
}

// A stream whose OnStalled adds another stream (a migration starts a new attempt) does not
// deadlock the watch.
TEST_F(StallWatchTest, OnStalledMayAddStreams) {
  struct Migrating final : StallWatch::Stream {
    Migrating(absl::Time now, StallWatch* w, FakeClock* c) : Stream(now), watch(w), clock(c) {}
    void OnStalled(absl::Duration) override {
      next = std::make_shared<RecordingStream>(clock->Now());
      watch->Add(next);
    }
    StallWatch* watch;
    FakeClock* clock;
    std::shared_ptr<RecordingStream> next;
  };
  auto s = std::make_shared<Migrating>(clock_.Now(), &watch_, &clock_);
  watch_.Add(s);
  clock_.Advance(absl::Seconds(7));
  EXPECT_EQ(watch_.Check(), 1);
  ASSERT_NE(s->next, nullptr);
  EXPECT_EQ(watch_.watched(), 1);
  clock_.Advance(absl::Seconds(7));
  EXPECT_EQ(watch_.Check(), 1);
  EXPECT_EQ(s->next->stalls.size(), 1u);
}

}  // namespace
}  // namespace tandem::router
