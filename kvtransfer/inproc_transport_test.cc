// The in-process transport: what the layers above rely on when they test without UCX. Its header
// promises UCX's errors and behaviour (kv_transport.h, ucx_transport.h, docs/kvtransfer.md).
#include "kvtransfer/inproc_transport.h"

#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "kvtransfer/transport_test_util.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;
using testing::Done;
using testing::kWait;
using testing::RandomPool;
using testing::SameLayers;

KvLayout Layout(int64_t blocks, int64_t layers = 4) {
  return KvLayout{.num_blocks = blocks, .num_layers = layers, .block_size = 4, .num_kv_heads = 2,
                  .head_dim = 8};
}

struct Side {
  std::unique_ptr<KvStorage> pool;
  std::unique_ptr<KvTransport> transport;  // declared after the pool: destroyed before it
  PoolDescriptor descriptor;
};

Side MakeSide(const std::string& name, const KvLayout& layout, uint32_t seed) {
  Side side;
  side.pool = RandomPool(layout, seed);
  side.transport = CreateInProcessTransport(name);
  absl::StatusOr<PoolDescriptor> d = side.transport->RegisterPool(side.pool.get());
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok()) side.descriptor = *d;
  return side;
}

// A test's connection. When the test lets go of it, it first waits (bounded) until no task of the
// writer's thread holds the connection any more, so that each test tears down in one order.
// (DroppingEverythingWhileWritesAreQueuedIsSafe covers the other order: the last reference
// dying on that thread.)
class Conn {
 public:
  explicit Conn(std::shared_ptr<Connection> c) : c_(std::move(c)) {}
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ~Conn() { reset(); }

  Connection* operator->() const { return c_.get(); }
  bool operator==(std::nullptr_t) const { return c_ == nullptr; }
  void reset() {
    const absl::Time give_up = absl::Now() + kWait;
    while (c_.use_count() > 1 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    c_.reset();
  }

 private:
  std::shared_ptr<Connection> c_;
};

Conn MustConnect(Side& writer, const PoolDescriptor& remote) {
  absl::StatusOr<std::shared_ptr<Connection>> c =
      writer.transport->Connect(remote, absl::Now() + kWait);
  EXPECT_TRUE(c.ok()) << c.status();
  return Conn(c.ok() ? *std::move(c) : nullptr);
}

// Notifications received by an owner.
class Inbox {
 public:
  explicit Inbox(KvTransport* owner) {
    owner->SetNotificationHandler([this](Notification n) {
      absl::MutexLock lock(&mu_);
      got_.push_back(std::move(n));
    });
  }
  // The first `n` notifications, after waiting (bounded) for them.
  std::vector<Notification> Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return got_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Notification> got_ ABSL_GUARDED_BY(mu_);
};

TEST(InProcessTransportTest, DescriptorDescribesThePool) {
  Side owner = MakeSide("inproc-describe", Layout(16), 1);
  const PoolDescriptor& d = owner.descriptor;
  EXPECT_TRUE(ValidateDescriptor(d).ok());
  EXPECT_EQ(d.transport, "inproc");
  EXPECT_EQ(d.address, "inproc-describe");
  EXPECT_EQ(owner.transport->name(), "inproc-describe");
  ASSERT_EQ(d.regions.size(), 1u);
  EXPECT_EQ(d.regions[0].base_address, reinterpret_cast<uint64_t>(owner.pool->data()));
  EXPECT_EQ(d.regions[0].length, 16 * Layout(16).block_stride() * sizeof(float));
  EXPECT_EQ(d.layout.num_blocks, 16);
}

TEST(InProcessTransportTest, WritesLayerByLayerAndNotifiesAfterTheData) {
  Side owner = MakeSide("inproc-owner", Layout(16), 1);
  Side writer = MakeSide("inproc-writer", Layout(8), 2);
  // On each notification "layer L", layers [0, L] of every pair must be in place already.
  const std::vector<BlockPair> pairs = {{0, 5}, {3, 1}, {7, 15}, {3, 2}};
  absl::Mutex mu;
  std::vector<std::string> checked;
  owner.transport->SetNotificationHandler([&](Notification n) {
    const int layer = n.message.back() - '0';
    bool in_place = true;
    for (const BlockPair& p : pairs) {
      in_place = in_place && SameLayers(*writer.pool, p.src, *owner.pool, p.dst, 0, layer + 1);
    }
    absl::MutexLock lock(&mu);
    checked.push_back(absl::StrCat(n.peer, " ", n.message, in_place ? " in place" : " EARLY"));
  });
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  EXPECT_EQ(conn->Describe(), "inproc (memcpy)");
  std::vector<Done> writes(4), notes(4);
  for (int32_t layer = 0; layer < 4; ++layer) {
    ASSERT_TRUE(conn->Write({.blocks = pairs, .first_layer = layer, .num_layers = 1},
                            absl::Now() + kWait, writes[layer].Callback())
                    .ok());
    ASSERT_TRUE(conn->Notify(absl::StrCat("layer ", layer), absl::Now() + kWait,
                             notes[layer].Callback())
                    .ok());
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(writes[i].Wait().ok());
    EXPECT_TRUE(notes[i].Wait().ok());
  }
  {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](std::vector<std::string>* c) { return c->size() >= 4; }, &checked),
                        kWait);
    EXPECT_THAT(checked, ::testing::ElementsAre(
                             "inproc-writer layer 0 in place", "inproc-writer layer 1 in place",
                             "inproc-writer layer 2 in place", "inproc-writer layer 3 in place"));
  }
  // Blocks that no pair names are untouched.
  auto fresh = RandomPool(Layout(16), 1);
  for (int32_t b : {0, 3, 4, 6, 14}) {
    EXPECT_TRUE(SameLayers(*fresh, b, *owner.pool, b, 0, 4)) << b;
  }
}

