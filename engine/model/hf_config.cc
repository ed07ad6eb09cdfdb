#include "engine/model/hf_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/model/mapped_file.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

// Where a family's Q/K/V biases come from.
enum class Bias { kNever, kAlways, kFromConfig };

// How a family's config.json states a sliding window.
enum class Window {
  kSlidingWindow,     // `sliding_window` (null: none), every layer (Mistral; Phi-3)
  kUseSlidingWindow,  // only with `use_sliding_window: true` (default false); refused (Qwen2/3)
  kGemma,             // on some layers (ReadGemma)
};

// Which Gemma generation a family is (kNone: not Gemma).
enum class Gemma { kNone, k1, k2, k3 };

struct HfArchitecture {
  const char* hf_name;
  const char* arch;
  Bias bias;
  bool qk_norm;                // model.layers.N.self_attn.{q,k}_norm.weight (Qwen3)
  float default_rms_norm_eps;  // transformers' default for the family's config class
  Window window;
  Gemma gemma = Gemma::kNone;
  float default_rope_theta = 10000.0f;  // transformers' default for the family's config class
};
constexpr HfArchitecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Bias::kFromConfig, false, 1e-6f, Window::kSlidingWindow},
    {"MistralForCausalLM", "llama", Bias::kFromConfig, false, 1e-6f, Window::kSlidingWindow},
    {"Qwen2ForCausalLM", "qwen2", Bias::kAlways, false, 1e-6f, Window::kUseSlidingWindow},
    {"Qwen3ForCausalLM", "qwen3", Bias::kFromConfig, true, 1e-6f, Window::kUseSlidingWindow},
    {"Phi3ForCausalLM", "phi3", Bias::kNever, false, 1e-5f, Window::kSlidingWindow},
    {"GemmaForCausalLM", "gemma", Bias::kFromConfig, false, 1e-6f, Window::kGemma, Gemma::k1},
    {"Gemma2ForCausalLM", "gemma2", Bias::kFromConfig, false, 1e-6f, Window::kGemma, Gemma::k2},
    {"Gemma3ForCausalLM", "gemma3", Bias::kFromConfig, true, 1e-6f, Window::kGemma, Gemma::k3,
     1000000.0f},
};
// Gemma's head size when config.json does not state it (transformers' Gemma config classes).
constexpr int64_t kGemmaDefaultHeadDim = 256;
// The most num_hidden_layers accepted (real models have a few hundred at most).
constexpr int64_t kMaxLayers = int64_t{1} << 16;

class ConfigReader {
 public:
  explicit ConfigReader(absl::string_view source) : source_(source) {}

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": config.json key '", key, "': ", what));
  }
  absl::Status Unimplemented(absl::string_view key, absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(source_, ": config.json key '", key, "': ", what));
  }

  // A required (or defaulted, when `fallback` is set) non-negative integer.
  absl::StatusOr<int64_t> Int(const json& obj, absl::string_view key,
                              std::optional<int64_t> fallback = std::nullopt) const {
    const auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) {
      if (fallback) return *fallback;
      return absl::NotFoundError(absl::StrCat(source_, ": config.json key '", key, "' not found"));
    }
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return static_cast<int64_t>(v);
      }
    } else if (it->is_number_integer()) {
      return it->get<int64_t>();
    }
    return Error(key, absl::StrCat("expected an integer, got ", it->dump()));
  }

  absl::StatusOr<float> Float(const json& obj, absl::string_view key,
                              std::optional<float> fallback = std::nullopt) const {
    const auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) {
      if (fallback) return *fallback;
      return absl::NotFoundError(absl::StrCat(source_, ": config.json key '", key, "' not found"));
    }
    if (!it->is_number()) return Error(key, absl::StrCat("expected a number, got ", it->dump()));
    return static_cast<float>(it->get<double>());
  }

  // A required non-empty array of numbers.
  absl::StatusOr<std::vector<float>> FloatList(const json& obj, absl::string_view key) const {
    const auto it = obj.find(std::string(key));
    if (it == obj.end() || !it->is_array() || it->empty()) {
      return Error(key, "expected a non-empty array of numbers");
    }
    std::vector<float> out;
    out.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_number()) {
        return Error(key, absl::StrCat("entry ", i, ": expected a number, got ", (*it)[i].dump()));
      }
      out.push_back(static_cast<float>((*it)[i].get<double>()));
    }
    return out;
  }

  absl::StatusOr<bool> Bool(const json& obj, absl::string_view key, bool fallback) const {
    const auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(key, absl::StrCat("expected a bool, got ", it->dump()));
    return it->get<bool>();
  }

  absl::StatusOr<std::string> String(const json& obj, absl::string_view key) const {
    const auto it = obj.find(std::string(key));
    if (it == obj.end() || !it->is_string()) {
      return Error(key, "expected a string");
    }
    return it->get<std::string>();
  }

 private:
  absl::string_view source_;
};

