#include "kvtransfer/ucx_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
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

KvLayout Layout(int64_t blocks, int64_t layers = 4, int64_t block_size = 4) {
  return KvLayout{.num_blocks = blocks, .num_layers = layers, .block_size = block_size,
                  .num_kv_heads = 2, .head_dim = 8};
}

absl::Status WaitFor(const std::function<absl::Status(DoneCallback)>& start) {
  absl::Notification done;
  absl::Status result;
  absl::Status started = start([&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  if (!started.ok()) return started;
  done.WaitForNotification();
  return result;
}

struct Side {
  std::unique_ptr<KvStorage> pool;
  std::unique_ptr<KvTransport> transport;  // after the pool: destroyed before it
  PoolDescriptor descriptor;
};

Side MakeSide(const std::string& name, const std::string& tls, const KvLayout& layout, uint32_t seed) {
  Side side;
  auto t = CreateUcxTransport({.name = name, .transports = tls});
  CHECK(t.ok()) << t.status();
  side.transport = *std::move(t);
  side.pool = RandomPool(layout, seed);
  auto d = side.transport->RegisterPool(side.pool.get());
  CHECK(d.ok()) << d.status();
  side.descriptor = *d;
  return side;
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, WritesLayersAndNotifiesAfterTheData) {
  const KvLayout layout = Layout(16);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  absl::Mutex mu;
  std::vector<Notification> got;
  owner.transport->SetNotificationHandler([&](Notification n) {
    absl::MutexLock lock(&mu);
    got.push_back(std::move(n));
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto conn = writer.transport->Connect(owner.descriptor, deadline);
  ASSERT_TRUE(conn.ok()) << conn.status();
  LOG(INFO) << "connection: " << (*conn)->Describe();
  const std::vector<BlockPair> pairs = {{0, 5}, {3, 1}, {7, 15}};
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    ASSERT_TRUE(WaitFor([&](DoneCallback done) {
                  return (*conn)->Write({.blocks = pairs, .first_layer = layer, .num_layers = 1},
                                        deadline, std::move(done));
                }).ok());
  }
  ASSERT_TRUE(WaitFor([&](DoneCallback done) {
                return (*conn)->Notify("all layers", deadline, std::move(done));
              }).ok());
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].message, "all layers");
    EXPECT_EQ(got[0].peer, "writer");
  }
  const size_t block_bytes = static_cast<size_t>(layout.block_stride()) * sizeof(float);
  for (const BlockPair& p : pairs) {
    EXPECT_EQ(std::memcmp(owner.pool->data() + p.dst * layout.block_stride(),
                          writer.pool->data() + p.src * layout.block_stride(), block_bytes),
              0)
        << p.src << " -> " << p.dst;
  }
}

// ---------------------------------------------------------------------------------------------
// Failure, refusal and concurrency, with both sides in this process.
// ---------------------------------------------------------------------------------------------

constexpr absl::Duration kSlack = absl::Seconds(1);  // how late after a deadline an error may come

std::shared_ptr<Connection> MustConnect(Side& writer, const PoolDescriptor& remote) {
  absl::StatusOr<std::shared_ptr<Connection>> c =
      writer.transport->Connect(remote, absl::Now() + kWait);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

// Notifications received by an owner; optionally holds the owner's thread in its handler.
class Inbox {
 public:
  explicit Inbox(KvTransport* owner) : owner_(owner) {
    owner->SetNotificationHandler([this](Notification n) { Add(std::move(n)); });
  }
  // The handler: keeps `n`, and waits while held.
  void Add(Notification n) {
    absl::MutexLock lock(&mu_);
    got_.push_back(std::move(n));
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_; };
    mu_.AwaitWithTimeout(absl::Condition(&released), kWait);
  }
  ~Inbox() {
    Release();
    owner_->SetNotificationHandler(nullptr);
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  // The notifications, once there are at least `n` (bounded wait).
  std::vector<Notification> Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return got_;
  }

 private:
  KvTransport* const owner_;
  absl::Mutex mu_;
  std::vector<Notification> got_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
};

