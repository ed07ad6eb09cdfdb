#include "engine/kv/block_pool.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "engine/kv/block_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

constexpr int64_t kBlockSize = 4;

KvLayout TinyLayout(int64_t num_blocks) {
  return KvLayout{.num_blocks = num_blocks, .num_layers = 1, .block_size = kBlockSize,
                  .num_kv_heads = 1, .head_dim = 2};
}

std::unique_ptr<BlockPool> MakePool(int64_t num_blocks, bool prefix_caching = true) {
  auto pool = BlockPool::Create(
      TinyLayout(num_blocks),
      {.model_id = "test-model", .enable_prefix_caching = prefix_caching});
  CHECK_OK(pool.status());
  return std::move(*pool);
}

// Records every event a pool emits.
struct EventLog {
  explicit EventLog(BlockPool* pool) {
    pool->set_event_listener([this](const KvEvent& e) { events.push_back(e); });
  }
  std::vector<KvEvent> events;
};

// Hash chain of `num_blocks` full blocks whose tokens all equal `fill` (distinct fills give
// distinct chains).
std::vector<BlockHash> Chain(const BlockPool& pool, int64_t num_blocks, int32_t fill) {
  std::vector<int32_t> tokens(static_cast<size_t>(num_blocks * kBlockSize), fill);
  // Vary tokens inside the chain so that no two blocks have the same content.
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] += static_cast<int32_t>(i / kBlockSize) * 1000;
  return HashFullBlocks(pool.model_hash(), tokens, kBlockSize);
}

std::vector<int32_t> AllocateOrDie(BlockPool& pool, int64_t n) {
  absl::StatusOr<std::vector<int32_t>> blocks = pool.Allocate(n);
  CHECK_OK(blocks.status());
  return *blocks;
}

void ExpectCountsConsistent(const BlockPool& pool) {
  EXPECT_EQ(pool.num_free() + pool.num_cached() + pool.num_used(), pool.num_blocks());
  EXPECT_EQ(pool.num_available(), pool.num_free() + pool.num_cached());
  EXPECT_GE(pool.num_free(), 0);
  EXPECT_GE(pool.num_cached(), 0);
  EXPECT_GE(pool.num_used(), 0);
  pool.CheckInvariants();
}

// Replays events into the set of cached hashes, checking the id sequence on the way.
std::set<BlockHash> Replay(const std::vector<KvEvent>& events) {
  std::set<BlockHash> cached;
  uint64_t expected_id = 1;
  for (const KvEvent& e : events) {
    EXPECT_EQ(e.event_id, expected_id++);
    switch (e.kind) {
      case KvEvent::Kind::kStored:
        for (BlockHash h : e.hashes) EXPECT_TRUE(cached.insert(h).second) << "stored twice: " << h;
        break;
      case KvEvent::Kind::kRemoved:
        for (BlockHash h : e.hashes) EXPECT_EQ(cached.erase(h), 1u) << "removed unknown: " << h;
        break;
      case KvEvent::Kind::kCleared:
        EXPECT_THAT(e.hashes, IsEmpty());
        cached.clear();
        break;
    }
  }
  return cached;
}

void ExpectSnapshotMatchesEvents(const BlockPool& pool, const std::vector<KvEvent>& events) {
  const std::set<BlockHash> replayed = Replay(events);
  const KvCacheSnapshot snapshot = pool.Snapshot();
  EXPECT_EQ(snapshot.last_event_id, pool.last_event_id());
  EXPECT_EQ(snapshot.last_event_id, static_cast<uint64_t>(events.size()));
  EXPECT_TRUE(std::is_sorted(snapshot.hashes.begin(), snapshot.hashes.end()));
  EXPECT_THAT(snapshot.hashes, ElementsAreArray(replayed));
}

// ---------------------------------------------------------------------------------------------
// Block hashes.

std::vector<int32_t> Iota(int n, int32_t start = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

// The definition of docs/block_hashing.md, written out independently of block_hash.cc.
BlockHash ContractHash(uint64_t parent, uint64_t model, const std::vector<int32_t>& tokens) {
  std::vector<unsigned char> bytes;
  auto put = [&bytes](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  };
  put(parent, 8);
  put(model, 8);
  for (int32_t t : tokens) put(static_cast<uint32_t>(t), 4);
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), kBlockHashSeed);
}

TEST(BlockHashTest, SeedSpellsTandemH1) {
  char text[9] = {};
  const uint64_t seed = kBlockHashSeed;
  for (int i = 0; i < 8; ++i) text[i] = static_cast<char>(seed >> (8 * i));
  EXPECT_STREQ(text, "TANDEMH1");
}

