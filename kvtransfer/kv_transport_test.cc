// The descriptor codec (ToProto / FromProto) and the checks every transport shares:
// ValidateDescriptor, ValidateWrite and CheckCompatibleLayouts.
#include "kvtransfer/kv_transport.h"

#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transport_test_util.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

using testing::kBlockBytes;
using testing::kBlockStrideBytes;
using testing::Layout;

PoolDescriptor Descriptor(int64_t blocks = 10) {
  return testing::HostPool(blocks, std::string("addr\0ess", 8), /*epoch=*/1796232218000000);
}

v1::KvPoolDescriptor Proto(const PoolDescriptor& d) {
  v1::KvPoolDescriptor proto;
  ToProto(d, &proto);
  return proto;
}

void ExpectSame(const PoolDescriptor& a, const PoolDescriptor& b) {
  EXPECT_EQ(a.transport, b.transport);
  EXPECT_EQ(a.address, b.address);
  EXPECT_EQ(a.pool_epoch, b.pool_epoch);
  EXPECT_EQ(a.layout.num_blocks, b.layout.num_blocks);
  EXPECT_EQ(a.layout.num_layers, b.layout.num_layers);
  EXPECT_EQ(a.layout.block_size, b.layout.block_size);
  EXPECT_EQ(a.layout.num_kv_heads, b.layout.num_kv_heads);
  EXPECT_EQ(a.layout.head_dim, b.layout.head_dim);
  ASSERT_EQ(a.regions.size(), b.regions.size());
  for (size_t i = 0; i < a.regions.size(); ++i) {
    EXPECT_EQ(a.regions[i].base_address, b.regions[i].base_address);
    EXPECT_EQ(a.regions[i].length, b.regions[i].length);
    EXPECT_EQ(a.regions[i].remote_key, b.regions[i].remote_key);
    EXPECT_EQ(a.regions[i].kind, b.regions[i].kind);
    EXPECT_EQ(a.regions[i].device_index, b.regions[i].device_index);
  }
}

TEST(DescriptorCodecTest, RoundTripsThroughTheWire) {
  PoolDescriptor cuda = Descriptor(3);
  cuda.regions[0].kind = MemoryKind::kCuda;
  cuda.regions[0].device_index = 7;
  for (const PoolDescriptor& d : {Descriptor(), Descriptor(1), cuda}) {
    ASSERT_TRUE(ValidateDescriptor(d).ok());
    v1::KvPoolDescriptor parsed;
    ASSERT_TRUE(parsed.ParseFromString(Proto(d).SerializeAsString()));
    absl::StatusOr<PoolDescriptor> back = FromProto(parsed);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(d, *back);
  }
}

TEST(DescriptorCodecTest, WritesTheLayoutAsDocumented) {
  // docs/kv_layout.md: block_bytes = 8*B*H*D, and layer_stride_bytes is block_bytes.
  const v1::KvPoolDescriptor p = Proto(Descriptor());
  EXPECT_EQ(p.transport(), "ucx");
  EXPECT_EQ(p.transport_address(), std::string("addr\0ess", 8));
  EXPECT_EQ(p.pool_epoch(), 1796232218000000u);
  EXPECT_EQ(p.layout().num_layers(), 4u);
  EXPECT_EQ(p.layout().block_size(), 4u);
  EXPECT_EQ(p.layout().num_kv_heads(), 2u);
  EXPECT_EQ(p.layout().head_dim(), 8u);
  EXPECT_EQ(p.layout().dtype(), v1::DTYPE_F32);
  EXPECT_EQ(p.layout().block_bytes(), kBlockBytes);
  EXPECT_EQ(p.layout().layer_stride_bytes(), kBlockBytes);
  ASSERT_EQ(p.regions_size(), 1);
  EXPECT_EQ(p.regions(0).memory_type(), v1::MEMORY_TYPE_HOST);
  EXPECT_EQ(p.regions(0).length(), 10 * kBlockStrideBytes);
}

TEST(DescriptorCodecTest, BlockCountComesFromTheRegionLength) {
  v1::KvPoolDescriptor p = Proto(Descriptor(10));
  p.mutable_regions(0)->set_length(7 * kBlockStrideBytes);
  absl::StatusOr<PoolDescriptor> d = FromProto(p);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout.num_blocks, 7);
}

