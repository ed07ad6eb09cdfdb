// Random sequences of block-table operations against a model kept by the test: reference counts,
// the eviction order of cached blocks, the KV events, and the KV data each sequence wrote.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int64_t kNumBlocks = 24;
constexpr size_t kMaxSequences = 8;
constexpr int64_t kMaxTokens = 40;

KvLayout TinyLayout() {
  return KvLayout{.num_blocks = kNumBlocks, .num_layers = 2, .block_size = kBlockSize,
                  .num_kv_heads = 1, .head_dim = 2};
}

// The float at element `i` of a token's K in `layer` for a position written with `marker`; V holds
// its negation. Exact in float for the markers a run uses.
float Encode(int64_t marker, int64_t layer, int64_t i) {
  return static_cast<float>(marker * 8 + layer * 2 + i + 1);
}

struct Sequence {
  BlockTable table;
  std::vector<int32_t> tokens;
  std::vector<int64_t> markers;  // per position: the marker written there (or inherited)
};

struct CachedEntry {
  int32_t block;
  BlockHash hash;
};

class RandomOps {
 public:
  RandomOps(uint32_t seed, int vocab) : rng_(seed), vocab_(vocab) {
    auto pool = BlockPool::Create(TinyLayout(), {.model_id = "random-ops"});
    CHECK_OK(pool.status());
    pool_ = std::move(*pool);
    pool_->set_event_listener([this](const KvEvent& e) { events_.push_back(e); });
    model_refs_.assign(kNumBlocks, 0);
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int r = Uniform(0, 99);
      const size_t events_before = events_.size();
      if (r < 14) {
        OpCreate();
      } else if (r < 42) {
        OpAppend();
      } else if (r < 50) {
        OpFork();
      } else if (r < 64) {
        OpCancel();
      } else if (r < 80) {
        OpRegister();
      } else if (r < 89) {
        OpPressure();
      } else if (r < 91) {
        OpFailingAllocate();
      } else if (r < 96) {
        OpMove();
      } else if (r < 97) {
        // Rare, so that the cache has time to fill between clears.
        if (Uniform(0, 3) == 0) {
          OpClearCache();
        } else {
          OpCachedPrefixLength();
        }
      } else {
        OpCachedPrefixLength();
      }
      CheckEvents(events_before);
      CheckInvariants();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "first failure at op " << op;
        return;
      }
    }
    // Drop everything: every block ends free or cached.
    while (!seqs_.empty()) Cancel(seqs_.size() - 1, 0);
    CheckInvariants();
    EXPECT_EQ(pool_->num_used(), 0);
  }

  struct Stats {
    int creates = 0, prefix_hits = 0, appends = 0, failed_appends = 0, copies = 0, forks = 0,
        cancels = 0, registers = 0, stored = 0, evictions = 0, clears = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  size_t Pick() { return static_cast<size_t>(Uniform(0, static_cast<int>(seqs_.size()) - 1)); }

  std::vector<int32_t> RandomTokens(int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(Uniform(0, vocab_ - 1));
    return t;
  }

  std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens) const {
    return HashFullBlocks(pool_->model_hash(), tokens, kBlockSize);
  }

  // --- Model updates -------------------------------------------------------------------------

  // `blocks` released in this order.
  void ModelRelease(const std::vector<int32_t>& blocks) {
    for (int32_t b : blocks) {
      int& refs = model_refs_[static_cast<size_t>(b)];
      EXPECT_GT(refs, 0) << "block " << b;
      --refs;
      if (refs == 0) {
        if (std::optional<BlockHash> h = pool_->hash_of(b)) lru_.push_back({b, *h});
      }
    }
  }

  // `blocks` were retained by AcquirePrefix.
  void ModelAcquire(const std::vector<int32_t>& blocks) {
    for (int32_t b : blocks) {
      int& refs = model_refs_[static_cast<size_t>(b)];
      if (refs == 0) {
        auto it = std::find_if(lru_.begin(), lru_.end(),
                               [b](const CachedEntry& e) { return e.block == b; });
        EXPECT_TRUE(it != lru_.end()) << "acquired block " << b << " was not cached";
        if (it != lru_.end()) lru_.erase(it);
      }
      ++refs;
    }
  }

  // `fresh` came from one Allocate, in its order, when `free_before` blocks were free: free blocks
  // first, then the least recently released cached ones, with one kRemoved event for those.
  void ModelAllocate(const std::vector<int32_t>& fresh, int64_t free_before,
                     size_t events_before) {
    const int64_t n = static_cast<int64_t>(fresh.size());
    const int64_t evicted = std::max<int64_t>(0, n - free_before);
    ASSERT_LE(evicted, static_cast<int64_t>(lru_.size()));
    std::vector<BlockHash> expect_removed;
    for (int64_t k = 0; k < n; ++k) {
      const int32_t b = fresh[static_cast<size_t>(k)];
      EXPECT_EQ(model_refs_[static_cast<size_t>(b)], 0) << "allocated a used block " << b;
      model_refs_[static_cast<size_t>(b)] = 1;
      if (k < n - evicted) {
        EXPECT_TRUE(std::none_of(lru_.begin(), lru_.end(),
                                 [b](const CachedEntry& e) { return e.block == b; }))
            << "evicted block " << b << " while free blocks remained";
      } else {
        const CachedEntry head = lru_.front();
        lru_.pop_front();
        EXPECT_EQ(b, head.block) << "eviction out of LRU order";
        expect_removed.push_back(head.hash);
        cache_content_.erase(head.hash);
      }
      EXPECT_EQ(pool_->hash_of(b), std::nullopt) << "allocated block " << b << " keeps a hash";
    }
    std::vector<const KvEvent*> removed;
    for (size_t e = events_before; e < events_.size(); ++e) {
      if (events_[e].kind == KvEvent::Kind::kRemoved) removed.push_back(&events_[e]);
    }
    if (evicted == 0) {
      EXPECT_TRUE(removed.empty()) << "kRemoved without eviction";
    } else {
      ++stats_.evictions;
      ASSERT_EQ(removed.size(), 1u) << "one kRemoved event per Allocate";
      EXPECT_EQ(removed[0]->hashes, expect_removed);
    }
  }

  // Writes marker values into positions [from, num_tokens) of `seq`.
  void WriteNewPositions(Sequence& seq, int64_t from) {
    const KvLayout& l = pool_->layout();
    for (int64_t pos = from; pos < seq.table.num_tokens(); ++pos) {
      const int64_t marker = next_marker_++;
      const int32_t block = seq.table.blocks()[static_cast<size_t>(pos / kBlockSize)];
      for (int64_t layer = 0; layer < l.num_layers; ++layer) {
        float* k = pool_->storage().KeyBlock(block, layer) + (pos % kBlockSize) * l.token_stride();
        for (int64_t i = 0; i < l.token_stride(); ++i) {
          k[i] = Encode(marker, layer, i);
          k[i + l.kv_stride()] = -Encode(marker, layer, i);
        }
      }
      seq.markers.push_back(marker);
    }
  }

  bool SlotHolds(int32_t block, int64_t slot, int64_t marker) const {
    const KvLayout& l = pool_->layout();
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      const float* k = pool_->storage().KeyBlock(block, layer) + slot * l.token_stride();
      for (int64_t i = 0; i < l.token_stride(); ++i) {
        if (k[i] != Encode(marker, layer, i) || k[i + l.kv_stride()] != -Encode(marker, layer, i)) {
          return false;
        }
      }
    }
    return true;
  }

  // --- Operations ------------------------------------------------------------------------------

  void OpCreate() {
    if (seqs_.size() >= kMaxSequences) return;
    ++stats_.creates;
    std::vector<int32_t> tokens;
    // Half of the requests start with a prefix of an earlier one, so prefixes repeat.
    if (!history_.empty() && Uniform(0, 1) == 0) {
      const std::vector<int32_t>& h = history_[static_cast<size_t>(
          Uniform(0, static_cast<int>(history_.size()) - 1))];
      tokens.assign(h.begin(), h.begin() + Uniform(0, static_cast<int>(h.size())));
    }
    const std::vector<int32_t> tail = RandomTokens(Uniform(tokens.empty() ? 1 : 0, 12));
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    if (static_cast<int64_t>(tokens.size()) > kMaxTokens) tokens.resize(kMaxTokens);

    Sequence seq{.table = BlockTable(pool_.get()), .tokens = {}, .markers = {}};
    if (Uniform(0, 1) == 0) {
      const std::vector<BlockHash> hashes = Hashes(tokens);
      int64_t expect = 0;
      while (expect < static_cast<int64_t>(hashes.size()) &&
             replayed_.contains(hashes[static_cast<size_t>(expect)])) {
        ++expect;
      }
      EXPECT_EQ(pool_->CachedPrefixLength(hashes), expect);
      std::vector<int32_t> hit = pool_->AcquirePrefix(hashes);
      EXPECT_EQ(static_cast<int64_t>(hit.size()), expect);
      ModelAcquire(hit);
      for (size_t k = 0; k < hit.size(); ++k) {
        EXPECT_EQ(pool_->hash_of(hit[k]), hashes[k]);
        auto it = cache_content_.find(hashes[k]);
        EXPECT_TRUE(it != cache_content_.end()) << "no content recorded for a cached hash";
        if (it == cache_content_.end()) return;
        seq.markers.insert(seq.markers.end(), it->second.begin(), it->second.end());
      }
      if (!hit.empty()) ++stats_.prefix_hits;
      seq.table.AdoptCachedPrefix(std::move(hit));
      EXPECT_EQ(seq.table.num_tokens(), expect * kBlockSize);
      EXPECT_EQ(seq.table.num_registered(), expect);
    }
    seq.tokens.assign(tokens.begin(), tokens.begin() + seq.table.num_tokens());
    const int64_t rest = static_cast<int64_t>(tokens.size()) - seq.table.num_tokens();
    seqs_.push_back(std::move(seq));
    history_.push_back(tokens);
    if (history_.size() > 16) history_.pop_front();
    if (rest > 0 && !Append(seqs_.size() - 1, rest, &tokens)) {
      // Not admitted: the request is dropped again.
      Cancel(seqs_.size() - 1, 0);
    }
  }

  void OpAppend() {
    if (seqs_.empty()) return;
    const size_t i = Pick();
    const int n = Uniform(1, 6);
    if (seqs_[i].table.num_tokens() + n > kMaxTokens) return;
    std::vector<int32_t> tokens = seqs_[i].tokens;
    const std::vector<int32_t> more = RandomTokens(n);
    tokens.insert(tokens.end(), more.begin(), more.end());
    Append(i, n, &tokens);
  }

  // Appends `n` positions to sequence `i` whose tokens become `*tokens`; false when the pool is
  // out of blocks (then nothing changed).
  bool Append(size_t i, int64_t n, const std::vector<int32_t>* tokens) {
    Sequence& seq = seqs_[i];
    ++stats_.appends;
    const std::vector<int32_t> before(seq.table.blocks().begin(), seq.table.blocks().end());
    const int64_t tokens_before = seq.table.num_tokens();
    const int64_t registered_before = seq.table.num_registered();
    const int64_t free_before = pool_->num_free();
    const int64_t cached_before = pool_->num_cached();
    const size_t events_before = events_.size();
    const int64_t needed = seq.table.BlocksNeededFor(n);
    const bool copy = tokens_before % kBlockSize != 0 &&
                      model_refs_[static_cast<size_t>(before.back())] > 1;
    EXPECT_EQ(needed, (tokens_before + n + kBlockSize - 1) / kBlockSize -
                          static_cast<int64_t>(before.size()) + (copy ? 1 : 0));

    const absl::Status status = seq.table.AppendSlots(n);
    if (!status.ok()) {
      ++stats_.failed_appends;
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
      EXPECT_GT(needed, free_before + cached_before) << "failed although blocks were available";
      EXPECT_EQ(std::vector<int32_t>(seq.table.blocks().begin(), seq.table.blocks().end()),
                before);
      EXPECT_EQ(seq.table.num_tokens(), tokens_before);
      EXPECT_EQ(seq.table.num_registered(), registered_before);
      EXPECT_EQ(pool_->num_free(), free_before);
      EXPECT_EQ(pool_->num_cached(), cached_before);
      EXPECT_EQ(events_.size(), events_before);
      return false;
    }
    EXPECT_LE(needed, free_before + cached_before);
    const std::vector<int32_t> after(seq.table.blocks().begin(), seq.table.blocks().end());
    EXPECT_EQ(seq.table.num_tokens(), tokens_before + n);
    EXPECT_EQ(seq.table.num_registered(), registered_before);
    EXPECT_EQ(static_cast<int64_t>(after.size()), (tokens_before + n + kBlockSize - 1) / kBlockSize);
    // Blocks before the last never change; the last changes exactly when it was copied.
    std::vector<int32_t> fresh;
    for (size_t k = 0; k < before.size(); ++k) {
      if (k + 1 < before.size() || !copy) {
        EXPECT_EQ(after[k], before[k]) << "block " << k << " changed";
      } else {
        EXPECT_NE(after[k], before[k]) << "shared partial block written in place";
        fresh.push_back(after[k]);
      }
    }
    for (size_t k = before.size(); k < after.size(); ++k) fresh.push_back(after[k]);
    EXPECT_EQ(static_cast<int64_t>(fresh.size()), needed);
    ModelAllocate(fresh, free_before, events_before);
    if (copy) {
      ++stats_.copies;
      ModelRelease({before.back()});
    }
    seq.tokens = *tokens;
    WriteNewPositions(seq, tokens_before);
    return true;
  }

  void OpFork() {
    if (seqs_.empty() || seqs_.size() >= kMaxSequences) return;
    ++stats_.forks;
    const size_t i = Pick();
    Sequence fork{.table = seqs_[i].table.Fork(), .tokens = seqs_[i].tokens,
                  .markers = seqs_[i].markers};
    for (int32_t b : fork.table.blocks()) ++model_refs_[static_cast<size_t>(b)];
    EXPECT_EQ(fork.table.num_tokens(), seqs_[i].table.num_tokens());
    EXPECT_EQ(fork.table.num_registered(), seqs_[i].table.num_registered());
    seqs_.push_back(std::move(fork));
  }

  void OpCancel() {
    if (seqs_.empty()) return;
    Cancel(Pick(), Uniform(0, 2));
  }

  // Drops sequence `i`: by its destructor (how 0), by Release (1), or by assigning an empty table
  // over it (2).
  void Cancel(size_t i, int how) {
    ++stats_.cancels;
    std::vector<int32_t> order(seqs_[i].table.blocks().rbegin(), seqs_[i].table.blocks().rend());
    ModelRelease(order);  // last block first
    if (how == 1) {
      seqs_[i].table.Release();
      EXPECT_TRUE(seqs_[i].table.blocks().empty());
      EXPECT_EQ(seqs_[i].table.num_tokens(), 0);
    } else if (how == 2) {
      seqs_[i].table = BlockTable(pool_.get());
    }
    seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void OpRegister() {
    if (seqs_.empty()) return;
    ++stats_.registers;
    Sequence& seq = seqs_[Pick()];
    std::vector<BlockHash> hashes = Hashes(seq.tokens);
    if (Uniform(0, 3) == 0) hashes.resize(static_cast<size_t>(Uniform(0, static_cast<int>(hashes.size()))));
    const std::vector<int32_t> blocks(seq.table.blocks().begin(), seq.table.blocks().end());
    std::vector<std::optional<BlockHash>> had;
    for (int32_t b : blocks) had.push_back(pool_->hash_of(b));
    const int64_t registered_before = seq.table.num_registered();
    const size_t events_before = events_.size();

    seq.table.RegisterFullBlocks(hashes);

    const int64_t full = std::min<int64_t>(seq.table.num_tokens() / kBlockSize,
                                           static_cast<int64_t>(hashes.size()));
    EXPECT_EQ(seq.table.num_registered(), std::max(registered_before, full));
    int64_t newly = 0;
    for (size_t k = 0; k < blocks.size(); ++k) {
      const std::optional<BlockHash> now = pool_->hash_of(blocks[k]);
      if (had[k].has_value()) {
        EXPECT_EQ(now, had[k]) << "a block changed its hash";
        continue;
      }
      if (!now.has_value()) continue;
      // Newly stored: only blocks in the range the table had not registered, with their own hash.
      EXPECT_GE(static_cast<int64_t>(k), registered_before);
      EXPECT_LT(static_cast<int64_t>(k), full);
      EXPECT_EQ(*now, hashes[k]);
      ++newly;
      cache_content_[*now] = std::vector<int64_t>(
          seq.markers.begin() + static_cast<std::ptrdiff_t>(k) * kBlockSize,
          seq.markers.begin() + static_cast<std::ptrdiff_t>(k + 1) * kBlockSize);
    }
    stats_.stored += static_cast<int>(newly);
    // Each kStored event is a consecutive run of this sequence's chain, with its true parent.
    int64_t in_events = 0;
    for (size_t e = events_before; e < events_.size(); ++e) {
      const KvEvent& ev = events_[e];
      EXPECT_EQ(ev.kind, KvEvent::Kind::kStored);
      if (ev.hashes.empty()) {
        ADD_FAILURE() << "empty kStored event";
        continue;
      }
      in_events += static_cast<int64_t>(ev.hashes.size());
      auto it = std::find(hashes.begin(), hashes.end(), ev.hashes[0]);
      if (it == hashes.end()) {
        ADD_FAILURE() << "stored a hash that is not the sequence's";
        continue;
      }
      const size_t j = static_cast<size_t>(it - hashes.begin());
      EXPECT_EQ(ev.parent, j == 0 ? std::nullopt : std::optional<BlockHash>(hashes[j - 1]));
      ASSERT_LE(j + ev.hashes.size(), hashes.size());
      EXPECT_TRUE(std::equal(ev.hashes.begin(), ev.hashes.end(), hashes.begin() + j));
    }
    EXPECT_EQ(in_events, newly);
  }

  // A burst of demand from elsewhere: takes blocks (evicting if needed) and gives them back.
  void OpPressure() {
    const int64_t available = pool_->num_available();
    if (available == 0) return;
    const int64_t n = Uniform(1, static_cast<int>(std::min<int64_t>(available, 10)));
    const int64_t free_before = pool_->num_free();
    const size_t events_before = events_.size();
    absl::StatusOr<std::vector<int32_t>> blocks = pool_->Allocate(n);
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    ASSERT_EQ(static_cast<int64_t>(blocks->size()), n);
    ModelAllocate(*blocks, free_before, events_before);
    pool_->Release(*blocks);
    ModelRelease(*blocks);
  }

  void OpFailingAllocate() {
    const int64_t free_before = pool_->num_free();
    const int64_t cached_before = pool_->num_cached();
    const size_t events_before = events_.size();
    absl::StatusOr<std::vector<int32_t>> blocks =
        pool_->Allocate(pool_->num_available() + Uniform(1, 3));
    EXPECT_EQ(blocks.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(pool_->num_free(), free_before);
    EXPECT_EQ(pool_->num_cached(), cached_before);
    EXPECT_EQ(events_.size(), events_before);
  }

  // Moves a sequence (its table by move construction) to the end.
  void OpMove() {
    if (seqs_.size() < 2) return;
    const size_t i = Pick();
    Sequence moved = std::move(seqs_[i]);
    EXPECT_TRUE(seqs_[i].table.blocks().empty());  // NOLINT(bugprone-use-after-move)
    seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
    seqs_.push_back(std::move(moved));
  }

  void OpClearCache() {
    ++stats_.clears;
    const size_t events_before = events_.size();
    pool_->ClearCache();
    ASSERT_EQ(events_.size(), events_before + 1);
    EXPECT_EQ(events_.back().kind, KvEvent::Kind::kCleared);
    lru_.clear();
    cache_content_.clear();
    EXPECT_EQ(pool_->num_cached(), 0);
  }

  void OpCachedPrefixLength() {
    if (history_.empty()) return;
    const std::vector<BlockHash> hashes = Hashes(history_.back());
    int64_t expect = 0;
    while (expect < static_cast<int64_t>(hashes.size()) &&
           replayed_.contains(hashes[static_cast<size_t>(expect)])) {
      ++expect;
    }
    const int64_t cached = pool_->num_cached();
    EXPECT_EQ(pool_->CachedPrefixLength(hashes), expect);
    EXPECT_EQ(pool_->num_cached(), cached);
  }

  // --- Checks ----------------------------------------------------------------------------------

  void CheckEvents(size_t from) {
    for (size_t e = from; e < events_.size(); ++e) {
      const KvEvent& ev = events_[e];
      EXPECT_EQ(ev.event_id, ++last_event_id_) << "event ids must grow by exactly 1";
      switch (ev.kind) {
        case KvEvent::Kind::kStored:
          for (BlockHash h : ev.hashes) EXPECT_TRUE(replayed_.insert(h).second) << "stored twice";
          break;
        case KvEvent::Kind::kRemoved:
          EXPECT_FALSE(ev.hashes.empty());
          for (BlockHash h : ev.hashes) EXPECT_EQ(replayed_.erase(h), 1u) << "removed unknown";
          break;
        case KvEvent::Kind::kCleared:
          EXPECT_TRUE(ev.hashes.empty());
          replayed_.clear();
          break;
      }
    }
    EXPECT_EQ(pool_->last_event_id(), last_event_id_);
  }

  void CheckInvariants() {
    pool_->CheckInvariants();
    const KvCacheSnapshot snapshot = pool_->Snapshot();
    EXPECT_EQ(snapshot.last_event_id, last_event_id_);
    EXPECT_EQ(snapshot.hashes, std::vector<BlockHash>(replayed_.begin(), replayed_.end()));
    EXPECT_EQ(pool_->num_free() + pool_->num_cached() + pool_->num_used(), kNumBlocks);

    // Exact reference counts: one per table holding the block.
    std::vector<int> holders(kNumBlocks, 0);
    // For each block: the (sequence, index) pairs that hold it.
    std::vector<std::vector<std::pair<size_t, size_t>>> where(kNumBlocks);
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const Sequence& seq = seqs_[s];
      const int64_t n = seq.table.num_tokens();
      EXPECT_EQ(static_cast<int64_t>(seq.tokens.size()), n);
      EXPECT_EQ(static_cast<int64_t>(seq.markers.size()), n);
      EXPECT_EQ(static_cast<int64_t>(seq.table.blocks().size()), (n + kBlockSize - 1) / kBlockSize);
      EXPECT_LE(seq.table.num_registered(), n / kBlockSize);
      std::set<int32_t> own;
      for (size_t k = 0; k < seq.table.blocks().size(); ++k) {
        const int32_t b = seq.table.blocks()[k];
        EXPECT_TRUE(own.insert(b).second) << "a table holds block " << b << " twice";
        ++holders[static_cast<size_t>(b)];
        where[static_cast<size_t>(b)].push_back({s, k});
      }
      if (n % kBlockSize != 0) {
        EXPECT_EQ(pool_->hash_of(seq.table.blocks().back()), std::nullopt)
            << "a partial block has a hash";
      }
    }
    int64_t used = 0;
    for (int32_t b = 0; b < kNumBlocks; ++b) {
      const size_t i = static_cast<size_t>(b);
      EXPECT_EQ(pool_->ref_count(b), holders[i]) << "block " << b;
      EXPECT_EQ(model_refs_[i], holders[i]) << "block " << b;
      if (holders[i] > 0) ++used;
      // A shared block is full in every holder, or the partial last block of forks that have not
      // written since they forked (all at the same length).
      if (holders[i] > 1) {
        const auto [s0, k0] = where[i][0];
        for (const auto& [s, k] : where[i]) {
          const Sequence& seq = seqs_[s];
          const int64_t end = static_cast<int64_t>(k + 1) * kBlockSize;
          if (end <= seq.table.num_tokens()) continue;
          EXPECT_EQ(k + 1, seq.table.blocks().size()) << "partial shared block not last";
          EXPECT_EQ(k, k0);
          EXPECT_EQ(seq.table.num_tokens(), seqs_[s0].table.num_tokens())
              << "a partial shared block was written by one of its holders";
        }
      }
      // A hashed block holds what was written when its hash was stored.
      if (std::optional<BlockHash> h = pool_->hash_of(b)) {
        EXPECT_TRUE(replayed_.contains(*h));
        auto it = cache_content_.find(*h);
        if (it == cache_content_.end()) {
          ADD_FAILURE() << "block " << b << " holds a hash the test never saw stored";
        } else {
          for (int64_t slot = 0; slot < kBlockSize; ++slot) {
            EXPECT_TRUE(SlotHolds(b, slot, it->second[static_cast<size_t>(slot)]))
                << "cached block " << b << " slot " << slot << " was overwritten";
          }
        }
      }
    }
    EXPECT_EQ(pool_->num_used(), used);

    // The cached blocks, in the model's eviction order.
    EXPECT_EQ(static_cast<int64_t>(lru_.size()), pool_->num_cached());
    for (const CachedEntry& e : lru_) {
      EXPECT_EQ(pool_->ref_count(e.block), 0);
      EXPECT_EQ(pool_->hash_of(e.block), e.hash);
    }

    // Every sequence reads back what it wrote (or inherited).
    for (const Sequence& seq : seqs_) {
      for (int64_t pos = 0; pos < seq.table.num_tokens(); ++pos) {
        const int32_t b = seq.table.blocks()[static_cast<size_t>(pos / kBlockSize)];
        EXPECT_TRUE(SlotHolds(b, pos % kBlockSize, seq.markers[static_cast<size_t>(pos)]))
            << "position " << pos << " in block " << b << " lost its data";
      }
    }
  }

  std::mt19937 rng_;
  int vocab_;
  std::unique_ptr<BlockPool> pool_;
  std::vector<KvEvent> events_;
  std::vector<Sequence> seqs_;
  std::deque<std::vector<int32_t>> history_;
  std::vector<int> model_refs_;
  std::deque<CachedEntry> lru_;  // least recently released first
  std::map<BlockHash, std::vector<int64_t>> cache_content_;  // hash -> markers of its slots
  std::set<BlockHash> replayed_;
  uint64_t last_event_id_ = 0;
  int64_t next_marker_ = 1;
  Stats stats_;
};

