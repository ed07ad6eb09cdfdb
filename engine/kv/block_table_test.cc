#include "engine/kv/block_table.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/block_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int64_t kBlockSize = 4;

KvLayout SmallLayout(int64_t num_blocks) {
  return KvLayout{.num_blocks = num_blocks, .num_layers = 2, .block_size = kBlockSize,
                  .num_kv_heads = 2, .head_dim = 3};
}

std::unique_ptr<BlockPool> MakePool(int64_t num_blocks) {
  auto pool = BlockPool::Create(SmallLayout(num_blocks), {.model_id = "table-test"});
  CHECK_OK(pool.status());
  return std::move(*pool);
}

std::vector<int32_t> Blocks(const BlockTable& table) {
  return std::vector<int32_t>(table.blocks().begin(), table.blocks().end());
}

// The value stored at element `i` of a token's K (V holds the negation) in layer `layer`.
float Encode(float marker, int64_t layer, int64_t i) {
  return marker * 1000.0f + static_cast<float>(layer * 100 + i);
}

// Writes `marker` into every K and V float of position `pos` of `table`, in every layer.
void WritePosition(BlockPool& pool, const BlockTable& table, int64_t pos, float marker) {
  ASSERT_LT(pos, table.num_tokens());
  const KvLayout& l = pool.layout();
  const int32_t block = table.blocks()[static_cast<size_t>(pos / l.block_size)];
  for (int64_t layer = 0; layer < l.num_layers; ++layer) {
    float* k = pool.storage().KeyBlock(block, layer) + (pos % l.block_size) * l.token_stride();
    for (int64_t i = 0; i < l.token_stride(); ++i) {
      k[i] = Encode(marker, layer, i);
      k[i + l.kv_stride()] = -Encode(marker, layer, i);
    }
  }
}

// Whether slot `slot` of `block` holds `marker` in every layer (K and V).
bool SlotHolds(BlockPool& pool, int32_t block, int64_t slot, float marker) {
  const KvLayout& l = pool.layout();
  for (int64_t layer = 0; layer < l.num_layers; ++layer) {
    const float* k = pool.storage().KeyBlock(block, layer) + slot * l.token_stride();
    for (int64_t i = 0; i < l.token_stride(); ++i) {
      if (k[i] != Encode(marker, layer, i)) return false;
      if (k[i + l.kv_stride()] != -Encode(marker, layer, i)) return false;
    }
  }
  return true;
}

// Whether slot `slot` of `block` was never written (the storage starts zeroed).
bool SlotIsZero(BlockPool& pool, int32_t block, int64_t slot) {
  const KvLayout& l = pool.layout();
  for (int64_t layer = 0; layer < l.num_layers; ++layer) {
    const float* k = pool.storage().KeyBlock(block, layer) + slot * l.token_stride();
    for (int64_t i = 0; i < l.token_stride(); ++i) {
      if (k[i] != 0.0f || k[i + l.kv_stride()] != 0.0f) return false;
    }
  }
  return true;
}

// Whether every position of `table` holds markers[pos].
void ExpectHolds(BlockPool& pool, const BlockTable& table, const std::vector<float>& markers) {
  ASSERT_EQ(table.num_tokens(), static_cast<int64_t>(markers.size()));
  for (int64_t pos = 0; pos < table.num_tokens(); ++pos) {
    const int32_t block = table.blocks()[static_cast<size_t>(pos / kBlockSize)];
    EXPECT_TRUE(SlotHolds(pool, block, pos % kBlockSize, markers[static_cast<size_t>(pos)]))
        << "position " << pos << " in block " << block;
  }
}

// Appends one position per marker and writes it.
void AppendAndWrite(BlockPool& pool, BlockTable& table, const std::vector<float>& markers) {
  const int64_t start = table.num_tokens();
  ASSERT_TRUE(table.AppendSlots(static_cast<int64_t>(markers.size())).ok());
  for (size_t i = 0; i < markers.size(); ++i) {
    WritePosition(pool, table, start + static_cast<int64_t>(i), markers[i]);
  }
}