// One RoPE settings object: `rope_scaling` (transformers < 5: "rope_type"/"type" and the scaling's
// keys) or `rope_parameters` (transformers 5: the same keys, plus "rope_theta" and
// "partial_rotary_factor"). `j` is the whole config (Phi-3 keeps original_max_position_embeddings
// at the top level).
// `key` names the object in errors.
absl::Status ReadRopeScaling(const ConfigReader& r, const json& j, const json& rs,
                             const char* key, ModelConfig* c) {
  // Phi-4-mini rotates only part of each head.
  ASSIGN_OR_RETURN(const float rotary_fraction, r.Float(rs, "partial_rotary_factor", 1.0f));
  if (rotary_fraction != 1.0f) {
    return r.Unimplemented("partial_rotary_factor",
                           absl::StrCat("RoPE over part of a head (", rotary_fraction,
                                        ") is not supported"));
  }
  if (!rs.contains("rope_type") && !rs.contains("type")) {
    for (const auto& [name, value] : rs.items()) {
      if (name != "rope_theta" && name != "partial_rotary_factor") {
        return r.Error(key, absl::StrCat("'", name, "' without a rope_type"));
      }
    }
    return absl::OkStatus();
  }
  std::string type;
  if (rs.contains("rope_type")) {
    ASSIGN_OR_RETURN(type, r.String(rs, "rope_type"));
  } else {
    ASSIGN_OR_RETURN(type, r.String(rs, "type"));
  }
  if (type == "default") return absl::OkStatus();
  if (type == "linear") {
    c->rope_scaling.type = RopeScaling::Type::kLinear;
    ASSIGN_OR_RETURN(c->rope_scaling.factor, r.Float(rs, "factor"));
    return absl::OkStatus();
  }
  if (type == "llama3") {
    c->rope_scaling.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(c->rope_scaling.factor, r.Float(rs, "factor"));
    ASSIGN_OR_RETURN(c->rope_scaling.low_freq_factor, r.Float(rs, "low_freq_factor", 1.0f));
    ASSIGN_OR_RETURN(c->rope_scaling.high_freq_factor, r.Float(rs, "high_freq_factor", 4.0f));
    ASSIGN_OR_RETURN(c->rope_scaling.original_max_position,
                     r.Int(rs, "original_max_position_embeddings", 8192));
    return absl::OkStatus();
  }
  if (type == "longrope" || type == "su") {  // "su": the first Phi-3-*-128k configs' name
    // Phi-3's LongRoPE. The context it was pretrained for is a top-level key in Phi-3 configs
    // (newer transformers also read it inside rope_scaling); the attention factor, unless
    // stated, is transformers' sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings /
    // original (s = rope_scaling.factor without an original), 1 when s <= 1.
    RopeScaling& out = c->rope_scaling;
    out.type = RopeScaling::Type::kLongRope;
    ASSIGN_OR_RETURN(out.long_factors, r.FloatList(rs, "long_factor"));
    ASSIGN_OR_RETURN(out.short_factors, r.FloatList(rs, "short_factor"));
    float scale = 1.0f;
    if (j.contains("original_max_position_embeddings") ||
        rs.contains("original_max_position_embeddings")) {
      const json& holder = j.contains("original_max_position_embeddings") ? j : rs;
      ASSIGN_OR_RETURN(out.original_max_position,
                       r.Int(holder, "original_max_position_embeddings"));
      if (out.original_max_position <= 0) {
        return r.Error("original_max_position_embeddings", "must be positive");
      }
      scale = static_cast<float>(static_cast<double>(c->max_context) /
                                 static_cast<double>(out.original_max_position));
    } else {
      out.original_max_position = c->max_context;
      ASSIGN_OR_RETURN(scale, r.Float(rs, "factor", 1.0f));
    }
    if (rs.contains("attention_factor") && !rs["attention_factor"].is_null()) {
      ASSIGN_OR_RETURN(out.attn_factor, r.Float(rs, "attention_factor"));
    } else if (scale > 1.0f && out.original_max_position > 1) {
      out.attn_factor = static_cast<float>(
          std::sqrt(1.0 + std::log(static_cast<double>(scale)) /
                              std::log(static_cast<double>(out.original_max_position))));
    }
    return absl::OkStatus();
  }
  return r.Unimplemented(key, absl::StrCat("RoPE type '", type, "' is not supported (supported: "
                                           "default, linear, llama3, longrope)"));
}

