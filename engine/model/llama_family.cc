// The GGUF metadata and tensor mapping shared by the Llama-family architectures.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/model/gguf_architecture.h"

namespace tandem {
namespace {

std::string Key(const LlamaFamilyTraits& t, absl::string_view suffix) {
  return absl::StrCat(t.arch, ".", suffix);
}

// Reads an optional size, or `fallback` when the key is absent.
absl::StatusOr<int64_t> OptionalSize(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.Has(key)) return fallback;
  ASSIGN_OR_RETURN(uint32_t v, f.GetUint32(key));
  return static_cast<int64_t>(v);
}

absl::StatusOr<float> OptionalFloat(const GgufFile& f, const std::string& key, float fallback) {
  if (!f.Has(key)) return fallback;
  return f.GetFloat32(key);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("{", absl::StrJoin(shape, ", "), "}");
}

absl::Status ReadRopeScaling(const GgufFile& f, const LlamaFamilyTraits& t, ModelConfig* c) {
  const std::string type_key = Key(t, "rope.scaling.type");
  const std::string factor_key = Key(t, "rope.scaling.factor");
  if (!f.Has(type_key)) {
    // Older conversions wrote a bare linear factor.
    const std::string legacy = Key(t, "rope.scale_linear");
    if (f.Has(legacy)) {
      ASSIGN_OR_RETURN(float factor, f.GetFloat32(legacy));
      if (factor != 1.0f) {
        c->rope_scaling.type = RopeScaling::Type::kLinear;
        c->rope_scaling.factor = factor;
      }
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(absl::string_view type, f.GetString(type_key));
  if (type == "none") return absl::OkStatus();
  if (type == "linear") {
    c->rope_scaling.type = RopeScaling::Type::kLinear;
    ASSIGN_OR_RETURN(c->rope_scaling.factor, f.GetFloat32(factor_key));
    return absl::OkStatus();
  }
  if (type == "llama3") {
    c->rope_scaling.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(c->rope_scaling.factor, f.GetFloat32(factor_key));
    ASSIGN_OR_RETURN(c->rope_scaling.low_freq_factor,
                     OptionalFloat(f, Key(t, "rope.scaling.low_freq_factor"), 1.0f));
    ASSIGN_OR_RETURN(c->rope_scaling.high_freq_factor,
                     OptionalFloat(f, Key(t, "rope.scaling.high_freq_factor"), 4.0f));
    ASSIGN_OR_RETURN(c->rope_scaling.original_max_position,
                     OptionalSize(f, Key(t, "rope.scaling.original_context_length"), 8192));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(f.path(), ": metadata key '", type_key,
                                               "': rope scaling '", type,
                                               "' is not supported (supported: none, linear, "
                                               "llama3)"));
}

// ModelConfig::sliding_layers from the architecture's period or the file's
// `{arch}.attention.sliding_window_pattern` (a period, or one bool per layer).
absl::Status ReadSlidingLayers(const GgufFile& f, const LlamaFamilyTraits& t, ModelConfig* c) {
  const std::string key = Key(t, "attention.sliding_window_pattern");
  if (c->sliding_window <= 0) return absl::OkStatus();
  if (t.sliding_window_period == 0) {
    // Every layer windowed alike (Mistral).
    if (f.Has(key)) {
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": metadata key '", key, "': per-layer sliding-window patterns are not "
          "supported for ", t.arch));
    }
    return absl::OkStatus();
  }
  if (c->num_layers <= 0 || c->num_layers > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": block_count ", c->num_layers,
                                                   " is out of range"));
  }
  const size_t layers = static_cast<size_t>(c->num_layers);
  const GgufValue* v = f.Find(key);
  if (v != nullptr && v->type() == GgufValueType::kArray) {
    if (v->element_type() != GgufValueType::kBool || v->size() != c->num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": metadata key '", key, "': expected an array of ", c->num_layers,
          " bools (one per layer) or a period"));
    }
    c->sliding_layers.resize(layers);
    for (size_t l = 0; l < layers; ++l) {
      c->sliding_layers[l] = v->element(static_cast<int64_t>(l)).AsBool().value_or(false);
    }
    return absl::OkStatus();
  }
  int64_t period = t.sliding_window_period;
  if (v != nullptr) {
    ASSIGN_OR_RETURN(period, OptionalSize(f, key, period));
  }
  c->sliding_layers.resize(layers);
  // Period 0 windows every layer; else the last layer of each period attends fully.
  for (size_t l = 0; l < layers; ++l) {
    c->sliding_layers[l] = period == 0 || static_cast<int64_t>(l) % period < period - 1;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> LlamaFamilyConfigFromGguf(const GgufFile& f,
                                                      const LlamaFamilyTraits& t) {
  ModelConfig c;
  c.architecture = std::string(t.arch);
  c.attention_bias = t.attention_bias;
  c.qk_norm = t.qk_norm;
  c.rope_neox = t.rope_neox;
  ASSIGN_OR_RETURN(c.num_layers, f.GetUint32(Key(t, "block_count")));
  ASSIGN_OR_RETURN(c.hidden_size, f.GetUint32(Key(t, "embedding_length")));
  ASSIGN_OR_RETURN(c.intermediate_size, f.GetUint32(Key(t, "feed_forward_length")));
  ASSIGN_OR_RETURN(c.num_heads, f.GetUint32(Key(t, "attention.head_count")));
  ASSIGN_OR_RETURN(c.num_kv_heads,
                   OptionalSize(f, Key(t, "attention.head_count_kv"), c.num_heads));
  ASSIGN_OR_RETURN(c.max_context, f.GetUint32(Key(t, "context_length")));
  ASSIGN_OR_RETURN(c.rms_norm_eps, OptionalFloat(f, Key(t, "attention.layer_norm_rms_epsilon"),
                                                 t.default_rms_norm_eps));
  ASSIGN_OR_RETURN(c.rope_theta, OptionalFloat(f, Key(t, "rope.freq_base"), t.default_rope_theta));
  if (c.num_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": metadata key '", Key(t, "attention.head_count"), "' must be positive"));
  }
  ASSIGN_OR_RETURN(c.head_dim, OptionalSize(f, Key(t, "attention.key_length"),
                                            c.hidden_size / c.num_heads));
  ASSIGN_OR_RETURN(int64_t value_dim, OptionalSize(f, Key(t, "attention.value_length"),
                                                   c.head_dim));
  if (value_dim != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": attention.key_length ", c.head_dim, " != attention.value_length ",
        value_dim, " is not supported"));
  }
  ASSIGN_OR_RETURN(int64_t rope_dims,
                   OptionalSize(f, Key(t, "rope.dimension_count"), c.head_dim));
  if (rope_dims != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": metadata key '", Key(t, "rope.dimension_count"), "' = ", rope_dims,
        ": partial RoPE (head_dim ", c.head_dim, ") is not supported"));
  }
  RETURN_IF_ERROR(ReadRopeScaling(f, t, &c));
  ASSIGN_OR_RETURN(c.sliding_window, OptionalSize(f, Key(t, "attention.sliding_window"),
                                                  t.default_sliding_window));
  RETURN_IF_ERROR(ReadSlidingLayers(f, t, &c));
  c.post_norms = t.post_norms;

  // Vocabulary: the tokenizer's token list, else `{arch}.vocab_size`, else the embedding rows.
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (const GgufValue* tokens = f.Find("tokenizer.ggml.tokens")) {
    if (tokens->type() != GgufValueType::kArray ||
        tokens->element_type() != GgufValueType::kString) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": metadata key 'tokenizer.ggml.tokens': expected array of string"));
    }
    c.vocab_size = tokens->size();
  } else if (f.Has(Key(t, "vocab_size"))) {
    ASSIGN_OR_RETURN(c.vocab_size, f.GetUint32(Key(t, "vocab_size")));
  } else if (embd != nullptr && embd->shape.size() == 2) {
    c.vocab_size = embd->shape[1];
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  RETURN_IF_ERROR(Annotate(c.Validate(), f.path()));
  return c;
}

