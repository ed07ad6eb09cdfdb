#include "kvtransfer/ucx_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "ucp/api/ucp.h"
#include "xxhash.h"

namespace tandem::kvtransfer {
namespace {

// Active message ids of the protocol between a writer and a pool's owner.
enum AmId : unsigned {
  kAmHello = 1,    // writer -> owner: connect_id, the epoch and base address it expects, its name
  kAmWelcome = 2,  // owner -> writer: connect_id, the owner's epoch, base address, block count
  kAmNotify = 3,   // writer -> owner: notify_id, the writer's name, the message
  kAmAck = 4,      // owner -> writer: notify_id
};

// The transport address in a descriptor: magic, a checksum and the UCX worker address, so that a
// corrupt or foreign descriptor is refused before UCX parses it.
constexpr char kAddressMagic[4] = {'T', 'U', 'C', 'X'};
constexpr size_t kAddressHeader = 4 + 8 + 4;

std::string EncodeAddress(const void* ucx_address, size_t length) {
  std::string out(kAddressMagic, 4);
  const uint64_t sum = XXH3_64bits(ucx_address, length);
  const uint32_t len = static_cast<uint32_t>(length);
  out.append(reinterpret_cast<const char*>(&sum), 8);
  out.append(reinterpret_cast<const char*>(&len), 4);
  out.append(static_cast<const char*>(ucx_address), length);
  return out;
}

absl::StatusOr<std::string> DecodeAddress(const std::string& address) {
  if (address.size() < kAddressHeader || std::memcmp(address.data(), kAddressMagic, 4) != 0) {
    return absl::InvalidArgumentError("the descriptor's address is not a Tandem UCX address");
  }
  uint64_t sum;
  uint32_t len;
  std::memcpy(&sum, address.data() + 4, 8);
  std::memcpy(&len, address.data() + 12, 4);
  if (address.size() != kAddressHeader + len) {
    return absl::InvalidArgumentError("the descriptor's UCX address is truncated");
  }
  std::string ucx = address.substr(kAddressHeader);
  if (XXH3_64bits(ucx.data(), ucx.size()) != sum) {
    return absl::InvalidArgumentError("the descriptor's UCX address is corrupt (checksum)");
  }
  return ucx;
}

template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Reads a T at *offset of `data`; false when it does not fit.
template <typename T>
bool Get(const char* data, size_t length, size_t* offset, T* v) {
  if (*offset + sizeof(T) > length) return false;
  std::memcpy(v, data + *offset, sizeof(T));
  *offset += sizeof(T);
  return true;
}

std::string UcxError(ucs_status_t status) { return ucs_status_string(status); }

// ucp_ep_print_info's text.
std::string EndpointInfo(ucp_ep_h ep);

uint64_t NowMicros() { return static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())); }

class UcxTransport;

// One operation in flight on a connection.
struct Op {
  enum class Kind { kConnect, kWrite, kNotify };
  Kind kind;
  absl::Time deadline;
  DoneCallback done;
  std::string message;  // kNotify: what to send once the flush is done
};

// A connection's state; owned by the transport, touched only on the progress thread except for
// the fields under `mu`.
struct ConnState {
  // The error handler's argument: UCX hands it back when the endpoint fails.
  struct EpContext {
    UcxTransport* transport;
    uint64_t conn_id;
  };
  EpContext ep_context{};
  uint64_t id = 0;
  std::string peer;  // for logs
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  uint64_t remote_base = 0;
  uint64_t remote_epoch = 0;
  KvLayout remote_layout;
  bool open = false;  // the handshake finished and nothing broke it
  // UCX reports peer failures on this endpoint (UCP_ERR_HANDLING_MODE_PEER). Shared-memory lanes
  // of UCX 1.13 cannot; there the acknowledged notifications and the deadlines find a dead peer.
  bool peer_errors = false;
  bool closed = false;
  absl::flat_hash_map<uint64_t, Op> ops;
  // Notifications in issue order; only the head is in flight, so they arrive in order.
  std::deque<uint64_t> notify_queue;

  absl::Mutex mu;
  std::string describe ABSL_GUARDED_BY(mu) = "ucx (connecting)";
  bool usable ABSL_GUARDED_BY(mu) = true;  // false once broken or cancelled
};

// user_data of a UCX request: which operation of which connection it belongs to.
struct RequestContext {
  UcxTransport* transport;
  uint64_t conn_id;
  uint64_t op_id;
  std::string buffer;  // what a send reads from until it completes
};

class UcxConnection;

// Whether the transport still exists, for connections that outlive it.
struct Liveness {
  absl::Mutex mu;
  UcxTransport* transport ABSL_GUARDED_BY(mu);
};


class UcxTransport final : public KvTransport {
 public:
  explicit UcxTransport(const UcxOptions& options)
      : options_(options), live_(std::make_shared<Liveness>()) {
    absl::MutexLock lock(&live_->mu);
    live_->transport = this;
  }
  ~UcxTransport() override;

  absl::Status Init();

