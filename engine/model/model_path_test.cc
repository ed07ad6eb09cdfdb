#include "engine/model/model_path.h"

#include <stdlib.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(DefaultModelTest, ExplicitModelMustExist) {
  std::string pattern = ::testing::TempDir() + "/explicit_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  const std::string file = dir + "/m.gguf";
  std::ofstream(file) << "x";
  EXPECT_EQ(*ResolveModelPath(file, ""), file);
  const auto missing = ResolveModelPath(dir + "/nope.gguf", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.gguf"));
  EXPECT_EQ(ResolveModelPath(dir, "").status().code(), absl::StatusCode::kNotFound);  // a folder
}

TEST(DefaultModelTest, DefaultComesFromModelsDir) {
  std::string pattern = ::testing::TempDir() + "/models_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  const auto missing = ResolveModelPath("", dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("scripts/setup.sh"));
  std::ofstream(absl::StrCat(dir, "/", kDefaultModelFile)) << "gguf";
  EXPECT_EQ(*ResolveModelPath("", dir), absl::StrCat(dir, "/", kDefaultModelFile));
  EXPECT_EQ(ModelsDir(dir), dir);
  EXPECT_THAT(ModelsDir(""), HasSubstr("/models"));
}

}  // namespace
}  // namespace tandem
