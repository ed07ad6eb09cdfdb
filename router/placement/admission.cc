#include "router/placement/admission.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "router/placement/placement.h"

namespace tandem::placement {

SloPrediction PredictionOf(const Decision& decision) {
  return {.predicted = decision.predicted,
          .ttft_seconds = decision.predicted_ttft_seconds,
          .wait_seconds = decision.predicted_wait_seconds,
          .headroom = decision.headroom,
          .meets_slo = decision.meets_slo,
          .ttft_slo_seconds = decision.ttft_slo_seconds};
}

SloPrediction AfterWaiting(SloPrediction prediction, absl::Duration waited) {
  const double seconds = std::max(absl::ToDoubleSeconds(waited), 0.0);
  if (!prediction.predicted || seconds == 0) return prediction;
  prediction.ttft_seconds += seconds;
  prediction.wait_seconds += seconds;
  if (prediction.ttft_slo_seconds > 0) {
    prediction.headroom = std::min(prediction.headroom,
                                   (prediction.ttft_slo_seconds - prediction.ttft_seconds) /
                                       prediction.ttft_slo_seconds);
  }
  prediction.meets_slo = prediction.headroom >= 0;
  return prediction;
}

std::vector<PriorityClass> DefaultPriorityClasses() {
  return {
      {.min_priority = -1, .admit_headroom = 0.2, .max_queued = 32},
      {.min_priority = 0, .admit_headroom = 0.0, .max_queued = 128},
      {.min_priority = 1, .admit_headroom = -0.25, .max_queued = 128},
  };
}

absl::StatusOr<std::vector<PriorityClass>> ParsePriorityClasses(absl::string_view spec) {
  if (spec.empty()) return DefaultPriorityClasses();
  std::vector<PriorityClass> classes;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(item, ':');
    PriorityClass c;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &c.min_priority) ||
        !absl::SimpleAtod(fields[1], &c.admit_headroom) ||
        !absl::SimpleAtoi(fields[2], &c.max_queued)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "priority class ", classes.size() + 1, " '", item,
          "' is not MIN_PRIORITY:ADMIT_HEADROOM:MAX_QUEUED (e.g. 0:0.1:128)"));
    }
    classes.push_back(c);
  }
  return classes;
}

absl::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kAdmit:
      return "admit";
    case Outcome::kQueue:
      return "queue";
    case Outcome::kReject:
      return "reject";
  }
  return "unknown";
}

absl::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kSloUnreachable:
      return "slo_unreachable";
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kDisplaced:
      return "displaced";
    case RejectReason::kExpired:
      return "expired";
  }
  return "unknown";
}

int64_t AdmissionCounters::rejected_total() const {
  int64_t total = 0;
  for (int64_t n : rejected) total += n;
  return total;
}

absl::StatusOr<Admission> Admission::Create(const AdmissionOptions& options) {
  if (options.classes.empty()) {
    return absl::InvalidArgumentError("admission: no priority class");
  }
  for (size_t i = 0; i < options.classes.size(); ++i) {
    const PriorityClass& c = options.classes[i];
    if (i > 0 && c.min_priority <= options.classes[i - 1].min_priority) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission: class ", i, " has min_priority ", c.min_priority,
                       ", not above the previous class's ", options.classes[i - 1].min_priority));
    }
    if (!std::isfinite(c.admit_headroom)) {
      return absl::InvalidArgumentError(absl::StrCat("admission: class ", i, " admit_headroom ",
                                                     c.admit_headroom, " is not finite"));
    }
    if (c.max_queued < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission: class ", i, " max_queued ", c.max_queued, " < 0"));
    }
  }
  if (options.max_queued < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission: max_queued ", options.max_queued, " < 0"));
  }
  if (options.max_queue_time <= absl::ZeroDuration() ||
      options.max_queue_time == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("admission: max_queue_time ",
                                                   absl::FormatDuration(options.max_queue_time),
                                                   " is not finite and > 0"));
  }
  if (options.min_retry_after < absl::ZeroDuration() ||
      options.max_retry_after < options.min_retry_after ||
      options.max_retry_after == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admission: retry-after bounds [", absl::FormatDuration(options.min_retry_after), ", ",
        absl::FormatDuration(options.max_retry_after), "] are not finite and ordered from 0"));
  }
  return Admission(options);
}

