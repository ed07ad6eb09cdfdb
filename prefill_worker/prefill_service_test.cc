// The Prefill service over a real gRPC server on loopback, a real engine and in-process
// transports, with one decode peer whose writes are held back: it must delay only its own
// request, keep its blocks until its writes end, and answer a prefill given up without waiting
// for a peer that never finishes.
#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"

namespace tandem {
namespace {

using kvtransfer::Connection;
using kvtransfer::DoneCallback;
using kvtransfer::KvTransport;
using kvtransfer::PoolDescriptor;
using kvtransfer::WriteOp;

constexpr absl::Duration kWait = absl::Seconds(60);  // bounds every wait; never reached when OK

// Writes to one peer wait behind a gate until the test opens it (a peer that takes as long as
// the test wants per write); Cancel ends the waiting ones with CANCELLED, as a transport does.
class Gate {
 public:
  struct Held {
    std::shared_ptr<Connection> inner;
    WriteOp op;
    absl::Time deadline;
    DoneCallback done;
  };

  // Queues the write while closed; forwards it when open.
  absl::Status Write(std::shared_ptr<Connection> inner, const WriteOp& op, absl::Time deadline,
                     DoneCallback done) {
    {
      absl::MutexLock lock(&mu_);
      if (!open_) {
        held_.push_back({std::move(inner), op, deadline, std::move(done)});
        ++ever_held_;
        return absl::OkStatus();
      }
    }
    return inner->Write(op, deadline, std::move(done));
  }

  void Open() {
    std::deque<Held> held;
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      held.swap(held_);
    }
    for (Held& h : held) {
      absl::Status s = h.inner->Write(h.op, h.deadline, std::move(h.done));
      if (!s.ok()) std::move(h.done)(s);
    }
  }

  void CancelHeld() {
    std::deque<Held> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (Held& h : held) std::move(h.done)(absl::CancelledError("the connection was cancelled"));
  }

  void AwaitHeld(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ever_held_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kWait));
  }

  int waiting() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
  int ever_held_ ABSL_GUARDED_BY(mu_) = 0;
};

class GatedConnection final : public Connection {
 public:
  GatedConnection(std::shared_ptr<Connection> inner, Gate* gate)
      : inner_(std::move(inner)), gate_(gate) {}
  absl::Status Write(const WriteOp& op, absl::Time deadline, DoneCallback done) override {
    return gate_->Write(inner_, op, deadline, std::move(done));
  }
  absl::Status Notify(std::string message, absl::Time deadline, DoneCallback done) override {
    return inner_->Notify(std::move(message), deadline, std::move(done));
  }
  void Cancel() override {
    gate_->CancelHeld();
    inner_->Cancel();
  }
  std::string Describe() const override { return "gated " + inner_->Describe(); }

 private:
  std::shared_ptr<Connection> inner_;
  Gate* gate_;
};

// The prefill worker's transport: connections to `gated_address` go through the gate.
class GatedTransport final : public KvTransport {
 public:
  GatedTransport(std::unique_ptr<KvTransport> inner, std::string gated_address, Gate* gate)
      : inner_(std::move(inner)), gated_address_(std::move(gated_address)), gate_(gate) {}
  absl::StatusOr<PoolDescriptor> RegisterPool(KvStorage* pool) override {
    return inner_->RegisterPool(pool);
  }
  absl::StatusOr<std::shared_ptr<Connection>> Connect(const PoolDescriptor& remote,
                                                      absl::Time deadline) override {
    absl::StatusOr<std::shared_ptr<Connection>> c = inner_->Connect(remote, deadline);
    if (!c.ok() || remote.address != gated_address_) return c;
    return std::make_shared<GatedConnection>(*std::move(c), gate_);
  }
  void SetNotificationHandler(absl::AnyInvocable<void(kvtransfer::Notification)> h) override {
    inner_->SetNotificationHandler(std::move(h));
  }
  const std::string& name() const override { return inner_->name(); }

 private:
  std::unique_ptr<KvTransport> inner_;
  std::string gated_address_;
  Gate* gate_;
};

// A decode worker's pool that prefills are written into.
struct Peer {
  std::unique_ptr<KvStorage> pool;  // outlives its transport
  std::unique_ptr<KvTransport> transport;
  v1::KvPoolDescriptor descriptor;
};

Peer MakePeer(const std::string& name, KvLayout layout) {
  Peer p;
  p.transport = kvtransfer::CreateInProcessTransport(name);
  layout.num_blocks = 64;
  p.pool = *KvStorage::Create(layout);
  absl::StatusOr<PoolDescriptor> d = p.transport->RegisterPool(p.pool.get());
  CHECK_OK(d.status());
  kvtransfer::ToProto(*d, &p.descriptor);
  return p;
}

