// The checks that keep a prefill worker inside what a decode worker granted it: CheckGrant's
// refusals (each names what is wrong), BlockLayerBytes' bounds and overflow checks, the write
// plan of a valid grant touching only granted bytes, GrantedConnection refusing other blocks and
// anything after Revoke, and PublicPart keeping keys out of public state.
#include "kvtransfer/kv_grant.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/prompt_write_plan.h"
#include "kvtransfer/transport_test_util.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

using testing::HostPool;
using testing::kBlockBytes;
using testing::kBlockStrideBytes;
using testing::kPoolBase;
using testing::Layout;

v1::KvDestination Destination(std::vector<uint32_t> ids, int64_t pool_blocks = 10) {
  const PoolDescriptor d = HostPool(pool_blocks, "addr", /*epoch=*/3);
  v1::KvDestination out;
  out.set_worker_id("decode-0");
  ToProto(d, out.mutable_pool());
  for (uint32_t b : ids) out.add_block_ids(b);
  return out;
}

TEST(CheckGrantTest, AValidGrantNamesTheBlocksAfterTheCachedOnes) {
  // 10 tokens, the first 4 (one block) cached at the destination: blocks 7 (cached), 2, 5.
  absl::StatusOr<KvGrant> grant =
      CheckGrant(Destination({7, 2, 5}), {.num_tokens = 10, .cached_tokens = 4}, Layout(1));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_THAT(grant->blocks, ::testing::ElementsAre(7, 2, 5));
  EXPECT_THAT(grant->granted_blocks(), ::testing::ElementsAre(2, 5));
  EXPECT_FALSE(grant->granted.contains(7));
  EXPECT_EQ(grant->pool.layout.num_blocks, 10);
}

struct BadGrant {
  std::string name;
  v1::KvDestination destination;
  GrantedTokens tokens;
  KvLayout local;
  absl::StatusCode code;
  std::string says;
};

class CheckGrantRefusalTest : public ::testing::TestWithParam<BadGrant> {};

TEST_P(CheckGrantRefusalTest, RefusesWithTheReason) {
  const BadGrant& c = GetParam();
  absl::StatusOr<KvGrant> grant = CheckGrant(c.destination, c.tokens, c.local);
  ASSERT_FALSE(grant.ok());
  EXPECT_EQ(grant.status().code(), c.code) << grant.status();
  EXPECT_THAT(grant.status().message(), HasSubstr(c.says));
}

