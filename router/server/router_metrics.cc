#include "router/server/router_metrics.h"

namespace tandem::router {

RouterMetrics& Metrics() {
  static RouterMetrics* metrics = new RouterMetrics();
  return *metrics;
}

}  // namespace tandem::router
