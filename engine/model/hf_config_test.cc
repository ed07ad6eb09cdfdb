#include "engine/model/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// SmolLM2-135M-Instruct's config.json (the fields Tandem reads).
json SmolLM2Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "hidden_size": 576,
    "intermediate_size": 1536, "max_position_embeddings": 8192, "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 100000, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "vocab_size": 49152})");
}

// Qwen2.5-0.5B-Instruct's config.json (the fields Tandem reads).
json Qwen2Config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": true, "vocab_size": 151936})");
}

TEST(HfConfigTest, MapsLlamaAndQwen2) {
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(SmolLM2Config().dump(), "smol");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_TRUE(c->rope_neox);  // every Hugging Face checkpoint
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->max_context, 8192);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 100000.0f);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  c = ModelConfigFromHfConfigJson(Qwen2Config().dump(), "qwen");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
}

// Qwen3-0.6B's config.json (the fields Tandem reads).
json Qwen3Config() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

// Phi-3-mini-4k-instruct's config.json (the fields Tandem reads; no rms_norm_eps, to see the
// family's default).
json Phi3Config() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "vocab_size": 32064})");
}

TEST(HfConfigTest, MapsQwen3AndPhi3) {
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(Qwen3Config().dump(), "qwen3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen3");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);

  c = ModelConfigFromHfConfigJson(Phi3Config().dump(), "phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "phi3");
  EXPECT_TRUE(c->rope_neox);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);  // Phi3Config's default
  EXPECT_EQ(c->sliding_window, 2047);       // as transformers applies it
}

TEST(HfConfigTest, SlidingWindow) {
  json j = SmolLM2Config();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4096;  // Mistral 7B v0.1
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(j.dump(), "mistral-v0.1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);

  j["sliding_window"] = nullptr;  // v0.2 and later: full attention
  c = ModelConfigFromHfConfigJson(j.dump(), "mistral-v0.2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);

  json q = Qwen2Config();  // a window that is switched off
  q["sliding_window"] = 32768;
  q["use_sliding_window"] = false;
  c = ModelConfigFromHfConfigJson(q.dump(), "qwen");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  q.erase("use_sliding_window");  // off by default, as in transformers' Qwen2Config
  c = ModelConfigFromHfConfigJson(q.dump(), "qwen");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  q["use_sliding_window"] = true;  // transformers windows only layers >= max_window_layers
  c = ModelConfigFromHfConfigJson(q.dump(), "qwen");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("'use_sliding_window'"));

  j["sliding_window"] = -1;
  c = ModelConfigFromHfConfigJson(j.dump(), "bad");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("sliding_window"));
}