// Lets the owner's handler go and waits until the owner has answered everything it held: a
// notification on a fresh connection is acknowledged only after the earlier acknowledgements
// were sent. Tests that hold an owner's handler end with it, while the writer is still alive
// (see OwnerSurvivesAWriterThatLeftBeforeItsAcknowledgement for why).
void SettleOwner(Side& writer, Side& owner, Inbox& inbox) {
  inbox.Release();
  std::shared_ptr<Connection> again = MustConnect(writer, owner.descriptor);
  ASSERT_NE(again, nullptr);
  Done note;
  ASSERT_TRUE(again->Notify("settle", absl::Now() + kWait, note.Callback()).ok());
  EXPECT_TRUE(note.Wait().ok()) << note.Wait();
}

// "Layers 0..L of request R" only means something if a connection's notifications reach the owner
// in the order they were issued. Each notification is sent when its own endpoint flush completes
// (ucx_transport.cc, StartNotify -> Flush -> Flushed -> SendAm), and nothing orders those
// completions and sends among each other: a flush issued later can complete at once while an
// earlier one still waits for its callback. Over shared memory, later notifications overtake
// earlier ones. Writes and notifications are issued back to back from many threads on each
// writer's connection, as the transfers of many requests would be.
TEST_P(UcxTransportTest, NotificationsArriveInIssueOrder) {
  constexpr int kWriters = 3, kThreads = 20, kSteps = 4;
  const KvLayout layout = Layout(kThreads, kSteps);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  std::vector<Side> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(MakeSide(absl::StrCat("writer", w), GetParam(), layout, 2 + w));
  }
  // The owner spends a little time on each notification, as a decode worker would.
  Inbox inbox(owner.transport.get());
  owner.transport->SetNotificationHandler([&inbox](Notification n) {
    absl::SleepFor(absl::Microseconds(200));
    inbox.Add(std::move(n));
  });
  std::vector<std::shared_ptr<Connection>> conns;
  for (Side& w : writers) conns.push_back(MustConnect(w, owner.descriptor));
  for (const auto& c : conns) ASSERT_NE(c, nullptr);
  // Rounds of kWriters x kThreads transfers of kSteps (write, notify) each; an overtaking shows
  // in most rounds on shared memory, so a few rounds make the check all but certain.
  constexpr int kRounds = 4;
  const size_t per_round = kWriters * kThreads * kSteps;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Done> done(per_round * 2);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, w, t] {
          Done* mine = &done[(w * kThreads + t) * kSteps * 2];
          for (int i = 0; i < kSteps; ++i) {
            EXPECT_TRUE(conns[w]->Write({.blocks = {{t, t}}, .first_layer = i, .num_layers = 1},
                                        absl::Now() + kWait, mine[2 * i].Callback())
                            .ok());
            EXPECT_TRUE(conns[w]->Notify(absl::StrCat(t, " ", i), absl::Now() + kWait,
                                         mine[2 * i + 1].Callback())
                            .ok());
          }
        });
      }
    }
    for (std::thread& t : threads) t.join();
    for (Done& d : done) ASSERT_TRUE(d.Wait().ok()) << d.Wait();
    std::vector<Notification> got = inbox.Wait((round + 1) * per_round);
    ASSERT_EQ(got.size(), (round + 1) * per_round);
    got.erase(got.begin(), got.begin() + static_cast<ptrdiff_t>(round * per_round));
    std::map<std::pair<std::string, int>, int> next;  // (writer, thread) -> the step due next
    int overtaken = 0;
    for (const Notification& n : got) {
      const size_t space = n.message.find(' ');
      const int t = std::stoi(n.message.substr(0, space));
      int& expected = next[{n.peer, t}];
      if (n.message != absl::StrCat(t, " ", expected)) {
        ++overtaken;
        ADD_FAILURE() << "round " << round << ": from " << n.peer << " \"" << n.message
                      << "\" arrived while \"" << t << " " << expected
                      << "\" was due: a later notification overtook an earlier one";
      }
      expected = std::stoi(n.message.substr(space + 1)) + 1;
    }
    if (overtaken > 0) break;
  }
}

