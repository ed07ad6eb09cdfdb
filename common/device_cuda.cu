// The CUDA build of common/device.h.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device.h"

namespace tandem {
namespace {

__global__ void SaxpyKernel(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

absl::Status CudaError(cudaError_t error, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

#define TANDEM_CUDA_RETURN_IF_ERROR(expr)                      \
  do {                                                         \
    if (cudaError_t tandem_cuda_error_ = (expr);               \
        tandem_cuda_error_ != cudaSuccess) {                   \
      return CudaError(tandem_cuda_error_, #expr);             \
    }                                                          \
  } while (false)

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<GpuInfo>> ListGpus() {
  int count = 0;
  if (cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device");
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    gpus.push_back(GpuInfo{i, prop.name, static_cast<uint64_t>(prop.totalGlobalMem), prop.major,
                           prop.minor});
  }
  return gpus;
}

absl::Status RunGpuSelfTest(int device) {
  constexpr int n = 1 << 20;
  constexpr float a = 1.5f;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.25f;
    y[i] = static_cast<float>(i % 7) - 3.0f;
  }
  float* dx = nullptr;
  float* dy = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&dx, n * sizeof(float)));
  if (cudaError_t e = cudaMalloc(&dy, n * sizeof(float)); e != cudaSuccess) {
    cudaFree(dx);
    return CudaError(e, "cudaMalloc(y)");
  }
  auto run = [&]() -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    SaxpyKernel<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    std::vector<float> out(n);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      const float want = a * x[i] + y[i];
      // The GPU may fuse the multiply-add: allow one rounding step of difference.
      if (std::fabs(out[i] - want) > 1e-6f * std::fmax(1.0f, std::fabs(want))) {
        return absl::InternalError(absl::StrCat("GPU self-test mismatch at ", i, ": got ", out[i],
                                                ", want ", want));
      }
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  cudaFree(dx);
  cudaFree(dy);
  return status;
}

}  // namespace tandem