std::vector<float> Markers(int n, float first) {
  std::vector<float> m;
  for (int i = 0; i < n; ++i) m.push_back(first + static_cast<float>(i));
  return m;
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

// ---------------------------------------------------------------------------------------------

TEST(BlockTableTest, EmptyTable) {
  auto pool = MakePool(4);
  BlockTable table(pool.get());
  EXPECT_THAT(table.blocks(), IsEmpty());
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(table.capacity(), 0);
  EXPECT_EQ(table.num_registered(), 0);
  EXPECT_EQ(table.BlocksNeededFor(0), 0);
  EXPECT_EQ(table.BlocksNeededFor(1), 1);
  EXPECT_EQ(table.BlocksNeededFor(kBlockSize), 1);
  EXPECT_EQ(table.BlocksNeededFor(kBlockSize + 1), 2);
  ASSERT_TRUE(table.AppendSlots(0).ok());
  EXPECT_THAT(table.blocks(), IsEmpty());
  EXPECT_EQ(pool->num_used(), 0);
}

TEST(BlockTableTest, AppendSlotsGrowsABlockAtATime) {
  auto pool = MakePool(8);
  BlockTable table(pool.get());
  std::set<int32_t> seen;
  for (int64_t n = 1; n <= 5 * kBlockSize; ++n) {
    const int64_t expect_new = (n - 1) % kBlockSize == 0 ? 1 : 0;
    EXPECT_EQ(table.BlocksNeededFor(1), expect_new) << n;
    const std::vector<int32_t> before = Blocks(table);
    ASSERT_TRUE(table.AppendSlots(1).ok()) << n;
    EXPECT_EQ(table.num_tokens(), n);
    const int64_t num_blocks = (n + kBlockSize - 1) / kBlockSize;
    EXPECT_EQ(static_cast<int64_t>(table.blocks().size()), num_blocks);
    EXPECT_EQ(table.capacity(), num_blocks * kBlockSize);
    // Existing blocks never move.
    EXPECT_TRUE(std::equal(before.begin(), before.end(), table.blocks().begin())) << n;
    for (int32_t b : table.blocks()) {
      EXPECT_EQ(pool->ref_count(b), 1);
      seen.insert(b);
    }
    EXPECT_EQ(pool->num_used(), num_blocks);
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), 5);
}

TEST(BlockTableTest, BlocksNeededForMatchesWhatAppendTakes) {
  auto pool = MakePool(16);
  for (int64_t start = 0; start <= 2 * kBlockSize; ++start) {
    for (int64_t n = 0; n <= 3 * kBlockSize; ++n) {
      BlockTable table(pool.get());
      ASSERT_TRUE(table.AppendSlots(start).ok());
      const int64_t need = table.BlocksNeededFor(n);
      EXPECT_EQ(need, (start + n + kBlockSize - 1) / kBlockSize -
                          (start + kBlockSize - 1) / kBlockSize);
      const int64_t used = pool->num_used();
      ASSERT_TRUE(table.AppendSlots(n).ok());
      EXPECT_EQ(pool->num_used() - used, need) << start << " + " << n;
      EXPECT_EQ(table.num_tokens(), start + n);
    }
  }
  EXPECT_EQ(pool->num_used(), 0) << "each table released at scope end";
}

TEST(BlockTableTest, FailedAppendLeavesTheTableUnchanged) {
  auto pool = MakePool(3);
  BlockTable table(pool.get());
  ASSERT_TRUE(table.AppendSlots(6).ok());  // 2 blocks, 2 free slots
  const std::vector<int32_t> before = Blocks(table);
  // 3 more positions fit in the last block + 1 new block: fine; 7 need 2 new blocks: not.
  EXPECT_EQ(table.BlocksNeededFor(7), 2);
  const absl::Status s = table.AppendSlots(7);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.num_tokens(), 6);
  EXPECT_EQ(table.capacity(), 8);
  EXPECT_EQ(Blocks(table), before);
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_EQ(pool->num_free(), 1);
  for (int32_t b : before) EXPECT_EQ(pool->ref_count(b), 1);
  pool->CheckInvariants();
  // What fits still works.
  ASSERT_TRUE(table.AppendSlots(6).ok());
  EXPECT_EQ(table.num_tokens(), 12);
  EXPECT_EQ(pool->num_free(), 0);
}