TEST_P(UcxTransportTest, DescriptorOfADestroyedTransportIsRefused) {
  const KvLayout layout = Layout(8);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  auto pool = RandomPool(layout, 1);
  PoolDescriptor old;
  {
    auto owner = *CreateUcxTransport({.name = "owner-old", .transports = GetParam()});
    old = *owner->RegisterPool(pool.get());
  }
  // The owner comes back with a new transport and registers the same pool anew.
  auto owner = *CreateUcxTransport({.name = "owner-new", .transports = GetParam()});
  const PoolDescriptor current = *owner->RegisterPool(pool.get());
  EXPECT_GT(current.pool_epoch, old.pool_epoch);
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Seconds(3);
  absl::StatusOr<std::shared_ptr<Connection>> conn = writer.transport->Connect(old, start + timeout);
  EXPECT_THAT(conn.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                     absl::StatusCode::kFailedPrecondition))
      << conn.status();
  EXPECT_LE(absl::Now() - start, timeout + kSlack);
  EXPECT_TRUE(writer.transport->Connect(current, absl::Now() + kWait).ok());
}

TEST_P(UcxTransportTest, ForgedDescriptorIsStale) {
  const KvLayout layout = Layout(16);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  std::vector<std::pair<std::string, PoolDescriptor>> forged;
  PoolDescriptor d = owner.descriptor;
  d.pool_epoch += 1;
  forged.emplace_back("newer epoch", d);
  d = owner.descriptor;
  d.pool_epoch -= 1;
  forged.emplace_back("older epoch", d);
  d = owner.descriptor;
  d.regions[0].base_address += 4096;
  forged.emplace_back("other base address", d);
  d = owner.descriptor;
  d.layout.num_blocks = 8;
  d.regions[0].length /= 2;
  forged.emplace_back("other block count", d);
  for (const auto& [what, descriptor] : forged) {
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(descriptor, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition)
        << what << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr("the descriptor is stale")) << what;
  }
  // The owner is unharmed.
  EXPECT_TRUE(writer.transport->Connect(owner.descriptor, absl::Now() + kWait).ok());
}

