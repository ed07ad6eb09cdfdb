#include "kvtransfer/ucx_transport.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

KvLayout Layout(int64_t blocks, int64_t layers = 4, int64_t block_size = 4) {
  return KvLayout{.num_blocks = blocks, .num_layers = layers, .block_size = block_size,
                  .num_kv_heads = 2, .head_dim = 8};
}

std::unique_ptr<KvStorage> RandomPool(const KvLayout& layout, uint32_t seed) {
  auto pool = *KvStorage::Create(layout);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < layout.total_floats(); ++i) pool->data()[i] = dist(rng);
  return pool;
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
  std::unique_ptr<KvTransport> transport;
  std::unique_ptr<KvStorage> pool;
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
