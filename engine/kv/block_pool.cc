#include "engine/kv/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             const Options& options) {
  if (layout.num_blocks > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV pool holds at most 2^31-1 blocks, not ", layout.num_blocks));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage, KvStorage::Create(layout, options.allocator));
  return std::unique_ptr<BlockPool>(new BlockPool(std::move(storage), options));
}

BlockPool::BlockPool(std::unique_ptr<KvStorage> storage, const Options& options)
    : storage_(std::move(storage)), options_(options), model_hash_(ModelIdHash(options.model_id)) {
  const size_t n = static_cast<size_t>(storage_->layout().num_blocks);
  refs_.assign(n, 0);
  hashes_.assign(n, std::nullopt);
  lru_prev_.assign(n, -1);
  lru_next_.assign(n, -1);
  free_.reserve(n);
  // Block 0 on top of the stack: a fresh pool hands out blocks in address order.
  for (size_t b = n; b-- > 0;) free_.push_back(static_cast<int32_t>(b));
}

size_t BlockPool::Index(int32_t block) const {
  CHECK(block >= 0 && block < num_blocks()) << "block " << block << " outside the pool of "
                                            << num_blocks();
  return static_cast<size_t>(block);
}

std::optional<BlockHash> BlockPool::hash_of(int32_t block) const { return hashes_[Index(block)]; }

void BlockPool::Emit(KvEvent event) {
  event.event_id = ++last_event_id_;
  if (listener_) listener_(event);
}

void BlockPool::LruPushBack(int32_t block) {
  const size_t i = Index(block);
  lru_prev_[i] = lru_tail_;
  lru_next_[i] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[static_cast<size_t>(lru_tail_)] = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++num_cached_;
}

void BlockPool::LruUnlink(int32_t block) {
  const size_t i = Index(block);
  const int32_t prev = lru_prev_[i];
  const int32_t next = lru_next_[i];
  if (prev >= 0) {
    lru_next_[static_cast<size_t>(prev)] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[static_cast<size_t>(next)] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[i] = lru_next_[i] = -1;
  --num_cached_;
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  if (n < 0 || n > num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat("need ", n, " KV blocks; ", num_free(),
                                                     " are free and ", num_cached(),
                                                     " cached (evictable)"));
  }
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(n));
  KvEvent removed{.kind = KvEvent::Kind::kRemoved};
  while (static_cast<int64_t>(blocks.size()) < n) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_head_;
      LruUnlink(b);
      const size_t i = static_cast<size_t>(b);
      index_.erase(*hashes_[i]);
      removed.hashes.push_back(*hashes_[i]);
      hashes_[i].reset();
    }
    refs_[static_cast<size_t>(b)] = 1;
    blocks.push_back(b);
  }
  if (!removed.hashes.empty()) Emit(std::move(removed));
  return blocks;
}

void BlockPool::Retain(int32_t block) {
  const size_t i = Index(block);
  CHECK(refs_[i] > 0) << "retaining block " << block << " that no sequence holds";
  ++refs_[i];
}

void BlockPool::Release(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    const size_t i = Index(b);
    CHECK(refs_[i] > 0) << "releasing block " << b << " that no sequence holds";
    if (--refs_[i] > 0) continue;
    if (hashes_[i].has_value()) {
      LruPushBack(b);
    } else {
      free_.push_back(b);
    }
  }
}

int64_t BlockPool::Register(absl::Span<const int32_t> blocks, absl::Span<const BlockHash> hashes,
                            std::optional<BlockHash> parent) {
  CHECK(blocks.size() == hashes.size());
  int64_t stored = 0;
  KvEvent run{.kind = KvEvent::Kind::kStored, .parent = parent};
  auto flush = [&] {
    if (!run.hashes.empty()) Emit(std::move(run));
    run = KvEvent{.kind = KvEvent::Kind::kStored};
  };
  for (size_t k = 0; k < blocks.size(); ++k) {
    const size_t i = Index(blocks[k]);
    CHECK(refs_[i] > 0) << "registering block " << blocks[k] << " that no sequence holds";
    const bool fresh = options_.enable_prefix_caching && !hashes_[i].has_value() &&
                       index_.try_emplace(hashes[k], blocks[k]).second;
    if (!fresh) {
      flush();
      run.parent = hashes[k];  // the next stored hash, if any, follows this one
      continue;
    }
    hashes_[i] = hashes[k];
    run.hashes.push_back(hashes[k]);
    ++stored;
  }
  flush();
  return stored;
}

int64_t BlockPool::CachedPrefixLength(absl::Span<const BlockHash> hashes) const {
  int64_t n = 0;
  for (BlockHash h : hashes) {
    if (!index_.contains(h)) break;
    ++n;
  }
  return n;
}

std::vector<int32_t> BlockPool::AcquirePrefix(absl::Span<const BlockHash> hashes) {
  std::vector<int32_t> blocks;
  for (BlockHash h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    const int32_t b = it->second;
    const size_t i = static_cast<size_t>(b);
    if (refs_[i] == 0) LruUnlink(b);
    ++refs_[i];
    blocks.push_back(b);
  }
  return blocks;
}

void BlockPool::ClearCache() {
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    LruUnlink(b);
    free_.push_back(b);
  }
  for (auto& h : hashes_) h.reset();
  index_.clear();
  Emit(KvEvent{.kind = KvEvent::Kind::kCleared});
}

KvCacheSnapshot BlockPool::Snapshot() const {
  KvCacheSnapshot snapshot{.last_event_id = last_event_id_};
  snapshot.hashes.reserve(index_.size());
  for (const auto& [hash, block] : index_) snapshot.hashes.push_back(hash);
  std::sort(snapshot.hashes.begin(), snapshot.hashes.end());
  return snapshot;
}

void BlockPool::CheckInvariants() const {
  const size_t n = refs_.size();
  std::vector<char> on_free(n, 0), on_lru(n, 0);
  for (int32_t b : free_) {
    const size_t i = Index(b);
    CHECK(!on_free[i]) << "block " << b << " is twice on the free list";
    on_free[i] = 1;
  }
  int64_t lru_len = 0;
  for (int32_t b = lru_head_, prev = -1; b >= 0; prev = b, b = lru_next_[static_cast<size_t>(b)]) {
    const size_t i = Index(b);
    CHECK(lru_prev_[i] == prev) << "broken cached list at block " << b;
    CHECK(!on_lru[i]) << "block " << b << " is twice on the cached list";
    on_lru[i] = 1;
    ++lru_len;
  }
  CHECK(lru_len == num_cached_);
  int64_t hashed = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = static_cast<int32_t>(i);
    CHECK(refs_[i] >= 0);
    if (refs_[i] > 0) {
      CHECK(!on_free[i] && !on_lru[i]) << "used block " << b << " is on a free list";
    } else if (hashes_[i].has_value()) {
      CHECK(on_lru[i] && !on_free[i]) << "cached block " << b << " is not on the cached list";
    } else {
      CHECK(on_free[i] && !on_lru[i]) << "free block " << b << " is not on the free list";
    }
    if (hashes_[i].has_value()) {
      ++hashed;
      auto it = index_.find(*hashes_[i]);
      CHECK(it != index_.end() && it->second == b) << "block " << b << " is missing from the index";
    }
  }
  CHECK(hashed == static_cast<int64_t>(index_.size()));
  CHECK(num_free() + num_cached() + num_used() == num_blocks());
}

}  // namespace tandem