  absl::StatusOr<PoolDescriptor> RegisterPool(KvStorage* pool) override;
  absl::StatusOr<void*> AllocatePoolMemory(size_t bytes) override;
  void ReleasePoolMemory(void* memory) override;
  absl::StatusOr<std::shared_ptr<Connection>> Connect(const PoolDescriptor& remote,
                                                      absl::Time deadline) override;
  void SetNotificationHandler(absl::AnyInvocable<void(Notification)> handler) override {
    absl::MutexLock lock(&handler_mu_);
    handler_ = std::move(handler);
  }
  const std::string& name() const override { return options_.name; }

  // Called by connections, from any thread.
  absl::Status StartWrite(const std::shared_ptr<ConnState>& conn, const WriteOp& op,
                          absl::Time deadline, DoneCallback done);
  absl::Status StartNotify(const std::shared_ptr<ConnState>& conn, std::string message,
                           absl::Time deadline, DoneCallback done);
  void Close(const std::shared_ptr<ConnState>& conn, absl::Status why);

 private:
  friend class UcxConnection;

  // Runs `task` on the progress thread.
  void Post(absl::AnyInvocable<void() &&> task);
  void Loop();
  void ExpireDeadlines();
  // Ends an operation (once); false when it had ended already.
  bool Finish(ConnState* conn, uint64_t op_id, absl::Status status);
  // Closes `conn` and ends every operation on it: `expired` with DEADLINE_EXCEEDED (when set),
  // the others with `why`.
  void Break(ConnState* conn, absl::Status why, std::optional<uint64_t> expired = std::nullopt);
  ConnState* Find(uint64_t conn_id);
  uint64_t AddOp(ConnState* conn, Op op);
  void IssueWrite(ConnState* conn, const WriteOp& op, uint64_t op_id);
  // Flushes the endpoint; Flushed() runs when every earlier operation on it is complete.
  void Flush(ConnState* conn, uint64_t op_id);
  void Flushed(ConnState* conn, uint64_t op_id);
  void SendAm(ucp_ep_h ep, unsigned id, std::string payload, ConnState* conn, uint64_t op_id,
              bool want_reply);
  void OnWelcome(const char* data, size_t length);
  void OnHello(const char* data, size_t length, ucp_ep_h reply_ep);
  void OnNotify(const char* data, size_t length, ucp_ep_h reply_ep);
  void OnAck(const char* data, size_t length);

  template <unsigned kId>
  static ucs_status_t AmCallback(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  ConnState* FindOp(uint64_t op_id);
  static void SendDone(void* request, ucs_status_t status, void* user_data);
  static void FlushDone(void* request, ucs_status_t status, void* user_data);
  static void EpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const UcxOptions options_;
  std::shared_ptr<Liveness> live_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;  // encoded
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex handler_mu_;
  absl::AnyInvocable<void(Notification)> handler_ ABSL_GUARDED_BY(handler_mu_);

  // The registered pool (set once, before any connection).
  absl::Mutex pool_mu_;
  KvStorage* pool_ ABSL_GUARDED_BY(pool_mu_) = nullptr;
  ucp_mem_h memh_ = nullptr;
  uint64_t epoch_ = 0;
  // Memory UCX allocated for the pool (AllocatePoolMemory), already mapped.
  void* allocated_ = nullptr;
  ucp_mem_h allocated_memh_ = nullptr;

  // Progress-thread state.
  absl::flat_hash_map<uint64_t, std::shared_ptr<ConnState>> conns_;
  uint64_t next_conn_id_ = 1;
  uint64_t next_op_id_ = 1;
  // UCX requests still in flight, deleted when they complete or after the worker is destroyed
  // (a flush to a dead shared-memory peer never completes).
  absl::flat_hash_set<RequestContext*> contexts_;
  RequestContext* NewContext(uint64_t conn_id, uint64_t op_id, std::string buffer);
  void DeleteContext(RequestContext* ctx);
  struct Closing {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    bool force;
  };
  std::vector<Closing> closing_;
  void CloseEndpoints();
};

class UcxConnection final : public Connection {
 public:
  UcxConnection(std::shared_ptr<Liveness> live, std::shared_ptr<ConnState> state)
      : live_(std::move(live)), state_(std::move(state)) {}
  ~UcxConnection() override { Cancel(); }

  absl::Status Write(const WriteOp& op, absl::Time deadline, DoneCallback done) override {
    absl::ReaderMutexLock lock(&live_->mu);
    if (live_->transport == nullptr) return Gone();
    return live_->transport->StartWrite(state_, op, deadline, std::move(done));
  }
  absl::Status Notify(std::string message, absl::Time deadline, DoneCallback done) override {
    absl::ReaderMutexLock lock(&live_->mu);
    if (live_->transport == nullptr) return Gone();
    return live_->transport->StartNotify(state_, std::move(message), deadline, std::move(done));
  }
  void Cancel() override {
    absl::ReaderMutexLock lock(&live_->mu);
    if (live_->transport != nullptr) {
      live_->transport->Close(state_, absl::CancelledError("cancelled"));
    }
  }
  std::string Describe() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->describe;
  }

 private:
  static absl::Status Gone() { return absl::UnavailableError("the transport was shut down"); }
  const std::shared_ptr<Liveness> live_;
  const std::shared_ptr<ConnState> state_;
};

