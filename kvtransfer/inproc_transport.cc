#include "kvtransfer/inproc_transport.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kvtransfer {
namespace {

// Runs tasks one at a time, in order, on its own thread.
class TaskThread {
 public:
  TaskThread() : state_(std::make_shared<State>()), thread_([state = state_] { Loop(*state); }) {}
  ~TaskThread() {
    {
      absl::MutexLock lock(&state_->mu);
      state_->stop = true;
    }
    // The last owner may be a task running on this very thread: it cannot join itself. The
    // thread then runs what is left and ends on its own, keeping alive the state it shares (it
    // used to read this object's members after it was freed; found by ASan in
    // prefill_service_test).
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void Post(absl::AnyInvocable<void() &&> task) {
    absl::MutexLock lock(&state_->mu);
    state_->tasks.push_back(std::move(task));
  }

 private:
  struct State {
    absl::Mutex mu;
    std::deque<absl::AnyInvocable<void() &&>> tasks ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
  };

  static void Loop(State& s) {
    while (true) {
      absl::AnyInvocable<void() &&> task;
      {
        absl::MutexLock lock(&s.mu);
        s.mu.Await(absl::Condition(
            +[](State* state) { return state->stop || !state->tasks.empty(); }, &s));
        if (s.tasks.empty()) return;  // stopping, and nothing left to run
        task = std::move(s.tasks.front());
        s.tasks.pop_front();
      }
      std::move(task)();
    }
  }

  const std::shared_ptr<State> state_;  // before thread_, which shares it
  std::thread thread_;
};
// What writers reach of an owner. Lives as long as any connection holds it; `pool` is cleared when
// the owner goes away.
struct Owner {
  absl::Mutex mu;
  KvStorage* pool ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  absl::AnyInvocable<void(Notification)> handler ABSL_GUARDED_BY(mu);
  TaskThread* thread ABSL_GUARDED_BY(mu) = nullptr;
};

absl::Mutex registry_mu(absl::kConstInit);
absl::flat_hash_map<std::string, std::weak_ptr<Owner>>& Registry() {
  static auto* registry = new absl::flat_hash_map<std::string, std::weak_ptr<Owner>>();
  return *registry;
}

class InProcessConnection : public Connection,
                            public std::enable_shared_from_this<InProcessConnection> {
 public:
  InProcessConnection(std::string name, KvStorage* local, std::shared_ptr<Owner> owner,
                      KvLayout remote_layout, std::shared_ptr<TaskThread> thread)
      : name_(std::move(name)),
        local_(local),
        owner_(std::move(owner)),
        remote_layout_(remote_layout),
        thread_(std::move(thread)) {}

  absl::Status Write(const WriteOp& op, absl::Time deadline, DoneCallback done) override {
    // Only a cancelled connection refuses at once. One closed by a passed deadline ends what comes
    // after in issue order (Check), so an operation's outcome never depends on how far the
    // transport's thread has got.
    if (state_.load() == kCancelled) return absl::UnavailableError("the connection is closed");
    if (absl::Status s = ValidateWrite(op, local_->layout(), remote_layout_); !s.ok()) return s;
    thread_->Post([self = shared_from_this(), op, deadline, done = std::move(done)]() mutable {
      std::move(done)(self->Copy(op, deadline));
    });
    return absl::OkStatus();
  }

  absl::Status Notify(std::string message, absl::Time deadline, DoneCallback done) override {
    // Only a cancelled connection refuses at once. One closed by a passed deadline ends what comes
    // after in issue order (Check), so an operation's outcome never depends on how far the
    // transport's thread has got.
    if (state_.load() == kCancelled) return absl::UnavailableError("the connection is closed");
    if (message.size() > kMaxNotificationBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a notification of ", message.size(),
                                                     " bytes exceeds ", kMaxNotificationBytes));
    }
    thread_->Post([this, self = shared_from_this(), message = std::move(message), deadline,
                   done = std::move(done)]() mutable {
      if (absl::Status s = Check(deadline); !s.ok()) return std::move(done)(s);
      absl::MutexLock lock(&owner_->mu);
      if (owner_->pool == nullptr || owner_->thread == nullptr) {
        return std::move(done)(absl::UnavailableError("the peer went away"));
      }
      owner_->thread->Post([owner = owner_, n = Notification{name_, std::move(message)}]() mutable {
        absl::MutexLock lock(&owner->mu);
        if (owner->handler) owner->handler(std::move(n));
      });
      std::move(done)(absl::OkStatus());
    });
    return absl::OkStatus();
  }

  void Cancel() override {
    int open = kOpen;
    state_.compare_exchange_strong(open, kCancelled);
  }
  std::string Describe() const override { return "inproc (memcpy)"; }

 private:
  absl::Status Copy(const WriteOp& op, absl::Time deadline) {
    if (absl::Status s = Check(deadline); !s.ok()) return s;
    absl::MutexLock lock(&owner_->mu);
    if (owner_->pool == nullptr) return absl::UnavailableError("the peer went away");
    const KvLayout& l = local_->layout();
    const size_t bytes = static_cast<size_t>(l.block_bytes());
    for (const BlockPair& p : op.blocks) {
      for (int32_t layer = op.first_layer; layer < op.first_layer + op.num_layers; ++layer) {
        std::memcpy(owner_->pool->KeyBlock<std::byte>(p.dst, layer),
                    local_->KeyBlock<std::byte>(p.src, layer), bytes);
      }
    }
    return absl::OkStatus();
  }