TEST(BlockHashTest, MatchesTheWrittenContract) {
  const std::string model_id = "SmolLM2-135M-Instruct";
  const uint64_t model = ModelIdHash(model_id);
  EXPECT_EQ(model, XXH3_64bits_withSeed(model_id.data(), model_id.size(), kBlockHashSeed));
  // Negative and large token ids are taken as their unsigned 32-bit patterns.
  std::vector<int32_t> tokens = Iota(10);
  tokens[1] = -7;
  tokens[6] = 2147483647;
  const std::vector<BlockHash> h = HashFullBlocks(model, tokens, kBlockSize);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], ContractHash(0, model, {tokens.begin(), tokens.begin() + 4}));
  EXPECT_EQ(h[1], ContractHash(h[0], model, {tokens.begin() + 4, tokens.begin() + 8}));
  EXPECT_EQ(h[0], HashBlock(std::nullopt, model, absl::MakeConstSpan(tokens).subspan(0, 4)));
  EXPECT_EQ(h[1], HashBlock(h[0], model, absl::MakeConstSpan(tokens).subspan(4, 4)));
  // Blocks larger than the 256-token stack buffer hash the same way.
  const std::vector<int32_t> big = Iota(300);
  EXPECT_EQ(HashBlock(std::nullopt, model, big), ContractHash(0, model, big));
  EXPECT_EQ(HashFullBlocks(model, big, 300), std::vector<BlockHash>{ContractHash(0, model, big)});
}

TEST(BlockHashTest, OnlyFullBlocksHaveHashes) {
  const uint64_t model = ModelIdHash("m");
  EXPECT_THAT(HashFullBlocks(model, {}, kBlockSize), IsEmpty());
  EXPECT_THAT(HashFullBlocks(model, Iota(3), kBlockSize), IsEmpty());
  const std::vector<int32_t> tokens = Iota(12);
  const std::vector<BlockHash> all = HashFullBlocks(model, tokens, kBlockSize);
  ASSERT_EQ(all.size(), 3u);
  for (size_t len = 0; len <= tokens.size(); ++len) {
    const std::vector<BlockHash> h =
        HashFullBlocks(model, absl::MakeConstSpan(tokens).first(len), kBlockSize);
    ASSERT_EQ(h.size(), len / kBlockSize) << len;
    // A prefix of the tokens has a prefix of the hashes.
    EXPECT_TRUE(std::equal(h.begin(), h.end(), all.begin())) << len;
  }
  // The tokens of a partial last block do not matter.
  std::vector<int32_t> other = Iota(11);
  other[8] = 99;
  other[10] = -1;
  EXPECT_EQ(HashFullBlocks(model, other, kBlockSize), HashFullBlocks(model, Iota(8), kBlockSize));
}

TEST(BlockHashTest, HashesChainOnEverythingBefore) {
  const uint64_t model = ModelIdHash("m");
  const std::vector<int32_t> base = Iota(16);
  const std::vector<BlockHash> h = HashFullBlocks(model, base, kBlockSize);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(std::set<BlockHash>(h.begin(), h.end()).size(), 4u);

  // A change in block 0 changes every hash.
  std::vector<int32_t> t0 = base;
  t0[2] += 1;
  const std::vector<BlockHash> h0 = HashFullBlocks(model, t0, kBlockSize);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(h0[i], h[i]) << i;

  // A change in block 2 keeps blocks 0 and 1.
  std::vector<int32_t> t2 = base;
  t2[9] = 12345;
  const std::vector<BlockHash> h2 = HashFullBlocks(model, t2, kBlockSize);
  EXPECT_EQ(h2[0], h[0]);
  EXPECT_EQ(h2[1], h[1]);
  EXPECT_NE(h2[2], h[2]);
  EXPECT_NE(h2[3], h[3]);

  // The same block content after a different prefix has a different hash.
  std::vector<int32_t> swapped = base;
  std::swap_ranges(swapped.begin(), swapped.begin() + 4, swapped.begin() + 4);
  const std::vector<BlockHash> hs = HashFullBlocks(model, swapped, kBlockSize);
  EXPECT_NE(hs[0], h[0]);
  EXPECT_NE(hs[1], h[1]);
  EXPECT_NE(hs[2], h[2]);  // same tokens in block 2, different chain

  // Token order inside a block matters.
  std::vector<int32_t> reordered = base;
  std::swap(reordered[0], reordered[1]);
  EXPECT_NE(HashFullBlocks(model, reordered, kBlockSize)[0], h[0]);
}

TEST(BlockHashTest, ModelIdIsAnInput) {
  const std::vector<int32_t> tokens = Iota(8);
  const std::vector<BlockHash> a = HashFullBlocks(ModelIdHash("model-a"), tokens, kBlockSize);
  const std::vector<BlockHash> b = HashFullBlocks(ModelIdHash("model-b"), tokens, kBlockSize);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  EXPECT_NE(ModelIdHash("model-a"), ModelIdHash("model-b"));
  EXPECT_EQ(ModelIdHash("model-a"), ModelIdHash("model-a"));
  // Pools of different models name the same tokens differently.
  auto pa = BlockPool::Create(TinyLayout(1), {.model_id = "model-a"});
  auto pb = BlockPool::Create(TinyLayout(1), {.model_id = "model-b"});
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ((*pa)->model_hash(), ModelIdHash("model-a"));
  EXPECT_EQ((*pb)->model_hash(), ModelIdHash("model-b"));
}

