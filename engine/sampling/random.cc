#include "engine/sampling/random.h"

#include <atomic>
#include <random>

namespace tandem::sampling {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

class DefaultSeedSource final : public SeedSource {
 public:
  DefaultSeedSource() {
    std::random_device device;
    const uint64_t hi = device();
    const uint64_t lo = device();
    state_.store((hi << 32) ^ lo, std::memory_order_relaxed);
  }
  uint64_t NextSeed() override {
    return SplitMix64Mix(state_.fetch_add(kSplitMixGamma, std::memory_order_relaxed) +
                         kSplitMixGamma);
  }

 private:
  std::atomic<uint64_t> state_{0};
};

std::atomic<SeedSource*> g_override{nullptr};

}  // namespace

PhiloxCounter Philox4x32(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kPhiloxM0, c[0], &hi0, &lo0);
    MulHiLo(kPhiloxM1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

double UniformDouble(uint32_t a, uint32_t b) {
  const uint64_t bits = (static_cast<uint64_t>(a >> 5) << 26) | (b >> 6);
  return static_cast<double>(bits) * 0x1.0p-53;
}

double UniformAt(uint64_t seed, uint64_t position, RandomStream stream) {
  const PhiloxCounter out = Philox4x32(
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
       static_cast<uint32_t>(stream), 0u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return UniformDouble(out[0], out[1]);
}

uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64SeedSource::NextSeed() {
  return SplitMix64Mix(state_.fetch_add(kSplitMixGamma, std::memory_order_relaxed) +
                       kSplitMixGamma);
}

SeedSource& ProcessSeedSource() {
  if (SeedSource* source = g_override.load(std::memory_order_acquire); source != nullptr) {
    return *source;
  }
  static DefaultSeedSource* const default_source = new DefaultSeedSource();  // never destroyed
  return *default_source;
}

SeedSource* SetProcessSeedSource(SeedSource* source) {
  return g_override.exchange(source, std::memory_order_acq_rel);
}

}  // namespace tandem::sampling
