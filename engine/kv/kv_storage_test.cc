#include "engine/kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

KvLayout SmallLayout() {
  return KvLayout{.num_blocks = 8, .num_layers = 3, .block_size = 4, .num_kv_heads = 2,
                  .head_dim = 5};
}

TEST(KvStorageTest, LayoutStridesTileTheRegionExactly) {
  const KvLayout l = SmallLayout();
  EXPECT_EQ(l.token_stride(), 10);
  EXPECT_EQ(l.kv_stride(), 40);
  EXPECT_EQ(l.layer_stride(), 80);
  EXPECT_EQ(l.block_stride(), 240);
  EXPECT_EQ(l.total_elements(), 1920);
  auto storage = KvStorage::Create(l);
  ASSERT_TRUE(storage.ok());
  // Every (block, layer, K|V, slot, head, d) maps to a distinct float inside the region.
  std::set<const float*> seen;
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* base = (*storage)->KeyBlock(b, layer) + kv * l.kv_stride();
        for (int64_t i = 0; i < l.kv_stride(); ++i) {
          const float* p = base + i;
          ASSERT_GE(p, (*storage)->data());
          ASSERT_LT(p, (*storage)->data() + l.total_elements());
          ASSERT_TRUE(seen.insert(p).second);
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), l.total_elements());
  EXPECT_EQ(static_cast<const char*>((*storage)->LayerValues(2)) -
                static_cast<const char*>((*storage)->LayerKeys(2)),
            l.kv_stride() * 4);
  EXPECT_EQ(l.total_bytes(), 1920 * 4);
  EXPECT_EQ(l.block_bytes(), 80 * 4);
  EXPECT_EQ(l.block_stride_bytes(), 240 * 4);
}

// An F16 pool: the same strides in elements, half the bytes, addressed as uint16_t; reading it as
// float is a programming error.
TEST(KvStorageTest, F16PoolHalvesTheBytes) {
  KvLayout l = SmallLayout();
  l.dtype = DType::kF16;
  EXPECT_EQ(l.total_bytes(), 1920 * 2);
  EXPECT_EQ(l.block_bytes(), 80 * 2);
  EXPECT_EQ(l.block_stride_bytes(), 240 * 2);
  auto storage = *KvStorage::Create(l);
  uint16_t* k = storage->KeyBlock<uint16_t>(5, 2);
  EXPECT_EQ(k - storage->data<uint16_t>(), 5 * l.block_stride() + 2 * l.layer_stride());
  EXPECT_EQ(static_cast<const char*>(storage->LayerValues(1)) -
                static_cast<const char*>(storage->LayerKeys(1)),
            l.kv_stride() * 2);
  for (int64_t i = 0; i < l.block_stride(); ++i) {
    storage->data<uint16_t>()[2 * l.block_stride() + i] = static_cast<uint16_t>(i + 1);
  }
  storage->CopyBlock(2, 7);
  for (int64_t i = 0; i < l.block_stride(); ++i) {
    ASSERT_EQ(storage->data<uint16_t>()[7 * l.block_stride() + i], i + 1);
  }
  EXPECT_EQ(storage->data<uint16_t>()[6 * l.block_stride()], 0);
  EXPECT_DEATH(storage->KeyBlock<float>(0, 0), "wrong element type");
}

TEST(KvStorageTest, CopyBlockCopiesEveryLayer) {
  auto storage = *KvStorage::Create(SmallLayout());
  const KvLayout& l = storage->layout();
  float* src = storage->data() + 3 * l.block_stride();
  for (int64_t i = 0; i < l.block_stride(); ++i) src[i] = static_cast<float>(i + 1);
  storage->CopyBlock(3, 6);
  const float* dst = storage->data() + 6 * l.block_stride();
  for (int64_t i = 0; i < l.block_stride(); ++i) ASSERT_EQ(dst[i], static_cast<float>(i + 1));
  // Neighbours are untouched.
  EXPECT_EQ(storage->data()[5 * l.block_stride() + l.block_stride() - 1], 0.0f);
  EXPECT_EQ(storage->data()[7 * l.block_stride()], 0.0f);
  EXPECT_DEATH(storage->CopyBlock(0, 8), "outside the pool");
}

// Memory the host cannot address (a GPU's) comes with its own zero and copy: KvStorage uses them,
// never memset or memcpy, for the region. Here the "device" is the heap, filled with garbage, and
// its zero and copy record the calls.
TEST(KvStorageTest, AnAllocatorsZeroAndCopyReplaceMemsetAndMemcpy) {
  std::vector<std::pair<size_t, size_t>> zeroed;                 // (offset, bytes)
  std::vector<std::tuple<size_t, size_t, size_t>> copied;        // (dst, src, bytes) offsets
  std::byte* base = nullptr;
  KvAllocator device{
      .allocate = [&](size_t bytes) -> absl::StatusOr<void*> {
        base = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
        std::memset(base, 0xAB, bytes);
        return base;
      },
      .release = [](void* p) { std::free(p); },
      .zero =
          [&](void* dst, size_t bytes) {
            zeroed.emplace_back(static_cast<std::byte*>(dst) - base, bytes);
            std::memset(dst, 0, bytes);
          },
      .copy =
          [&](void* dst, const void* src, size_t bytes) {
            copied.emplace_back(static_cast<std::byte*>(dst) - base,
                                static_cast<const std::byte*>(src) - base, bytes);
            std::memcpy(dst, src, bytes);
          }};
  auto storage = *KvStorage::Create(SmallLayout(), device);
  const KvLayout& l = storage->layout();
  ASSERT_EQ(zeroed.size(), 1u);
  EXPECT_EQ(zeroed[0], std::make_pair(size_t{0}, static_cast<size_t>(l.total_bytes())));
  EXPECT_EQ(storage->data()[l.total_elements() - 1], 0.0f);

  storage->data()[2 * l.block_stride()] = 7.0f;
  storage->CopyBlock(2, 5);
  const size_t block = static_cast<size_t>(l.block_stride_bytes());
  ASSERT_EQ(copied.size(), 1u);
  EXPECT_EQ(copied[0], std::make_tuple(5 * block, 2 * block, block));
  EXPECT_EQ(storage->data()[5 * l.block_stride()], 7.0f);
}

TEST(KvStorageTest, ParsesKvDTypeFlags) {
  EXPECT_EQ(*ParseKvDType("f16"), DType::kF16);
  EXPECT_EQ(*ParseKvDType("F32"), DType::kF32);
  for (const char* bad : {"", "bf16", "fp16", "q8_0"}) {
    const absl::StatusOr<DType> d = ParseKvDType(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseKvDType("half").status().message(), "KV dtype 'half' is not one of f16, f32");
}

TEST(KvStorageTest, BadLayouts) {
  for (KvLayout l : {KvLayout{}, KvLayout{.num_blocks = -1, .num_layers = 1, .block_size = 1,
                                          .num_kv_heads = 1, .head_dim = 1},
                     KvLayout{.num_blocks = int64_t{1} << 30, .num_layers = 32, .block_size = 16,
                              .num_kv_heads = 8, .head_dim = 128},
                     KvLayout{.num_blocks = 1, .num_layers = 1, .block_size = 1,
                              .num_kv_heads = 1, .head_dim = 1, .dtype = DType::kBF16}}) {
    EXPECT_EQ(KvStorage::Create(l).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tandem
