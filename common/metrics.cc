#include "common/metrics.h"

#include <exception>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace tandem {
namespace {

absl::Mutex g_server_mu;
prometheus::Exposer* g_exposer ABSL_GUARDED_BY(g_server_mu) = nullptr;  // leaked on purpose
int g_port ABSL_GUARDED_BY(g_server_mu) = 0;

std::shared_ptr<prometheus::Registry>& RegistryPtr() {
  static auto* registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *registry;
}

}  // namespace

prometheus::Registry& ProcessMetrics() { return *RegistryPtr(); }

absl::StatusOr<int> StartProcessMetricsServer(absl::string_view bind_address) {
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort(bind_address));
  absl::MutexLock lock(&g_server_mu);
  if (g_exposer != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the metrics server already runs on port ", g_port));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One civetweb thread is plenty for scrapes.
    exposer = std::make_unique<prometheus::Exposer>(address.ToString(), /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address.ToString(), ": ", e.what()));
  }
  exposer->RegisterCollectable(RegistryPtr(), "/metrics");
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics server on ", address.ToString(), " reports no listening port"));
  }
  g_port = ports.front();
  g_exposer = exposer.release();
  return g_port;
}

int ProcessMetricsPort() {
  absl::MutexLock lock(&g_server_mu);
  return g_port;
}

std::string SerializeMetrics(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

const prometheus::Histogram::BucketBoundaries& RequestLatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
      0.05,   0.075,  0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5, 5.0, 10.0};
  return *buckets;
}

}  // namespace tandem
