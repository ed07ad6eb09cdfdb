// Fuzzes the KV transfer descriptor parsing (kvtransfer/kv_transport.h FromProto): the input is a
// serialized tandem.v1.KvPoolDescriptor, as a prefill worker receives a decode worker's pool from
// the router. An accepted descriptor must validate, and must read back the same after ToProto.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

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
  return 0;
}
