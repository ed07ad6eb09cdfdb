// The requests a router has in flight, and what its drain needs of them (docs/failures.md,
// "Planned shutdown"): how many are left, a gate that refuses new ones once the drain starts, and
// a cut that ends those still running when the drain ends (its deadline, or a second signal)
// with a clear error.
//
//   InFlightRequests in_flight;
//   ASSIGN_OR_RETURN(std::shared_ptr<InFlightRequests::Entry> entry, in_flight.Enter(sink));
//   // start the request with `entry.get()` as its sink, then:
//   in_flight.Started(*entry, call);   // or Abandon(*entry) when it did not start
//   ...
//   in_flight.StartDrain();            // Enter refuses from now on
//   in_flight.AwaitIdle(deadline);     // until every entry's OnDone has passed its end on
//   in_flight.Cut();                   // the rest: cancelled, ending with UNAVAILABLE
//
// A request is in flight from Enter until its sink's OnDone returned (or Abandon). Pure: no I/O,
// no clock but the deadlines given. Thread-safe.
#ifndef TANDEM_ROUTER_SERVER_IN_FLIGHT_H_
#define TANDEM_ROUTER_SERVER_IN_FLIGHT_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_conversion.h"
#include "router/server/relayed_call.h"

namespace tandem::router {

class InFlightRequests {
 public:
  // What a refused request's client is told to wait before it tries again (elsewhere: this
  // router is going away, another replica takes it at once).
  static constexpr absl::Duration kRetryAfter = absl::Seconds(1);

  // The sink a request runs with: passes everything on to its frontend's sink, and its end
  // (after a Cut: UNAVAILABLE instead of the cancellation) before the request leaves.
  class Entry final : public ResponseSink {
   public:
    Entry(InFlightRequests* owner, ResponseSink* sink) : owner_(owner), sink_(sink) {}

    void OnResponse(const v1::GenerateResponse& response) override { sink_->OnResponse(response); }
    void OnAdmitted() override { sink_->OnAdmitted(); }
    void OnDone(const absl::Status& status) override {
      bool cut;
      {
        absl::MutexLock lock(&mu_);
        cut = cut_;
      }
      // A request that ended well as it was cut keeps its OK.
      sink_->OnDone(cut && !status.ok() ? CutStatus() : status);
      owner_->Leave(this);  // may destroy this entry
    }

    static absl::Status CutStatus() {
      return WithRetryAfter(
          absl::UnavailableError("router is draining: the request was cut as the drain ended"),
          kRetryAfter);
    }

   private:
    friend class InFlightRequests;
    InFlightRequests* const owner_;
    ResponseSink* const sink_;
    absl::Mutex mu_;
    // Not owned: the frontend holds the call until its end.
    std::weak_ptr<RelayedCall> call_ ABSL_GUARDED_BY(mu_);
    bool cut_ ABSL_GUARDED_BY(mu_) = false;
  };

  // A new request, whose sink is `sink` (which must outlive its OnDone): the entry to start it
  // with; UNAVAILABLE "router is draining" (with a retry-after hint) once the drain started.
  absl::StatusOr<std::shared_ptr<Entry>> Enter(ResponseSink* sink) {
    absl::MutexLock lock(&mu_);
    if (draining_) return Refusal();
    auto entry = std::make_shared<Entry>(this, sink);
    entries_.emplace(entry.get(), entry);
    return entry;
  }
  // The request started as `call`; a request cut before that is cancelled now.
  void Started(Entry& entry, const std::shared_ptr<RelayedCall>& call) {
    bool cut;
    {
      absl::MutexLock lock(&entry.mu_);
      cut = entry.cut_;
      entry.call_ = call;
    }
    if (cut) call->Cancel();
  }
  // The request did not start (its sink will not be called): it leaves.
  void Abandon(Entry& entry) { Leave(&entry); }

  // From now on Enter refuses. Returns the requests in flight.
  int64_t StartDrain() {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    return static_cast<int64_t>(entries_.size());
  }
  bool draining() {
    absl::MutexLock lock(&mu_);
    return draining_;
  }
  int64_t size() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(entries_.size());
  }
  // Waits until no request is in flight, or until `deadline`; true when none is.
  bool AwaitIdle(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entries_.empty(); };
    return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  }
  // Cancels every request in flight; each ends with CutStatus (unless it ended well). Returns how
  // many there were. Their ends come on the requests' own threads, maybe before this returns.
  int64_t Cut() {
    std::vector<std::shared_ptr<Entry>> entries;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [raw, entry] : entries_) entries.push_back(entry);
    }
    for (const std::shared_ptr<Entry>& entry : entries) {
      std::shared_ptr<RelayedCall> call;
      {
        absl::MutexLock lock(&entry->mu_);
        entry->cut_ = true;
        call = entry->call_.lock();
      }
      if (call != nullptr) call->Cancel();  // else Started cancels it
    }
    return static_cast<int64_t>(entries.size());
  }

  // The refusal of a request that comes while the router drains.
  static absl::Status Refusal() {
    return WithRetryAfter(absl::UnavailableError("router is draining"), kRetryAfter);
  }

 private:
  void Leave(Entry* entry) {
    std::shared_ptr<Entry> last;  // destroyed outside the lock
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(entry);
    if (it == entries_.end()) return;
    last = std::move(it->second);
    entries_.erase(it);
  }

  absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<Entry*, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_IN_FLIGHT_H_
