// The KV memory of one worker: one region, allocated once, cut into blocks of `block_size` tokens
// that hold K and V for every layer. Block ids index this region; a per-sequence block table maps
// a sequence's positions onto blocks (position p lives in slot p % block_size of block
// table[p / block_size]).
//
// Layout (elements of the pool's dtype, F32 or F16; row-major), the contract for the attention
// kernels and for transfers:
//
//   [num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]
//
// so one block's slice for one layer (K then V) is contiguous, and so is the whole block across
// layers. docs/kv_layout.md carries the full contract. This file is only the memory; BlockPool
// (block_pool.h) decides which block belongs to whom.
#ifndef TANDEM_ENGINE_KV_KV_STORAGE_H_
#define TANDEM_ENGINE_KV_KV_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "engine/core/dtype.h"

namespace tandem {

struct KvLayout {
  int64_t num_blocks = 0;
  int64_t num_layers = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Element type: F32, or F16 (half the memory and the bytes a transfer moves). Engines pick it
  // with --kv_dtype (CpuBackend::Options::kv_dtype), default F16; a bare layout is F32.
  DType dtype = DType::kF32;

  // Strides in elements.
  int64_t token_stride() const { return num_kv_heads * head_dim; }
  int64_t kv_head_stride() const { return head_dim; }
  int64_t kv_stride() const { return block_size * token_stride(); }  // K -> V of one layer
  int64_t layer_stride() const { return 2 * kv_stride(); }
  int64_t block_stride() const { return num_layers * layer_stride(); }
  int64_t total_elements() const { return num_blocks * block_stride(); }

  int64_t element_bytes() const { return dtype == DType::kF16 ? 2 : 4; }
  // Bytes of K then V of one block for one layer (docs/kv_layout.md's block_bytes: the unit of a
  // layer-by-layer transfer), and of one block for every layer.
  int64_t block_bytes() const { return layer_stride() * element_bytes(); }
  int64_t block_stride_bytes() const { return block_stride() * element_bytes(); }
  int64_t total_bytes() const { return total_elements() * element_bytes(); }

  // INVALID_ARGUMENT when a size is not positive, the dtype is neither F32 nor F16, or the pool
  // would exceed 2^40 elements.
  absl::Status Validate() const;
};

// The KV element type named by a flag: "f16" or "f32" (any case). INVALID_ARGUMENT otherwise.
absl::StatusOr<DType> ParseKvDType(absl::string_view name);

// Whether T is the element type of `dtype` (float: F32, uint16_t: F16); std::byte fits any.
template <typename T>
bool KvElementFits(DType dtype) {
  if constexpr (std::is_same_v<T, std::byte>) return true;
  if constexpr (std::is_same_v<T, float>) return dtype == DType::kF32;
  if constexpr (std::is_same_v<T, uint16_t>) return dtype == DType::kF16;
  return false;
}

// Where a pool's memory comes from when not from the heap: e.g. a transport that exposes memory it
// allocated itself best (UCX: shared memory that a peer on the host maps, so a remote write is a
// single copy), or a GPU backend (device memory). `allocate` returns at least `bytes` bytes
// aligned to 64, UNIMPLEMENTED to have the pool on the heap after all, or another error; `release`
// gets the same pointer back. Memory the host cannot address comes with `zero` and `copy`, which
// KvStorage then uses instead of memset and memcpy (the only times the engine touches the
// contents on the host: clearing a new pool, copying a shared block before a sequence writes it).
struct KvAllocator {
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void*)> release;
  std::function<void(void* dst, size_t bytes)> zero = nullptr;
  std::function<void(void* dst, const void* src, size_t bytes)> copy = nullptr;
};

// Owns the KV region. Not thread-safe: one engine thread owns it.
class KvStorage {
 public:
  // The region comes from `allocator` when it has an allocate function, else from the heap.
  static absl::StatusOr<std::unique_ptr<KvStorage>> Create(const KvLayout& layout,
                                                           const KvAllocator& allocator = {});

  const KvLayout& layout() const { return layout_; }
  // The region's start as T: float for an F32 pool, uint16_t (f16 bits) for an F16 one, std::byte
  // for either. Element offsets (the layout's strides) apply to the typed pointer.
  template <typename T = float>
  T* data() const {
    CheckElement<T>();
    return reinterpret_cast<T*>(data_.get());
  }
  // K of `layer` in `block`: [block_size][num_kv_heads][head_dim]; V follows at + kv_stride()
  // elements.
  template <typename T = float>
  T* KeyBlock(int64_t block, int64_t layer) const {
    CheckElement<T>();
    const int64_t element = block * layout_.block_stride() + layer * layout_.layer_stride();
    return reinterpret_cast<T*>(data_.get() + element * layout_.element_bytes());
  }
  // K of block 0 for `layer`: with block_stride() it addresses that layer's K in every block.
  const void* LayerKeys(int64_t layer) const { return KeyBlock<std::byte>(0, layer); }
  const void* LayerValues(int64_t layer) const {
    return KeyBlock<std::byte>(0, layer) + layout_.kv_stride() * layout_.element_bytes();
  }
  // Copies all of block `src` (every layer, K and V) onto block `dst`.
  void CopyBlock(int32_t src, int32_t dst);

 private:
  template <typename T>
  void CheckElement() const {
    CHECK(KvElementFits<T>(layout_.dtype))
        << "KV pool of " << DTypeName(layout_.dtype) << " addressed with the wrong element type";
  }
  struct FreeDeleter {
    std::function<void(void*)> release;  // empty: std::free
    void operator()(std::byte* p) const;
  };
  KvStorage(const KvLayout& layout, std::byte* data, std::function<void(void*)> release,
            std::function<void(void*, const void*, size_t)> copy);

  KvLayout layout_;
  std::function<void(void*, const void*, size_t)> copy_;  // empty: memcpy
  std::unique_ptr<std::byte, FreeDeleter> data_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_KV_STORAGE_H_