TEST(HfConfigTest, RopeScaling) {
  json j = SmolLM2Config();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(j.dump(), "llama3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  c = ModelConfigFromHfConfigJson(j.dump(), "linear");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 2.0f);
}

// Phi-3-mini-128k's form: "type": "longrope", the lists, and the original context at the top
// level; the attention factor is transformers' sqrt(1 + ln(s) / ln(original)).
TEST(HfConfigTest, LongRope) {
  json j = SmolLM2Config();  // head_dim 64: 32 factors per list
  j["architectures"] = {"Phi3ForCausalLM"};
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  std::vector<double> long_factors(32), short_factors(32);
  for (int i = 0; i < 32; ++i) {
    long_factors[static_cast<size_t>(i)] = 1.0 + i;
    short_factors[static_cast<size_t>(i)] = 1.0 + 0.01 * i;
  }
  j["rope_scaling"] = {{"type", "longrope"}, {"long_factor", long_factors},
                       {"short_factor", short_factors}};
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(j.dump(), "phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeScaling& r = c->rope_scaling;
  EXPECT_EQ(r.type, RopeScaling::Type::kLongRope);
  ASSERT_EQ(r.long_factors.size(), 32u);
  EXPECT_EQ(r.long_factors[31], 32.0f);
  EXPECT_FLOAT_EQ(r.short_factors[31], 1.31f);
  EXPECT_EQ(r.original_max_position, 4096);
  EXPECT_FLOAT_EQ(r.attn_factor, static_cast<float>(std::sqrt(1.0 + std::log(32.0) /
                                                                      std::log(4096.0))));
  EXPECT_TRUE(c->UsesLongRopeFactors());

  // A stated attention_factor wins; a context no longer than the original keeps the short list.
  j["rope_scaling"]["rope_type"] = "longrope";
  j["rope_scaling"]["attention_factor"] = 1.5;
  j["max_position_embeddings"] = 4096;
  c = ModelConfigFromHfConfigJson(j.dump(), "phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.attn_factor, 1.5f);
  EXPECT_FALSE(c->UsesLongRopeFactors());
  j["rope_scaling"].erase("attention_factor");
  c = ModelConfigFromHfConfigJson(j.dump(), "phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.attn_factor, 1.0f);

  // Non-positive and non-finite entries are refused naming the list and the entry.
  j["rope_scaling"]["short_factor"][3] = 0.0;
  absl::Status s = ModelConfigFromHfConfigJson(j.dump(), "phi3").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("short_factor[3] must be positive and finite, got 0"));
  j["rope_scaling"]["short_factor"][3] = 1.0;
  std::string text = j.dump();
  const size_t at = text.find("32.0");  // the last long factor
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 4, "1e39");  // a double, infinite as a float
  s = ModelConfigFromHfConfigJson(text, "phi3").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("long_factor[31] must be positive and finite"));
}

TEST(HfConfigTest, ErrorsNameTheSourceAndKey) {
  using C = absl::StatusCode;
  struct Case {
    std::string name;
    std::function<void(json*)> edit;
    C code;
    std::string substring;
  };
  const Case cases[] = {
      {"unknown architecture", [](json* j) { (*j)["architectures"] = {"FalconForCausalLM"}; },
       C::kUnimplemented, "'FalconForCausalLM'"},
      {"no architectures", [](json* j) { j->erase("architectures"); }, C::kInvalidArgument,
       "'architectures'"},
      {"missing hidden_size", [](json* j) { j->erase("hidden_size"); }, C::kNotFound,
       "'hidden_size'"},
      {"string layers", [](json* j) { (*j)["num_hidden_layers"] = "30"; }, C::kInvalidArgument,
       "'num_hidden_layers'"},
      {"too many layers", [](json* j) { (*j)["num_hidden_layers"] = 65537; },
       C::kInvalidArgument, "'num_hidden_layers': 65537 is more than 65536"},
      {"float heads", [](json* j) { (*j)["num_attention_heads"] = 9.5; }, C::kInvalidArgument,
       "'num_attention_heads'"},
      {"zero heads", [](json* j) { (*j)["num_attention_heads"] = 0; }, C::kInvalidArgument,
       "num_attention_heads"},
      {"heads do not divide hidden", [](json* j) { (*j)["num_attention_heads"] = 7; },
       C::kInvalidArgument, "num_heads 7 does not divide hidden_size 576"},
      {"kv heads do not divide", [](json* j) { (*j)["num_key_value_heads"] = 2; },
       C::kInvalidArgument, "num_kv_heads 2"},
      {"negative vocab", [](json* j) { (*j)["vocab_size"] = -1; }, C::kInvalidArgument,
       "vocab_size"},
      {"eps string", [](json* j) { (*j)["rms_norm_eps"] = "1e-5"; }, C::kInvalidArgument,
       "'rms_norm_eps'"},
      {"tie not bool", [](json* j) { (*j)["tie_word_embeddings"] = 1; }, C::kInvalidArgument,
       "'tie_word_embeddings'"},
      {"yarn", [](json* j) { (*j)["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}}; },
       C::kUnimplemented, "'yarn'"},
      {"longrope factors of the wrong length",
       [](json* j) {
         (*j)["architectures"] = {"Phi3ForCausalLM"};
         (*j)["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0}},
                                 {"short_factor", {1.0}}};
       },
       C::kInvalidArgument, "longrope long_factor has 1 entries, expected head_dim / 2 = 32"},
      {"longrope factor not a number",
       [](json* j) {
         (*j)["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0, "2"}},
                                 {"short_factor", {1.0}}};
       },
       C::kInvalidArgument, "'long_factor': entry 1: expected a number"},
      {"longrope without short_factor",
       [](json* j) { (*j)["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0}}}; },
       C::kInvalidArgument, "'short_factor'"},
      {"partial rotary", [](json* j) { (*j)["partial_rotary_factor"] = 0.75; },
       C::kUnimplemented, "'partial_rotary_factor'"},
      {"rope_scaling not object", [](json* j) { (*j)["rope_scaling"] = 2; }, C::kInvalidArgument,
       "'rope_scaling'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json j = SmolLM2Config();
    c.edit(&j);
    absl::Status s = ModelConfigFromHfConfigJson(j.dump(), "dir/config.json").status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr("dir/config.json")) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.substring)) << s;
  }
  absl::Status s = ModelConfigFromHfConfigJson("{not json", "x.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("x.json"));
}

// gemma-2b's config.json (the fields Tandem reads): hidden_act "gelu" as released, and the
// hidden_activation added later that says what the model runs.
json Gemma1Config() {
  return json::parse(R"({
    "architectures": ["GemmaForCausalLM"], "head_dim": 256, "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000.0,
    "vocab_size": 256000})");
}

// gemma-2-27b-it's config.json: query_pre_attn_scalar 144 = hidden / heads, not head_dim.
json Gemma2Config() {
  return json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "head_dim": 128, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 4608, "intermediate_size": 36864, "max_position_embeddings": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 46, "num_key_value_heads": 16,
    "query_pre_attn_scalar": 144, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "vocab_size": 256000})");
}

// gemma-3-1b-it's config.json.
json Gemma3Config() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attn_logit_softcapping": null,
    "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144})");
}

