#include "engine/model/model_path.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

TEST(DefaultModelTest, BareNameIsLookedUpInModelsDir) {
  std::string pattern = ::testing::TempDir() + "/named_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  // An empty models folder: the error says so.
  const auto empty = ResolveModelPath("tiny.Q4_1", dir);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("holds no models"));
  const auto absent = ResolveModelPath("tiny.Q4_1", dir + "/absent");
  EXPECT_THAT(std::string(absent.status().message()), HasSubstr("does not exist"));

  std::ofstream(dir + "/tiny.Q4_1.gguf") << "gguf";
  std::ofstream(dir + "/notes.txt") << "not a model";
  const std::string hf = dir + "/Tiny-HF";
  ASSERT_EQ(::mkdir(hf.c_str(), 0700), 0);
  std::ofstream(hf + "/config.json") << "{}";
  std::ofstream(hf + "/tokenizer.json") << "{}";
  std::ofstream(hf + "/model.safetensors") << "x";
  const std::string broken = dir + "/Broken-HF";
  ASSERT_EQ(::mkdir(broken.c_str(), 0700), 0);

  // A GGUF file by name, with or without its suffix; a Hugging Face folder by name.
  EXPECT_EQ(*ResolveModelPath("tiny.Q4_1", dir), dir + "/tiny.Q4_1.gguf");
  EXPECT_EQ(*ResolveModelPath("tiny.Q4_1.gguf", dir), dir + "/tiny.Q4_1.gguf");
  EXPECT_EQ(*ResolveModelPath("Tiny-HF", dir), hf);
  EXPECT_EQ(*ResolveModelPath("Tiny-HF/", dir), hf);
  // A folder found by name is still checked.
  const auto incomplete = ResolveModelPath("Broken-HF", dir);
  EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(incomplete.status().message()), HasSubstr("config.json"));
  // An unknown name lists what the folder holds (GGUF files without the suffix, folders), sorted.
  const auto unknown = ResolveModelPath("llama-70b", dir);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("llama-70b is neither a file, a folder, nor a model in " + dir +
                        ", which holds: Broken-HF, Tiny-HF, tiny.Q4_1"));
  EXPECT_THAT(std::string(unknown.status().message()), Not(HasSubstr("notes")));
  // A path with a slash is taken as a path, never looked up by name.
  const auto pathlike = ResolveModelPath("sub/tiny.Q4_1", dir);
  EXPECT_EQ(pathlike.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(pathlike.status().message()), Not(HasSubstr("holds")));
}

}  // namespace
}  // namespace tandem
