#include "engine/kv/block_table.h"

#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"

namespace tandem {

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_),
      blocks_(std::move(other.blocks_)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      num_registered_(std::exchange(other.num_registered_, 0)),
      forked_(std::exchange(other.forked_, false)) {
  other.blocks_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = other.pool_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    num_registered_ = std::exchange(other.num_registered_, 0);
    forked_ = std::exchange(other.forked_, false);
  }
  return *this;
}

void BlockTable::AdoptCachedPrefix(std::vector<int32_t> blocks) {
  CHECK(blocks_.empty()) << "a cached prefix can only start a table";
  blocks_ = std::move(blocks);
  num_tokens_ = capacity();
  num_registered_ = static_cast<int64_t>(blocks_.size());
}

bool BlockTable::LastMayBeShared() const {
  return forked_ && num_tokens_ % pool_->block_size() != 0 && pool_->ref_count(blocks_.back()) > 1;
}

int64_t BlockTable::BlocksNeededFor(int64_t n) const {
  const int64_t bs = pool_->block_size();
  const int64_t have = static_cast<int64_t>(blocks_.size());
  const int64_t want = (num_tokens_ + n + bs - 1) / bs;
  int64_t needed = std::max<int64_t>(0, want - have);
  // The last block is written into when it has free slots; a shared one is copied first.
  if (n > 0 && LastMayBeShared()) ++needed;
  return needed;
}

absl::Status BlockTable::AppendSlots(int64_t n) {
  CHECK(n >= 0);
  const int64_t needed = BlocksNeededFor(n);
  ASSIGN_OR_RETURN(std::vector<int32_t> fresh, pool_->Allocate(needed));
  size_t next = 0;
  if (n > 0 && LastMayBeShared()) {
    const int32_t shared = blocks_.back();
    const int32_t copy = fresh[next++];
    pool_->storage().CopyBlock(shared, copy);
    pool_->Release({shared});
    blocks_.back() = copy;
  }
  while (next < fresh.size()) blocks_.push_back(fresh[next++]);
  num_tokens_ += n;
  return absl::OkStatus();
}

BlockTable BlockTable::Fork() const {
  BlockTable fork(pool_);
  for (int32_t b : blocks_) pool_->Retain(b);
  fork.blocks_ = blocks_;
  fork.num_tokens_ = num_tokens_;
  fork.num_registered_ = num_registered_;
  fork.forked_ = forked_ = true;
  return fork;
}

void BlockTable::RegisterFullBlocks(absl::Span<const BlockHash> hashes) {
  const int64_t full = std::min<int64_t>(num_tokens_ / pool_->block_size(),
                                         static_cast<int64_t>(hashes.size()));
  if (full <= num_registered_) return;
  const size_t from = static_cast<size_t>(num_registered_);
  const size_t count = static_cast<size_t>(full - num_registered_);
  std::optional<BlockHash> parent;
  if (from > 0) parent = hashes[from - 1];
  pool_->Register(absl::MakeConstSpan(blocks_).subspan(from, count), hashes.subspan(from, count),
                  parent);
  num_registered_ = full;
}

void BlockTable::Release() {
  if (pool_ != nullptr && !blocks_.empty()) {
    std::vector<int32_t> reversed(blocks_.rbegin(), blocks_.rend());
    pool_->Release(reversed);
  }
  blocks_.clear();
  num_tokens_ = 0;
  num_registered_ = 0;
  forked_ = false;
}

}  // namespace tandem
