// Internal to engine/model: what one architecture file provides to the loader's registry, and the
// Llama-family mapping the architecture files share.
#ifndef TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_
#define TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"

namespace tandem {

struct GgufArchitecture {
  absl::string_view name;  // `general.architecture` value
  absl::StatusOr<ModelConfig> (*config_from_gguf)(const GgufFile& file);
  absl::StatusOr<ModelWeights> (*weights_from_gguf)(const GgufFile& file,
                                                    const ModelConfig& config);
};

const GgufArchitecture& LlamaArchitecture();  // arch_llama.cc
const GgufArchitecture& Qwen2Architecture();  // arch_qwen2.cc
const GgufArchitecture& Qwen3Architecture();  // arch_qwen3.cc

// Shared by the Llama-family architectures (llama_family.cc).
struct LlamaFamilyTraits {
  absl::string_view arch;        // metadata key prefix, e.g. "llama"
  float default_rms_norm_eps;    // when `{arch}.attention.layer_norm_rms_epsilon` is absent
  float default_rope_theta;      // when `{arch}.rope.freq_base` is absent
  bool attention_bias;           // Q/K/V bias tensors are required
  bool qk_norm;                  // per-head Q/K norm tensors (attn_{q,k}_norm) are required
  bool rope_neox;                // ModelConfig::rope_neox for this architecture's files
};
absl::StatusOr<ModelConfig> LlamaFamilyConfigFromGguf(const GgufFile& file,
                                                      const LlamaFamilyTraits& traits);
absl::StatusOr<ModelWeights> LlamaFamilyWeightsFromGguf(const GgufFile& file,
                                                        const ModelConfig& config);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_GGUF_ARCHITECTURE_H_
