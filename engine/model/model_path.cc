#include "engine/model/model_path.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "nlohmann/json.hpp"

namespace tandem {

std::string ModelsDir(absl::string_view models_dir) {
  if (!models_dir.empty()) return std::string(models_dir);
  return absl::StrCat(kSourceDir, "/models");
}

namespace {

enum class PathKind { kMissing, kFile, kFolder, kOther };

PathKind KindOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kFolder;
  return PathKind::kOther;
}

// The names --model takes from `dir`: its *.gguf files (without the suffix) and its folders,
// sorted; empty when `dir` cannot be read.
std::vector<std::string> ModelNamesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path& entry = it->path();
    if (entry.filename().string().starts_with(".")) continue;
    const PathKind kind = KindOf(entry.string());
    if (kind == PathKind::kFolder) {
      names.push_back(entry.filename().string());
    } else if (kind == PathKind::kFile && entry.extension() == ".gguf") {
      names.push_back(entry.stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// `path` when it is a GGUF file or a Hugging Face folder CheckHfModelFolder accepts.
absl::StatusOr<std::string> AcceptModelAt(const std::string& path, PathKind kind) {
  if (kind == PathKind::kFolder) RETURN_IF_ERROR(CheckHfModelFolder(path));
  return path;
}

}  // namespace

absl::StatusOr<std::string> ResolveModelPath(absl::string_view model, absl::string_view models_dir) {
  const std::string dir = ModelsDir(models_dir);
  if (model.empty()) {
    const std::string path = absl::StrCat(dir, "/", kDefaultModelFile);
    if (KindOf(path) != PathKind::kFile) {
      return absl::NotFoundError(absl::StrCat(
          "the default model is missing at ", path,
          "; run scripts/setup.sh to download and verify it"));
    }
    return path;
  }
  std::string path(model);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const PathKind kind = KindOf(path);
  if (kind == PathKind::kFile || kind == PathKind::kFolder) return AcceptModelAt(path, kind);
  if (kind == PathKind::kOther) {
    return absl::NotFoundError(
        absl::StrCat("model ", path, " is neither a GGUF file nor a folder"));
  }
  if (path.find('/') != std::string::npos) {
    return absl::NotFoundError(absl::StrCat("model ", path, " does not exist"));
  }
  // A bare name: a folder or GGUF file in the models folder.
  for (const std::string& candidate : {absl::StrCat(dir, "/", path),
                                       absl::StrCat(dir, "/", path, ".gguf")}) {
    const PathKind found = KindOf(candidate);
    if (found == PathKind::kFile || found == PathKind::kFolder) {
      return AcceptModelAt(candidate, found);
    }
  }
  const std::vector<std::string> names = ModelNamesIn(dir);
  return absl::NotFoundError(absl::StrCat(
      "model ", path, " is neither a file, a folder, nor a model in ", dir,
      KindOf(dir) != PathKind::kFolder ? std::string(", which does not exist")
      : names.empty()                  ? std::string(", which holds no models")
                                       : absl::StrCat(", which holds: ", absl::StrJoin(names, ", "))));
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