absl::StatusOr<const GgufTensor*> RequireGgufTensor(const GgufFile& f, const ModelConfig& c,
                                                    const std::string& name,
                                                    const std::vector<int64_t>& shape) {
  const GgufTensor* t = f.FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": tensor '", name, "' not found (",
                                            c.architecture, " expects shape ", ShapeString(shape),
                                            ")"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name,
                                                   "': expected shape ", ShapeString(shape),
                                                   ", got ", ShapeString(t->shape)));
  }
  return t;
}

absl::Status GgufTopLevelWeights(const GgufFile& f, const ModelConfig& c, ModelWeights* w) {
  const int64_t h = c.hidden_size;
  ASSIGN_OR_RETURN(w->token_embd, RequireGgufTensor(f, c, "token_embd.weight", {h, c.vocab_size}));
  ASSIGN_OR_RETURN(w->output_norm, RequireGgufTensor(f, c, "output_norm.weight", {h}));
  if (c.tie_word_embeddings) {
    w->output = w->token_embd;
  } else {
    ASSIGN_OR_RETURN(w->output, RequireGgufTensor(f, c, "output.weight", {h, c.vocab_size}));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelWeights> LlamaFamilyWeightsFromGguf(
    const GgufFile& f, const ModelConfig& c, std::vector<std::shared_ptr<const void>>* /*owners*/) {
  auto require = [&](const std::string& name,
                     const std::vector<int64_t>& shape) -> absl::StatusOr<const GgufTensor*> {
    return RequireGgufTensor(f, c, name, shape);
  };
  const int64_t h = c.hidden_size;
  const int64_t dq = c.num_heads * c.head_dim;
  const int64_t dkv = c.num_kv_heads * c.head_dim;
  ModelWeights w;
  RETURN_IF_ERROR(GgufTopLevelWeights(f, c, &w));
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    ASSIGN_OR_RETURN(w.rope_freqs, require("rope_freqs.weight", {c.head_dim / 2}));
  }
  // One layer at a time, as its tensors are found: block_count is the file's word, and a
  // count past its tensors fails at the first missing one instead of allocating them all.
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers.emplace_back();
    auto name = [i](absl::string_view part) { return absl::StrCat("blk.", i, ".", part); };
    ASSIGN_OR_RETURN(l.attn_norm, require(name("attn_norm.weight"), {h}));
    ASSIGN_OR_RETURN(l.attn_q, require(name("attn_q.weight"), {h, dq}));
    ASSIGN_OR_RETURN(l.attn_k, require(name("attn_k.weight"), {h, dkv}));
    ASSIGN_OR_RETURN(l.attn_v, require(name("attn_v.weight"), {h, dkv}));
    ASSIGN_OR_RETURN(l.attn_output, require(name("attn_output.weight"), {dq, h}));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(l.attn_q_bias, require(name("attn_q.bias"), {dq}));
      ASSIGN_OR_RETURN(l.attn_k_bias, require(name("attn_k.bias"), {dkv}));
      ASSIGN_OR_RETURN(l.attn_v_bias, require(name("attn_v.bias"), {dkv}));
    } else {
      for (absl::string_view b : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) {
        if (f.FindTensor(name(b)) != nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(f.path(), ": tensor '", name(b), "' present, but architecture ",
                           c.architecture, " has no attention biases"));
        }
      }
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(l.attn_q_norm, require(name("attn_q_norm.weight"), {c.head_dim}));
      ASSIGN_OR_RETURN(l.attn_k_norm, require(name("attn_k_norm.weight"), {c.head_dim}));
    } else {
      for (absl::string_view n : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
        if (f.FindTensor(name(n)) != nullptr) {
          return absl::UnimplementedError(
              absl::StrCat(f.path(), ": tensor '", name(n), "' present, but architecture ",
                           c.architecture, " has no Q/K norms"));
        }
      }
    }
    if (c.post_norms) {
      ASSIGN_OR_RETURN(l.attn_post_norm, require(name("post_attention_norm.weight"), {h}));
      ASSIGN_OR_RETURN(l.ffn_post_norm, require(name("post_ffw_norm.weight"), {h}));
    }
    ASSIGN_OR_RETURN(l.ffn_norm, require(name("ffn_norm.weight"), {h}));
    ASSIGN_OR_RETURN(l.ffn_gate, require(name("ffn_gate.weight"), {h, c.intermediate_size}));
    ASSIGN_OR_RETURN(l.ffn_up, require(name("ffn_up.weight"), {h, c.intermediate_size}));
    ASSIGN_OR_RETURN(l.ffn_down, require(name("ffn_down.weight"), {c.intermediate_size, h}));
  }
  return w;
}

}  // namespace tandem
