#include "engine/model/model_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::string_view RopeScalingTypeName(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kNone: return "none";
    case RopeScaling::Type::kLinear: return "linear";
    case RopeScaling::Type::kLlama3: return "llama3";
    case RopeScaling::Type::kLongRope: return "longrope";
  }
  return "unknown";
}

namespace {

absl::Status Bad(const ModelConfig& c, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("model config (", c.architecture.empty() ? "?" : c.architecture, "): ", what));
}

bool PositiveFinite(float x) { return std::isfinite(x) && x > 0.0f; }

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (architecture.empty()) return Bad(*this, "architecture is empty");
  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"vocab_size", vocab_size},     {"hidden_size", hidden_size},
               {"intermediate_size", intermediate_size}, {"num_layers", num_layers},
               {"num_heads", num_heads},       {"num_kv_heads", num_kv_heads},
               {"head_dim", head_dim},         {"max_context", max_context}};
  for (const auto& s : sizes) {
    if (s.value <= 0) return Bad(*this, absl::StrCat(s.name, " must be positive, got ", s.value));
  }
  if (hidden_size % num_heads != 0) {
    return Bad(*this, absl::StrCat("num_heads ", num_heads, " does not divide hidden_size ",
                                   hidden_size));
  }
  if (num_heads % num_kv_heads != 0) {
    return Bad(*this, absl::StrCat("num_kv_heads ", num_kv_heads, " does not divide num_heads ",
                                   num_heads));
  }
  if (head_dim % 2 != 0) {
    return Bad(*this, absl::StrCat("head_dim ", head_dim, " must be even for RoPE"));
  }
  if (!PositiveFinite(rms_norm_eps)) {
    return Bad(*this, absl::StrCat("rms_norm_eps must be positive and finite, got ", rms_norm_eps));
  }
  if (!PositiveFinite(rope_theta)) {
    return Bad(*this, absl::StrCat("rope_theta must be positive and finite, got ", rope_theta));
  }
  if (sliding_window < 0) {
    return Bad(*this, absl::StrCat("sliding_window must be >= 0, got ", sliding_window));
  }
  if (!sliding_layers.empty() && static_cast<int64_t>(sliding_layers.size()) != num_layers) {
    return Bad(*this, absl::StrCat("sliding_layers has ", sliding_layers.size(),
                                   " entries for ", num_layers, " layers"));
  }
  const struct {
    const char* name;
    float value;
  } nonnegative[] = {{"rope_theta_sliding", rope_theta_sliding},
                     {"attention_scale", attention_scale},
                     {"attn_logit_softcap", attn_logit_softcap},
                     {"final_logit_softcap", final_logit_softcap}};
  for (const auto& f : nonnegative) {
    if (!std::isfinite(f.value) || f.value < 0.0f) {
      return Bad(*this, absl::StrCat(f.name, " must be finite and >= 0, got ", f.value));
    }
  }
  if (!PositiveFinite(embedding_scale)) {
    return Bad(*this, absl::StrCat("embedding_scale must be positive and finite, got ",
                                   embedding_scale));
  }
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLongRope: {
      if (rope_scaling.original_max_position <= 0) {
        return Bad(*this, absl::StrCat("longrope original_max_position must be positive, got ",
                                       rope_scaling.original_max_position));
      }
      if (!PositiveFinite(rope_scaling.attn_factor)) {
        return Bad(*this, absl::StrCat("longrope attn_factor must be positive and finite, got ",
                                       rope_scaling.attn_factor));
      }
      const struct {
        const char* name;
        const std::vector<float>& values;
      } lists[] = {{"long_factor", rope_scaling.long_factors},
                   {"short_factor", rope_scaling.short_factors}};
      for (const auto& list : lists) {
        if (static_cast<int64_t>(list.values.size()) != head_dim / 2) {
          return Bad(*this, absl::StrCat("longrope ", list.name, " has ", list.values.size(),
                                         " entries, expected head_dim / 2 = ", head_dim / 2));
        }
        for (size_t i = 0; i < list.values.size(); ++i) {
          if (!PositiveFinite(list.values[i])) {
            return Bad(*this, absl::StrCat("longrope ", list.name, "[", i,
                                           "] must be positive and finite, got ",
                                           list.values[i]));
          }
        }
      }
      break;
    }
    case RopeScaling::Type::kLlama3:
      if (!PositiveFinite(rope_scaling.low_freq_factor) ||
          !PositiveFinite(rope_scaling.high_freq_factor) ||
          rope_scaling.high_freq_factor <= rope_scaling.low_freq_factor) {
        return Bad(*this, absl::StrCat("llama3 rope scaling needs 0 < low_freq_factor (",
                                       rope_scaling.low_freq_factor, ") < high_freq_factor (",
                                       rope_scaling.high_freq_factor, ")"));
      }
      if (rope_scaling.original_max_position <= 0) {
        return Bad(*this, absl::StrCat("llama3 rope scaling original_max_position must be "
                                       "positive, got ",
                                       rope_scaling.original_max_position));
      }
      [[fallthrough]];
    case RopeScaling::Type::kLinear:
      if (!PositiveFinite(rope_scaling.factor)) {
        return Bad(*this, absl::StrCat("rope scaling factor must be positive and finite, got ",
                                       rope_scaling.factor));
      }
      break;
  }
  return absl::OkStatus();
}

std::string ModelConfig::DebugString() const {
  std::string s = absl::StrCat(architecture, " layers=", num_layers, " hidden=", hidden_size,
                               " heads=", num_heads, "/", num_kv_heads, " head_dim=", head_dim,
                               " ffn=", intermediate_size, " vocab=", vocab_size,
                               " ctx=", max_context, " eps=", rms_norm_eps,
                               " rope_theta=", rope_theta,
                               " rope_scaling=", RopeScalingTypeName(rope_scaling.type));
  if (rope_scaling.type == RopeScaling::Type::kLongRope) {
    absl::StrAppend(&s, "(original=", rope_scaling.original_max_position,
                    UsesLongRopeFactors() ? " long" : " short",
                    " attn_factor=", rope_scaling.attn_factor, ")");
  } else if (rope_scaling.type != RopeScaling::Type::kNone) {
    absl::StrAppend(&s, "(", rope_scaling.factor, ")");
  }
  absl::StrAppend(&s, " tied=", tie_word_embeddings ? "yes" : "no",
                  " qkv_bias=", attention_bias ? "yes" : "no",
                  " qk_norm=", qk_norm ? "yes" : "no", " sliding_window=", sliding_window,
                  " rope_pairs=", rope_neox ? "neox" : "interleaved");
  if (!sliding_layers.empty()) {
    absl::StrAppend(&s, " sliding_layers=");
    for (bool b : sliding_layers) absl::StrAppend(&s, b ? "S" : "G");
  }
  if (rope_theta_sliding > 0.0f) absl::StrAppend(&s, " rope_theta_sliding=", rope_theta_sliding);
  if (embedding_scale != 1.0f) absl::StrAppend(&s, " embedding_scale=", embedding_scale);
  if (ffn_activation == Activation::kGeluTanh) absl::StrAppend(&s, " ffn=geglu");
  if (post_norms) absl::StrAppend(&s, " post_norms=yes");
  if (attention_scale > 0.0f) absl::StrAppend(&s, " attention_scale=", attention_scale);
  if (attn_logit_softcap > 0.0f) absl::StrAppend(&s, " attn_softcap=", attn_logit_softcap);
  if (final_logit_softcap > 0.0f) absl::StrAppend(&s, " final_softcap=", final_logit_softcap);
  return s;
}

}  // namespace tandem
