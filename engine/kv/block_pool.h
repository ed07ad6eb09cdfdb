// The block allocator of a worker's KV memory: reference counts, a free list, and the prefix
// cache (which full block holds which block hash), with the KV events that describe the cache.
//
// Every block is in exactly one of three states:
//   used    referenced by at least one sequence (it may also be cached);
//   cached  unreferenced but holding a hashed full block, so a later request can reuse it; these
//           are evicted least recently released first when free blocks run out;
//   free    unreferenced and without a hash.
// so free + cached + used = total, always.
//
//   ASSIGN_OR_RETURN(auto pool, BlockPool::Create(layout, {.model_id = "SmolLM2-135M-Instruct"}));
//   ASSIGN_OR_RETURN(std::vector<int32_t> blocks, pool->Allocate(4));
//   pool->Register({blocks[0]}, {hash0}, std::nullopt);  // a full block: reusable from now on
//   pool->Release(blocks);                               // block 0 stays cached, the rest free
//   std::vector<int32_t> hit = pool->AcquirePrefix({hash0, hash1});  // {blocks[0]}, retained
//
// Not thread-safe: one engine thread owns it.
#ifndef TANDEM_ENGINE_KV_BLOCK_POOL_H_
#define TANDEM_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_storage.h"

namespace tandem {

// A change of the prefix cache (DESIGN.md §4; proto tandem.v1.KvEvent). `event_id` starts at 1 and
// grows by exactly 1 per event of one pool.
struct KvEvent {
  enum class Kind { kStored, kRemoved, kCleared };
  uint64_t event_id = 0;
  Kind kind = Kind::kStored;
  // kStored: the block before hashes[0] in its sequence; nullopt for a sequence's first block.
  std::optional<BlockHash> parent = std::nullopt;
  // kStored: new cached hashes in sequence order, each chained on the one before. kRemoved: hashes
  // no longer cached. kCleared: empty.
  std::vector<BlockHash> hashes = {};
};

// Every hash the cache holds, consistent with the events up to last_event_id.
struct KvCacheSnapshot {
  uint64_t last_event_id = 0;
  std::vector<BlockHash> hashes = {};  // sorted
};

class BlockPool {
 public:
  struct Options {
    // Input of every block hash (block_hash.h).
    std::string model_id;
    // When false, nothing is ever cached: Register does nothing and AcquirePrefix finds nothing.
    bool enable_prefix_caching = true;
    // Where the pool's memory comes from (default: the heap).
    KvAllocator allocator = {};
  };

  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           const Options& options);

  KvStorage& storage() { return *storage_; }
  const KvLayout& layout() const { return storage_->layout(); }
  int64_t block_size() const { return layout().block_size; }
  uint64_t model_hash() const { return model_hash_; }
  bool prefix_caching() const { return options_.enable_prefix_caching; }

  int64_t num_blocks() const { return layout().num_blocks; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_cached() const { return num_cached_; }  // unreferenced, reusable
  int64_t num_used() const { return num_blocks() - num_free() - num_cached(); }
  // Blocks an Allocate can take now: free ones, then cached ones by eviction.
  int64_t num_available() const { return num_free() + num_cached(); }

  // Takes `n` blocks with reference count 1: free blocks first, then the least recently released
  // cached blocks (evicting them from the cache, one kRemoved event). RESOURCE_EXHAUSTED, with
  // nothing taken, when fewer than `n` are available.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);

  // One more reference to a used block (a fork shares it).
  void Retain(int32_t block);
  // Drops one reference from each block, in order. A block left unreferenced becomes cached if it
  // has a hash (most recently released, so evicted last), otherwise free. Sequences release their
  // blocks last first, so a prefix outlives its tails.
  void Release(absl::Span<const int32_t> blocks);

  // Marks used full blocks as holding `hashes` (blocks[k] holds hashes[k]; the hashes are
  // consecutive in one sequence, and `parent` is the one before hashes[0], nullopt for a
  // sequence's first block). A block keeps the first hash it gets, and a hash already cached in
  // another block is skipped; nothing is stored when prefix caching is off. Emits one kStored
  // event per run of newly stored hashes. Returns how many were stored.
  int64_t Register(absl::Span<const int32_t> blocks, absl::Span<const BlockHash> hashes,
                   std::optional<BlockHash> parent);

  // The blocks of the longest cached prefix of the chain `hashes`, each retained once (a cached
  // block becomes used). Empty when hashes[0] is not cached.
  std::vector<int32_t> AcquirePrefix(absl::Span<const BlockHash> hashes);
  // How many leading blocks of `hashes` are cached, without taking them.
  int64_t CachedPrefixLength(absl::Span<const BlockHash> hashes) const;

  // Forgets every hash (one kCleared event); cached blocks become free.
  void ClearCache();

  // Receives every event as it happens (with none set, events are numbered and dropped).
  void set_event_listener(std::function<void(const KvEvent&)> listener) {
    listener_ = std::move(listener);
  }
  uint64_t last_event_id() const { return last_event_id_; }
  KvCacheSnapshot Snapshot() const;

  // For tests and invariant checks.
  int32_t ref_count(int32_t block) const { return refs_[Index(block)]; }
  std::optional<BlockHash> hash_of(int32_t block) const;
  // CHECK-fails when the bookkeeping is inconsistent (counts, lists, index).
  void CheckInvariants() const;

 private:
  BlockPool(std::unique_ptr<KvStorage> storage, const Options& options);
  size_t Index(int32_t block) const;
  void Emit(KvEvent event);
  // The cached (unreferenced, hashed) blocks form a doubly linked list, least recently released
  // at the head.
  void LruPushBack(int32_t block);
  void LruUnlink(int32_t block);

  std::unique_ptr<KvStorage> storage_;
  Options options_;
  uint64_t model_hash_;
  std::vector<int32_t> refs_;
  std::vector<std::optional<BlockHash>> hashes_;
  std::vector<int32_t> free_;  // a stack
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int64_t num_cached_ = 0;
  absl::flat_hash_map<BlockHash, int32_t> index_;  // hash -> the block that holds it
  uint64_t last_event_id_ = 0;
  std::function<void(const KvEvent&)> listener_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_POOL_H_
