// A small self-contained test harness for the CUDA kernels (engine/cuda/*_check.cu), for the bare
// GPU machine, which has no GoogleTest or abseil: cases register themselves, compare device
// results with plain CPU references within a stated tolerance, and the runner prints one line per
// case. Exit status: 0 all passed, 1 a case failed, 77 no GPU (ctest counts it as skipped).
//
//   TANDEM_CHECK_CASE(RmsNormMatchesTheReference) {
//     ...
//     CHECK_CLOSE(got, want, 1e-5, 1e-5);  // |got - want| <= abs + rel * |want|, element-wise
//   }
#ifndef TANDEM_ENGINE_CUDA_CHECK_H_
#define TANDEM_ENGINE_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tandem::cuda::check {

struct Case {
  const char* name;
  std::function<void()> run;
};

std::vector<Case>& Cases();
// Marks the running case failed with a message (printed at once).
void Fail(const char* file, int line, const std::string& message);
bool CaseFailed();
// Clears the failure for the next case (the runner calls it).
void ResetFailure();

struct Register {
  Register(const char* name, std::function<void()> run) { Cases().push_back({name, std::move(run)}); }
};

// Element-wise: |got[i] - want[i]| <= abs_tol + rel_tol * |want[i]|; reports the worst element.
bool Close(const std::vector<float>& got, const std::vector<float>& want, double abs_tol,
           double rel_tol, std::string* why);

// IEEE half and bfloat16 bits, written here independently of the project's CPU code (which the
// bare GPU machine cannot build): float -> half rounds to nearest even, overflows to infinity
// (65520 and above) and keeps NaN; float -> bfloat16 rounds to nearest even (NaN not handled).
// The reverse conversions are exact.
uint16_t FloatToHalfBits(float f);
float HalfBitsToFloat(uint16_t h);
uint16_t FloatToBf16Bits(float f);
float Bf16BitsToFloat(uint16_t b);

// Uniform floats in [lo, hi) from `seed`.
std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// A device buffer of T, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&data_, n * sizeof(T)) != cudaSuccess) data_ = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t n_;
};

}  // namespace tandem::cuda::check

#define TANDEM_CHECK_CASE(name)                                                         \
  static void name();                                                                  \
  static ::tandem::cuda::check::Register tandem_check_register_##name(#name, &name);   \
  static void name()

#define CHECK_CUDA(expr)                                                                       \
  do {                                                                                         \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                                          \
      ::tandem::cuda::check::Fail(__FILE__, __LINE__,                                          \
                                  std::string(#expr) + ": " + cudaGetErrorString(e_));         \
      return;                                                                                  \
    }                                                                                          \
  } while (false)

#define CHECK_TRUE(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::tandem::cuda::check::Fail(__FILE__, __LINE__, std::string("expected: ") + #cond);     \
      return;                                                                                  \
    }                                                                                          \
  } while (false)

#define CHECK_CLOSE(got, want, abs_tol, rel_tol)                                               \
  do {                                                                                         \
    std::string why_;                                                                          \
    if (!::tandem::cuda::check::Close((got), (want), (abs_tol), (rel_tol), &why_)) {           \
      ::tandem::cuda::check::Fail(__FILE__, __LINE__, std::string(#got) + " vs " + #want +    \
                                                          ": " + why_);                        \
      return;                                                                                  \
    }                                                                                          \
  } while (false)

#endif  // TANDEM_ENGINE_CUDA_CHECK_H_