// Where config.json keeps the RoPE settings. transformers < 5 writes rope_theta and rope_scaling
// (and Gemma 3's rope_local_base_freq) at the top level; transformers 5 writes one
// rope_parameters object, or, where layers differ (Gemma 3), one per layer type:
// {"full_attention": {...}, "sliding_attention": {...}}. As transformers 5 reads them: a
// rope_scaling that is not null gives the scaling (over rope_parameters' own; for Gemma 3, the
// full-attention layers'), and each base comes from the RoPE object, else the top-level key,
// else the family's default. Anything else per layer type is UNIMPLEMENTED.
absl::Status ReadRope(const ConfigReader& r, const json& j, const HfArchitecture& arch,
                      ModelConfig* c) {
  static const json kNone = json::object();
  const json* params = &kNone;
  if (const auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return r.Error("rope_parameters", "expected an object or null");
    params = &*it;
  }
  const json* full = params;
  const json* sliding = nullptr;
  if (params->contains("full_attention") || params->contains("sliding_attention")) {
    full = sliding = &kNone;
    for (const auto& [key, value] : params->items()) {
      if (key != "full_attention" && key != "sliding_attention") {
        return r.Error("rope_parameters", absl::StrCat("'", key, "' next to per-layer-type "
                                                       "entries (full_attention, "
                                                       "sliding_attention)"));
      }
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return r.Error("rope_parameters", absl::StrCat("'", key, "': expected an object or null"));
      }
      (key == "full_attention" ? full : sliding) = &value;
    }
  }
  const json* scaling = full;
  const char* scaling_key = "rope_parameters";
  if (const auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return r.Error("rope_scaling", "expected an object or null");
    scaling = &*it;
    scaling_key = "rope_scaling";
    // transformers 5 replaces a flat rope_parameters with it (and updates the full-attention
    // layers' with it).
    if (sliding == nullptr) full = scaling;
  }
  // The base: the scaling's object, the full-attention layers' (per layer type), the top level.
  const json* theta_holder = &j;
  for (const json* o : {scaling, full}) {
    if (o->contains("rope_theta") && !(*o)["rope_theta"].is_null()) {
      theta_holder = o;
      break;
    }
  }
  ASSIGN_OR_RETURN(c->rope_theta, r.Float(*theta_holder, "rope_theta", arch.default_rope_theta));
  ASSIGN_OR_RETURN(const float top_fraction, r.Float(j, "partial_rotary_factor", 1.0f));
  if (top_fraction != 1.0f) {
    return r.Unimplemented("partial_rotary_factor",
                           absl::StrCat("RoPE over part of a head (", top_fraction,
                                        ") is not supported"));
  }
  RETURN_IF_ERROR(ReadRopeScaling(r, j, *scaling, scaling_key, c));
  if (arch.gemma == Gemma::k3) {
    // The windowed layers: their own base (rope_local_base_freq before transformers 5), no
    // scaling.
    const json* local = &j;
    const char* key = "rope_local_base_freq";
    if (sliding != nullptr && sliding->contains("rope_theta")) {
      local = sliding;
      key = "rope_theta";
    }
    ASSIGN_OR_RETURN(c->rope_theta_sliding, r.Float(*local, key, 10000.0f));
    if (sliding != nullptr) {
      ModelConfig unscaled;
      RETURN_IF_ERROR(ReadRopeScaling(r, j, *sliding, "rope_parameters", &unscaled));
      if (unscaled.rope_scaling.type != RopeScaling::Type::kNone) {
        return r.Unimplemented("rope_parameters",
                               "a RoPE scaling on the sliding-window layers is not supported");
      }
    }
  } else if (sliding != nullptr && *sliding != *full) {
    return r.Unimplemented("rope_parameters",
                           "RoPE settings that differ per layer type are not supported for this "
                           "architecture");
  }
  return absl::OkStatus();
}

// A soft-cap key: absent -> `fallback` (the config class's default), null -> 0 (none).
absl::StatusOr<float> SoftCap(const ConfigReader& r, const json& j, const char* key,
                              float fallback) {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return 0.0f;
  ASSIGN_OR_RETURN(const float cap, r.Float(j, key));
  if (!(cap > 0.0f) || !std::isfinite(cap)) return r.Error(key, "must be positive or null");
  return cap;
}

