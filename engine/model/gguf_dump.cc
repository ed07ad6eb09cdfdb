// gguf_dump: prints a GGUF file's header, metadata, tensor directory and (when it maps to a
// supported architecture) its ModelConfig as one JSON object. Used by the reference tests against
// gguf-py and for inspecting model files.
//
//   gguf_dump [--values] FILE.gguf
//
// Per tensor: name, type, shape (ggml order), file offset, bytes, the first and last 8 dequantized
// values, and two exact checksums of the dequantized float32 bit patterns b[i]:
// bits_sum = sum b[i] and bits_wsum = sum (i + 1) * b[i], both mod 2^64. With --values every
// dequantized value is printed too (small files only).
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/gguf.h"
#include "engine/model/model_loader.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

json ValueToJson(const GgufValue& v) {
  switch (v.type()) {
    case GgufValueType::kString:
      return std::string(*v.AsString());
    case GgufValueType::kBool:
      return *v.AsBool();
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
      return *v.AsFloat64();
    case GgufValueType::kArray: {
      json a = json::array();
      for (int64_t i = 0; i < v.size(); ++i) a.push_back(ValueToJson(v.element(i)));
      return a;
    }
    default:
      if (auto i = v.AsInt64()) return *i;
      return *v.AsUint64();
  }
}

json TypeToJson(const GgufValue& v) {
  if (v.type() != GgufValueType::kArray) return std::string(GgufValueTypeName(v.type()));
  // Nested arrays: the element type of the first element (or "array" when empty).
  json t = {{"array", std::string(GgufValueTypeName(v.element_type()))}};
  if (v.element_type() == GgufValueType::kArray && v.size() > 0) {
    t["element"] = TypeToJson(v.element(0));
  }
  return t;
}

json TensorToJson(const GgufTensor& t, bool all_values) {
  json j;
  j["name"] = t.name;
  j["type"] = std::string(DTypeName(t.type));
  j["shape"] = t.shape;
  j["offset"] = t.file_offset;
  j["bytes"] = t.bytes;
  const int64_t n = t.elements();
  std::vector<float> values(static_cast<size_t>(n));
  DequantizeReference(t.type, t.data, values.data(), n);
  uint64_t sum = 0;
  uint64_t wsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    __builtin_memcpy(&bits, &values[static_cast<size_t>(i)], sizeof(bits));
    sum += bits;
    wsum += static_cast<uint64_t>(i + 1) * bits;
  }
  j["bits_sum"] = std::to_string(sum);
  j["bits_wsum"] = std::to_string(wsum);
  const int64_t k = n < 8 ? n : 8;
  j["first"] = std::vector<float>(values.begin(), values.begin() + k);
  j["last"] = std::vector<float>(values.end() - k, values.end());
  if (all_values) j["values"] = values;
  return j;
}

json ConfigToJson(const ModelConfig& c) {
  return {{"architecture", c.architecture},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"num_kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"max_context", c.max_context},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", std::string(RopeScalingTypeName(c.rope_scaling.type))},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"attention_bias", c.attention_bias}};
}

int Main(int argc, char** argv) {
  bool all_values = false;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--values") {
      all_values = true;
    } else if (path.empty() && !arg.empty() && arg[0] != '-') {
      path = arg;
    } else {
      std::cerr << "usage: gguf_dump [--values] FILE.gguf\n";
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << "usage: gguf_dump [--values] FILE.gguf\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) {
    std::cerr << "gguf_dump: " << file.status() << "\n";
    return 1;
  }
  const GgufFile& f = **file;
  json out;
  out["version"] = f.version();
  out["alignment"] = f.alignment();
  out["data_offset"] = f.data_offset();
  json meta = json::array();
  for (const GgufKeyValue& kv : f.metadata()) {
    meta.push_back({{"key", std::string(kv.key)},
                    {"type", TypeToJson(kv.value)},
                    {"value", ValueToJson(kv.value)}});
  }
  out["metadata"] = std::move(meta);
  json tensors = json::array();
  for (const GgufTensor& t : f.tensors()) tensors.push_back(TensorToJson(t, all_values));
  out["tensors"] = std::move(tensors);
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(f);
  if (config.ok()) {
    out["config"] = ConfigToJson(*config);
    absl::StatusOr<LoadedModel> model = LoadGgufModel(std::move(file).value());
    out["load_status"] = model.ok() ? std::string("OK") : model.status().ToString();
  } else {
    out["config_error"] = config.status().ToString();
  }
  std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
