#include "engine/model/model_loader.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

// The registry: one entry per architecture file.
std::vector<const GgufArchitecture*> Architectures() {
  return {&LlamaArchitecture(),  &Qwen2Architecture(),  &Qwen3Architecture(), &Phi3Architecture(),
          &GemmaArchitecture(),  &Gemma2Architecture(), &Gemma3Architecture()};
}

absl::StatusOr<const GgufArchitecture*> FindArchitecture(const GgufFile& file) {
  ASSIGN_OR_RETURN(absl::string_view name, file.GetString("general.architecture"));
  for (const GgufArchitecture* a : Architectures()) {
    if (a->name == name) return a;
  }
  return absl::UnimplementedError(absl::StrCat(
      file.path(), ": architecture '", name, "' (general.architecture) is not supported; "
      "supported: ", absl::StrJoin(SupportedGgufArchitectures(), ", ")));
}

}  // namespace

std::vector<std::string> SupportedGgufArchitectures() {
  std::vector<std::string> names;
  for (const GgufArchitecture* a : Architectures()) names.emplace_back(a->name);
  return names;
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file) {
  ASSIGN_OR_RETURN(const GgufArchitecture* arch, FindArchitecture(file));
  return arch->config_from_gguf(file);
}

absl::StatusOr<LoadedModel> LoadGgufModel(std::unique_ptr<GgufFile> file) {
  ASSIGN_OR_RETURN(const GgufArchitecture* arch, FindArchitecture(*file));
  LoadedModel model;
  ASSIGN_OR_RETURN(model.config, arch->config_from_gguf(*file));
  ASSIGN_OR_RETURN(model.weights, arch->weights_from_gguf(*file, model.config, &model.owners));
  model.file = std::move(file);
  return model;
}

absl::StatusOr<LoadedModel> LoadGgufModel(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return LoadGgufModel(std::move(file));
}

}  // namespace tandem
