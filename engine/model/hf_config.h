// Hugging Face `config.json` -> ModelConfig, for models shipped as safetensors.
#ifndef TANDEM_ENGINE_MODEL_HF_CONFIG_H_
#define TANDEM_ENGINE_MODEL_HF_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"

namespace tandem {

// Maps a config.json text. `architectures[0]` picks the family: LlamaForCausalLM and
// MistralForCausalLM map to "llama", Qwen2ForCausalLM to "qwen2" (attention_bias always true);
// others are UNIMPLEMENTED, naming them. Keys: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (default: heads), head_dim
// (default: hidden / heads), max_position_embeddings, rms_norm_eps (default 1e-6),
// rope_theta (default 10000), rope_scaling (null | {"rope_type"/"type": "linear", "factor"} |
// {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
// "original_max_position_embeddings"}), tie_word_embeddings (default false), attention_bias
// (Llama; default false). The result is validated. Errors name `source` (e.g. the file path)
// and the key.
absl::StatusOr<ModelConfig> ModelConfigFromHfConfigJson(absl::string_view json_text,
                                                        absl::string_view source);

// Reads the file at `path` (e.g. "<model dir>/config.json") and maps it as above.
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

// {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}.
std::vector<std::string> SupportedHfArchitectures();

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_HF_CONFIG_H_
