// Deterministic randomness for sampling, independent of the C++ standard library's engines and
// distributions (which differ between implementations).
//
//   Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
//   counter-based generator. Block(counter, key) is a pure function, so the random number used
//   for output position i of a request is Philox(counter = {i_lo, i_hi, stream, 0},
//   key = {seed_lo, seed_hi}) no matter how often or on which machine (or device: the same
//   function is easy to write in CUDA) it is evaluated.
//
//   UniformDouble(): a double in [0, 1) with 53 random bits, from two 32-bit words.
//
//   SeedSource: where requests without a seed get one. The process-wide source can be replaced in
//   tests.
#ifndef TANDEM_ENGINE_SAMPLING_RANDOM_H_
#define TANDEM_ENGINE_SAMPLING_RANDOM_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace tandem::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32 with 10 rounds, bit-compatible with Random123's philox4x32_10 (and hence with
// cuRAND's / PyTorch's Philox). Thread-safe (a pure function).
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key);

// Uniform double in [0, 1): (a >> 5) * 2^26 + (b >> 6), divided by 2^53. Exact, no rounding.
double UniformDouble(uint32_t a, uint32_t b);

// Streams of one request's random numbers (the third counter word), so that features added later
// draw numbers independent of the sampling draw.
enum class RandomStream : uint32_t { kSampling = 0 };

// The uniform number in [0, 1) that the request with `seed` uses at output position `position`
// (0 for the first generated token) in `stream`.
double UniformAt(uint64_t seed, uint64_t position, RandomStream stream);

// Source of seeds for requests that did not set one. Implementations must be thread-safe.
class SeedSource {
 public:
  virtual ~SeedSource() = default;
  virtual uint64_t NextSeed() = 0;
};

// The process-wide seed source: by default a SplitMix64 sequence started from std::random_device
// at first use (lock-free, thread-safe). Never null.
SeedSource& ProcessSeedSource();

// Replaces the process-wide source (nullptr restores the default) and returns the previous
// override (nullptr when it was the default). `source` must outlive its use. For tests and for
// main(); thread-safe, but Samplers created concurrently may see either source.
SeedSource* SetProcessSeedSource(SeedSource* source);

// SplitMix64 (Steele et al.): a sequence of well-mixed 64-bit seeds from a start value. Handy as
// an injected SeedSource in tests. Thread-safe.
class SplitMix64SeedSource final : public SeedSource {
 public:
  explicit SplitMix64SeedSource(uint64_t start) : state_(start) {}
  uint64_t NextSeed() override;

 private:
  std::atomic<uint64_t> state_;
};

// The SplitMix64 output function (a bijective 64-bit mixer).
uint64_t SplitMix64Mix(uint64_t z);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_RANDOM_H_
