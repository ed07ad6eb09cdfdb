// Which addresses the router follows as workers: the static ones always, and those a DNS name
// (e.g. a Kubernetes headless Service) resolves to now. Each resolution is compared with the
// members: addresses that appear join, members that are gone leave, and a static address never
// leaves. Whoever resolves the name (router/server/discovery.h) acts on the change: it follows
// the workers that joined and stops following those that left.
//
//   WorkerMembership membership(options.addresses);  // the static addresses are members
//   for (const std::string& a : membership.fixed()) Follow(a);
//   ... each time the name is resolved:
//   MembershipChange change = membership.Resolved(addresses);
//   for (const std::string& a : change.joined) Follow(a);
//   for (const std::string& a : change.left) Drop(a);
//
// Pure: no I/O, no clock, no lock. Thread-compatible: the caller serializes access.
#ifndef TANDEM_ROUTER_REGISTRY_MEMBERSHIP_H_
#define TANDEM_ROUTER_REGISTRY_MEMBERSHIP_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace tandem {

// What one resolution changed.
struct MembershipChange {
  // Addresses that became members, each once, in the order they were resolved.
  std::vector<std::string> joined;
  // Members that no longer are, sorted.
  std::vector<std::string> left;
};

class WorkerMembership {
 public:
  // `fixed`: the static addresses, members from the start and for good.
  explicit WorkerMembership(absl::Span<const std::string> fixed);

  // The name now resolves to `addresses` (repeats allowed; empty when the resolution failed too,
  // which makes every member that is not static leave): makes them the members, with the static
  // ones, and returns what changed.
  MembershipChange Resolved(absl::Span<const std::string> addresses);

  // The static addresses, each once, in the order given.
  const std::vector<std::string>& fixed() const { return fixed_; }
  // Whether `address` is a member now.
  bool contains(const std::string& address) const { return members_.contains(address); }
  // The members now, sorted.
  std::vector<std::string> members() const;

 private:
  std::vector<std::string> fixed_;
  absl::flat_hash_set<std::string> fixed_set_;
  absl::flat_hash_set<std::string> members_;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_REGISTRY_MEMBERSHIP_H_