TEST(BlockTableTest, ForkSharesEveryBlock) {
  auto pool = MakePool(6);
  BlockTable table(pool.get());
  ASSERT_TRUE(table.AppendSlots(10).ok());
  table.RegisterFullBlocks(HashFullBlocks(pool->model_hash(), Tokens(10, 1), kBlockSize));
  ASSERT_EQ(table.num_registered(), 2);
  {
    BlockTable fork = table.Fork();
    EXPECT_EQ(Blocks(fork), Blocks(table));
    EXPECT_EQ(fork.num_tokens(), 10);
    EXPECT_EQ(fork.capacity(), table.capacity());
    EXPECT_EQ(fork.num_registered(), 2);
    for (int32_t b : table.blocks()) EXPECT_EQ(pool->ref_count(b), 2);
    EXPECT_EQ(pool->num_used(), 3) << "a fork takes no new block";
    BlockTable fork2 = fork.Fork();
    for (int32_t b : table.blocks()) EXPECT_EQ(pool->ref_count(b), 3);
  }
  for (int32_t b : table.blocks()) EXPECT_EQ(pool->ref_count(b), 1);
  EXPECT_EQ(pool->num_used(), 3);
  pool->CheckInvariants();
}

TEST(BlockTableTest, WritingIntoASharedPartialBlockCopiesItForTheFork) {
  auto pool = MakePool(6);
  BlockTable original(pool.get());
  const std::vector<float> prefix = Markers(6, 1);  // block 0 full, block 1 has 2 of 4
  AppendAndWrite(*pool, original, prefix);
  const std::vector<int32_t> shared = Blocks(original);
  BlockTable fork = original.Fork();

  EXPECT_EQ(fork.BlocksNeededFor(1), 1) << "the shared partial block must be copied";
  EXPECT_EQ(fork.BlocksNeededFor(2), 1);
  EXPECT_EQ(fork.BlocksNeededFor(3), 2);
  ASSERT_TRUE(fork.AppendSlots(1).ok());
  ASSERT_EQ(fork.blocks().size(), 2u);
  EXPECT_EQ(fork.blocks()[0], shared[0]) << "the full block stays shared";
  EXPECT_NE(fork.blocks()[1], shared[1]) << "the partial block was copied";
  EXPECT_EQ(pool->ref_count(shared[0]), 2);
  EXPECT_EQ(pool->ref_count(shared[1]), 1);
  EXPECT_EQ(pool->ref_count(fork.blocks()[1]), 1);
  EXPECT_EQ(Blocks(original), shared);

  // The copy holds what the original wrote (positions 0..5; 6 is not written yet).
  for (int64_t pos = 0; pos < 6; ++pos) {
    EXPECT_TRUE(SlotHolds(*pool, fork.blocks()[static_cast<size_t>(pos / kBlockSize)],
                          pos % kBlockSize, prefix[static_cast<size_t>(pos)]))
        << pos;
  }
  // Writing into the fork's copy leaves the original block alone (slot 2 there stays zero).
  ASSERT_TRUE(SlotIsZero(*pool, shared[1], 2));
  WritePosition(*pool, fork, 6, 100);
  EXPECT_TRUE(SlotHolds(*pool, fork.blocks()[1], 2, 100));
  EXPECT_TRUE(SlotIsZero(*pool, shared[1], 2));
  EXPECT_TRUE(SlotIsZero(*pool, shared[1], 3));
  ExpectHolds(*pool, original, prefix);

  // The original now owns its last block alone and appends in place.
  EXPECT_EQ(original.BlocksNeededFor(1), 0);
  ASSERT_TRUE(original.AppendSlots(1).ok());
  EXPECT_EQ(Blocks(original), shared);
  WritePosition(*pool, original, 6, 200);
  std::vector<float> original_markers = prefix;
  original_markers.push_back(200);
  std::vector<float> fork_markers = prefix;
  fork_markers.push_back(100);
  ExpectHolds(*pool, original, original_markers);
  ExpectHolds(*pool, fork, fork_markers);
  pool->CheckInvariants();
}

