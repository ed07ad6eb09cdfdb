// What every KvTransport must do (kv_transport.h), checked against each transport: in-process,
// and UCX over shared memory and over TCP on loopback. A case added here checks them all; a
// transport's own test file keeps only what is specific to it.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/transport_test_util.h"
#include "kvtransfer/ucx_transport.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::Conn;
using testing::Done;
using testing::Inbox;
using testing::kSlack;
using testing::kWait;
using testing::Layout;
using testing::MustConnect;
using testing::RandomPool;
using testing::SameLayers;
using testing::Side;
using testing::Stall;

// A transport under test: how to make one, how to hold its operations back, and where it departs
// from kv_transport.h (each departure a known gap, checked where the contract holds).
struct TransportUnderTest {
  std::string name;  // in the test names
  std::string kind;  // PoolDescriptor::transport, and how Connection::Describe() starts
  std::function<std::unique_ptr<KvTransport>(const std::string& name)> create;
  std::function<std::unique_ptr<Stall>(Side& owner, Side& writer, Connection& conn)> stall;
  // An operation towards an owner whose transport is gone may end DEADLINE_EXCEEDED rather than
  // UNAVAILABLE: over shared memory UCX finds a dead peer only by the missing acknowledgement.
  bool gone_owner_may_time_out = false;
  // kv_transport.h: a connection that outlives its transport fails every call with UNAVAILABLE.
  // The in-process connection keeps the writer's thread alive and goes on writing.
  bool fails_calls_once_its_transport_is_gone = true;
};

void PrintTo(const TransportUnderTest& transport, std::ostream* os) { *os << transport.name; }

TransportUnderTest InProcess() {
  return {.name = "inproc",
          .kind = "inproc",
          .create = [](const std::string& name) { return CreateInProcessTransport(name); },
          .stall = [](Side&, Side&, Connection& conn) -> std::unique_ptr<Stall> {
            return std::make_unique<testing::WriterThreadStall>(conn);
          },
          .fails_calls_once_its_transport_is_gone = false};
}

// `tls`: the UCX transports, as UCX_TLS takes them.
TransportUnderTest Ucx(const std::string& tls) {
  return {.name = absl::StrCat("ucx_", tls.substr(0, tls.find(','))),
          .kind = "ucx",
          .create =
              [tls](const std::string& name) {
                absl::StatusOr<std::unique_ptr<KvTransport>> t =
                    CreateUcxTransport({.name = name, .transports = tls});
                CHECK(t.ok()) << t.status();
                return *std::move(t);
              },
          .stall = [](Side& owner, Side& writer, Connection& conn) -> std::unique_ptr<Stall> {
            return std::make_unique<testing::OwnerHandlerStall>(owner, writer, conn);
          },
          .gone_owner_may_time_out = true};
}

class KvTransportConformanceTest : public ::testing::TestWithParam<TransportUnderTest> {
 protected:
  static Side MakeSide(const std::string& name, const KvLayout& layout, uint32_t seed) {
    return testing::MakeSide(GetParam().create(name), layout, seed);
  }
};

// Death tests run in a child process, so that a crash fails that test alone.
class KvTransportConformanceDeathTest : public KvTransportConformanceTest {};

TEST_P(KvTransportConformanceTest, DescriptorDescribesThePool) {
  Side owner = MakeSide("owner", Layout(16), 1);
  const PoolDescriptor& d = owner.descriptor;
  EXPECT_TRUE(ValidateDescriptor(d).ok());
  EXPECT_EQ(d.transport, GetParam().kind);
  EXPECT_EQ(owner.transport->name(), "owner");
  ASSERT_EQ(d.regions.size(), 1u);
  EXPECT_EQ(d.regions[0].base_address, reinterpret_cast<uint64_t>(owner.pool->data()));
  EXPECT_EQ(d.regions[0].length, 16 * Layout(16).block_stride() * sizeof(float));
  EXPECT_EQ(d.layout.num_blocks, 16);
}

