// The router's admission queue: requests that placement predicts cannot meet their objectives now
// wait here for capacity, and leave to run once a fresh placement admits them (highest priority
// first, then earliest arrival), or refused with RESOURCE_EXHAUSTED and a retry-after hint
// (common/status_conversion.h) when their time runs out, a request of higher priority takes their
// place, or the queue is destroyed. What is admitted, queued or refused is decided by
// placement::Admission (router/placement/admission.h, docs/slo.md); this class holds the waiting
// requests, looks at them again, and counts the admission metrics (router_metrics.h).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<AdmissionQueue> queue,
//                    AdmissionQueue::Create({.admission = options, .clock = clock}));
//   queue->Start();  // looks again every `poll` on a thread of its own
//   ASSIGN_OR_RETURN(placement::SloPrediction p, request->Place());
//   ASSIGN_OR_RETURN(placement::Outcome o,
//                    queue->Offer(request, {.priority = 0, .arrival = t0, .prediction = p}));
//   // kAdmit: start it on its placement now. kQueue: the queue holds it; it gets Start or Refuse.
//
// A test with a FakeClock calls Pump itself instead of Start. Thread-safe.
#ifndef TANDEM_ROUTER_SERVER_ADMISSION_QUEUE_H_
#define TANDEM_ROUTER_SERVER_ADMISSION_QUEUE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "router/placement/admission.h"
#include "common/periodic_thread.h"

namespace tandem::router {

// A request offered to an AdmissionQueue: the router's side of it. The queue calls Place and
// Unplace with its lock held (they must not call the queue), Start and Refuse without it. A queued
// request gets exactly one of Start and Refuse, unless AdmissionQueue::Remove took it out first.
class WaitingRequest {
 public:
  virtual ~WaitingRequest() = default;
  // Places the request on the cluster as it is now and holds that placement until Unplace or
  // Start: its prediction (placement::PredictionOf the decision). An error when nothing can take
  // it now (no worker): it holds nothing and waits on.
  virtual absl::StatusOr<placement::SloPrediction> Place() = 0;
  // Gives back the placement the last Place holds: it was not admitted on it.
  virtual void Unplace() = 0;
  // Leaves the queue to run on the placement the last Place holds.
  virtual void Start() = 0;
  // Leaves the queue refused: `status` is RESOURCE_EXHAUSTED, with a retry-after hint.
  virtual void Refuse(const absl::Status& status) = 0;
};

class AdmissionQueue {
 public:
  struct Options {
    // What is admitted, queued, refused; how long a request may wait. Checked by Create.
    placement::AdmissionOptions admission = {};
    // How often Start's thread looks at the queue again (capacity frees without a signal: a
    // request ends, a load sample comes). > 0.
    absl::Duration poll = absl::Milliseconds(10);
    // Arrivals, queue deadlines and waiting times. Must outlive the queue.
    Clock* clock = RealClock();
  };

  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<std::unique_ptr<AdmissionQueue>> Create(const Options& options);
  // Stops Start's thread, then refuses every request still waiting (RESOURCE_EXHAUSTED: "the
  // router is shutting down").
  ~AdmissionQueue();

  // Calls Pump every `poll` (real time) on a thread of its own until destruction.
  void Start();

  // A request offered: its priority, when it reached the router (its TTFT objective runs from
  // there), and the prediction of the placement it holds.
  struct Request {
    int32_t priority = 0;
    absl::Time arrival = absl::InfinitePast();
    placement::SloPrediction prediction = {};
  };
  // Offers `request`, which holds the placement `offer.prediction` comes from (its Place).
  //   kAdmit             it keeps its placement; the caller starts it now.
  //   kQueue             the placement is given back (Unplace) and the queue holds the request
  //                      until it calls Start or Refuse, or Remove takes it out. A queued request
  //                      of lower priority that it pushed out is refused first.
  //   RESOURCE_EXHAUSTED refused, with a message for the client and a retry-after hint; the
  //                      placement is given back.
  // A prediction admission cannot read (not finite) is logged and the request admitted.
  absl::StatusOr<placement::Outcome> Offer(std::shared_ptr<WaitingRequest> request,
                                           const Request& offer);

  // Takes `request` out of the queue (its client cancelled it): it gets neither Start nor Refuse.
  // False when it is not waiting (never queued, or already started or refused).
  bool Remove(const WaitingRequest* request);

  // Looks at the queue once: refuses the requests whose deadline has passed, then places the
  // others again, highest priority first, and starts those admitted on their fresh placement
  // (the time they waited counts against their TTFT objective); the rest give it back and wait.
  void Pump();

  // Requests waiting now.
  int64_t size();

 private:
  AdmissionQueue(const Options& options, placement::Admission admission);
  // Takes the request of admission id `id` out of the maps; null when it is not there.
  std::shared_ptr<WaitingRequest> TakeLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  absl::Mutex mu_;
  placement::Admission admission_ ABSL_GUARDED_BY(mu_);
  // The queued requests by the id admission knows them by, and back.
  absl::flat_hash_map<uint64_t, std::shared_ptr<WaitingRequest>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const WaitingRequest*, uint64_t> ids_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_ADMISSION_QUEUE_H_