std::vector<BadGrant> BadGrants() {
  std::vector<BadGrant> cases;
  const GrantedTokens ten{.num_tokens = 10, .cached_tokens = 0};
  cases.push_back({"BlockPastThePool", Destination({1, 10, 2}), ten, Layout(1),
                   absl::StatusCode::kInvalidArgument,
                   "destination.block_ids[1] = 10 is outside the pool's 10 blocks"});
  cases.push_back({"HugeBlockId", Destination({1, 4294967295u, 2}), ten, Layout(1),
                   absl::StatusCode::kInvalidArgument, "destination.block_ids[1] = 4294967295"});
  cases.push_back({"Duplicate", Destination({3, 4, 3}), ten, Layout(1),
                   absl::StatusCode::kInvalidArgument,
                   "destination.block_ids[2] = 3 repeats destination.block_ids[0]"});
  // A cached block named again among the granted ones would let a write reach shared data.
  cases.push_back({"CachedBlockGrantedAgain", Destination({3, 3, 4}),
                   {.num_tokens = 10, .cached_tokens = 4}, Layout(1),
                   absl::StatusCode::kInvalidArgument, "repeats"});
  cases.push_back({"TooFew", Destination({1, 2}), ten, Layout(1),
                   absl::StatusCode::kInvalidArgument,
                   "destination.block_ids has 2 blocks; 10 tokens in blocks of 4 need exactly 3"});
  cases.push_back({"TooMany", Destination({1, 2, 3, 4}), ten, Layout(1),
                   absl::StatusCode::kInvalidArgument, "need exactly 3"});
  cases.push_back({"CachedNotWholeBlocks", Destination({1, 2, 3}),
                   {.num_tokens = 10, .cached_tokens = 3}, Layout(1),
                   absl::StatusCode::kInvalidArgument, "num_destination_cached_tokens 3"});
  cases.push_back({"CachedEverything", Destination({1, 2, 3}),
                   {.num_tokens = 8, .cached_tokens = 8}, Layout(1),
                   absl::StatusCode::kInvalidArgument, "num_destination_cached_tokens 8"});
  KvLayout other = Layout(1);
  other.num_layers = 5;
  cases.push_back({"LayoutDiffers", Destination({1, 2, 3}), ten, other,
                   absl::StatusCode::kFailedPrecondition, "KV layouts differ"});
  v1::KvDestination no_regions = Destination({1, 2, 3});
  no_regions.mutable_pool()->clear_regions();
  cases.push_back({"NoRegion", no_regions, ten, Layout(1), absl::StatusCode::kInvalidArgument,
                   "destination.pool: descriptor layout"});
  // The region (and its last blocks' bytes) would wrap past 2^64.
  v1::KvDestination wraps = Destination({1, 2, 9});
  wraps.mutable_pool()->mutable_regions(0)->set_base_address(
      std::numeric_limits<uint64_t>::max() - 3 * kBlockStrideBytes);
  cases.push_back({"RegionWrapsAround", wraps, ten, Layout(1),
                   absl::StatusCode::kInvalidArgument, "runs past the end of the address space"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckGrantRefusalTest, ::testing::ValuesIn(BadGrants()),
                         [](const ::testing::TestParamInfo<BadGrant>& info) {
                           return info.param.name;
                         });

TEST(BlockLayerBytesTest, FollowsTheLayoutAndStaysInTheRegion) {
  const KvLayout l = Layout(10);
  const ByteRange region{.address = kPoolBase, .length = 10 * kBlockStrideBytes};
  absl::StatusOr<ByteRange> r = BlockLayerBytes(l, region, 3, 1, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->address, kPoolBase + 3 * kBlockStrideBytes + kBlockBytes);
  EXPECT_EQ(r->length, 2 * kBlockBytes);
  // The last layer of the last block ends exactly at the region's end.
  r = BlockLayerBytes(l, region, 9, 3, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->address + r->length, region.address + region.length);

  EXPECT_THAT(BlockLayerBytes(l, region, 10, 0, 1).status().message(),
              HasSubstr("block 10 is outside"));
  EXPECT_THAT(BlockLayerBytes(l, region, -1, 0, 1).status().message(), HasSubstr("block -1"));
  EXPECT_THAT(BlockLayerBytes(l, region, 0, 3, 2).status().message(), HasSubstr("layers [3"));
  EXPECT_THAT(BlockLayerBytes(l, region, 0, -1, 1).status().message(), HasSubstr("layers [-1"));
  // A region shorter than the layout says: the block's bytes are refused, not assumed.
  EXPECT_THAT(BlockLayerBytes(l, {.address = kPoolBase, .length = 9 * kBlockStrideBytes}, 9, 0, 4)
                  .status()
                  .message(),
              HasSubstr("lies past its region"));
  // A layout whose block stride times a large block id passes 2^64.
  KvLayout huge = l;
  huge.num_blocks = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(BlockLayerBytes(huge, {.address = 0, .length = ~uint64_t{0}},
                              std::numeric_limits<int64_t>::max() - 1, 0, 1)
                  .status()
                  .message(),
              HasSubstr("overflows"));
}

// Every byte the write plan of a valid grant addresses lies in a granted block, and at the end
// every byte of every granted block was written -- for whole prompts, chunked ones, and prompts
// partly taken from the prefill worker's own prefix cache.
TEST(GrantedWritePlanTest, TouchesOnlyGrantedBlocksBytesAndAllOfThem) {
  const KvLayout local = Layout(16);  // the prefill worker's pool
  struct Shape {
    int64_t tokens;
    int64_t dst_cached;
    int64_t src_cached;  // leading tokens the prefill worker reuses (whole blocks)
    int64_t chunk;       // tokens per step
  };
  for (const Shape& s : {Shape{10, 0, 0, 10}, Shape{10, 4, 0, 10}, Shape{23, 8, 0, 5},
                         Shape{23, 0, 12, 3}, Shape{23, 4, 12, 7}, Shape{16, 4, 8, 16}}) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << s.tokens << " dst_cached=" << s.dst_cached
                                      << " src_cached=" << s.src_cached << " chunk=" << s.chunk);
    const int64_t n_blocks = (s.tokens + 3) / 4;
    // Destination ids spread over a 10-block pool, in no order.
    std::vector<uint32_t> ids;
    for (int64_t k = 0; k < n_blocks; ++k) ids.push_back(static_cast<uint32_t>((k * 7 + 3) % 10));
    absl::StatusOr<KvGrant> grant = CheckGrant(
        Destination(ids), {.num_tokens = s.tokens, .cached_tokens = s.dst_cached}, local);
    ASSERT_TRUE(grant.ok()) << grant.status();
    absl::StatusOr<PromptWritePlan> plan =
        PromptWritePlan::Create({.block_size = 4, .num_layers = 4,
                                 .destination_cached_tokens = s.dst_cached,
                                 .destination_blocks = grant->blocks});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<int32_t> source;
    for (int64_t k = 0; k < n_blocks; ++k) source.push_back(static_cast<int32_t>(15 - k));
    const PoolDescriptor::Region& region = grant->pool.regions[0];
    const ByteRange whole{.address = region.base_address, .length = region.length};
    // Each byte written, as (block, offset in the block) of granted blocks only.
    std::set<std::pair<int32_t, uint64_t>> written;
    for (int64_t first = s.src_cached; first < s.tokens; first += s.chunk) {
      const int64_t count = std::min(s.chunk, s.tokens - first);
      for (int64_t layer = 0; layer < 4; ++layer) {
        for (const WriteOp& op : plan->OnLayer(layer, first, count, source)) {
          EXPECT_TRUE(CheckWriteGranted(*grant, op).ok());
          for (const BlockPair& p : op.blocks) {
            absl::StatusOr<ByteRange> r =
                BlockLayerBytes(grant->pool.layout, whole, p.dst, op.first_layer, op.num_layers);
            ASSERT_TRUE(r.ok()) << r.status();
            // The bytes are inside exactly one block, which is granted.
            const uint64_t offset = r->address - whole.address;
            const int64_t block = static_cast<int64_t>(offset / kBlockStrideBytes);
            ASSERT_EQ((offset + r->length - 1) / kBlockStrideBytes, static_cast<uint64_t>(block));
            ASSERT_TRUE(grant->granted.contains(static_cast<int32_t>(block))) << block;
            for (uint64_t i = 0; i < r->length; i += kBlockBytes) {
              written.insert({static_cast<int32_t>(block), offset % kBlockStrideBytes + i});
            }
          }
        }
      }
    }
    // Every layer of every granted block, in units of block_bytes.
    EXPECT_EQ(written.size(), grant->granted.size() * 4);
  }
}