TEST(BlockHashTest, ExtendIncrementallyEqualsAllAtOnce) {
  const uint64_t model = ModelIdHash("m");
  for (int64_t block_size : {1, 3, 4, 16}) {
    std::vector<int32_t> tokens;
    std::vector<BlockHash> incremental;
    for (int i = 0; i < 70; ++i) {
      tokens.push_back((i * 7919) % 50 - 3);
      ExtendBlockHashes(model, tokens, block_size, &incremental);
      ASSERT_EQ(incremental, HashFullBlocks(model, tokens, block_size))
          << "block_size " << block_size << " tokens " << tokens.size();
      // Calling again with nothing new changes nothing.
      ExtendBlockHashes(model, tokens, block_size, &incremental);
      ASSERT_EQ(static_cast<int64_t>(incremental.size()),
                static_cast<int64_t>(tokens.size()) / block_size);
    }
  }
}

TEST(BlockHashTest, ExtendChainsOnTheHashesItIsGiven) {
  // Extend trusts what `hashes` holds and computes only the missing blocks, chained on them.
  const uint64_t model = ModelIdHash("m");
  const std::vector<int32_t> tokens = Iota(12);
  std::vector<BlockHash> hashes = {0xabcdefULL};
  ExtendBlockHashes(model, tokens, kBlockSize, &hashes);
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_EQ(hashes[0], 0xabcdefULL);
  EXPECT_EQ(hashes[1], HashBlock(hashes[0], model, absl::MakeConstSpan(tokens).subspan(4, 4)));
  EXPECT_EQ(hashes[2], HashBlock(hashes[1], model, absl::MakeConstSpan(tokens).subspan(8, 4)));
}

// ---------------------------------------------------------------------------------------------
// Creation and counts.

