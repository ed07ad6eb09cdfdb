// The registry against a worker that stops answering without closing anything: a WatchState
// server on loopback behind a TCP relay that can be frozen (it keeps every socket open and moves
// no byte, as a cut link does), or a server that keeps its stream open and goes silent. The worker
// must be taken for lost and stop taking requests, then be re-admitted once it answers again.
#include "router/server/registry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/keepalive.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

// Relays TCP connections from a loopback port to `target_port`, one thread per direction. While
// frozen it moves nothing and accepts nothing new, and keeps every socket open; connections made
// while frozen are never served, like those whose packets a cut link dropped. Thaw serves new
// connections again.
class FreezableRelay {
 public:
  explicit FreezableRelay(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FreezableRelay() {
    stopping_ = true;
    accept_thread_.join();  // then nothing adds to threads_
    for (auto& t : threads_) t.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  int port() const { return port_; }
  void Freeze() { ++generation_; }  // connections of earlier generations stop for good
  void Thaw() { frozen_generation_ = generation_.load(); }
  bool frozen() const { return generation_ != frozen_generation_; }

 private:
  void AcceptLoop() {
    while (!stopping_) {
      if (frozen()) {  // new connections wait in the backlog
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(client);
        close(server);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        fds_.push_back(client);
        fds_.push_back(server);
      }
      const int generation = generation_;
      threads_.emplace_back([=, this] { Pipe(client, server, generation); });
      threads_.emplace_back([=, this] { Pipe(server, client, generation); });
    }
  }
  // Moves bytes until the connection closes, the relay stops, or it is frozen.
  void Pipe(int from, int to, int generation) {
    char buffer[16384];
    while (!stopping_) {
      if (generation_ != generation) {  // frozen: hold the sockets, move nothing
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = read(from, buffer, sizeof(buffer));
      if (n <= 0) {
        shutdown(to, SHUT_WR);
        return;
      }
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t m = write(to, buffer + sent, static_cast<size_t>(n - sent));
        if (m <= 0) return;
        sent += m;
      }
    }
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> generation_{0};
  std::atomic<int> frozen_generation_{0};
  std::thread accept_thread_;
  std::vector<std::thread> threads_;  // the relay's; only AcceptLoop adds
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

// A decode worker's WatchState: a snapshot, then a load sample every 20 ms; while `silent`, the
// open streams send nothing (and stay open).
class FakeWorkerState final : public v1::WorkerState::CallbackService {
 public:
  std::atomic<bool> silent{false};
  // Every message from now on says the worker drains (LoadSample.draining).
  std::atomic<bool> draining{false};
  // The open streams end (OK) after their next message, as a drained worker ends them.
  std::atomic<bool> end_streams{false};
  std::atomic<int> subscriptions{0};
  // The load the snapshot reports (set before the first subscription).
  v1::LoadSample snapshot_load;

  grpc::ServerWriteReactor<v1::WorkerStateUpdate>* WatchState(
      grpc::CallbackServerContext* /*context*/, const v1::WatchStateRequest* /*request*/) override {
    ++subscriptions;
    {
      absl::MutexLock lock(&mu_);
      ++subscribed_;
    }
    return new Stream(this);
  }

  // Waits (up to a minute: a loaded machine) until `n` streams ended in all.
  bool AwaitStreamsEnded(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Minutes(1));
  }

  // Waits (up to a minute: a loaded machine) until `n` subscriptions came in all.
  bool AwaitSubscriptions(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return subscribed_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Minutes(1));
  }

 private:
  class Stream final : public grpc::ServerWriteReactor<v1::WorkerStateUpdate> {
   public:
    explicit Stream(FakeWorkerState* service) : service_(service) {
      v1::Snapshot* s = update_.mutable_snapshot();
      s->set_worker_id("fake-decode");
      s->set_role(v1::ROLE_DECODE);
      s->set_model_id("fake-model");
      s->set_block_size(16);
      s->set_total_blocks(64);
      s->set_free_blocks(64);
      s->set_max_context(2048);
      s->set_max_running(8);
      *s->mutable_load() = service->snapshot_load;
      s->mutable_load()->set_free_blocks(64);
      s->mutable_load()->set_draining(service->draining);
      StartWrite(&update_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::CANCELLED);
      if (service_->end_streams) return Finish(grpc::Status::OK);
      std::thread([this] {
        while (service_->silent && !cancelled_) absl::SleepFor(absl::Milliseconds(5));
        absl::SleepFor(absl::Milliseconds(20));
        update_.Clear();
        update_.mutable_load()->set_free_blocks(64);
        update_.mutable_load()->set_draining(service_->draining);
        if (cancelled_) return Finish(grpc::Status::CANCELLED);
        StartWrite(&update_);
      }).detach();
    }
    void OnCancel() override { cancelled_ = true; }
    void OnDone() override {
      // The detached writer has returned: OnDone comes after Finish, which only it calls once the
      // stream is cancelled, or after a failed write (no writer started).
      {
        absl::MutexLock lock(&service_->mu_);
        ++service_->ended_;
      }
      delete this;
    }

   private:
    FakeWorkerState* const service_;
    v1::WorkerStateUpdate update_;
    std::atomic<bool> cancelled_{false};
  };

  absl::Mutex mu_;
  int subscribed_ ABSL_GUARDED_BY(mu_) = 0;  // as `subscriptions`, to wait on
  int ended_ ABSL_GUARDED_BY(mu_) = 0;       // streams done
};

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    ApplyKeepalive({.time = absl::Milliseconds(200), .timeout = absl::Milliseconds(200)}, &builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  // Waits (up to a minute: a loaded machine) for the registry to say `ready`.
  static bool AwaitReady(Registry& registry, bool ready) {
    return registry.AwaitReady(ready, absl::Minutes(1));
  }

  FakeWorkerState service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(RegistryTest, ACutLinkIsFoundByKeepaliveAndTheWorkerComesBack) {
  FreezableRelay relay(port_);
  RegistryOptions options;
  options.addresses = {absl::StrCat("127.0.0.1:", relay.port())};
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.keepalive = {.time = absl::Milliseconds(200), .timeout = absl::Milliseconds(200)};
  // Only keepalive can find this cut: the liveness check is off.
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));

  relay.Freeze();
  ASSERT_TRUE(AwaitReady(registry, false)) << "the frozen link was never found out";
  relay.Thaw();
  ASSERT_TRUE(AwaitReady(registry, true)) << "the worker was not re-admitted";
  EXPECT_GE(service_.subscriptions, 2);
}

TEST_F(RegistryTest, WithoutKeepaliveOrLivenessACutLinkGoesUnnoticed) {
  // The control: the same cut, with pings far apart and no liveness check, is not found within
  // the time the test above needed many times over; what found it there is keepalive.
  FreezableRelay relay(port_);
  RegistryOptions options;
  options.addresses = {absl::StrCat("127.0.0.1:", relay.port())};
  options.keepalive = {.time = absl::Hours(1), .timeout = absl::Hours(1)};
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));
  relay.Freeze();
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    ASSERT_TRUE(registry.Ready());
    absl::SleepFor(absl::Milliseconds(50));
  }
}