// Every way FromProto refuses a descriptor: INVALID_ARGUMENT with a message naming the problem.
TEST(DescriptorCodecTest, RefusesBadDescriptors) {
  struct Case {
    const char* name;
    std::function<void(v1::KvPoolDescriptor*)> change;
    const char* message;
  };
  const Case cases[] = {
      {"bf16", [](auto* p) { p->mutable_layout()->set_dtype(v1::DTYPE_BF16); },
       "KV dtype DTYPE_BF16 is not supported (F32 or F16)"},
      {"f16 with f32 sizes", [](auto* p) { p->mutable_layout()->set_dtype(v1::DTYPE_F16); },
       "do not match the layout"},
      {"bf16", [](auto* p) { p->mutable_layout()->set_dtype(v1::DTYPE_BF16); },
       "KV dtype DTYPE_BF16 is not supported"},
      {"no dtype", [](auto* p) { p->mutable_layout()->clear_dtype(); },
       "KV dtype DTYPE_UNSPECIFIED is not supported"},
      {"block_bytes", [](auto* p) { p->mutable_layout()->set_block_bytes(kBlockBytes + 4); },
       "block_bytes 516 / layer_stride_bytes 512 do not match the layout (512"},
      {"block_bytes of f16", [](auto* p) { p->mutable_layout()->set_block_bytes(kBlockBytes / 2); },
       "block_bytes 256 / layer_stride_bytes 512 do not match the layout (512"},
      {"layer_stride_bytes",
       [](auto* p) { p->mutable_layout()->set_layer_stride_bytes(kBlockStrideBytes); },
       "block_bytes 512 / layer_stride_bytes 2048 do not match the layout"},
      {"no memory type", [](auto* p) { p->mutable_regions(0)->clear_memory_type(); },
       "region memory type MEMORY_TYPE_UNSPECIFIED"},
      {"region not whole blocks",
       [](auto* p) { p->mutable_regions(0)->set_length(10 * kBlockStrideBytes + 4); },
       "the region holds 20484 bytes; the layout needs 20480"},
      {"region shorter than a block",
       [](auto* p) { p->mutable_regions(0)->set_length(kBlockStrideBytes - 1); },
       "descriptor layout: KV layout sizes must be positive: blocks=0"},
      {"zero address", [](auto* p) { p->mutable_regions(0)->set_base_address(0); },
       "the region has no address"},
      {"no region", [](auto* p) { p->clear_regions(); }, "blocks=0"},
      {"two regions", [](auto* p) { *p->add_regions() = p->regions(0); },
       "a KV pool is one region; the descriptor has 2"},
      {"no transport", [](auto* p) { p->clear_transport(); }, "the descriptor names no transport"},
      {"no layers", [](auto* p) { p->mutable_layout()->set_num_layers(0); },
       "descriptor layout: KV layout sizes must be positive"},
      {"no heads",
       [](auto* p) {
         p->mutable_layout()->set_num_kv_heads(0);
         p->mutable_layout()->set_block_bytes(0);
         p->mutable_layout()->set_layer_stride_bytes(0);
       },
       "descriptor layout: KV layout sizes must be positive"},
      {"no layout", [](auto* p) { p->clear_layout(); }, "KV dtype DTYPE_UNSPECIFIED"},
  };
  for (const Case& c : cases) {
    v1::KvPoolDescriptor p = Proto(Descriptor());
    c.change(&p);
    absl::StatusOr<PoolDescriptor> d = FromProto(p);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << d.status();
    EXPECT_THAT(d.status().message(), HasSubstr(c.message)) << c.name;
  }
}

