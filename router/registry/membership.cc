#include "router/registry/membership.h"

#include <algorithm>

namespace tandem {

WorkerMembership::WorkerMembership(absl::Span<const std::string> fixed) {
  for (const std::string& address : fixed) {
    if (fixed_set_.insert(address).second) fixed_.push_back(address);
  }
  members_ = fixed_set_;
}

MembershipChange WorkerMembership::Resolved(absl::Span<const std::string> addresses) {
  MembershipChange change;
  const absl::flat_hash_set<std::string> resolved(addresses.begin(), addresses.end());
  for (const std::string& address : addresses) {
    if (members_.insert(address).second) change.joined.push_back(address);
  }
  for (const std::string& address : members_) {
    if (!resolved.contains(address) && !fixed_set_.contains(address)) {
      change.left.push_back(address);
    }
  }
  for (const std::string& address : change.left) members_.erase(address);
  std::sort(change.left.begin(), change.left.end());
  return change;
}

std::vector<std::string> WorkerMembership::members() const {
  std::vector<std::string> out(members_.begin(), members_.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tandem