TEST_F(RegistryTest, ASilentWorkerIsTakenForLostAndReadmittedBySnapshot) {
  RegistryOptions options;
  options.addresses = {absl::StrCat("127.0.0.1:", port_)};
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.liveness_timeout = absl::Milliseconds(300);
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));
  const int before = service_.subscriptions;

  service_.silent = true;  // the connection answers pings; the stream brings nothing
  ASSERT_TRUE(AwaitReady(registry, false));
  {
    std::vector<WorkerSummary> workers = registry.Workers();
    ASSERT_EQ(workers.size(), 1u);
    EXPECT_FALSE(workers[0].ready);
  }
  service_.silent = false;
  ASSERT_TRUE(AwaitReady(registry, true));
  EXPECT_GT(service_.subscriptions, before);  // re-admitted by a new stream's snapshot
}

// The line of `name` with `worker`'s label on the process's /metrics, "" when there is none.
std::string MetricLine(absl::string_view name, absl::string_view worker) {
  const std::string text = SerializeMetrics(ProcessMetrics());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, absl::StrCat(name, "{")) &&
        absl::StrContains(line, absl::StrCat("worker=\"", worker, "\""))) {
      return std::string(line);
    }
  }
  return "";
}

// A worker that never answers is exported as unhealthy from the moment it is followed, so that an
// alert on the healthy gauge sees it (an absent series matches no alert).
TEST(RegistryMetricsTest, AWorkerIsExportedUnhealthyUntilItsFirstSnapshot) {
  const std::string address = "127.0.0.1:1";  // nothing listens on port 1
  RegistryOptions options;
  options.addresses = {address};
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  EXPECT_THAT(MetricLine("tandem_router_worker_healthy", address), ::testing::EndsWith(" 0"));
}