TEST_P(KvTransportConformanceTest, WritesLayerByLayerAndNotifiesAfterTheData) {
  Side owner = MakeSide("owner", Layout(16), 1);
  Side writer = MakeSide("writer", Layout(8), 2);
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
  EXPECT_THAT(conn->Describe(), StartsWith(GetParam().kind));
  LOG(INFO) << "connection: " << conn->Describe();
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
    EXPECT_TRUE(writes[i].Wait().ok()) << writes[i].Wait();
    EXPECT_TRUE(notes[i].Wait().ok()) << notes[i].Wait();
  }
  {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](std::vector<std::string>* c) { return c->size() >= 4; }, &checked),
                        kWait);
    EXPECT_THAT(checked,
                ::testing::ElementsAre("writer layer 0 in place", "writer layer 1 in place",
                                       "writer layer 2 in place", "writer layer 3 in place"));
  }
  owner.transport->SetNotificationHandler(nullptr);
  // Blocks that no pair names are untouched.
  auto fresh = RandomPool(Layout(16), 1);
  for (int32_t b : {0, 3, 4, 6, 14}) {
    EXPECT_TRUE(SameLayers(*fresh, b, *owner.pool, b, 0, 4)) << b;
  }
}

TEST_P(KvTransportConformanceTest, WritesALayerRangeInOneOperation) {
  Side owner = MakeSide("owner", Layout(8, 6), 1);
  Side writer = MakeSide("writer", Layout(8, 6), 2);
  auto before = RandomPool(Layout(8, 6), 1);
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  const absl::Status s =
      testing::WriteAndWait(*conn, {.blocks = {{2, 6}}, .first_layer = 1, .num_layers = 3});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(SameLayers(*writer.pool, 2, *owner.pool, 6, 1, 3));
  EXPECT_TRUE(SameLayers(*before, 6, *owner.pool, 6, 0, 1));  // layers outside the range stay
  EXPECT_TRUE(SameLayers(*before, 6, *owner.pool, 6, 4, 2));
}