TEST(BlockPoolTest, CreateValidatesTheLayout) {
  EXPECT_EQ(BlockPool::Create(KvLayout{}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  KvLayout huge = TinyLayout(int64_t{1} << 31);
  EXPECT_EQ(BlockPool::Create(huge, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, FreshPoolIsAllFree) {
  auto pool = MakePool(6);
  EXPECT_EQ(pool->num_blocks(), 6);
  EXPECT_EQ(pool->num_free(), 6);
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(pool->num_available(), 6);
  EXPECT_EQ(pool->block_size(), kBlockSize);
  EXPECT_EQ(pool->model_hash(), ModelIdHash("test-model"));
  EXPECT_TRUE(pool->prefix_caching());
  EXPECT_EQ(pool->last_event_id(), 0u);
  EXPECT_THAT(pool->Snapshot().hashes, IsEmpty());
  for (int32_t b = 0; b < 6; ++b) {
    EXPECT_EQ(pool->ref_count(b), 0);
    EXPECT_EQ(pool->hash_of(b), std::nullopt);
  }
  ExpectCountsConsistent(*pool);
}

TEST(BlockPoolTest, AllocateHandsOutDistinctBlocksWithOneReference) {
  auto pool = MakePool(7);
  std::vector<int32_t> a = AllocateOrDie(*pool, 3);
  std::vector<int32_t> b = AllocateOrDie(*pool, 4);
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  EXPECT_THAT(all, ElementsAre(0, 1, 2, 3, 4, 5, 6));
  for (int32_t blk : all) EXPECT_EQ(pool->ref_count(blk), 1);
  EXPECT_EQ(pool->num_used(), 7);
  EXPECT_EQ(pool->num_free(), 0);
  EXPECT_THAT(AllocateOrDie(*pool, 0), IsEmpty());
  ExpectCountsConsistent(*pool);
}

TEST(BlockPoolTest, AllocateTakesFreeBlocksBeforeEvictingCachedOnes) {
  auto pool = MakePool(6);
  EventLog log(pool.get());
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 6);
  const std::vector<BlockHash> chain = Chain(*pool, 3, 1);
  // Blocks 0..2 hold a chain; 3..5 hold nothing.
  ASSERT_EQ(pool->Register({blocks[0], blocks[1], blocks[2]}, chain, std::nullopt), 3);
  pool->Release(blocks);
  EXPECT_EQ(pool->num_cached(), 3);
  EXPECT_EQ(pool->num_free(), 3);
  const size_t events_before = log.events.size();

  std::vector<int32_t> got = AllocateOrDie(*pool, 3);
  std::sort(got.begin(), got.end());
  EXPECT_THAT(got, ElementsAre(blocks[3], blocks[4], blocks[5]));
  EXPECT_EQ(log.events.size(), events_before) << "no eviction while free blocks remain";
  EXPECT_EQ(pool->num_cached(), 3);
  EXPECT_EQ(pool->CachedPrefixLength(chain), 3);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, EvictsLeastRecentlyReleasedFirstWithOneRemovedEvent) {
  auto pool = MakePool(6);
  EventLog log(pool.get());
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 6);
  // Six single-block chains, one per block.
  std::vector<BlockHash> h;
  for (int32_t i = 0; i < 6; ++i) {
    h.push_back(Chain(*pool, 1, 10 + i)[0]);
    ASSERT_EQ(pool->Register({blocks[static_cast<size_t>(i)]}, {h.back()}, std::nullopt), 1);
  }
  // Release order: 4, 1, 5, 0, 3, 2 (one call, in order) -> that is the eviction order.
  const std::vector<size_t> order = {4, 1, 5, 0, 3, 2};
  std::vector<int32_t> release;
  for (size_t i : order) release.push_back(blocks[i]);
  pool->Release(release);
  EXPECT_EQ(pool->num_cached(), 6);
  EXPECT_EQ(pool->num_free(), 0);

  // Taking one back through the cache refreshes nothing but removes it from the eviction list.
  ASSERT_THAT(pool->AcquirePrefix({h[5]}), ElementsAre(blocks[5]));
  pool->Release({blocks[5]});  // now the most recently released

  size_t seen = log.events.size();
  std::vector<int32_t> got = AllocateOrDie(*pool, 2);
  EXPECT_THAT(got, ElementsAre(blocks[4], blocks[1]));
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().kind, KvEvent::Kind::kRemoved);
  EXPECT_THAT(log.events.back().hashes, ElementsAre(h[4], h[1]));
  EXPECT_EQ(pool->hash_of(blocks[4]), std::nullopt);
  EXPECT_EQ(pool->hash_of(blocks[1]), std::nullopt);
  EXPECT_EQ(pool->CachedPrefixLength({h[4]}), 0);
  EXPECT_EQ(pool->num_cached(), 4);

  seen = log.events.size();
  got = AllocateOrDie(*pool, 4);
  EXPECT_THAT(got, ElementsAre(blocks[0], blocks[3], blocks[2], blocks[5]));
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().kind, KvEvent::Kind::kRemoved);
  EXPECT_THAT(log.events.back().hashes, ElementsAre(h[0], h[3], h[2], h[5]));
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_used(), 6);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, MixedAllocateTakesAllFreeThenEvicts) {
  auto pool = MakePool(5);
  EventLog log(pool.get());
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 5);
  const std::vector<BlockHash> chain = Chain(*pool, 3, 7);
  ASSERT_EQ(pool->Register({blocks[0], blocks[1], blocks[2]}, chain, std::nullopt), 3);
  // Release last first, as a table does: block 2 is evicted first, block 0 last.
  pool->Release({blocks[4], blocks[3], blocks[2], blocks[1], blocks[0]});
  const size_t seen = log.events.size();
  std::vector<int32_t> got = AllocateOrDie(*pool, 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_THAT(std::vector<int32_t>(got.begin(), got.begin() + 2),
              UnorderedElementsAreArray({blocks[3], blocks[4]}));
  EXPECT_THAT(std::vector<int32_t>(got.begin() + 2, got.end()), ElementsAre(blocks[2], blocks[1]));
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().kind, KvEvent::Kind::kRemoved);
  EXPECT_THAT(log.events.back().hashes, ElementsAre(chain[2], chain[1]));
  // The head of the chain survives.
  EXPECT_EQ(pool->CachedPrefixLength(chain), 1);
  EXPECT_EQ(pool->hash_of(blocks[0]), chain[0]);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, AllocateFailureTakesNothing) {
  auto pool = MakePool(5);
  EventLog log(pool.get());
  const std::vector<int32_t> held = AllocateOrDie(*pool, 3);
  const std::vector<BlockHash> chain = Chain(*pool, 1, 3);
  ASSERT_EQ(pool->Register({held[0]}, chain, std::nullopt), 1);
  pool->Release({held[0]});  // 2 free, 1 cached, 2 used
  ASSERT_EQ(pool->num_free(), 2);
  ASSERT_EQ(pool->num_cached(), 1);
  const size_t seen = log.events.size();
  const uint64_t last_id = pool->last_event_id();

  for (int64_t n : {4, 5, 100}) {
    absl::StatusOr<std::vector<int32_t>> r = pool->Allocate(n);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << n;
    EXPECT_EQ(pool->num_free(), 2);
    EXPECT_EQ(pool->num_cached(), 1);
    EXPECT_EQ(pool->num_used(), 2);
    EXPECT_EQ(pool->hash_of(held[0]), chain[0]);
    EXPECT_EQ(pool->CachedPrefixLength(chain), 1);
    EXPECT_EQ(log.events.size(), seen);
    EXPECT_EQ(pool->last_event_id(), last_id);
    ExpectCountsConsistent(*pool);
  }
  EXPECT_FALSE(pool->Allocate(-1).ok());
  EXPECT_EQ(pool->num_available(), 3);
  // Exactly what is available still works.
  EXPECT_EQ(AllocateOrDie(*pool, 3).size(), 3u);
  EXPECT_EQ(pool->num_available(), 0);
  EXPECT_EQ(pool->Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, RetainAndReleaseCountReferences) {
  auto pool = MakePool(3);
  const int32_t b = AllocateOrDie(*pool, 1)[0];
  EXPECT_EQ(pool->ref_count(b), 1);
  pool->Retain(b);
  pool->Retain(b);
  EXPECT_EQ(pool->ref_count(b), 3);
  EXPECT_EQ(pool->num_used(), 1);
  pool->Release({b});
  EXPECT_EQ(pool->ref_count(b), 2);
  EXPECT_EQ(pool->num_used(), 1);
  EXPECT_EQ(pool->num_free(), 2);
  // One span may hold the same block more than once: one reference each.
  pool->Release({b, b});
  EXPECT_EQ(pool->ref_count(b), 0);
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(pool->num_free(), 3);
  ExpectCountsConsistent(*pool);
}

TEST(BlockPoolTest, ReleasedHashedBlockIsCachedAndUnhashedIsFree) {
  auto pool = MakePool(4);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register({blocks[0]}, {Chain(*pool, 1, 5)[0]}, std::nullopt), 1);
  pool->Retain(blocks[0]);
  pool->Release({blocks[0]});
  EXPECT_EQ(pool->num_cached(), 0) << "still referenced";
  EXPECT_EQ(pool->num_used(), 2);
  pool->Release({blocks[0]});
  EXPECT_EQ(pool->num_cached(), 1);
  EXPECT_EQ(pool->num_used(), 1);
  EXPECT_EQ(pool->num_free(), 2);
  EXPECT_TRUE(pool->hash_of(blocks[0]).has_value());
  pool->Release({blocks[1]});
  EXPECT_EQ(pool->num_cached(), 1);
  EXPECT_EQ(pool->num_free(), 3);
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(pool->num_available(), 4);
  ExpectCountsConsistent(*pool);
}