// A worker found through a DNS name that drops out of it (a pod not ready) and comes back is
// followed again: a new watch stream, and it takes requests again.
TEST_F(RegistryTest, AWorkerThatLeavesTheDnsNameAndComesBackIsFollowedAgain) {
  const std::string address = absl::StrCat("127.0.0.1:", port_);
  absl::Mutex mu;
  std::vector<std::string> answer = {address};
  RegistryOptions options;
  options.dns_names = {"workers.test:7100"};
  options.dns_interval = absl::Milliseconds(20);
  options.resolve = [&](absl::string_view) -> absl::StatusOr<std::vector<std::string>> {
    absl::MutexLock lock(&mu);
    return answer;
  };
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));

  for (int round = 0; round < 2; ++round) {
    {
      absl::MutexLock lock(&mu);
      answer.clear();
    }
    ASSERT_TRUE(AwaitReady(registry, false)) << "the worker did not leave";
    ASSERT_TRUE(registry.AwaitFollowing(address, false, absl::Seconds(30)));
    // Gone from /metrics too: a healthy-0 series left behind would keep a "worker unhealthy"
    // alert firing for a worker that no longer exists.
    EXPECT_EQ(MetricLine("tandem_router_worker_healthy", address), "");
    EXPECT_EQ(MetricLine("tandem_router_worker_kv_event_id", address), "");
    const int before = service_.subscriptions;
    {
      absl::MutexLock lock(&mu);
      answer = {address};
    }
    ASSERT_TRUE(AwaitReady(registry, true)) << "round " << round << ": not followed again";
    EXPECT_GT(service_.subscriptions, before);
    EXPECT_THAT(MetricLine("tandem_router_worker_healthy", address), ::testing::EndsWith(" 1"));
  }
  // Dropped by discovery is no lost connection.
  EXPECT_EQ(MetricLine("tandem_router_worker_connection_lost_total", address), "");
}