TEST(BlockTableTest, OriginalWritingAfterForkAlsoCopies) {
  auto pool = MakePool(6);
  BlockTable original(pool.get());
  const std::vector<float> prefix = Markers(3, 10);
  AppendAndWrite(*pool, original, prefix);
  const int32_t shared = original.blocks()[0];
  BlockTable fork = original.Fork();
  AppendAndWrite(*pool, original, {50});
  EXPECT_NE(original.blocks()[0], shared);
  EXPECT_EQ(fork.blocks()[0], shared);
  EXPECT_EQ(pool->ref_count(shared), 1);
  ExpectHolds(*pool, fork, prefix);
  ExpectHolds(*pool, original, {10, 11, 12, 50});
  EXPECT_FALSE(SlotHolds(*pool, shared, 3, 50));
  // The fork now writes in place.
  AppendAndWrite(*pool, fork, {60, 61});
  EXPECT_EQ(fork.blocks()[0], shared);
  ExpectHolds(*pool, fork, {10, 11, 12, 60, 61});
  ExpectHolds(*pool, original, {10, 11, 12, 50});
}

TEST(BlockTableTest, FailedCopyOnWriteLeavesBothTablesUnchanged) {
  auto pool = MakePool(2);
  BlockTable original(pool.get());
  AppendAndWrite(*pool, original, Markers(5, 1));  // 2 blocks, the pool is full
  BlockTable fork = original.Fork();
  EXPECT_EQ(fork.BlocksNeededFor(1), 1);
  EXPECT_EQ(fork.AppendSlots(1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Blocks(fork), Blocks(original));
  EXPECT_EQ(fork.num_tokens(), 5);
  for (int32_t b : original.blocks()) EXPECT_EQ(pool->ref_count(b), 2);
  pool->CheckInvariants();
  // Once the original is gone, the fork owns the block and appends in place.
  original.Release();
  EXPECT_EQ(fork.BlocksNeededFor(1), 0);
  const std::vector<int32_t> fork_blocks = Blocks(fork);
  AppendAndWrite(*pool, fork, {6, 7, 8});
  EXPECT_EQ(Blocks(fork), fork_blocks);
  ExpectHolds(*pool, fork, Markers(8, 1));
}

TEST(BlockTableTest, ForkAppendingAfterAFullSharedBlockAllocatesANewOne) {
  auto pool = MakePool(6);
  BlockTable original(pool.get());
  AppendAndWrite(*pool, original, Markers(8, 1));  // two full blocks
  const std::vector<int32_t> shared = Blocks(original);
  BlockTable fork = original.Fork();
  EXPECT_EQ(fork.BlocksNeededFor(1), 1);
  const int64_t used = pool->num_used();
  AppendAndWrite(*pool, fork, {77});
  EXPECT_EQ(pool->num_used(), used + 1) << "one new block, no copy";
  ASSERT_EQ(fork.blocks().size(), 3u);
  EXPECT_EQ(fork.blocks()[0], shared[0]);
  EXPECT_EQ(fork.blocks()[1], shared[1]);
  EXPECT_EQ(pool->ref_count(shared[0]), 2);
  EXPECT_EQ(pool->ref_count(shared[1]), 2);
  EXPECT_EQ(pool->ref_count(fork.blocks()[2]), 1);
  EXPECT_EQ(Blocks(original), shared);
  ExpectHolds(*pool, original, Markers(8, 1));
  std::vector<float> fork_markers = Markers(8, 1);
  fork_markers.push_back(77);
  ExpectHolds(*pool, fork, fork_markers);
}

TEST(BlockTableTest, ReleaseReturnsBlocksLastFirst) {
  auto pool = MakePool(4);
  std::vector<KvEvent> events;
  pool->set_event_listener([&events](const KvEvent& e) { events.push_back(e); });
  BlockTable table(pool.get());
  ASSERT_TRUE(table.AppendSlots(3 * kBlockSize).ok());
  const std::vector<BlockHash> hashes =
      HashFullBlocks(pool->model_hash(), Tokens(3 * kBlockSize, 1), kBlockSize);
  table.RegisterFullBlocks(hashes);
  const std::vector<int32_t> blocks = Blocks(table);
  table.Release();
  EXPECT_THAT(table.blocks(), IsEmpty());
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(table.num_registered(), 0);
  EXPECT_EQ(table.capacity(), 0);
  EXPECT_EQ(pool->num_cached(), 3);
  EXPECT_EQ(pool->num_free(), 1);
  // The tail was released first, so it goes first; the prefix head survives longest.
  ASSERT_EQ(pool->Allocate(2).status().code(), absl::StatusCode::kOk);  // 1 free + 1 evicted
  ASSERT_EQ(events.back().kind, KvEvent::Kind::kRemoved);
  EXPECT_THAT(events.back().hashes, ElementsAre(hashes[2]));
  EXPECT_EQ(pool->CachedPrefixLength(hashes), 2);
  ASSERT_TRUE(pool->Allocate(1).ok());
  EXPECT_THAT(events.back().hashes, ElementsAre(hashes[1]));
  EXPECT_EQ(pool->CachedPrefixLength(hashes), 1);
  EXPECT_EQ(pool->hash_of(blocks[0]), hashes[0]);
  // Releasing twice is harmless.
  table.Release();
  pool->CheckInvariants();
}

TEST(BlockTableTest, RegisterFullBlocksRegistersOnlyFullBlocks) {
  auto pool = MakePool(6);
  std::vector<KvEvent> events;
  pool->set_event_listener([&events](const KvEvent& e) { events.push_back(e); });
  const std::vector<int32_t> tokens = Tokens(16, 1);
  const std::vector<BlockHash> hashes = HashFullBlocks(pool->model_hash(), tokens, kBlockSize);
  BlockTable table(pool.get());
  ASSERT_TRUE(table.AppendSlots(10).ok());
  table.RegisterFullBlocks(hashes);  // more hashes than full blocks
  EXPECT_EQ(table.num_registered(), 2);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].parent, std::nullopt);
  EXPECT_THAT(events[0].hashes, ElementsAre(hashes[0], hashes[1]));
  EXPECT_EQ(pool->hash_of(table.blocks()[0]), hashes[0]);
  EXPECT_EQ(pool->hash_of(table.blocks()[1]), hashes[1]);
  EXPECT_EQ(pool->hash_of(table.blocks()[2]), std::nullopt);
  // Nothing new: no event.
  table.RegisterFullBlocks(hashes);
  EXPECT_EQ(events.size(), 1u);

  ASSERT_TRUE(table.AppendSlots(6).ok());  // 16 tokens, 4 full blocks
  // Fewer hashes than full blocks: only those covered.
  table.RegisterFullBlocks(absl::MakeConstSpan(hashes).first(3));
  EXPECT_EQ(table.num_registered(), 3);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].parent, hashes[1]);
  EXPECT_THAT(events[1].hashes, ElementsAre(hashes[2]));
  EXPECT_EQ(pool->hash_of(table.blocks()[3]), std::nullopt);
  table.RegisterFullBlocks(hashes);
  EXPECT_EQ(table.num_registered(), 4);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2].parent, hashes[2]);
  EXPECT_THAT(events[2].hashes, ElementsAre(hashes[3]));
  EXPECT_EQ(pool->CachedPrefixLength(hashes), 4);
  // A shorter hash list never unregisters.
  table.RegisterFullBlocks({});
  EXPECT_EQ(table.num_registered(), 4);
}

