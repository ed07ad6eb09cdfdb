// ServeUntilSignal's drain, with signals from the test (an injected SignalWaiter) and drainables
// that record what happened to them: the health service goes NOT_SERVING before the drain starts,
// the work in progress is waited for until it ends, the timeout passes or a second signal comes,
// and the hand-off always comes last.
#include "common/serve.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Signals that the test raises; the waiter takes one each time it returns true.
class FakeSignals {
 public:
  void Raise() {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  bool Await(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const bool got = mu_.AwaitWithDeadline(absl::Condition(this, &FakeSignals::HasPending), deadline);
    if (got) --pending_;
    return got;
  }
  SignalWaiter waiter() {
    return [this](absl::Time deadline) { return Await(deadline); };
  }

 private:
  bool HasPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ > 0; }
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

// grpc.health.v1.Health/Check on `port` for the whole server: 1 SERVING, 2 NOT_SERVING, -1 when
// the call failed. The request is empty and the answer one varint field, so the bytes are read
// by hand rather than through generated code.
int HealthStatus(int port) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.size() != 2 || bytes[0] != 0x08) return -1;  // field 1, varint
  return bytes[1];
}

// Records its calls; its work ends when the test says so.
class FakeDrainable final : public Drainable {
 public:
  explicit FakeDrainable(std::string name, std::vector<std::string>* journal, absl::Mutex* mu)
      : name_(std::move(name)), journal_(journal), journal_mu_(mu) {}

  // Called at StartDrain (the health status is read there).
  std::function<void()> on_start = [] {};

  void StartDrain() override {
    Record("start");
    on_start();
  }
  bool AwaitIdle(absl::Time deadline) override {
    Record("await");
    last_deadline_ = deadline;
    if (!awaited.HasBeenNotified()) awaited.Notify();
    return work_ended_.WaitForNotificationWithDeadline(deadline);
  }
  void HandOff() override { Record(work_ended_.HasBeenNotified() ? "hand_off" : "hand_off_work"); }

  void EndWork() { work_ended_.Notify(); }
  // AwaitIdle was called.
  absl::Notification awaited;
  absl::Time last_deadline() const { return last_deadline_; }

 private:
  void Record(const std::string& what) {
    absl::MutexLock lock(journal_mu_);
    journal_->push_back(absl::StrCat(name_, ":", what));
  }
  const std::string name_;
  std::vector<std::string>* const journal_;
  absl::Mutex* const journal_mu_;
  absl::Notification work_ended_;
  absl::Time last_deadline_ = absl::InfinitePast();  // the serving thread's only
};

class ServeTest : public ::testing::Test {
 protected:
  // Serves on a thread with `options` (signals from signals_, the drainables a and b); returns
  // the port once it is listening.
  int Serve(ServeOptions options) {
    options.await_signal = signals_.waiter();
    options.drainables = {&a_, &b_};
    // A member, not a local: the thread reads it again after ServeUntilSignal returns, long
    // after this function has (a local here was read after its scope ended and crashed a test).
    thread_ = std::thread([this, options] {
      result_ = ServeUntilSignal("127.0.0.1:0", {}, [&](int port) {
        port_ = port;
        ready_.Notify();
      }, options);
      if (!ready_.HasBeenNotified()) ready_.Notify();
      returned_.Notify();
    });
    ready_.WaitForNotification();
    return port_;
  }
  void TearDown() override {
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> Journal() {
    absl::MutexLock lock(&mu_);
    return journal_;
  }

  FakeSignals signals_;
  absl::Mutex mu_;
  std::vector<std::string> journal_ ABSL_GUARDED_BY(mu_);
  FakeDrainable a_{"a", &journal_, &mu_};
  FakeDrainable b_{"b", &journal_, &mu_};
  std::thread thread_;
  int port_ = 0;
  absl::Status result_;
  absl::Notification ready_;
  absl::Notification returned_;
};

TEST_F(ServeTest, TheHealthGoesNotServingBeforeTheDrainAndEveryPhaseComesInOrder) {
  const int port = Serve({.drain_timeout = absl::Hours(1)});
  EXPECT_EQ(HealthStatus(port), 1);
  int health_at_start = 0;
  a_.on_start = [&] { health_at_start = HealthStatus(port); };
  a_.EndWork();
  b_.EndWork();
  signals_.Raise();
  returned_.WaitForNotification();
  ASSERT_TRUE(result_.ok()) << result_;
  EXPECT_EQ(health_at_start, 2);  // NOT_SERVING
  EXPECT_EQ(Journal(), (std::vector<std::string>{"a:start", "b:start", "a:await", "b:await",
                                                 "a:hand_off", "b:hand_off"}));
}

TEST_F(ServeTest, WorkThatEndsEndsTheDrainLongBeforeTheTimeout) {
  Serve({.drain_timeout = absl::Hours(1)});
  b_.EndWork();
  signals_.Raise();
  // a's work holds the drain (waited for in slices, with a look for a second signal between).
  a_.awaited.WaitForNotification();
  a_.EndWork();
  returned_.WaitForNotification();  // an hour's timeout: only the work's end got here
  const std::vector<std::string> journal = Journal();
  ASSERT_GE(journal.size(), 4u);
  EXPECT_EQ(journal[journal.size() - 2], "a:hand_off");
  EXPECT_EQ(journal.back(), "b:hand_off");
}

TEST_F(ServeTest, WorkThatOutlivesTheTimeoutIsHandedOffAtTheDeadline) {
  const absl::Time before = absl::Now();
  Serve({.drain_timeout = absl::Milliseconds(300)});
  signals_.Raise();
  returned_.WaitForNotification();
  const std::vector<std::string> journal = Journal();
  ASSERT_FALSE(journal.empty());
  EXPECT_EQ(journal.back(), "b:hand_off_work");
  EXPECT_NE(std::find(journal.begin(), journal.end(), "a:hand_off_work"), journal.end());
  // a was never idle: b was never waited for.
  EXPECT_EQ(std::find(journal.begin(), journal.end(), "b:await"), journal.end());
  // The last wait ran to the drain's deadline, which is the timeout after the signal.
  EXPECT_GE(a_.last_deadline(), before + absl::Milliseconds(300));
}

TEST_F(ServeTest, ASecondSignalEndsTheDrainAtOnce) {
  Serve({.drain_timeout = absl::Hours(1)});
  signals_.Raise();
  signals_.Raise();  // taken between two waits for a's work, which never ends
  returned_.WaitForNotification();  // an hour's timeout: only the second signal got here
  const std::vector<std::string> journal = Journal();
  ASSERT_FALSE(journal.empty());
  EXPECT_EQ(journal.back(), "b:hand_off_work");
}

TEST(ServeOptionsTest, ANegativeTimeoutIsRefused) {
  const absl::Status s =
      ServeUntilSignal("127.0.0.1:0", {}, [](int) {},
                       ServeOptions{.drain_timeout = absl::Seconds(-1),
                                    .await_signal = [](absl::Time) { return true; }});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