// A peer's descriptor is external input. Dimensions whose product does not fit 64 bits must be
// refused, not overflow: FromProto multiplies them (kv_transport.cc, BlockBytes) before
// KvLayout::Validate bounds them. Runs in a child process so that a sanitizer report of the
// overflow fails this test alone.
TEST(DescriptorCodecDeathTest, RefusesDimensionsWhoseProductOverflows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        v1::KvPoolDescriptor p = Proto(Descriptor());
        p.mutable_layout()->set_block_size(1u << 21);
        p.mutable_layout()->set_num_kv_heads(1u << 21);
        p.mutable_layout()->set_head_dim(1u << 21);  // 2 * 2^63 floats per block and layer
        p.mutable_layout()->set_block_bytes(0);
        p.mutable_layout()->set_layer_stride_bytes(0);
        const absl::Status s = FromProto(p).status();
        std::_Exit(s.code() == absl::StatusCode::kInvalidArgument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ValidateDescriptorTest, RefusesIncompleteDescriptors) {
  struct Case {
    const char* name;
    std::function<void(PoolDescriptor*)> change;
    const char* message;
  };
  const Case cases[] = {
      {"no transport", [](auto* d) { d->transport.clear(); }, "names no transport"},
      {"bad layout", [](auto* d) { d->layout.head_dim = -8; },
       "descriptor layout: KV layout sizes must be positive"},
      {"no blocks",
       [](auto* d) {
         d->layout.num_blocks = 0;
         d->regions[0].length = 0;
       },
       "descriptor layout: KV layout sizes must be positive: blocks=0"},
      {"no region", [](auto* d) { d->regions.clear(); },
       "a KV pool is one region; the descriptor has 0"},
      {"two regions", [](auto* d) { d->regions.push_back(d->regions[0]); },
       "the descriptor has 2"},
      {"region too short", [](auto* d) { d->regions[0].length -= 1; },
       "the region holds 20479 bytes; the layout needs 20480"},
      {"region too long", [](auto* d) { d->regions[0].length += kBlockStrideBytes; },
       "the region holds 22528 bytes; the layout needs 20480"},
      {"zero address", [](auto* d) { d->regions[0].base_address = 0; }, "the region has no address"},
      {"region past 2^64",
       [](auto* d) { d->regions[0].base_address = ~uint64_t{0} - kBlockStrideBytes; },
       "runs past the end of the address space"},
      {"no memory kind", [](auto* d) { d->regions[0].kind = static_cast<MemoryKind>(0); },
       "the region has no memory type"},
      {"unknown memory kind", [](auto* d) { d->regions[0].kind = static_cast<MemoryKind>(3); },
       "the region has no memory type"},
  };
  for (const Case& c : cases) {
    PoolDescriptor d = Descriptor();
    c.change(&d);
    const absl::Status s = ValidateDescriptor(d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
  }
}

// Each dimension under FromProto's bound (2^16) with block_bytes that match them: a block of
// every layer is 2^16 * 2^51 bytes, past int64. Found by tests/fuzz/kv_descriptor_fuzz.cc (UBSan:
// signed overflow in KvLayout::block_stride); its input is corpus/kv_descriptor/crash-*.
TEST(DescriptorCodecDeathTest, RefusesABlockOfAllLayersOver63Bits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        v1::KvPoolDescriptor p = Proto(Descriptor());
        v1::KvLayout* l = p.mutable_layout();
        l->set_num_layers(1u << 16);
        l->set_block_size(1u << 16);
        l->set_num_kv_heads(1u << 16);
        l->set_head_dim(1u << 16);
        l->set_block_bytes(uint64_t{2} << 48 << 2);  // K and V, 2^48 floats each
        l->set_layer_stride_bytes(l->block_bytes());
        const absl::Status s = FromProto(p).status();
        const bool named = s.message().find("is over 2^63 bytes") != absl::string_view::npos;
        std::_Exit(s.code() == absl::StatusCode::kInvalidArgument && named ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CheckCompatibleLayoutsTest, OnlyTheBlockCountMayDiffer) {
  EXPECT_TRUE(CheckCompatibleLayouts(Layout(10), Layout(10)).ok());
  EXPECT_TRUE(CheckCompatibleLayouts(Layout(10), Layout(1000)).ok());
  const std::vector<std::function<void(KvLayout*)>> changes = {
      [](KvLayout* l) { l->num_layers += 1; }, [](KvLayout* l) { l->block_size = 16; },
      [](KvLayout* l) { l->num_kv_heads = 1; }, [](KvLayout* l) { l->head_dim = 16; },
      [](KvLayout* l) { l->dtype = DType::kF16; }};
  for (size_t i = 0; i < changes.size(); ++i) {
    KvLayout other = Layout(10);
    changes[i](&other);
    for (const absl::Status& s :
         {CheckCompatibleLayouts(Layout(10), other), CheckCompatibleLayouts(other, Layout(10))}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << i;
      EXPECT_THAT(s.message(), HasSubstr("KV layouts differ: here layers=")) << i;
    }
  }
  KvLayout other = Layout(10);
  other.head_dim = 16;
  EXPECT_EQ(CheckCompatibleLayouts(Layout(10), other).message(),
            "KV layouts differ: here layers=4 block_size=4 kv_heads=2 head_dim=8 dtype=F32; peer "
            "layers=4 block_size=4 kv_heads=2 head_dim=16 dtype=F32 (prefill and decode workers "
            "need the same --kv_dtype)");
}

TEST(ValidateWriteTest, AcceptsBlocksAndLayersOfBothPools) {
  const KvLayout local = Layout(4), remote = Layout(16);
  EXPECT_TRUE(ValidateWrite({.blocks = {{3, 15}}, .first_layer = 0, .num_layers = 4}, local, remote)
                  .ok());
  EXPECT_TRUE(ValidateWrite({.blocks = {{0, 0}, {3, 3}, {3, 4}}, .first_layer = 3, .num_layers = 1},
                            local, remote)
                  .ok());
  // The writer's pool may be the bigger one.
  EXPECT_TRUE(ValidateWrite({.blocks = {{15, 3}}, .first_layer = 1, .num_layers = 2}, remote, local)
                  .ok());
}

TEST(ValidateWriteTest, RefusesWritesThatCannotStart) {
  const KvLayout local = Layout(4), remote = Layout(16);
  struct Case {
    WriteOp op;
    const char* message;
  };
  const Case cases[] = {
      {{.blocks = {}, .first_layer = 0, .num_layers = 1}, "the write names no blocks"},
      {{.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 0}, "layers [0, 0) are outside [0, 4)"},
      {{.blocks = {{0, 0}}, .first_layer = 2, .num_layers = -1}, "layers [2, 1) are outside [0, 4)"},
      {{.blocks = {{0, 0}}, .first_layer = -1, .num_layers = 2}, "layers [-1, 1) are outside [0, 4)"},
      {{.blocks = {{0, 0}}, .first_layer = 3, .num_layers = 2}, "layers [3, 5) are outside [0, 4)"},
      {{.blocks = {{0, 0}}, .first_layer = 4, .num_layers = 1}, "layers [4, 5) are outside [0, 4)"},
      {{.blocks = {{0, 0}, {4, 1}}, .first_layer = 0, .num_layers = 1},
       "source block 4 is outside the local pool of 4"},
      {{.blocks = {{-1, 1}}, .first_layer = 0, .num_layers = 1},
       "source block -1 is outside the local pool of 4"},
      {{.blocks = {{0, 16}}, .first_layer = 0, .num_layers = 1},
       "destination block 16 is outside the peer's pool of 16"},
      {{.blocks = {{1, 2}, {0, -3}}, .first_layer = 0, .num_layers = 1},
       "destination block -3 is outside the peer's pool of 16"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateWrite(c.op, local, remote);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << s;
    EXPECT_EQ(s.message(), c.message);
  }
}

// first_layer + num_layers is computed in int32_t (kv_transport.cc, ValidateWrite): a layer range
// near INT32_MAX overflows, and where it wraps (release builds) to a negative end, the write
// passes and a transport would copy billions of layers. In a child process so that a sanitizer
// report fails this test alone.
TEST(ValidateWriteDeathTest, RefusesLayerRangesThatOverflow) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  for (const auto& [first, num] : {std::pair<int32_t, int32_t>{1, kMax}, {kMax, 1}, {3, kMax - 1}}) {
    EXPECT_EXIT(
        {
          const absl::Status s = ValidateWrite(
              {.blocks = {{0, 0}}, .first_layer = first, .num_layers = num}, Layout(4), Layout(4));
          std::_Exit(s.code() == absl::StatusCode::kInvalidArgument ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "")
        << "first_layer " << first << ", num_layers " << num;
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
