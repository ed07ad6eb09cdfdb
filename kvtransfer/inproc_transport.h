// A KvTransport inside one process: writes are memcpy on the writer's transport thread, in issue
// order, and notifications reach the owner's handler on the owner's thread. For unit tests of the
// workers and the router's disaggregated path without UCX; its errors match UCX's (a destroyed
// owner is UNAVAILABLE, deadlines and Cancel behave the same).
#ifndef TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_
#define TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_

#include <memory>
#include <string>

#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

// `name` must be unique in the process; it is the transport address.
std::unique_ptr<KvTransport> CreateInProcessTransport(const std::string& name);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_INPROC_TRANSPORT_H_
