#include "common/serve.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace tandem {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// While waiting for the drainables, how often a second signal is looked for.
constexpr absl::Duration kSignalCheck = absl::Milliseconds(100);

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool AwaitTerminationSignal(absl::Time deadline) {
  const sigset_t set = TerminationSignals();
  while (true) {
    int signal = 0;
    if (deadline == absl::InfiniteFuture()) {
      if (sigwait(&set, &signal) == 0) {
        LOG(INFO) << "signal " << signal;
        return true;
      }
      continue;
    }
    const timespec wait = absl::ToTimespec(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    signal = sigtimedwait(&set, nullptr, &wait);
    if (signal > 0) {
      LOG(INFO) << "signal " << signal;
      return true;
    }
    if (errno != EINTR) return false;  // EAGAIN: the deadline passed
  }
}

absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const ServeOptions& options) {
  if (options.drain_timeout < absl::ZeroDuration() || options.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the drain timeout and the grace must not be negative");
  }
  const SignalWaiter await_signal =
      options.await_signal != nullptr ? options.await_signal : AwaitTerminationSignal;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ApplyKeepalive(options.keepalive, &builder);
  int port = 0;
  builder.AddListeningPort(listen,
                           options.credentials != nullptr ? options.credentials
                                                          : grpc::InsecureServerCredentials(),
                           &port);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  on_ready(port);
  await_signal(absl::InfiniteFuture());

  // 1-2: out of the load balancers' and the routers' rotation; new work refused.
  server->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.drain_timeout;
  if (!options.drainables.empty()) {
    LOG(INFO) << "draining: health NOT_SERVING, new work refused; the work in progress has "
              << absl::FormatDuration(options.drain_timeout) << " to finish";
  }
  for (Drainable* d : options.drainables) d->StartDrain();

  // 3: the work in progress finishes, unless the deadline or a second signal comes first.
  const char* why = "every drainable was idle";
  for (Drainable* d : options.drainables) {
    bool idle = false;
    while (true) {
      const absl::Time slice = std::min(deadline, absl::Now() + kSignalCheck);
      if (d->AwaitIdle(slice)) {
        idle = true;
        break;
      }
      if (slice >= deadline) {
        why = "the drain timeout passed";
        break;
      }
      if (await_signal(absl::Now())) {
        why = "a second signal came";
        break;
      }
    }
    if (!idle) break;
  }
  if (!options.drainables.empty()) {
    LOG(INFO) << "drain ended after " << absl::FormatDuration(absl::Now() - start) << " ("
              << why << ")";
  }

  // 4-5: what still runs ends with UNAVAILABLE, and the server stops.
  for (Drainable* d : options.drainables) d->HandOff();
  LOG(INFO) << "shutting down";
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::ToInt64Milliseconds(options.grace)));
  server->Wait();
  LOG(INFO) << "stopped";
  return absl::OkStatus();
}

absl::Status ServeUntilSignal(const std::string& listen, const std::vector<grpc::Service*>& services,
                              const std::function<void(int port)>& on_ready,
                              const KeepaliveOptions& keepalive, absl::Duration grace) {
  return ServeUntilSignal(listen, services, on_ready,
                          ServeOptions{.keepalive = keepalive, .grace = grace});
}

}  // namespace tandem