TEST_P(UcxTransportTest, ConnectRefusesBadDescriptorsAtOnce) {
  const KvLayout layout = Layout(8);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  struct Case {
    std::string name;
    PoolDescriptor descriptor;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  PoolDescriptor d = owner.descriptor;
  d.address.back() ^= 0x5a;
  cases.push_back({"corrupt address", d, absl::StatusCode::kInvalidArgument,
                   "the descriptor's UCX address is corrupt (checksum)"});
  d = owner.descriptor;
  d.address[20] ^= 0x01;
  cases.push_back({"one bit flipped", d, absl::StatusCode::kInvalidArgument, "(checksum)"});
  d = owner.descriptor;
  d.address.resize(d.address.size() - 3);
  cases.push_back({"truncated address", d, absl::StatusCode::kInvalidArgument,
                   "the descriptor's UCX address is truncated"});
  d = owner.descriptor;
  d.address += "xyz";
  cases.push_back({"longer address", d, absl::StatusCode::kInvalidArgument, "truncated"});
  d = owner.descriptor;
  d.address[0] = 'X';
  cases.push_back({"foreign address", d, absl::StatusCode::kInvalidArgument,
                   "the descriptor's address is not a Tandem UCX address"});
  d = owner.descriptor;
  d.address.clear();
  cases.push_back({"no address", d, absl::StatusCode::kInvalidArgument, "not a Tandem UCX address"});
  d = owner.descriptor;
  d.transport = "inproc";
  cases.push_back({"other transport", d, absl::StatusCode::kInvalidArgument,
                   "a descriptor of transport 'inproc' given to UCX"});
  d = owner.descriptor;
  d.regions[0].base_address = 0;
  cases.push_back({"zero address", d, absl::StatusCode::kInvalidArgument, "no address"});
  d = owner.descriptor;
  d.layout.block_size = 8;
  d.regions[0].length = static_cast<uint64_t>(d.layout.total_bytes());
  cases.push_back({"other layout", d, absl::StatusCode::kInvalidArgument, "KV layouts differ"});
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(c.descriptor, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), c.code) << c.name << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr(c.message)) << c.name;
  }
  auto lonely = *CreateUcxTransport({.name = "no-pool", .transports = GetParam()});
  EXPECT_EQ(lonely->Connect(owner.descriptor, absl::Now() + kWait).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(UcxTransportTest, RegistersOnePool) {
  Side owner = MakeSide("owner", GetParam(), Layout(4), 1);
  auto other = RandomPool(Layout(4), 2);
  EXPECT_EQ(owner.transport->RegisterPool(other.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(UcxTransportTest, WritesThatCannotStartFailAtOnceWithoutACallback) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(4), 2);
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  const absl::Time deadline = absl::Now() + kWait;
  const struct {
    WriteOp op;
    const char* message;
  } bad[] = {
      {{.blocks = {}, .first_layer = 0, .num_layers = 1}, "the write names no blocks"},
      {{.blocks = {{4, 0}}, .first_layer = 0, .num_layers = 1},
       "source block 4 is outside the local pool of 4"},
      {{.blocks = {{0, 1}, {0, 8}}, .first_layer = 0, .num_layers = 1},
       "destination block 8 is outside the peer's pool of 8"},
      {{.blocks = {{0, -1}}, .first_layer = 0, .num_layers = 1}, "destination block -1"},
      {{.blocks = {{0, 0}}, .first_layer = 3, .num_layers = 2}, "layers [3, 5) are outside [0, 4)"},
      {{.blocks = {{0, 0}}, .first_layer = -1, .num_layers = 1}, "layers [-1, 0)"},
      {{.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 0}, "layers [0, 0)"},
  };
  std::vector<Done> refused(std::size(bad));
  for (size_t i = 0; i < std::size(bad); ++i) {
    const absl::Status s = conn->Write(bad[i].op, deadline, refused[i].Callback());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << i << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(bad[i].message)) << i;
  }
  Done too_long;
  const absl::Status s =
      conn->Notify(std::string(kMaxNotificationBytes + 1, 'x'), deadline, too_long.Callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("exceeds 65536"));
  // Operations on a connection end in order: once a later one has ended, a refused one that had
  // been queued would have ended too.
  Done later;
  ASSERT_TRUE(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 4}, deadline,
                          later.Callback())
                  .ok());
  ASSERT_TRUE(later.Wait().ok());
  Done note;
  ASSERT_TRUE(conn->Notify("after the refusals", deadline, note.Callback()).ok());
  ASSERT_TRUE(note.Wait().ok());
  for (size_t i = 0; i < std::size(bad); ++i) EXPECT_EQ(refused[i].calls(), 0) << i;
  EXPECT_EQ(too_long.calls(), 0);
}

TEST_P(UcxTransportTest, NotificationOfTheMaximumSizeArrivesWhole) {
  Side owner = MakeSide("owner", GetParam(), Layout(4), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(4), 2);
  Inbox inbox(owner.transport.get());
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  std::string message(kMaxNotificationBytes, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 131 % 251);
  Done done;
  ASSERT_TRUE(conn->Notify(message, absl::Now() + kWait, done.Callback()).ok());
  ASSERT_TRUE(done.Wait().ok()) << done.Wait();
  const std::vector<Notification> got = inbox.Wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.size(), message.size());
  EXPECT_TRUE(got[0].message == message);
  EXPECT_EQ(got[0].peer, "writer");
}