absl::Status UcxTransport::Init() {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("UCX configuration: ", UcxError(s)));
  }
  if (!options_.transports.empty()) {
    if (ucs_status_t s = ucp_config_modify(config, "TLS", options_.transports.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX transports '", options_.transports, "': ", UcxError(s)));
    }
  }
  const std::string keepalive =
      absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive_interval), "ms");
  ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str());  // best effort

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return absl::UnavailableError(absl::StrCat("ucp_init: ", UcxError(s)));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  wp.name = options_.name.c_str();
  if ((s = ucp_worker_create(context_, &wp, &worker_)) != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_worker_create: ", UcxError(s)));
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if ((s = ucp_worker_get_address(worker_, &address, &length)) != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_worker_get_address: ", UcxError(s)));
  }
  address_ = EncodeAddress(address, length);
  ucp_worker_release_address(worker_, address);
  if ((s = ucp_worker_get_efd(worker_, &worker_fd_)) != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucp_worker_get_efd: ", UcxError(s)));
  }
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kAmHello, &UcxTransport::AmCallback<kAmHello>},
      {kAmWelcome, &UcxTransport::AmCallback<kAmWelcome>},
      {kAmNotify, &UcxTransport::AmCallback<kAmNotify>},
      {kAmAck, &UcxTransport::AmCallback<kAmAck>}};
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = cb;
    hp.arg = this;
    if ((s = ucp_worker_set_am_recv_handler(worker_, &hp)) != UCS_OK) {
      return absl::UnavailableError(absl::StrCat("ucp_worker_set_am_recv_handler: ", UcxError(s)));
    }
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  thread_ = std::thread([this] { Loop(); });
  LOG(INFO) << "kvtransfer " << options_.name << ": UCX "
            << UCP_API_MAJOR << "." << UCP_API_MINOR << " ready (transports: "
            << (!options_.transports.empty()                  ? options_.transports
                : std::getenv("UCX_TLS") != nullptr           ? std::getenv("UCX_TLS")
                                                              : "UCX default")
            << ")";
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  {
    // Connections still held elsewhere fail from now on instead of reaching a dead transport.
    absl::MutexLock lock(&live_->mu);
    live_->transport = nullptr;
  }
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (memh_ != nullptr && memh_ != allocated_memh_) ucp_mem_unmap(context_, memh_);
  if (allocated_memh_ != nullptr) ucp_mem_unmap(context_, allocated_memh_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  for (RequestContext* ctx : contexts_) delete ctx;
  contexts_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxTransport::Post(absl::AnyInvocable<void() &&> task) {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = tasks_.empty();
    tasks_.push_back(std::move(task));
  }
  // Only the first task since the loop last took the queue wakes it: the ones after it will be
  // taken by the same swap (the loop takes the queue after it drains the eventfd), so a burst of
  // posts (a layer's writes, then the notification) costs one wake-up, not one each.
  if (!first) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void UcxTransport::Loop() {
  while (true) {
    std::deque<absl::AnyInvocable<void() &&>> tasks;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      tasks.swap(tasks_);
      stopping = stopping_;
    }
    for (auto& task : tasks) std::move(task)();
    if (stopping) break;
    while (ucp_worker_progress(worker_) != 0) {
    }
    ExpireDeadlines();
    CloseEndpoints();
    // Sleep until UCX or a caller has something, or the next deadline (at most 50 ms).
    absl::Time wake = absl::Now() + absl::Milliseconds(50);
    for (const auto& [id, conn] : conns_) {
      for (const auto& [op_id, op] : conn->ops) wake = std::min(wake, op.deadline);
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) {
      // UCX holds work it could not post (e.g. a full shared-memory queue to the peer): let the
      // peer's progress thread, perhaps on this core, drain it instead of spinning.
      sched_yield();
      continue;
    }
    pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - absl::Now()) + 1);
    poll(fds, 2, static_cast<int>(ms));
    if (fds[1].revents & POLLIN) {
      uint64_t drained;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
  }
  // Shutting down: every connection ends; UCX completes what it can.
  std::vector<std::shared_ptr<ConnState>> all;
  for (auto& [id, conn] : conns_) all.push_back(conn);
  for (auto& conn : all) Break(conn.get(), absl::CancelledError("the transport is shutting down"));
  CloseEndpoints();
  for (int i = 0; i < 100 && ucp_worker_progress(worker_) != 0; ++i) {
  }
  conns_.clear();
}