// What Gemma changes (the config keys of transformers' Gemma, Gemma2 and Gemma3Text configs).
// The +1 of Gemma's RMSNorm weights is the loader's (hf_model_loader.cc).
absl::Status ReadGemma(const ConfigReader& r, const json& j, Gemma gemma, ModelConfig* c) {
  c->embedding_scale = std::sqrt(static_cast<float>(c->hidden_size));
  // Gemma 1's modeling code reads hidden_act; its released configs say "gelu" there and
  // "gelu_pytorch_tanh" in hidden_activation, which is what the model was trained with (and what
  // llama.cpp runs). Gemma 2/3 read hidden_activation.
  const char* act_key = "hidden_activation";
  if (gemma == Gemma::k1 && (!j.contains(act_key) || j[act_key].is_null())) act_key = "hidden_act";
  std::string act = "gelu_pytorch_tanh";
  if (j.contains(act_key) && !j[act_key].is_null()) {
    ASSIGN_OR_RETURN(act, r.String(j, act_key));
  }
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh") {
    return r.Unimplemented(act_key, absl::StrCat("activation '", act, "' is not supported for "
                                                 "Gemma (supported: gelu_pytorch_tanh)"));
  }
  c->ffn_activation = ModelConfig::Activation::kGeluTanh;
  if (gemma == Gemma::k1) return absl::OkStatus();

  c->post_norms = true;
  ASSIGN_OR_RETURN(const float scalar, r.Float(j, "query_pre_attn_scalar", 256.0f));
  if (!(scalar > 0.0f) || !std::isfinite(scalar)) {
    return r.Error("query_pre_attn_scalar", "must be positive");
  }
  c->attention_scale = 1.0f / std::sqrt(scalar);
  const float default_cap = gemma == Gemma::k2 ? 50.0f : 0.0f;
  ASSIGN_OR_RETURN(c->attn_logit_softcap, SoftCap(r, j, "attn_logit_softcapping", default_cap));
  ASSIGN_OR_RETURN(c->final_logit_softcap,
                   SoftCap(r, j, "final_logit_softcapping", gemma == Gemma::k2 ? 30.0f : 0.0f));

  // The window: every other layer from layer 0 (Gemma 2), five layers of six (Gemma 3's
  // sliding_window_pattern), or one "sliding_attention" / "full_attention" per layer
  // (layer_types, newer configs of both).
  const auto w = j.find("sliding_window");
  if (gemma == Gemma::k3) {
    // EmbeddingGemma's encoder: every token attends to every other.
    ASSIGN_OR_RETURN(const bool bidirectional, r.Bool(j, "use_bidirectional_attention", false));
    if (bidirectional) {
      return r.Unimplemented("use_bidirectional_attention",
                             "bidirectional attention (an embedding model) is not supported");
    }
  }
  if (w != j.end() && w->is_null()) {
    if (gemma == Gemma::k3) {
      // Gemma 3's "sliding" layers would still take the local RoPE base.
      return r.Unimplemented("sliding_window", "Gemma 3 without a window is not supported");
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(c->sliding_window, r.Int(j, "sliding_window", 4096));
  if (c->sliding_window <= 0) return r.Error("sliding_window", "must be positive or null");
  const size_t layers = static_cast<size_t>(c->num_layers);
  c->sliding_layers.assign(layers, false);
  const auto types = j.find("layer_types");
  if (types != j.end() && !types->is_null()) {
    if (!types->is_array() || types->size() != layers) {
      return r.Error("layer_types", "expected one entry per layer");
    }
    for (size_t l = 0; l < layers; ++l) {
      const json& t = (*types)[l];
      if (t == "sliding_attention") {
        c->sliding_layers[l] = true;
      } else if (t != "full_attention") {
        return r.Error("layer_types", absl::StrCat("unknown layer type ", t.dump()));
      }
    }
  } else {
    int64_t period = 2;
    if (gemma == Gemma::k3) {
      ASSIGN_OR_RETURN(period, r.Int(j, "sliding_window_pattern", 6));
      if (period <= 0) return r.Error("sliding_window_pattern", "must be positive");
    }
    // The last layer of each period attends fully.
    for (size_t l = 0; l < layers; ++l) {
      c->sliding_layers[l] = static_cast<int64_t>(l) % period < period - 1;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SupportedHfArchitectures() {
  std::vector<std::string> names;
  for (const HfArchitecture& a : kArchitectures) names.emplace_back(a.hf_name);
  return names;
}

absl::StatusOr<ModelConfig> ModelConfigFromHfConfigJson(absl::string_view json_text,
                                                        absl::string_view source) {
  const json j = json::parse(json_text.begin(), json_text.end(), nullptr,
                             /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": config.json is not a JSON object"));
  }
  const ConfigReader r(source);
  const auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return r.Error("architectures", "expected a non-empty array of strings");
  }
  const std::string hf_name = (*archs)[0].get<std::string>();
  const HfArchitecture* arch = nullptr;
  for (const HfArchitecture& a : kArchitectures) {
    if (hf_name == a.hf_name) arch = &a;
  }
  if (arch == nullptr && (hf_name == "Gemma3ForConditionalGeneration" ||
                          j.contains("vision_config"))) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": architecture '", hf_name, "': vision models are not supported; the text-only "
        "Gemma3ForCausalLM is"));
  }
  if (arch == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": architecture '", hf_name, "' is not supported; supported: ",
        absl::StrJoin(SupportedHfArchitectures(), ", ")));
  }
  ModelConfig c;
  c.architecture = arch->arch;
  c.rope_neox = true;  // Hugging Face checkpoints keep the Q/K rows in rotate_half order
  ASSIGN_OR_RETURN(c.vocab_size, r.Int(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, r.Int(j, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, r.Int(j, "intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, r.Int(j, "num_hidden_layers"));
  // Per-layer settings are sized by it (as the GGUF reader bounds block_count).
  if (c.num_layers > kMaxLayers) {
    return r.Error("num_hidden_layers", absl::StrCat(c.num_layers, " is more than ", kMaxLayers));
  }
  ASSIGN_OR_RETURN(c.num_heads, r.Int(j, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_kv_heads, r.Int(j, "num_key_value_heads", c.num_heads));
  if (c.num_heads <= 0) return r.Error("num_attention_heads", "must be positive");
  const bool gemma = arch->gemma != Gemma::kNone;
  ASSIGN_OR_RETURN(c.head_dim, r.Int(j, "head_dim", gemma ? kGemmaDefaultHeadDim
                                                          : c.hidden_size / c.num_heads));
  ASSIGN_OR_RETURN(c.max_context, r.Int(j, "max_position_embeddings"));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.Float(j, "rms_norm_eps", arch->default_rms_norm_eps));
  // Gemma's config classes tie by default; the others do not.
  ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool(j, "tie_word_embeddings", gemma));
  switch (arch->bias) {
    case Bias::kNever:
      c.attention_bias = false;
      break;
    case Bias::kAlways:
      c.attention_bias = true;
      break;
    case Bias::kFromConfig:
      ASSIGN_OR_RETURN(c.attention_bias, r.Bool(j, "attention_bias", false));
      break;
  }
  c.qk_norm = arch->qk_norm;
  RETURN_IF_ERROR(ReadRope(r, j, *arch, &c));
  if (gemma) {
    RETURN_IF_ERROR(ReadGemma(r, j, arch->gemma, &c));
    RETURN_IF_ERROR(Annotate(c.Validate(), source));
    return c;
  }
  const auto w = j.find("sliding_window");
  bool use_window = w != j.end() && !w->is_null();
  if (arch->window == Window::kUseSlidingWindow) {
    // Qwen2/Qwen3 configs carry a window but switch it off (`use_sliding_window: false`, also
    // the default); switched on, it covers only the layers from `max_window_layers` on.
    ASSIGN_OR_RETURN(const bool switched_on, r.Bool(j, "use_sliding_window", false));
    if (switched_on && use_window) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": config.json key 'use_sliding_window': a sliding window on some layers (from "
          "max_window_layers on) is not supported"));
    }
    use_window = false;
  }
  // Mistral v0.1 attends over a window (`sliding_window`, 4096); later Mistrals set it null.
  // Phi-3-mini-4k states 2047, which transformers applies (llama.cpp ignores it in GGUF files).
  if (use_window) {
    ASSIGN_OR_RETURN(c.sliding_window, r.Int(j, "sliding_window"));
    if (c.sliding_window <= 0) return r.Error("sliding_window", "must be positive or null");
  }
  RETURN_IF_ERROR(Annotate(c.Validate(), source));
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return ModelConfigFromHfConfigJson(
      absl::string_view(reinterpret_cast<const char*>(file.data()),
                        static_cast<size_t>(file.size())),
      path);
}

}  // namespace tandem