TEST(KvRandomOpsTest, InvariantsHoldUnderRandomOperations) {
  RandomOps::Stats total;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomOps ops(seed, /*vocab=*/seed % 2 == 0 ? 2 : 3);
    ops.Run(2000);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const RandomOps::Stats& s = ops.stats();
    total.creates += s.creates;
    total.prefix_hits += s.prefix_hits;
    total.appends += s.appends;
    total.failed_appends += s.failed_appends;
    total.copies += s.copies;
    total.forks += s.forks;
    total.cancels += s.cancels;
    total.registers += s.registers;
    total.stored += s.stored;
    total.evictions += s.evictions;
    total.clears += s.clears;
  }
  // The run exercised every path it is meant to.
  EXPECT_GT(total.prefix_hits, 100);
  EXPECT_GT(total.failed_appends, 50);
  EXPECT_GT(total.copies, 100);
  EXPECT_GT(total.evictions, 100);
  EXPECT_GT(total.stored, 100);
  EXPECT_GT(total.clears, 5);
  std::printf("creates=%d prefix_hits=%d appends=%d failed=%d copies=%d forks=%d cancels=%d "
              "registers=%d stored=%d evictions=%d clears=%d\n",
              total.creates, total.prefix_hits, total.appends, total.failed_appends, total.copies,
              total.forks, total.cancels, total.registers, total.stored, total.evictions,
              total.clears);
}

}  // namespace
}  // namespace tandem
