// The blocks of one sequence, in position order: position p lives in slot p % block_size of
// blocks()[p / block_size]. A table grows a block at a time as tokens are appended, can share its
// blocks with a fork (copy-on-write: a shared block is copied before anything is written into it),
// and registers its full blocks in the pool's prefix cache.
//
//   BlockTable table(pool);
//   table.AdoptCachedPrefix(pool->AcquirePrefix(hashes));  // reuse what the cache holds
//   RETURN_IF_ERROR(table.AppendSlots(n));  // positions num_tokens() .. +n-1 are now writable
//   ... the forward step writes K/V there ...
//   table.RegisterFullBlocks(hashes);       // full blocks become reusable by later requests
//
// Releases its blocks when destroyed. Not thread-safe.
#ifndef TANDEM_ENGINE_KV_BLOCK_TABLE_H_
#define TANDEM_ENGINE_KV_BLOCK_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_pool.h"

namespace tandem {

class BlockTable {
 public:
  explicit BlockTable(BlockPool* pool) : pool_(pool) {}
  ~BlockTable() { Release(); }
  BlockTable(BlockTable&& other) noexcept;
  BlockTable& operator=(BlockTable&& other) noexcept;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  absl::Span<const int32_t> blocks() const { return blocks_; }
  // Positions 0 .. num_tokens()-1 have slots.
  int64_t num_tokens() const { return num_tokens_; }
  // Slots the blocks hold, filled or not.
  int64_t capacity() const { return static_cast<int64_t>(blocks_.size()) * pool_->block_size(); }
  // Leading blocks registered in (or taken from) the prefix cache.
  int64_t num_registered() const { return num_registered_; }

  // For an empty table: takes blocks (already retained, e.g. from BlockPool::AcquirePrefix) that
  // hold the sequence's first blocks, full.
  void AdoptCachedPrefix(std::vector<int32_t> blocks);

  // Blocks AppendSlots(n) would allocate (copies of shared blocks included).
  int64_t BlocksNeededFor(int64_t n) const;
  // Makes positions num_tokens() .. num_tokens()+n-1 writable by this sequence alone: copies a
  // shared partly filled last block, then allocates blocks as needed. RESOURCE_EXHAUSTED, with the
  // table unchanged, when the pool has too few blocks.
  absl::Status AppendSlots(int64_t n);

  // A new table sharing every block (each retained once more). Writing into a shared block copies
  // it first, so the two sequences may diverge.
  BlockTable Fork() const;

  // Registers the table's full blocks that hashes[] covers and that are not registered yet
  // (hashes[k] is the hash of block k). Only blocks whose slots are all filled are registered.
  void RegisterFullBlocks(absl::Span<const BlockHash> hashes);

  // Returns every block to the pool, last first (so a cached prefix outlives its tail), and
  // empties the table.
  void Release();

 private:
  // Whether the last block may be partly filled and shared: only a Fork shares one (the prefix
  // cache shares full blocks only), so a table never forked skips the pool's reference count.
  bool LastMayBeShared() const;

  BlockPool* pool_;
  std::vector<int32_t> blocks_;
  int64_t num_tokens_ = 0;
  int64_t num_registered_ = 0;
  // This table was made by Fork or forked since its last Release (mutable: Fork is const).
  mutable bool forked_ = false;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_TABLE_H_