std::vector<bool> Windowed(const ModelConfig& c) {
  std::vector<bool> out;
  for (int64_t l = 0; l < c.num_layers; ++l) out.push_back(c.LayerWindow(l) > 0);
  return out;
}

TEST(HfConfigTest, MapsGemma1) {
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(Gemma1Config().dump(), "gemma");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "gemma");
  EXPECT_TRUE(c->rope_neox);
  EXPECT_TRUE(c->tie_word_embeddings);  // GemmaConfig's default
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_FLOAT_EQ(c->embedding_scale, std::sqrt(2048.0f));
  EXPECT_EQ(c->ffn_activation, ModelConfig::Activation::kGeluTanh);
  EXPECT_FALSE(c->post_norms);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->attention_scale, 0.0f);  // 1 / sqrt(head_dim)
  EXPECT_EQ(c->attn_logit_softcap, 0.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);
  EXPECT_EQ(c->sliding_window, 0);

  json j = Gemma1Config();
  j.erase("head_dim");  // transformers' default, not hidden / heads
  j.erase("hidden_activation");
  j["hidden_act"] = "gelu_pytorch_tanh";
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  // Without hidden_activation, transformers runs hidden_act: the exact GELU is not implemented.
  j["hidden_act"] = "gelu";
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("'hidden_act'"));
}

TEST(HfConfigTest, MapsGemma2) {
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(Gemma2Config().dump(), "gemma2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "gemma2");
  EXPECT_TRUE(c->post_norms);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FLOAT_EQ(c->embedding_scale, std::sqrt(4608.0f));
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 12.0f);  // 1 / sqrt(144)
  EXPECT_EQ(c->attn_logit_softcap, 50.0f);
  EXPECT_EQ(c->final_logit_softcap, 30.0f);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->rope_theta_sliding, 0.0f);
  std::vector<bool> even(46);
  for (size_t l = 0; l < even.size(); ++l) even[l] = l % 2 == 0;
  EXPECT_EQ(Windowed(*c), even);

  // transformers' Gemma2Config defaults, and null switching a cap or the window off.
  json j = Gemma2Config();
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar", "sliding_window"}) {
    j.erase(key);
  }
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_logit_softcap, 50.0f);
  EXPECT_EQ(c->final_logit_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 16.0f);
  EXPECT_EQ(c->sliding_window, 4096);
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["sliding_window"] = nullptr;
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_logit_softcap, 0.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);
  EXPECT_EQ(c->sliding_window, 0);

  // Newer configs list each layer's kind.
  j = Gemma2Config();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windowed(*c), (std::vector<bool>{false, true, false}));
}

TEST(HfConfigTest, MapsGemma3) {
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(Gemma3Config().dump(), "gemma3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "gemma3");
  EXPECT_TRUE(c->post_norms);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 16.0f);
  EXPECT_EQ(c->attn_logit_softcap, 0.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);
  EXPECT_EQ(c->sliding_window, 512);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_theta_sliding, 1e4f);
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(c->LayerWindow(l) > 0, l % 6 != 5) << l;

  // Gemma 3 4B's text part: linear RoPE scaling (the full-attention layers'), other pattern.
  json j = Gemma3Config();
  j["rope_scaling"] = {{"factor", 8.0}, {"rope_type", "linear"}};
  j["sliding_window_pattern"] = 3;
  j["num_hidden_layers"] = 4;
  j["rope_local_base_freq"] = 20000.0;
  j.erase("rope_theta");  // Gemma3TextConfig's default
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_theta_sliding, 2e4f);
  EXPECT_EQ(Windowed(*c), (std::vector<bool>{true, true, false, true}));

  j = Gemma3Config();
  j["final_logit_softcapping"] = 30.0;
  j["num_hidden_layers"] = 2;
  j["layer_types"] = {"sliding_attention", "full_attention"};
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->final_logit_softcap, 30.0f);
  EXPECT_EQ(Windowed(*c), (std::vector<bool>{true, false}));
}

