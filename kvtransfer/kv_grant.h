// What a decode worker lets a prefill worker write for one request, and the checks that keep the
// prefill worker inside it (docs/security.md, "The KV path").
//
// A PrefillRequest's KvDestination names one block of the decode worker's pool for each KV block
// of the whole sequence, in position order from token 0. The first
// num_destination_cached_tokens / block_size of them hold K/V the decode worker caches already:
// they only place the rest and are never written. The others are the grant: the blocks this
// request may write, every layer of each, and nothing else of the pool.
//
//   ASSIGN_OR_RETURN(KvGrant grant, CheckGrant(request.destination(),
//                                              {.num_tokens = n, .cached_tokens = cached},
//                                              loop->kv_layout()));
//   auto conn = std::make_shared<GrantedConnection>(std::move(inner), grant, request_id);
//   conn->Write(op, ...);  // PERMISSION_DENIED unless every destination block of op is granted
//   conn->Revoke();        // the call answered or was given up: no write starts after this
//
// A UCX remote key opens the whole registered pool to whoever holds it: these checks bind an
// honest prefill worker to its grant (a buggy plan, a confused request), not a compromised one.
#ifndef TANDEM_KVTRANSFER_KV_GRANT_H_
#define TANDEM_KVTRANSFER_KV_GRANT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvtransfer/kv_transport.h"

namespace tandem {
namespace v1 {
class KvDestination;
class KvPoolDescriptor;
}  // namespace v1

namespace kvtransfer {

// Bytes [address, address + length) in some address space.
struct ByteRange {
  uint64_t address = 0;
  uint64_t length = 0;
};

// The bytes of layers [first_layer, first_layer + num_layers) of block `block` of a pool with
// `layout` whose memory is `region` (docs/kv_layout.md: block b, layer l starts at
// b * block_stride_bytes + l * block_bytes). Every product and sum is checked: INVALID_ARGUMENT
// naming the block when the block or a layer is outside the layout, an intermediate would pass
// 2^64, or the range does not lie inside `region`.
absl::StatusOr<ByteRange> BlockLayerBytes(const KvLayout& layout, const ByteRange& region,
                                          int64_t block, int64_t first_layer, int64_t num_layers);

// A destination checked by CheckGrant.
struct KvGrant {
  PoolDescriptor pool;
  // Every block of the sequence, in position order (KvDestination.block_ids).
  std::vector<int32_t> blocks;
  // Index in `blocks` of the first block to write (the destination caches those before it).
  int64_t first_granted = 0;
  // blocks[first_granted...], as a set.
  absl::flat_hash_set<int32_t> granted;

  // The blocks this request writes, in position order.
  absl::Span<const int32_t> granted_blocks() const {
    return absl::MakeConstSpan(blocks).subspan(static_cast<size_t>(first_granted));
  }
};

// What the request says of its tokens (PrefillRequest).
struct GrantedTokens {
  int64_t num_tokens = 0;     // token_ids size
  int64_t cached_tokens = 0;  // num_destination_cached_tokens
};

// Checks `destination` before anything is written into it, for a sequence of `tokens` computed by
// a worker whose pool has `local` (its own num_blocks aside):
// - INVALID_ARGUMENT: a descriptor FromProto refuses; cached tokens not whole blocks or not below
//   the sequence; not exactly ceil(num_tokens / block_size) block ids; an id outside the pool's
//   blocks; an id given twice; a granted block whose bytes (every layer) BlockLayerBytes does not
//   place inside the pool's region;
// - FAILED_PRECONDITION: a layout that differs from `local` (other than in block count).
// Each message names the field and the offending value.
absl::StatusOr<KvGrant> CheckGrant(const v1::KvDestination& destination, GrantedTokens tokens,
                                   const KvLayout& local);

// PERMISSION_DENIED naming the first destination block of `op` outside `grant`.
absl::Status CheckWriteGranted(const KvGrant& grant, const WriteOp& op);

// The part of a pool descriptor that is not a credential, for state anyone with a worker's
// WatchState stream may read (Snapshot.kv_pool): transport, layout and epoch. The regions (their
// remote keys and addresses) and the transport address are left out; only the prefill worker a
// request names gets them, in its PrefillRequest.
v1::KvPoolDescriptor PublicPart(const v1::KvPoolDescriptor& descriptor);

// A Connection that writes only the blocks of one grant, until revoked. Thread-safe.
class GrantedConnection final : public Connection {
 public:
  // `what` names the grant in errors (e.g. "request 42").
  GrantedConnection(std::shared_ptr<Connection> inner, KvGrant grant, std::string what);

  // PERMISSION_DENIED for a destination block outside the grant; FAILED_PRECONDITION once
  // revoked; otherwise the inner connection's Write.
  absl::Status Write(const WriteOp& op, absl::Time deadline, DoneCallback done) override;
  // FAILED_PRECONDITION once revoked.
  absl::Status Notify(std::string message, absl::Time deadline, DoneCallback done) override;
  // Cancels the inner connection (and with it every write on it, of any grant).
  void Cancel() override;
  std::string Describe() const override;

  // No Write or Notify starts from now on; those started before run to their end.
  void Revoke();

  const KvGrant& grant() const { return grant_; }

 private:
  const std::shared_ptr<Connection> inner_;
  const KvGrant grant_;
  const std::string what_;
  absl::Mutex mu_;
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvtransfer
}  // namespace tandem

#endif  // TANDEM_KVTRANSFER_KV_GRANT_H_