// A worker that says it drains (it got SIGTERM) is placed on no more, though its stream is up;
// when it ends its stream after the drain, that is a departure, not a lost connection, and it is
// still taken for draining (the snapshot of a new stream says whether it still is).
TEST_F(RegistryTest, ADrainingWorkerTakesNoRequestAndItsLeavingIsNoLoss) {
  const std::string address = absl::StrCat("127.0.0.1:", port_);
  RegistryOptions options;
  options.addresses = {address};
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));
  std::unique_ptr<placement::PlacementPolicy> policy = *placement::CreatePolicy("round_robin", {});
  const placement::Request request{.prompt_tokens = 8, .block_size = 16, .max_tokens = 12};
  ASSERT_TRUE(registry.Place(*policy, request).ok());
  EXPECT_EQ(MetricLine("tandem_router_worker_draining", address),
            absl::StrCat("tandem_router_worker_draining{worker=\"", address, "\"} 0"));

  service_.draining = true;
  ASSERT_TRUE(AwaitReady(registry, false)) << "the drain was not heard";
  EXPECT_EQ(registry.Place(*policy, request).status().code(), absl::StatusCode::kUnavailable);
  std::vector<WorkerSummary> workers = registry.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].ready);  // its stream is up: its streams in progress go on
  EXPECT_TRUE(workers[0].draining);
  EXPECT_EQ(MetricLine("tandem_router_worker_draining", address),
            absl::StrCat("tandem_router_worker_draining{worker=\"", address, "\"} 1"));

  const int before = service_.subscriptions;
  service_.end_streams = true;  // drained: the worker ends its stream
  // The router subscribes again (a static address); the worker, still up, ends each stream.
  ASSERT_TRUE(service_.AwaitSubscriptions(before + 2));
  EXPECT_EQ(MetricLine("tandem_router_worker_connection_lost_total", address), "");
  EXPECT_TRUE(registry.Workers()[0].draining);
  EXPECT_FALSE(registry.Ready());
}

// A decode worker's Generate: one token, then the last one once the test lets it go on.
class HoldingDecode final : public v1::Decode::Service {
 public:
  absl::Notification go_on;
  grpc::Status Generate(grpc::ServerContext* /*context*/, const v1::DecodeRequest* /*request*/,
                        grpc::ServerWriter<v1::DecodeResponse>* writer) override {
    v1::DecodeResponse response;
    response.add_token_ids(1);
    if (!writer->Write(response)) return grpc::Status::CANCELLED;
    go_on.WaitForNotification();
    response.set_token_ids(0, 2);
    response.set_finish_reason(v1::FINISH_REASON_LENGTH);
    writer->Write(response);
    return grpc::Status::OK;
  }
};

// A draining worker fails its readiness, so a headless Service's DNS name stops returning it
// while it still finishes its streams: the registry stops following it (a departure, not a loss),
// and a stream in progress there, on the router's own channel as RequestRouter opens it, goes on
// to its end; what the registry counted for it is released as usual.
TEST_F(RegistryTest, AWorkerDroppedByDiscoveryKeepsItsStreamsInProgress) {
  FakeWorkerState state;
  HoldingDecode decode;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&state);
  builder.RegisterService(&decode);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  absl::Mutex mu;
  std::vector<std::string> answer = {address};
  RegistryOptions options;
  options.dns_names = {"decode.test:7100"};
  options.dns_interval = absl::Milliseconds(20);
  options.resolve = [&](absl::string_view) -> absl::StatusOr<std::vector<std::string>> {
    absl::MutexLock lock(&mu);
    return answer;
  };
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));
  std::unique_ptr<placement::PlacementPolicy> policy = *placement::CreatePolicy("round_robin", {});
  absl::StatusOr<Route> route =
      registry.Place(*policy, {.prompt_tokens = 8, .block_size = 16, .max_tokens = 2});
  ASSERT_TRUE(route.ok()) << route.status();
  ASSERT_EQ(route->decode_address, address);

  auto stub = v1::Decode::NewStub(CreateKeepaliveChannel(address, options.keepalive));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> stream =
      stub->Generate(&context, v1::DecodeRequest());
  v1::DecodeResponse response;
  ASSERT_TRUE(stream->Read(&response));
  registry.Progress(*route, 1, registry.clock()->Now());
  registry.PromptDone(*route);

  state.draining = true;
  ASSERT_TRUE(AwaitReady(registry, false)) << "the drain was not heard";
  {
    absl::MutexLock lock(&mu);
    answer.clear();  // not ready: out of the DNS name
  }
  ASSERT_TRUE(state.AwaitStreamsEnded(1)) << "the registry still follows the worker";
  decode.go_on.Notify();
  ASSERT_TRUE(stream->Read(&response)) << "the stream in progress was cut";
  EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
  registry.Release(*route);
  EXPECT_EQ(MetricLine("tandem_router_worker_connection_lost_total", address), "");
  server->Shutdown(std::chrono::system_clock::now());
}

