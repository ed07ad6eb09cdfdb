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
  // A folder that is not a Hugging Face model: the error names the first missing file.
  const auto folder = ResolveModelPath(dir, "");
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(folder.status().message()), HasSubstr("config.json"));
}

TEST(DefaultModelTest, HfFolderNeedsEveryPiece) {
  std::string pattern = ::testing::TempDir() + "/hf_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  std::ofstream(dir + "/config.json") << "{}";
  EXPECT_THAT(std::string(ResolveModelPath(dir, "").status().message()),
              HasSubstr("tokenizer.json"));
  std::ofstream(dir + "/tokenizer.json") << "{}";
  EXPECT_THAT(std::string(ResolveModelPath(dir, "").status().message()),
              HasSubstr("*.safetensors"));
  std::ofstream(dir + "/model-00001-of-00002.safetensors") << "x";
  EXPECT_EQ(*ResolveModelPath(dir + "//", ""), dir);
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}})";
  const auto shard = ResolveModelPath(dir, "");
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(shard.status().message()), HasSubstr("model-00002-of-00002"));
  std::ofstream(dir + "/model.safetensors.index.json") << "[1, 2";
  EXPECT_EQ(ResolveModelPath(dir, "").status().code(), absl::StatusCode::kInvalidArgument);
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