TEST(GrantedConnectionTest, WritesOnlyGrantedBlocksAndNothingAfterRevoke) {
  const KvLayout layout = Layout(10);
  std::unique_ptr<KvStorage> src = *KvStorage::Create(layout);
  std::unique_ptr<KvStorage> dst = *KvStorage::Create(layout);
  std::unique_ptr<KvTransport> writer = CreateInProcessTransport("grant-writer");
  std::unique_ptr<KvTransport> owner = CreateInProcessTransport("grant-owner");
  ASSERT_TRUE(writer->RegisterPool(src.get()).ok());
  absl::StatusOr<PoolDescriptor> d = owner->RegisterPool(dst.get());
  ASSERT_TRUE(d.ok());
  v1::KvDestination destination;
  ToProto(*d, destination.mutable_pool());
  for (uint32_t b : {4u, 6u, 1u}) destination.add_block_ids(b);
  absl::StatusOr<KvGrant> grant =
      CheckGrant(destination, {.num_tokens = 12, .cached_tokens = 4}, layout);
  ASSERT_TRUE(grant.ok()) << grant.status();
  absl::StatusOr<std::shared_ptr<Connection>> inner = writer->Connect(*d, absl::InfiniteFuture());
  ASSERT_TRUE(inner.ok());
  GrantedConnection conn(*inner, *std::move(grant), "request r1");

  auto never = [](absl::Status) { ADD_FAILURE() << "a refused write must not call back"; };
  // Block 4 holds what the destination caches: not granted.
  absl::Status s = conn.Write({.blocks = {{0, 6}, {1, 4}}}, absl::InfiniteFuture(), never);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("request r1: destination block 4 is not granted"));
  EXPECT_EQ(conn.Write({.blocks = {{0, 7}}}, absl::InfiniteFuture(), never).code(),
            absl::StatusCode::kPermissionDenied);

  absl::Notification done;
  ASSERT_TRUE(conn.Write({.blocks = {{0, 6}, {1, 1}}}, absl::InfiniteFuture(),
                         [&done](absl::Status s) {
                           EXPECT_TRUE(s.ok()) << s;
                           done.Notify();
                         })
                  .ok());
  done.WaitForNotification();

  conn.Revoke();
  s = conn.Write({.blocks = {{0, 6}}}, absl::InfiniteFuture(), never);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("revoked"));
  EXPECT_EQ(conn.Notify("late", absl::InfiniteFuture(), never).code(),
            absl::StatusCode::kFailedPrecondition);
  writer.reset();
  owner.reset();
}

TEST(PublicPartTest, KeepsTheLayoutAndDropsKeysAndAddresses) {
  const v1::KvDestination full = Destination({1});
  ASSERT_FALSE(full.pool().regions(0).remote_key().empty());
  const v1::KvPoolDescriptor pub = PublicPart(full.pool());
  EXPECT_EQ(pub.transport(), "ucx");
  EXPECT_EQ(pub.layout().SerializeAsString(), full.pool().layout().SerializeAsString());
  EXPECT_EQ(pub.pool_epoch(), 3u);
  EXPECT_EQ(pub.regions_size(), 0);
  EXPECT_TRUE(pub.transport_address().empty());
  // Nothing of the key survives anywhere in the bytes.
  EXPECT_EQ(pub.SerializeAsString().find("key"), std::string::npos);
}

}  // namespace
}  // namespace tandem::kvtransfer