void UcxTransport::CloseEndpoints() {
  std::vector<Closing> closing;
  closing.swap(closing_);
  for (const Closing& c : closing) {
    if (c.rkey != nullptr) ucp_rkey_destroy(c.rkey);
    if (c.ep == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // Forced where UCX allows it (peer error mode): what is still queued is dropped. Without it
    // (shared memory) puts were done by this CPU inside ucp_put_nbx, so nothing is queued.
    p.flags = c.force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(c.ep, &p);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
  }
}

RequestContext* UcxTransport::NewContext(uint64_t conn_id, uint64_t op_id, std::string buffer) {
  auto* ctx = new RequestContext{this, conn_id, op_id, std::move(buffer)};
  contexts_.insert(ctx);
  return ctx;
}

void UcxTransport::DeleteContext(RequestContext* ctx) {
  contexts_.erase(ctx);
  delete ctx;
}

ConnState* UcxTransport::Find(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  return it == conns_.end() ? nullptr : it->second.get();
}

uint64_t UcxTransport::AddOp(ConnState* conn, Op op) {
  const uint64_t id = next_op_id_++;
  conn->ops.emplace(id, std::move(op));
  return id;
}

bool UcxTransport::Finish(ConnState* conn, uint64_t op_id, absl::Status status) {
  auto it = conn->ops.find(op_id);
  if (it == conn->ops.end()) return false;
  DoneCallback done = std::move(it->second.done);
  conn->ops.erase(it);
  if (done) std::move(done)(std::move(status));
  return true;
}

void UcxTransport::Break(ConnState* conn, absl::Status why, std::optional<uint64_t> expired) {
  if (!conn->closed) {
    conn->closed = true;
    conn->open = false;
    {
      absl::MutexLock lock(&conn->mu);
      conn->usable = false;
    }
    // UCX objects are released outside UCX callbacks, after the current progress call.
    closing_.push_back({conn->ep, conn->rkey, conn->peer_errors});
    conn->ep = nullptr;
    conn->rkey = nullptr;
    LOG(INFO) << "kvtransfer " << options_.name << ": connection to " << conn->peer
              << " closed: " << why;
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, op] : conn->ops) ids.push_back(id);
  for (uint64_t id : ids) {
    if (expired.has_value() && id == *expired) {
      Finish(conn, id, absl::DeadlineExceededError(absl::StrCat(
                           "kvtransfer to ", conn->peer, ": the operation's deadline passed")));
    } else {
      Finish(conn, id, why);
    }
  }
  conns_.erase(conn->id);  // may destroy `conn` when no UcxConnection holds it
}

void UcxTransport::ExpireDeadlines() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<std::shared_ptr<ConnState>, uint64_t>> expired;
  for (const auto& [id, conn] : conns_) {
    for (const auto& [op_id, op] : conn->ops) {
      if (op.deadline < now) {
        expired.emplace_back(conn, op_id);
        break;
      }
    }
  }
  for (auto& [conn, op_id] : expired) {
    Break(conn.get(),
          absl::UnavailableError(absl::StrCat("kvtransfer to ", conn->peer,
                                              ": closed after another operation's deadline")),
          op_id);
  }
}

// A pool is written remotely, never read remotely: a key holder on a transport whose hardware
// checks access (RDMA verbs) cannot read the blocks with it. (Software-emulated RMA over TCP and
// shared memory ignore this; docs/security.md, "The KV path".)
constexpr unsigned kPoolProtection =
    UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_WRITE;

absl::StatusOr<void*> UcxTransport::AllocatePoolMemory(size_t bytes) {
  absl::MutexLock lock(&pool_mu_);
  if (allocated_ != nullptr) {
    return absl::FailedPreconditionError("the pool memory is allocated already");
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE | UCP_MEM_MAP_PARAM_FIELD_PROT;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  mp.prot = kPoolProtection;
  mp.memory_type = options_.memory_kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                             : UCS_MEMORY_TYPE_HOST;
  if (ucs_status_t s = ucp_mem_map(context_, &mp, &allocated_memh_); s != UCS_OK) {
    allocated_memh_ = nullptr;
    return absl::UnimplementedError(absl::StrCat("UCX cannot allocate the pool: ", UcxError(s)));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(allocated_memh_, &attr); s != UCS_OK || attr.length < bytes ||
                                                              reinterpret_cast<uintptr_t>(attr.address) % 64 != 0) {
    ucp_mem_unmap(context_, allocated_memh_);
    allocated_memh_ = nullptr;
    return absl::UnimplementedError("UCX allocated unusable pool memory");
  }
  allocated_ = attr.address;
  LOG(INFO) << "kvtransfer " << options_.name << ": the KV pool (" << (bytes >> 20)
            << " MiB) lives in memory UCX allocated, which peers on this host map directly";
  return allocated_;
}

void UcxTransport::ReleasePoolMemory(void* memory) {
  absl::MutexLock lock(&pool_mu_);
  if (memory != allocated_ || allocated_ == nullptr) return;
  if (memh_ == allocated_memh_) memh_ = nullptr;
  ucp_mem_unmap(context_, allocated_memh_);
  allocated_memh_ = nullptr;
  allocated_ = nullptr;
}

absl::StatusOr<PoolDescriptor> UcxTransport::RegisterPool(KvStorage* pool) {
  absl::MutexLock lock(&pool_mu_);
  if (pool_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.name, ": a KV pool is registered already"));
  }
  const KvLayout& l = pool->layout();
  const size_t bytes = static_cast<size_t>(l.total_bytes());
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE | UCP_MEM_MAP_PARAM_FIELD_PROT;
  mp.prot = kPoolProtection;
  mp.address = pool->data<std::byte>();
  mp.length = bytes;
  mp.memory_type = options_.memory_kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                             : UCS_MEMORY_TYPE_HOST;
  // ucp_mem_map and ucp_rkey_pack are context-level calls, safe beside the worker's thread.
  if (pool->data<std::byte>() == allocated_) {
    memh_ = allocated_memh_;  // mapped when UCX allocated it
  } else if (ucs_status_t s = ucp_mem_map(context_, &mp, &memh_); s != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("registering the KV pool (", bytes >> 20,
                                               " MiB) with UCX: ", UcxError(s)));
  }
  void* rkey = nullptr;
  size_t rkey_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, memh_, &rkey, &rkey_size); s != UCS_OK) {
    if (memh_ != allocated_memh_) ucp_mem_unmap(context_, memh_);
    memh_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucp_rkey_pack: ", UcxError(s)));
  }
  std::string packed(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  pool_ = pool;
  epoch_ = std::max(epoch_ + 1, NowMicros());  // grows with every registration and restart
  return PoolDescriptor{
      .transport = "ucx",
      .address = address_,
      .regions = {{.base_address = reinterpret_cast<uint64_t>(pool->data<std::byte>()),
                   .length = bytes,
                   .remote_key = std::move(packed),
                   .kind = options_.memory_kind,
                   .device_index = options_.device_index}},
      .layout = l,
      .pool_epoch = epoch_};
}

