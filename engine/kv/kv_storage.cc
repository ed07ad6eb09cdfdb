#include "engine/kv/kv_storage.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tandem {

absl::StatusOr<DType> ParseKvDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "f16") return DType::kF16;
  if (lower == "f32") return DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("KV dtype '", name, "' is not one of f16, f32"));
}

absl::Status KvLayout::Validate() const {
  if (num_blocks <= 0 || num_layers <= 0 || block_size <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout sizes must be positive: blocks=", num_blocks, " layers=", num_layers,
        " block_size=", block_size, " kv_heads=", num_kv_heads, " head_dim=", head_dim));
  }
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("KV dtype ", DTypeName(dtype),
                                                   " is not supported (F32 or F16)"));
  }
  const double elements = static_cast<double>(num_blocks) * num_layers * 2 * block_size *
                          num_kv_heads * head_dim;
  if (elements > static_cast<double>(int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool of ", elements * element_bytes() / (1 << 30), " GiB is too large"));
  }
  return absl::OkStatus();
}

void KvStorage::FreeDeleter::operator()(std::byte* p) const {
  if (release) {
    release(p);
  } else {
    std::free(p);
  }
}

absl::StatusOr<std::unique_ptr<KvStorage>> KvStorage::Create(const KvLayout& layout,
                                                             const KvAllocator& allocator) {
  if (absl::Status s = layout.Validate(); !s.ok()) return s;
  const size_t bytes = static_cast<size_t>(layout.total_bytes());
  absl::StatusOr<void*> memory = absl::UnimplementedError("no allocator");
  if (allocator.allocate) memory = allocator.allocate(bytes);
  if (memory.status().code() != absl::StatusCode::kUnimplemented) {
    if (!memory.ok()) return memory.status();
    if (*memory == nullptr || reinterpret_cast<uintptr_t>(*memory) % 64 != 0) {
      if (*memory != nullptr && allocator.release) allocator.release(*memory);
      return absl::InternalError("the KV allocator returned memory that is not 64-byte aligned");
    }
    if (allocator.zero) {
      allocator.zero(*memory, bytes);
    } else {
      std::memset(*memory, 0, bytes);
    }
    return std::unique_ptr<KvStorage>(new KvStorage(layout, static_cast<std::byte*>(*memory),
                                                    allocator.release, allocator.copy));
  }
  // 2 MiB alignment lets the kernel back the region with huge pages and keeps SIMD loads aligned.
  constexpr size_t kAlign = size_t{2} << 20;
  void* data = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV pool of ", bytes >> 20, " MiB"));
  }
  std::memset(data, 0, bytes);
  return std::unique_ptr<KvStorage>(
      new KvStorage(layout, static_cast<std::byte*>(data), nullptr, nullptr));
}

KvStorage::KvStorage(const KvLayout& layout, std::byte* data, std::function<void(void*)> release,
                     std::function<void(void*, const void*, size_t)> copy)
    : layout_(layout), copy_(std::move(copy)), data_(data, FreeDeleter{std::move(release)}) {}

void KvStorage::CopyBlock(int32_t src, int32_t dst) {
  CHECK(src >= 0 && src < layout_.num_blocks && dst >= 0 && dst < layout_.num_blocks)
      << "block copy " << src << " -> " << dst << " outside the pool of " << layout_.num_blocks;
  const int64_t n = layout_.block_stride_bytes();
  if (copy_) {
    copy_(data_.get() + dst * n, data_.get() + src * n, static_cast<size_t>(n));
  } else {
    std::memcpy(data_.get() + dst * n, data_.get() + src * n, static_cast<size_t>(n));
  }
}

}  // namespace tandem