// One Prefill call in flight from the test.
struct Call {
  grpc::ClientContext context;
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  absl::Notification done;
  grpc::Status status;
};

class PrefillServiceTest : public ::testing::Test {
 protected:
  // With `fake_time`, the service's deadlines run on clock_ and timers_, which the test moves;
  // otherwise on the real clock.
  void Start(bool fake_time) {
    TimerQueue* timers = nullptr;
    if (fake_time) {
      clock_ = std::make_unique<FakeClock>(absl::Now());  // write deadlines are real time
      timers_ = std::make_unique<TimerQueue>(
          TimerQueue::Options{.clock = clock_.get(), .start_thread = false});
      timers = timers_.get();
    }
    EngineLoop::Options options;
    options.engine.cpu.num_threads = 2;
    options.engine.kv_blocks = 64;
    options.engine.scheduler.max_running = 8;
    options.export_metrics = false;
    absl::StatusOr<std::unique_ptr<EngineLoop>> loop = EngineLoop::Start(
        absl::StrCat(kSourceDir, "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), options);
    CHECK_OK(loop.status());
    loop_ = *std::move(loop);
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fast_ = MakePeer(absl::StrCat("fast-", test), loop_->kv_layout());
    slow_ = MakePeer(absl::StrCat("slow-", test), loop_->kv_layout());
    transport_ = std::make_unique<GatedTransport>(
        kvtransfer::CreateInProcessTransport(absl::StrCat("prefill-", test)),
        slow_.descriptor.transport_address(), &gate_);
    CHECK_OK(transport_->RegisterPool(&loop_->kv_storage()).status());
    service_ = std::make_unique<PrefillService>(
        loop_.get(), transport_.get(),
        PrefillService::Options{.worker_id = "prefill", .abandon_grace = absl::Seconds(1),
                                .timers = timers});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    CHECK(server_ != nullptr && port > 0);
    stub_ = v1::Prefill::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    gate_.Open();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + kWait));
    service_.reset();
    transport_.reset();  // before the pool it registered
    loop_.reset();
  }

  // A prompt of `n` tokens drawn from `seed`, for `peer`.
  std::unique_ptr<Call> Send(const Peer& peer, const std::string& id, int n, int seed,
                             int timeout_ms = 0) {
    auto call = std::make_unique<Call>();
    v1::PrefillRequest& r = call->request;
    r.set_request_id(id);
    for (int i = 0; i < n; ++i) r.add_token_ids(1000 + (seed * 7919 + i * 104729) % 20000);
    r.mutable_sampling()->set_temperature(0);
    const int64_t bs = loop_->kv_layout().block_size;
    for (int64_t b = 0; b < (n + bs - 1) / bs; ++b) {
      r.mutable_destination()->add_block_ids(static_cast<uint32_t>(b));
    }
    r.mutable_destination()->set_worker_id(id + "-decode");
    *r.mutable_destination()->mutable_pool() = peer.descriptor;
    if (timeout_ms > 0) r.set_timeout_ms(static_cast<uint32_t>(timeout_ms));
    Call* c = call.get();
    stub_->async()->Prefill(&c->context, &c->request, &c->response, [c](grpc::Status s) {
      c->status = std::move(s);
      c->done.Notify();
    });
    return call;
  }

  // Blocks the engine holds; waits (bounded) until it equals `want`.
  void AwaitUsedBlocks(int64_t want) {
    loop_->AwaitStats([want](const SchedulerStats& s) { return s.used_blocks == want; }, kWait);
    EXPECT_EQ(loop_->stats().used_blocks, want);
  }

  // Waits (bounded) until the engine has no request left.
  void AwaitNoRequests() {
    ASSERT_TRUE(loop_->AwaitStats(
        [](const SchedulerStats& s) { return s.running == 0 && s.waiting == 0; }, kWait));
  }

  uint64_t PromptBytes(int n) const {
    const KvLayout& l = loop_->kv_layout();
    const int64_t blocks = (n + l.block_size - 1) / l.block_size;
    return static_cast<uint64_t>(blocks * l.num_layers * l.block_bytes());
  }

  std::unique_ptr<FakeClock> clock_;
  std::unique_ptr<TimerQueue> timers_;
  Gate gate_;
  std::unique_ptr<EngineLoop> loop_;
  Peer fast_, slow_;
  std::unique_ptr<KvTransport> transport_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Prefill::Stub> stub_;
};