TEST(HfConfigTest, GemmaErrors) {
  using C = absl::StatusCode;
  struct Case {
    std::string name;
    json config;
    C code;
    std::string substring;
  };
  auto edit = [](json j, const std::function<void(json*)>& f) {
    f(&j);
    return j;
  };
  const Case cases[] = {
      {"vision model by name",
       edit(Gemma3Config(), [](json* j) {
         (*j)["architectures"] = {"Gemma3ForConditionalGeneration"};
       }),
       C::kUnimplemented, "vision"},
      {"vision config",
       edit(Gemma3Config(), [](json* j) {
         (*j)["architectures"] = {"SomethingForConditionalGeneration"};
         (*j)["vision_config"] = json::object();
       }),
       C::kUnimplemented, "vision"},
      {"missing hidden_size", edit(Gemma3Config(), [](json* j) { j->erase("hidden_size"); }),
       C::kNotFound, "'hidden_size'"},
      {"missing vocab", edit(Gemma2Config(), [](json* j) { j->erase("vocab_size"); }),
       C::kNotFound, "'vocab_size'"},
      // Gemma 2's per-layer windows were allocated for every layer first (std::bad_alloc)
      {"a trillion layers",
       edit(Gemma2Config(), [](json* j) { (*j)["num_hidden_layers"] = int64_t{1} << 40; }),
       C::kInvalidArgument, "'num_hidden_layers'"},
      {"exact gelu",
       edit(Gemma2Config(), [](json* j) { (*j)["hidden_activation"] = "gelu"; }),
       C::kUnimplemented, "'hidden_activation'"},
      {"activation not a string",
       edit(Gemma3Config(), [](json* j) { (*j)["hidden_activation"] = 1; }),
       C::kInvalidArgument, "'hidden_activation'"},
      {"negative cap",
       edit(Gemma2Config(), [](json* j) { (*j)["attn_logit_softcapping"] = -1.0; }),
       C::kInvalidArgument, "'attn_logit_softcapping'"},
      {"cap string",
       edit(Gemma2Config(), [](json* j) { (*j)["final_logit_softcapping"] = "30"; }),
       C::kInvalidArgument, "'final_logit_softcapping'"},
      {"zero scalar", edit(Gemma2Config(), [](json* j) { (*j)["query_pre_attn_scalar"] = 0; }),
       C::kInvalidArgument, "'query_pre_attn_scalar'"},
      {"layer_types length",
       edit(Gemma3Config(), [](json* j) { (*j)["layer_types"] = {"full_attention"}; }),
       C::kInvalidArgument, "'layer_types'"},
      {"layer_types unknown",
       edit(Gemma2Config(), [](json* j) {
         (*j)["num_hidden_layers"] = 1;
         (*j)["layer_types"] = {"chunked_attention"};
       }),
       C::kInvalidArgument, "chunked_attention"},
      {"zero pattern", edit(Gemma3Config(), [](json* j) { (*j)["sliding_window_pattern"] = 0; }),
       C::kInvalidArgument, "'sliding_window_pattern'"},
      {"zero window", edit(Gemma2Config(), [](json* j) { (*j)["sliding_window"] = 0; }),
       C::kInvalidArgument, "'sliding_window'"},
      {"gemma3 without window",
       edit(Gemma3Config(), [](json* j) { (*j)["sliding_window"] = nullptr; }),
       C::kUnimplemented, "'sliding_window'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status s = ModelConfigFromHfConfigJson(c.config.dump(), "dir/config.json").status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr("dir/config.json")) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.substring)) << s;
  }
}

// transformers 5 writes the RoPE settings into one rope_parameters object (base included), nested
// per layer type for Gemma 3, and no rope_theta / rope_scaling / rope_local_base_freq.
TEST(HfConfigTest, RopeParametersOfTransformers5) {
  json j = SmolLM2Config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  absl::StatusOr<ModelConfig> c = ModelConfigFromHfConfigJson(j.dump(), "llama3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);

  // The base in rope_parameters wins over a top-level one, as in transformers 5; a rope_scaling
  // that is not null gives the scaling.
  j["rope_theta"] = 1.0;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  c = ModelConfigFromHfConfigJson(j.dump(), "both");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_theta, 1.0f);  // rope_scaling states none: the top level's
  j.erase("rope_scaling");
  c = ModelConfigFromHfConfigJson(j.dump(), "both");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500000.0f);

  j = Qwen3Config();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  c = ModelConfigFromHfConfigJson(j.dump(), "qwen3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  // Phi-3's LongRoPE, its original context still at the top level.
  j = SmolLM2Config();
  j.erase("rope_scaling");
  j["architectures"] = {"Phi3ForCausalLM"};
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0},
                          {"long_factor", std::vector<double>(32, 2.0)},
                          {"short_factor", std::vector<double>(32, 1.0)}};
  c = ModelConfigFromHfConfigJson(j.dump(), "phi3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(c->rope_scaling.original_max_position, 4096);
  EXPECT_EQ(c->rope_theta, 1e4f);

  // Gemma 3 (4B's text part): the full-attention layers' base and linear scaling, the sliding
  // layers' own base, written as transformers 5 saves it (layer_types spelled out).
  j = Gemma3Config();
  for (const char* key : {"rope_theta", "rope_scaling", "rope_local_base_freq",
                          "sliding_window_pattern"}) {
    j.erase(key);
  }
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention"};
  j["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  j["use_bidirectional_attention"] = false;
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_theta_sliding, 1e4f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(Windowed(*c), (std::vector<bool>{true, true, false}));
  // Without a base in the nested objects: Gemma3TextConfig's defaults.
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}},
                          {"sliding_attention", nullptr}};
  c = ModelConfigFromHfConfigJson(j.dump(), "gemma3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_theta_sliding, 1e4f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(HfConfigTest, RopeParametersErrors) {
  using C = absl::StatusCode;
  struct Case {
    const char* name;
    json config;
    json rope_parameters;
    C code;
    const char* substring;
  };
  json nested_gemma3 = Gemma3Config();
  nested_gemma3.erase("rope_local_base_freq");
  const json full = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  const Case cases[] = {
      {"not an object", SmolLM2Config(), 3, C::kInvalidArgument, "'rope_parameters'"},
      {"yarn", SmolLM2Config(), {{"rope_type", "yarn"}, {"factor", 4.0}}, C::kUnimplemented,
       "'yarn'"},
      {"partial rotary", SmolLM2Config(),
       {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}, C::kUnimplemented,
       "'partial_rotary_factor'"},
      {"a factor without a type", SmolLM2Config(), {{"factor", 4.0}}, C::kInvalidArgument,
       "'factor' without a rope_type"},
      {"a key next to layer types", nested_gemma3, {{"full_attention", full}, {"factor", 2.0}},
       C::kInvalidArgument, "'factor' next to per-layer-type entries"},
      {"a layer type not an object", nested_gemma3, {{"full_attention", 1}},
       C::kInvalidArgument, "'full_attention': expected an object or null"},
      {"scaled sliding layers", nested_gemma3,
       {{"full_attention", full},
        {"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}},
       C::kUnimplemented, "RoPE scaling on the sliding-window layers"},
      {"per layer type outside Gemma 3", SmolLM2Config(),
       {{"full_attention", full}, {"sliding_attention", {{"rope_theta", 1e4}}}},
       C::kUnimplemented, "differ per layer type"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json j = c.config;
    j["rope_parameters"] = c.rope_parameters;
    absl::Status s = ModelConfigFromHfConfigJson(j.dump(), "dir/config.json").status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr("dir/config.json")) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.substring)) << s;
  }
  // EmbeddingGemma's bidirectional attention.
  json j = Gemma3Config();
  j["use_bidirectional_attention"] = true;
  absl::Status s = ModelConfigFromHfConfigJson(j.dump(), "dir/config.json").status();
  EXPECT_EQ(s.code(), C::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("'use_bidirectional_attention'"));
}

TEST(HfConfigTest, LoadsAFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/hf_config_test_config.json");
  {
    std::ofstream out(path);
    out << Qwen2Config().dump(2);
  }
  absl::StatusOr<ModelConfig> c = LoadHfConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  std::filesystem::remove(path);
  absl::Status s = LoadHfConfig(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
}

}  // namespace
}  // namespace tandem
