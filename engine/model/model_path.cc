#include "engine/model/model_path.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "nlohmann/json.hpp"

namespace tandem {

std::string ModelsDir(absl::string_view models_dir) {
  if (!models_dir.empty()) return std::string(models_dir);
  return absl::StrCat(kSourceDir, "/models");
}

absl::StatusOr<std::string> ResolveModelPath(absl::string_view model, absl::string_view models_dir) {
  const bool is_default = model.empty();
  std::string path =
      is_default ? absl::StrCat(ModelsDir(models_dir), "/", kDefaultModelFile) : std::string(model);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st {};
  if (!is_default && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (absl::Status folder = CheckHfModelFolder(path); !folder.ok()) return folder;
    return path;
  }
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(
        is_default ? absl::StrCat("the default model is missing at ", path,
                                  "; run scripts/setup.sh to download and verify it")
                   : absl::StrCat("model ", path,
                                  " does not exist or is neither a GGUF file nor a folder"));
  }
  return path;
}

absl::Status CheckHfModelFolder(const std::string& dir) {
  auto is_file = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  auto missing = [&](absl::string_view file, absl::string_view why) {
    return absl::NotFoundError(absl::StrCat("model folder ", dir, " has no ", file, " (", why,
                                            "); a Hugging Face model folder needs config.json, "
                                            "*.safetensors and tokenizer.json"));
  };
  if (!is_file(dir + "/config.json")) return missing("config.json", "the model's shape");
  if (!is_file(dir + "/tokenizer.json")) return missing("tokenizer.json", "the tokenizer");
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (is_file(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json index =
        nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    auto map = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || map == index.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": expected a JSON object with a \"weight_map\" object"));
    }
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": the shard of ", tensor, " is not a file name"));
      }
      const std::string name = shard.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || !is_file(dir + "/" + name)) {
        return missing(name, absl::StrCat("a shard model.safetensors.index.json names, holding ",
                                          tensor));
      }
    }
    return absl::OkStatus();
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") return absl::OkStatus();
  }
  return missing("*.safetensors file", "the weights");
}

}  // namespace tandem