int Admission::ClassOf(int32_t priority) const {
  int cls = 0;
  for (size_t i = 0; i < options_.classes.size(); ++i) {
    if (priority >= options_.classes[i].min_priority) cls = static_cast<int>(i);
  }
  return cls;
}

int64_t Admission::ClassSize(int32_t priority) const { return class_size_[ClassOf(priority)]; }

bool Admission::Admits(int32_t priority, const SloPrediction& prediction) const {
  if (!prediction.predicted) return true;
  return prediction.headroom >= options_.classes[ClassOf(priority)].admit_headroom;
}

bool Admission::AdmitsQueued(const QueuedRequest& queued, const SloPrediction& prediction,
                             absl::Time now) const {
  const absl::Duration waited =
      queued.arrival == absl::InfinitePast() ? absl::ZeroDuration() : now - queued.arrival;
  return Admits(queued.priority, AfterWaiting(prediction, waited));
}

absl::Duration Admission::RetryAfter(const SloPrediction& prediction) const {
  // The backlog ahead drains in about the predicted wait; a request over its objective needs the
  // overshoot drained as well.
  double drain = prediction.wait_seconds;
  if (prediction.ttft_slo_seconds > 0) {
    drain = std::max(drain, prediction.ttft_seconds - prediction.ttft_slo_seconds);
  }
  return std::clamp(absl::Seconds(drain), options_.min_retry_after, options_.max_retry_after);
}

bool Admission::Before(const Entry& a, const Entry& b) {
  if (a.request.priority != b.request.priority) return a.request.priority > b.request.priority;
  if (a.request.arrival != b.request.arrival) return a.request.arrival < b.request.arrival;
  return a.serial < b.serial;
}

Rejection Admission::Reject(const Entry& entry, RejectReason reason, std::string message) {
  ++counters_.rejected[static_cast<int>(reason)];
  return {.id = entry.request.id,
          .priority = entry.request.priority,
          .reason = reason,
          .message = std::move(message),
          .retry_after = RetryAfter(entry.request.prediction)};
}

int Admission::Victim(int32_t priority, int cls, bool class_full) const {
  // The last eligible entry in queue order: the lowest priority, the newest among equals.
  for (int i = static_cast<int>(queue_.size()) - 1; i >= 0; --i) {
    const Entry& e = queue_[i];
    if (e.request.priority >= priority) return -1;  // the rest are of higher or equal priority
    if (class_full && e.cls != cls) continue;
    return i;
  }
  return -1;
}