TEST(BlockTableTest, AdoptCachedPrefixReusesTheBlocksAndTheirContents) {
  auto pool = MakePool(8);
  const std::vector<int32_t> tokens = Tokens(10, 1);
  const std::vector<BlockHash> hashes = HashFullBlocks(pool->model_hash(), tokens, kBlockSize);
  std::vector<int32_t> first_blocks;
  {
    BlockTable first(pool.get());
    AppendAndWrite(*pool, first, Markers(10, 1));
    first.RegisterFullBlocks(hashes);
    first_blocks = Blocks(first);
  }
  EXPECT_EQ(pool->num_cached(), 2);
  EXPECT_EQ(pool->num_used(), 0);

  // A second request with the same first 8 tokens and a different tail.
  std::vector<int32_t> tokens2 = tokens;
  tokens2[8] = 500;
  tokens2.push_back(501);
  tokens2.push_back(502);
  const std::vector<BlockHash> hashes2 = HashFullBlocks(pool->model_hash(), tokens2, kBlockSize);
  ASSERT_EQ(hashes2.size(), 3u);
  ASSERT_EQ(hashes2[1], hashes[1]);
  BlockTable second(pool.get());
  second.AdoptCachedPrefix(pool->AcquirePrefix(hashes2));
  EXPECT_THAT(second.blocks(), ElementsAre(first_blocks[0], first_blocks[1]));
  EXPECT_EQ(second.num_tokens(), 8);
  EXPECT_EQ(second.capacity(), 8);
  EXPECT_EQ(second.num_registered(), 2);
  EXPECT_EQ(pool->num_cached(), 0);
  for (int32_t b : second.blocks()) EXPECT_EQ(pool->ref_count(b), 1);
  ExpectHolds(*pool, second, Markers(8, 1));

  // The rest is appended after the prefix; registration continues after it.
  AppendAndWrite(*pool, second, {90, 91, 92, 93});
  EXPECT_EQ(second.blocks().size(), 3u);
  std::vector<KvEvent> events;
  pool->set_event_listener([&events](const KvEvent& e) { events.push_back(e); });
  second.RegisterFullBlocks(hashes2);
  EXPECT_EQ(second.num_registered(), 3);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].parent, hashes2[1]);
  EXPECT_THAT(events[0].hashes, ElementsAre(hashes2[2]));

  // An empty adoption (cache miss) leaves an empty table.
  BlockTable third(pool.get());
  third.AdoptCachedPrefix(pool->AcquirePrefix({12345}));
  EXPECT_EQ(third.num_tokens(), 0);
  EXPECT_EQ(third.num_registered(), 0);
}