TEST(InProcessTransportTest, WritesALayerRangeInOneOperation) {
  Side owner = MakeSide("inproc-range-owner", Layout(8, 6), 1);
  Side writer = MakeSide("inproc-range-writer", Layout(8, 6), 2);
  auto before = RandomPool(Layout(8, 6), 1);
  Conn conn = MustConnect(writer, owner.descriptor);
  Done done;
  ASSERT_TRUE(conn->Write({.blocks = {{2, 6}}, .first_layer = 1, .num_layers = 3},
                          absl::Now() + kWait, done.Callback())
                  .ok());
  ASSERT_TRUE(done.Wait().ok());
  EXPECT_TRUE(SameLayers(*writer.pool, 2, *owner.pool, 6, 1, 3));
  EXPECT_TRUE(SameLayers(*before, 6, *owner.pool, 6, 0, 1));  // layers outside the range stay
  EXPECT_TRUE(SameLayers(*before, 6, *owner.pool, 6, 4, 2));
}

TEST(InProcessTransportTest, RegistersOnePoolUnderAUniqueName) {
  Side owner = MakeSide("inproc-once", Layout(4), 1);
  auto other = RandomPool(Layout(4), 2);
  EXPECT_EQ(owner.transport->RegisterPool(other.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto twin = CreateInProcessTransport("inproc-once");
  absl::StatusOr<PoolDescriptor> d = twin->RegisterPool(other.get());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kAlreadyExists) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("inproc-once"));
}

