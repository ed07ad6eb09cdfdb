#include "router/server/discovery.h"

#include <netdb.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace tandem::router {

absl::StatusOr<std::vector<std::string>> ResolveDns(absl::string_view name) {
  const size_t colon = name.rfind(':');
  const std::string host(name.substr(0, colon));
  const std::string port(colon == absl::string_view::npos ? "" : name.substr(colon + 1));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &result); error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", name, ": ", gai_strerror(error)));
  }
  std::vector<std::string> found;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char ip[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    found.push_back(absl::StrCat(ip, ":", port));
  }
  freeaddrinfo(result);
  return found;
}

WorkerDiscovery::WorkerDiscovery(Options options, Listener listener)
    : options_(std::move(options)),
      listener_(std::move(listener)),
      membership_(options_.addresses) {}

WorkerDiscovery::~WorkerDiscovery() { thread_.reset(); }

void WorkerDiscovery::Start() {
  {
    absl::MutexLock lock(&membership_mu_);
    for (const std::string& address : membership_.fixed()) listener_.joined(address);
  }
  if (options_.dns_names.empty()) return;
  thread_ = std::make_unique<PeriodicThread>(
      PeriodicThread::Options{.period = options_.interval, .call_at_start = true},
      [this] { Refresh(); });
}

void WorkerDiscovery::Refresh() {
  absl::MutexLock lock(&membership_mu_);
  std::vector<std::string> all;
  for (const std::string& name : options_.dns_names) {
    absl::StatusOr<std::vector<std::string>> found = options_.resolve(name);
    if (found.ok()) {
      last_answer_[name] = *std::move(found);
    } else {
      // A resolver that fails for a moment (a DNS server restarting) must not drop every worker;
      // a worker that is really gone is found by its watch stream.
      LOG(WARNING) << found.status() << "; keeping the " << name
                   << " workers of the last resolution";
    }
    if (auto it = last_answer_.find(name); it != last_answer_.end()) {
      all.insert(all.end(), it->second.begin(), it->second.end());
    }
  }
  const MembershipChange change = membership_.Resolved(all);
  for (const std::string& address : change.joined) listener_.joined(address);
  for (const std::string& address : change.left) {
    LOG(INFO) << "worker " << address << " is no longer in " << absl::StrJoin(options_.dns_names, ", ");
    listener_.left(address);
  }
}

std::vector<std::string> WorkerDiscovery::members() {
  absl::MutexLock lock(&membership_mu_);
  return membership_.members();
}

}  // namespace tandem::router