TEST_P(KvTransportConformanceTest, RegistersOnePool) {
  Side owner = MakeSide("owner", Layout(4), 1);
  auto other = RandomPool(Layout(4), 2);
  EXPECT_EQ(owner.transport->RegisterPool(other.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(KvTransportConformanceTest, ConnectRefusesBadDescriptorsAtOnce) {
  Side owner = MakeSide("owner", Layout(8), 1);
  Side writer = MakeSide("writer", Layout(8), 2);
  struct Case {
    std::string name;
    PoolDescriptor descriptor;
    std::string message;
  };
  std::vector<Case> cases;
  for (const char* other : {"inproc", "ucx", "rdma"}) {
    if (other == GetParam().kind) continue;
    PoolDescriptor d = owner.descriptor;
    d.transport = other;
    cases.push_back({absl::StrCat("transport ", other), d,
                     absl::StrCat("a descriptor of transport '", other, "' given to")});
  }
  PoolDescriptor d = owner.descriptor;
  d.regions[0].base_address = 0;
  cases.push_back({"zero address", d, "no address"});
  d = owner.descriptor;
  d.layout.block_size = 8;
  d.regions[0].length = static_cast<uint64_t>(d.layout.total_bytes());
  cases.push_back({"other block size", d, "KV layouts differ"});
  d = owner.descriptor;
  d.layout.num_layers = 5;
  d.regions[0].length = static_cast<uint64_t>(d.layout.total_bytes());
  cases.push_back({"other layer count", d, "KV layouts differ"});
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(c.descriptor, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr(c.message)) << c.name;
  }
  std::unique_ptr<KvTransport> lonely = GetParam().create("no-pool");
  EXPECT_EQ(lonely->Connect(owner.descriptor, absl::Now() + kWait).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(KvTransportConformanceTest, ForgedDescriptorIsStale) {
  Side owner = MakeSide("owner", Layout(16), 1);
  Side writer = MakeSide("writer", Layout(16), 2);
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
  for (const auto& [what, descriptor] : forged) {
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(descriptor, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition)
        << what << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr("is stale")) << what;
  }
  // The owner is unharmed.
  EXPECT_TRUE(writer.transport->Connect(owner.descriptor, absl::Now() + kWait).ok());
}

TEST_P(KvTransportConformanceTest, DescriptorOfADestroyedOwnerIsRefused) {
  Side writer = MakeSide("writer", Layout(8), 2);
  auto pool = RandomPool(Layout(8), 1);
  PoolDescriptor old;
  {
    std::unique_ptr<KvTransport> owner = GetParam().create("owner-old");
    old = *owner->RegisterPool(pool.get());
  }
  // The owner comes back with a new transport and registers the same pool anew.
  std::unique_ptr<KvTransport> owner = GetParam().create("owner-new");
  const PoolDescriptor current = *owner->RegisterPool(pool.get());
  EXPECT_GT(current.pool_epoch, old.pool_epoch);
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Seconds(3);
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      writer.transport->Connect(old, start + timeout);
  EXPECT_THAT(conn.status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kFailedPrecondition))
      << conn.status();
  EXPECT_LE(absl::Now() - start, timeout + kSlack);
  EXPECT_TRUE(writer.transport->Connect(current, absl::Now() + kWait).ok());
}

TEST_P(KvTransportConformanceTest, WritesThatCannotStartFailAtOnceWithoutACallback) {
  Side owner = MakeSide("owner", Layout(8), 1);
  Side writer = MakeSide("writer", Layout(4), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
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
  ASSERT_TRUE(later.Wait().ok()) << later.Wait();
  Done note;
  ASSERT_TRUE(conn->Notify("after the refusals", deadline, note.Callback()).ok());
  ASSERT_TRUE(note.Wait().ok()) << note.Wait();
  for (size_t i = 0; i < std::size(bad); ++i) EXPECT_EQ(refused[i].calls(), 0) << i;
  EXPECT_EQ(too_long.calls(), 0);
}

TEST_P(KvTransportConformanceTest, NotificationOfTheMaximumSizeArrivesWhole) {
  Side owner = MakeSide("owner", Layout(4), 1);
  Side writer = MakeSide("writer", Layout(4), 2);
  Inbox inbox(owner.transport.get());
  Conn conn = MustConnect(writer, owner.descriptor);
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

TEST_P(KvTransportConformanceTest, CancelEndsOutstandingOperations) {
  Side owner = MakeSide("owner", Layout(8), 1);
  Side writer = MakeSide("writer", Layout(8), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  const absl::Time deadline = absl::Now() + kWait;
  std::unique_ptr<Stall> stall = GetParam().stall(owner, writer, *conn);
  const bool writes_held = stall->holds_writes();
  Done held;
  ASSERT_TRUE(conn->Notify("held", deadline, held.Callback()).ok());
  std::vector<Done> writes(4);
  for (int32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(conn->Write({.blocks = {{i + 1, i + 1}}, .first_layer = 0, .num_layers = 4},
                            deadline, writes[i].Callback())
                    .ok());
  }
  Done queued;
  ASSERT_TRUE(conn->Notify("queued", deadline, queued.Callback()).ok());
  conn->Cancel();
  // The connection is closed at once.
  Done after;
  EXPECT_EQ(conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, deadline,
                        after.Callback())
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(conn->Notify("after", deadline, after.Callback()).code(),
            absl::StatusCode::kUnavailable);
  stall.reset();
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kCancelled) << held.Wait();
  EXPECT_EQ(queued.Wait().code(), absl::StatusCode::kCancelled) << queued.Wait();
  auto fresh = RandomPool(Layout(8), 1);
  for (int32_t i = 0; i < 4; ++i) {
    if (writes_held) {  // not started: cancelled, and nothing of them landed
      EXPECT_EQ(writes[i].Wait().code(), absl::StatusCode::kCancelled) << writes[i].Wait();
      EXPECT_TRUE(SameLayers(*fresh, i + 1, *owner.pool, i + 1, 0, 4)) << i;
    } else {
      EXPECT_THAT(writes[i].Wait().code(),
                  AnyOf(absl::StatusCode::kOk, absl::StatusCode::kCancelled));
    }
  }
  // No callback ran twice, nor for what was refused.
  EXPECT_EQ(held.calls(), 1);
  EXPECT_EQ(queued.calls(), 1);
  for (Done& w : writes) EXPECT_EQ(w.calls(), 1);
  EXPECT_EQ(after.calls(), 0);
}

TEST_P(KvTransportConformanceTest, PassedDeadlineEndsTheOperationAndClosesTheConnection) {
  Side owner = MakeSide("owner", Layout(8), 1);
  Side writer = MakeSide("writer", Layout(8), 2);
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  // Held back, the notification cannot have ended OK before its deadline.
  std::unique_ptr<Stall> stall = GetParam().stall(owner, writer, *conn);
  Done late;
  ASSERT_TRUE(conn->Notify("late", absl::Now() - absl::Milliseconds(1), late.Callback()).ok());
  stall.reset();
  EXPECT_EQ(late.Wait().code(), absl::StatusCode::kDeadlineExceeded) << late.Wait();
  EXPECT_EQ(late.calls(), 1);
  // The connection closed with it: no later write lands in blocks the owner may have reused.
  Done next;
  const absl::Status started = conn->Write({.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 1},
                                           absl::Now() + kWait, next.Callback());
  testing::ExpectUnavailable(started, next);
}

// Under ASan this test also checks that the operations cut short by the dead owner release what
// they hold: over shared memory UCX's flushes never complete, and the RequestContext that
// UcxTransport::Flush allocates for each (ucx_transport.cc) is never deleted, which
// LeakSanitizer reports when the process exits (ctest runs each test in its own process).
TEST_P(KvTransportConformanceTest, DestroyedOwnerFailsWritesAndNotifications) {
  Side writer = MakeSide("writer", Layout(8), 2);
  Side owner = MakeSide("owner", Layout(8), 1);
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  const absl::Status first =
      testing::WriteAndWait(*conn, {.blocks = {{1, 1}}, .first_layer = 0, .num_layers = 4});
  ASSERT_TRUE(first.ok()) << first;
  owner.transport.reset();  // its pool stays: a late write lands in live memory
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::vector<absl::StatusCode> gone = {absl::StatusCode::kUnavailable};
  if (GetParam().gone_owner_may_time_out) gone.push_back(absl::StatusCode::kDeadlineExceeded);
  Done write, note;
  const absl::Status write_started = conn->Write(
      {.blocks = {{2, 2}}, .first_layer = 0, .num_layers = 4}, deadline, write.Callback());
  const absl::Status note_started = conn->Notify("anyone?", deadline, note.Callback());
  for (auto [started, done] : {std::pair{write_started, &write}, std::pair{note_started, &note}}) {
    if (!started.ok()) {
      EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
      continue;
    }
    const absl::Status s = done->Wait();
    EXPECT_THAT(gone, ::testing::Contains(s.code())) << s;
    EXPECT_LE(done->when(), deadline + kSlack);
  }
}

// "Layers 0..L of request R" only means something if a connection's notifications reach the owner
// in the order they were issued, however many threads issue them. (UCX once sent each notification
// when its own flush completed, and over shared memory later ones overtook earlier ones.) Writes
// and notifications are issued back to back from many threads on each writer's connection, as the
// transfers of many requests would be.
TEST_P(KvTransportConformanceTest, NotificationsArriveInIssueOrder) {
  constexpr int kWriters = 3, kThreads = 20, kSteps = 4;
  const KvLayout layout = Layout(kThreads, kSteps);
  Side owner = MakeSide("owner", layout, 1);
  std::vector<Side> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(MakeSide(absl::StrCat("writer", w), layout, 2 + w));
  }
  // The owner spends a little time on each notification, as a decode worker would.
  Inbox inbox(owner.transport.get());
  owner.transport->SetNotificationHandler([&inbox](Notification n) {
    absl::SleepFor(absl::Microseconds(200));
    inbox.Add(std::move(n));
  });
  std::vector<Conn> conns;
  for (Side& w : writers) conns.push_back(MustConnect(w, owner.descriptor));
  for (const Conn& c : conns) ASSERT_NE(c, nullptr);
  // Rounds of kWriters x kThreads transfers of kSteps (write, notify) each; an overtaking showed
  // in most rounds, so a few rounds make the check all but certain.
  constexpr int kRounds = 4;
  const size_t per_round = kWriters * kThreads * kSteps;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Done> done(per_round * 2);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, w, t] {
          Done* mine = &done[(w * kThreads + t) * kSteps * 2];
          const Conn& conn = conns[w];
          for (int i = 0; i < kSteps; ++i) {
            EXPECT_TRUE(conn->Write({.blocks = {{t, t}}, .first_layer = i, .num_layers = 1},
                                    absl::Now() + kWait, mine[2 * i].Callback())
                            .ok());
            EXPECT_TRUE(conn->Notify(absl::StrCat(t, " ", i), absl::Now() + kWait,
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

// Three writer transports into one owner, and each writer into three owners, all at once from
// their own threads (20 writes per pair, then a notification): every byte lands where it should,
// every notification arrives after its data.
TEST_P(KvTransportConformanceTest, ConcurrentWritersAndOwners) {
  constexpr int kWriters = 3, kOwners = 3, kWrites = 20;
  const KvLayout owner_layout = Layout(kWriters * kWrites), writer_layout = Layout(kWrites);
  std::vector<Side> owners, writers;
  for (int o = 0; o < kOwners; ++o) {
    owners.push_back(MakeSide(absl::StrCat("owner", o), owner_layout, 10 + o));
  }
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(MakeSide(absl::StrCat("writer", w), writer_layout, 20 + w));
  }
  // Each owner checks, on a notification from writer w, that all of w's blocks are in place.
  absl::Mutex mu;
  std::vector<std::string> notes;
  for (int o = 0; o < kOwners; ++o) {
    owners[o].transport->SetNotificationHandler([&, o](Notification n) {
      const int w = n.peer.back() - '0';
      bool in_place = true;
      for (int j = 0; j < kWrites; ++j) {
        in_place =
            in_place && SameLayers(*writers[w].pool, j, *owners[o].pool, w * kWrites + j, 0, 4);
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
        for (int j = 0; j <= kWrites; ++j) EXPECT_TRUE(mine[j].Wait().ok()) << mine[j].Wait();
      });
    }
  }
  for (std::thread& t : threads) t.join();
  {
    // A notification's callback may run before the owner's handler does (it was handed over).
    absl::MutexLock lock(&mu);
    auto all_arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return notes.size() >= static_cast<size_t>(kOwners * kWriters);
    };
    mu.AwaitWithTimeout(absl::Condition(&all_arrived), kWait);
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

// kv_transport.h: a Connection may outlive its transport, and then every call fails with
// UNAVAILABLE. UcxConnection once kept a raw UcxTransport* and called it from Write, Notify,
// Cancel and its destructor: a use after free once the transport was gone.
TEST_P(KvTransportConformanceDeathTest, ConnectionMayOutliveItsTransport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    Side owner = MakeSide("owner", Layout(8), 1);
    auto writer = std::make_unique<Side>(MakeSide("writer", Layout(8), 2));
    Conn conn = MustConnect(*writer, owner.descriptor);
    if (conn == nullptr) std::_Exit(2);
    writer->transport.reset();
    Done after;
    const absl::Status s = conn->Write({.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1},
                                      absl::Now() + kWait, after.Callback());
    conn->Cancel();
    conn.reset();  // must not touch the destroyed transport
    const bool as_promised = s.code() == absl::StatusCode::kUnavailable && after.calls() == 0;
    std::_Exit(as_promised || !GetParam().fails_calls_once_its_transport_is_gone ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

// A writer that goes away while the owner's handler runs for its notification: the owner must
// survive a writer dying at any moment. (The UCX owner once queued the acknowledgement with the
// message's reply endpoint and sent it after draining ucp_worker_progress, by which time UCX had
// released that endpoint because the writer disconnected: a crash in ucp_am_send_nbx.)
TEST_P(KvTransportConformanceDeathTest, OwnerSurvivesAWriterThatLeftBeforeItsAcknowledgement) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    Side owner = MakeSide("owner", Layout(8), 1);
    Inbox inbox(owner.transport.get());
    Done held;  // outlives the writer, which ends it
    {
      Side writer = MakeSide("writer", Layout(8), 2);
      Conn conn = MustConnect(writer, owner.descriptor);
      if (conn == nullptr) std::_Exit(2);
      inbox.Hold();
      if (!conn->Notify("held", absl::Now() + kWait, held.Callback()).ok()) std::_Exit(3);
      if (inbox.Wait(1).size() != 1) std::_Exit(4);
    }  // the writer's connection and transport are gone; the owner's handler still runs
    inbox.Release();
    // The owner still serves a new writer.
    Side writer = MakeSide("writer2", Layout(8), 3);
    Conn conn = MustConnect(writer, owner.descriptor);
    if (conn == nullptr) std::_Exit(5);
    Done note;
    if (!conn->Notify("still there?", absl::Now() + kWait, note.Callback()).ok()) std::_Exit(6);
    std::_Exit(note.Wait().ok() && inbox.Wait(2).size() == 2 ? 0 : 7);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

const auto kTransports = ::testing::Values(InProcess(), Ucx("posix,self"), Ucx("tcp,self"));
auto TestName = [](const ::testing::TestParamInfo<TransportUnderTest>& info) {
  return info.param.name;
};
INSTANTIATE_TEST_SUITE_P(Transports, KvTransportConformanceTest, kTransports, TestName);
INSTANTIATE_TEST_SUITE_P(Transports, KvTransportConformanceDeathTest, kTransports, TestName);

}  // namespace
}  // namespace tandem::kvtransfer
