// Moving KV blocks between workers: a prefill worker writes a prompt's K/V, layer by layer,
// straight into blocks of a decode worker's pool (DESIGN.md §1, §4; docs/kv_layout.md).
//
// The pool's owner registers its pool once and hands out the PoolDescriptor (it travels in
// tandem.v1.KvPoolDescriptor). A writer registers its own pool, connects to the owner from the
// descriptor, and issues writes of block slices; a notification sent after writes on the same
// connection reaches the owner only once their data is in place.
//
//   // Decode worker (owner):
//   ASSIGN_OR_RETURN(auto transport, CreateUcxTransport({.name = "decode-0"}));
//   transport->SetNotificationHandler([](Notification n) { ... n.message ... });
//   ASSIGN_OR_RETURN(PoolDescriptor mine, transport->RegisterPool(&pool->storage()));
//   // Prefill worker (writer):
//   RETURN_IF_ERROR(transport->RegisterPool(&pool->storage()).status());
//   ASSIGN_OR_RETURN(auto conn, transport->Connect(theirs, absl::Now() + absl::Seconds(2)));
//   RETURN_IF_ERROR(conn->Write({.blocks = {{3, 17}}, .first_layer = l, .num_layers = 1},
//                               deadline, [](absl::Status s) { ... }));
//   RETURN_IF_ERROR(conn->Notify("request 42: layers 0..11", deadline, [](absl::Status) {}));
//
// Callbacks run on the transport's own thread; they must not block. Every operation ends exactly
// once: OK, DEADLINE_EXCEEDED past its deadline, UNAVAILABLE when the peer failed or went away,
// CANCELLED by Cancel() or when the transport shuts down.
#ifndef TANDEM_KVTRANSFER_KV_TRANSPORT_H_
#define TANDEM_KVTRANSFER_KV_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv/kv_storage.h"

namespace tandem {
namespace v1 {
class KvPoolDescriptor;
}  // namespace v1

namespace kvtransfer {

enum class MemoryKind { kHost = 1, kCuda = 2 };  // values of tandem.v1.MemoryType

// Everything a remote writer needs to put blocks into a pool (tandem.v1.KvPoolDescriptor).
struct PoolDescriptor {
  struct Region {
    uint64_t base_address = 0;  // in the owner's address space
    uint64_t length = 0;        // bytes
    std::string remote_key;     // transport key (UCX: a packed rkey)
    MemoryKind kind = MemoryKind::kHost;
    uint32_t device_index = 0;
  };
  std::string transport;  // "ucx" or "inproc"
  std::string address;    // the owner's transport address (UCX: its packed worker address)
  std::vector<Region> regions;
  KvLayout layout;
  uint64_t pool_epoch = 0;
};

// INVALID_ARGUMENT unless the descriptor is complete and self-consistent (a layout that validates,
// regions that cover the whole pool and end below 2^64).
absl::Status ValidateDescriptor(const PoolDescriptor& descriptor);
void ToProto(const PoolDescriptor& descriptor, v1::KvPoolDescriptor* proto);
// INVALID_ARGUMENT for a descriptor that ValidateDescriptor refuses or an unsupported dtype.
absl::StatusOr<PoolDescriptor> FromProto(const v1::KvPoolDescriptor& proto);

// One block to copy: `src` in the writer's pool onto `dst` in the peer's pool.
struct BlockPair {
  int32_t src = 0;
  int32_t dst = 0;
};

// Layers [first_layer, first_layer + num_layers) of every pair of `blocks`. Each (block, layer)
// is one contiguous run of KvLayout block_bytes on both sides (docs/kv_layout.md).
struct WriteOp {
  std::vector<BlockPair> blocks;
  int32_t first_layer = 0;
  int32_t num_layers = 1;
};

// A short message from a writer to a pool's owner.
struct Notification {
  std::string peer;     // the writer's transport name
  std::string message;  // as sent, at most kMaxNotificationBytes
};
inline constexpr size_t kMaxNotificationBytes = 64 * 1024;

using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;

// A writer's link to one peer pool. Thread-safe. It may outlive its transport: then every call
// fails with UNAVAILABLE.
class Connection {
 public:
  virtual ~Connection() = default;

  // Starts writing `op` from the writer's registered pool into the peer's pool; `done` runs when
  // every byte is in the peer's memory, or with the error that ended the write. A write that
  // cannot start (an empty block list, a block id or layer outside either pool, a closed
  // connection) returns the error and never calls `done`.
  virtual absl::Status Write(const WriteOp& op, absl::Time deadline, DoneCallback done) = 0;

  // Sends `message` to the peer's notification handler, after every Write issued before it on
  // this connection has completed: a notification never overtakes the data it announces. `done`
  // runs once the message was handed to the peer (OK) or failed.
  virtual absl::Status Notify(std::string message, absl::Time deadline, DoneCallback done) = 0;

  // Ends every outstanding operation with CANCELLED and closes the connection.
  virtual void Cancel() = 0;

  // How the transport reaches the peer, e.g. "ucx: posix/memory rma, tcp/lo am" or "inproc".
  virtual std::string Describe() const = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // Memory for the pool that this transport exposes best, for KvStorage (KvAllocator): UCX
  // allocates shared memory that a peer on the same host maps directly, so a put is a single
  // copy by the writer. UNIMPLEMENTED when the transport has no preference (use the heap).
  // Release it only after the pool is gone; the transport must outlive it.
  virtual absl::StatusOr<void*> AllocatePoolMemory(size_t /*bytes*/) {
    return absl::UnimplementedError("this transport takes any memory");
  }
  virtual void ReleasePoolMemory(void* /*memory*/) {}
  // A KvAllocator over AllocatePoolMemory (KvStorage uses the heap when it is UNIMPLEMENTED).
  KvAllocator PoolAllocator();

  // Registers `pool` (which must outlive the transport) for remote writes into it and as the
  // source of this side's writes. FAILED_PRECONDITION when a pool is registered already.
  virtual absl::StatusOr<PoolDescriptor> RegisterPool(KvStorage* pool) = 0;

  // Connects to the owner of `remote`. INVALID_ARGUMENT for a descriptor of another transport, an
  // invalid one or one whose layout differs from this side's pool (except in block count);
  // FAILED_PRECONDITION when no pool is registered here; UNAVAILABLE when the peer cannot be
  // reached before `deadline`.
  virtual absl::StatusOr<std::shared_ptr<Connection>> Connect(const PoolDescriptor& remote,
                                                              absl::Time deadline) = 0;

  // Receives the notifications peers send to this side, on the transport's thread.
  virtual void SetNotificationHandler(absl::AnyInvocable<void(Notification)> handler) = 0;

  // This side's name in logs and notifications.
  virtual const std::string& name() const = 0;
};

// The checks every transport makes before a write starts.
absl::Status ValidateWrite(const WriteOp& op, const KvLayout& local, const KvLayout& remote);
// INVALID_ARGUMENT unless the two layouts differ at most in their number of blocks.
absl::Status CheckCompatibleLayouts(const KvLayout& local, const KvLayout& remote);

}  // namespace kvtransfer
}  // namespace tandem

#endif  // TANDEM_KVTRANSFER_KV_TRANSPORT_H_