// ---------------------------------------------------------------------------------------------
// Register and events.

TEST(BlockPoolTest, RegisterStoresAChainWithOneEvent) {
  auto pool = MakePool(6);
  EventLog log(pool.get());
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 4);
  const std::vector<BlockHash> chain = Chain(*pool, 4, 1);
  EXPECT_EQ(pool->Register({blocks[0], blocks[1]}, {chain[0], chain[1]}, std::nullopt), 2);
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].event_id, 1u);
  EXPECT_EQ(log.events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(log.events[0].parent, std::nullopt);
  EXPECT_THAT(log.events[0].hashes, ElementsAre(chain[0], chain[1]));
  // Continuing the sequence: parent is the hash before.
  EXPECT_EQ(pool->Register({blocks[2], blocks[3]}, {chain[2], chain[3]}, chain[1]), 2);
  ASSERT_EQ(log.events.size(), 2u);
  EXPECT_EQ(log.events[1].event_id, 2u);
  EXPECT_EQ(log.events[1].parent, chain[1]);
  EXPECT_THAT(log.events[1].hashes, ElementsAre(chain[2], chain[3]));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(pool->hash_of(blocks[i]), chain[i]);
  EXPECT_EQ(pool->CachedPrefixLength(chain), 4);
  // Registering is not releasing: the blocks stay used.
  EXPECT_EQ(pool->num_used(), 4);
  EXPECT_EQ(pool->num_cached(), 0);
  // An empty register stores nothing and says nothing.
  EXPECT_EQ(pool->Register({}, {}, std::nullopt), 0);
  EXPECT_EQ(log.events.size(), 2u);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, RegisterSkipsHashesHeldByOtherBlocks) {
  auto pool = MakePool(8);
  EventLog log(pool.get());
  const std::vector<int32_t> first = AllocateOrDie(*pool, 2);
  const std::vector<BlockHash> chain = Chain(*pool, 4, 1);
  ASSERT_EQ(pool->Register(first, {chain[0], chain[1]}, std::nullopt), 2);
  // A second sequence computed the same two blocks itself, then two more.
  const std::vector<int32_t> second = AllocateOrDie(*pool, 4);
  const size_t seen = log.events.size();
  EXPECT_EQ(pool->Register(second, chain, std::nullopt), 2);
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().kind, KvEvent::Kind::kStored);
  EXPECT_EQ(log.events.back().parent, chain[1]);
  EXPECT_THAT(log.events.back().hashes, ElementsAre(chain[2], chain[3]));
  // The duplicates stay unhashed; the index still points at the first sequence's blocks.
  EXPECT_EQ(pool->hash_of(second[0]), std::nullopt);
  EXPECT_EQ(pool->hash_of(second[1]), std::nullopt);
  EXPECT_EQ(pool->hash_of(second[2]), chain[2]);
  EXPECT_EQ(pool->hash_of(second[3]), chain[3]);
  EXPECT_EQ(pool->hash_of(first[0]), chain[0]);
  std::vector<int32_t> hit = pool->AcquirePrefix(chain);
  EXPECT_THAT(hit, ElementsAre(first[0], first[1], second[2], second[3]));
  pool->Release(hit);
  // Releasing the duplicates frees them (they hold no hash).
  pool->Release({second[1], second[0]});
  EXPECT_EQ(pool->ref_count(second[0]), 0);
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_free(), 4);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, RegisterSplitsRunsAroundSkippedHashes) {
  auto pool = MakePool(10);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 6, 2);
  const BlockHash before = Chain(*pool, 1, 99)[0];
  // Another block already holds chain[1] and chain[4].
  const std::vector<int32_t> other = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register({other[0]}, {chain[1]}, chain[0]), 1);
  ASSERT_EQ(pool->Register({other[1]}, {chain[4]}, chain[3]), 1);
  const size_t seen = log.events.size();
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 6);
  EXPECT_EQ(pool->Register(blocks, chain, before), 4);
  ASSERT_EQ(log.events.size(), seen + 3);
  const KvEvent& a = log.events[seen];
  const KvEvent& b = log.events[seen + 1];
  const KvEvent& c = log.events[seen + 2];
  EXPECT_EQ(a.kind, KvEvent::Kind::kStored);
  EXPECT_EQ(a.parent, before);
  EXPECT_THAT(a.hashes, ElementsAre(chain[0]));
  EXPECT_EQ(b.kind, KvEvent::Kind::kStored);
  EXPECT_EQ(b.parent, chain[1]);
  EXPECT_THAT(b.hashes, ElementsAre(chain[2], chain[3]));
  EXPECT_EQ(c.kind, KvEvent::Kind::kStored);
  EXPECT_EQ(c.parent, chain[4]);
  EXPECT_THAT(c.hashes, ElementsAre(chain[5]));
  EXPECT_EQ(a.event_id + 1, b.event_id);
  EXPECT_EQ(b.event_id + 1, c.event_id);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, RegisterWithLeadingAndTrailingSkips) {
  auto pool = MakePool(8);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 4, 3);
  const std::vector<int32_t> other = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register({other[0]}, {chain[0]}, std::nullopt), 1);
  ASSERT_EQ(pool->Register({other[1]}, {chain[3]}, chain[2]), 1);
  const size_t seen = log.events.size();
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 4);
  EXPECT_EQ(pool->Register(blocks, chain, std::nullopt), 2);
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().parent, chain[0]);
  EXPECT_THAT(log.events.back().hashes, ElementsAre(chain[1], chain[2]));
  // All skipped: no event at all.
  const std::vector<int32_t> more = AllocateOrDie(*pool, 2);
  EXPECT_EQ(pool->Register(more, {chain[0], chain[1]}, std::nullopt), 0);
  EXPECT_EQ(log.events.size(), seen + 1);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, ABlockKeepsItsFirstHash) {
  auto pool = MakePool(3);
  EventLog log(pool.get());
  const int32_t b = AllocateOrDie(*pool, 1)[0];
  const BlockHash h1 = Chain(*pool, 1, 1)[0];
  const BlockHash h2 = Chain(*pool, 1, 2)[0];
  ASSERT_EQ(pool->Register({b}, {h1}, std::nullopt), 1);
  EXPECT_EQ(pool->Register({b}, {h2}, std::nullopt), 0);
  EXPECT_EQ(pool->Register({b}, {h1}, std::nullopt), 0);
  EXPECT_EQ(pool->hash_of(b), h1);
  EXPECT_EQ(pool->CachedPrefixLength({h2}), 0);
  EXPECT_EQ(pool->CachedPrefixLength({h1}), 1);
  EXPECT_EQ(log.events.size(), 1u);
  // h2 is still free to be stored by another block.
  const int32_t c = AllocateOrDie(*pool, 1)[0];
  EXPECT_EQ(pool->Register({c}, {h2}, std::nullopt), 1);
  EXPECT_EQ(pool->hash_of(c), h2);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, EvictedHashCanBeStoredAgain) {
  auto pool = MakePool(2);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 1, 4);
  const int32_t a = AllocateOrDie(*pool, 1)[0];
  ASSERT_EQ(pool->Register({a}, chain, std::nullopt), 1);
  pool->Release({a});
  const std::vector<int32_t> both = AllocateOrDie(*pool, 2);  // evicts `a`
  ASSERT_EQ(log.events.back().kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(pool->Register({both[0]}, chain, std::nullopt), 1);
  EXPECT_EQ(pool->hash_of(both[0]), chain[0]);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

// ---------------------------------------------------------------------------------------------
// Prefix lookups.

TEST(BlockPoolTest, AcquirePrefixTakesTheLongestCachedChain) {
  auto pool = MakePool(8);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 5, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 4);
  // Blocks hold chain[0], chain[1] and chain[3], not chain[2].
  ASSERT_EQ(pool->Register({blocks[0], blocks[1]}, {chain[0], chain[1]}, std::nullopt), 2);
  ASSERT_EQ(pool->Register({blocks[3]}, {chain[3]}, chain[2]), 1);
  pool->Release({blocks[3], blocks[2], blocks[1], blocks[0]});
  ASSERT_EQ(pool->num_cached(), 3);
  const size_t seen = log.events.size();

  EXPECT_EQ(pool->CachedPrefixLength(chain), 2);
  EXPECT_EQ(pool->num_cached(), 3) << "CachedPrefixLength takes nothing";
  std::vector<int32_t> hit = pool->AcquirePrefix(chain);
  EXPECT_THAT(hit, ElementsAre(blocks[0], blocks[1]));
  EXPECT_EQ(pool->ref_count(blocks[0]), 1);
  EXPECT_EQ(pool->ref_count(blocks[1]), 1);
  EXPECT_EQ(pool->ref_count(blocks[3]), 0);
  EXPECT_EQ(pool->num_cached(), 1);
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_EQ(log.events.size(), seen) << "acquiring emits nothing";
  ExpectCountsConsistent(*pool);

  // Acquiring a used block again only adds a reference.
  std::vector<int32_t> again = pool->AcquirePrefix({chain[0]});
  EXPECT_THAT(again, ElementsAre(blocks[0]));
  EXPECT_EQ(pool->ref_count(blocks[0]), 2);
  EXPECT_EQ(pool->num_used(), 2);

  // A miss on the first hash takes nothing, even when later hashes are cached.
  EXPECT_THAT(pool->AcquirePrefix({chain[2], chain[3]}), IsEmpty());
  EXPECT_EQ(pool->CachedPrefixLength({chain[2], chain[3]}), 0);
  EXPECT_EQ(pool->ref_count(blocks[3]), 0);
  EXPECT_EQ(pool->num_cached(), 1);
  EXPECT_THAT(pool->AcquirePrefix({}), IsEmpty());
  EXPECT_EQ(pool->CachedPrefixLength({}), 0);

  // The mid-chain block alone is found by its own hash.
  EXPECT_THAT(pool->AcquirePrefix({chain[3]}), ElementsAre(blocks[3]));
  EXPECT_EQ(pool->num_cached(), 0);
  pool->Release({blocks[3]});
  pool->Release(again);
  pool->Release({hit[1], hit[0]});
  EXPECT_EQ(pool->num_cached(), 3);
  EXPECT_EQ(pool->num_used(), 0);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, AcquiredBlocksAreNotEvicted) {
  auto pool = MakePool(3);
  const std::vector<BlockHash> chain = Chain(*pool, 2, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register(blocks, chain, std::nullopt), 2);
  pool->Release({blocks[1], blocks[0]});
  std::vector<int32_t> hit = pool->AcquirePrefix(chain);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(pool->num_available(), 1);
  EXPECT_EQ(pool->Allocate(2).status().code(), absl::StatusCode::kResourceExhausted);
  std::vector<int32_t> one = AllocateOrDie(*pool, 1);
  EXPECT_NE(one[0], blocks[0]);
  EXPECT_NE(one[0], blocks[1]);
  EXPECT_EQ(pool->CachedPrefixLength(chain), 2);
  ExpectCountsConsistent(*pool);
}

