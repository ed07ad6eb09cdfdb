// What the transport tests share: seeded pools, byte comparison of block layers, a callback that
// records how an operation ended, the two sides of a transfer, an owner's inbox, and the ways to
// hold operations back so that a test can end them while they are outstanding.
#ifndef TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_
#define TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer::testing {

inline constexpr absl::Duration kWait = absl::Seconds(10);  // bounds every wait; never reached when OK
// How late after a deadline an operation may end with its error.
inline constexpr absl::Duration kSlack = absl::Seconds(1);

// `blocks` blocks of `layers` layers, `block_size` tokens a block, 2 K/V heads of 8.
inline KvLayout Layout(int64_t blocks, int64_t layers = 4, int64_t block_size = 4) {
  return KvLayout{.num_blocks = blocks, .num_layers = layers, .block_size = block_size,
                  .num_kv_heads = 2, .head_dim = 8};
}

// Bytes of one layer of one block of Layout(blocks) (2 * 4 tokens * 2 heads * 8 * 4 bytes), the
// stride from a block to the next (its 4 layers), and where HostPool's region starts.
inline constexpr uint64_t kBlockBytes = 512;
inline constexpr uint64_t kBlockStrideBytes = 4 * kBlockBytes;
inline constexpr uint64_t kPoolBase = 0x7f0000200000;

// What a worker publishes for a host pool of Layout(blocks) at kPoolBase: one region, a remote
// key with a NUL and a 0xff byte in it.
inline PoolDescriptor HostPool(int64_t blocks, std::string address, uint64_t epoch) {
  return PoolDescriptor{.transport = "ucx",
                        .address = std::move(address),
                        .regions = {{.base_address = kPoolBase,
                                     .length = static_cast<uint64_t>(blocks) * kBlockStrideBytes,
                                     .remote_key = std::string("\x01\x00\xffkey", 6),
                                     .kind = MemoryKind::kHost,
                                     .device_index = 0}},
                        .layout = Layout(blocks),
                        .pool_epoch = epoch};
}

// A pool of `layout` filled with values drawn from `seed`.
inline std::unique_ptr<KvStorage> RandomPool(const KvLayout& layout, uint32_t seed) {
  auto pool = *KvStorage::Create(layout);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < layout.total_elements(); ++i) pool->data()[i] = dist(rng);
  return pool;
}

// Whether layers [first, first + n) of `src` in `from` equal those of `dst` in `to`.
inline bool SameLayers(KvStorage& from, int32_t src, KvStorage& to, int32_t dst, int64_t first,
                       int64_t n) {
  const size_t bytes = static_cast<size_t>(n * from.layout().layer_stride()) * sizeof(float);
  return std::memcmp(from.KeyBlock(src, first), to.KeyBlock(dst, first), bytes) == 0;
}

// The status an operation ended with, when, and how often its callback ran.
class Done {
 public:
  DoneCallback Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      ++calls_;
      status_ = std::move(s);
      when_ = absl::Now();
    };
  }
  // The status, after waiting (bounded) for the callback.
  absl::Status Wait(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(+[](int* calls) { return *calls > 0; }, &calls_),
                              timeout)) {
      return absl::InternalError("the operation did not end within the test's wait");
    }
    return status_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::Time when() {
    absl::MutexLock lock(&mu_);
    return when_;
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time when_ ABSL_GUARDED_BY(mu_);
};

// Writes `op` on `conn` and waits (bounded) for it to end: how it ended, or why it did not start.
inline absl::Status WriteAndWait(Connection& conn, const WriteOp& op) {
  Done done;
  if (absl::Status s = conn.Write(op, absl::Now() + kWait, done.Callback()); !s.ok()) return s;
  return done.Wait();
}

// An operation that must fail UNAVAILABLE: refused at once (`started`, and `done` never runs), or
// started and ended so by `done`.
inline void ExpectUnavailable(const absl::Status& started, Done& done) {
  if (started.ok()) {
    EXPECT_EQ(done.Wait().code(), absl::StatusCode::kUnavailable) << done.Wait();
  } else {
    EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
    EXPECT_EQ(done.calls(), 0);
  }
}

// One end of a transfer: a seeded pool registered with its transport.
struct Side {
  std::unique_ptr<KvStorage> pool;
  std::unique_ptr<KvTransport> transport;  // declared after the pool: destroyed before it
  PoolDescriptor descriptor;
};

inline Side MakeSide(std::unique_ptr<KvTransport> transport, const KvLayout& layout,
                     uint32_t seed) {
  Side side;
  side.pool = RandomPool(layout, seed);
  side.transport = std::move(transport);
  absl::StatusOr<PoolDescriptor> d = side.transport->RegisterPool(side.pool.get());
  CHECK(d.ok()) << d.status();
  side.descriptor = *std::move(d);
  return side;
}

// A test's connection. When the test lets go of it, it first waits (bounded) until no task of the
// writer's transport holds the connection any more, so that each test tears down in one order.
// (InProcessTransportDeathTest.DroppingEverythingWhileWritesAreQueuedIsSafe covers the other
// order: the last reference dying on the transport's thread.)
class Conn {
 public:
  explicit Conn(std::shared_ptr<Connection> c) : c_(std::move(c)) {}
  Conn(Conn&&) = default;
  Conn& operator=(Conn&&) = delete;
  ~Conn() { reset(); }

