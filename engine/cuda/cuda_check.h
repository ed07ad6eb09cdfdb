// Error handling shared by the CUDA kernels (engine/cuda). Kernels take raw pointers, explicit
// strides and a stream, and return the launch's cudaError_t; they include no abseil and no gRPC,
// so the same files build standalone on a bare GPU machine (scripts/gpu_check.sh). Shape and
// device checks live one layer up, in the backend.
#ifndef TANDEM_ENGINE_CUDA_CUDA_CHECK_H_
#define TANDEM_ENGINE_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

// Returns the error of `expr` (a cudaError_t) from the enclosing function when it is not success.
#define TANDEM_CUDA_TRY(expr)                                          \
  do {                                                                 \
    if (cudaError_t tandem_cuda_try_ = (expr); tandem_cuda_try_ != cudaSuccess) { \
      return tandem_cuda_try_;                                         \
    }                                                                  \
  } while (false)

namespace tandem::cuda {

// Blocks of `threads` threads that cover `n` items.
inline unsigned BlocksFor(long long n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_CHECK_H_
