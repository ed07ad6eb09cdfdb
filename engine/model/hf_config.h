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
// MistralForCausalLM map to "llama", Qwen2ForCausalLM to "qwen2" (attention_bias always true),
// Qwen3ForCausalLM to "qwen3" (qk_norm), Phi3ForCausalLM to "phi3" (no biases; fused qkv_proj and
// gate_up_proj), GemmaForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM to "gemma" / "gemma2" /
// "gemma3" (below); others are UNIMPLEMENTED, naming them (Gemma3ForConditionalGeneration and any
// config with a vision_config as a vision model). Keys: vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: heads),
// head_dim (default: hidden / heads), max_position_embeddings, rms_norm_eps (default 1e-6; Phi-3
// 1e-5), rope_theta (default 10000), rope_scaling (null | {"rope_type"/"type": "linear", "factor"}
// | {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
// "original_max_position_embeddings"} | {"rope_type"/"type": "longrope", "long_factor",
// "short_factor", optional "attention_factor"} with original_max_position_embeddings at the top
// level or inside), tie_word_embeddings (default false), attention_bias
// (Llama, Mistral, Qwen3; default false), sliding_window (Mistral, Phi-3: every layer; null or
// absent: none; Qwen2/Qwen3 only with use_sliding_window, which is UNIMPLEMENTED as it windows
// only some layers), partial_rotary_factor (UNIMPLEMENTED unless 1). Gemma, with the defaults of
// transformers' Gemma config classes: head_dim 256, tie_word_embeddings true, embeddings scaled by
// sqrt(hidden_size), the GELU (tanh) of hidden_activation (Gemma 1: else hidden_act; anything
// but gelu_pytorch_tanh is UNIMPLEMENTED); Gemma 2/3 also post norms, q·k scaled by
// 1 / sqrt(query_pre_attn_scalar) (256), attn_logit_softcapping and final_logit_softcapping
// (Gemma 2: 50 and 30, Gemma 3: none; null: none), sliding_window (4096; Gemma 2: null for none)
// on the layers layer_types names "sliding_attention", else every other layer from 0 (Gemma 2) or
// all but the last of each sliding_window_pattern (6) layers (Gemma 3), whose RoPE base is
// rope_local_base_freq (10000; rope_theta defaults to 1e6 and rope_scaling is the full-attention
// layers'; use_bidirectional_attention true is UNIMPLEMENTED). transformers 5 writes the RoPE
// settings as rope_parameters instead: one object with rope_theta and the rope_scaling keys
// ("rope_type", ...; partial_rotary_factor), or, for Gemma 3, one per layer type
// ({"full_attention": {...}, "sliding_attention": {...}}: the global layers' base and scaling,
// the windowed layers' base; a scaling there, or settings that differ per layer type in another
// family, is UNIMPLEMENTED). Read as transformers 5 reads them: a rope_scaling that is not null
// gives the scaling, and a base inside the RoPE object wins over the top-level rope_theta.
// The result is validated.
// Errors name `source` (e.g. the file path) and the key.
absl::StatusOr<ModelConfig> ModelConfigFromHfConfigJson(absl::string_view json_text,
                                                        absl::string_view source);

// Reads the file at `path` (e.g. "<model dir>/config.json") and maps it as above.
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

// {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
//  "Phi3ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"}.
std::vector<std::string> SupportedHfArchitectures();

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_HF_CONFIG_H_