TEST(BlockTableDeathTest, AdoptingIntoANonEmptyTableDies) {
  auto pool = MakePool(4);
  BlockTable table(pool.get());
  ASSERT_TRUE(table.AppendSlots(1).ok());
  EXPECT_DEATH(table.AdoptCachedPrefix({3}), "a cached prefix can only start a table");
}

TEST(BlockTableTest, MoveConstructionKeepsReferencesExact) {
  auto pool = MakePool(6);
  BlockTable a(pool.get());
  AppendAndWrite(*pool, a, Markers(6, 1));
  a.RegisterFullBlocks(HashFullBlocks(pool->model_hash(), Tokens(6, 1), kBlockSize));
  const std::vector<int32_t> blocks = Blocks(a);
  {
    BlockTable b(std::move(a));
    EXPECT_EQ(Blocks(b), blocks);
    EXPECT_EQ(b.num_tokens(), 6);
    EXPECT_EQ(b.num_registered(), 1);
    for (int32_t blk : blocks) EXPECT_EQ(pool->ref_count(blk), 1);
    // The moved-from table is empty and still usable.
    EXPECT_THAT(a.blocks(), IsEmpty());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(a.num_tokens(), 0);
    EXPECT_EQ(a.num_registered(), 0);
    a.Release();
    for (int32_t blk : blocks) EXPECT_EQ(pool->ref_count(blk), 1);
    ASSERT_TRUE(a.AppendSlots(1).ok());
    EXPECT_EQ(pool->num_used(), 3);
    ExpectHolds(*pool, b, Markers(6, 1));
  }
  for (int32_t blk : blocks) EXPECT_EQ(pool->ref_count(blk), 0);
  EXPECT_EQ(pool->num_used(), 1);  // what `a` appended after the move
  a.Release();
  EXPECT_EQ(pool->num_used(), 0);
  pool->CheckInvariants();
}