absl::StatusOr<std::shared_ptr<Connection>> UcxTransport::Connect(const PoolDescriptor& remote,
                                                                  absl::Time deadline) {
  if (remote.transport != "ucx") {
    return absl::InvalidArgumentError(
        absl::StrCat("a descriptor of transport '", remote.transport, "' given to UCX"));
  }
  if (absl::Status s = ValidateDescriptor(remote); !s.ok()) return s;
  KvLayout local;
  {
    absl::MutexLock lock(&pool_mu_);
    if (pool_ == nullptr) return absl::FailedPreconditionError("register a pool before connecting");
    local = pool_->layout();
  }
  if (absl::Status s = CheckCompatibleLayouts(local, remote.layout); !s.ok()) return s;
  absl::StatusOr<std::string> ucx_address = DecodeAddress(remote.address);
  if (!ucx_address.ok()) return ucx_address.status();

  auto state = std::make_shared<ConnState>();
  state->remote_base = remote.regions[0].base_address;
  state->remote_epoch = remote.pool_epoch;
  state->remote_layout = remote.layout;
  state->peer = absl::StrCat("pool@", absl::Hex(state->remote_base));

  struct Waiter {
    absl::Notification ready;
    absl::Status status;
  };
  auto waiter = std::make_shared<Waiter>();
  Post([this, state, waiter, deadline, address = *std::move(ucx_address),
        rkey = remote.regions[0].remote_key]() mutable {
    state->id = next_conn_id_++;
    conns_.emplace(state->id, state);
    Op op{.kind = Op::Kind::kConnect,
          .deadline = deadline,
          .done = [waiter](absl::Status s) {
            waiter->status = std::move(s);
            waiter->ready.Notify();
          },
          .message = {}};
    const uint64_t op_id = AddOp(state.get(), std::move(op));
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxTransport::EpError;
    state->ep_context = {this, state->id};
    ep.err_handler.arg = &state->ep_context;
    ep.name = options_.name.c_str();
    ucs_status_t created = ucp_ep_create(worker_, &ep, &state->ep);
    state->peer_errors = created == UCS_OK;
    if (created == UCS_ERR_UNREACHABLE) {
      // The transports that reach this peer cannot report its failure (UCX 1.13's shared
      // memory): connect without, and rely on deadlines and acknowledgements.
      ep.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
      created = ucp_ep_create(worker_, &ep, &state->ep);
    }
    if (ucs_status_t s = created; s != UCS_OK) {
      state->ep = nullptr;
      return Break(state.get(), absl::UnavailableError(
                                    absl::StrCat("cannot reach the peer: ", UcxError(s))));
    }
    if (ucs_status_t s = ucp_ep_rkey_unpack(state->ep, rkey.data(), &state->rkey); s != UCS_OK) {
      state->rkey = nullptr;
      return Break(state.get(), absl::InvalidArgumentError(absl::StrCat(
                                    "the descriptor's remote key is unusable: ", UcxError(s))));
    }
    std::string hello;
    Put(&hello, op_id);
    Put(&hello, state->remote_epoch);
    Put(&hello, state->remote_base);
    hello += options_.name;
    SendAm(state->ep, kAmHello, std::move(hello), state.get(), op_id, /*want_reply=*/true);
  });
  waiter->ready.WaitForNotification();
  if (!waiter->status.ok()) return waiter->status;
  return std::make_shared<UcxConnection>(live_, std::move(state));
}

