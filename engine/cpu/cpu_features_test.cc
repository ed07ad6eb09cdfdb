#include "engine/cpu/cpu_features.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(CpuFeaturesTest, ScalarIsAlwaysSupportedAndBestIsSupported) {
  const CpuFeatures& host = HostCpuFeatures();
  EXPECT_TRUE(IsaSupported(Isa::kScalar, host));
  EXPECT_TRUE(IsaSupported(BestIsa(host), host));
  EXPECT_TRUE(IsaSupported(ActiveIsa(), host));
  EXPECT_TRUE(IsaSupported(Isa::kScalar, CpuFeatures{}));
  EXPECT_FALSE(IsaSupported(Isa::kAvx2, CpuFeatures{}));
  EXPECT_EQ(BestIsa(CpuFeatures{}), Isa::kScalar);
  // AVX-512 without VNNI falls back to AVX2.
  EXPECT_EQ(BestIsa(CpuFeatures{.avx2 = true, .avx512 = true}), Isa::kAvx2);
  RecordProperty("cpu_features", CpuFeaturesSummary(host));
  std::printf("host CPU: %s; active ISA: %s\n", CpuFeaturesSummary(host).c_str(),
              std::string(IsaName(ActiveIsa())).c_str());
}

TEST(CpuFeaturesTest, Summary) {
  EXPECT_EQ(CpuFeaturesSummary(CpuFeatures{}), "none");
  EXPECT_EQ(CpuFeaturesSummary(CpuFeatures{.avx2 = true, .avx512 = true, .avx512_vnni = true}),
            "avx2 avx512 avx512_vnni");
}

TEST(CpuFeaturesTest, ParseIsa) {
  for (Isa isa : kAllIsas) {
    absl::StatusOr<Isa> parsed = ParseIsa(IsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(*ParseIsa("AVX2"), Isa::kAvx2);
  EXPECT_EQ(ParseIsa("sse9").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuFeaturesTest, SelectIsaForcesDownButNotUp) {
  const CpuFeatures all{.avx2 = true, .avx512 = true, .avx512_vnni = true};
  EXPECT_EQ(SelectIsa(all, {}), Isa::kAvx512);
  EXPECT_EQ(SelectIsa(all, {.max_isa = Isa::kScalar}), Isa::kScalar);
  EXPECT_EQ(SelectIsa(all, {.max_isa = Isa::kAvx2}), Isa::kAvx2);
  const CpuFeatures avx2_only{.avx2 = true};
  EXPECT_EQ(SelectIsa(avx2_only, {.max_isa = Isa::kAvx512}), Isa::kAvx2);
}

}  // namespace
}  // namespace tandem::cpu
