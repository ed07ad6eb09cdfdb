#include "common/device.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(DeviceTest, CpuOnlyBuildSaysSo) {
  if (BuiltWithCuda()) GTEST_SKIP() << "this build has CUDA; the CPU-only answer is not in it";
  EXPECT_EQ(ListGpus().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RunGpuSelfTest(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DeviceTest, EveryVisibleGpuPassesTheSelfTest) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
  const auto gpus = ListGpus();
  if (!gpus.ok()) {
    // A machine without a GPU must say so with UNAVAILABLE, never crash.
    ASSERT_EQ(gpus.status().code(), absl::StatusCode::kUnavailable) << gpus.status();
    GTEST_SKIP() << "no GPU on this machine: " << gpus.status();
  }
  ASSERT_FALSE(gpus->empty());
  for (const GpuInfo& gpu : *gpus) {
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.total_memory_bytes, 0u);
    EXPECT_GE(gpu.compute_capability_major, 7);
    EXPECT_TRUE(RunGpuSelfTest(gpu.index).ok()) << gpu.name;
  }
}

}  // namespace
}  // namespace tandem