  Connection* operator->() const { return c_.get(); }
  Connection& operator*() const { return *c_; }
  bool operator==(std::nullptr_t) const { return c_ == nullptr; }
  void reset() {
    const absl::Time give_up = absl::Now() + kWait;
    while (c_.use_count() > 1 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    c_.reset();
  }

 private:
  std::shared_ptr<Connection> c_;
};

inline Conn MustConnect(Side& writer, const PoolDescriptor& remote) {
  absl::StatusOr<std::shared_ptr<Connection>> c =
      writer.transport->Connect(remote, absl::Now() + kWait);
  EXPECT_TRUE(c.ok()) << c.status();
  return Conn(c.ok() ? *std::move(c) : nullptr);
}

// Notifications received by an owner; optionally holds the owner's thread in its handler. Must be
// destroyed before the owner's transport.
class Inbox {
 public:
  explicit Inbox(KvTransport* owner) : owner_(owner) {
    owner->SetNotificationHandler([this](Notification n) { Add(std::move(n)); });
  }
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox() {
    Release();
    owner_->SetNotificationHandler(nullptr);
  }
  // The handler: keeps `n`, and waits while held.
  void Add(Notification n) {
    absl::MutexLock lock(&mu_);
    got_.push_back(std::move(n));
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_; };
    mu_.AwaitWithTimeout(absl::Condition(&released), kWait);
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  // The notifications, once there are at least `n` (bounded wait).
  std::vector<Notification> Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return got_;
  }

 private:
  KvTransport* const owner_;
  absl::Mutex mu_;
  std::vector<Notification> got_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
};

// Lets the owner's handler go and waits until the owner has answered everything it held: a
// notification on a fresh connection is acknowledged only after the earlier acknowledgements
// were sent. Tests that hold an owner's handler end with it, while the writer is still alive
// (OwnerSurvivesAWriterThatLeftBeforeItsAcknowledgement is why).
inline void SettleOwner(Side& writer, Side& owner, Inbox& inbox) {
  inbox.Release();
  Conn again = MustConnect(writer, owner.descriptor);
  ASSERT_NE(again, nullptr);
  Done note;
  ASSERT_TRUE(again->Notify("settle", absl::Now() + kWait, note.Callback()).ok());
  EXPECT_TRUE(note.Wait().ok()) << note.Wait();
}

// Holds back what a test issues on a connection after it, so that those operations are still
// outstanding when the test ends them (Cancel, a passed deadline). What can be held depends on
// how the transport queues its work, so each transport names the Stall that fits it. Destroying
// it lets everything go, and returns once the transport has answered all it held.
class Stall {
 public:
  virtual ~Stall() = default;
  // Whether writes are held too; else only notifications are, and a write may still end OK.
  virtual bool holds_writes() const = 0;
};

// Holds the writer's transport thread in the callback of a first write: for a transport that runs
// every operation on that thread in issue order (in-process), all that follows on the writer's
// connections waits, not started.
class WriterThreadStall : public Stall {
 public:
  explicit WriterThreadStall(Connection& conn) : state_(std::make_shared<State>()) {
    const absl::Status s = conn.Write(
        {.blocks = {{0, 0}}, .first_layer = 0, .num_layers = 1}, absl::Now() + kWait,
        [state = state_](absl::Status) {
          state->entered.Notify();
          state->release.WaitForNotificationWithTimeout(kWait);
          state->left.Notify();
        });
    EXPECT_TRUE(s.ok()) << s;
    if (s.ok()) {
      EXPECT_TRUE(state_->entered.WaitForNotificationWithTimeout(kWait));
    }
  }
  ~WriterThreadStall() override {
    state_->release.Notify();
    if (state_->entered.HasBeenNotified()) state_->left.WaitForNotificationWithTimeout(kWait);
  }
  bool holds_writes() const override { return true; }

 private:
  struct State {  // shared with the callback, which may outlive this object by a few instructions
    absl::Notification entered, release, left;
  };
  std::shared_ptr<State> state_;
};

// Holds the owner's notification handler on a first notification: for a transport that sends a
// connection's notifications one at a time, each after the owner acknowledged the one before
// (UCX), every later notification on the connection waits. The test must end the connection
// (which ends the first notification too) before it destroys the stall.
class OwnerHandlerStall : public Stall {
 public:
  OwnerHandlerStall(Side& owner, Side& writer, Connection& conn)
      : owner_(owner), writer_(writer), inbox_(owner.transport.get()) {
    inbox_.Hold();
    EXPECT_TRUE(conn.Notify("stall", absl::Now() + kWait, first_.Callback()).ok());
    EXPECT_EQ(inbox_.Wait(1).size(), 1u);
  }
  ~OwnerHandlerStall() override {
    (void)first_.Wait();  // ended by the test, with whatever ended the connection
    SettleOwner(writer_, owner_, inbox_);
    EXPECT_EQ(first_.calls(), 1);  // the late acknowledgement changed nothing
  }
  bool holds_writes() const override { return false; }

 private:
  Side& owner_;
  Side& writer_;
  Inbox inbox_;
  Done first_;
};

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_
