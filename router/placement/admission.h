// Admission by priority (DESIGN.md §5, docs/slo.md): whether a request that placement has
// predicted latencies for runs now, waits in a bounded queue for capacity, or is refused with a
// reason and a retry-after hint. Pure and clock-free: the caller passes `now`; nothing here
// sleeps, locks or starts threads.
//
// Driven from the router's event loop, under the router's lock:
//
//   ASSIGN_OR_RETURN(placement::Admission admission, placement::Admission::Create({}));
//   // A request arrives: place it, then offer it.
//   ASSIGN_OR_RETURN(placement::Decision d, policy->Place(request, view));
//   ASSIGN_OR_RETURN(placement::Verdict v,
//                    admission.Offer({.id = id, .priority = request.priority, .arrival = t0,
//                                     .prediction = placement::PredictionOf(d)}, now));
//   // kAdmit: start it on d. kQueue: keep the request aside under `id`. kReject: refuse it
//   // (v.reason, v.message, v.retry_after). v.displaced: refuse that queued request too.
//
//   // When capacity may have freed (a request finished, a load sample came) and at
//   // NextDeadline(): first the expired, then whatever now fits, highest priority first.
//   for (const placement::Rejection& r : admission.PopExpired(now)) Refuse(r);
//   admission.NextReady(now, [&](const placement::QueuedRequest& q) {
//     // Place q.id again on the current view; start it and return true when
//     // admission.Admits(q.priority, PredictionOf(new decision)).
//   });
//
// Rules (AdmissionOptions has the numbers):
//   - A request without a prediction (a policy other than slo) is admitted.
//   - Its priority class (PriorityClass) sets the headroom it needs to be admitted at once:
//     lower classes need more, so they are held back first as load grows; a high class may be
//     admitted with a small predicted miss (the workers' schedulers serve it first).
//   - Otherwise it is queued if it can still make its TTFT objective after some wait (its
//     predicted time without the waiting part fits in what is left of the objective) and its
//     class and the whole queue have room. A full queue makes room for it by pushing out the
//     lowest-priority queued request (newest first among equals) when that one's priority is
//     strictly lower; else it is refused (kQueueFull).
//   - A queued request leaves by NextReady (highest priority first, then earliest arrival), by
//     PopExpired once its deadline passes (the latest moment at which it could still make its
//     TTFT, at most max_queue_time after it was queued), or by Remove (cancelled).
//   - Retry-after hints come from the predicted drain time: the larger of the predicted wait
//     behind other work and the predicted overshoot of the TTFT objective, clamped to
//     [min_retry_after, max_retry_after].
#ifndef TANDEM_ROUTER_PLACEMENT_ADMISSION_H_
#define TANDEM_ROUTER_PLACEMENT_ADMISSION_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "router/placement/placement.h"

namespace tandem::placement {

// What admission reads of a placement Decision.
struct SloPrediction {
  // False: nothing was predicted (the request is admitted).
  bool predicted = false;
  // Decision::predicted_ttft_seconds, predicted_wait_seconds, headroom, meets_slo,
  // ttft_slo_seconds (0: no TTFT objective).
  double ttft_seconds = 0;
  double wait_seconds = 0;
  double headroom = 0;
  bool meets_slo = true;
  double ttft_slo_seconds = 0;
};

// The prediction of a decision.
SloPrediction PredictionOf(const Decision& decision);

// `prediction` for a request that has already waited `waited` since its arrival: TTFT and wait
// longer by that much, headroom at most the TTFT objective's with it, meets_slo again
// headroom >= 0. A negative `waited` counts as 0.
SloPrediction AfterWaiting(SloPrediction prediction, absl::Duration waited);

// A band of priorities treated alike.
struct PriorityClass {
  // The class of a request is the one with the highest min_priority <= its priority; the first
  // class also takes every priority below its own.
  int32_t min_priority = 0;
  // Admitted at once when the predicted headroom is at least this. Finite.
  double admit_headroom = 0;
  // Requests of the class the queue may hold; 0: never queued. >= 0.
  int64_t max_queued = 64;
};

// The default classes: background (priority < 0) needs 20% headroom and queues 32; normal (0)
// needs its SLOs met and queues 128; high (> 0) is admitted up to 25% over its objectives and
// queues 128.
std::vector<PriorityClass> DefaultPriorityClasses();

// Priority classes from a flag: "MIN_PRIORITY:ADMIT_HEADROOM:MAX_QUEUED" per class, comma-separated,
// e.g. "-1:0.2:32,0:0:128,1:-0.25:128" (the defaults). Empty: DefaultPriorityClasses().
// INVALID_ARGUMENT naming the class for a malformed one; the rest (order, ranges) is checked by
// Admission::Create.
absl::StatusOr<std::vector<PriorityClass>> ParsePriorityClasses(absl::string_view spec);

struct AdmissionOptions {
  // Not empty, min_priority strictly increasing.
  std::vector<PriorityClass> classes = DefaultPriorityClasses();
  // Requests queued in all classes together. >= 0.
  int64_t max_queued = 256;
  // Longest a request stays queued. > 0.
  absl::Duration max_queue_time = absl::Seconds(5);
  // Bounds of retry-after hints. 0 <= min_retry_after <= max_retry_after, finite.
  absl::Duration min_retry_after = absl::Seconds(1);
  absl::Duration max_retry_after = absl::Seconds(60);
};

enum class Outcome {
  kAdmit,   // run it now
  kQueue,   // keep it aside; NextReady or PopExpired will return it
  kReject,  // refuse it
};

enum class RejectReason {
  kNone = 0,
  // It cannot make its TTFT objective even after the shortest wait.
  kSloUnreachable,
  // Its class or the whole queue is full of requests of its priority or higher.
  kQueueFull,
  // A higher-priority arrival took its place in the queue.
  kDisplaced,
  // Capacity did not come before its queue deadline.
  kExpired,
};
inline constexpr int kRejectReasons = 5;  // kNone included

// "admit" | "queue" | "reject".
absl::string_view OutcomeName(Outcome outcome);
// "none" | "slo_unreachable" | "queue_full" | "displaced" | "expired" (metric labels).
absl::string_view RejectReasonName(RejectReason reason);

// A request offered to admission.
struct QueuedRequest {
  // The caller's handle (opaque here); unique among the queued requests.
  uint64_t id = 0;
  // Request::priority: higher first.
  int32_t priority = 0;
  // When the router received it (its TTFT runs from there); InfinitePast: `now` of Offer.
  absl::Time arrival = absl::InfinitePast();
  SloPrediction prediction = {};
};

// A request refused after it was queued (PopExpired, Verdict::displaced).
struct Rejection {
  uint64_t id = 0;
  int32_t priority = 0;
  RejectReason reason = RejectReason::kNone;
  std::string message = "";
  absl::Duration retry_after = absl::ZeroDuration();
};

struct Verdict {
  Outcome outcome = Outcome::kAdmit;
  // kReject: why, in a word and in a sentence for the client.
  RejectReason reason = RejectReason::kNone;
  std::string message = "";
  // kReject: when a retry may succeed (Retry-After).
  absl::Duration retry_after = absl::ZeroDuration();
  // kQueue: when PopExpired returns it unless NextReady took it first.
  absl::Time deadline = absl::InfinitePast();
  // kQueue: a queued request pushed out to make room, already removed; refuse it.
  std::optional<Rejection> displaced = std::nullopt;
};

// Counters for metrics (docs/slo.md suggests names); they only grow.
struct AdmissionCounters {
  // Admitted by Offer at once.
  int64_t admitted = 0;
  // Entered the queue.
  int64_t queued = 0;
  // Left the queue to run (NextReady).
  int64_t dequeued = 0;
  // Left the queue by Remove.
  int64_t removed = 0;
  // Refused, by RejectReason (index static_cast<int>(reason); kNone stays 0).
  std::array<int64_t, kRejectReasons> rejected = {};