absl::Status UcxTransport::StartWrite(const std::shared_ptr<ConnState>& conn, const WriteOp& op,
                                      absl::Time deadline, DoneCallback done) {
  {
    absl::MutexLock lock(&conn->mu);
    if (!conn->usable) return absl::UnavailableError("the connection is closed");
  }
  KvLayout local;
  {
    absl::MutexLock lock(&pool_mu_);
    local = pool_->layout();
  }
  if (absl::Status s = ValidateWrite(op, local, conn->remote_layout); !s.ok()) return s;
  Post([this, conn, op, deadline, done = std::move(done)]() mutable {
    if (conn->closed) {
      return std::move(done)(absl::UnavailableError("the connection is closed"));
    }
    const uint64_t op_id = AddOp(conn.get(), Op{.kind = Op::Kind::kWrite,
                                                .deadline = deadline,
                                                .done = std::move(done),
                                                .message = {}});
    IssueWrite(conn.get(), op, op_id);
  });
  return absl::OkStatus();
}

void UcxTransport::IssueWrite(ConnState* conn, const WriteOp& op, uint64_t op_id) {
  KvStorage* pool;
  {
    absl::MutexLock lock(&pool_mu_);
    pool = pool_;
  }
  const KvLayout& l = pool->layout();
  const uint64_t block_bytes = static_cast<uint64_t>(l.block_bytes());
  const uint64_t block_stride = static_cast<uint64_t>(l.block_stride_bytes());
  const size_t length = static_cast<size_t>(op.num_layers) * block_bytes;
  const char* local = reinterpret_cast<const char*>(pool->data<std::byte>());
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  p.memh = memh_;
  // Layers [first, first + n) of one block are contiguous on both sides: one put per block.
  for (const BlockPair& b : op.blocks) {
    const uint64_t src = static_cast<uint64_t>(b.src) * block_stride +
                         static_cast<uint64_t>(op.first_layer) * block_bytes;
    const uint64_t dst = conn->remote_base + static_cast<uint64_t>(b.dst) * block_stride +
                         static_cast<uint64_t>(op.first_layer) * block_bytes;
    ucs_status_ptr_t r = ucp_put_nbx(conn->ep, local + src, length, dst, conn->rkey, &p);
    if (UCS_PTR_IS_ERR(r)) {
      return Break(conn, absl::UnavailableError(absl::StrCat(
                             "kvtransfer to ", conn->peer, ": put failed: ",
                             UcxError(UCS_PTR_STATUS(r)))));
    }
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // released by UCX once complete
  }
  Flush(conn, op_id);
}

void UcxTransport::Flush(ConnState* conn, uint64_t op_id) {
  RequestContext* ctx = NewContext(conn->id, op_id, {});
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxTransport::FlushDone;
  p.user_data = ctx;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(conn->ep, &p);
  if (UCS_PTR_IS_PTR(r)) return;  // FlushDone follows
  ctx->transport->DeleteContext(ctx);
  if (UCS_PTR_IS_ERR(r)) {
    return Break(conn, absl::UnavailableError(absl::StrCat(
                           "kvtransfer to ", conn->peer, ": flush failed: ",
                           UcxError(UCS_PTR_STATUS(r)))));
  }
  Flushed(conn, op_id);
}

void UcxTransport::FlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<RequestContext*>(user_data);
  UcxTransport* self = ctx->transport;
  ConnState* conn = self->Find(ctx->conn_id);
  if (conn != nullptr) {
    if (status != UCS_OK) {
      self->Break(conn, absl::UnavailableError(absl::StrCat("kvtransfer to ", conn->peer,
                                                            ": ", UcxError(status))));
    } else {
      self->Flushed(conn, ctx->op_id);
    }
  }
  ctx->transport->DeleteContext(ctx);
  ucp_request_free(request);
}

void UcxTransport::Flushed(ConnState* conn, uint64_t op_id) {
  auto it = conn->ops.find(op_id);
  if (it == conn->ops.end()) return;
  if (it->second.kind == Op::Kind::kWrite) {
    Finish(conn, op_id, absl::OkStatus());
    return;
  }
  // A notification: every earlier write is in place, so it may go now. It ends when the owner
  // acknowledges it.
  std::string payload;
  Put(&payload, op_id);
  const uint32_t name_len = static_cast<uint32_t>(options_.name.size());
  Put(&payload, name_len);
  payload += options_.name;
  payload += it->second.message;
  it->second.message.clear();
  SendAm(conn->ep, kAmNotify, std::move(payload), conn, op_id, /*want_reply=*/true);
}

absl::Status UcxTransport::StartNotify(const std::shared_ptr<ConnState>& conn, std::string message,
                                       absl::Time deadline, DoneCallback done) {
  if (message.size() > kMaxNotificationBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a notification of ", message.size(),
                                                   " bytes exceeds ", kMaxNotificationBytes));
  }
  {
    absl::MutexLock lock(&conn->mu);
    if (!conn->usable) return absl::UnavailableError("the connection is closed");
  }
  Post([this, conn, message = std::move(message), deadline, done = std::move(done)]() mutable {
    if (conn->closed) {
      return std::move(done)(absl::UnavailableError("the connection is closed"));
    }
    const uint64_t op_id = AddOp(conn.get(), Op{.kind = Op::Kind::kNotify,
                                                .deadline = deadline,
                                                .done = std::move(done),
                                                .message = std::move(message)});
    conn->notify_queue.push_back(op_id);
    if (conn->notify_queue.size() == 1) Flush(conn.get(), op_id);
  });
  return absl::OkStatus();
}