TEST_P(UcxTransportTest, CancelEndsOutstandingOperations) {
  const KvLayout layout = Layout(8);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  Inbox inbox(owner.transport.get());
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  // The owner's handler holds the first notification, so its acknowledgement cannot come.
  inbox.Hold();
  const absl::Time deadline = absl::Now() + kWait;
  Done held;
  ASSERT_TRUE(conn->Notify("held", deadline, held.Callback()).ok());
  ASSERT_EQ(inbox.Wait(1).size(), 1u);
  std::vector<Done> writes(5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(conn->Write({.blocks = {{i, i}}, .first_layer = 0, .num_layers = 4}, deadline,
                            writes[i].Callback())
                    .ok());
  }
  Done queued_note;
  ASSERT_TRUE(conn->Notify("queued", deadline, queued_note.Callback()).ok());
  conn->Cancel();
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kCancelled) << held.Wait();
  EXPECT_EQ(queued_note.Wait().code(), absl::StatusCode::kCancelled) << queued_note.Wait();
  for (Done& w : writes) {
    EXPECT_THAT(w.Wait().code(),
                ::testing::AnyOf(absl::StatusCode::kOk, absl::StatusCode::kCancelled));
  }
  // The connection is closed; no callback ran twice.
  Done after;
  EXPECT_EQ(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, deadline,
                        after.Callback())
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(conn->Notify("after", deadline, after.Callback()).code(),
            absl::StatusCode::kUnavailable);
  // A new connection works, and the released acknowledgement of "held" changed nothing.
  SettleOwner(writer, owner, inbox);
  EXPECT_EQ(held.calls(), 1);
  EXPECT_EQ(queued_note.calls(), 1);
  for (Done& w : writes) EXPECT_EQ(w.calls(), 1);
  EXPECT_EQ(after.calls(), 0);
}

TEST_P(UcxTransportTest, DroppingTheConnectionEndsOutstandingOperations) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
  Inbox inbox(owner.transport.get());
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  inbox.Hold();
  Done held;
  ASSERT_TRUE(conn->Notify("held", absl::Now() + kWait, held.Callback()).ok());
  ASSERT_EQ(inbox.Wait(1).size(), 1u);
  conn.reset();
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(held.calls(), 1);
  SettleOwner(writer, owner, inbox);
}

TEST_P(UcxTransportTest, PassedDeadlineEndsTheOperationAndClosesTheConnection) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
  Inbox inbox(owner.transport.get());
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  inbox.Hold();  // no acknowledgement: the notification can only end by its deadline
  const absl::Time deadline = absl::Now() + absl::Milliseconds(300);
  Done note;
  ASSERT_TRUE(conn->Notify("unacknowledged", deadline, note.Callback()).ok());
  EXPECT_EQ(note.Wait().code(), absl::StatusCode::kDeadlineExceeded) << note.Wait();
  EXPECT_GE(note.when(), deadline);
  EXPECT_LE(note.when(), deadline + kSlack);
  Done after;
  EXPECT_EQ(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1},
                        absl::Now() + kWait, after.Callback())
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(after.calls(), 0);
  EXPECT_EQ(note.calls(), 1);
  SettleOwner(writer, owner, inbox);
}

// Under ASan this test also checks that the operations cut short by the dead owner release what
// they hold: over shared memory their flushes never complete, and the RequestContext that
// UcxTransport::Flush allocates for each (ucx_transport.cc) is never deleted, which
// LeakSanitizer reports when the process exits (ctest runs each test in its own process).
TEST_P(UcxTransportTest, DestroyedOwnerFailsTheNextNotificationWithinItsDeadline) {
  const KvLayout layout = Layout(8);
  Side writer = MakeSide("writer", GetParam(), layout, 2);
  Side owner = MakeSide("owner", GetParam(), layout, 1);
  std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(WaitFor([&](DoneCallback done) {
                return conn->Write({.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 4},
                                   absl::Now() + kWait, std::move(done));
              }).ok());
  owner.transport.reset();  // its pool stays: a late put lands in live memory
  const absl::Duration timeout = absl::Seconds(2);
  const absl::Time deadline = absl::Now() + timeout;
  Done write, note;
  const absl::Status started = conn->Write({.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 4},
                                           deadline, write.Callback());
  if (!started.ok()) {
    EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  }
  const absl::Status notify_started = conn->Notify("anyone?", deadline, note.Callback());
  if (notify_started.ok()) {
    const absl::Status s = note.Wait();
    EXPECT_THAT(s.code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kDeadlineExceeded))
        << s;
    EXPECT_LE(note.when(), deadline + kSlack);
  } else {
    EXPECT_EQ(notify_started.code(), absl::StatusCode::kUnavailable) << notify_started;
  }
  if (started.ok()) {
    EXPECT_FALSE(write.Wait().ok());
  }
}