TEST(InProcessTransportTest, ConnectRefusesWhatItCannotUse) {
  Side owner = MakeSide("inproc-refuse-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-refuse-writer", Layout(8), 2);
  const absl::Time deadline = absl::Now() + kWait;
  struct Case {
    const char* name;
    PoolDescriptor descriptor;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  PoolDescriptor d = owner.descriptor;
  d.transport = "ucx";
  cases.push_back({"ucx", d, absl::StatusCode::kInvalidArgument,
                   "a descriptor of transport 'ucx' given to inproc"});
  d = owner.descriptor;
  d.regions[0].base_address = 0;
  cases.push_back({"no address", d, absl::StatusCode::kInvalidArgument, "no address"});
  d = owner.descriptor;
  d.layout.num_layers = 5;
  d.regions[0].length = static_cast<uint64_t>(d.layout.total_bytes());
  cases.push_back({"layout", d, absl::StatusCode::kInvalidArgument, "KV layouts differ"});
  d = owner.descriptor;
  d.address = "inproc-nobody";
  cases.push_back({"unknown", d, absl::StatusCode::kUnavailable, "no in-process pool 'inproc-nobody'"});
  d = owner.descriptor;
  d.regions[0].base_address += 4096;
  cases.push_back({"other base", d, absl::StatusCode::kFailedPrecondition, "is stale"});
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<Connection>> conn = writer.transport->Connect(c.descriptor, deadline);
    EXPECT_EQ(conn.status().code(), c.code) << c.name << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr(c.message)) << c.name;
  }
  auto lonely = CreateInProcessTransport("inproc-no-pool");
  EXPECT_EQ(lonely->Connect(owner.descriptor, deadline).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer.transport->Connect(owner.descriptor, absl::Now() - absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(InProcessTransportTest, DescriptorOfADestroyedOwnerIsRefused) {
  Side writer = MakeSide("inproc-stale-writer", Layout(8), 2);
  auto pool = RandomPool(Layout(8), 1);
  PoolDescriptor old;
  {
    auto owner = CreateInProcessTransport("inproc-stale-owner");
    old = *owner->RegisterPool(pool.get());
  }
  EXPECT_EQ(writer.transport->Connect(old, absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
  // The owner restarts under the same name with another pool: the old descriptor is stale.
  auto other_pool = RandomPool(Layout(8), 3);
  auto restarted = CreateInProcessTransport("inproc-stale-owner");
  ASSERT_TRUE(restarted->RegisterPool(other_pool.get()).ok());
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      writer.transport->Connect(old, absl::Now() + kWait);
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition) << conn.status();
}

// tandem.v1.KvPoolDescriptor.pool_epoch "changes (grows) every time the pool is registered anew",
// and a writer "fails a transfer to a stale descriptor with FAILED_PRECONDITION"; UCX does so
// (ucx_transport.cc: the handshake compares epochs). The in-process transport, which promises
// UCX's errors, hands out epoch 1 at every registration and never compares it.
TEST(InProcessTransportTest, EpochGrowsWithEachRegistrationAndIsChecked) {
  Side writer = MakeSide("inproc-epoch-writer", Layout(8), 2);
  auto pool = RandomPool(Layout(8), 1);
  PoolDescriptor first;
  {
    auto owner = CreateInProcessTransport("inproc-epoch-owner");
    first = *owner->RegisterPool(pool.get());
  }
  // The same pool registered anew (an owner restarted its transport).
  auto owner = CreateInProcessTransport("inproc-epoch-owner");
  const PoolDescriptor second = *owner->RegisterPool(pool.get());
  EXPECT_GT(second.pool_epoch, first.pool_epoch);
  EXPECT_EQ(writer.transport->Connect(first, absl::Now() + kWait).status().code(),
            absl::StatusCode::kFailedPrecondition);
  PoolDescriptor forged = second;
  forged.pool_epoch += 1;
  EXPECT_EQ(writer.transport->Connect(forged, absl::Now() + kWait).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(writer.transport->Connect(second, absl::Now() + kWait).ok());
}

TEST(InProcessTransportTest, WritesThatCannotStartFailAtOnceWithoutACallback) {
  Side owner = MakeSide("inproc-bad-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-bad-writer", Layout(4), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  const absl::Time deadline = absl::Now() + kWait;
  const WriteOp bad[] = {
      {.blocks = {}, .first_layer = 0, .num_layers = 1},
      {.blocks = {{4, 0}}, .first_layer = 0, .num_layers = 1},
      {.blocks = {{0, 8}}, .first_layer = 0, .num_layers = 1},
      {.blocks = {{0, -1}}, .first_layer = 0, .num_layers = 1},
      {.blocks = {{0, 0}}, .first_layer = 3, .num_layers = 2},
      {.blocks = {{0, 0}}, .first_layer = -1, .num_layers = 1},
      {.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 0},
  };
  std::vector<Done> refused(std::size(bad));
  for (size_t i = 0; i < std::size(bad); ++i) {
    EXPECT_EQ(conn->Write(bad[i], deadline, refused[i].Callback()).code(),
              absl::StatusCode::kInvalidArgument)
        << i;
  }
  Done too_long;
  EXPECT_EQ(conn->Notify(std::string(kMaxNotificationBytes + 1, 'x'), deadline, too_long.Callback())
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Operations run in issue order: once a later one has ended, a queued refused one would have.
  Done later;
  ASSERT_TRUE(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, deadline,
                          later.Callback())
                  .ok());
  ASSERT_TRUE(later.Wait().ok());
  for (size_t i = 0; i < std::size(bad); ++i) EXPECT_EQ(refused[i].calls(), 0) << i;
  EXPECT_EQ(too_long.calls(), 0);
}

TEST(InProcessTransportTest, NotificationOfTheMaximumSizeArrivesWhole) {
  Side owner = MakeSide("inproc-big-owner", Layout(4), 1);
  Side writer = MakeSide("inproc-big-writer", Layout(4), 2);
  Inbox inbox(owner.transport.get());
  Conn conn = MustConnect(writer, owner.descriptor);
  std::string message(kMaxNotificationBytes, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 131 % 251);
  Done done;
  ASSERT_TRUE(conn->Notify(message, absl::Now() + kWait, done.Callback()).ok());
  ASSERT_TRUE(done.Wait().ok());
  const std::vector<Notification> got = inbox.Wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].message == message);
  EXPECT_EQ(got[0].peer, "inproc-big-writer");
}

TEST(InProcessTransportTest, CancelEndsOutstandingOperations) {
  Side owner = MakeSide("inproc-cancel-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-cancel-writer", Layout(8), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  const absl::Time deadline = absl::Now() + kWait;
  // The first write's callback holds the writer's thread, so what follows stays queued.
  absl::Notification entered, release;
  Done first;
  ASSERT_TRUE(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, deadline,
                          [&](absl::Status s) {
                            entered.Notify();
                            release.WaitForNotificationWithTimeout(kWait);
                            first.Callback()(std::move(s));
                          })
                  .ok());
  std::vector<Done> queued(3);
  ASSERT_TRUE(conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 4}, deadline,
                          queued[0].Callback())
                  .ok());
  ASSERT_TRUE(conn->Notify("half", deadline, queued[1].Callback()).ok());
  ASSERT_TRUE(conn->Write({.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 4}, deadline,
                          queued[2].Callback())
                  .ok());
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(kWait));
  conn->Cancel();
  release.Notify();
  EXPECT_TRUE(first.Wait().ok());
  for (Done& d : queued) EXPECT_EQ(d.Wait().code(), absl::StatusCode::kCancelled);
  for (Done& d : queued) EXPECT_EQ(d.calls(), 1);
  // The cancelled writes did not land.
  auto fresh = RandomPool(Layout(8), 1);
  EXPECT_TRUE(SameLayers(*fresh, 1, *owner.pool, 1, 0, 4));
  EXPECT_TRUE(SameLayers(*fresh, 2, *owner.pool, 2, 0, 4));
  // The connection is closed.
  Done after;
  EXPECT_EQ(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, deadline,
                        after.Callback())
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(conn->Notify("after", deadline, after.Callback()).code(),
            absl::StatusCode::kUnavailable);
}

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
}

