#include "engine/sampling/random.h"

#include <cmath>
#include <cstdint>

#include "engine/sampling/deterministic_exp.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  struct Kat {
    PhiloxCounter counter;
    PhiloxKey key;
    PhiloxCounter want;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    EXPECT_EQ(Philox4x32(k.counter, k.key), k.want) << std::hex << k.counter[0];
  }
}

TEST(UniformTest, RangeEnds) {
  EXPECT_EQ(UniformDouble(0, 0), 0.0);
  EXPECT_LT(UniformDouble(0xffffffff, 0xffffffff), 1.0);
  EXPECT_EQ(UniformDouble(0xffffffff, 0xffffffff), 1.0 - 0x1.0p-53);
  EXPECT_EQ(UniformDouble(0x80000000, 0), 0.5);
}

TEST(UniformTest, UniformAtIsAPureFunctionOfSeedAndPosition) {
  EXPECT_EQ(UniformAt(7, 3, RandomStream::kSampling), UniformAt(7, 3, RandomStream::kSampling));
  EXPECT_NE(UniformAt(7, 3, RandomStream::kSampling), UniformAt(7, 4, RandomStream::kSampling));
  EXPECT_NE(UniformAt(7, 3, RandomStream::kSampling), UniformAt(8, 3, RandomStream::kSampling));
  // The mean of many draws is 1/2 (std of the mean: 1/sqrt(12 * 1e5) ~ 0.0009; 5 sigma).
  double sum = 0.0;
  for (uint64_t i = 0; i < 100000; ++i) sum += UniformAt(12345, i, RandomStream::kSampling);
  EXPECT_NEAR(sum / 100000, 0.5, 0.0046);
}

TEST(DeterministicExpTest, MatchesStdExpWithin5e7Relative) {
  for (double x = -87.0; x <= 88.0; x += 0.00137) {
    const auto xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    EXPECT_NEAR(DeterministicExp(xf), want, 5e-7 * want) << xf;
  }
  EXPECT_EQ(DeterministicExp(0.0f), 1.0f);
  EXPECT_EQ(DeterministicExp(-88.0f), 0.0f);
  EXPECT_EQ(DeterministicExp(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(DeterministicExp(89.0f)));
  EXPECT_TRUE(std::isnan(DeterministicExp(NAN)));
}

TEST(FixedOrderSumTest, SumsInBlocksOfEight) {
  const float v[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0.5f};
  EXPECT_EQ(FixedOrderSum(v, 11), 55.5);
  EXPECT_EQ(FixedOrderSum(v, 3), 6.0);
  EXPECT_EQ(FixedOrderSum(v, 0), 0.0);
  // 1e8 + 1 + ... in one chain of floats loses the ones; in double blocks it does not.
  const float big[8] = {1e8f, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(FixedOrderSum(big, 8), 1e8 + 7);
}

class FixedSeeds final : public SeedSource {
 public:
  uint64_t NextSeed() override { return next_++; }

 private:
  uint64_t next_ = 100;
};

TEST(SeedSourceTest, ProcessSourceCanBeReplacedAndRestored) {
  FixedSeeds fixed;
  EXPECT_EQ(SetProcessSeedSource(&fixed), nullptr);
  EXPECT_EQ(ProcessSeedSource().NextSeed(), 100u);
  EXPECT_EQ(ProcessSeedSource().NextSeed(), 101u);
  EXPECT_EQ(SetProcessSeedSource(nullptr), &fixed);
  // The default source gives different seeds on consecutive draws.
  EXPECT_NE(ProcessSeedSource().NextSeed(), ProcessSeedSource().NextSeed());
}

TEST(SeedSourceTest, SplitMixIsDeterministic) {
  SplitMix64SeedSource a(42), b(42), c(43);
  const uint64_t a1 = a.NextSeed();
  EXPECT_EQ(a1, b.NextSeed());
  EXPECT_NE(a1, c.NextSeed());
  EXPECT_NE(a1, a.NextSeed());
  // SplitMix64 reference value: the first output for state 0 is 0xE220A8397B1DCDAF.
  SplitMix64SeedSource zero(0);
  EXPECT_EQ(zero.NextSeed(), 0xE220A8397B1DCDAFull);
}

}  // namespace
}  // namespace tandem::sampling
