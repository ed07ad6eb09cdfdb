#include "engine/model/model_path.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/version.h"

namespace tandem {

std::string ModelsDir(absl::string_view models_dir) {
  if (!models_dir.empty()) return std::string(models_dir);
  return absl::StrCat(kSourceDir, "/models");
}

absl::StatusOr<std::string> ResolveModelPath(absl::string_view model, absl::string_view models_dir) {
  const bool is_default = model.empty();
  const std::string path =
      is_default ? absl::StrCat(ModelsDir(models_dir), "/", kDefaultModelFile) : std::string(model);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(
        is_default ? absl::StrCat("the default model is missing at ", path,
                                  "; run scripts/setup.sh to download and verify it")
                   : absl::StrCat("model file ", path, " does not exist or is not a file"));
  }
  return path;
}

}  // namespace tandem