// kv_transport.h does not say that a Connection must not outlive its transport, and the
// in-process transport allows it; UcxConnection keeps a raw UcxTransport* and calls it from
// Write/Notify/Cancel and its destructor (ucx_transport.cc, class UcxConnection), a use after
// free once the transport is gone. In a child process so that the crash fails this test alone.
class UcxTransportDeathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportDeathTest, ConnectionMayOutliveItsTransport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
    auto writer = std::make_unique<Side>(MakeSide("writer", GetParam(), Layout(8), 2));
    std::shared_ptr<Connection> conn = MustConnect(*writer, owner.descriptor);
    if (conn == nullptr) std::_Exit(2);
    writer->transport.reset();
    Done after;
    const absl::Status s = conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1},
                                      absl::Now() + kWait, after.Callback());
    conn->Cancel();
    conn.reset();
    std::_Exit(s.code() == absl::StatusCode::kUnavailable && after.calls() == 0 ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

// A writer that goes away while the owner's handler runs for its notification: the owner queues
// the acknowledgement with the message's reply endpoint (ucx_transport.cc, OnNotify ->
// replies_) and sends it after draining ucp_worker_progress (Loop), by which time UCX may have
// failed and released that endpoint because the writer disconnected -> the owner crashes in
// ucp_am_send_nbx. The owner must survive a writer dying at any moment. In a child process so
// that the crash fails this test alone.
TEST_P(UcxTransportDeathTest, OwnerSurvivesAWriterThatLeftBeforeItsAcknowledgement) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
    Inbox inbox(owner.transport.get());
    Done held;  // outlives the writer, which ends it
    {
      Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
      std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
      if (conn == nullptr) std::_Exit(2);
      inbox.Hold();
      if (!conn->Notify("held", absl::Now() + kWait, held.Callback()).ok()) std::_Exit(3);
      if (inbox.Wait(1).size() != 1) std::_Exit(4);
    }  // the writer's connection and transport are gone; the owner's handler still runs
    inbox.Release();
    // The owner still serves a new writer.
    Side writer = MakeSide("writer2", GetParam(), Layout(8), 3);
    std::shared_ptr<Connection> conn = MustConnect(writer, owner.descriptor);
    if (conn == nullptr) std::_Exit(5);
    Done note;
    if (!conn->Notify("still there?", absl::Now() + kWait, note.Callback()).ok()) std::_Exit(6);
    std::_Exit(note.Wait().ok() && inbox.Wait(2).size() == 2 ? 0 : 7);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportDeathTest,
                         ::testing::Values("posix,self", "tcp,self"),
                         [](const auto& info) { return info.param.substr(0, info.param.find(',')); });