TEST(BlockTableTest, MoveAssignmentReleasesTheOldBlocks) {
  auto pool = MakePool(8);
  BlockTable a(pool.get());
  ASSERT_TRUE(a.AppendSlots(5).ok());
  BlockTable b(pool.get());
  ASSERT_TRUE(b.AppendSlots(9).ok());
  const std::vector<int32_t> a_blocks = Blocks(a);
  const std::vector<int32_t> b_blocks = Blocks(b);
  BlockTable fork_of_b = b.Fork();
  b = std::move(a);
  EXPECT_EQ(Blocks(b), a_blocks);
  EXPECT_EQ(b.num_tokens(), 5);
  for (int32_t blk : a_blocks) EXPECT_EQ(pool->ref_count(blk), 1);
  for (int32_t blk : b_blocks) EXPECT_EQ(pool->ref_count(blk), 1) << "only the fork holds it";
  EXPECT_THAT(a.blocks(), IsEmpty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.num_tokens(), 0);

  // Self-assignment keeps everything.
  BlockTable& alias = b;
  b = std::move(alias);
  EXPECT_EQ(Blocks(b), a_blocks);
  for (int32_t blk : a_blocks) EXPECT_EQ(pool->ref_count(blk), 1);

  // Assigning an empty table releases.
  b = BlockTable(pool.get());
  for (int32_t blk : a_blocks) EXPECT_EQ(pool->ref_count(blk), 0);
  EXPECT_EQ(pool->num_used(), static_cast<int64_t>(b_blocks.size()));
  pool->CheckInvariants();
}

TEST(BlockTableTest, TablesInAGrowingVectorKeepReferencesExact) {
  auto pool = MakePool(40);
  std::vector<BlockTable> tables;
  for (int i = 0; i < 20; ++i) {
    tables.emplace_back(pool.get());
    ASSERT_TRUE(tables.back().AppendSlots(1 + i % 7).ok());
    if (i % 3 == 0) tables.push_back(tables.back().Fork());
  }
  std::vector<int> refs(40, 0);
  for (const BlockTable& t : tables) {
    for (int32_t b : t.blocks()) ++refs[static_cast<size_t>(b)];
  }
  for (int32_t b = 0; b < 40; ++b) EXPECT_EQ(pool->ref_count(b), refs[static_cast<size_t>(b)]);
  tables.erase(tables.begin(), tables.begin() + 5);
  std::fill(refs.begin(), refs.end(), 0);
  for (const BlockTable& t : tables) {
    for (int32_t b : t.blocks()) ++refs[static_cast<size_t>(b)];
  }
  for (int32_t b = 0; b < 40; ++b) EXPECT_EQ(pool->ref_count(b), refs[static_cast<size_t>(b)]);
  tables.clear();
  EXPECT_EQ(pool->num_used(), 0);
  pool->CheckInvariants();
}

TEST(BlockTableTest, DestructorReleases) {
  auto pool = MakePool(6);
  const std::vector<BlockHash> hashes =
      HashFullBlocks(pool->model_hash(), Tokens(8, 1), kBlockSize);
  {
    BlockTable table(pool.get());
    ASSERT_TRUE(table.AppendSlots(10).ok());
    table.RegisterFullBlocks(hashes);
    EXPECT_EQ(pool->num_used(), 3);
  }
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(pool->num_cached(), 2);
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_EQ(pool->CachedPrefixLength(hashes), 2);
  pool->CheckInvariants();
}

}  // namespace
}  // namespace tandem
