#include "router/server/admission_queue.h"

#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/status_conversion.h"
#include "common/status_macros.h"
#include "router/server/router_metrics.h"

namespace tandem::router {
namespace {

// Refuses a request that was queued, counting why.
void Refuse(WaitingRequest& request, const placement::Rejection& r) {
  Metrics().rejections.Add({{"reason", std::string(placement::RejectReasonName(r.reason))}})
      .Increment();
  request.Refuse(WithRetryAfter(absl::ResourceExhaustedError(r.message), r.retry_after));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AdmissionQueue>> AdmissionQueue::Create(const Options& options) {
  if (options.poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the admission queue's poll period must be positive");
  }
  ASSIGN_OR_RETURN(placement::Admission admission, placement::Admission::Create(options.admission));
  return std::unique_ptr<AdmissionQueue>(new AdmissionQueue(options, std::move(admission)));
}

AdmissionQueue::AdmissionQueue(const Options& options, placement::Admission admission)
    : options_(options), admission_(std::move(admission)) {}

AdmissionQueue::~AdmissionQueue() {
  thread_.reset();
  std::vector<std::shared_ptr<WaitingRequest>> left;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, request] : by_id_) {
      admission_.Remove(id);
      left.push_back(std::move(request));
    }
    by_id_.clear();
    ids_.clear();
    Metrics().queued.Set(static_cast<double>(admission_.Size()));
  }
  for (const std::shared_ptr<WaitingRequest>& request : left) {
    Refuse(*request, {.reason = placement::RejectReason::kExpired,
                      .message = "the router is shutting down"});
  }
}

void AdmissionQueue::Start() {
  thread_ = std::make_unique<PeriodicThread>(PeriodicThread::Options{.period = options_.poll},
                                             [this] { Pump(); });
}

absl::StatusOr<placement::Outcome> AdmissionQueue::Offer(std::shared_ptr<WaitingRequest> request,
                                                         const Request& offer) {
  std::shared_ptr<WaitingRequest> displaced;
  placement::Verdict verdict;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    absl::StatusOr<placement::Verdict> offered = admission_.Offer(
        {.id = id, .priority = offer.priority, .arrival = offer.arrival,
         .prediction = offer.prediction},
        options_.clock->Now());
    if (!offered.ok()) {
      LOG(WARNING) << "admission: " << offered.status() << "; admitting the request";
      offered = placement::Verdict{};
    }
    verdict = *std::move(offered);
    Metrics().admissions.Add({{"outcome", std::string(placement::OutcomeName(verdict.outcome))}})
        .Increment();
    if (verdict.outcome == placement::Outcome::kAdmit) return verdict.outcome;
    request->Unplace();  // placed again when it starts
    if (verdict.outcome == placement::Outcome::kReject) {
      Metrics()
          .rejections.Add({{"reason", std::string(placement::RejectReasonName(verdict.reason))}})
          .Increment();
      return WithRetryAfter(absl::ResourceExhaustedError(verdict.message), verdict.retry_after);
    }
    ids_[request.get()] = id;
    by_id_[id] = std::move(request);
    if (verdict.displaced.has_value()) displaced = TakeLocked(verdict.displaced->id);
    Metrics().queued.Set(static_cast<double>(admission_.Size()));
  }
  if (displaced != nullptr) Refuse(*displaced, *verdict.displaced);
  return verdict.outcome;
}

bool AdmissionQueue::Remove(const WaitingRequest* request) {
  absl::MutexLock lock(&mu_);
  auto it = ids_.find(request);
  if (it == ids_.end()) return false;
  admission_.Remove(it->second);
  by_id_.erase(it->second);
  ids_.erase(it);
  Metrics().queued.Set(static_cast<double>(admission_.Size()));
  return true;
}

void AdmissionQueue::Pump() {
  std::vector<std::pair<std::shared_ptr<WaitingRequest>, placement::Rejection>> refused;
  std::vector<std::pair<std::shared_ptr<WaitingRequest>, absl::Time>> started;  // with arrival
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    if (admission_.Size() > 0) {
      for (placement::Rejection& r : admission_.PopExpired(now)) {
        std::shared_ptr<WaitingRequest> request = TakeLocked(r.id);
        if (request != nullptr) refused.emplace_back(std::move(request), std::move(r));
      }
      admission_.NextReady(now, [&](const placement::QueuedRequest& q) {
        auto it = by_id_.find(q.id);
        if (it == by_id_.end()) return false;
        absl::StatusOr<placement::SloPrediction> prediction = it->second->Place();
        if (!prediction.ok()) return false;
        if (!admission_.AdmitsQueued(q, *prediction, now)) {
          it->second->Unplace();
          return false;
        }
        started.emplace_back(TakeLocked(q.id), q.arrival);
        return true;
      });
    }
    Metrics().queued.Set(static_cast<double>(admission_.Size()));
  }
  for (auto& [request, rejection] : refused) Refuse(*request, rejection);
  for (auto& [request, arrival] : started) {
    Metrics().queue_wait.Observe(absl::ToDoubleSeconds(options_.clock->Now() - arrival));
    request->Start();
  }
}

int64_t AdmissionQueue::size() {
  absl::MutexLock lock(&mu_);
  return admission_.Size();
}

std::shared_ptr<WaitingRequest> AdmissionQueue::TakeLocked(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  std::shared_ptr<WaitingRequest> request = std::move(it->second);
  by_id_.erase(it);
  ids_.erase(request.get());
  return request;
}

}  // namespace tandem::router
