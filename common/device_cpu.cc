// The CPU-only build of common/device.h.
#include "common/device.h"

namespace tandem {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<GpuInfo>> ListGpus() {
  return absl::FailedPreconditionError("this build of Tandem has no CUDA support (TANDEM_CUDA=OFF or nvcc not found)");
}

absl::Status RunGpuSelfTest(int /*device*/) {
  return absl::FailedPreconditionError("this build of Tandem has no CUDA support");
}

}  // namespace tandem
