#include "kvtransfer/kv_grant.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::kvtransfer {
namespace {

// a * b + c, false when any step passes 2^64.
bool MulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {
  uint64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, out);
}

}  // namespace

absl::StatusOr<ByteRange> BlockLayerBytes(const KvLayout& layout, const ByteRange& region,
                                          int64_t block, int64_t first_layer, int64_t num_layers) {
  if (block < 0 || block >= layout.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("block ", block, " is outside the pool's ", layout.num_blocks));
  }
  if (first_layer < 0 || num_layers <= 0 || first_layer > layout.num_layers - num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", first_layer, ", +", num_layers,
                                                   ") of block ", block, " are outside [0, ",
                                                   layout.num_layers, ")"));
  }
  const int64_t block_bytes = layout.block_bytes();
  const int64_t block_stride = layout.block_stride_bytes();
  uint64_t layer_offset = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end = 0;
  uint64_t region_end = 0;
  if (block_bytes <= 0 || block_stride <= 0 ||
      !MulAdd(static_cast<uint64_t>(first_layer), static_cast<uint64_t>(block_bytes), 0,
              &layer_offset) ||
      !MulAdd(static_cast<uint64_t>(block), static_cast<uint64_t>(block_stride), layer_offset,
              &offset) ||
      !MulAdd(static_cast<uint64_t>(num_layers), static_cast<uint64_t>(block_bytes), 0,
              &length) ||
      __builtin_add_overflow(offset, length, &end) ||
      __builtin_add_overflow(region.address, region.length, &region_end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the address of block ", block, " overflows 64 bits"));
  }
  if (end > region.length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block ", block, " (bytes [", offset, ", ", end, ")) lies past its region of ",
        region.length, " bytes"));
  }
  return ByteRange{.address = region.address + offset, .length = length};
}

absl::StatusOr<KvGrant> CheckGrant(const v1::KvDestination& destination, GrantedTokens tokens,
                                   const KvLayout& local) {
  absl::StatusOr<PoolDescriptor> pool = FromProto(destination.pool());
  if (!pool.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.pool: ", pool.status().message()));
  }
  if (absl::Status s = CheckCompatibleLayouts(local, pool->layout); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("destination.pool: ", s.message()));
  }
  const int64_t bs = local.block_size;
  if (tokens.num_tokens <= 0 || tokens.cached_tokens < 0 || tokens.cached_tokens % bs != 0 ||
      tokens.cached_tokens >= tokens.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_destination_cached_tokens ", tokens.cached_tokens, " must be a multiple of ", bs,
        " below the sequence's ", tokens.num_tokens, " tokens"));
  }
  const int64_t needed = (tokens.num_tokens + bs - 1) / bs;
  if (destination.block_ids_size() != needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination.block_ids has ", destination.block_ids_size(), " blocks; ",
        tokens.num_tokens, " tokens in blocks of ", bs, " need exactly ", needed));
  }
  KvGrant grant;
  grant.first_granted = tokens.cached_tokens / bs;
  grant.blocks.reserve(static_cast<size_t>(needed));
  absl::flat_hash_map<uint32_t, int> seen;
  for (int i = 0; i < destination.block_ids_size(); ++i) {
    const uint32_t b = destination.block_ids(i);
    if (static_cast<int64_t>(b) >= pool->layout.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("destination.block_ids[", i, "] = ", b,
                                                     " is outside the pool's ",
                                                     pool->layout.num_blocks, " blocks"));
    }
    if (auto [it, fresh] = seen.try_emplace(b, i); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("destination.block_ids[", i, "] = ", b,
                                                     " repeats destination.block_ids[",
                                                     it->second, "]"));
    }
    grant.blocks.push_back(static_cast<int32_t>(b));
  }
  const PoolDescriptor::Region& region = pool->regions[0];
  for (int32_t b : grant.granted_blocks()) {
    absl::StatusOr<ByteRange> bytes = BlockLayerBytes(
        pool->layout, {.address = region.base_address, .length = region.length}, b, 0,
        pool->layout.num_layers);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination.pool.regions[0]: ", bytes.status().message()));
    }
    grant.granted.insert(b);
  }
  grant.pool = *std::move(pool);
  return grant;
}

absl::Status CheckWriteGranted(const KvGrant& grant, const WriteOp& op) {
  for (const BlockPair& p : op.blocks) {
    if (!grant.granted.contains(p.dst)) {
      return absl::PermissionDeniedError(
          absl::StrCat("destination block ", p.dst, " is not granted to this request"));
    }
  }
  return absl::OkStatus();
}

v1::KvPoolDescriptor PublicPart(const v1::KvPoolDescriptor& descriptor) {
  v1::KvPoolDescriptor out;
  out.set_transport(descriptor.transport());
  if (descriptor.has_layout()) *out.mutable_layout() = descriptor.layout();
  out.set_pool_epoch(descriptor.pool_epoch());
  return out;
}

GrantedConnection::GrantedConnection(std::shared_ptr<Connection> inner, KvGrant grant,
                                     std::string what)
    : inner_(std::move(inner)), grant_(std::move(grant)), what_(std::move(what)) {}

absl::Status GrantedConnection::Write(const WriteOp& op, absl::Time deadline, DoneCallback done) {
  if (absl::Status s = CheckWriteGranted(grant_, op); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(what_, ": ", s.message()));
  }
  // Held while the write starts, so that none starts after Revoke returns.
  absl::MutexLock lock(&mu_);
  if (revoked_) {
    return absl::FailedPreconditionError(absl::StrCat(what_, ": the grant was revoked"));
  }
  return inner_->Write(op, deadline, std::move(done));
}

absl::Status GrantedConnection::Notify(std::string message, absl::Time deadline,
                                       DoneCallback done) {
  absl::MutexLock lock(&mu_);
  if (revoked_) {
    return absl::FailedPreconditionError(absl::StrCat(what_, ": the grant was revoked"));
  }
  return inner_->Notify(std::move(message), deadline, std::move(done));
}

void GrantedConnection::Cancel() { inner_->Cancel(); }

std::string GrantedConnection::Describe() const {
  return absl::StrCat(inner_->Describe(), " (", what_, ": ", grant_.granted.size(),
                      " blocks granted)");
}

void GrantedConnection::Revoke() {
  absl::MutexLock lock(&mu_);
  revoked_ = true;
}

}  // namespace kvtransfer
