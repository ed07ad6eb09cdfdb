// Finds the workers the registry follows: the static addresses at once, then the addresses DNS
// names resolve to (e.g. Kubernetes headless Services, one per pool), resolved again every interval
// on a thread of its own. What each resolution changes is WorkerMembership's decision
// (router/registry/membership.h); this class resolves, and tells its listener.
//
//   WorkerDiscovery discovery({.addresses = {"10.0.0.5:7100"}, .dns_names = {"prefill:7100", "decode:7100"}},
//                             {.joined = [&](const std::string& a) { Follow(a); },
//                              .left = [&](const std::string& a) { Drop(a); }});
//   discovery.Start();
//
// A test with a fake resolver calls Refresh itself instead. Thread-safe.
#ifndef TANDEM_ROUTER_SERVER_DISCOVERY_H_
#define TANDEM_ROUTER_SERVER_DISCOVERY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/registry/membership.h"
#include "common/periodic_thread.h"

namespace tandem::router {

// Resolves a name "host:port" to worker addresses "ip:port".
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(absl::string_view name)>;

// The system's resolver (getaddrinfo): the IPv4 addresses of `host`, in its order, each with
// `port`. UNAVAILABLE when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveDns(absl::string_view name);

class WorkerDiscovery {
 public:
  struct Options {
    // Worker addresses (host:port), followed for good.
    std::vector<std::string> addresses = {};
    // DNS names "host:port" whose addresses are the workers (with the name's port); none: none.
    std::vector<std::string> dns_names = {};
    // How often the names are resolved again. > 0.
    absl::Duration interval = absl::Seconds(5);
    Resolver resolve = ResolveDns;
  };
  // Where the decisions go. Called one at a time: from Start for the static addresses, then from
  // Refresh (discovery's thread); they must not call the discovery.
  struct Listener {
    // `address` became a worker: follow it.
    std::function<void(const std::string& address)> joined;
    // `address` is no longer a worker: stop following it.
    std::function<void(const std::string& address)> left;
  };

  WorkerDiscovery(Options options, Listener listener);
  // Stops Start's thread (after a resolution in progress).
  ~WorkerDiscovery();

  // The static addresses join; then, with DNS names, a thread resolves them now and every interval
  // until destruction.
  void Start();

  // Resolves every name once and tells the listener which workers joined and left. A name that
  // does not resolve is logged and keeps the workers of its last resolution (one that is gone is
  // found by its watch stream); the other names' answers apply. A name that resolves to no
  // address drops its workers.
  void Refresh();

  // The workers now (the static ones and those the last resolution found), sorted.
  std::vector<std::string> members();

 private:
  const Options options_;
  const Listener listener_;
  absl::Mutex membership_mu_;  // held through a Refresh: one at a time
  WorkerMembership membership_ ABSL_GUARDED_BY(membership_mu_);
  // Each name's last successful answer (a name not yet resolved has none).
  absl::flat_hash_map<std::string, std::vector<std::string>> last_answer_
      ABSL_GUARDED_BY(membership_mu_);
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_DISCOVERY_H_
