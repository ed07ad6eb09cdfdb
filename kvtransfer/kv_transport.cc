#include "kvtransfer/kv_transport.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::kvtransfer {
namespace {

// The wire's names for the KV element types Tandem's pools use (KvLayout::Validate).
v1::DType ToProtoDType(DType t) { return t == DType::kF16 ? v1::DTYPE_F16 : v1::DTYPE_F32; }

}  // namespace

KvAllocator KvTransport::PoolAllocator() {
  return KvAllocator{.allocate = [this](size_t bytes) { return AllocatePoolMemory(bytes); },
                     .release = [this](void* memory) { ReleasePoolMemory(memory); }};
}

absl::Status CheckCompatibleLayouts(const KvLayout& local, const KvLayout& remote) {
  if (local.num_layers != remote.num_layers || local.block_size != remote.block_size ||
      local.num_kv_heads != remote.num_kv_heads || local.head_dim != remote.head_dim ||
      local.dtype != remote.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layouts differ: here layers=", local.num_layers, " block_size=", local.block_size,
        " kv_heads=", local.num_kv_heads, " head_dim=", local.head_dim,
        " dtype=", DTypeName(local.dtype), "; peer layers=", remote.num_layers,
        " block_size=", remote.block_size, " kv_heads=", remote.num_kv_heads,
        " head_dim=", remote.head_dim, " dtype=", DTypeName(remote.dtype),
        " (prefill and decode workers need the same --kv_dtype)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDescriptor(const PoolDescriptor& d) {
  if (d.transport.empty()) return absl::InvalidArgumentError("the descriptor names no transport");
  if (absl::Status s = d.layout.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor layout: ", s.message()));
  }
  if (d.regions.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV pool is one region; the descriptor has ", d.regions.size()));
  }
  const PoolDescriptor::Region& r = d.regions[0];
  const uint64_t pool_bytes = static_cast<uint64_t>(d.layout.total_bytes());
  if (r.length != pool_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the region holds ", r.length,
                                                   " bytes; the layout needs ", pool_bytes));
  }
  if (r.base_address == 0) return absl::InvalidArgumentError("the region has no address");
  // So that base + any offset inside the region is an address (transports add them unchecked).
  if (r.base_address > std::numeric_limits<uint64_t>::max() - r.length) {
    return absl::InvalidArgumentError(absl::StrCat("the region at ", r.base_address, " of ",
                                                   r.length,
                                                   " bytes runs past the end of the address space"));
  }
  if (r.kind != MemoryKind::kHost && r.kind != MemoryKind::kCuda) {
    return absl::InvalidArgumentError("the region has no memory type");
  }
  return absl::OkStatus();
}

void ToProto(const PoolDescriptor& d, v1::KvPoolDescriptor* proto) {
  proto->Clear();
  proto->set_transport(d.transport);
  proto->set_transport_address(d.address);
  for (const PoolDescriptor::Region& r : d.regions) {
    v1::MemoryRegion* region = proto->add_regions();
    region->set_base_address(r.base_address);
    region->set_length(r.length);
    region->set_remote_key(r.remote_key);
    region->set_memory_type(static_cast<v1::MemoryType>(r.kind));
    region->set_device_index(r.device_index);
  }
  v1::KvLayout* layout = proto->mutable_layout();
  layout->set_num_layers(static_cast<uint32_t>(d.layout.num_layers));
  layout->set_num_kv_heads(static_cast<uint32_t>(d.layout.num_kv_heads));
  layout->set_head_dim(static_cast<uint32_t>(d.layout.head_dim));
  layout->set_block_size(static_cast<uint32_t>(d.layout.block_size));
  layout->set_dtype(ToProtoDType(d.layout.dtype));
  layout->set_block_bytes(static_cast<uint64_t>(d.layout.block_bytes()));
  layout->set_layer_stride_bytes(static_cast<uint64_t>(d.layout.block_bytes()));
  proto->set_pool_epoch(d.pool_epoch);
}