TEST(BlockPoolTest, ClearCacheForgetsEveryHash) {
  auto pool = MakePool(6);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 4, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 4);
  ASSERT_EQ(pool->Register(blocks, chain, std::nullopt), 4);
  // Blocks 2, 3 cached; 0, 1 still used.
  pool->Release({blocks[3], blocks[2]});
  ASSERT_EQ(pool->num_cached(), 2);
  const size_t seen = log.events.size();
  pool->ClearCache();
  ASSERT_EQ(log.events.size(), seen + 1);
  EXPECT_EQ(log.events.back().kind, KvEvent::Kind::kCleared);
  EXPECT_THAT(log.events.back().hashes, IsEmpty());
  EXPECT_EQ(log.events.back().event_id, pool->last_event_id());
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_THAT(pool->Snapshot().hashes, IsEmpty());
  EXPECT_EQ(pool->CachedPrefixLength(chain), 0);
  for (int32_t b : blocks) EXPECT_EQ(pool->hash_of(b), std::nullopt);
  // Used blocks lost their hash too: released, they are free, not cached.
  pool->Release({blocks[1], blocks[0]});
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_free(), 6);
  // Allocating after a clear evicts nothing.
  const size_t seen2 = log.events.size();
  EXPECT_EQ(AllocateOrDie(*pool, 6).size(), 6u);
  EXPECT_EQ(log.events.size(), seen2);
  // An empty cache can be cleared again; it is still one event.
  pool->ClearCache();
  EXPECT_EQ(log.events.size(), seen2 + 1);
  ExpectCountsConsistent(*pool);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, ClearedHashesCanBeStoredAgain) {
  auto pool = MakePool(4);
  EventLog log(pool.get());
  const std::vector<BlockHash> chain = Chain(*pool, 2, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register(blocks, chain, std::nullopt), 2);
  pool->ClearCache();
  EXPECT_EQ(pool->Register(blocks, chain, std::nullopt), 2);
  EXPECT_EQ(pool->CachedPrefixLength(chain), 2);
  ExpectSnapshotMatchesEvents(*pool, log.events);
}

