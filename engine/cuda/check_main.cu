// The runner of the CUDA kernel checks (check.h).
#include <cstdlib>
#include <cstring>

#include "engine/cuda/check.h"

namespace tandem::cuda::check {
namespace {
bool failed = false;
}  // namespace

std::vector<Case>& Cases() {
  static std::vector<Case>* cases = new std::vector<Case>();
  return *cases;
}

void Fail(const char* file, int line, const std::string& message) {
  failed = true;
  std::printf("  %s:%d: %s\n", file, line, message.c_str());
}

bool CaseFailed() { return failed; }

void ResetFailure() { failed = false; }

bool Close(const std::vector<float>& got, const std::vector<float>& want, double abs_tol,
           double rel_tol, std::string* why) {
  if (got.size() != want.size()) {
    *why = "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
    return false;
  }
  double worst = 0;
  size_t at = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = abs_tol + rel_tol * std::fabs(static_cast<double>(want[i]));
    if (!(err <= allowed)) {  // NaN fails too
      ++bad;
      if (!(err <= worst)) {
        worst = err;
        at = i;
      }
    }
  }
  if (bad == 0) return true;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%zu of %zu elements out of tolerance; worst at %zu: %g vs %g",
                bad, got.size(), at, got[at], want[at]);
  *why = buf;
  return false;
}

namespace {

uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

}  // namespace

uint16_t FloatToHalfBits(float f) {
  const uint32_t b = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  if (a < 0x38800000u) {                        // below 2^-14: a multiple of 2^-24
    const double units = std::nearbyint(static_cast<double>(BitsFloat(a)) * 16777216.0);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));  // 1024: smallest normal
  }
  uint32_t h = (a >> 13) - (112u << 10);  // the exponent rebiased from 127 to 15
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry bumps the exponent
  return static_cast<uint16_t>(sign | h);
}

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;  // exact
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsFloat(exponent == 31 ? sign | 0x7F800000u | (mantissa << 13)
                                  : sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToBf16Bits(float f) {
  const uint32_t b = FloatBits(f);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float Bf16BitsToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

std::vector<float> Random(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace tandem::cuda::check

// Usage: cuda_kernels_check [substring]  (runs the cases whose name contains it)
int main(int argc, char** argv) {
  using namespace tandem::cuda::check;  // NOLINT: main only
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("no GPU: %s; the CUDA kernel checks are skipped\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  const char* filter = argc > 1 ? argv[1] : "";
  int passed = 0, failures = 0;
  for (const Case& c : Cases()) {
    if (std::strstr(c.name, filter) == nullptr) continue;
    std::printf("[ RUN  ] %s\n", c.name);
    std::fflush(stdout);
    c.run();
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
      Fail(__FILE__, __LINE__, std::string("after the case: ") + cudaGetErrorString(e));
    }
    const bool ok = !CaseFailed();
    std::printf("[ %s ] %s\n", ok ? " OK " : "FAIL", c.name);
    ok ? ++passed : ++failures;
    ResetFailure();
  }
  std::printf("%d passed, %d failed\n", passed, failures);
  return failures == 0 ? 0 : 1;
}
