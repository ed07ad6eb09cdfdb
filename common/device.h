// What accelerators this process can use. The CUDA parts are built only when nvcc was found at
// configure time (TANDEM_CUDA=AUTO|ON); a CPU-only build answers that it has no CUDA.
#ifndef TANDEM_COMMON_DEVICE_H_
#define TANDEM_COMMON_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

struct GpuInfo {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

// True when this binary was built with CUDA.
bool BuiltWithCuda();

// The CUDA devices visible to this process. FAILED_PRECONDITION in a CPU-only build; UNAVAILABLE
// with the driver's reason when there is no device or no usable driver.
absl::StatusOr<std::vector<GpuInfo>> ListGpus();

// Runs a small kernel (y = a*x + y over 1M floats) on `device` and compares it with the CPU
// result; INTERNAL on a mismatch, the CUDA error otherwise. Proves the toolchain, driver and
// device agree before a worker trusts them.
absl::Status RunGpuSelfTest(int device);

}  // namespace tandem

#endif  // TANDEM_COMMON_DEVICE_H_
