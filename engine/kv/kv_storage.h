// The KV memory of one worker: one region, allocated once, cut into blocks of `block_size` tokens
// that hold K and V for every layer. Block ids index this region; a per-sequence block table maps
// a sequence's positions onto blocks (position p lives in slot p % block_size of block
// table[p / block_size]).
//
// Layout (floats, row-major), the contract for the attention kernels and for transfers:
//
//   [num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]
//
// so one block's slice for one layer (K then V) is contiguous, and so is the whole block across
// layers. docs/kv_layout.md carries the full contract. This file is only the memory; BlockPool
// (block_pool.h) decides which block belongs to whom.
#ifndef TANDEM_ENGINE_KV_KV_STORAGE_H_
#define TANDEM_ENGINE_KV_KV_STORAGE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"

namespace tandem {

struct KvLayout {
  int64_t num_blocks = 0;
  int64_t num_layers = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  // Strides in floats.
  int64_t token_stride() const { return num_kv_heads * head_dim; }
  int64_t kv_head_stride() const { return head_dim; }
  int64_t kv_stride() const { return block_size * token_stride(); }  // K -> V of one layer
  int64_t layer_stride() const { return 2 * kv_stride(); }
  int64_t block_stride() const { return num_layers * layer_stride(); }
  int64_t total_floats() const { return num_blocks * block_stride(); }

  // INVALID_ARGUMENT when a size is not positive or the pool would exceed 2^40 floats.
  absl::Status Validate() const;
};

// Where a pool's memory comes from when not from the heap: e.g. a transport that exposes memory it
// allocated itself best (UCX: shared memory that a peer on the host maps, so a remote write is a
// single copy). `allocate` returns at least `bytes` bytes aligned to 64, UNIMPLEMENTED to have the
// pool on the heap after all, or another error; `release` gets the same pointer back.
struct KvAllocator {
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void*)> release;
};

// Owns the KV region. Not thread-safe: one engine thread owns it.
class KvStorage {
 public:
  // The region comes from `allocator` when it has an allocate function, else from the heap.
  static absl::StatusOr<std::unique_ptr<KvStorage>> Create(const KvLayout& layout,
                                                           const KvAllocator& allocator = {});

  const KvLayout& layout() const { return layout_; }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }

  // K of `layer` in `block`: [block_size][num_kv_heads][head_dim]; V follows at + kv_stride().
  float* KeyBlock(int64_t block, int64_t layer) {
    return data_.get() + block * layout_.block_stride() + layer * layout_.layer_stride();
  }
  // K of block 0 for `layer`: with block_stride() it addresses that layer's K in every block.
  float* LayerKeys(int64_t layer) { return KeyBlock(0, layer); }
  float* LayerValues(int64_t layer) { return KeyBlock(0, layer) + layout_.kv_stride(); }

  // Copies all of block `src` (every layer, K and V) onto block `dst`.
  void CopyBlock(int32_t src, int32_t dst);

 private:
  struct FreeDeleter {
    std::function<void(void*)> release;  // empty: std::free
    void operator()(float* p) const;
  };
  KvStorage(const KvLayout& layout, float* data, std::function<void(void*)> release);

  KvLayout layout_;
  std::unique_ptr<float, FreeDeleter> data_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_KV_STORAGE_H_