// The liveness timeout on the registry's clock: a worker whose stream stays open but brings
// nothing is lost once the clock has moved past the timeout, not before, and a fresh snapshot
// brings it back.
TEST_F(RegistryTest, AWorkerIsLostWhenTheClockPassesTheLivenessTimeout) {
  FakeClock clock;
  service_.silent = true;  // the snapshot, then nothing on an open stream
  RegistryOptions options;
  options.addresses = {absl::StrCat("127.0.0.1:", port_)};
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.liveness_timeout = absl::Seconds(3);
  options.clock = &clock;
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));
  const int before = service_.subscriptions;

  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(registry.CheckLiveness(), 0);  // silent for exactly the timeout: not yet
  EXPECT_TRUE(registry.Ready());
  clock.Advance(absl::Milliseconds(1));
  registry.CheckLiveness();  // or the registry's own check, whichever comes first
  ASSERT_TRUE(AwaitReady(registry, false));
  EXPECT_EQ(registry.CheckLiveness(), 0);  // lost once

  service_.silent = false;
  ASSERT_TRUE(AwaitReady(registry, true));
  EXPECT_GT(service_.subscriptions, before);  // re-admitted by a new stream's snapshot
}

// Places every request on the first worker, locally, and keeps the view it was given.
class RecordingPolicy final : public placement::PlacementPolicy {
 public:
  absl::string_view name() const override { return "recording"; }
  absl::StatusOr<placement::Decision> Place(const placement::Request& /*request*/,
                                            const placement::ClusterView& cluster) override {
    if (cluster.workers.empty()) return absl::UnavailableError("no worker");
    last = cluster.workers[0];
    return placement::Decision{.decode_worker = cluster.workers[0].id, .local_prefill = true};
  }
  placement::WorkerCandidate last;
};

// What CI saw as a flaky slo test: a burst of six streams starts, the worker's sample shows one
// running and five posted to its engine (waiting), the burst ends before the next sample, and a
// request sent right after was predicted against a batch of seven. The streams the router saw
// end are subtracted from what the sample counts, waiting ones too.
TEST_F(RegistryTest, StreamsThatEndedAreNotCountedFromASampleTakenBeforeTheyStarted) {
  service_.snapshot_load.set_running_seqs(1);
  service_.snapshot_load.set_waiting_seqs(5);
  service_.snapshot_load.set_finished_seqs(10);
  service_.silent = true;  // no sample after the snapshot: it stays the latest
  RegistryOptions options;
  options.addresses = {absl::StrCat("127.0.0.1:", port_)};
  options.liveness_timeout = absl::InfiniteDuration();
  Registry registry(options);
  ASSERT_TRUE(AwaitReady(registry, true));

  RecordingPolicy policy;
  const placement::Request request{.prompt_tokens = 8, .block_size = 16, .max_tokens = 12};
  std::vector<Route> burst;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<Route> route = registry.Place(policy, request);
    ASSERT_TRUE(route.ok()) << route.status();
    burst.push_back(*std::move(route));
  }
  for (Route& route : burst) {  // each decodes its 12 tokens and ends
    registry.Progress(route, 1, registry.clock()->Now());
    registry.PromptDone(route);
    registry.Progress(route, 11, registry.clock()->Now());
    registry.Release(route);
  }
  ASSERT_TRUE(registry.Place(policy, request).ok());
  EXPECT_EQ(policy.last.running_seqs, 0);
  EXPECT_EQ(policy.last.waiting_seqs, 0);
  EXPECT_EQ(policy.last.placed_sequences, 0);
  EXPECT_TRUE(policy.last.slo.running_groups.empty());
}

}  // namespace
}  // namespace tandem::router