// Three writer transports into one owner, and each writer into three owners, all at once from
// their own threads (20 writes per pair, then a notification): every byte lands where it should,
// every notification arrives after its data.
TEST_P(UcxTransportTest, ConcurrentWritersAndOwners) {
  constexpr int kWriters = 3, kOwners = 3, kWrites = 20;
  const KvLayout owner_layout = Layout(kWriters * kWrites), writer_layout = Layout(kWrites);
  std::vector<Side> owners, writers;
  for (int o = 0; o < kOwners; ++o) {
    owners.push_back(MakeSide(absl::StrCat("owner", o), GetParam(), owner_layout, 10 + o));
  }
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(MakeSide(absl::StrCat("writer", w), GetParam(), writer_layout, 20 + w));
  }
  // Each owner checks, on a notification from writer w, that all of w's blocks are in place.
  absl::Mutex mu;
  std::vector<std::string> notes;
  for (int o = 0; o < kOwners; ++o) {
    owners[o].transport->SetNotificationHandler([&, o](Notification n) {
      const int w = n.peer.back() - '0';
      bool in_place = true;
      for (int j = 0; j < kWrites; ++j) {
        in_place = in_place && SameLayers(*writers[w].pool, j, *owners[o].pool, w * kWrites + j, 0, 4);
      }
      absl::MutexLock lock(&mu);
      notes.push_back(absl::StrCat(o, " ", n.peer, " ", n.message, in_place ? "" : " EARLY"));
    });
  }
  std::vector<Done> done(kWriters * kOwners * (kWrites + 1));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    for (int o = 0; o < kOwners; ++o) {
      threads.emplace_back([&, w, o] {
        std::shared_ptr<Connection> conn = MustConnect(writers[w], owners[o].descriptor);
        if (conn == nullptr) return;
        Done* mine = &done[(w * kOwners + o) * (kWrites + 1)];
        for (int j = 0; j < kWrites; ++j) {
          EXPECT_TRUE(conn->Write({.blocks = {{j, w * kWrites + j}}, .first_layer = 0,
                                   .num_layers = 4},
                                  absl::Now() + kWait, mine[j].Callback())
                          .ok());
        }
        EXPECT_TRUE(conn->Notify("done", absl::Now() + kWait, mine[kWrites].Callback()).ok());
        for (int j = 0; j <= kWrites; ++j) EXPECT_TRUE(mine[j].Wait().ok()) << mine[j].Wait();
      });
    }
  }
  for (std::thread& t : threads) t.join();
  {
    absl::MutexLock lock(&mu);
    std::sort(notes.begin(), notes.end());
    std::vector<std::string> expected;
    for (int o = 0; o < kOwners; ++o) {
      for (int w = 0; w < kWriters; ++w) expected.push_back(absl::StrCat(o, " writer", w, " done"));
    }
    EXPECT_EQ(notes, expected);
  }
  for (int o = 0; o < kOwners; ++o) {
    owners[o].transport->SetNotificationHandler(nullptr);
    for (int w = 0; w < kWriters; ++w) {
      for (int j = 0; j < kWrites; ++j) {
        EXPECT_TRUE(SameLayers(*writers[w].pool, j, *owners[o].pool, w * kWrites + j, 0, 4))
            << "owner " << o << " writer " << w << " block " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest, ::testing::Values("posix,self", "tcp,self"),
                         [](const auto& info) { return info.param.substr(0, info.param.find(',')); });

TEST(UcxAddressTest, LaneParsing) {
  const std::string info =
      "#\n# UCP endpoint\n#\n#               peer: <no debug data>\n"
      "#                 lane[0]:  2:posix/memory.0 md[1]           -> md[1]/posix/sysdev[255] rma_bw#0 am am_bw#0\n"
      "#                 lane[1]:  8:tcp/lo.0 md[4]                 -> md[4]/tcp/sysdev[255] rma_bw#1 wireup\n";
  EXPECT_THAT(LaneTransports(info), ::testing::ElementsAre("posix/memory", "tcp/lo"));
  EXPECT_FALSE(FellBackToTcp({"posix/memory", "tcp/lo"}, "posix,tcp"));
  EXPECT_TRUE(FellBackToTcp({"tcp/lo"}, "posix,tcp"));
  EXPECT_FALSE(FellBackToTcp({"tcp/lo"}, "tcp"));
  EXPECT_TRUE(FellBackToTcp({"tcp/eth0"}, ""));
}

}  // namespace
}  // namespace tandem::kvtransfer
