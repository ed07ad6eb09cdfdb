// Test-only: builds GGUF files byte by byte, recording where each field lands so tests can
// corrupt them. Not part of the library (no .cc; included by the *_test.cc files only).
#ifndef TANDEM_ENGINE_MODEL_GGUF_TEST_WRITER_H_
#define TANDEM_ENGINE_MODEL_GGUF_TEST_WRITER_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/gguf.h"

namespace tandem::testing {

// An encoded metadata value: its type id and its bytes after the type field.
struct GgufTestValue {
  uint32_t type = 0;
  std::string bytes;
};

template <typename T>
void AppendLE(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

template <typename T>
void StoreLE(std::string* out, int64_t at, T v) {
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
GgufTestValue Scalar(GgufValueType type, T v) {
  GgufTestValue r{static_cast<uint32_t>(type), {}};
  AppendLE(&r.bytes, v);
  return r;
}
inline GgufTestValue U8(uint8_t v) { return Scalar(GgufValueType::kUint8, v); }
inline GgufTestValue I8(int8_t v) { return Scalar(GgufValueType::kInt8, v); }
inline GgufTestValue U16(uint16_t v) { return Scalar(GgufValueType::kUint16, v); }
inline GgufTestValue I16(int16_t v) { return Scalar(GgufValueType::kInt16, v); }
inline GgufTestValue U32(uint32_t v) { return Scalar(GgufValueType::kUint32, v); }
inline GgufTestValue I32(int32_t v) { return Scalar(GgufValueType::kInt32, v); }
inline GgufTestValue U64(uint64_t v) { return Scalar(GgufValueType::kUint64, v); }
inline GgufTestValue I64(int64_t v) { return Scalar(GgufValueType::kInt64, v); }
inline GgufTestValue F32(float v) { return Scalar(GgufValueType::kFloat32, v); }
inline GgufTestValue F64(double v) { return Scalar(GgufValueType::kFloat64, v); }
inline GgufTestValue Bool(bool v) { return Scalar(GgufValueType::kBool, static_cast<uint8_t>(v)); }
inline void AppendString(std::string* out, const std::string& s) {
  AppendLE<uint64_t>(out, s.size());
  out->append(s);
}
inline GgufTestValue Str(const std::string& s) {
  GgufTestValue r{static_cast<uint32_t>(GgufValueType::kString), {}};
  AppendString(&r.bytes, s);
  return r;
}
// An array of `elements`, which must all have type `element_type`.
inline GgufTestValue Arr(GgufValueType element_type, const std::vector<GgufTestValue>& elements) {
  GgufTestValue r{static_cast<uint32_t>(GgufValueType::kArray), {}};
  AppendLE<uint32_t>(&r.bytes, static_cast<uint32_t>(element_type));
  AppendLE<uint64_t>(&r.bytes, elements.size());
  // Elements carry no type tag; a nested array is its element type, count and elements.
  for (const GgufTestValue& e : elements) r.bytes += e.bytes;
  return r;
}
inline GgufTestValue StrArr(const std::vector<std::string>& v) {
  std::vector<GgufTestValue> e;
  for (const std::string& s : v) e.push_back(Str(s));
  return Arr(GgufValueType::kString, e);
}

// Where the fields of a built file are.
struct GgufTestLayout {
  struct Kv {
    std::string key;
    int64_t key_at = 0;    // the key's u64 length
    int64_t type_at = 0;   // u32 value type
    int64_t value_at = 0;  // first byte after the type
  };
  struct TensorInfo {
    std::string name;
    int64_t name_at = 0;    // u64 name length
    int64_t n_dims_at = 0;  // u32
    int64_t dims_at = 0;    // u64 ne[0]
    int64_t type_at = 0;    // u32 ggml type
    int64_t offset_at = 0;  // u64 offset
    uint64_t offset = 0;    // the value written there
    int64_t data_at = 0;    // absolute
  };
  int64_t tensor_count_at = 8;
  int64_t kv_count_at = 16;
  std::vector<Kv> kvs;
  std::vector<TensorInfo> tensors;
  int64_t data_offset = 0;
};

class GgufTestWriter {
 public:
  void set_version(uint32_t v) { version_ = v; }
  // Alignment used to place tensors (write `general.alignment` yourself when not 32).
  void set_alignment(int64_t a) { alignment_ = a; }

  void Add(const std::string& key, GgufTestValue v) { kvs_.emplace_back(key, std::move(v)); }
  // `data` must hold exactly the tensor's storage bytes (use ZeroTensor / RandomBytes).
  void AddTensor(const std::string& name, DType type, std::vector<int64_t> shape,
                 std::string data, uint32_t type_id_override = ~0u) {
    tensors_.push_back(
        {name, type, std::move(shape), std::move(data),
         type_id_override == ~0u ? GgmlTypeId(type) : type_id_override});
  }
  // A tensor of zeros of the right size.
  void AddZeroTensor(const std::string& name, DType type, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    AddTensor(name, type, shape, std::string(static_cast<size_t>(*DTypeStorageBytes(type, n)), '\0'));
  }

  std::string Build(GgufTestLayout* layout = nullptr) const {
    GgufTestLayout l;
    std::string out = "GGUF";
    AppendLE<uint32_t>(&out, version_);
    AppendLE<uint64_t>(&out, tensors_.size());
    AppendLE<uint64_t>(&out, kvs_.size());
    for (const auto& [key, value] : kvs_) {
      GgufTestLayout::Kv k;
      k.key = key;
      k.key_at = static_cast<int64_t>(out.size());
      AppendString(&out, key);
      k.type_at = static_cast<int64_t>(out.size());
      AppendLE<uint32_t>(&out, value.type);
      k.value_at = static_cast<int64_t>(out.size());
      out += value.bytes;
      l.kvs.push_back(k);
    }
    uint64_t next = 0;
    for (const Tensor& t : tensors_) {
      GgufTestLayout::TensorInfo ti;
      ti.name = t.name;
      ti.name_at = static_cast<int64_t>(out.size());
      AppendString(&out, t.name);
      ti.n_dims_at = static_cast<int64_t>(out.size());
      AppendLE<uint32_t>(&out, static_cast<uint32_t>(t.shape.size()));
      ti.dims_at = static_cast<int64_t>(out.size());
      for (int64_t d : t.shape) AppendLE<uint64_t>(&out, static_cast<uint64_t>(d));
      ti.type_at = static_cast<int64_t>(out.size());
      AppendLE<uint32_t>(&out, t.type_id);
      ti.offset_at = static_cast<int64_t>(out.size());
      ti.offset = next;
      AppendLE<uint64_t>(&out, next);
      next = Align(next + t.data.size());
      l.tensors.push_back(ti);
    }
    l.data_offset = static_cast<int64_t>(Align(out.size()));
    if (!tensors_.empty()) out.resize(static_cast<size_t>(l.data_offset), '\0');
    for (size_t i = 0; i < tensors_.size(); ++i) {
      l.tensors[i].data_at = l.data_offset + static_cast<int64_t>(l.tensors[i].offset);
      out.resize(static_cast<size_t>(l.tensors[i].data_at), '\0');
      out += tensors_[i].data;  // no padding after the last tensor
    }
    if (layout != nullptr) *layout = std::move(l);
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::string data;
    uint32_t type_id;
  };
  uint64_t Align(uint64_t x) const {
    const auto a = static_cast<uint64_t>(alignment_);
    return (x + a - 1) / a * a;
  }

  uint32_t version_ = 3;
  int64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufTestValue>> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace tandem::testing

#endif  // TANDEM_ENGINE_MODEL_GGUF_TEST_WRITER_H_
