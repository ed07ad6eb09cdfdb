// GGUF model files: header, metadata and tensor directory, read from a read-only memory mapping.
//
// A GGUF file (versions 2 and 3, little-endian) is
//
//   magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//   metadata_kv_count x { string key | u32 value_type | value }
//   tensor_count      x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   data section: tensor i starts at data_start + offset_i (each offset aligned)
//
// where a string is { u64 length | bytes (not NUL-terminated) } and an array value is
// { u32 element_type | u64 count | count x element }.
//
// Keys the tokenizer reads (all optional unless the tokenizer says otherwise):
//   tokenizer.ggml.model             string        "gpt2" (byte-level BPE) | "llama" (SentencePiece)
//   tokenizer.ggml.pre               string        pre-tokenizer name, e.g. "smollm", "llama-bpe"
//   tokenizer.ggml.tokens            [string]      the vocabulary, index = token id
//   tokenizer.ggml.scores            [float32]     per-token score (SentencePiece merges)
//   tokenizer.ggml.token_type        [int32]       1 normal, 2 unknown, 3 control, 4 user-defined,
//                                                  5 unused, 6 byte
//   tokenizer.ggml.merges            [string]      BPE merges, "left right" per entry, by rank
//   tokenizer.ggml.bos_token_id      uint32
//   tokenizer.ggml.eos_token_id      uint32
//   tokenizer.ggml.unknown_token_id  uint32
//   tokenizer.ggml.padding_token_id  uint32
//   tokenizer.ggml.add_bos_token     bool
//   tokenizer.ggml.add_eos_token     bool
//   tokenizer.chat_template          string        Jinja template
//
// Ownership and lifetime: a GgufFile owns its mapping. Every absl::string_view, GgufValue,
// GgufTensor (and its `data` pointer) handed out by a GgufFile points into that mapping or into
// the GgufFile itself and stays valid exactly as long as the GgufFile lives. Keep the
// std::unique_ptr<GgufFile> alive for as long as any weights or vocabulary views are used.
//
// Thread-safety: a GgufFile is immutable after Open(); all const methods are thread-safe.
//
// Errors: bad input never crashes. Open() returns INVALID_ARGUMENT for malformed content,
// DATA_LOSS for truncation, UNIMPLEMENTED for GGUF v1 or unsupported tensor types, NOT_FOUND /
// PERMISSION_DENIED etc. for the file system. Every message names the file, the field (key or
// tensor) and the byte offset.
#ifndef TANDEM_ENGINE_MODEL_GGUF_H_
#define TANDEM_ENGINE_MODEL_GGUF_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/core/dtype.h"
#include "engine/model/mapped_file.h"

namespace tandem {

// GGUF metadata value types; the numbers are the on-disk ids.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "int8", ..., "float64", "bool", "string", "array"; "unknown" for other values.
absl::string_view GgufValueTypeName(GgufValueType type);
bool IsGgufIntegerType(GgufValueType type);

// One metadata value: a scalar, a string or an array (possibly of arrays). Cheap to copy (arrays
// are shared, strings are views into the mapping). Valid while its GgufFile lives.
class GgufValue {
 public:
  GgufValue() = default;

  GgufValueType type() const { return type_; }

  // Scalars. Each returns std::nullopt when the value is not of a fitting type:
  // AsInt64/AsUint64 accept every integer type whose value fits in the result;
  // AsFloat64 accepts float32 and float64; AsBool only bool; AsString only string.
  std::optional<int64_t> AsInt64() const;
  std::optional<uint64_t> AsUint64() const;
  std::optional<double> AsFloat64() const;
  std::optional<bool> AsBool() const;
  std::optional<absl::string_view> AsString() const;

  // Arrays. REQUIRES for element(): type() == kArray and 0 <= i < size().
  GgufValueType element_type() const { return element_type_; }  // meaningful for arrays only
  int64_t size() const { return type_ == GgufValueType::kArray ? count_ : 0; }
  GgufValue element(int64_t i) const;

 private:
  friend class GgufParser;

  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType element_type_ = GgufValueType::kUint8;
  // Scalars: integers are kept as both (one of them exact, per is_signed_); floats in f64_.
  int64_t i64_ = 0;
  uint64_t u64_ = 0;
  double f64_ = 0;
  absl::string_view str_;
  // Arrays of fixed-size scalars: `count_` little-endian elements at `raw_` (inside the mapping).
  int64_t count_ = 0;
  const uint8_t* raw_ = nullptr;
  std::shared_ptr<const std::vector<absl::string_view>> strings_;  // arrays of strings
  std::shared_ptr<const std::vector<GgufValue>> arrays_;           // arrays of arrays
};

struct GgufKeyValue {
  absl::string_view key;  // view into the mapping
  GgufValue value;
};

// One entry of the tensor directory.
struct GgufTensor {
  std::string name;
  DType type = DType::kF32;
  // ggml order: shape[0] (ne[0]) is the contiguous dimension. A [rows, cols] matrix in PyTorch
  // order is {cols, rows} here. 1 to 4 dimensions, each >= 1.
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping; aligned to the file's alignment
  int64_t bytes = 0;           // storage size, from shape and type
  int64_t file_offset = 0;     // offset of `data` from the start of the file

  int64_t elements() const;
};

// A parsed GGUF file. See the file comment for ownership, lifetime and thread-safety.
class GgufFile {
 public:
  // Memory-maps `path` read-only (MAP_PRIVATE) and parses it.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a copy of `bytes` held in memory; `name` stands for the file name in error messages.
  // Meant for tests and for files that are already in memory.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(absl::string_view bytes,
                                                             const std::string& name);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  int64_t file_size() const { return size_; }
  int64_t data_offset() const { return data_offset_; }  // start of the data section

  // ---- Metadata -----------------------------------------------------------------------------
  bool Has(absl::string_view key) const;
  // nullptr when absent.
  const GgufValue* Find(absl::string_view key) const;
  // All key/value pairs in file order (for dumps).
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }

  // Typed accessors. NOT_FOUND names a missing key; INVALID_ARGUMENT names the key and the
  // expected and actual types (or the value that does not fit).
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<uint32_t> GetUint32(absl::string_view key) const;  // any integer type that fits
  absl::StatusOr<uint64_t> GetUint64(absl::string_view key) const;  // any integer type that fits
  absl::StatusOr<int64_t> GetInt64(absl::string_view key) const;    // any integer type that fits
  absl::StatusOr<float> GetFloat32(absl::string_view key) const;    // float32 or float64
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // Views into the mapping.
  absl::StatusOr<std::vector<absl::string_view>> GetStringArray(absl::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloat32Array(absl::string_view key) const;  // f32/f64
  // Any integer element type whose values fit in int32.
  absl::StatusOr<std::vector<int32_t>> GetInt32Array(absl::string_view key) const;

  // ---- Tensors ------------------------------------------------------------------------------
  // nullptr when absent.
  const GgufTensor* FindTensor(absl::string_view name) const;
  // In file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // MappedFile::DropPages over a tensor's bytes (its first `bytes`, when given), once its user
  // keeps a copy of its own.
  void DropPages(const GgufTensor& tensor, int64_t bytes = -1) const;

 private:
  friend class GgufParser;
  explicit GgufFile(MappedFile bytes);

  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(MappedFile bytes);

  MappedFile bytes_;
  std::string path_;
  const uint8_t* base_ = nullptr;  // bytes_.data()
  int64_t size_ = 0;               // bytes_.size()
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  int64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  absl::flat_hash_map<absl::string_view, size_t> metadata_index_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_GGUF_H_
