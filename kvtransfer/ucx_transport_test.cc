// What only the UCX transport does: its packed worker address, the handshake that checks a
// descriptor against the owner's pool, and acknowledged notifications that end on their deadline.
// What every transport does is in kv_transport_conformance_test.cc, which runs against UCX over
// shared memory and over TCP on loopback too.
#include "kvtransfer/ucx_transport.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transport_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;
using testing::Conn;
using testing::Done;
using testing::Inbox;
using testing::kSlack;
using testing::kWait;
using testing::Layout;
using testing::MustConnect;
using testing::Side;

// `tls`: the UCX transports, as UCX_TLS takes them.
Side MakeSide(const std::string& name, const std::string& tls, const KvLayout& layout,
              uint32_t seed) {
  absl::StatusOr<std::unique_ptr<KvTransport>> t =
      CreateUcxTransport({.name = name, .transports = tls});
  CHECK(t.ok()) << t.status();
  return testing::MakeSide(*std::move(t), layout, seed);
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, ConnectRefusesCorruptAddressesAtOnce) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
  struct Case {
    std::string name;
    PoolDescriptor descriptor;
    std::string message;
  };
  std::vector<Case> cases;
  PoolDescriptor d = owner.descriptor;
  d.address.back() ^= 0x5a;
  cases.push_back({"corrupt address", d, "the descriptor's UCX address is corrupt (checksum)"});
  d = owner.descriptor;
  d.address[20] ^= 0x01;
  cases.push_back({"one bit flipped", d, "(checksum)"});
  d = owner.descriptor;
  d.address.resize(d.address.size() - 3);
  cases.push_back({"truncated address", d, "the descriptor's UCX address is truncated"});
  d = owner.descriptor;
  d.address += "xyz";
  cases.push_back({"longer address", d, "truncated"});
  d = owner.descriptor;
  d.address[0] = 'X';
  cases.push_back({"foreign address", d, "the descriptor's address is not a Tandem UCX address"});
  d = owner.descriptor;
  d.address.clear();
  cases.push_back({"no address", d, "not a Tandem UCX address"});
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<Connection>> conn =
        writer.transport->Connect(c.descriptor, absl::Now() + kWait);
    EXPECT_EQ(conn.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << conn.status();
    EXPECT_THAT(conn.status().message(), HasSubstr(c.message)) << c.name;
  }
}

// The handshake compares the owner's pool with the descriptor, its block count included.
TEST_P(UcxTransportTest, ForgedBlockCountIsStale) {
  Side owner = MakeSide("owner", GetParam(), Layout(16), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(16), 2);
  PoolDescriptor d = owner.descriptor;
  d.layout.num_blocks = 8;
  d.regions[0].length /= 2;
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      writer.transport->Connect(d, absl::Now() + kWait);
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kFailedPrecondition) << conn.status();
  EXPECT_THAT(conn.status().message(), HasSubstr("the descriptor is stale"));
  EXPECT_TRUE(writer.transport->Connect(owner.descriptor, absl::Now() + kWait).ok());
}

TEST_P(UcxTransportTest, DroppingTheConnectionEndsOutstandingOperations) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
  Inbox inbox(owner.transport.get());
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  inbox.Hold();  // no acknowledgement: the notification stays outstanding
  Done held;
  ASSERT_TRUE(conn->Notify("held", absl::Now() + kWait, held.Callback()).ok());
  ASSERT_EQ(inbox.Wait(1).size(), 1u);
  conn.reset();
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(held.calls(), 1);
  testing::SettleOwner(writer, owner, inbox);
}

// The progress thread ends an operation when its deadline passes, not when something else
// happens on the connection: a notification the owner never acknowledges ends on time.
TEST_P(UcxTransportTest, AnUnacknowledgedNotificationEndsAtItsDeadline) {
  Side owner = MakeSide("owner", GetParam(), Layout(8), 1);
  Side writer = MakeSide("writer", GetParam(), Layout(8), 2);
  Inbox inbox(owner.transport.get());
  Conn conn = MustConnect(writer, owner.descriptor);
  ASSERT_NE(conn, nullptr);
  inbox.Hold();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(300);
  Done note;
  ASSERT_TRUE(conn->Notify("unacknowledged", deadline, note.Callback()).ok());
  EXPECT_EQ(note.Wait().code(), absl::StatusCode::kDeadlineExceeded) << note.Wait();
  EXPECT_GE(note.when(), deadline);
  EXPECT_LE(note.when(), deadline + kSlack);
  EXPECT_EQ(note.calls(), 1);
  testing::SettleOwner(writer, owner, inbox);
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
