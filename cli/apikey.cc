#include "cli/apikey.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "router/auth/api_keys.h"

ABSL_FLAG(std::string, tenant, "", "`tandem apikey`: the tenant the new key belongs to");
ABSL_FLAG(double, rps, 0, "`tandem apikey`: the tenant's requests per second (0: no limit)");
ABSL_FLAG(int64_t, concurrency, 0,
          "`tandem apikey`: the tenant's concurrent requests (0: no limit)");

namespace tandem {

int RunApiKey() {
  const std::string tenant = absl::GetFlag(FLAGS_tenant);
  if (absl::Status s = auth::ValidateTenant(tenant); !s.ok()) {
    std::fprintf(stderr, "error: --tenant: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  auth::TenantLimits limits;
  const double rps = absl::GetFlag(FLAGS_rps);
  if (!std::isfinite(rps) || rps < 0) {
    std::fprintf(stderr, "error: --rps must be a number >= 0 (0: no limit)\n");
    return 2;
  }
  if (rps > 0) limits.rps = rps;
  const int64_t concurrency = absl::GetFlag(FLAGS_concurrency);
  if (concurrency < 0) {
    std::fprintf(stderr, "error: --concurrency must be >= 0 (0: no limit)\n");
    return 2;
  }
  if (concurrency > 0) limits.concurrency = concurrency;
  absl::StatusOr<std::string> key = auth::NewApiKey();
  if (!key.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(key.status().message()).c_str());
    return 1;
  }
  std::printf(
      "API key of tenant '%s' (shown this once; the router keeps only its SHA-256):\n  %s\n"
      "Add this line to the router's --api_keys_file (a running router re-reads it):\n  %s\n",
      tenant.c_str(), key->c_str(), auth::ApiKeyLine(tenant, *key, limits).c_str());
  return 0;
}

}  // namespace tandem
