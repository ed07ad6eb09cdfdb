#include "common/flags.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int32_t, flags_test_port, 8000, "a port");
ABSL_FLAG(std::string, flags_test_policy, "round_robin", "a policy");
ABSL_FLAG(bool, flags_test_json, false, "a switch");
ABSL_FLAG(double, flags_test_ratio, 0.5, "a ratio");

namespace tandem {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// Sets environment variables for one test and restores the flags and the environment after it.
class FlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& name : set_) unsetenv(name.c_str());
    absl::SetFlag(&FLAGS_flags_test_port, 8000);
    absl::SetFlag(&FLAGS_flags_test_policy, "round_robin");
    absl::SetFlag(&FLAGS_flags_test_json, false);
    absl::SetFlag(&FLAGS_flags_test_ratio, 0.5);
  }
  void SetEnv(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  std::vector<std::string> set_;
};

TEST_F(FlagsTest, EnvironmentName) {
  EXPECT_EQ(FlagEnvironmentName("max_batch"), "TANDEM_MAX_BATCH");
  EXPECT_EQ(FlagEnvironmentName("kv-block.size"), "TANDEM_KV_BLOCK_SIZE");
  EXPECT_EQ(FlagEnvironmentName("x"), "TANDEM_X");
}

TEST_F(FlagsTest, EnvironmentSetsFlagsOfEveryType) {
  SetEnv("TANDEM_FLAGS_TEST_PORT", "9123");
  SetEnv("TANDEM_FLAGS_TEST_POLICY", "kv_aware");
  SetEnv("TANDEM_FLAGS_TEST_JSON", "true");
  SetEnv("TANDEM_FLAGS_TEST_RATIO", "0.75");
  ASSERT_TRUE(ApplyFlagEnvironment().ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_port), 9123);
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_policy), "kv_aware");
  EXPECT_TRUE(absl::GetFlag(FLAGS_flags_test_json));
  EXPECT_DOUBLE_EQ(absl::GetFlag(FLAGS_flags_test_ratio), 0.75);
}

TEST_F(FlagsTest, UnsetEnvironmentKeepsDefaults) {
  ASSERT_TRUE(ApplyFlagEnvironment().ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_port), 8000);
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_policy), "round_robin");
}

TEST_F(FlagsTest, BadValueNamesVariableAndFlag) {
  for (const char* bad : {"abc", "99999999999", "12x", ""}) {
    SetEnv("TANDEM_FLAGS_TEST_PORT", bad);
    const absl::Status status = ApplyFlagEnvironment();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr("TANDEM_FLAGS_TEST_PORT"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("--flags_test_port"));
  }
}

TEST_F(FlagsTest, CommandLineWinsOverEnvironment) {
  SetEnv("TANDEM_FLAGS_TEST_PORT", "9123");
  SetEnv("TANDEM_FLAGS_TEST_POLICY", "kv_aware");
  std::vector<std::string> args = {"prog", "--flags_test_port=7", "serve", "extra"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const std::vector<char*> positional =
      ParseFlagsWithEnvironment(static_cast<int>(argv.size()), argv.data(), "usage: prog");
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_port), 7);                // command line
  EXPECT_EQ(absl::GetFlag(FLAGS_flags_test_policy), "kv_aware");     // environment
  ASSERT_EQ(positional.size(), 3u);
  EXPECT_STREQ(positional[1], "serve");
  EXPECT_STREQ(positional[2], "extra");
}

TEST_F(FlagsTest, UnknownVariablesAreReported) {
  SetEnv("TANDEM_FLAGS_TEST_PROT", "1");  // typo
  SetEnv("TANDEM_FLAGS_TEST_PORT", "1");
  SetEnv("TANDEM_MODELS_HOME", "/x");
  const auto unknown = UnknownFlagEnvironment({"TANDEM_MODELS_HOME"});
  EXPECT_THAT(unknown, Contains("TANDEM_FLAGS_TEST_PROT"));
  EXPECT_THAT(unknown, Not(Contains("TANDEM_FLAGS_TEST_PORT")));
  EXPECT_THAT(unknown, Not(Contains("TANDEM_MODELS_HOME")));
}

TEST(FlagsDeathTest, BadEnvironmentExitsWithUsageError) {
  setenv("TANDEM_FLAGS_TEST_RATIO", "lots", 1);
  std::string prog = "prog";
  char* argv[] = {prog.data()};
  EXPECT_EXIT(ParseFlagsWithEnvironment(1, argv, "usage"), ::testing::ExitedWithCode(2),
              "TANDEM_FLAGS_TEST_RATIO='lots' is not a valid value for --flags_test_ratio");
  unsetenv("TANDEM_FLAGS_TEST_RATIO");
}

}  // namespace
}  // namespace tandem