TEST(BlockPoolTest, PrefixCachingOffCachesNothing) {
  auto pool = MakePool(4, /*prefix_caching=*/false);
  EventLog log(pool.get());
  EXPECT_FALSE(pool->prefix_caching());
  const std::vector<BlockHash> chain = Chain(*pool, 3, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 3);
  EXPECT_EQ(pool->Register(blocks, chain, std::nullopt), 0);
  for (int32_t b : blocks) EXPECT_EQ(pool->hash_of(b), std::nullopt);
  EXPECT_THAT(log.events, IsEmpty());
  EXPECT_EQ(pool->CachedPrefixLength(chain), 0);
  EXPECT_THAT(pool->AcquirePrefix(chain), IsEmpty());
  pool->Release({blocks[2], blocks[1], blocks[0]});
  EXPECT_EQ(pool->num_cached(), 0);
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_THAT(pool->Snapshot().hashes, IsEmpty());
  EXPECT_EQ(pool->last_event_id(), 0u);
  ExpectCountsConsistent(*pool);
}

TEST(BlockPoolTest, EventsAreNumberedWithoutAListener) {
  auto pool = MakePool(4);
  const std::vector<BlockHash> chain = Chain(*pool, 2, 1);
  const std::vector<int32_t> blocks = AllocateOrDie(*pool, 2);
  ASSERT_EQ(pool->Register({blocks[0]}, {chain[0]}, std::nullopt), 1);
  ASSERT_EQ(pool->Register({blocks[1]}, {chain[1]}, chain[0]), 1);
  EXPECT_EQ(pool->last_event_id(), 2u);
  // A listener set later continues the numbering.
  EventLog log(pool.get());
  pool->ClearCache();
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].event_id, 3u);
  EXPECT_EQ(pool->Snapshot().last_event_id, 3u);
}

