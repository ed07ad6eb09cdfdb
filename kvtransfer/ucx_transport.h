// The KvTransport over UCX (ucp): RMA puts straight into the peer's registered pool, short active
// messages for the handshake and notifications. UCX picks the wire per peer: shared memory or TCP
// on one host, RDMA, CUDA IPC or NVLink in a GPU cluster (UCX_TLS, or UcxOptions::transports).
//
// One UCX context and worker per transport, driven by one progress thread that sleeps on the
// worker's event descriptor; the public methods hand work to that thread and never touch UCX
// themselves. Every connection starts with a handshake that checks the descriptor is current (the
// owner's pool epoch and address), and every notification is acknowledged by the owner, so a
// writer learns within the deadline when the owner is gone, even over shared memory where puts
// into a dead peer's memory still "succeed".
//
// When an operation's deadline passes, or the peer fails, the connection is closed at once (so no
// late write lands in blocks the owner has since reused) and every operation still on it ends:
// the expired one with DEADLINE_EXCEEDED, the others with UNAVAILABLE. Connect again to go on.
#ifndef TANDEM_KVTRANSFER_UCX_TRANSPORT_H_
#define TANDEM_KVTRANSFER_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

struct UcxOptions {
  // This side's name in logs and in the notifications it sends.
  std::string name = "kvtransfer";
  // UCX transports, as UCX_TLS takes them (e.g. "posix,self", "tcp", "rc,cuda_ipc"); empty: the
  // UCX_TLS environment variable, else UCX's own choice.
  std::string transports;
  // How often UCX probes an idle peer; a peer silent for a few intervals is declared failed.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // Memory the pool lives in; kCuda needs a UCX built with CUDA support.
  MemoryKind memory_kind = MemoryKind::kHost;
  uint32_t device_index = 0;
};

// UNAVAILABLE when UCX cannot start (naming what failed).
absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(const UcxOptions& options);

// The UCX transport names of every lane of a UCX endpoint description (ucp_ep_print_info's text),
// e.g. {"posix/memory", "tcp/lo"}; and whether only TCP carries data while `requested` (a UCX_TLS
// value) asked for something else. Exposed for tests.
std::vector<std::string> LaneTransports(const std::string& ep_info);
bool FellBackToTcp(const std::vector<std::string>& lanes, const std::string& requested);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_TRANSPORT_H_
