// What only the in-process transport does: its address is its name, unique in the process, and it
// runs a writer's operations one by one on the writer's thread. What every transport does is in
// kv_transport_conformance_test.cc, which runs against this one too.
#include "kvtransfer/inproc_transport.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transport_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;
using testing::Conn;
using testing::Done;
using testing::kWait;
using testing::Layout;
using testing::MustConnect;
using testing::RandomPool;
using testing::SameLayers;
using testing::Side;

Side MakeSide(const std::string& name, const KvLayout& layout, uint32_t seed) {
  return testing::MakeSide(CreateInProcessTransport(name), layout, seed);
}

TEST(InProcessTransportTest, AddressIsTheTransportsUniqueName) {
  Side owner = MakeSide("inproc-name-owner", Layout(4), 1);
  Side writer = MakeSide("inproc-name-writer", Layout(4), 2);
  EXPECT_EQ(owner.descriptor.address, "inproc-name-owner");
  EXPECT_EQ(MustConnect(writer, owner.descriptor)->Describe(), "inproc (memcpy)");
  auto other = RandomPool(Layout(4), 3);
  auto twin = CreateInProcessTransport("inproc-name-owner");
  absl::StatusOr<PoolDescriptor> d = twin->RegisterPool(other.get());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kAlreadyExists) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("inproc-name-owner"));
}

TEST(InProcessTransportTest, ConnectRefusesAnUnknownNameAndAPassedDeadline) {
  Side owner = MakeSide("inproc-refuse-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-refuse-writer", Layout(8), 2);
  PoolDescriptor d = owner.descriptor;
  d.address = "inproc-nobody";
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      writer.transport->Connect(d, absl::Now() + kWait);
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kUnavailable) << conn.status();
  EXPECT_THAT(conn.status().message(), HasSubstr("no in-process pool 'inproc-nobody'"));
  EXPECT_EQ(writer.transport->Connect(owner.descriptor, absl::Now() - absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

// An owner that restarts under its name is found again by that name; the descriptors of its
// earlier registrations are stale, whether it registered the same pool anew (only the epoch
// differs) or another one.
TEST(InProcessTransportTest, ARestartedOwnerRefusesItsOldDescriptors) {
  Side writer = MakeSide("inproc-stale-writer", Layout(8), 2);
  auto pool = RandomPool(Layout(8), 1);
  PoolDescriptor old;
  {
    auto owner = CreateInProcessTransport("inproc-stale-owner");
    old = *owner->RegisterPool(pool.get());
  }
  EXPECT_EQ(writer.transport->Connect(old, absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
  {
    auto same_pool = CreateInProcessTransport("inproc-stale-owner");
    ASSERT_TRUE(same_pool->RegisterPool(pool.get()).ok());
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(old, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition) << conn.status();
  }
  auto other_pool = RandomPool(Layout(8), 3);
  auto other = CreateInProcessTransport("inproc-stale-owner");
  ASSERT_TRUE(other->RegisterPool(other_pool.get()).ok());
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      writer.transport->Connect(old, absl::Now() + kWait);
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition) << conn.status();
}

// The transport checks an operation's deadline when the writer's thread reaches it: a write past
// its deadline ends DEADLINE_EXCEEDED before it copies anything, and closes the connection as UCX
// does (ucx_transport.h).
TEST(InProcessTransportTest, PassedDeadlineEndsTheOperation) {
  Side owner = MakeSide("inproc-deadline-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-deadline-writer", Layout(8), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  Done write, note;
  const absl::Time past = absl::Now() - absl::Milliseconds(1);
  ASSERT_TRUE(conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 4}, past,
                          write.Callback())
                  .ok());
  ASSERT_TRUE(conn->Notify("late", past, note.Callback()).ok());
  EXPECT_EQ(write.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(note.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  auto fresh = RandomPool(Layout(8), 1);
  EXPECT_TRUE(SameLayers(*fresh, 1, *owner.pool, 1, 0, 4));  // the expired write did not land
  Done next;
  const absl::Status started = conn->Write({.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 1},
                                           absl::Now() + kWait, next.Callback());
  testing::ExpectUnavailable(started, next);
}

// Dropping the last connection while its writes are still queued, after the writer's transport
// is gone: the last reference then dies on the transport's own task thread, whose destructor
// joins that thread (inproc_transport.cc, TaskThread::~TaskThread) -> std::system_error
// (EDEADLK) from a destructor -> std::terminate. In a child process so that the crash fails this
// test alone.
TEST(InProcessTransportDeathTest, DroppingEverythingWhileWritesAreQueuedIsSafe) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    Side owner = MakeSide("inproc-drop-owner", Layout(8), 1);
    auto writer = std::make_unique<Side>(MakeSide("inproc-drop-writer", Layout(8), 2));
    std::shared_ptr<Connection> conn =
        *writer->transport->Connect(owner.descriptor, absl::Now() + kWait);
    absl::Notification entered, release, finished;
    (void)conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1},
                      absl::Now() + kWait, [&](absl::Status) {
                        entered.Notify();
                        release.WaitForNotificationWithTimeout(kWait);
                      });
    (void)conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 1},
                      absl::Now() + kWait, [&](absl::Status) { finished.Notify(); });
    entered.WaitForNotificationWithTimeout(kWait);
    conn.reset();
    writer->transport.reset();
    release.Notify();
    finished.WaitForNotificationWithTimeout(kWait);
    // The queued tasks (and with them the last connection) are destroyed after `finished`.
    absl::SleepFor(absl::Milliseconds(200));
    std::_Exit(finished.HasBeenNotified() ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tandem::kvtransfer