// ucx_transport.h: "When an operation's deadline passes ... the connection is closed at once (so
// no late write lands in blocks the owner has since reused) ... Connect again to go on." The
// in-process transport says its "deadlines ... behave the same", yet keeps the connection open.
TEST(InProcessTransportTest, PassedDeadlineClosesTheConnectionLikeUcx) {
  Side owner = MakeSide("inproc-close-owner", Layout(8), 1);
  Side writer = MakeSide("inproc-close-writer", Layout(8), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  Done expired;
  ASSERT_TRUE(conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 1},
                          absl::Now() - absl::Milliseconds(1), expired.Callback())
                  .ok());
  ASSERT_EQ(expired.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  Done next;
  const absl::Status started = conn->Write({.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 1},
                                           absl::Now() + kWait, next.Callback());
  if (started.ok()) {
    EXPECT_EQ(next.Wait().code(), absl::StatusCode::kUnavailable)
        << "a write after an expired one still landed";
  } else {
    EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable);
  }
}

TEST(InProcessTransportTest, DestroyedOwnerFailsWritesAndNotificationsUnavailable) {
  Side writer = MakeSide("inproc-gone-writer", Layout(8), 2);
  auto owner = std::make_unique<Side>(MakeSide("inproc-gone-owner", Layout(8), 1));
  Conn conn = MustConnect(writer, owner->descriptor);
  Done ok;
  ASSERT_TRUE(conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 1},
                          absl::Now() + kWait, ok.Callback())
                  .ok());
  ASSERT_TRUE(ok.Wait().ok());
  owner.reset();
  Done write, note;
  const absl::Time deadline = absl::Now() + kWait;
  ASSERT_TRUE(conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 1}, deadline,
                          write.Callback())
                  .ok());
  ASSERT_TRUE(conn->Notify("anyone?", deadline, note.Callback()).ok());
  EXPECT_EQ(write.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(note.Wait().code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessTransportTest, ConnectionMayOutliveItsTransport) {
  Side owner = MakeSide("inproc-outlive-owner", Layout(8), 1);
  auto writer = std::make_unique<Side>(MakeSide("inproc-outlive-writer", Layout(8), 2));
  Conn conn = MustConnect(*writer, owner.descriptor);
  writer->transport.reset();
  conn.reset();  // must not touch the destroyed transport
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

// Several writers into one owner, and one writer into several owners, all at once from their own
// threads: every byte lands where it should and every notification reaches its owner.
TEST(InProcessTransportTest, ConcurrentWritersAndOwners) {
  constexpr int kWriters = 3, kOwners = 3, kWrites = 20;
  const KvLayout owner_layout = Layout(kWriters * kWrites), writer_layout = Layout(kWrites);
  std::vector<Side> owners, writers;
  std::vector<std::unique_ptr<Inbox>> inboxes;
  for (int o = 0; o < kOwners; ++o) {
    owners.push_back(MakeSide(absl::StrCat("inproc-many-owner", o), owner_layout, 10 + o));
    inboxes.push_back(std::make_unique<Inbox>(owners.back().transport.get()));
  }
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(MakeSide(absl::StrCat("inproc-many-writer", w), writer_layout, 20 + w));
  }
  // Writer w sends its block j to block w * kWrites + j of every owner.
  std::vector<Done> done(kWriters * kOwners * (kWrites + 1));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    for (int o = 0; o < kOwners; ++o) {
      threads.emplace_back([&, w, o] {
        Conn conn = MustConnect(writers[w], owners[o].descriptor);
        if (conn == nullptr) return;
        Done* mine = &done[(w * kOwners + o) * (kWrites + 1)];
        for (int j = 0; j < kWrites; ++j) {
          EXPECT_TRUE(conn->Write({.blocks = {{j, w * kWrites + j}}, .first_layer = 0,
                                   .num_layers = 4},
                                  absl::Now() + kWait, mine[j].Callback())
                          .ok());
        }
        EXPECT_TRUE(conn->Notify("done", absl::Now() + kWait, mine[kWrites].Callback()).ok());
        for (int j = 0; j <= kWrites; ++j) EXPECT_TRUE(mine[j].Wait().ok());
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (int o = 0; o < kOwners; ++o) {
    EXPECT_EQ(inboxes[o]->Wait(kWriters).size(), static_cast<size_t>(kWriters));
    for (int w = 0; w < kWriters; ++w) {
      for (int j = 0; j < kWrites; ++j) {
        EXPECT_TRUE(SameLayers(*writers[w].pool, j, *owners[o].pool, w * kWrites + j, 0, 4))
            << "owner " << o << " writer " << w << " block " << j;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