  const std::string name_;
  KvStorage* const local_;
  const std::shared_ptr<Owner> owner_;
  const KvLayout remote_layout_;
  const std::shared_ptr<TaskThread> thread_;
  // As UCX: an operation past its deadline ends with DEADLINE_EXCEEDED and closes the
  // connection; what comes after ends with UNAVAILABLE; Cancel ends the rest with CANCELLED.
  absl::Status Check(absl::Time deadline) {
    if (absl::Now() > deadline) {
      int open = kOpen;
      state_.compare_exchange_strong(open, kExpired);
      return absl::DeadlineExceededError("the operation's deadline passed");
    }
    switch (state_.load()) {
      case kCancelled:
        return absl::CancelledError("cancelled");
      case kExpired:
        return absl::UnavailableError("closed after another operation's deadline");
      default:
        return absl::OkStatus();
    }
  }
  static constexpr int kOpen = 0, kCancelled = 1, kExpired = 2;
  std::atomic<int> state_{kOpen};
};

class InProcessTransport : public KvTransport {
 public:
  explicit InProcessTransport(std::string name)
      : name_(std::move(name)),
        thread_(std::make_shared<TaskThread>()),
        owner_(std::make_shared<Owner>()) {}

  ~InProcessTransport() override {
    {
      absl::MutexLock lock(&registry_mu);
      Registry().erase(name_);
    }
    absl::MutexLock lock(&owner_->mu);
    owner_->pool = nullptr;
    owner_->thread = nullptr;
    owner_->handler = nullptr;
  }

  absl::StatusOr<PoolDescriptor> RegisterPool(KvStorage* pool) override {
    uint64_t epoch = 0;
    {
      absl::MutexLock lock(&owner_->mu);
      if (owner_->pool != nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(name_, ": a pool is registered already"));
      }
      owner_->pool = pool;
      owner_->thread = thread_.get();
      static std::atomic<uint64_t> epochs{0};
      owner_->epoch = ++epochs;  // grows with every registration in the process
      epoch = owner_->epoch;
    }
    {
      absl::MutexLock lock(&registry_mu);
      if (!Registry().try_emplace(name_, owner_).second) {
        absl::MutexLock owner_lock(&owner_->mu);
        owner_->pool = nullptr;
        return absl::AlreadyExistsError(absl::StrCat("in-process transport name ", name_,
                                                     " is in use"));
      }
    }
    local_ = pool;
    const KvLayout& l = pool->layout();
    return PoolDescriptor{
        .transport = "inproc",
        .address = name_,
        .regions = {{.base_address = reinterpret_cast<uint64_t>(pool->data<std::byte>()),
                     .length = static_cast<uint64_t>(l.total_bytes()),
                     .remote_key = "",
                     .kind = MemoryKind::kHost,
                     .device_index = 0}},
        .layout = l,
        .pool_epoch = epoch};
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const PoolDescriptor& remote,
                                                      absl::Time deadline) override {
    if (remote.transport != "inproc") {
      return absl::InvalidArgumentError(
          absl::StrCat("a descriptor of transport '", remote.transport, "' given to inproc"));
    }
    if (absl::Status s = ValidateDescriptor(remote); !s.ok()) return s;
    if (local_ == nullptr) {
      return absl::FailedPreconditionError("register a pool before connecting");
    }
    if (absl::Status s = CheckCompatibleLayouts(local_->layout(), remote.layout); !s.ok()) return s;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("connect deadline passed");
    std::shared_ptr<Owner> owner;
    {
      absl::MutexLock lock(&registry_mu);
      auto it = Registry().find(remote.address);
      if (it != Registry().end()) owner = it->second.lock();
    }
    if (owner == nullptr) {
      return absl::UnavailableError(absl::StrCat("no in-process pool '", remote.address, "'"));
    }
    {
      absl::MutexLock lock(&owner->mu);
      if (owner->pool == nullptr || owner->epoch != remote.pool_epoch ||
          reinterpret_cast<uint64_t>(owner->pool->data<std::byte>()) != remote.regions[0].base_address) {
        return absl::FailedPreconditionError(
            absl::StrCat("the descriptor of '", remote.address, "' is stale"));
      }
    }
    return std::make_shared<InProcessConnection>(name_, local_, std::move(owner), remote.layout,
                                                 thread_);
  }

  void SetNotificationHandler(absl::AnyInvocable<void(Notification)> handler) override {
    absl::MutexLock lock(&owner_->mu);
    owner_->handler = std::move(handler);
  }

  const std::string& name() const override { return name_; }

 private:
  const std::string name_;
  std::shared_ptr<TaskThread> thread_;
  std::shared_ptr<Owner> owner_;
  KvStorage* local_ = nullptr;
};

}  // namespace

std::unique_ptr<KvTransport> CreateInProcessTransport(const std::string& name) {
  return std::make_unique<InProcessTransport>(name);
}

}  // namespace tandem::kvtransfer