absl::StatusOr<Verdict> Admission::Offer(const QueuedRequest& request, absl::Time now) {
  const SloPrediction& p = request.prediction;
  for (const auto& [name, value] : {std::pair<absl::string_view, double>{"ttft", p.ttft_seconds},
                                    {"wait", p.wait_seconds},
                                    {"ttft_slo", p.ttft_slo_seconds}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("admission: request ", request.id, " has ",
                                                     name, " ", value, " s (not finite and >= 0)"));
    }
  }
  if (std::isnan(p.headroom)) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission: request ", request.id, " has a NaN headroom"));
  }
  for (const Entry& e : queue_) {
    if (e.request.id == request.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission: request ", request.id, " is already queued"));
    }
  }

  Verdict verdict;
  if (AdmitsQueued(request, p, now)) {  // what it waited before the offer counts too
    ++counters_.admitted;
    verdict.outcome = Outcome::kAdmit;
    return verdict;
  }

  Entry entry = {.request = request,
                 .deadline = now + options_.max_queue_time,
                 .cls = ClassOf(request.priority),
                 .serial = next_serial_};
  entry.request.arrival =
      std::min(request.arrival == absl::InfinitePast() ? now : request.arrival, now);
  auto refuse = [&](RejectReason reason, std::string message) {
    Rejection r = Reject(entry, reason, std::move(message));
    verdict.outcome = Outcome::kReject;
    verdict.reason = r.reason;
    verdict.message = std::move(r.message);
    verdict.retry_after = r.retry_after;
    return verdict;
  };

  // It can wait only as long as its own work still fits in what is left of its TTFT objective.
  if (p.ttft_slo_seconds > 0) {
    const double service = std::max(p.ttft_seconds - p.wait_seconds, 0.0);
    const absl::Time latest = entry.request.arrival + absl::Seconds(p.ttft_slo_seconds - service);
    if (latest <= now) {
      return refuse(RejectReason::kSloUnreachable,
                    absl::StrFormat("predicted time to first token %.3f s (%.3f s of it without "
                                    "waiting) cannot meet the %.3f s objective",
                                    p.ttft_seconds, service, p.ttft_slo_seconds));
    }
    entry.deadline = std::min(entry.deadline, latest);
  }

  const PriorityClass& cls = options_.classes[entry.cls];
  const bool class_full = class_size_[entry.cls] >= cls.max_queued;
  const bool all_full = Size() >= options_.max_queued;
  if (class_full || all_full) {
    const int victim = Victim(request.priority, entry.cls, class_full);
    if (victim < 0) {
      return refuse(RejectReason::kQueueFull,
                    class_full ? absl::StrCat("the queue of priority class ", entry.cls,
                                              " is full (", cls.max_queued, " requests)")
                               : absl::StrCat("the admission queue is full (", options_.max_queued,
                                              " requests)"));
    }
    verdict.displaced =
        Reject(queue_[victim], RejectReason::kDisplaced,
               absl::StrCat("a request of priority ", request.priority, " took its queue place"));
    --class_size_[queue_[victim].cls];
    queue_.erase(queue_.begin() + victim);
  }

  ++next_serial_;
  queue_.insert(std::upper_bound(queue_.begin(), queue_.end(), entry, Before), entry);
  ++class_size_[entry.cls];
  ++counters_.queued;
  verdict.outcome = Outcome::kQueue;
  verdict.deadline = entry.deadline;
  return verdict;
}

std::vector<QueuedRequest> Admission::NextReady(
    absl::Time now, absl::FunctionRef<bool(const QueuedRequest&)> try_start) {
  std::vector<QueuedRequest> started;
  std::vector<Entry> kept;
  kept.reserve(queue_.size());
  for (Entry& e : queue_) {
    if (e.deadline > now && try_start(e.request)) {
      --class_size_[e.cls];
      started.push_back(std::move(e.request));
    } else {
      kept.push_back(std::move(e));
    }
  }
  queue_ = std::move(kept);
  counters_.dequeued += static_cast<int64_t>(started.size());
  return started;
}

std::vector<Rejection> Admission::PopExpired(absl::Time now) {
  std::vector<Entry> expired;
  std::vector<Entry> kept;
  kept.reserve(queue_.size());
  for (Entry& e : queue_) {
    (e.deadline <= now ? expired : kept).push_back(std::move(e));
  }
  queue_ = std::move(kept);
  std::stable_sort(expired.begin(), expired.end(),
                   [](const Entry& a, const Entry& b) { return a.deadline < b.deadline; });
  std::vector<Rejection> rejections;
  rejections.reserve(expired.size());
  for (const Entry& e : expired) {
    --class_size_[e.cls];
    rejections.push_back(
        Reject(e, RejectReason::kExpired,
               absl::StrCat("no capacity came in time for its time-to-first-token objective (",
                            e.request.prediction.ttft_slo_seconds, " s)")));
  }
  return rejections;
}

bool Admission::Remove(uint64_t id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->request.id == id) {
      --class_size_[it->cls];
      queue_.erase(it);
      ++counters_.removed;
      return true;
    }
  }
  return false;
}

std::optional<absl::Time> Admission::NextDeadline() const {
  std::optional<absl::Time> earliest;
  for (const Entry& e : queue_) {
    if (!earliest || e.deadline < *earliest) earliest = e.deadline;
  }
  return earliest;
}

}  // namespace tandem::placement