absl::StatusOr<PoolDescriptor> FromProto(const v1::KvPoolDescriptor& proto) {
  PoolDescriptor d;
  d.transport = proto.transport();
  d.address = proto.transport_address();
  d.pool_epoch = proto.pool_epoch();
  const v1::KvLayout& l = proto.layout();
  if (l.dtype() != v1::DTYPE_F32 && l.dtype() != v1::DTYPE_F16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV dtype ", v1::DType_Name(l.dtype()), " is not supported (F32 or F16)"));
  }
  // Bounded before any product of them is formed (they come from a peer).
  constexpr uint32_t kMaxDim = 1 << 16;
  if (l.num_layers() > kMaxDim || l.block_size() > kMaxDim || l.num_kv_heads() > kMaxDim ||
      l.head_dim() > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout dimensions over ", kMaxDim, ": layers=", l.num_layers(), " block_size=",
        l.block_size(), " kv_heads=", l.num_kv_heads(), " head_dim=", l.head_dim()));
  }
  d.layout = KvLayout{.num_blocks = 0, .num_layers = l.num_layers(), .block_size = l.block_size(),
                      .num_kv_heads = l.num_kv_heads(), .head_dim = l.head_dim(),
                      .dtype = l.dtype() == v1::DTYPE_F16 ? DType::kF16 : DType::kF32};
  if (l.block_bytes() != static_cast<uint64_t>(d.layout.block_bytes()) ||
      l.layer_stride_bytes() != l.block_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_bytes ", l.block_bytes(), " / layer_stride_bytes ", l.layer_stride_bytes(),
        " do not match the layout (", d.layout.block_bytes(), ", docs/kv_layout.md)"));
  }
  // ... and so is a block of every layer, whose size (block_stride_bytes) bounds the pool: each
  // dimension under kMaxDim still lets their product pass 2^63 (found by tests/fuzz).
  if (l.num_layers() > 0 &&
      l.block_bytes() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / l.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", l.num_layers(), " layers of ",
                                                   l.block_bytes(), " bytes is over 2^63 bytes"));
  }
  for (const v1::MemoryRegion& r : proto.regions()) {
    if (r.memory_type() != v1::MEMORY_TYPE_HOST && r.memory_type() != v1::MEMORY_TYPE_CUDA) {
      return absl::InvalidArgumentError(
          absl::StrCat("region memory type ", v1::MemoryType_Name(r.memory_type())));
    }
    d.regions.push_back({.base_address = r.base_address(), .length = r.length(),
                         .remote_key = r.remote_key(),
                         .kind = static_cast<MemoryKind>(r.memory_type()),
                         .device_index = r.device_index()});
  }
  const int64_t block_stride_bytes = d.layout.block_stride_bytes();
  if (!d.regions.empty() && block_stride_bytes > 0) {
    d.layout.num_blocks = static_cast<int64_t>(d.regions[0].length) / block_stride_bytes;
  }
  if (absl::Status s = ValidateDescriptor(d); !s.ok()) return s;
  return d;
}

absl::Status ValidateWrite(const WriteOp& op, const KvLayout& local, const KvLayout& remote) {
  if (op.blocks.empty()) return absl::InvalidArgumentError("the write names no blocks");
  if (op.num_layers <= 0 || op.first_layer < 0 ||
      int64_t{op.first_layer} + int64_t{op.num_layers} > local.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", op.first_layer, ", ",
                                                   int64_t{op.first_layer} + op.num_layers,
                                                   ") are outside [0, ", local.num_layers, ")"));
  }
  for (const BlockPair& p : op.blocks) {
    if (p.src < 0 || p.src >= local.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("source block ", p.src,
                                                     " is outside the local pool of ",
                                                     local.num_blocks));
    }
    if (p.dst < 0 || p.dst >= remote.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("destination block ", p.dst,
                                                     " is outside the peer's pool of ",
                                                     remote.num_blocks));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
