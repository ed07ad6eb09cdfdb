// Hugging Face safetensors files: a JSON header and the raw tensors, memory-mapped read-only.
//
//   u64 header_size (little-endian) | header: header_size bytes of UTF-8 JSON | data
//   header = {"__metadata__": {"k": "v", ...},                       (optional, strings only)
//             "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//             ...}
//
// Offsets are relative to the start of the data section. Shapes are in PyTorch order (row-major,
// the LAST dimension contiguous) -- the reverse of GgufTensor::shape.
//
// Ownership and lifetime: a SafetensorsFile owns its mapping; tensor `data` pointers and names
// stay valid as long as it lives. Tensor data is NOT necessarily aligned to its element size
// (the header length decides where data starts): read it with memcpy or copy it.
// Thread-safety: immutable after Open(); const methods are thread-safe.
//
// Errors: DATA_LOSS for a truncated file, INVALID_ARGUMENT for a malformed header or a tensor whose
// offsets do not match its shape and dtype, overlap another or leave the file; UNIMPLEMENTED for
// dtypes Tandem does not read (supported: F32, F16, BF16). Messages name the file and the tensor.
#ifndef TANDEM_ENGINE_MODEL_SAFETENSORS_H_
#define TANDEM_ENGINE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/core/dtype.h"
#include "engine/model/mapped_file.h"

namespace tandem {

struct SafetensorsTensor {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // PyTorch order; may be empty (a scalar) or contain zeros
  const void* data = nullptr;  // inside the mapping; possibly unaligned
  int64_t bytes = 0;
  int64_t file_offset = 0;  // of `data`, from the start of the file

  int64_t elements() const;
};

class SafetensorsFile {
 public:
  // Headers larger than this are refused (the safetensors library's own limit).
  static constexpr int64_t kMaxHeaderBytes = 100 << 20;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses a copy of `bytes`; `name` stands for the file in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(absl::string_view bytes,
                                                                    const std::string& name);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return bytes_.path(); }
  // Sorted by name (JSON object order is not preserved by the header format).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensor* FindTensor(absl::string_view name) const;
  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t data_offset() const { return data_offset_; }

 private:
  explicit SafetensorsFile(MappedFile bytes) : bytes_(std::move(bytes)) {}
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(MappedFile bytes);
  absl::Status ParseHeader();

  MappedFile bytes_;
  int64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_SAFETENSORS_H_