void UcxTransport::Close(const std::shared_ptr<ConnState>& conn, absl::Status why) {
  {
    absl::MutexLock lock(&conn->mu);
    if (!conn->usable) return;
    conn->usable = false;
  }
  Post([this, conn, why = std::move(why)]() mutable {
    if (!conn->closed) Break(conn.get(), std::move(why));
  });
}

void UcxTransport::SendAm(ucp_ep_h ep, unsigned id, std::string payload, ConnState* conn,
                          uint64_t op_id, bool want_reply) {
  RequestContext* ctx = NewContext(conn != nullptr ? conn->id : 0, op_id, std::move(payload));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER | (want_reply ? UCP_AM_SEND_FLAG_REPLY : 0);
  p.cb.send = &UcxTransport::SendDone;
  p.user_data = ctx;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ep, id, nullptr, 0, ctx->buffer.data(), ctx->buffer.size(), &p);
  if (UCS_PTR_IS_PTR(r)) return;  // SendDone follows
  const ucs_status_t status = UCS_PTR_STATUS(r);
  ctx->transport->DeleteContext(ctx);
  if (status != UCS_OK && conn != nullptr) {
    Break(conn, absl::UnavailableError(
                    absl::StrCat("kvtransfer to ", conn->peer, ": send failed: ", UcxError(status))));
  }
}

void UcxTransport::SendDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<RequestContext*>(user_data);
  if (status != UCS_OK && ctx->conn_id != 0) {
    if (ConnState* conn = ctx->transport->Find(ctx->conn_id); conn != nullptr) {
      ctx->transport->Break(conn, absl::UnavailableError(absl::StrCat(
                                      "kvtransfer to ", conn->peer, ": send failed: ",
                                      UcxError(status))));
    }
  }
  ctx->transport->DeleteContext(ctx);
  ucp_request_free(request);
}

void UcxTransport::EpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ctx = static_cast<ConnState::EpContext*>(arg);
  if (ConnState* conn = ctx->transport->Find(ctx->conn_id); conn != nullptr) {
    ctx->transport->Break(conn, absl::UnavailableError(absl::StrCat(
                                    "kvtransfer to ", conn->peer, ": the peer failed (",
                                    UcxError(status), ")")));
  }
}

template <unsigned kId>
ucs_status_t UcxTransport::AmCallback(void* arg, const void* /*header*/, size_t /*header_length*/,
                                      void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    LOG(ERROR) << "kvtransfer " << self->options_.name
               << ": a rendezvous active message was dropped (this protocol sends eager only)";
    return UCS_OK;
  }
  const char* bytes = static_cast<const char*>(data);
  const ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  switch (kId) {
    case kAmHello:
      if (reply_ep != nullptr) self->OnHello(bytes, length, reply_ep);
      break;
    case kAmWelcome:
      self->OnWelcome(bytes, length);
      break;
    case kAmNotify:
      if (reply_ep != nullptr) self->OnNotify(bytes, length, reply_ep);
      break;
    case kAmAck:
      self->OnAck(bytes, length);
      break;
  }
  return UCS_OK;
}

ConnState* UcxTransport::FindOp(uint64_t op_id) {
  for (auto& [id, conn] : conns_) {
    if (conn->ops.contains(op_id)) return conn.get();
  }
  return nullptr;
}

void UcxTransport::OnHello(const char* data, size_t length, ucp_ep_h reply_ep) {
  size_t offset = 0;
  uint64_t connect_id, expected_epoch, expected_base;
  if (!Get(data, length, &offset, &connect_id) || !Get(data, length, &offset, &expected_epoch) ||
      !Get(data, length, &offset, &expected_base)) {
    LOG(WARNING) << "kvtransfer " << options_.name << ": a malformed hello was ignored";
    return;
  }
  const std::string writer(data + offset, length - offset);
  uint64_t base = 0, blocks = 0, epoch = 0;
  {
    absl::MutexLock lock(&pool_mu_);
    if (pool_ != nullptr) {
      base = reinterpret_cast<uint64_t>(pool_->data<std::byte>());
      blocks = static_cast<uint64_t>(pool_->layout().num_blocks);
      epoch = epoch_;
    }
  }
  std::string welcome;
  Put(&welcome, connect_id);
  Put(&welcome, epoch);
  Put(&welcome, base);
  Put(&welcome, blocks);
  // Answered from inside the callback: the reply endpoint is only known to be valid here (UCX
  // frees it once the writer goes away).
  SendAm(reply_ep, kAmWelcome, std::move(welcome), nullptr, 0, false);
  LOG(INFO) << "kvtransfer " << options_.name << ": writer " << writer << " connected"
            << (expected_epoch != epoch ? " with a stale descriptor" : "");
}