TEST(BlockPoolTest, EventIdsAreContiguousAndSnapshotMatchesReplay) {
  auto pool = MakePool(6);
  EventLog log(pool.get());
  // A scripted mix of every kind of event.
  for (int round = 0; round < 5; ++round) {
    const std::vector<BlockHash> chain = Chain(*pool, 3, 100 + round);
    std::vector<int32_t> blocks = AllocateOrDie(*pool, 3);
    pool->Register(blocks, chain, std::nullopt);
    pool->Release({blocks[2], blocks[1], blocks[0]});
    if (round == 3) pool->ClearCache();
    ExpectSnapshotMatchesEvents(*pool, log.events);
    ExpectCountsConsistent(*pool);
  }
  ASSERT_FALSE(log.events.empty());
  bool saw_removed = false, saw_cleared = false;
  for (const KvEvent& e : log.events) {
    saw_removed |= e.kind == KvEvent::Kind::kRemoved;
    saw_cleared |= e.kind == KvEvent::Kind::kCleared;
  }
  EXPECT_TRUE(saw_removed);
  EXPECT_TRUE(saw_cleared);
}

// ---------------------------------------------------------------------------------------------
// Broken invariants crash.

TEST(BlockPoolDeathTest, ReleasingAnUnheldBlockDies) {
  auto pool = MakePool(4);
  EXPECT_DEATH(pool->Release({2}), "releasing block 2 that no sequence holds");
  const int32_t b = AllocateOrDie(*pool, 1)[0];
  pool->Release({b});
  EXPECT_DEATH(pool->Release({b}), "that no sequence holds");
}

TEST(BlockPoolDeathTest, ReleasingACachedBlockDies) {
  auto pool = MakePool(4);
  const int32_t b = AllocateOrDie(*pool, 1)[0];
  ASSERT_EQ(pool->Register({b}, Chain(*pool, 1, 1), std::nullopt), 1);
  pool->Release({b});
  ASSERT_EQ(pool->num_cached(), 1);
  EXPECT_DEATH(pool->Release({b}), "releasing block .* that no sequence holds");
}

TEST(BlockPoolDeathTest, RetainingOrRegisteringAnUnheldBlockDies) {
  auto pool = MakePool(4);
  EXPECT_DEATH(pool->Retain(1), "retaining block 1 that no sequence holds");
  EXPECT_DEATH(pool->Register({3}, Chain(*pool, 1, 1), std::nullopt),
               "registering block 3 that no sequence holds");
}

TEST(BlockPoolDeathTest, BlocksOutsideThePoolDie) {
  auto pool = MakePool(4);
  EXPECT_DEATH(pool->Release({4}), "block 4 outside the pool of 4");
  EXPECT_DEATH(pool->Retain(-1), "outside the pool");
  EXPECT_DEATH((void)pool->ref_count(7), "outside the pool");
}

}  // namespace
}  // namespace tandem