  int64_t rejected_total() const;
};

// The admission controller of one model's requests. Thread-compatible: the router calls it under
// its lock. Movable.
class Admission {
 public:
  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<Admission> Create(const AdmissionOptions& options);

  // Admits, queues or refuses `request`. INVALID_ARGUMENT (nothing changes) when its id is
  // already queued or its prediction has numbers that are not finite, or negative times.
  absl::StatusOr<Verdict> Offer(const QueuedRequest& request, absl::Time now);

  // Whether a request of `priority` with `prediction` is admitted at once (the first rule of
  // Offer, for a request that has not waited).
  bool Admits(int32_t priority, const SloPrediction& prediction) const;

  // For the NextReady callback: whether `queued` is admitted with `prediction`, a fresh placement
  // of it at `now`. Its TTFT objective runs from its arrival, so the time it has waited since is
  // added to the predicted TTFT first (AfterWaiting); a prediction that ignored it would start a
  // request that waited 4 s of a 6 s objective on a predicted 5 s.
  bool AdmitsQueued(const QueuedRequest& queued, const SloPrediction& prediction,
                    absl::Time now) const;

  // Calls `try_start` on the queued requests whose deadline is after `now`, highest priority
  // first, then earliest arrival; removes and returns those for which it returned true (they
  // are started), in that order. `try_start` must not call this object's non-const methods.
  std::vector<QueuedRequest> NextReady(absl::Time now,
                                       absl::FunctionRef<bool(const QueuedRequest&)> try_start);

  // Removes and returns, as kExpired rejections, the queued requests whose deadline is at or
  // before `now` (earliest deadline first).
  std::vector<Rejection> PopExpired(absl::Time now);

  // Removes a queued request (cancelled by its client). False when `id` is not queued.
  bool Remove(uint64_t id);

  // The earliest deadline in the queue (when to call PopExpired next); nullopt when empty.
  std::optional<absl::Time> NextDeadline() const;

  // Queued requests, all and of `priority`'s class.
  int64_t Size() const { return static_cast<int64_t>(queue_.size()); }
  int64_t ClassSize(int32_t priority) const;

  const AdmissionCounters& counters() const { return counters_; }
  const AdmissionOptions& options() const { return options_; }

 private:
  struct Entry {
    QueuedRequest request;
    absl::Time deadline;
    int cls = 0;
    uint64_t serial = 0;  // order of Offer, the last tie-break
  };

  explicit Admission(const AdmissionOptions& options) : options_(options) {}
  int ClassOf(int32_t priority) const;
  absl::Duration RetryAfter(const SloPrediction& prediction) const;
  Rejection Reject(const Entry& entry, RejectReason reason, std::string message);
  // Index in queue_ of the entry to push out for an arrival of `priority` in class `cls`, or -1.
  int Victim(int32_t priority, int cls, bool class_full) const;
  // Queue order: priority descending, arrival ascending, serial ascending.
  static bool Before(const Entry& a, const Entry& b);

  AdmissionOptions options_;
  std::vector<Entry> queue_;  // in queue order
  std::vector<int64_t> class_size_ = std::vector<int64_t>(options_.classes.size(), 0);
  uint64_t next_serial_ = 0;
  AdmissionCounters counters_;
};

}  // namespace tandem::placement

#endif  // TANDEM_ROUTER_PLACEMENT_ADMISSION_H_