TEST_F(PrefillServiceTest, ASlowPeerDelaysOnlyItsOwnRequest) {
  Start(/*fake_time=*/false);
  std::unique_ptr<Call> slow = Send(slow_, "slow", 40, 1);
  gate_.AwaitHeld(1);  // the slow request's prompt is being computed; its writes wait

  std::unique_ptr<Call> fast = Send(fast_, "fast", 40, 2);
  ASSERT_TRUE(fast->done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(fast->status.ok()) << fast->status.error_message();
  EXPECT_EQ(fast->response.timings().transfer_bytes(), PromptBytes(40));
  EXPECT_EQ(fast->response.num_computed_tokens(), 40u);
  EXPECT_FALSE(slow->done.HasBeenNotified()) << slow->status.error_message();
  EXPECT_GT(gate_.waiting(), 0);

  gate_.Open();
  ASSERT_TRUE(slow->done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(slow->status.ok()) << slow->status.error_message();
  EXPECT_EQ(slow->response.timings().transfer_bytes(), PromptBytes(40));
  // Every block went back to the pool (its prompts' full blocks stay in the prefix cache).
  AwaitUsedBlocks(0);
}

// How a prefill is given up, and what then ends its writes.
struct GiveUpCase {
  std::string name;
  enum { kClientCancels, kCancelRpc, kDeadline } cause;
  // True: the peer finishes the writes; false: they end when abandon_grace has passed and the
  // connection is cancelled.
  bool peer_finishes;
  grpc::StatusCode code;  // the server's answer (when the client still listens)
};

class PrefillGiveUpTest : public PrefillServiceTest,
                          public ::testing::WithParamInterface<GiveUpCase> {};

TEST_P(PrefillGiveUpTest, BlocksStayHeldUntilTheWritesEndThenTheCallAnswers) {
  const GiveUpCase& c = GetParam();
  Start(/*fake_time=*/true);
  std::unique_ptr<Call> slow = Send(slow_, "slow", 40, 3, /*timeout_ms=*/5000);
  gate_.AwaitHeld(1);

  grpc::ClientContext cancel_context;
  v1::CancelRequest cancel_request;
  v1::CancelResponse cancel_response;
  grpc::Status cancel_status;
  std::vector<std::byte> at_cancel_answer;
  absl::Notification cancel_answered;
  switch (c.cause) {
    case GiveUpCase::kClientCancels:
      slow->context.TryCancel();
      break;
    case GiveUpCase::kCancelRpc:
      cancel_request.set_request_id("slow");
      stub_->async()->Cancel(&cancel_context, &cancel_request, &cancel_response,
                             [&](grpc::Status s) {
                               cancel_status = std::move(s);
                               // What the destination holds when Cancel answers.
                               const auto* pool = slow_.pool->data<std::byte>();
                               at_cancel_answer.assign(
                                   pool, pool + slow_.pool->layout().total_bytes());
                               cancel_answered.Notify();
                             });
      break;
    case GiveUpCase::kDeadline:
      clock_->Advance(absl::Seconds(5));
      EXPECT_GE(timers_->RunDue(), 1);
      break;
  }
  AwaitNoRequests();  // the engine dropped it, or it ended by itself ...
  // ... but its blocks stay: the waiting writes read them.
  EXPECT_GT(gate_.waiting(), 0);
  const int64_t bs = loop_->kv_layout().block_size;
  EXPECT_EQ(loop_->stats().used_blocks, (40 + bs - 1) / bs);
  if (c.cause != GiveUpCase::kClientCancels) {
    EXPECT_FALSE(slow->done.HasBeenNotified()) << "answered before its writes ended";
  }
  // Prefill.Cancel answers only once nothing more can land in the destination's blocks.
  EXPECT_FALSE(cancel_answered.HasBeenNotified()) << "Cancel answered with writes in flight";

  if (c.peer_finishes) {
    gate_.Open();
  } else {
    clock_->Advance(absl::Seconds(1));  // abandon_grace: the connection is cancelled
    EXPECT_GE(timers_->RunDue(), 1);
    EXPECT_EQ(gate_.waiting(), 0);
  }
  AwaitUsedBlocks(0);
  ASSERT_TRUE(slow->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(slow->status.error_code(), c.code) << slow->status.error_message();
  if (c.cause == GiveUpCase::kCancelRpc) {
    ASSERT_TRUE(cancel_answered.WaitForNotificationWithTimeout(kWait));
    EXPECT_TRUE(cancel_status.ok()) << cancel_status.error_message();
    EXPECT_TRUE(cancel_response.found());
    // Nothing was written after Cancel answered.
    const auto* pool = slow_.pool->data<std::byte>();
    EXPECT_TRUE(std::equal(at_cancel_answer.begin(), at_cancel_answer.end(), pool));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Causes, PrefillGiveUpTest,
    ::testing::Values(
        GiveUpCase{"ClientCancelsPeerFinishes", GiveUpCase::kClientCancels, true,
                   grpc::StatusCode::CANCELLED},
        GiveUpCase{"ClientCancelsPeerHangs", GiveUpCase::kClientCancels, false,
                   grpc::StatusCode::CANCELLED},
        GiveUpCase{"CancelRpcPeerFinishes", GiveUpCase::kCancelRpc, true,
                   grpc::StatusCode::CANCELLED},
        GiveUpCase{"CancelRpcPeerHangs", GiveUpCase::kCancelRpc, false,
                   grpc::StatusCode::CANCELLED},
        GiveUpCase{"DeadlinePeerHangs", GiveUpCase::kDeadline, false,
                   grpc::StatusCode::DEADLINE_EXCEEDED}),
    [](const ::testing::TestParamInfo<GiveUpCase>& info) { return info.param.name; });

// Draining (SIGTERM): a new prefill is refused with UNAVAILABLE and the draining metadata (the
// decode worker asks elsewhere), the one in progress is waited for until it ends, and one still
// running at the hand-off is given up with UNAVAILABLE (the next test).
TEST_F(PrefillServiceTest, ADrainingWorkerRefusesNewPromptsAndFinishesTheOnesInProgress) {
  Start(/*fake_time=*/false);
  std::unique_ptr<Call> held = Send(slow_, "held", 40, 1);
  gate_.AwaitHeld(1);  // computed; its writes wait
  service_->StartDrain();

  std::unique_ptr<Call> refused = Send(fast_, "refused", 40, 2);
  ASSERT_TRUE(refused->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused->status.error_message(), ::testing::HasSubstr("draining"));
  const auto& trailers = refused->context.GetServerTrailingMetadata();
  ASSERT_NE(trailers.find(kDrainingMetadataKey), trailers.end());

  EXPECT_FALSE(service_->AwaitIdle(absl::Now()));  // `held` is still in progress
  gate_.Open();
  ASSERT_TRUE(service_->AwaitIdle(absl::Now() + kWait));
  ASSERT_TRUE(held->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(held->status.ok()) << held->status.error_message();
  EXPECT_EQ(held->response.timings().transfer_bytes(), PromptBytes(40));
  service_->HandOff();  // nothing left
  AwaitUsedBlocks(0);
}

TEST_F(PrefillServiceTest, AtTheHandOffAPrefillInProgressIsGivenUp) {
  Start(/*fake_time=*/false);
  std::unique_ptr<Call> held = Send(slow_, "held", 40, 1);
  gate_.AwaitHeld(1);
  service_->StartDrain();
  service_->HandOff();  // the writes are ended abandon_grace (1 s) later
  ASSERT_TRUE(held->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(held->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(held->status.error_message(), ::testing::HasSubstr("draining"));
  ASSERT_TRUE(service_->AwaitIdle(absl::Now() + kWait));
  AwaitUsedBlocks(0);
}

TEST_F(PrefillServiceTest, BadRequestsAreRefusedWithTheirReason) {
  Start(/*fake_time=*/false);
  std::unique_ptr<Call> empty = Send(fast_, "empty", 0, 0);
  ASSERT_TRUE(empty->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(empty->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty->status.error_message(), ::testing::HasSubstr("empty"));

  std::unique_ptr<Call> few = Send(fast_, "few", 40, 4);
  ASSERT_TRUE(few->done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(few->status.ok());
  v1::PrefillRequest r = few->request;
  r.mutable_destination()->mutable_block_ids()->RemoveLast();
  grpc::ClientContext context;
  v1::PrefillResponse response;
  const grpc::Status status = stub_->Prefill(&context, r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("blocks"));
}


// The destination pool filled with a canary byte: a refused grant leaves every byte of it, and a
// valid one changes the granted blocks (every layer) and nothing else -- not the block the
// destination caches, not any block outside the grant.
class PrefillGrantTest : public PrefillServiceTest {
 protected:
  static constexpr unsigned char kCanary = 0xA5;

  void FillCanary(Peer& peer) {
    std::memset(peer.pool->data<std::byte>(), kCanary,
                static_cast<size_t>(peer.pool->layout().total_bytes()));
  }

  // Blocks of `peer` with a byte that is not the canary.
  std::vector<int32_t> ChangedBlocks(const Peer& peer) {
    const KvLayout& l = peer.pool->layout();
    const size_t stride = static_cast<size_t>(l.block_stride_bytes());
    const auto* bytes = reinterpret_cast<const unsigned char*>(peer.pool->data<std::byte>());
    std::vector<int32_t> changed;
    for (int64_t b = 0; b < l.num_blocks; ++b) {
      const unsigned char* block = bytes + static_cast<size_t>(b) * stride;
      if (std::any_of(block, block + stride, [](unsigned char c) { return c != kCanary; })) {
        changed.push_back(static_cast<int32_t>(b));
      }
    }
    return changed;
  }

  // Whether every layer of `block` holds something other than the canary somewhere.
  bool EveryLayerWritten(const Peer& peer, int32_t block) {
    const KvLayout& l = peer.pool->layout();
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      const auto* p = reinterpret_cast<const unsigned char*>(peer.pool->KeyBlock<std::byte>(block, layer));
      const size_t n = static_cast<size_t>(l.block_bytes());
      if (std::all_of(p, p + n, [](unsigned char c) { return c == kCanary; })) return false;
    }
    return true;
  }

  // A 40-token prompt (3 blocks of 16) for `peer` with these destination ids.
  v1::PrefillRequest Request(const Peer& peer, std::vector<uint32_t> ids, uint32_t cached = 0) {
    v1::PrefillRequest r;
    r.set_request_id("grant");
    for (int i = 0; i < 40; ++i) r.add_token_ids(1000 + i * 37);
    r.mutable_sampling()->set_temperature(0);
    r.set_num_destination_cached_tokens(cached);
    r.mutable_destination()->set_worker_id("decode");
    *r.mutable_destination()->mutable_pool() = peer.descriptor;
    for (uint32_t b : ids) r.mutable_destination()->add_block_ids(b);
    return r;
  }

  grpc::Status Prefill(const v1::PrefillRequest& r) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1::PrefillResponse response;
    return stub_->Prefill(&context, r, &response);
  }
};

TEST_F(PrefillGrantTest, ARefusedGrantWritesNothing) {
  Start(/*fake_time=*/false);
  ASSERT_EQ(loop_->kv_layout().block_size, 16);
  FillCanary(fast_);
  struct Bad {
    std::vector<uint32_t> ids;
    uint32_t cached;
    grpc::StatusCode code;
    std::string says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{5, 64, 7}, 0, grpc::StatusCode::INVALID_ARGUMENT,
            "destination.block_ids[1] = 64 is outside the pool's 64 blocks"},
           {{5, 7, 5}, 0, grpc::StatusCode::INVALID_ARGUMENT,
            "destination.block_ids[2] = 5 repeats destination.block_ids[0]"},
           {{9, 9, 7}, 16, grpc::StatusCode::INVALID_ARGUMENT, "repeats"},
           {{5, 7}, 0, grpc::StatusCode::INVALID_ARGUMENT, "need exactly 3"},
           {{5, 7, 9, 11}, 0, grpc::StatusCode::INVALID_ARGUMENT, "need exactly 3"},
       }) {
    const grpc::Status status = Prefill(Request(fast_, bad.ids, bad.cached));
    EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(bad.says));
  }
  // A pool of another layout of the same block size (heads and head size swapped).
  v1::PrefillRequest other = Request(fast_, {5, 7, 9});
  v1::KvLayout* layout = other.mutable_destination()->mutable_pool()->mutable_layout();
  ASSERT_NE(layout->num_kv_heads(), layout->head_dim());
  const uint32_t heads = layout->num_kv_heads();
  layout->set_num_kv_heads(layout->head_dim());
  layout->set_head_dim(heads);
  const grpc::Status status = Prefill(other);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("KV layouts differ"));

  EXPECT_THAT(ChangedBlocks(fast_), ::testing::IsEmpty());
  AwaitUsedBlocks(0);
}

TEST_F(PrefillGrantTest, AValidGrantChangesOnlyTheGrantedBlocks) {
  Start(/*fake_time=*/false);
  FillCanary(fast_);
  // Block 41 holds the first 16 tokens at the destination already; 9 and 30 are granted.
  const grpc::Status status = Prefill(Request(fast_, {41, 9, 30}, /*cached=*/16));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(ChangedBlocks(fast_), ::testing::ElementsAre(9, 30));
  EXPECT_TRUE(EveryLayerWritten(fast_, 9));
  EXPECT_TRUE(EveryLayerWritten(fast_, 30));
  AwaitUsedBlocks(0);
}

}  // namespace
}  // namespace tandem
