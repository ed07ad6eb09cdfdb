// Fuzzes the KV transfer descriptor parsing (kvtransfer/kv_transport.h FromProto): the input is a
// serialized tandem.v1.KvPoolDescriptor, as a prefill worker receives a decode worker's pool from
// the router. An accepted descriptor must validate, and must read back the same after ToProto;
// and as a prefill's destination (kvtransfer/kv_grant.h CheckGrant), its first and last blocks
// must be granted with every byte inside the region, and a block past its end refused.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "kvtransfer/kv_grant.h"
#include "kvtransfer/kv_transport.h"
#include "tandem/v1/worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::v1::KvPoolDescriptor proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto descriptor = tandem::kvtransfer::FromProto(proto);
  if (!descriptor.ok()) return 0;
  if (!tandem::kvtransfer::ValidateDescriptor(*descriptor).ok()) std::abort();
  tandem::v1::KvPoolDescriptor again;
  tandem::kvtransfer::ToProto(*descriptor, &again);
  auto reread = tandem::kvtransfer::FromProto(again);
  if (!reread.ok() || reread->regions.size() != descriptor->regions.size() ||
      reread->address != descriptor->address || reread->pool_epoch != descriptor->pool_epoch) {
    std::abort();
  }

  const tandem::KvLayout& layout = descriptor->layout;
  if (layout.num_blocks > UINT32_MAX) return 0;
  const auto last = static_cast<uint32_t>(layout.num_blocks - 1);
  tandem::v1::KvDestination destination;
  *destination.mutable_pool() = proto;
  destination.add_block_ids(last);
  if (last != 0) destination.add_block_ids(0);
  const tandem::kvtransfer::GrantedTokens tokens{
      .num_tokens = destination.block_ids_size() * layout.block_size, .cached_tokens = 0};
  auto grant = tandem::kvtransfer::CheckGrant(destination, tokens, layout);
  if (!grant.ok()) std::abort();  // the descriptor validated: so must these ids
  const auto& region = grant->pool.regions[0];
  for (int32_t b : grant->granted_blocks()) {
    auto bytes = tandem::kvtransfer::BlockLayerBytes(
        layout, {.address = region.base_address, .length = region.length}, b, 0,
        layout.num_layers);
    if (!bytes.ok() || bytes->address < region.base_address ||
        bytes->address - region.base_address + bytes->length > region.length) {
      std::abort();
    }
  }
  if (last < UINT32_MAX) {
    destination.set_block_ids(0, last + 1);  // one past the pool
    if (tandem::kvtransfer::CheckGrant(destination, tokens, layout).ok()) std::abort();
  }
  return 0;
}