void UcxTransport::OnWelcome(const char* data, size_t length) {
  size_t offset = 0;
  uint64_t connect_id, epoch, base, blocks;
  if (!Get(data, length, &offset, &connect_id) || !Get(data, length, &offset, &epoch) ||
      !Get(data, length, &offset, &base) || !Get(data, length, &offset, &blocks)) {
    return;
  }
  ConnState* conn = FindOp(connect_id);
  if (conn == nullptr) return;  // timed out meanwhile
  if (epoch != conn->remote_epoch || base != conn->remote_base ||
      static_cast<int64_t>(blocks) != conn->remote_layout.num_blocks) {
    return Break(conn, absl::FailedPreconditionError(absl::StrCat(
                           "the descriptor is stale: the pool now has epoch ", epoch,
                           " at 0x", absl::Hex(base), " (", blocks, " blocks); the descriptor has ",
                           conn->remote_epoch, " at 0x", absl::Hex(conn->remote_base), " (",
                           conn->remote_layout.num_blocks, " blocks)")));
  }
  conn->open = true;
  const std::vector<std::string> lanes = LaneTransports(EndpointInfo(conn->ep));
  const std::string describe = absl::StrCat("ucx: ", absl::StrJoin(lanes, ", "));
  {
    absl::MutexLock lock(&conn->mu);
    conn->describe = describe;
  }
  const char* env = std::getenv("UCX_TLS");
  const std::string requested = !options_.transports.empty() ? options_.transports
                                : env != nullptr             ? env
                                                             : "";
  if (FellBackToTcp(lanes, requested)) {
    LOG(WARNING) << "kvtransfer " << options_.name << ": the connection to " << conn->peer
                 << " runs over TCP only (" << describe << ") although UCX_TLS=" << requested
                 << " asked for faster transports; KV transfers will be slow";
  } else {
    LOG(INFO) << "kvtransfer " << options_.name << ": connected to " << conn->peer << " ("
              << describe << ")";
  }
  Finish(conn, connect_id, absl::OkStatus());
}

void UcxTransport::OnNotify(const char* data, size_t length, ucp_ep_h reply_ep) {
  size_t offset = 0;
  uint64_t notify_id;
  uint32_t name_len;
  if (!Get(data, length, &offset, &notify_id) || !Get(data, length, &offset, &name_len) ||
      offset + name_len > length) {
    LOG(WARNING) << "kvtransfer " << options_.name << ": a malformed notification was ignored";
    return;
  }
  Notification n{.peer = std::string(data + offset, name_len),
                 .message = std::string(data + offset + name_len, length - offset - name_len)};
  {
    absl::MutexLock lock(&handler_mu_);
    if (handler_) handler_(std::move(n));
  }
  std::string ack;
  Put(&ack, notify_id);
  SendAm(reply_ep, kAmAck, std::move(ack), nullptr, 0, false);
}

void UcxTransport::OnAck(const char* data, size_t length) {
  size_t offset = 0;
  uint64_t notify_id;
  if (!Get(data, length, &offset, &notify_id)) return;
  ConnState* conn = FindOp(notify_id);
  if (conn == nullptr) return;
  Finish(conn, notify_id, absl::OkStatus());
  // The next notification goes only now, after a flush of everything issued before it.
  if (!conn->notify_queue.empty() && conn->notify_queue.front() == notify_id) {
    conn->notify_queue.pop_front();
  }
  if (!conn->notify_queue.empty() && !conn->closed) Flush(conn, conn->notify_queue.front());
}

std::string EndpointInfo(ucp_ep_h ep) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buffer, &size);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string info(buffer, size);
  std::free(buffer);
  return info;
}

}  // namespace

std::vector<std::string> LaneTransports(const std::string& ep_info) {
  std::vector<std::string> lanes;
  for (absl::string_view line : absl::StrSplit(ep_info, '\n')) {
    if (!absl::StrContains(line, "lane[")) continue;
    // "#                lane[0]:  8:posix/memory.0 md[4]           <proxy> rma_bw#0 am am_bw#0"
    for (absl::string_view word : absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      const size_t slash = word.find('/');
      if (slash == absl::string_view::npos || slash == 0) continue;
      absl::string_view tl = word;
      if (const size_t colon = tl.find(':'); colon != absl::string_view::npos) tl.remove_prefix(colon + 1);
      if (const size_t dot = tl.rfind('.'); dot != absl::string_view::npos && dot > tl.find('/')) {
        tl = tl.substr(0, dot);
      }
      const std::string name(tl);
      if (std::find(lanes.begin(), lanes.end(), name) == lanes.end()) lanes.push_back(name);
      break;
    }
  }
  return lanes;
}

bool FellBackToTcp(const std::vector<std::string>& lanes, const std::string& requested) {
  if (lanes.empty()) return false;
  for (const std::string& lane : lanes) {
    if (!absl::StartsWith(lane, "tcp/") && !absl::StartsWith(lane, "self/")) return false;
  }
  // Only TCP carries data. That is a fallback when something other than TCP was asked for
  // (UCX's default "all" counts: on one host it would pick shared memory).
  if (requested.empty() || requested == "all") return true;
  for (absl::string_view t : absl::StrSplit(requested, ',', absl::SkipEmpty())) {
    if (t != "tcp" && t != "self" && t != "^tcp") return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(const UcxOptions& options) {
  auto transport = std::make_unique<UcxTransport>(options);
  if (absl::Status s = transport->Init(); !s.ok()) return s;
  return transport;
}

}  // namespace tandem::kvtransfer
